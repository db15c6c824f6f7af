"""CopyAsync -> cp.async: each thread moves 16-byte chunks of the stage (in the order of
ir/access.copy_chunk), with zero-fill for everything outside the tensor; a transposing
copy moves single 4-byte elements instead (ir/access.transpose_element)."""
from __future__ import annotations

from ..access import (CHUNK, TRANSPOSE_BYTES, copy_chunk, copy_chunks, copy_iterations, transpose_element,
                      transpose_elements, transpose_iterations)
from ..instr import Instr
from ..values import Addr, Imm
from ...errors import IRError
from .smem import shared_address


def _uniform_steps(plan, iterations: int):
    """Per iteration, the (row, byte column) step from iteration 0 when it is the same for
    every thread (the usual case), else None. plan(i): per thread, its (row, byte column)."""
    first = plan(0)
    steps = []
    for i in range(iterations):
        deltas = {(r - r0, c - c0) for (r, c), (r0, c0) in zip(plan(i), first)}
        if len(deltas) != 1:
            return None
        steps.append(deltas.pop())
    return steps


def lower_copy(b, ctx, op):
    if op.transpose:
        return lower_transposing_copy(b, ctx, op)
    tile, src = op.dst, op.src
    layout, esize = tile.layout, tile.dtype.bytes
    threads = ctx.kernel.threads
    iterations = copy_iterations(tile, threads)
    ld_bytes = ctx.ld_bytes(src)
    steps = _uniform_steps(lambda i: copy_chunks(tile, threads, i), iterations)
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


def lower_transposing_copy(b, ctx, op):
    """Element (r, c) of the stage is element (c, r) of the tensor's block: one 4-byte
    cp.async each. The thread's first element is computed once; the others sit at
    compile-time steps from it in both memories (immediate offsets), so an element without
    bounds checks costs one instruction."""
    tile, src = op.dst, op.src
    layout, esize = tile.layout, TRANSPOSE_BYTES
    threads = ctx.kernel.threads
    iterations = transpose_iterations(tile, threads)
    steps = _uniform_steps(lambda i: transpose_elements(layout, threads, i), iterations)
    if steps is None:
        raise IRError(f"{tile.name}: the transposing copy's elements do not step uniformly")
    ld_bytes = ctx.ld_bytes(src)
    r0, c0 = transpose_element(ctx.pro, ctx.tid, layout, threads)
    first = transpose_elements(layout, threads, 0)
    r0_values, c0_values = [r for r, _ in first], [c for _, c in first]
    # The stage's rows run along the tensor's columns and its byte columns along the rows.
    grow = b.add(op.row0, b.div(c0, esize))
    gcol = b.add(op.col0, r0)
    gaddr = b.wide_mad(gcol, esize, b.wide_mad(grow, ld_bytes, src.ptr))
    # Room left to each edge (may be negative): element i is outside when its step reaches it.
    row_room = b.sub(src.rows, grow) if op.check_rows else None
    col_room = b.sub(src.cols, gcol) if op.check_cols else None
    prev_rows = 0
    tests = {}  # (room, step) -> predicate: elements in the same tensor row share the row test

    def outside(room, step):
        if (id(room), step) not in tests:
            tests[(id(room), step)] = b.cmp("le", room, step, signed=True)
        return tests[(id(room), step)]

    for i, (dr, dc) in enumerate(steps):
        if i % 8 == 0:
            stage = op.stage if isinstance(op.stage, int) else "stage"
            b.comment(f"elements {i}..{min(i + 8, iterations) - 1}: {tile.name}[{stage}] <- {src.name} transposed")
        dst, disp = shared_address(b, ctx, tile, op.stage, (0, r0, r0_values, dr), (0, c0, c0_values, dc))
        tensor_rows = dc // esize
        if tensor_rows != prev_rows:  # a step down the tensor's rows: its pitch is a runtime value
            gaddr = b.op("add.s64", "b64", gaddr, ctx.row_step(b, src, tensor_rows - prev_rows))
            prev_rows = tensor_rows
        gdisp = dr * esize
        out = ([outside(row_room, tensor_rows)] if row_room is not None else []) + \
              ([outside(col_room, dr)] if col_room is not None else [])
        if not out:
            b.emit(Instr("cp.async.ca.shared.global", (), (Addr(dst, disp), Addr(gaddr, gdisp), Imm(esize))))
            continue
        skip = out[0] if len(out) == 1 else b.pred_or(*out)
        # ignore-src zero-fills the element; its address must still be mapped: the tensor's base.
        here = b.op("add.s64", "b64", gaddr, gdisp) if gdisp else gaddr
        safe = b.op("selp.b64", "b64", src.ptr, here, skip)
        b.emit(Instr("cp.async.ca.shared.global", (), (Addr(dst, disp), Addr(safe), Imm(esize), skip)))
