"""CopyAsync -> cp.async: each thread moves 16-byte chunks of the stage (in the order of
ir/access.copy_chunk), with zero-fill for everything outside the tensor."""
from __future__ import annotations

from ..access import CHUNK, copy_chunk, copy_chunks, copy_iterations
from ..instr import Instr
from ..values import Addr, Imm
from .smem import shared_address


def _uniform_steps(tile, threads: int, iterations: int):
    """Per iteration, the (row, byte column) step from iteration 0 when it is the same for
    every thread (the usual case), else None."""
    first = copy_chunks(tile, threads, 0)
    steps = []
    for i in range(iterations):
        deltas = {(r - r0, c - c0) for (r, c), (r0, c0) in zip(copy_chunks(tile, threads, i), first)}
        if len(deltas) != 1:
            return None
        steps.append(deltas.pop())
    return steps


def lower_copy(b, ctx, op):
    tile, src = op.dst, op.src
    layout, esize = tile.layout, tile.dtype.bytes
    threads = ctx.kernel.threads
    iterations = copy_iterations(tile, threads)
    ld_bytes = ctx.ld_bytes(src)
    steps = _uniform_steps(tile, threads, iterations)
    # The thread's first chunk (the assignment the bank report reads), computed once at entry.
    r0, c0 = copy_chunk(ctx.pro, ctx.tid, layout)
    r0_values = [r for r, _ in copy_chunks(tile, threads, 0)]
    c0_values = [c for _, c in copy_chunks(tile, threads, 0)]
    row_base = b.add(op.row0, r0)
    col_base = b.add(op.col0, b.div(c0, esize))
    # One running global address, advanced chunk by chunk: it depends on the k step, so
    # the compiler keeps one 64-bit register live instead of hoisting one per chunk.
    gaddr = b.wide_mad(col_base, esize, b.wide_mad(row_base, ld_bytes, src.ptr))
    prev = (0, 0)
    for i in range(iterations):
        b.comment(f"chunk {i}: {tile.name}[{op.stage if isinstance(op.stage, int) else 'stage'}] <- {src.name}")
        if steps is None:  # irregular assignment: everything from the chunk number
            r, colb = copy_chunk(ctx.pro, ctx.pro.add(ctx.tid, i * threads), layout)
            dst, disp = shared_address(b, ctx, tile, op.stage, (r, 0, [0], 0), (0, colb, [0], 0))
            grow, gcol = b.add(op.row0, r), b.add(op.col0, b.div(colb, esize))
            gaddr = b.wide_mad(gcol, esize, b.wide_mad(grow, ld_bytes, src.ptr))
        else:
            dr, dc = steps[i]
            dst, disp = shared_address(b, ctx, tile, op.stage, (0, r0, r0_values, dr), (0, c0, c0_values, dc))
            grow, gcol = b.add(row_base, dr), b.add(col_base, dc // esize)
            if dr != prev[0]:
                gaddr = b.op("add.s64", "b64", gaddr, ctx.row_step(b, src, dr - prev[0]))
            if dc != prev[1]:
                gaddr = b.op("add.s64", "b64", gaddr, dc - prev[1])
            prev = (dr, dc)
        checks = []
        if op.check_rows:
            checks.append(b.cmp("lt", grow, src.rows))
        if op.check_cols:
            checks.append(b.cmp("lt", gcol, src.cols))
        if not checks:
            b.emit(Instr("cp.async.cg.shared.global", (), (Addr(dst, disp), Addr(gaddr), Imm(CHUNK))))
            continue
        inside = checks[0] if len(checks) == 1 else b.pred_and(*checks)
        nbytes = CHUNK
        if op.check_cols:
            nbytes = b.min(b.mul(b.sub(src.cols, gcol), esize), CHUNK)  # bytes to the row's end
        nbytes = b.selp(nbytes, 0, inside)
        # A chunk outside the tensor reads nothing (src-size 0), but its address must still be
        # mapped: point it at the tensor's base.
        safe = b.op("selp.b64", "b64", gaddr, src.ptr, inside)
        b.emit(Instr("cp.async.cg.shared.global", (), (Addr(dst, disp), Addr(safe), Imm(CHUNK), nbytes)))
