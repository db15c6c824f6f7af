"""Atomics and fences on global memory: atom{.sem}{.scope}.global.{add,exch}.{u32,s32,b32},
fence.{acq_rel,sc}.{gpu,sys} and membar.{gl,sys}.

The emulator runs one CTA at a time and, inside a CTA, the active threads of an instruction
in thread order: each thread's read-modify-write sees the ones before it, so the values
returned are those of one order the GPU could pick. The memory-order and scope qualifiers
and the fences change no value here (every access is sequentially consistent); what they
order between CTAs is checked by ordering.py: an ordinary access of bytes another CTA wrote
must follow a release-acquire chain through these instructions.
"""
from __future__ import annotations

import numpy as np

from .memops import _IGNORED, _misaligned
from .memory import MemoryFault
from .ordering import semantics
from .program import Reg
from .state import Context, per_thread

_OPS = {"add": lambda old, v: old + v, "exch": lambda old, v: v}
_TYPES = {"add": ("u32", "s32"), "exch": ("b32",)}   # (as ptxas takes them: add is arithmetic, exch bitwise)


def build_atom(ins, ctx: Context):
    parts = ins.opcode.split(".")[1:]
    quals = [p for p in parts if p not in _IGNORED and p != "acq_rel"]
    if len(quals) != 3 or quals[0] != "global" or quals[1] not in _OPS or quals[2] not in _TYPES[quals[1]]:
        ctx.unsupported(ins, f"{ins.opcode} (the emulator runs atom.global.add.u32 / .s32 and atom.global.exch.b32)")
    op, t = _OPS[quals[1]], np.uint32
    strong, sem = semantics(ins.opcode.split("."))
    if len(ins.operands) != 3 or not isinstance(ins.operands[0], Reg):
        ctx.unsupported(ins, f"{ins.opcode} with operands {ins.operands!r}")
    dst, where, value = ins.operands
    put = ctx.writer(ins, dst, np.dtype(t))
    read = ctx.reader(ins, value, t)
    addr = ctx.address(ins, where)
    guard = ctx.guard(ins)
    n = ctx.threads
    all_tids = ctx.all_tids

    def run():
        a = per_thread(addr(), n).astype(np.uint64, copy=False)
        v = per_thread(read(), n).astype(t, copy=False)
        act = np.ones(n, dtype=bool) if guard is None else guard()
        if not act.any():
            return
        tids = all_tids[act]
        _misaligned(ctx, ins, a[act], 4, tids, "4-byte atomic")
        old = np.zeros(n, dtype=t)
        try:
            for tid in tids.tolist():   # thread order: each sees the ones before it
                at = a[tid:tid + 1]
                before = ctx.memory.load(at, 4).view(t)[0, 0]
                old[tid] = before
                with np.errstate(over="ignore"):
                    ctx.memory.store(at, np.array([[op(before, v[tid])]], dtype=t).view(np.uint32), 4)
                if strong and ctx.order is not None:
                    ctx.order.strong(ctx, ins, tid, int(at[0]), reads=True, writes=True, rmw=True, sem=sem)
        except MemoryFault as f:
            ctx.fault(ins, f, tids)
        put(old)
    return run


# fence / membar forms that order global memory: PTX's membar.gl is fence.sc.gpu
_FENCES = {"fence.acq_rel.gpu", "fence.acq_rel.sys", "fence.sc.gpu", "fence.sc.sys", "membar.gl", "membar.sys"}


def build_order_fence(ins, ctx: Context):
    """A fence between generic accesses at gpu or system scope (ordering.py: it releases to the
    thread's next strong write and acquires what its strong reads before it saw)."""
    if ins.opcode not in _FENCES or ins.operands:
        ctx.unsupported(ins, f"{ins.opcode} (the emulator runs {', '.join(sorted(_FENCES))})")
    running = ctx.guard(ins)

    def run():
        if ctx.order is not None:
            ctx.order.fence(ctx, ins, ctx.all_tids if running is None else ctx.all_tids[running()])
    return run


BUILDERS = {"atom": build_atom, "membar": build_order_fence}
