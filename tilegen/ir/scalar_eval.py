"""Evaluate the integer arithmetic of tile-level IR for given parameter values: enough to
know how often a loop runs and which pipeline stage an op touches at each iteration.
Anything it cannot know (thread-dependent values, floats) evaluates to None."""
from __future__ import annotations

from .values import Imm, Sym, Value

_U32 = 0xFFFFFFFF
_BINARY = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "div": lambda a, b: a // b if b else None, "rem": lambda a, b: a % b if b else None,
    "min": min, "max": max, "and": lambda a, b: a & b, "or": lambda a, b: a | b,
    "xor": lambda a, b: a ^ b, "shl": lambda a, b: a << b, "shr": lambda a, b: a >> b,
}
_COMPARE = {"lt": lambda a, b: a < b, "le": lambda a, b: a <= b, "gt": lambda a, b: a > b,
            "ge": lambda a, b: a >= b, "eq": lambda a, b: a == b, "ne": lambda a, b: a != b}
# Special registers with a value that does not matter for stage indices: block 0, thread 0.
_SPECIAL = {"%tid.x": 0, "%ctaid.x": 0, "%ctaid.y": 0, "%ctaid.z": 0, "%nctaid.x": 1}


class ScalarEval:
    def __init__(self, params: dict | None = None, declared=()):
        """params: parameter name -> value; declared: the kernel's Params, whose registers
        hold those values from the start (tile level: the loads come with lowering)."""
        self.env: dict[Value, object] = {}
        self.defs: dict = {}        # Value -> the instruction that made it last (at_thread)
        self.params = params or {}  # parameter name -> value, for ld.param
        for p in declared:
            self.env[p.value] = self.params.get(p.name)

    def value(self, x):
        if isinstance(x, bool):
            return None
        if isinstance(x, int):
            return x
        if isinstance(x, Imm):
            return x.value if x.type != "f32" else None
        if isinstance(x, Value):
            return self.env.get(x)
        if isinstance(x, Sym):
            return _SPECIAL.get(x.name)
        return None

    def step(self, instr):
        """Record the result of one instruction (None when unknown)."""
        if len(instr.outs) != 1 or not isinstance(instr.outs[0], Value):
            return
        out = instr.outs[0]
        self.defs[out] = instr
        self.env[out] = self._apply(instr, [self.value(x) for x in instr.ins])

    def _apply(self, instr, args):
        """The result of `instr` on argument values `args` (None when unknown)."""
        out = instr.outs[0]
        parts = instr.opcode.split(".")
        result = None
        if parts[0] == "setp" and len(args) == 2 and None not in args and instr.pred is None:
            a, b = args
            if parts[2] == "s32":
                a, b = (a - (1 << 32) if a >= 1 << 31 else a), (b - (1 << 32) if b >= 1 << 31 else b)
            return _COMPARE.get(parts[1], lambda x, y: None)(a, b)
        if parts[0] in ("and", "or", "not") and parts[-1] == "pred":
            if None not in args:
                result = (all(args) if parts[0] == "and" else any(args) if parts[0] == "or" else not args[0])
            return result
        if parts[0] == "ld" and parts[1] == "param":
            src = instr.ins[0]
            result = self.params.get(getattr(getattr(src, "base", None), "name", None))
        elif instr.pred is None and None not in args:
            op = parts[0]
            if op == "mov" and len(args) == 1:
                result = args[0]
            elif op == "redux" and parts[2] in ("min", "max") and len(args) == 2:
                # tilegen reduces only warp-uniform values (the warp index): the thread's own
                result = args[0]
            elif op == "mad" and len(args) == 3:
                result = args[0] * args[1] + args[2]
            elif op == "mul" and parts[1:] == ["hi", "u32"] and len(args) == 2:   # (builder._div_by_constant)
                result = (args[0] * args[1]) >> 32
            elif op in _BINARY and len(args) == 2 and out.type == "b32":
                result = _BINARY[op](args[0], args[1])
            if isinstance(result, int):
                result &= _U32
        return result

    def at_thread(self, x, tid: int, memo=None):
        """x's value in thread `tid` of CTA 0 (self.value is thread 0's), from the instructions
        that made it: None when unknown."""
        if isinstance(x, Sym) and x.name == "%tid.x":
            return tid
        if not isinstance(x, Value) or x not in self.defs:
            return self.value(x)
        memo = {} if memo is None else memo
        if x not in memo:
            instr = self.defs[x]
            memo[x] = self._apply(instr, [self.at_thread(y, tid, memo) for y in instr.ins])
        return memo[x]
