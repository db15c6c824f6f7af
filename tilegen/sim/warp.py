"""Warp shuffles: shfl.sync.{bfly,up,down,idx}.b32, from the PTX ISA (instructions-shfl-sync).

    shfl.sync.mode.b32 d[|p], a, b, c, membermask;

For lane i of a warp: segmask = c[12:8], clamp = c[4:0]; maxLane = (i & segmask) |
(clamp & ~segmask), minLane = i & segmask. The source lane j and its validity:
bfly j = i ^ b, valid if j <= maxLane; up j = i - b, valid if j >= maxLane; down
j = i + b, valid if j <= maxLane; idx j = minLane | (b & ~segmask), valid if j <= maxLane.
An invalid j reads the lane's own a. (The d|p form, which also returns the validity, is
not supported.)

Modelled: every lane of every warp takes part (membermask all ones, no guard: the CTA
runs in lockstep, so a partial warp would be a divergence the emulator cannot express).
"""
from __future__ import annotations

import numpy as np

from .program import Imm
from .state import Context, per_thread

FULL = 0xFFFFFFFF


def build_shfl(ins, ctx: Context):
    parts = ins.opcode.split(".")
    if len(parts) != 4 or parts[1] != "sync" or parts[2] not in ("bfly", "up", "down", "idx") or parts[3] != "b32":
        ctx.unsupported(ins, f"{ins.opcode} (only shfl.sync.{{bfly,up,down,idx}}.b32)")
    if ins.guard is not None:
        ctx.unsupported(ins, "a guarded shfl.sync (every lane of the warp must take part)")
    running = ctx.guard(ins)   # masked code: the warps of the running group (their writes only)
    if len(ins.operands) != 5:
        ctx.unsupported(ins, f"{ins.opcode} with {len(ins.operands)} operands (d, a, b, c, membermask)")
    d, a, b, c, member = ins.operands
    if not isinstance(member, Imm) or (int(member.value) & FULL) != FULL:
        ctx.unsupported(ins, "shfl.sync with a membermask other than 0xffffffff")
    if ctx.threads % 32:
        ctx.unsupported(ins, "shfl.sync in a CTA that is not whole warps")
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
        if running is not None:
            w = running().reshape(-1, 32)
            if not (w.all(axis=1) | ~w.any(axis=1)).all():
                ctx.fail(ins, "shfl.sync run by part of a warp (every lane must take part)", kind="divergence",
                         tid=int(np.flatnonzero(w.any(axis=1) & ~w.all(axis=1))[0]) * 32)
        src = per_thread(ra(), n)
        put(src[warp_base + j])
    return run


BUILDERS = {"shfl": build_shfl}
