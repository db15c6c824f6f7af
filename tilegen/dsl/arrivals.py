"""Arrival counters: CTAs of one launch counting, in global memory, who has finished a piece
of shared work, so that the last to finish does what needs all of it (split-K's ordered sum of
slices inside the GEMM kernel, instead of a second kernel).

    F = tg.counters("F")                       # parameter F_ptr: u32 counters, zero between launches
    ...                                        # every thread of the role stores its part
    with tg.if_(F.last_arrival(block, arrivals)):
        ...                                    # this CTA arrived last: every part is visible

last_arrival is a release-acquire handshake at GPU scope (the PTX memory model's release and
acquire patterns, as CUTLASS's semaphores use them): the role's threads meet
at their barrier (their stores happen before thread 0's), thread 0 adds one to the counter with
atom.acq_rel.gpu (its release publishes what the role stored; its acquire, on the last
arrival, makes every other CTA's parts visible), and bar.red.or.pred hands the answer to every
thread of the role (ordering the acquire before their loads). The last arrival puts the
counter back to 0, so counters the host zeroed once serve every later launch on the stream.
A CTA never waits on another: no CTA needs another to be resident, whatever the grid.
"""
from __future__ import annotations

from ..ir import tile as T
from ..ir.instr import Instr
from ..ir.values import Addr, Imm, Value
from .primitives import barrier, declare_param, thread_id
from .scalars import Pred, raw, wrap
from .trace import current, fail


class Counters:
    """What counters() returns: an array of u32 counters in global memory."""

    def __init__(self, name: str, ptr):
        self.name, self.ptr = name, ptr

    def last_arrival(self, index, arrivals) -> Pred:
        """Count this CTA's arrival at counters[index] and return, the same on every thread of
        the role (or of the CTA outside roles), whether it was the `arrivals`-th; the last one
        puts the counter back to 0. Every thread of the role calls it, after its stores."""
        tr = current()
        first, threads = getattr(tr, "role_threads", None) or (0, tr.kernel.threads)
        ident = (getattr(tr, "role_barrier", None) or (0, 0))[0]
        b = tr.builder
        barrier()   # the role's stores happen before thread 0's release
        leader = b.cmp("eq", raw(thread_id()), first)
        at = Addr(b.wide_mad(raw(wrap(index)), 4, self.ptr))
        old = Value("b32", "arrived")
        b.emit(Instr("atom.acq_rel.gpu.global.add.u32", (old,), (at, Imm(1)), pred=leader,
                     comment=f"{self.name}[i] += 1: publishes this CTA's part, sees those before it"))
        last = b.pred_and(b.cmp("eq", old, raw(wrap(arrivals) - 1)), leader)
        b.emit(Instr("st.relaxed.gpu.global.u32", (), (at, Imm(0)), pred=last,
                     comment=f"the last arrival puts {self.name}[i] back to 0 for the next launch"))
        told = Value("pred", "last")
        b.emit(Instr("bar.red.or.pred", (told,), (Imm(ident), Imm(threads), last) if ident else (Imm(0), last),
                     comment="every thread of the role learns whether this CTA arrived last"))
        return Pred(told)


def counters(name: str) -> Counters:
    """Declare `<name>_ptr`: u32 counters in global memory that are 0 before the launch (and,
    each put back by its last arrival, after it)."""
    if not isinstance(name, str) or not name.isidentifier():
        fail(f"counters: name must be an identifier, got {name!r}")
    ptr = declare_param(f"{name}_ptr", "u64", pointer=True)
    current().kernel.arrays.append(T.ArrayDecl(name, "counters", ptr))
    return Counters(name, ptr)


__all__ = ["Counters", "counters"]
