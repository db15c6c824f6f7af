"""PTX printer: one small formatting rule per instruction family; unknown opcodes fail.

Output is deterministic: registers are numbered in order of first appearance, labels in
order of emission, so the same IR gives byte-identical PTX.
"""
from __future__ import annotations

from ..arch.targets import ptx_version_for
from ..errors import IRError
from ..ir.instr import Comment, If, Instr, Loop, SpinWait
from ..ir.lower.context import SMEM_SYMBOL
from ..ir.tile import TensorMap
from ..ir.values import Addr, Imm, Sym, TensorAddr, Value, Vec

REG_PREFIX = {"b32": "%r", "f32": "%f", "b64": "%rd", "pred": "%p"}
PARAM_PTX_TYPE = {"u32": ".u32", "s32": ".s32", "f32": ".f32", "u64": ".u64"}
TENSORMAP_BYTES, TENSORMAP_ALIGN = TensorMap.BYTES, TensorMap.ALIGN

# Opcode families tilegen emits (the first dotted component, or the two first for
# cp.async). Anything else is a generator bug and must not reach the PTX.
KNOWN = {
    "mov", "add", "sub", "mul", "mad", "div", "rem", "min", "max", "and", "or", "xor", "not",
    "shl", "shr", "setp", "selp", "cvt", "cvta", "ld", "st", "ldmatrix", "stmatrix", "mma",
    "bar", "fma", "neg", "abs", "ex2", "rcp", "tanh", "cp.async",
    "shfl",  # shfl.sync.bfly: row reductions of accumulator fragments (ir/lower/elementwise.py)
    "redux",  # redux.sync.min: the warp index, marked warp-uniform for ptxas (dsl/kernel.py)
    "wgmma", "fence",  # sm_90a: warpgroup mma from shared memory and its proxy fence (ir/lower/wgmma.py)
    "mbarrier",  # sm_90: mbarriers that TMA copies complete on (ir/lower/mbarrier.py); cp.async.bulk is cp.async's family
    "setmaxnreg",  # sm_90a: warp roles move registers between warpgroups (dsl/roles.py)
    "mapa", "barrier",  # sm_90 clusters: a peer's shared address, the cluster barrier (ir/lower/mbarrier.py)
    "atom",  # arrival counters in global memory (dsl/arrivals.py)
}


class _Names:
    def __init__(self):
        self.count = {t: 0 for t in REG_PREFIX}
        self.names: dict[Value, str] = {}

    def __call__(self, v: Value) -> str:
        if v not in self.names:
            self.names[v] = f"{REG_PREFIX[v.type]}{self.count[v.type]}"
            self.count[v.type] += 1
        return self.names[v]


def _family(opcode: str) -> str:
    return "cp.async" if opcode.startswith("cp.async") else opcode.split(".")[0]


class _Printer:
    def __init__(self):
        self.reg = _Names()
        self.labels = 0
        self.lines: list[str] = []

    def operand(self, x) -> str:
        if isinstance(x, Value):
            return self.reg(x)
        if isinstance(x, (Imm, Sym)):
            return x.text()
        if isinstance(x, int):
            return str(x)
        if isinstance(x, Addr):
            base = self.operand(x.base)
            return f"[{base}+{x.offset}]" if x.offset else f"[{base}]"
        if isinstance(x, Vec):
            return "{" + ", ".join(self.operand(i) for i in x.items) + "}"
        if isinstance(x, TensorAddr):
            return f"[{self.operand(x.desc)}, {{{', '.join(self.operand(c) for c in x.coords)}}}]"
        raise IRError(f"cannot print operand {x!r}")

    def label(self, stem: str) -> str:
        self.labels += 1
        return f"${stem}_{self.labels}"

    def emit(self, text: str, depth: int):
        self.lines.append("    " * depth + text)

    def instr(self, n: Instr, depth: int):
        if _family(n.opcode) not in KNOWN:
            raise IRError(f"codegen has no rule for opcode {n.opcode!r}")
        ops = [self.operand(x) for x in n.outs + n.ins]
        guard = ""
        if n.pred is not None:
            guard = f"@{'!' if n.pred_neg else ''}{self.reg(n.pred)} "
        text = f"{guard}{n.opcode}" + (" " + ", ".join(ops) if ops else "") + ";"
        if n.comment:
            text += f"  // {n.comment}"
        self.emit(text, depth)

    def region(self, nodes, depth: int):
        for n in nodes:
            if isinstance(n, Instr):
                self.instr(n, depth)
            elif isinstance(n, Comment):
                self.emit(f"// {n.text}", depth)
            elif isinstance(n, Loop):
                self.loop(n, depth)
            elif isinstance(n, If):
                self.if_(n, depth)
            elif isinstance(n, SpinWait):
                self.spin(n, depth)
            else:
                raise IRError(f"codegen got a {type(n).__name__}: lower tile ops first")

    def loop(self, n: Loop, depth: int):
        head, end = self.label("loop"), self.label("done")
        c, p = self.reg(n.counter), self.reg(Value("pred"))
        if n.comment:
            self.emit(f"// {n.comment}", depth)
        self.emit(f"mov.u32 {c}, {self.operand(n.start)};", depth)
        self.emit(f"setp.ge.u32 {p}, {c}, {self.operand(n.stop)};", depth)
        self.emit(f"@{p} bra.uni {end};", depth)
        self.lines.append(f"{head}:")
        self.region(n.body, depth + 1)
        self.emit(f"add.u32 {c}, {c}, 1;", depth + 1)
        self.emit(f"setp.lt.u32 {p}, {c}, {self.operand(n.stop)};", depth + 1)
        self.emit(f"@{p} bra.uni {head};", depth + 1)
        self.lines.append(f"{end}:")

    def spin(self, n: SpinWait, depth: int):
        head = self.label("wait")
        if n.comment:
            self.emit(f"// {n.comment}", depth)
        self.lines.append(f"{head}:")
        self.region(n.body, depth + 1)
        self.emit(f"@!{self.reg(n.until)} bra {head};", depth + 1)

    def if_(self, n: If, depth: int):
        end = self.label("endif")
        other = self.label("else") if n.orelse else end
        if n.comment:
            self.emit(f"// {n.comment}", depth)
        self.emit(f"@{'' if n.negate else '!'}{self.reg(n.cond)} bra {other};", depth)
        self.region(n.body, depth + 1)
        if n.orelse:
            self.emit(f"bra.uni {end};", depth + 1)
            self.lines.append(f"{other}:")
            self.region(n.orelse, depth + 1)
        self.lines.append(f"{end}:")


def _param_decl(p) -> str:
    if p.type == "tensormap":  # a CUtensorMap passed by value; TMA takes its generic address
        return f".align {TENSORMAP_ALIGN} .b8 {p.name}[{TENSORMAP_BYTES}]"
    return f"{PARAM_PTX_TYPE[p.type]} {p.name}"


def emit_ptx(kernel) -> str:
    """The whole PTX module for one lowered kernel."""
    if kernel.level != "instr":
        raise IRError("emit_ptx needs instruction-level IR (run the passes first)")
    pr = _Printer()
    pr.region(kernel.body, 1)
    body = pr.lines
    try:
        major, minor = ptx_version_for(kernel.target, sorted(kernel.features))
    except ValueError as e:   # (a feature the kernel's target lacks: a DSL kernel compiled for the default)
        raise IRError(f"{kernel.name}: {e}: compile it for a target that has it (a DSL kernel: "
                      f"tilegen.compile(fn, target='sm_90a'); the DSL's default target is sm_80)") from None
    out = [
        f"// Generated by tilegen: kernel {kernel.name}, {kernel.threads} threads, "
        f"{kernel.smem_bytes} bytes of dynamic shared memory",
        f".version {major}.{minor}",
        f".target {kernel.target}",
        ".address_size 64",
        "",
    ]
    # (declared even with no dynamic shared memory: the entry takes its base regardless)
    out.append(f".extern .shared .align 1024 .b8 {SMEM_SYMBOL}[];")
    out.append("")
    params = ",\n".join(f"    .param {_param_decl(p)}" for p in kernel.params)
    out.append(f".visible .entry {kernel.name}(\n{params}\n)")
    out.append(f".reqntid {kernel.threads}, 1, 1")
    if kernel.cluster != (1, 1, 1):
        out.append(f".reqnctapercluster {', '.join(map(str, kernel.cluster))}")
    out.append("{")
    for t, prefix in REG_PREFIX.items():
        if pr.reg.count[t]:
            out.append(f"    .reg .{t} {prefix}<{pr.reg.count[t]}>;")
    out.append("")
    out.extend(body)
    out.append("    ret;")
    out.append("}")
    return "\n".join(out) + "\n"
