"""The IR verifier, run after the front-end and after every pass.

Checks: every register is written before it is read (in program order, loops included);
tile ops reference declared tensors and shared tiles; constant stages and fragment origins
lie inside their shared tile; fragments fit their atoms; at instruction level no tile op
is left; shared tiles are aligned as they need (1024 bytes for stages) and inside the allocation.
"""
from __future__ import annotations

from ..errors import IRError
from . import tile as T
from .instr import Comment, If, Instr, Loop, SpinWait
from .values import Addr, TensorAddr, Value, Vec


def verify(kernel):
    defined: set = set()
    if kernel.level == "tile":  # loaded at the entry by lowering; afterwards by their ld.param
        for p in kernel.params:
            defined.update(v for v in (p.value, p.global_value) if v is not None)
    _check_region(kernel, kernel.body, defined)
    if kernel.level == "instr":
        end = 0
        for tile in kernel.shared:
            if tile.offset % tile.align:
                raise IRError(f"shared tile {tile.name} at offset {tile.offset}, not {tile.align}-byte aligned")
            end = max(end, tile.offset + tile.bytes)
        if end > kernel.smem_bytes:
            raise IRError(f"shared tiles end at {end} bytes, beyond the {kernel.smem_bytes} allocated")
    return kernel


def _uses(x):
    if isinstance(x, Value):
        yield x
    elif isinstance(x, Addr):
        yield from _uses(x.base)
    elif isinstance(x, Vec):
        for item in x.items:
            yield from _uses(item)
    elif isinstance(x, TensorAddr):
        yield from _uses(x.desc)
        for c in x.coords:
            yield from _uses(c)


def _check_region(kernel, nodes, defined):
    for node in nodes:
        if isinstance(node, Comment):
            continue
        if isinstance(node, Instr):
            for x in node.ins + ((node.pred,) if node.pred is not None else ()):
                for v in _uses(x):
                    if v not in defined:
                        raise IRError(f"{node.opcode}: reads register {v.hint or v!r} before any write")
            for x in node.outs:
                for v in _uses(x):
                    defined.add(v)
        elif isinstance(node, Loop):
            for x in (node.start, node.stop):
                for v in _uses(x):
                    if v not in defined:
                        raise IRError(f"loop bound {v.hint} used before it is defined")
            defined.add(node.counter)
            _check_region(kernel, node.body, defined)
        elif isinstance(node, If):
            if node.cond not in defined or node.cond.type != "pred":
                raise IRError("if: condition is not a defined predicate")
            # Registers written inside a branch stay visible after it: virtual registers are
            # mutable and ptxas sees the real control flow.
            _check_region(kernel, node.body, defined)
            _check_region(kernel, node.orelse, defined)
        elif isinstance(node, SpinWait):
            _check_region(kernel, node.body, defined)
            if node.until not in defined or node.until.type != "pred":
                raise IRError("spin wait: its condition is not a predicate its body writes")
        elif isinstance(node, T.TileOp):
            if kernel.level == "instr":
                raise IRError(f"{type(node).__name__} left after lowering")
            _check_tile_op(kernel, node, defined)
        else:
            raise IRError(f"unknown IR node {type(node).__name__}")


def _check_tile_op(kernel, op, defined):
    """What every tile op must meet (its operands defined, its fragments whole), then its
    own rules (CHECKS)."""
    where = f" ({op.loc})" if op.loc else ""
    for name in ("stage", "row0", "col0", "matrix", "alpha", "beta"):
        v = getattr(op, name, None)
        if isinstance(v, Value) and v not in defined:
            raise IRError(f"{type(op).__name__}.{name} used before it is defined{where}")
    for frag_name in ("frag", "acc", "a", "b"):
        f = getattr(op, frag_name, None)
        if isinstance(f, T.Fragment) and set(f.regs) != {(i, j) for i in range(f.tiles[0]) for j in range(f.tiles[1])}:
            raise IRError(f"fragment {f.name} registers do not match its {f.tiles} atoms{where}")
    CHECKS[type(op)](kernel, op, defined, where)


def _declared_stage(kernel, tile, stage, where):
    if tile not in kernel.shared:
        raise IRError(f"shared tile {tile.name} is not declared in this kernel{where}")
    if isinstance(stage, int) and not 0 <= stage < tile.stages:
        raise IRError(f"stage {stage} outside {tile.name}'s {tile.stages} stages{where}")


def _check_copy(kernel, op, defined, where):
    _declared_stage(kernel, op.dst, op.stage, where)
    if op.src.dtype != op.dst.dtype:
        raise IRError(f"copy from {op.src.dtype} into a {op.dst.dtype} tile{where}")


def fragment_bounds(op) -> list:
    """For a LoadFragment (or LoadAccumulator): (origin, extent, limit) along the tile's stored rows and columns: the
    fragment fits where 0 <= origin <= limit - extent on both."""
    frag, tile = op.frag, op.src
    rows, cols = _fragment_extent(frag)
    logical = (rows, cols)
    if frag.operand == "C":   # (LoadAccumulator: a row-major tile, logical = stored)
        return list(zip((op.row0, op.col0), logical, (tile.layout.rows, tile.layout.cols)))
    if frag.operand == "A":
        need = logical if op.k_major else (cols, rows)
    else:
        need = (cols, rows) if op.k_major else logical
    origin = (op.row0, op.col0)
    if frag.operand == "A":
        o = origin if op.k_major else origin[::-1]
    else:
        o = origin[::-1] if op.k_major else origin
    return list(zip(o, need, (tile.layout.rows, tile.layout.cols)))


def _check_load(kernel, op, defined, where):
    _declared_stage(kernel, op.src, op.stage, where)
    frag, tile = op.frag, op.src
    for n, extent, limit in fragment_bounds(op):
        if isinstance(n, int) and not 0 <= n <= limit - extent:
            raise IRError(f"fragment {frag.name} at {(op.row0, op.col0)} does not fit in {tile.name} "
                          f"({tile.layout.rows}x{tile.layout.cols}){where}")
        if extent > limit:
            raise IRError(f"fragment {frag.name} ({extent}) larger than {tile.name}{where}")


def _check_mma(kernel, op, defined, where):
    if not (op.acc.operand, op.a.operand, op.b.operand) == ("C", "A", "B"):
        raise IRError(f"mma takes (C, A, B) fragments{where}")
    if not (op.acc.atom is op.a.atom is op.b.atom):
        raise IRError(f"mma fragments of different atoms{where}")


def _nothing_more(kernel, op, defined, where):
    """Ops whose own rules the DSL already enforced when it built them."""


def _fragment_extent(frag):
    tm, tn = frag.tiles
    atom = frag.atom
    if frag.operand == "A":
        return 16 * tm, atom.k
    if frag.operand == "B":
        return atom.k, 8 * tn
    return 16 * tm, 8 * tn


def _check_fragment_arith(kernel, op, defined, where):
    """Elementwise ops, row reductions, masks and operand conversions (ir/lower/elementwise.py)."""
    name = type(op).__name__

    def same_shape(f, g):
        if isinstance(g, T.Fragment):
            return isinstance(f, T.Fragment) and f.atom is g.atom and f.tiles == g.tiles
        return isinstance(f, T.RowVector) and f.atom is g.atom and f.tm == g.tm

    def accumulator(f, what):
        if not (isinstance(f, T.Fragment) and f.operand == "C" and f.reg_type == "f32"):
            raise IRError(f"{name}: {what} must be an f32 accumulator fragment{where}")

    def scalar(x, what):
        if isinstance(x, Value) and (x not in defined or x.type != "f32"):
            raise IRError(f"{name}: {what} is not a defined f32 value{where}")

    if isinstance(op, T.Elementwise):
        if op.fn not in T.ELEMENTWISE_FNS:
            raise IRError(f"elementwise fn {op.fn!r}; known: {', '.join(T.ELEMENTWISE_FNS)}{where}")
        if isinstance(op.out, T.Fragment):
            accumulator(op.out, "out")
        elif not isinstance(op.out, T.RowVector):
            raise IRError(f"{name}: out must be a fragment or a row vector{where}")
        unary = op.fn in ("copy", "exp", "exp2")  # add_if_finite is binary
        if unary != (op.y is None):
            raise IRError(f"{name}: {op.fn} takes {'one operand' if unary else 'two operands'}{where}")
        for what, x in (("x", op.x), ("y", op.y)):
            if isinstance(x, T.Fragment) and not same_shape(x, op.out):
                raise IRError(f"{name}: {what} fragment {x.name} does not match out {op.out.name}{where}")
            if isinstance(x, T.RowVector) and not (x.atom is op.out.atom and x.tm == (
                    op.out.tiles[0] if isinstance(op.out, T.Fragment) else op.out.tm)):
                raise IRError(f"{name}: row vector {x.name} does not cover the rows of {op.out.name}{where}")
            scalar(x, what)
    elif isinstance(op, T.RowReduce):
        accumulator(op.src, "src")
        if op.fn not in ("max", "sum") or not isinstance(op.out, T.RowVector) or op.out.atom is not op.src.atom \
                or op.out.tm != op.src.tiles[0]:
            raise IRError(f"{name}: {op.fn} of {op.src.name} into a row vector of its rows{where}")
    elif isinstance(op, T.MaskFragment):
        accumulator(op.src, "src")
        if not same_shape(op.out, op.src):
            raise IRError(f"{name}: out does not match src{where}")

        def terms(c):
            if isinstance(c, T.MaskLogic):
                for a in c.args:
                    yield from terms(a)
            else:
                for _, t in c.lhs.terms + c.rhs.terms:
                    yield t
        for t in terms(op.cond):
            if isinstance(t, Value) and t not in defined:
                raise IRError(f"{name}: the condition reads {t.hint or t!r} before it is defined{where}")
    elif isinstance(op, T.FragmentToOperand):
        accumulator(op.src, "src")
        d = op.dst
        if d.operand != "A" or d.tiles != (op.src.tiles[0], 1):
            raise IRError(f"{name}: dst must be an A fragment of {op.src.tiles[0]} m-atoms{where}")
        if op.col0 % op.src.atom.n or not 0 <= op.col0 <= op.src.tiles[1] * op.src.atom.n - d.atom.k:
            raise IRError(f"{name}: columns {op.col0}..{op.col0 + d.atom.k} are not whole atoms of {op.src.name}{where}")


def _declared_barrier(kernel, bar, stage, where):
    if bar not in kernel.barriers:
        raise IRError(f"mbarrier {bar.name} is not declared in this kernel{where}")
    if isinstance(stage, int) and not 0 <= stage < bar.stages:
        raise IRError(f"stage {stage} outside mbarrier {bar.name}'s {bar.stages} stages{where}")


def _check_barrier_op(kernel, op, defined, where):
    _declared_barrier(kernel, op.bar, op.stage, where)
    if isinstance(op, T.MBarrierWait):
        p = op.parity
        if isinstance(p, Value) and p not in defined:
            raise IRError(f"mbarrier wait: parity read before it is defined{where}")
        if isinstance(p, int) and p not in (0, 1):
            raise IRError(f"mbarrier wait: parity {p}; allowed 0, 1{where}")


def _check_tma_load(kernel, op, defined, where):
    _declared_stage(kernel, op.dst, op.stage, where)
    _declared_barrier(kernel, op.bar, op.bar_stage, where)
    tmap, lay = op.tmap, op.dst.layout
    if tmap not in kernel.tensor_maps or tmap.param not in kernel.params:
        raise IRError(f"tensor map {tmap.name} is not a parameter of this kernel{where}")
    if tmap.tensor.dtype != op.dst.dtype:
        raise IRError(f"TMA copy from {tmap.tensor.dtype} into a {op.dst.dtype} tile{where}")
    box_cols = lay.panel_bytes // lay.esize if lay.swizzle else lay.cols
    panels = lay.row_bytes // lay.panel_bytes if lay.swizzle else 1
    rows = lay.rows if panels % op.parts == 0 else lay.rows // op.parts   # a share of each panel's rows
    if op.parts < 1 or (panels % op.parts and lay.rows % op.parts):
        raise IRError(f"a TMA copy of part of {op.parts} of {op.dst.name}: the parts must divide its {panels} "
                      f"panels or its {lay.rows} rows{where}")
    if (tmap.box_rows, tmap.box_cols, tmap.swizzle) != (rows, box_cols, lay.mode if lay.swizzle else "none"):
        raise IRError(f"tensor map {tmap.name} has a {tmap.box_rows} x {tmap.box_cols} {tmap.swizzle} box; "
                      f"{op.dst.name}'s copies are {rows} x {box_cols} {lay.mode}{where}")


# The rules of each tile op beyond the common ones (a new op adds its entry).
CHECKS = {
    T.CopyAsync: _check_copy,
    T.CommitGroup: _nothing_more,
    T.WaitGroup: _nothing_more,
    T.Barrier: _nothing_more,
    T.FillFragment: _nothing_more,
    T.LoadFragment: _check_load,
    T.LoadAccumulator: _check_load,
    T.Mma: _check_mma,
    T.SplitTF32: _nothing_more,
    T.StoreFragment: _nothing_more,
    T.StoreRowVector: _nothing_more,
    T.AccumulateFragment: _nothing_more,
    T.Wgmma: _nothing_more,
    T.WgmmaFence: _nothing_more,
    T.WgmmaCommit: _nothing_more,
    T.WgmmaWait: _nothing_more,
    T.FenceProxyAsync: _nothing_more,
    T.Elementwise: _check_fragment_arith,
    T.RowReduce: _check_fragment_arith,
    T.MaskFragment: _check_fragment_arith,
    T.FragmentToOperand: _check_fragment_arith,
    T.MBarrierArrive: _check_barrier_op,
    T.MBarrierWait: _check_barrier_op,
    T.TmaLoad: _check_tma_load,
    T.ClusterSync: _nothing_more,
    T.SetMaxRegisters: _nothing_more,
    T.StoreStage: _nothing_more,
    T.FetchVector: _nothing_more,
    T.ParkVector: _nothing_more,
    T.TmaStore: _nothing_more,
    T.TmaStoreCommit: _nothing_more,
    T.TmaStoreWait: _nothing_more,
}
