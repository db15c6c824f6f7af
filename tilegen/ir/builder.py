"""Builder: appends IR nodes to the innermost open region and makes scalar arithmetic
easy to write. Front-ends and lowering passes both use it."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Union

from ..errors import IRError
from .instr import Comment, If, Instr, Loop, Role
from .values import Imm, Sym, Value, known_align

Scalar = Union[Value, int]

_SIGNED_CMP = {"lt": "lt", "le": "le", "gt": "gt", "ge": "ge", "eq": "eq", "ne": "ne"}


class Builder:
    def __init__(self, body: list):
        self._regions = [body]

    @property
    def region(self) -> list:
        return self._regions[-1]

    def open_regions(self) -> tuple:
        """The ids of the bodies being built, outermost first (the kernel's, then loop and if bodies)."""
        return tuple(id(r) for r in self._regions)

    def emit(self, node):
        self.region.append(node)
        return node

    def comment(self, text: str):
        self.emit(Comment(text))

    @contextmanager
    def loop(self, start, stop, hint: str = "i", comment: str = ""):
        counter = Value("b32", hint)
        node = Loop(counter, _op(start), _op(stop), [], comment)
        self.emit(node)
        self._regions.append(node.body)
        try:
            yield counter
        finally:
            self._regions.pop()

    @contextmanager
    def _body_of(self, node):
        """Emit `node` and build its body inside the block."""
        self.emit(node)
        self._regions.append(node.body)
        try:
            yield node
        finally:
            self._regions.pop()

    def if_(self, cond: Value, negate: bool = False, comment: str = ""):
        return self._body_of(If(cond, [], negate, comment))

    def role(self, cond: Value, name: str, first_warp: int, end_warp: int):
        """A warp role: the body runs on the warps where `cond` holds (ir/instr.py Role)."""
        return self._body_of(Role(cond, [], False, f"role {name}: warps {first_warp}..{end_warp - 1}", [], name,
                                  first_warp, end_warp))

    @contextmanager
    def else_(self):
        """The other branch of the If just emitted in this region."""
        last = self.region[-1] if self.region else None
        if not isinstance(last, If) or last.orelse:
            raise ValueError("else_ must follow an if_ block (with no else yet) in the same region")
        self._regions.append(last.orelse)
        try:
            yield last
        finally:
            self._regions.pop()

    # -- instructions producing one new value -----------------------------------------------
    def op(self, opcode: str, type: str, *ins, hint: str = "", pred=None, comment: str = "") -> Value:
        out = Value(type, hint)
        self.emit(Instr(opcode, (out,), tuple(_op(x) for x in ins), pred=pred, comment=comment))
        return out

    def mov(self, x, type: str = "b32", hint: str = "") -> Value:
        return self.op(f"mov.{'b32' if type == 'b32' else type}", type, x, hint=hint)

    def special(self, reg: str, hint: str = "") -> Value:
        """%tid.x, %ctaid.x, %laneid ..."""
        return self.op("mov.u32", "b32", Sym(reg), hint=hint or reg.strip("%").replace(".", "_"))

    # u32 arithmetic; ints fold at build time so templates stay readable and PTX stays small.
    def add(self, a: Scalar, b: Scalar) -> Scalar:
        if isinstance(a, int) and isinstance(b, int):
            return a + b
        if isinstance(b, int) and b == 0:
            return a
        if isinstance(a, int) and a == 0:
            return b
        return _aligned(self.op("add.u32", "b32", a, b), min(known_align(a), known_align(b)))

    def sub(self, a: Scalar, b: Scalar) -> Scalar:
        if isinstance(a, int) and isinstance(b, int):
            return a - b
        if isinstance(b, int) and b == 0:
            return a
        return _aligned(self.op("sub.u32", "b32", a, b), min(known_align(a), known_align(b)))

    def mul(self, a: Scalar, b: Scalar) -> Scalar:
        if isinstance(a, int) and isinstance(b, int):
            return a * b
        if isinstance(a, int):
            a, b = b, a
        if isinstance(b, int):
            if b == 0:
                return 0
            if b == 1:
                return a
            if b & (b - 1) == 0:
                return self.shl(a, b.bit_length() - 1)
        return _aligned(self.op("mul.lo.u32", "b32", a, b), known_align(a) * known_align(b))

    def mad(self, a: Scalar, b: Scalar, c: Scalar) -> Scalar:
        if isinstance(a, int) and isinstance(b, int):
            return self.add(a * b, c)
        if isinstance(c, int) and c == 0:
            return self.mul(a, b)
        if isinstance(b, int) and b & (b - 1) == 0:
            return self.add(self.mul(a, b), c)
        if isinstance(a, int):
            a, b = b, a
        return _aligned(self.op("mad.lo.u32", "b32", a, b, c),
                        min(known_align(a) * known_align(b), known_align(c)))

    def div(self, a: Scalar, b: Scalar) -> Scalar:
        _no_zero(b, "div")
        if isinstance(a, int) and isinstance(b, int):
            return a // b
        if isinstance(b, int):
            if b == 1:
                return a
            if b & (b - 1) == 0:
                return self.op("shr.u32", "b32", a, b.bit_length() - 1)
        return self.op("div.u32", "b32", a, b)

    def rem(self, a: Scalar, b: Scalar) -> Scalar:
        _no_zero(b, "rem")
        if isinstance(a, int) and isinstance(b, int):
            return a % b
        if isinstance(b, int):
            if b == 1:
                return 0
            if b & (b - 1) == 0:
                return _aligned(self.op("and.b32", "b32", a, b - 1), min(known_align(a), b))
        return self.op("rem.u32", "b32", a, b)

    def divmod_const(self, a: Scalar, d: int) -> tuple:
        """(a // d, a % d) of a u32 `a` and a constant d >= 1 without a division instruction:
        shifts and a mask for a power of two, else a multiply-high (Granlund and Montgomery,
        1994, figure 4.1: l = ceil(log2 d), m = floor(2^32 (2^l - d) / d) + 1 < 2^32, t =
        mulhi(a, m), a // d = (t + ((a - t) >> 1)) >> (l - 1), exact for every u32 a). ptxas
        (CUDA 13.0) turns div.u32 by an immediate into a float reciprocal (I2F, MUFU.RCP) computed
        each time it runs, in loops too: the stage index t % 6 on every k-tile cost the
        warp-specialized kernel up to a fifth of its time on decoding's stacks (docs/perf_notes.md 43).
        (div and rem keep the division: elsewhere it costs nothing measurable, and the same
        sequence in every kernel made ptxas's relocatable build of one mma.sync kernel take 10
        registers more than its plain build.)"""
        if isinstance(a, int) or d & (d - 1) == 0:
            return self.div(a, d), self.rem(a, d)
        q = self._div_by_constant(a, d)
        return q, self.sub(a, self.mul(q, d))

    def _div_by_constant(self, a: Scalar, d: int) -> Value:
        l = (d - 1).bit_length()
        m = ((1 << 32) * ((1 << l) - d)) // d + 1
        t = self.op("mul.hi.u32", "b32", a, m)
        half = self.op("shr.u32", "b32", self.op("sub.u32", "b32", a, t), 1)
        return self.op("shr.u32", "b32", self.op("add.u32", "b32", t, half), l - 1)

    def min(self, a: Scalar, b: Scalar) -> Scalar:
        if isinstance(a, int) and isinstance(b, int):
            return min(a, b)
        return self.op("min.u32", "b32", a, b)

    def max(self, a: Scalar, b: Scalar) -> Scalar:
        if isinstance(a, int) and isinstance(b, int):
            return max(a, b)
        return self.op("max.u32", "b32", a, b)

    def and_(self, a: Scalar, b: Scalar) -> Scalar:
        if isinstance(a, int) and isinstance(b, int):
            return a & b
        mask = b if isinstance(b, int) else a if isinstance(a, int) else None
        align = max(known_align(a) if mask is not None else 1, known_align(mask) if mask is not None else 1)
        return _aligned(self.op("and.b32", "b32", a, b), align if mask is not None else 1)

    def or_(self, a: Scalar, b: Scalar) -> Scalar:
        if isinstance(a, int) and isinstance(b, int):
            return a | b
        if isinstance(b, int) and b == 0:
            return a
        return self.op("or.b32", "b32", a, b)

    def xor(self, a: Scalar, b: Scalar) -> Scalar:
        if isinstance(a, int) and isinstance(b, int):
            return a ^ b
        if isinstance(b, int) and b == 0:
            return a
        return _aligned(self.op("xor.b32", "b32", a, b), min(known_align(a), known_align(b)))

    def shr(self, a: Scalar, n: int) -> Scalar:
        if isinstance(a, int):
            return a >> n
        return a if n == 0 else self.op("shr.u32", "b32", a, n)

    def shl(self, a: Scalar, n: int) -> Scalar:
        if isinstance(a, int):
            return a << n
        return a if n == 0 else _aligned(self.op("shl.b32", "b32", a, n), known_align(a) << n)

    def cmp(self, rel: str, a: Scalar, b: Scalar, signed: bool = False) -> Value:
        """A predicate a <rel> b over u32 (or s32) values."""
        if rel not in _SIGNED_CMP:
            raise ValueError(f"comparison {rel!r}; allowed: {', '.join(_SIGNED_CMP)}")
        return self.op(f"setp.{rel}.{'s32' if signed else 'u32'}", "pred", a, b)

    def pred_and(self, a: Value, b: Value) -> Value:
        return self.op("and.pred", "pred", a, b)

    def pred_or(self, a: Value, b: Value) -> Value:
        return self.op("or.pred", "pred", a, b)

    def selp(self, a: Scalar, b: Scalar, p: Value, type: str = "b32") -> Value:
        return self.op(f"selp.{'b32' if type == 'b32' else type}", type, a, b, p)

    def wide_mad(self, a: Scalar, b: Scalar, base: Value) -> Value:
        """base (b64) + a * b, with a * b widened from u32 to u64."""
        if isinstance(a, int) and isinstance(b, int):
            return self.op("add.s64", "b64", base, a * b)
        if isinstance(a, int):
            a, b = b, a
        return self.op("mad.wide.u32", "b64", a, b, base)


def _no_zero(b, what: str) -> None:
    if isinstance(b, int) and b == 0:
        raise IRError(f"{what}: a constant divisor of 0 (div.u32 and rem.u32 by zero have no defined result)")


def _aligned(v, align: int):
    if isinstance(v, Value):
        v.align = max(1, min(align, 1 << 32))
    return v


def _op(x):
    if isinstance(x, bool):
        raise TypeError("a bool is not an IR operand")
    if isinstance(x, int):
        return Imm(x)
    if isinstance(x, float):
        return Imm(x, "f32")
    return x
