"""Warp-collective tensor-core instructions: mma.sync, ldmatrix, stmatrix.

The CTA's threads are viewed as (warps, 32 lanes); one numpy call does every warp at
once. Fragment layouts come from tilegen.sim.tables (the PTX ISA), precomputed here into
gather indices: register words -> tile matrices -> register words.

mma numerics: operands decoded exactly (tf32 keeps only its top 19 bits, as the tensor
core does), products and sums in float64, one rounding to the accumulator type at the end.
Hardware accumulates in (at least) f32, so results agree within f32 accumulation error.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from . import numerics as nm
from . import tables
from .memory import MemoryFault
from .program import Vec
from .state import Context, per_thread

WARP = 32


def _aligned_guard(ins, ctx: Context, warp_partial: bool = False, warp_mask: bool = False):
    """.sync.aligned instructions: .aligned asks every thread of a warp to run them or none, so
    the guard must be uniform in each warp. With warp_partial, whole warps may run one without
    the others (a branch on the warp index): on() then says True for mma (only registers: the
    writes honour the guard), or with warp_mask the warps that run it (ldmatrix / stmatrix,
    whose shared-memory accesses must be those warps' alone). Without, the whole CTA or none."""
    g = ctx.guard(ins)
    if g is None:
        return None

    def on():
        m = g()
        if m.all():
            return True
        if not m.any():
            return False
        if warp_partial and ctx.threads % WARP == 0:
            w = m.reshape(-1, WARP)
            if (w.all(axis=1) | ~w.any(axis=1)).all():
                return w.all(axis=1) if warp_mask else True
        ctx.fail(ins, f"{ins.opcode.split('.')[0]} is .sync.aligned but its guard differs between "
                      f"threads; the emulator needs it uniform across the CTA", kind="divergence",
                 tid=int(np.flatnonzero(m != m[0])[0]))
    return on


def _warps(ctx, ins):
    if ctx.threads % WARP:
        ctx.unsupported(ins, f"{ins.opcode.split('.')[0]} in a CTA of {ctx.threads} threads "
                             f"(not whole warps)")
    return ctx.threads // WARP


def _vec(ctx, ins, op, n, what):
    if not isinstance(op, Vec) or len(op.items) != n:
        ctx.fail(ins, f"{what} must be a vector of {n} registers", kind="unsupported")
    return op.items


def _positions(coords, rows, cols):
    """Index arrays between a (32, regs, per) fragment and its (rows, cols) tile:
    gather[tile_flat] = fragment position, scatter[fragment_flat] = tile position."""
    c = tables.as_array(coords)                      # (32, regs, per, 2)
    tile = (c[..., 0] * cols + c[..., 1]).reshape(-1)
    gather = np.empty(rows * cols, dtype=np.int64)
    gather[tile] = np.arange(tile.size)
    return gather, tile


# ---- mma.sync ---------------------------------------------------------------------------------

@lru_cache(maxsize=None)
def _mma_plan(opcode):
    """Gather indices of one mma form: A, B, C tiles from fragments, D fragments from the tile."""
    L = tables.mma_layout(opcode)
    ga, _ = _positions(L.a, L.m, L.k)
    gb, _ = _positions(L.b, L.k, L.n)
    gc, sc = _positions(L.c, L.m, L.n)
    return ga, gb, gc, sc


def build_mma(ins, ctx: Context):
    try:
        L = tables.mma_layout(ins.opcode)
    except ValueError as e:
        ctx.unsupported(ins, str(e))
    W = _warps(ctx, ins)
    if len(ins.operands) != 4:
        ctx.unsupported(ins, "mma with other than 4 operands")
    d_ops, a_ops, b_ops, c_ops = ins.operands
    d_items = _vec(ctx, ins, d_ops, L.c_regs, "D")
    a_items = _vec(ctx, ins, a_ops, L.a_regs, "A")
    b_items = _vec(ctx, ins, b_ops, L.b_regs, "B")
    c_items = _vec(ctx, ins, c_ops, L.c_regs, "C")
    ga, gb, gc, sc = _mma_plan(ins.opcode)
    acc32 = L.c_type == "f32"
    wdt = np.float32 if acc32 else np.uint32
    ra = [ctx.reader(ins, x, np.uint32) for x in a_items]
    rb = [ctx.reader(ins, x, np.uint32) for x in b_items]
    rc = [ctx.reader(ins, x, wdt) for x in c_items]
    puts = [ctx.writer(ins, x, wdt) for x in d_items]
    on = _aligned_guard(ins, ctx, warp_partial=True)
    n = ctx.threads
    m_, n_, k_ = L.m, L.n, L.k
    a_type, b_type = L.a_type, L.b_type

    def regs(readers, dtype):
        return np.stack([per_thread(r(), n) for r in readers], axis=1).astype(dtype, copy=False)

    def run():
        if on is not None and not on():
            return
        A = nm.decode_operand(regs(ra, np.uint32), a_type).reshape(W, -1)[:, ga].reshape(W, m_, k_)
        B = nm.decode_operand(regs(rb, np.uint32), b_type).reshape(W, -1)[:, gb].reshape(W, k_, n_)
        if acc32:
            C = regs(rc, np.float32).reshape(W, -1)[:, gc].reshape(W, m_, n_)
        else:
            C = nm.decode_operand(regs(rc, np.uint32), "f16").reshape(W, -1)[:, gc].reshape(W, m_, n_)
        D = np.matmul(A.astype(np.float64), B.astype(np.float64)) + C
        frag = D.reshape(W, -1)[:, sc].reshape(n, -1)          # (threads, regs * per)
        if acc32:
            out = frag.astype(np.float32)
        else:
            out = np.ascontiguousarray(frag.astype(np.float16)).view(np.uint32)
        for i, put in enumerate(puts):
            put(np.ascontiguousarray(out[:, i]))
    return run


# ---- ldmatrix / stmatrix ----------------------------------------------------------------------

def _matrix_setup(ins, ctx):
    try:
        op, num, trans = tables.parse_matrix_opcode(ins.opcode)
    except ValueError as e:
        ctx.unsupported(ins, str(e))
    return (op, num, _warps(ctx, ins)) + _matrix_plan(num, trans)


@lru_cache(maxsize=None)
def _matrix_plan(num, trans):
    """For each (lane, reg, elem): the stack row it comes from and its column; and the lane
    giving each stack row's address."""
    mv = tables.matrix_move(num, trans)
    c = tables.as_array(mv.frag)                             # (32, num, 2, 2)
    rows, cols = c[..., 0].reshape(WARP, -1), c[..., 1].reshape(WARP, -1)
    addr_lane = np.array([mv.address_lane(r // 8, r % 8) for r in range(8 * num)])
    return rows, cols, addr_lane


def _row_offsets(ins, ctx, addr, warps, addr_lane):
    """(len(warps), 8*num) shared byte offsets of the matrix rows of those warps, checked
    (bounds, 16-byte alignment)."""
    a = per_thread(addr(), ctx.threads).astype(np.uint64).reshape(-1, WARP)[warps][:, addr_lane]
    flat = a.reshape(-1)
    owner = (warps[:, None] * WARP + addr_lane[None, :]).reshape(-1)
    bad = flat % np.uint64(16) != 0
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        ctx.fail(ins, "misaligned matrix row address: ldmatrix/stmatrix rows must be 16-byte aligned",
                 kind="misaligned", tid=owner[i], address=int(flat[i]))
    try:
        off = ctx.shared.offsets(flat, 16)
    except MemoryFault as f:
        ctx.fault(ins, f, owner)
    return off.reshape(len(warps), -1)


def _running_warps(on, W):
    """The warps an ldmatrix / stmatrix runs in (all, or those its warp-uniform guard keeps),
    or None when none does."""
    sel = True if on is None else on()
    if sel is False:
        return None
    return np.arange(W) if sel is True else np.flatnonzero(sel)


def build_ldmatrix(ins, ctx: Context):
    op, num, W, rows, cols, addr_lane = _matrix_setup(ins, ctx)
    if len(ins.operands) != 2:
        ctx.unsupported(ins, f"{ins.opcode} with these operands")
    dests = _vec(ctx, ins, ins.operands[0], num, "the destination")
    addr = ctx.address(ins, ins.operands[1])
    puts = [ctx.writer(ins, d, np.uint32) for d in dests]
    on = _aligned_guard(ins, ctx, warp_partial=True, warp_mask=True)
    n = ctx.threads
    lanes_rows = rows.reshape(-1)                          # (32 * num * 2,)
    lanes_cols = cols.reshape(-1)
    byte = np.arange(2)

    def run():
        warps = _running_warps(on, W)
        if warps is None:
            return
        tids = (warps[:, None] * WARP + np.arange(WARP)).reshape(-1)
        off = _row_offsets(ins, ctx, addr, warps, addr_lane)               # (warps, 8num)
        # Byte offsets every receiving lane reads: its row start + 2 * column (+0, +1).
        src = off[:, lanes_rows] + 2 * lanes_cols                          # (warps, 32*num*2)
        per_lane = (src.reshape(tids.size, -1)[:, :, None] + byte).reshape(tids.size, -1)
        v = ctx.shadow.read(tids, per_lane, ins.line)
        if v:
            ctx.violation(ins, v, tids)
        halves = ctx.shared.words(2)[src // 2]                             # (warps, 32*num*2) uint16
        words = np.zeros((n, num), dtype=np.uint32)                        # (the guard keeps the others')
        words[tids] = np.ascontiguousarray(halves).view(np.uint32).reshape(tids.size, num)
        for i, put in enumerate(puts):
            put(np.ascontiguousarray(words[:, i]))
    return run


def build_stmatrix(ins, ctx: Context):
    op, num, W, rows, cols, addr_lane = _matrix_setup(ins, ctx)
    if len(ins.operands) != 2:
        ctx.unsupported(ins, f"{ins.opcode} with these operands")
    addr = ctx.address(ins, ins.operands[0])
    srcs = _vec(ctx, ins, ins.operands[1], num, "the source")
    readers = [ctx.reader(ins, s, np.uint32) for s in srcs]
    on = _aligned_guard(ins, ctx, warp_partial=True, warp_mask=True)
    n = ctx.threads
    lanes_rows, lanes_cols = rows.reshape(-1), cols.reshape(-1)
    byte = np.arange(2)

    def run():
        warps = _running_warps(on, W)
        if warps is None:
            return
        tids = (warps[:, None] * WARP + np.arange(WARP)).reshape(-1)
        off = _row_offsets(ins, ctx, addr, warps, addr_lane)
        dst = off[:, lanes_rows] + 2 * lanes_cols                          # (warps, 32*num*2)
        per_lane = (dst.reshape(tids.size, -1)[:, :, None] + byte).reshape(tids.size, -1)
        v = ctx.shadow.write(tids, per_lane, ins.line, "stmatrix")
        if v:
            ctx.violation(ins, v, tids)
        words = np.stack([per_thread(r(), n) for r in readers], axis=1).astype(np.uint32)[tids]
        halves = np.ascontiguousarray(words).view(np.uint16).reshape(warps.size, -1)
        ctx.shared.words(2)[dst // 2] = halves
    return run


BUILDERS = {"mma": build_mma, "ldmatrix": build_ldmatrix, "stmatrix": build_stmatrix}
