"""CopyAsync -> cp.async: each thread moves 16-byte chunks of the stage (in the order of
ir/access.copy_chunk), with zero-fill for everything outside the tensor."""
from __future__ import annotations

from ..access import CHUNK, copy_chunk, copy_iterations
from ..instr import Instr
from ..values import Addr, Imm
from .smem import emit_offset, stage_base


def lower_copy(b, ctx, op):
    tile, src = op.dst, op.src
    layout, esize = tile.layout, tile.dtype.bytes
    threads = ctx.kernel.threads
    iterations = copy_iterations(tile, threads)
    base = stage_base(b, ctx, tile, op.stage)
    ld_bytes = ctx.ld_bytes(src)
    for i in range(iterations):
        b.comment(f"chunk {i}: {tile.name}[{op.stage if isinstance(op.stage, int) else 'stage'}] <- {src.name}")
        # The thread-to-chunk assignment (shared with the bank report) is computed once at entry.
        r, colb = copy_chunk(ctx.pro, ctx.pro.add(ctx.tid, i * threads), layout)
        soff = emit_offset(ctx.pro, layout, r, colb)
        grow = b.add(op.row0, r)
        gcol = b.add(op.col0, b.div(colb, esize))
        inside = b.pred_and(b.cmp("lt", grow, src.rows), b.cmp("lt", gcol, src.cols))
        left = b.mul(b.sub(src.cols, gcol), esize)        # bytes to the row's end
        nbytes = b.selp(b.min(left, CHUNK), 0, inside)
        # Out-of-range chunks read nothing (src-size 0); point them at the base anyway.
        grow0 = b.selp(grow, 0, inside)
        gcol0 = b.selp(gcol, 0, inside)
        row_addr = b.wide_mad(grow0, ld_bytes, src.ptr)
        gaddr = b.wide_mad(gcol0, esize, row_addr)
        b.emit(Instr("cp.async.cg.shared.global", (), (Addr(b.add(base, soff)), Addr(gaddr), Imm(CHUNK), nbytes)))
