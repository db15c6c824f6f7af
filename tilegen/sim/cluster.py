"""Clusters on the emulator (sm_90, ptx.md 6.9): the CTAs of one cluster run side by side.

Each CTA of a cluster has its own Context (registers, shared memory, mbarriers, copies in
flight) and its own decoded code, and runs on a Python thread of its own; one baton passes
between them, so exactly one runs at any time and a run is deterministic. A CTA keeps the
baton until it cannot go on without another CTA of its cluster: a wait on an mbarrier phase
that only a peer's arrival or multicast can complete, or a cluster barrier the others have
not reached. It then hands the baton round the cluster; if it comes back and no CTA made
progress meanwhile, nothing ever will, and the emulator reports the deadlock (with what the
waiting CTA waits for) instead of hanging.

What crosses between CTAs:
- shared::cluster addresses (`mapa.shared::cluster.u32 d, a, rank`): the emulator maps rank
  r's shared memory at CLUSTER_WINDOW + r * RANK_SPAN; a plain shared address means the
  CTA's own;
- `mbarrier.arrive{.release.cluster}.shared::cluster.b64 _, [a]`: an arrival on a peer's
  mbarrier (it must have been initialised: a cluster barrier after mbarrier.init orders that);
- TMA loads with `.multicast::cluster` and a CTA mask: the box lands at the same shared offset
  in every CTA of the mask and completes bytes on each one's mbarrier at the same offset;
- `barrier.cluster.arrive` / `barrier.cluster.wait`: every thread of every CTA arrives, then
  the waits return.
The CTAs' race shadows share one clock and one table of released and acquired arrivals
(sim/race.py Sync), so a stage released by a remote arrival may be refilled by the peer's
multicast, and one that was not is reported.
"""
from __future__ import annotations

import threading

import numpy as np

from .errors import SimError
from .race import Sync
from .signals import Wait
from .state import per_thread

CLUSTER_WINDOW = 1 << 24   # shared::cluster address of rank r's byte at offset o: CLUSTER_WINDOW + r * RANK_SPAN + o
RANK_SPAN = 1 << 20
MAX_CLUSTER = 16


class Aborted(Exception):
    """Another CTA of the cluster failed: this one stops (the first error is reported)."""


class Cluster:
    """The contexts of one cluster's CTAs, by rank, and the baton they run under."""

    def __init__(self, ctxs: list):
        self.ctxs = ctxs
        self.size = len(ctxs)
        self.threads = ctxs[0].threads
        self.sync = Sync(self.threads * self.size)
        self.cv = threading.Condition()
        for ctx in ctxs:
            ctx.cluster = self

    # -- running ----------------------------------------------------------------------------
    def run(self, ctas: list, codes: list, run_cta) -> int:
        """Run the CTAs `ctas` (by rank) side by side; the steps they took."""
        self.sync.reset()
        self.turn, self.finished, self.error = 0, set(), None
        self.steps = [0] * self.size
        self.barrier_phase, self.barrier_arrived = 0, [np.zeros(self.threads, bool) for _ in range(self.size)]
        for ctx, cta in zip(self.ctxs, ctas):
            ctx.start_cta(cta)
        workers = [threading.Thread(target=self._main, args=(r, codes[r], run_cta), daemon=True)
                   for r in range(self.size)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        if self.error is not None:
            raise self.error
        return sum(self.steps)

    def _main(self, rank: int, code, run_cta):
        self._wait_turn(rank)
        try:
            if self.error is None:
                self.steps[rank] = run_cta(self.ctxs[rank], code)
        except Aborted:
            pass
        except BaseException as e:  # noqa: BLE001  (handed to the launching thread)
            if self.error is None:
                self.error = e
        finally:
            with self.cv:
                self.finished.add(rank)
            self._pass(rank)

    def _wait_turn(self, rank: int):
        with self.cv:
            while self.turn != rank:
                self.cv.wait()

    def _pass(self, rank: int):
        """The baton to the next CTA that has not finished."""
        with self.cv:
            for i in range(1, self.size + 1):
                q = (rank + i) % self.size
                if q not in self.finished:
                    self.turn = q
                    break
            self.cv.notify_all()

    def progress(self) -> int:
        return sum(c.progress for c in self.ctxs)

    def block(self, ctx, stuck: SimError):
        """CTA `ctx` waits for something only a peer can do: the others run; returns when one
        of them made progress, raises `stuck` when none could."""
        before = self.progress()
        if any(q != ctx.rank and q not in self.finished for q in range(self.size)):
            self._pass(ctx.rank)
            self._wait_turn(ctx.rank)
        if self.error is not None:
            raise Aborted()
        if self.progress() == before:
            raise stuck

    def peer(self, ins, ctx, rank: int, what: str, tid: int):
        """The context of CTA `rank` of ctx's cluster, still running."""
        if not 0 <= rank < self.size:
            ctx.fail(ins, f"{what} names CTA rank {rank} of a cluster of {self.size}", kind="cluster", tid=tid)
        if rank in self.finished:
            ctx.fail(ins, f"{what} reaches CTA rank {rank} of the cluster after it exited: a CTA must not exit while "
                          f"its peers may still access its shared memory (end with a cluster barrier)",
                     kind="cluster", tid=tid)
        return self.ctxs[rank]


def split_address(ctx, addr: int):
    """(rank, shared offset) of a shared::cluster address (a plain shared address: ctx's own)."""
    if addr >= CLUSTER_WINDOW:
        rank, off = divmod(addr - CLUSTER_WINDOW, RANK_SPAN)
        return int(rank), int(off)
    return ctx.rank, int(addr - ctx.shared.base)


def peer_context(ins, ctx, rank: int, what: str, tid: int):
    """The context of CTA `rank` of ctx's cluster (ctx itself outside clusters, rank 0)."""
    if rank == ctx.rank:
        return ctx
    if ctx.cluster is None:
        ctx.fail(ins, f"{what} names CTA rank {rank}, but the kernel runs without a cluster (launch it with "
                      f"cluster dims, or declare .reqnctapercluster)", kind="cluster", tid=tid)
    return ctx.cluster.peer(ins, ctx, rank, what, tid)


# -- instructions -------------------------------------------------------------------------------

def build_mapa(ins, ctx):
    """mapa.shared::cluster.u32 d, a, rank: a's offset in the shared memory of CTA `rank`."""
    if ins.opcode not in ("mapa.shared::cluster.u32", "mapa.shared::cluster.b32") or len(ins.operands) != 3:
        ctx.unsupported(ins, f"{ins.opcode} (only mapa.shared::cluster.u32 d, a, rank)")
    put = ctx.writer(ins, ins.operands[0], np.uint32)
    addr = ctx.reader(ins, ins.operands[1], np.int64)
    rank = ctx.reader(ins, ins.operands[2], np.int64)
    guard = ctx.guard(ins)
    n = ctx.threads

    def run():
        size = ctx.cluster.size if ctx.cluster is not None else 1
        a, r = per_thread(addr(), n).astype(np.int64), per_thread(rank(), n).astype(np.int64)
        on = np.ones(n, bool) if guard is None else guard()
        off = a - ctx.shared.base
        bad = on & ((r < 0) | (r >= size))
        if bad.any():
            t = int(np.flatnonzero(bad)[0])
            ctx.fail(ins, f"mapa to CTA rank {int(r[t])} of a cluster of {size}", kind="cluster", tid=t)
        bad = on & ((off < 0) | (off >= ctx.shared.size))
        if bad.any():
            t = int(np.flatnonzero(bad)[0])
            ctx.fail(ins, "mapa of an address outside this CTA's shared memory", kind="bounds", tid=t,
                     address=int(a[t]))
        put(np.where(on, CLUSTER_WINDOW + r * RANK_SPAN + off, 0).astype(np.uint32))
    return run


def build_cluster_barrier(ins, ctx):
    """barrier.cluster.arrive{.release,.relaxed}{.aligned} / barrier.cluster.wait{.acquire}{.aligned}."""
    parts = ins.opcode.split(".")
    op, quals = parts[2] if len(parts) > 2 else "", set(parts[3:])
    if op == "arrive" and quals <= {"release", "relaxed", "aligned"}:
        return _cluster_arrive(ins, ctx)
    if op == "wait" and quals <= {"acquire", "aligned"}:
        return _cluster_wait(ins, ctx)
    ctx.unsupported(ins, f"the instruction {ins.opcode}")


def _state(ctx):
    """(every CTA's arrivals at the cluster barrier, the phase), a cluster of one included."""
    cl = ctx.cluster
    if cl is not None:
        return cl
    if ctx.solo_barrier is None:
        ctx.solo_barrier = _Solo(ctx)
    return ctx.solo_barrier


class _Solo:
    """The cluster barrier of a CTA launched without a cluster (a cluster of one)."""

    def __init__(self, ctx):
        self.size, self.ctxs, self.finished = 1, [ctx], set()
        self.barrier_phase, self.barrier_arrived = 0, [np.zeros(ctx.threads, bool)]


def _cluster_arrive(ins, ctx):
    guard = ctx.guard(ins)

    def run():
        st = _state(ctx)
        mask = np.ones(ctx.threads, bool) if guard is None else guard()
        arrived = st.barrier_arrived[ctx.rank]
        if (arrived & mask).any():
            ctx.fail(ins, "barrier.cluster.arrive twice before the phase completed (no barrier.cluster.wait between)",
                     kind="cluster", tid=int(np.flatnonzero(arrived & mask)[0]))
        arrived |= mask
        for t in np.flatnonzero(mask).tolist():
            ctx.cluster_phase[t] = st.barrier_phase     # the phase this thread waits to see complete
        ctx.progress += 1
        if all(a.all() for a in st.barrier_arrived):
            for a in st.barrier_arrived:
                a[:] = False
            st.barrier_phase += 1
            for c in st.ctxs:   # accesses before the barrier, in every CTA, are ordered before those after it
                c.shadow.barrier()
                c.progress += 1
    return run


def _cluster_wait(ins, ctx):
    guard = ctx.guard(ins)
    apart = ctx.masked

    def run():
        st = _state(ctx)
        mask = np.ones(ctx.threads, bool) if guard is None else guard()
        tids = np.flatnonzero(mask)
        if not tids.size:
            return None
        phases = ctx.cluster_phase
        missing = [t for t in tids.tolist() if t not in phases]
        if missing:
            ctx.fail(ins, "barrier.cluster.wait without a barrier.cluster.arrive before it", kind="cluster",
                     tid=missing[0])
        while any(phases[t] >= st.barrier_phase for t in tids.tolist()):
            stuck = _barrier_stuck(ins, ctx, st, int(tids[0]))
            if apart:
                return Wait((stuck, ctx.progress), again=True)
            if ctx.cluster is None:
                raise stuck
            ctx.cluster.block(ctx, stuck)
        for t in tids.tolist():
            del phases[t]
        return None
    return run


def _barrier_stuck(ins, ctx, st, tid) -> SimError:
    waiting = [f"CTA rank {r}: {int((~a).sum())} threads" for r, a in enumerate(st.barrier_arrived) if not a.all()]
    gone = [f"CTA rank {r} exited" for r in sorted(st.finished)]
    return SimError(f"deadlock: the cluster barrier waits for threads that never arrive ({'; '.join(gone + waiting)})",
                    kind="deadlock", line=ins.line, text=ins.text, cta=ctx.cta, tid=tid)


BUILDERS = {"mapa": build_mapa}

__all__ = ["Aborted", "Cluster", "CLUSTER_WINDOW", "RANK_SPAN", "BUILDERS", "build_cluster_barrier", "peer_context",
           "split_address"]
