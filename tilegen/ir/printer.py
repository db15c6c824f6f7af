"""Text form of the IR, for humans (Kernel.ir). Registers print as %hint.N."""
from __future__ import annotations

from . import tile as T
from .instr import Comment, If, Instr, Loop
from .values import Addr, Imm, Sym, Value, Vec


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


def print_ir(kernel) -> str:
    names = _Names()

    def val(x) -> str:
        if isinstance(x, Value):
            return names(x)
        if isinstance(x, (Imm, Sym)):
            return x.text()
        if isinstance(x, Addr):
            return f"[{val(x.base)}" + (f"+{x.offset}]" if x.offset else "]")
        if isinstance(x, Vec):
            return "{" + ", ".join(val(i) for i in x.items) + "}"
        return str(x)

    lines = [f"kernel {kernel.name}  ({kernel.threads} threads, {kernel.target}, {kernel.level} level)"]
    for p in kernel.params:
        lines.append(f"  param {p.name}: {p.type}")
    for t in kernel.tensors:
        lines.append(f"  tensor {t.name}: {t.dtype} stored {val(t.rows)} x {val(t.cols)}, ld {val(t.ld)}"
                     f" ({'row' if t.logical == 'row' else 'col'}-major)")
    for s in kernel.shared:
        lay = s.layout
        lines.append(f"  shared {s.name}: {s.dtype} {s.stages} x ({lay.rows} x {lay.cols}), {lay.mode},"
                     f" {lay.stage_bytes} B/stage, offset {s.offset}")

    def frag(f: T.Fragment) -> str:
        return f"{f.name}<{f.operand} {f.atom.name} {f.tiles[0]}x{f.tiles[1]}>"

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
        elif isinstance(n, If):
            lines.append(f"{pad}if {'not ' if n.negate else ''}{val(n.cond)}:")
            for c in n.body:
                node(c, depth + 1)
            if n.orelse:
                lines.append(f"{pad}else:")
                for c in n.orelse:
                    node(c, depth + 1)
        elif isinstance(n, T.CopyAsync):
            lines.append(f"{pad}copy_async {n.dst.name}[{val(n.stage)}] <- {n.src.name}[{val(n.row0)}, {val(n.col0)}]"
                         + (" transposed" if n.transpose else ""))
        elif isinstance(n, T.CommitGroup):
            lines.append(f"{pad}commit_group")
        elif isinstance(n, T.WaitGroup):
            lines.append(f"{pad}wait_group {n.pending}")
        elif isinstance(n, T.Barrier):
            lines.append(f"{pad}barrier")
        elif isinstance(n, T.FillFragment):
            lines.append(f"{pad}{frag(n.frag)} = fill {n.value}")
        elif isinstance(n, T.LoadFragment):
            lines.append(f"{pad}{frag(n.frag)} = load {n.src.name}[{val(n.stage)}] at ({val(n.row0)}, {val(n.col0)})"
                         f" {'K-major' if n.k_major else 'MN-major'}")
        elif isinstance(n, T.Mma):
            lines.append(f"{pad}{frag(n.acc)} {'+=' if n.accumulate else '='} mma({n.a.name}, {n.b.name})")
        elif isinstance(n, T.StoreFragment):
            ab = f" alpha={val(n.alpha)} beta={val(n.beta)}" if n.alpha is not None else ""
            if n.bias is not None:
                ab += f" bias={n.bias.name}[{n.bias_axis}]"
            if n.activation != "none":
                ab += f" activation={n.activation}"
            if n.residual is not None:
                ab += f" residual={n.residual.name}"
            view = "" if any(t is n.dst for t in kernel.tensors) else ".T"   # a transposed view
            lines.append(f"{pad}store {n.dst.name}{view}[{val(n.row0)}, {val(n.col0)}] <- {frag(n.frag)}{ab}")
        elif isinstance(n, T.Wgmma):
            a = (frag(n.a) if isinstance(n.a, T.Fragment) else
                 f"{n.a.name}[{val(n.a_stage)}] at ({val(n.a_m0)}, {n.k0}) {'K' if n.a_k_major else 'MN'}-major")
            b = f"{n.b.name}[{val(n.b_stage)}] at ({n.k0}, {val(n.b_n0)}) {'K' if n.b_k_major else 'MN'}-major"
            lines.append(f"{pad}{frag(n.acc)} {'+=' if n.accumulate else '='} wgmma m64n{n.shape.n}k{n.shape.k}({a}, {b})")
        elif isinstance(n, (T.WgmmaFence, T.WgmmaCommit, T.FenceProxyAsync)):
            lines.append(pad + {T.WgmmaFence: "wgmma_fence", T.WgmmaCommit: "wgmma_commit",
                                T.FenceProxyAsync: "fence_proxy_async"}[type(n)])
        elif isinstance(n, T.WgmmaWait):
            lines.append(f"{pad}wgmma_wait {n.pending}")
        elif isinstance(n, T.SplitTF32):
            lines.append(f"{pad}{frag(n.hi)}, {frag(n.lo)} = split_tf32({n.hi.name})")
        elif isinstance(n, T.FRAGMENT_ARITH_OPS):
            lines.append(pad + fragment_arith_text(n, val, frag))
        else:
            lines.append(f"{pad}<{type(n).__name__}>")
        if isinstance(n, T.TileOp) and n.loc:
            lines[-1] += f"    # {n.loc}"

    lines.append("  body:")
    for n in kernel.body:
        node(n, 2)
    return "\n".join(lines) + "\n"


def fragment_arith_text(n, val, frag) -> str:
    """One line for an op of ir/lower/elementwise.py."""
    def thing(x):
        if isinstance(x, T.Fragment):
            return frag(x)
        if isinstance(x, T.RowVector):
            return f"{x.name}<rows {x.tm}x{x.atom.m}>"
        if isinstance(x, (int, float)):
            return repr(float(x))
        return val(x)

    def cond(c):
        if isinstance(c, T.MaskLogic):
            if c.op == "not":
                return f"~({cond(c.args[0])})"
            return "(" + f" {'&' if c.op == 'and' else '|'} ".join(cond(a) for a in c.args) + ")"
        rel = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}[c.rel]
        return f"{side(c.lhs)} {rel} {side(c.rhs)}"

    def side(lin):
        out = ""
        for sign, t in lin.terms:
            text = {"row": "r", "col": "c"}.get(t) if isinstance(t, str) else str(t) if isinstance(t, int) else val(t)
            out += (" + " if out else "") + text if sign > 0 else (" - " if out else "-") + text
        return out or "0"

    if isinstance(n, T.Elementwise):
        args = ", ".join(thing(x) for x in (n.x, n.y) if x is not None)
        return f"{thing(n.out)} = {n.fn}({args})"
    if isinstance(n, T.RowReduce):
        return f"{thing(n.out)} = row_{n.fn}({frag(n.src)})"
    if isinstance(n, T.MaskFragment):
        return (f"{frag(n.out)} = mask({n.src.name} at ({val(n.row0)}, {val(n.col0)}): "
                f"{n.value!r} where {cond(n.cond)})")
    return f"{frag(n.dst)} = to_operand({n.src.name} columns {n.col0}..{n.col0 + n.dst.atom.k})"
