"""mbarriers (ptx.md 6.6): mbarrier.init / arrive / arrive.expect_tx / try_wait.parity and
fence.mbarrier_init, with the protocol checks a Hopper pipeline needs.

A barrier lives at an 8-byte aligned shared address. Its phase completes when the pending
arrivals reach zero and the transaction count (bytes announced by expect_tx minus bytes TMA
copies delivered) is zero; then the phase number advances and the arrival count reloads.
try_wait.parity P is true once the phase of parity P completed, i.e. while the phase in
progress has the other parity.

When a wait finds its phase incomplete, the first try fails (as the hardware's may); the
next lets the TMA copies that complete on the barrier land (sim/mbarrier.land). With nothing
left to land, a CTA in lockstep can never complete the phase: the emulator reports the
deadlock (arrivals and bytes missing) instead of hanging. Once warps have parted (warp roles)
the wait lets the other groups run first (a Wait signal), and the deadlock is reported only
when no group can move (sim/runner.py).

Arrivals release and successful waits acquire (SharedShadow.release / acquire): a stage
read before an arrival may be overwritten by a thread that waited for that arrival's phase.

In a cluster (sim/cluster.py) an arrival may go to a peer CTA's barrier through a
shared::cluster address, and a wait whose phase only a peer can complete hands the run to
the peers before it is called a deadlock.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from .cluster import peer_context, split_address
from .signals import Wait
from .errors import SimError
from .memory import MemoryFault
from .program import Mem, Reg, Sym
from .state import Context, per_thread

BAR_BYTES = 8
MAX_COUNT = (1 << 20) - 1


@dataclass
class MBarrierState:
    count: int                     # arrivals per phase
    pending: int                   # arrivals still missing in the phase in progress
    tx: int = 0                    # bytes announced minus bytes delivered, this phase
    phase: int = 0                 # phases completed
    arrived: set = field(default_factory=set)   # this CTA's threads that arrived this phase
    spins: int = 0                 # failed waits in a row on the phase in progress

    def complete_if_done(self, ctx: Context):
        if self.pending == 0 and self.tx == 0:
            if len(self.arrived) == ctx.threads:  # the whole CTA arrived: ordered like bar.sync
                ctx.shadow.barrier()
            self.phase += 1
            self.pending = self.count
            self.arrived = set()
            self.spins = 0
            return True
        return False


@dataclass
class BulkCopy:
    """A TMA copy in flight: `data` goes to shared offsets `offs` when it lands, completing
    `nbytes` of the transaction count of the barrier at shared offset `bar`."""
    bar: int
    offs: np.ndarray
    data: np.ndarray
    nbytes: int
    line: int
    reads: Optional[tuple] = None   # its global reads as issued (sim/ordering.py GlobalOrder.landed), or None


def land(ins, ctx: Context, off: int, waiter: int) -> bool:
    """Land every copy in flight on the barrier at `off` (in issue order), as thread `waiter`
    waits for it; False if none was."""
    mine = [c for c in ctx.bulk if c.bar == off]
    if not mine:
        return False
    ctx.bulk = [c for c in ctx.bulk if c.bar != off]
    bar = ctx.mbarriers[off]
    phase = (ctx.rank, off, bar.phase)   # (the key the waiters acquire once it completes)
    ctx.progress += 1
    for i, c in enumerate(mine):
        ctx.shared.data[c.offs] = c.data
        ctx.shadow.land_bulk(c.offs)
        if c.reads is not None and ctx.order is not None:
            ctx.order.landed(ctx, c.reads, waiter, phase)
        bar.tx -= c.nbytes
        if bar.tx < 0 and bar.pending == 0:
            ctx.fail(ins, f"the TMA copies on {name_of(ctx, off)} deliver {-bar.tx} bytes more than its arrivals "
                          f"announced (expect_tx)", kind="mbarrier")
        if bar.complete_if_done(ctx) and i + 1 < len(mine):
            ctx.fail(ins, f"the phase of {name_of(ctx, off)} completed with {len(mine) - i - 1} more TMA cop"
                          f"{'y' if len(mine) - i == 2 else 'ies'} (issued at PTX line {mine[i + 1].line}) still to "
                          f"land: the arrivals announced fewer bytes (expect_tx) than the copies deliver", kind="mbarrier")
    return True


def name_of(ctx: Context, off: int) -> str:
    return ctx.barrier_names.get(off, f"the mbarrier at shared offset {off}")


def _address(ins, ctx: Context, op):
    if not isinstance(op, Mem):
        ctx.unsupported(ins, f"{ins.opcode} with the operand {op!r} (an address [r] in shared memory)")
    return ctx.address(ins, op)


def _offsets(ins, ctx, addr, tids):
    """The shared offsets of the barrier addresses of threads `tids` (one barrier each)."""
    try:
        off = ctx.shared.offsets(addr, BAR_BYTES)
    except MemoryFault as f:
        ctx.fault(ins, f, tids)
    bad = (addr.astype(np.int64) % BAR_BYTES) != 0
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        ctx.fail(ins, "an mbarrier must be 8-byte aligned", kind="misaligned", tid=tids[i], address=int(addr[i]))
    return off


def _active(ctx, guard):
    return ctx.all_tids if guard is None else ctx.all_tids[guard()]


def _targets(ins, ctx, addr, guard):
    """(threads that run it, the shared offset of each one's barrier), or None when none runs it."""
    tids = _active(ctx, guard)
    if not tids.size:
        return None
    return tids, _offsets(ins, ctx, per_thread(addr(), ctx.threads)[tids].astype(np.uint64), tids)


def state(ins, ctx: Context, off: int, tid: int) -> MBarrierState:
    bar = ctx.mbarriers.get(off)
    if bar is None:
        ctx.fail(ins, f"{name_of(ctx, off)} is used before mbarrier.init", kind="mbarrier", tid=tid,
                 address=ctx.shared.base + off)
    return bar


def build_mbarrier(ins, ctx: Context):
    parts = ins.opcode.split(".")
    op = parts[1] if len(parts) > 1 else ""
    quals = set(parts[2:])
    if op == "arrive" and "shared::cluster" in quals and not quals & {"expect_tx"} \
            and quals <= {"release", "cluster", "shared::cluster", "b64"}:
        return _remote_arrive(ins, ctx)
    if "shared::cta" not in quals and "shared" not in quals:
        ctx.unsupported(ins, f"{ins.opcode} (only .shared::cta barriers, and arrivals on .shared::cluster ones)")
    if op == "init":
        return _init(ins, ctx)
    if op == "arrive":
        return _arrive(ins, ctx, expect="expect_tx" in quals)
    if op == "try_wait" and "parity" in quals:
        return _try_wait(ins, ctx)
    ctx.unsupported(ins, f"the instruction {ins.opcode}")


def _init(ins, ctx):
    if len(ins.operands) != 2:
        ctx.unsupported(ins, f"{ins.opcode} with {len(ins.operands)} operands")
    addr = _address(ins, ctx, ins.operands[0])
    count = ctx.reader(ins, ins.operands[1], np.uint32)
    guard = ctx.guard(ins)
    n = ctx.threads

    def run():
        got = _targets(ins, ctx, addr, guard)
        if got is None:
            return
        tids, offs = got
        c = per_thread(count(), n)[tids]
        for off, k, t in zip(offs.tolist(), c.tolist(), tids.tolist()):
            if not 1 <= k <= MAX_COUNT:
                ctx.fail(ins, f"mbarrier.init with {k} arrivals; allowed 1..{MAX_COUNT}", kind="mbarrier", tid=t)
            ctx.mbarriers[off] = MBarrierState(int(k), int(k))
        ctx.progress += 1
    return run


def _arrive(ins, ctx, expect: bool):
    ops = ins.operands
    if not ops or not isinstance(ops[0], Sym) or ops[0].name != "_" or len(ops) != (3 if expect else 2):
        ctx.unsupported(ins, f"{ins.opcode} with these operands (the sink _, [addr]{', bytes' if expect else ''})")
    addr = _address(ins, ctx, ops[1])
    nbytes = ctx.reader(ins, ops[2], np.uint32) if expect else None
    guard = ctx.guard(ins)
    n = ctx.threads

    def run():
        got = _targets(ins, ctx, addr, guard)
        if got is None:
            return
        tids, offs = got
        tx = per_thread(nbytes(), n)[tids] if expect else None
        ctx.progress += 1
        first_phase = {}   # barrier offset -> its phase when this instruction's first arrival came
        for i, (off, t) in enumerate(zip(offs.tolist(), tids.tolist())):
            bar = state(ins, ctx, off, t)
            if first_phase.setdefault(off, bar.phase) != bar.phase:
                _overflowing_arrivals(ins, ctx, off, bar, first_phase[off], int((offs == off).sum()), t)
            _count_arrival(ins, ctx, ctx, ctx.rank, off, bar, t, int(tx[i]) if expect else 0)
    return run


def _overflowing_arrivals(ins, ctx, off, bar, phase: int, arriving: int, tid: int):
    """One arrive instruction's threads completed a phase and would go on into the next: the
    barrier counts fewer arrivals than the threads that arrive together, so its phases complete
    early (on the GPU, stages refilled while consumers still read them, or a hang)."""
    ctx.fail(ins, f"{arriving} threads arrive on {name_of(ctx, off)} together, but its phase {phase} completed "
                  f"after {bar.count} of them and the rest would count towards phase {phase + 1}: mbarrier.init gave "
                  f"it {bar.count} arrivals a phase, fewer than the threads that arrive here (count every thread "
                  f"that arrives each phase, tilegen.dsl.mbarrier(..., arrivals=N), or arrive from one thread, "
                  f"tilegen.dsl.arrive(..., single=True))", kind="mbarrier", tid=tid)


def _count_arrival(ins, ctx, dest, rank: int, off: int, bar, t: int, tx: int = 0):
    """Thread t of ctx arrives on `bar` (offset off of CTA `dest`, of cluster rank `rank`),
    announcing tx bytes: it releases what it did so far; the phase completes once every
    arrival came and every byte landed."""
    ctx.shadow.release(t, (rank, off, bar.phase))
    bar.tx += tx
    if bar.pending == 0:
        where = "" if dest is ctx else f" of CTA rank {rank}"
        ctx.fail(ins, f"arrives on {name_of(dest, off)}{where} whose phase {bar.phase} already has all its "
                      f"{bar.count} arrivals", kind="mbarrier", tid=t)
    bar.pending -= 1
    if dest is ctx:
        bar.arrived.add(t)
    if bar.complete_if_done(dest):
        _no_copies_left_over(ins, dest, off, t)


def _no_copies_left_over(ins, ctx, off, tid):
    """A phase just completed: copies still landing on this barrier would count towards the
    next phase, a protocol bug (the arrivals announced fewer bytes than the copies carry)."""
    left = [c for c in ctx.bulk if c.bar == off]
    if left:
        ctx.fail(ins, f"the phase of {name_of(ctx, off)} completed while {len(left)} TMA cop"
                      f"{'y' if len(left) == 1 else 'ies'} issued on it (PTX line {left[0].line}) had not landed: "
                      f"the arrivals announced fewer bytes (expect_tx) than the copies deliver",
                 kind="mbarrier", tid=tid)


def _try_wait(ins, ctx):
    ops = ins.operands
    if len(ops) not in (3, 4) or not isinstance(ops[0], Reg) or ops[0].type != "pred":
        ctx.unsupported(ins, f"{ins.opcode} with these operands (a predicate, [addr], parity)")
    put = ctx.writer(ins, ops[0], np.bool_)
    addr = _address(ins, ctx, ops[1])
    parity = ctx.reader(ins, ops[2], np.uint32)
    guard = ctx.guard(ins)
    n = ctx.threads
    apart = ctx.masked   # code for warps that parted: other groups may still arrive

    def run():
        got = _targets(ins, ctx, addr, guard)
        if got is None:
            return
        tids, offs = got
        par = per_thread(parity(), n)[tids] & 1
        done = np.zeros(n, dtype=bool)
        blocked = []
        for off in np.unique(offs).tolist():
            sel = offs == off
            bar = state(ins, ctx, off, int(tids[sel][0]))
            ok = par[sel] != (bar.phase & 1)
            if not ok.all():
                blocked.append(off)
            done[tids[sel]] = ok
            if ok.any():   # they saw the last completed phase of their parity
                ctx.shadow.acquire(tids[sel][ok], (ctx.rank, off, bar.phase - 1))
        # The first failed try only fails (a loop that gives up on a failed try reads too
        # early, and is caught); the next lets the copies land, or, with none left to land,
        # the phase waits on other warps (a deadlock if there are none).
        stuck = None
        for off in blocked:
            bar = ctx.mbarriers[off]
            bar.spins += 1
            if bar.spins > 1 and not land(ins, ctx, off, int(tids[offs == off][0])):
                stuck = _deadlock(ins, ctx, off, bar, int(tids[offs == off][0]))
                if not apart:
                    if ctx.cluster is None:
                        raise stuck
                    ctx.cluster.block(ctx, stuck)   # a peer may arrive or multicast; the loop tries again
        put(done)
        if blocked and apart:
            return Wait(None if stuck is None else (stuck, ctx.progress))
        return None
    return run


def _remote_arrive(ins, ctx):
    """mbarrier.arrive{.release.cluster}.shared::cluster.b64 _, [a]: an arrival on the barrier
    at shared::cluster address a (a peer CTA's, from mapa, or this CTA's own)."""
    ops = ins.operands
    if len(ops) != 2 or not isinstance(ops[0], Sym) or ops[0].name != "_":
        ctx.unsupported(ins, f"{ins.opcode} with these operands (the sink _, [addr])")
    addr = _address(ins, ctx, ops[1])
    guard = ctx.guard(ins)
    n = ctx.threads

    def run():
        tids = _active(ctx, guard)
        if not tids.size:
            return
        a = per_thread(addr(), n)[tids]
        ctx.progress += 1
        for t, x in zip(tids.tolist(), a.tolist()):
            rank, off = split_address(ctx, int(x))
            dest = peer_context(ins, ctx, rank, "a remote mbarrier arrival", t)
            if off % BAR_BYTES or not 0 <= off < dest.shared.size:
                ctx.fail(ins, f"a remote mbarrier arrival at offset {off} of CTA rank {rank}'s shared memory: not an "
                              f"8-byte aligned barrier", kind="misaligned", tid=t, address=int(x))
            bar = dest.mbarriers.get(off)
            if bar is None:
                ctx.fail(ins, f"arrives on {name_of(dest, off)} of CTA rank {rank} before that CTA initialised it "
                              f"(a cluster barrier after mbarrier.init orders the two)", kind="mbarrier", tid=t)
            dest.progress += 1
            _count_arrival(ins, ctx, dest, rank, off, bar, t)
    return run


def _deadlock(ins, ctx, off, bar, tid) -> SimError:
    missing = []
    if bar.pending:
        missing.append(f"{bar.pending} of its {bar.count} arrivals have not come")
    if bar.tx > 0:
        missing.append(f"{bar.tx} announced bytes have not been delivered (no TMA copy left to land on it)")
    if bar.tx < 0:
        missing.append(f"its copies delivered {-bar.tx} bytes more than were announced")
    who = f"warp {tid // 32} waits" if ctx.active is not None else "the CTA waits"
    return SimError(f"deadlock: {who} for phase {bar.phase} (parity {bar.phase & 1}) of {name_of(ctx, off)}, "
                   f"which can never complete: {'; '.join(missing) or 'nothing is missing'}",
                   kind="deadlock", line=ins.line, text=ins.text, cta=ctx.cta, tid=tid)


def build_fence_mbarrier_init(ins, ctx: Context):
    """fence.mbarrier_init.release.cluster: orders the inits before later arrives (the
    emulator applies every instruction in order: nothing to do)."""
    return lambda: None


BUILDERS = {"mbarrier": build_mbarrier}

__all__ = ["MBarrierState", "BulkCopy", "BUILDERS", "build_fence_mbarrier_init", "land", "name_of", "state"]
