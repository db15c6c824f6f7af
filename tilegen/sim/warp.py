"""Warp-wide exchanges: shfl.sync.{bfly,up,down,idx}.b32 and redux.sync, from the PTX ISA
(instructions-shfl-sync, instructions-redux-sync).

    shfl.sync.mode.b32 d[|p], a, b, c, membermask;

For lane i of a warp: segmask = c[12:8], clamp = c[4:0]; maxLane = (i & segmask) |
(clamp & ~segmask), minLane = i & segmask. The source lane j and its validity:
bfly j = i ^ b, valid if j <= maxLane; up j = i - b, valid if j >= maxLane; down
j = i + b, valid if j <= maxLane; idx j = minLane | (b & ~segmask), valid if j <= maxLane.
An invalid j reads the lane's own a. (The d|p form, which also returns the validity, is
not supported.)

    redux.sync.op.type d, a, membermask;   op: min, max, add (.u32, .s32); and, or, xor (.b32)

d is the reduction of a over the warp's lanes, in every lane (add wraps modulo 2^32).

Modelled: every lane of every warp takes part (membermask all ones, no guard: the CTA
runs in lockstep, so a partial warp would be a divergence the emulator cannot express).
"""
from __future__ import annotations

import numpy as np

from .program import Imm
from .state import Context, per_thread

FULL = 0xFFFFFFFF


def _whole_warps(ins, ctx: Context, operands: int, names: str):
    """The checks shfl.sync and redux.sync share; returns the running-group mask function."""
    name = ".".join(ins.opcode.split(".")[:2])
    if ins.guard is not None:
        ctx.unsupported(ins, f"a guarded {name} (every lane of the warp must take part)")
    if len(ins.operands) != operands:
        ctx.unsupported(ins, f"{ins.opcode} with {len(ins.operands)} operands ({names})")
    member = ins.operands[-1]
    if not isinstance(member, Imm) or (int(member.value) & FULL) != FULL:
        ctx.unsupported(ins, f"{name} with a membermask other than 0xffffffff")
    if ctx.threads % 32:
        ctx.unsupported(ins, f"{name} in a CTA that is not whole warps")
    return ctx.guard(ins)   # masked code: the warps of the running group (their writes only)


def _check_whole(ins, ctx: Context, running):
    if running is not None:
        w = running().reshape(-1, 32)
        if not (w.all(axis=1) | ~w.any(axis=1)).all():
            name = ".".join(ins.opcode.split(".")[:2])
            ctx.fail(ins, f"{name} run by part of a warp (every lane must take part)", kind="divergence",
                     tid=int(np.flatnonzero(w.any(axis=1) & ~w.all(axis=1))[0]) * 32)


def build_shfl(ins, ctx: Context):
    parts = ins.opcode.split(".")
    if len(parts) != 4 or parts[1] != "sync" or parts[2] not in ("bfly", "up", "down", "idx") or parts[3] != "b32":
        ctx.unsupported(ins, f"{ins.opcode} (only shfl.sync.{{bfly,up,down,idx}}.b32)")
    running = _whole_warps(ins, ctx, 5, "d, a, b, c, membermask")
    d, a, b, c, _ = ins.operands
    put = ctx.writer(ins, d, np.uint32)
    ra = ctx.reader(ins, a, np.uint32)
    rb = ctx.reader(ins, b, np.uint32)
    rc = ctx.reader(ins, c, np.uint32)
    mode = parts[2]
    n = ctx.threads
    lane = (np.arange(n) & 31).astype(np.int64)
    warp_base = np.arange(n) - lane

    def run():
        bv = per_thread(rb(), n).astype(np.int64) & 31
        cv = per_thread(rc(), n).astype(np.int64)
        seg, clamp = (cv >> 8) & 31, cv & 31
        max_lane = (lane & seg) | (clamp & ~seg)
        min_lane = lane & seg
        if mode == "bfly":
            j, ok = lane ^ bv, (lane ^ bv) <= max_lane
        elif mode == "up":
            j = lane - bv
            ok = j >= max_lane
        elif mode == "down":
            j = lane + bv
            ok = j <= max_lane
        else:
            j = min_lane | (bv & ~seg)
            ok = j <= max_lane
        j = np.where(ok, j, lane)
        _check_whole(ins, ctx, running)
        src = per_thread(ra(), n)
        put(src[warp_base + j])
    return run


_REDUX = {("min", "u32"): np.min, ("max", "u32"): np.max, ("min", "s32"): np.min, ("max", "s32"): np.max,
          ("add", "u32"): np.sum, ("add", "s32"): np.sum, ("and", "b32"): np.bitwise_and.reduce,
          ("or", "b32"): np.bitwise_or.reduce, ("xor", "b32"): np.bitwise_xor.reduce}


def build_redux(ins, ctx: Context):
    parts = ins.opcode.split(".")
    if len(parts) != 4 or parts[1] != "sync" or (parts[2], parts[3]) not in _REDUX:
        ctx.unsupported(ins, f"{ins.opcode} (only redux.sync.{{min,max,add}}.{{u32,s32}} and "
                             f"redux.sync.{{and,or,xor}}.b32)")
    running = _whole_warps(ins, ctx, 3, "d, a, membermask")
    d, a, _ = ins.operands
    put = ctx.writer(ins, d, np.uint32)
    ra = ctx.reader(ins, a, np.uint32)
    reduce = _REDUX[(parts[2], parts[3])]
    signed = parts[3] == "s32"
    n = ctx.threads

    def run():
        _check_whole(ins, ctx, running)
        lanes = np.ascontiguousarray(per_thread(ra(), n)).reshape(-1, 32)
        if signed:
            lanes = lanes.view(np.int32)
        elif parts[2] == "add":
            lanes = lanes.astype(np.int64)
        r = np.asarray(reduce(lanes, axis=1)).astype(np.int64) & FULL   # add wraps modulo 2^32
        put(np.repeat(r.astype(np.uint32), 32))
    return run


BUILDERS = {"shfl": build_shfl, "redux": build_redux}
