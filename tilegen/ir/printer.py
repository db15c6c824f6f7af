"""Text form of the IR, for humans (Kernel.ir). Registers print as %hint.N."""
from __future__ import annotations

from . import tile as T
from .instr import Comment, If, Instr, Loop, Role, SpinWait
from .values import Addr, Imm, Sym, TensorAddr, Value, Vec


class _Names:
    def __init__(self):
        self.names: dict = {}
        self.used: dict = {}

    def __call__(self, v: Value) -> str:
        if v not in self.names:
            stem = v.hint or v.type
            n = self.used.get(stem, 0)
            self.used[stem] = n + 1
            self.names[v] = f"%{stem}" + (f".{n}" if n else "")
        return self.names[v]


class _Text:
    """What the one-line renderings of tile ops share: operands, fragments, the kernel."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.names = _Names()

    def val(self, x) -> str:
        if isinstance(x, Value):
            return self.names(x)
        if isinstance(x, (Imm, Sym)):
            return x.text()
        if isinstance(x, Addr):
            return f"[{self.val(x.base)}" + (f"+{x.offset}]" if x.offset else "]")
        if isinstance(x, Vec):
            return "{" + ", ".join(self.val(i) for i in x.items) + "}"
        if isinstance(x, TensorAddr):
            return f"[{self.val(x.desc)}, {{{', '.join(self.val(c) for c in x.coords)}}}]"
        return str(x)

    def frag(self, f: T.Fragment) -> str:
        return f"{f.name}<{f.operand} {f.atom.name} {f.tiles[0]}x{f.tiles[1]}>"

    def thing(self, x) -> str:
        """A fragment, a row vector, a constant or a scalar operand of fragment arithmetic."""
        if isinstance(x, T.Fragment):
            return self.frag(x)
        if isinstance(x, T.RowVector):
            return f"{x.name}<rows {x.tm}x{x.atom.m}>"
        if isinstance(x, (int, float)):
            return repr(float(x))
        return self.val(x)

    def cond(self, c) -> str:
        if isinstance(c, T.MaskLogic):
            if c.op == "not":
                return f"~({self.cond(c.args[0])})"
            return "(" + f" {'&' if c.op == 'and' else '|'} ".join(self.cond(a) for a in c.args) + ")"
        rel = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}[c.rel]
        return f"{self.side(c.lhs)} {rel} {self.side(c.rhs)}"

    def side(self, lin) -> str:
        out = ""
        for sign, t in lin.terms:
            text = {"row": "r", "col": "c"}.get(t) if isinstance(t, str) else str(t) if isinstance(t, int) else self.val(t)
            out += (" + " if out else "") + text if sign > 0 else (" - " if out else "-") + text
        return out or "0"


def _copy(n, t):
    return (f"copy_async {n.dst.name}[{t.val(n.stage)}] <- {n.src.name}[{t.val(n.row0)}, {t.val(n.col0)}]"
            + (" transposed" if n.transpose else ""))


def _load(n, t):
    return (f"{t.frag(n.frag)} = load {n.src.name}[{t.val(n.stage)}] at ({t.val(n.row0)}, {t.val(n.col0)})"
            f" {'K-major' if n.k_major else 'MN-major'}")


def _store(n, t):
    ab = f" alpha={t.val(n.alpha)} beta={t.val(n.beta)}" if n.alpha is not None else ""
    if n.bias is not None:
        ab += f" bias={n.bias.name}[{n.bias_axis}]"
    if n.activation != "none":
        ab += f" activation={n.activation}"
    if n.residual is not None:
        ab += f" residual={n.residual.name}"
    for vec, which in ((n.row_scale, "row"), (n.col_scale, "col")):
        if vec is not None:
            ab += f" scale={vec.name}[{which}]"
    view = "" if any(x is n.dst for x in t.kernel.tensors) else ".T"   # a transposed view
    return f"store {n.dst.name}{view}[{t.val(n.row0)}, {t.val(n.col0)}] <- {t.frag(n.frag)}{ab}"


def _wgmma(n, t):
    a = (t.frag(n.a) if isinstance(n.a, T.Fragment) else
         f"{n.a.name}[{t.val(n.a_stage)}] at ({t.val(n.a_m0)}, {n.k0}) {'K' if n.a_k_major else 'MN'}-major")
    b = f"{n.b.name}[{t.val(n.b_stage)}] at ({n.k0}, {t.val(n.b_n0)}) {'K' if n.b_k_major else 'MN'}-major"
    return f"{t.frag(n.acc)} {'+=' if n.accumulate else '='} wgmma m64n{n.shape.n}k{n.shape.k}({a}, {b})"


def _elementwise(n, t):
    args = ", ".join(t.thing(x) for x in (n.x, n.y) if x is not None)
    return f"{t.thing(n.out)} = {n.fn}({args})"


def _mask(n, t):
    return (f"{t.frag(n.out)} = mask({n.src.name} at ({t.val(n.row0)}, {t.val(n.col0)}): "
            f"{n.value!r} where {t.cond(n.cond)})")


def _arrive(n, t):
    who = "one thread" if n.single else f"one thread per {n.one_per}" if n.one_per else "each thread"
    where = f" of cluster CTA {t.val(n.cta)}" if n.cta is not None else ""
    return (f"arrive {n.bar.name}[{t.val(n.stage)}]{where} ({who}"
            + (f", expecting {n.expect_bytes} B)" if n.expect_bytes else ")"))


def _matrix(n, t) -> str:
    """A stack's map: which matrix."""
    return f" matrix {t.val(n.matrix)}" if n.tmap.batch is not None else ""


def _tma_load(n, t):
    share = f" part {t.val(n.part)}/{n.parts} of the panels," if n.parts > 1 else ""
    cast = f" multicast to CTAs {t.val(n.multicast)}," if n.multicast is not None else ""
    return (f"{n.dst.name}[{t.val(n.stage)}] <- tma {n.tmap.name}{_matrix(n, t)} at stored ({t.val(n.row0)}, {t.val(n.col0)}),"
            f"{share}{cast} completes on {n.bar.name}[{t.val(n.bar_stage)}]")


# One line per tile op: a renderer for each TileOp class (a new op adds its entry).
TEXT = {
    T.CopyAsync: _copy,
    T.CommitGroup: lambda n, t: "commit_group",
    T.WaitGroup: lambda n, t: f"wait_group {n.pending}",
    T.Barrier: lambda n, t: f"barrier {n.ident} ({n.threads} threads)" if n.threads else "barrier",
    T.FillFragment: lambda n, t: f"{t.frag(n.frag)} = fill {n.value}",
    T.LoadFragment: _load,
    T.Mma: lambda n, t: f"{t.frag(n.acc)} {'+=' if n.accumulate else '='} mma({n.a.name}, {n.b.name})",
    T.SplitTF32: lambda n, t: (f"{t.frag(n.hi)}, {t.frag(n.lo)}" + (f", {t.frag(n.finite_hi)}" if n.finite_hi else "")
                               + f" = split_tf32({n.hi.name})"),
    T.StoreFragment: _store,
    T.StoreRowVector: lambda n, t: f"{n.dst.name}[{t.val(n.row0)}.., {t.val(n.col)}] = row vector {n.vec.name}",
    T.AccumulateFragment: lambda n, t: f"{n.frag.name} += {n.src.name}[{t.val(n.row0)}.., {t.val(n.col0)}..]",
    T.LoadAccumulator: lambda n, t: (f"{t.frag(n.frag)} {'+=' if n.add else '='} {n.src.name}[{t.val(n.stage)}] at "
                                     f"({t.val(n.row0)}, {t.val(n.col0)})"),
    T.Wgmma: _wgmma,
    T.WgmmaFence: lambda n, t: "wgmma_fence",
    T.WgmmaCommit: lambda n, t: "wgmma_commit",
    T.WgmmaWait: lambda n, t: f"wgmma_wait {n.pending}",
    T.FenceProxyAsync: lambda n, t: "fence_proxy_async",
    T.Elementwise: _elementwise,
    T.RowReduce: lambda n, t: f"{t.thing(n.out)} = row_{n.fn}({t.frag(n.src)})",
    T.MaskFragment: _mask,
    T.FragmentToOperand: lambda n, t: (f"{t.frag(n.dst)} = to_operand({n.src.name} columns "
                                       f"{n.col0}..{n.col0 + n.dst.atom.k})"),
    T.MBarrierArrive: _arrive,
    T.StoreStage: lambda n, t: (f"{n.dst.name}[{t.val(n.stage)}] = {n.frag.name}[{t.val(n.row0)}.., part {n.part}/{n.parts}]"
                                + (f" * {t.val(n.alpha)}" if n.alpha is not None else "")
                                + (f" (vectors [{t.val(n.vector_buffer)}])" if n.vector_buffer != 0 else "")
                                + (" (barrier before the stores)" if n.sync is not None else "")),
    T.TmaStore: lambda n, t: (f"tma store {n.src.name}[{t.val(n.stage)}] -> {n.tmap.tensor.name}"
                              f"{_matrix(n, t)}[{t.val(n.row0)}, {t.val(n.col0)}]"),
    T.TmaStoreCommit: lambda n, t: "tma store commit",
    T.FetchVector: lambda n, t: (f"fetch {n.sv.name}[{t.val(n.buffer)}] = {n.sv.vec.name}[{t.val(n.origin)}..+"
                                 f"{n.sv.length}] (threads {n.sv.first_thread}..+{n.sv.threads})"),
    T.ParkVector: lambda n, t: f"park {n.sv.name}[{t.val(n.buffer)}] -> {n.sv.tile.name}",
    T.TmaStoreWait: lambda n, t: f"tma store wait{'' if n.writes else '.read'} {n.pending}",
    T.SetMaxRegisters: lambda n, t: f"setmaxnreg {'inc' if n.increase else 'dec'} {n.count}",
    T.MBarrierWait: lambda n, t: f"wait {n.bar.name}[{t.val(n.stage)}] parity {t.val(n.parity)}",
    T.TmaLoad: _tma_load,
    T.ClusterSync: lambda n, t: "cluster sync",
}


def print_ir(kernel) -> str:
    t = _Text(kernel)
    val = t.val
    lines = [f"kernel {kernel.name}  ({kernel.threads} threads, {kernel.target}, {kernel.level} level)"]
    for p in kernel.params:
        lines.append(f"  param {p.name}: {p.type}")
    if kernel.grid is not None:
        lines.append(f"  grid {kernel.grid}")
    for x in kernel.tensors:
        lines.append(f"  tensor {x.name}: {x.dtype} stored {val(x.rows)} x {val(x.cols)}, ld {val(x.ld)}"
                     f" ({'row' if x.logical == 'row' else 'col'}-major)")
    for s in kernel.shared:
        lay = s.layout
        lines.append(f"  shared {s.name}: {s.dtype} {s.stages} x ({lay.rows} x {lay.cols}), {lay.mode},"
                     f" {lay.stage_bytes} B/stage, offset {s.offset}")
    for bar in kernel.barriers:
        lines.append(f"  mbarrier {bar.name}: {bar.stages} x {bar.arrivals} arrival{'s' if bar.arrivals > 1 else ''}, "
                     f"offset {bar.offset}")
    for m in kernel.tensor_maps:
        lines.append(f"  tensor map {m.name}: {m.tensor.name}, box {m.box_rows} x {m.box_cols}, swizzle {m.swizzle}")

    def node(n, depth):
        pad = "  " * depth
        if isinstance(n, Instr):
            guard = f"@{'!' if n.pred_neg else ''}{val(n.pred)} " if n.pred is not None else ""
            outs = ", ".join(val(x) for x in n.outs)
            ins = ", ".join(val(x) for x in n.ins)
            lines.append(f"{pad}{guard}{outs + ' = ' if outs else ''}{n.opcode} {ins}".rstrip())
        elif isinstance(n, Comment):
            lines.append(f"{pad}// {n.text}")
        elif isinstance(n, Loop):
            lines.append(f"{pad}for {val(n.counter)} in range({val(n.start)}, {val(n.stop)}):"
                         + (f"  // {n.comment}" if n.comment else ""))
            for c in n.body:
                node(c, depth + 1)
        elif isinstance(n, SpinWait):
            lines.append(f"{pad}repeat:" + (f"  // {n.comment}" if n.comment else ""))
            for c in n.body:
                node(c, depth + 1)
            lines.append(f"{pad}until {val(n.until)}")
        elif isinstance(n, Role):
            lines.append(f"{pad}role {n.name} (warps {n.first_warp}..{n.end_warp - 1}, while {val(n.cond)}):")
            for c in n.body:
                node(c, depth + 1)
        elif isinstance(n, If):
            lines.append(f"{pad}if {'not ' if n.negate else ''}{val(n.cond)}:")
            for c in n.body:
                node(c, depth + 1)
            if n.orelse:
                lines.append(f"{pad}else:")
                for c in n.orelse:
                    node(c, depth + 1)
        else:
            render = TEXT.get(type(n))
            lines.append(pad + (render(n, t) if render is not None else f"<{type(n).__name__}>"))
            if n.loc:
                lines[-1] += f"    # {n.loc}"

    lines.append("  body:")
    for n in kernel.body:
        node(n, 2)
    return "\n".join(lines) + "\n"
