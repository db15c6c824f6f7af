"""TMA loads and stores (sm_90, ptx.md 6.4): one thread copies a block of a tensor into a
shared stage with cp.async.bulk.tensor, the copies completing on an mbarrier; or a stage out
to a block of a tensor, the stores joining the thread's bulk groups (commit, wait.read).

A stage is stored in panels one swizzle span wide (ir/layout.py), and a TMA box with that
swizzle writes exactly one panel: so a stage takes one box per panel, each box the panel's
rows x (span / element size) columns, at the panel's offset. The tensor map's box is that
panel (TensorMap.box_rows x box_cols)."""
from __future__ import annotations

from ..instr import Instr
from ..values import Addr, TensorAddr
from .mbarrier import barrier_address, first_thread
from .smem import cached_stage_base

TMA_LOAD = "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
TMA_STORE = "cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group"


def panels(layout) -> int:
    """TMA boxes per stage: one per swizzle panel."""
    return layout.row_bytes // layout.panel_bytes if layout.swizzle else 1


def lower_tma_load(b, ctx, op):
    ctx.kernel.features.add("tma")
    layout, tmap = op.dst.layout, op.tmap
    base = cached_stage_base(b, ctx, op.dst, op.stage)
    bar = Addr(barrier_address(b, ctx, op.bar, op.bar_stage))
    first = first_thread(ctx)
    for p in range(panels(layout)):
        dst = Addr(b.add(base, p * layout.rows * layout.panel_bytes) if p else base)
        col = b.add(op.col0, p * tmap.box_cols)
        b.emit(Instr(TMA_LOAD, (), (dst, TensorAddr(tmap.param.value, (col, op.row0)), bar), pred=first,
                     comment=f"{tmap.tensor.name} -> {op.dst.name}, panel {p}" if panels(layout) > 1 else ""))


def lower_tma_store(b, ctx, op):
    ctx.kernel.features.add("tma")
    layout, tmap = op.src.layout, op.tmap
    base = cached_stage_base(b, ctx, op.src, op.stage)
    first = first_thread(ctx)
    for p in range(panels(layout)):
        src = Addr(b.add(base, p * layout.rows * layout.panel_bytes) if p else base)
        col = b.add(op.col0, p * tmap.box_cols)
        b.emit(Instr(TMA_STORE, (), (TensorAddr(tmap.param.value, (col, op.row0)), src), pred=first,
                     comment=f"{op.src.name} -> {tmap.tensor.name}, panel {p}" if panels(layout) > 1 else ""))


def lower_tma_store_commit(b, ctx, op):
    b.emit(Instr("cp.async.bulk.commit_group", (), (), pred=first_thread(ctx)))


def lower_tma_store_wait(b, ctx, op):
    b.emit(Instr("cp.async.bulk.wait_group.read", (), (op.pending,), pred=first_thread(ctx),
                 comment="the stores' shared sources may be written again"))
