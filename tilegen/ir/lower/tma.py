"""TMA loads and stores (sm_90, ptx.md 6.4): one thread copies a block of a tensor into a
shared stage with cp.async.bulk.tensor, the copies completing on an mbarrier; or a stage out
to a block of a tensor, the stores joining the thread's bulk groups (commit, wait.read).

A stage is stored in panels one swizzle span wide (ir/layout.py), and a TMA box with that
swizzle writes exactly one panel: so a stage takes one box per panel, each box the panel's
rows x (span / element size) columns, at the panel's offset. The tensor map's box is that
panel (TensorMap.box_rows x box_cols)."""
from __future__ import annotations

from ..instr import Instr
from ..values import Addr, Imm, TensorAddr
from .mbarrier import barrier_address, first_thread
from .smem import cached_stage_base

TMA_LOAD = "cp.async.bulk.tensor.{rank}d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
TMA_STORE = "cp.async.bulk.tensor.{rank}d.global.shared::cta.tile.bulk_group"


def _coords(op, col, row) -> tuple:
    """A box's coordinates, innermost first: (column, row), and a stack's matrix (3-D maps)."""
    return (col, row) if op.tmap.batch is None else (col, row, op.matrix)


def _rank(op) -> int:
    return 2 if op.tmap.batch is None else 3


def panels(layout) -> int:
    """TMA boxes per stage: one per swizzle panel."""
    return layout.row_bytes // layout.panel_bytes if layout.swizzle else 1


def lower_tma_load(b, ctx, op):
    """One box per panel; with parts > 1 only this CTA's share of the panels (part * share ..),
    and with a multicast mask each box lands in every CTA of the mask (ptx.md 6.4)."""
    ctx.kernel.features.add("tma")
    layout, tmap = op.dst.layout, op.tmap
    base = cached_stage_base(b, ctx, op.dst, op.stage)
    bar = Addr(barrier_address(b, ctx, op.bar, op.bar_stage))
    first = first_thread(ctx)
    opcode, extra = TMA_LOAD.format(rank=_rank(op)), ()
    if op.multicast is not None:
        ctx.kernel.features.add("cluster")
        opcode, extra = opcode + ".multicast::cluster", (Imm(op.multicast),)
    panel_bytes = layout.rows * (layout.panel_bytes if layout.swizzle else layout.row_bytes)
    if panels(layout) % op.parts == 0:   # this CTA's share of the panels, whole
        share = panels(layout) // op.parts
        first_panel = b.mul(op.part, share)
        boxes = [(b.add(first_panel, j), 0) for j in range(share)]
    else:                                # this CTA's share of every panel's rows (tmap.box_rows of them)
        boxes = [(p, b.mul(op.part, tmap.box_rows)) for p in range(panels(layout))]
    row_bytes = panel_bytes // layout.rows
    for j, (p, r) in enumerate(boxes):
        dst = Addr(b.add(b.add(base, b.mul(p, panel_bytes)), b.mul(r, row_bytes)))
        col = b.add(op.col0, b.mul(p, tmap.box_cols))
        which = f"panel {p}" if isinstance(p, int) else f"panel {j} of this CTA's {len(boxes)}"
        if not isinstance(r, int) or r:
            which += ", this CTA's share of its rows"
        b.emit(Instr(opcode, (), (dst, TensorAddr(tmap.param.value, _coords(op, col, b.add(op.row0, r))), bar) + extra,
                     pred=first, comment=f"{tmap.tensor.name} -> {op.dst.name}, {which}"
                     if panels(layout) > 1 or op.parts > 1 else ""))


def lower_tma_store(b, ctx, op):
    ctx.kernel.features.add("tma")
    layout, tmap = op.src.layout, op.tmap
    base = cached_stage_base(b, ctx, op.src, op.stage)
    first = first_thread(ctx)
    for p in range(panels(layout)):
        src = Addr(b.add(base, p * layout.rows * layout.panel_bytes) if p else base)
        col = b.add(op.col0, p * tmap.box_cols)
        b.emit(Instr(TMA_STORE.format(rank=_rank(op)), (), (TensorAddr(tmap.param.value, _coords(op, col, op.row0)), src),
                     pred=first,
                     comment=f"{op.src.name} -> {tmap.tensor.name}, panel {p}" if panels(layout) > 1 else ""))


def lower_tma_store_commit(b, ctx, op):
    b.emit(Instr("cp.async.bulk.commit_group", (), (), pred=first_thread(ctx)))


def lower_tma_store_wait(b, ctx, op):
    if op.writes:
        b.emit(Instr("cp.async.bulk.wait_group", (), (op.pending,), pred=first_thread(ctx),
                     comment="the stores are complete: their global writes are visible to this thread"))
        return
    b.emit(Instr("cp.async.bulk.wait_group.read", (), (op.pending,), pred=first_thread(ctx),
                 comment="the stores' shared sources may be written again"))
