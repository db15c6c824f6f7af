"""Order between the CTAs of one launch in global memory.

The emulator runs a launch's CTAs one after another, so every load sees what every earlier
CTA stored; the GPU runs them side by side and guarantees only what the PTX memory model
orders. So the emulator records, for each byte of global memory an ordinary (weak) access
wrote during the launch, which CTA and thread wrote it and when, and an ordinary read or
write of that byte by another CTA must be ordered after the write by a release-acquire
chain (PTX ISA, memory consistency model):

  the write --(same thread, or a barrier or mbarrier arrival that the releasing thread is
      ordered after)--> a release: a strong write or read-modify-write with .release or
      .acq_rel, or one after a fence.acq_rel / fence.sc / membar.gl of the same thread
  --(the location's release sequence: later read-modify-writes continue it, another plain
      strong store ends it)--> an acquire: a strong read or read-modify-write with .acquire
      or .acq_rel, or one followed by a fence of the same thread
  --(same thread, or a barrier or an arrival the reader acquired after it)--> the access.

Strong accesses (atom, ld / st with .relaxed / .acquire / .release / .volatile at gpu or
system scope) are the synchronisation itself and are not checked against each other. Within a
CTA, "ordered" is what the shared-memory race detector knows (race.py: its barrier epochs and
the arrivals each thread acquired).

Also reported: ld.global.nc (the non-coherent path, which is only defined for data no one
writes during the kernel) of bytes written during the launch.

The threads of one CTA are held to race.py's order in global memory too (a barrier, or an
arrival acquired, between one thread's write and another's access, and between one thread's
read and another's write; SimError kind "race").

A write after another CTA's read is held to the same rule the other way round: the reader must
release what it read (its reads ordered before its release as writes are) and the writer acquire
it, else the write may land before the read on the GPU (kind "order", naming the reading CTA).

A TMA store's writes are in flight from its issue until a cp.async.bulk.wait_group (without
.read) of the issuing thread completes its bulk group (sim/tma.py): then they count as that
thread's writes at that point. Before, nothing orders them before any access, the issuing
thread's own included: a release before the completion does not publish them (kind "order"
for another CTA's access, "race" for one of this CTA).

Reads are recorded in every allocation, inputs the launch never wrote before included, so that
a kernel writing into its own input in place (a shift, a transpose) is held to this rule too.

A TMA load's reads are in flight from its issue until the copy lands (sim/mbarrier.land, when a
thread's wait on its barrier finds the phase short of them): before, nothing orders them before any
write, the issuing thread's own included (an ordinary read of those bytes meanwhile does not replace
the record); after, they count as reads by the thread whose wait landed them, and every thread that
saw the phase the copy completed (in any CTA a multicast landed in) is ordered after them, and so is
every thread that acquired an arrival such a thread made after seeing it.

Limits: per byte only the last read since its last write is kept (one CTA's, one thread's).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

NOBODY = -1
IN_FLIGHT_EPOCH = np.iinfo(np.int32).max   # a TMA store's write not complete yet: no epoch,
IN_FLIGHT = np.iinfo(np.int64).max          # no clock comes after it
SEMANTICS = ("relaxed", "acquire", "release", "acq_rel")


@dataclass
class Grant:
    """What thread `tid` of CTA `cta` released: its CTA's writes of epochs before `epoch`,
    its own writes up to `clock`, and those of threads whose arrivals it acquired (`row`:
    the latest arrival of each thread it acquired, or None)."""
    cta: int
    tid: int
    epoch: int
    clock: int
    row: Optional[np.ndarray]
    line: int

    def covers(self, tids, epochs, clocks) -> np.ndarray:
        ok = (epochs < self.epoch) | ((tids == self.tid) & (clocks <= self.clock))
        if self.row is not None:
            ok |= self.row[tids] >= clocks
        return ok


@dataclass
class Known:
    """Grants thread `tid` of this CTA acquired at (`epoch`, `clock`) of its CTA's shadow."""
    grants: tuple
    tid: int
    epoch: int
    clock: int


class _Accesses:
    """Per byte of one allocation: the CTA (NOBODY: none), thread, epoch, clock and PTX line of
    the last access of one kind."""

    def __init__(self, n: int):
        self.cta = np.full(n, NOBODY, dtype=np.int32)
        self.tid = np.zeros(n, dtype=np.int16)      # (a CTA has at most 1024 threads)
        self.epoch = np.zeros(n, dtype=np.int32)
        self.clock = np.zeros(n, dtype=np.int64)
        self.line = np.zeros(n, dtype=np.int32)
        self.copy = np.full(n, NOBODY, dtype=np.int32)   # a TMA load's reads: its GlobalOrder.copies index

    def record(self, o, cta: int, tids, epoch: int, clock: int, line: int, copy: int = NOBODY):
        self.cta[o], self.tid[o], self.epoch[o], self.clock[o], self.line[o] = cta, tids, epoch, clock, line
        self.copy[o] = copy


class _Bytes(_Accesses):
    """The last weak write of each byte of one allocation (the fields of _Accesses), and in
    `read` the last weak read since that write (NOBODY: none)."""

    def __init__(self, size: int):
        n = max(int(size), 1)
        super().__init__(n)
        self.read = _Accesses(n)


def cta_index(ctx) -> int:
    x, y, z = ctx.cta
    gx, gy, _ = ctx.grid
    return int(x + gx * (y + gy * z))


def cta_of(ctx, index: int) -> tuple:
    gx, gy, _ = ctx.grid
    return index % gx, index // gx % gy, index // (gx * gy)


class GlobalOrder:
    """One launch's record of global writes and of the release sequences of its CTAs."""

    def __init__(self):
        self.bytes: dict = {}        # allocation base -> _Bytes
        self.sequences: dict = {}    # global address of a strong location -> [Grant] of its release sequence
        self.known: dict = {}        # CTA -> [Known]
        self.fenced: dict = {}       # (CTA, tid) -> the Grant its last fence made (its next strong write releases it)
        self.pending: dict = {}      # (CTA, tid) -> grants its strong reads saw, acquired by its next fence
        self.copies: list = []       # per TMA load: [(CTAs, (rank, barrier), phase)] of each landing

    # -- where a thread of the running CTA stands ------------------------------------------
    @staticmethod
    def _grant(ctx, tid: int, line: int) -> Grant:
        sh = ctx.shadow
        sh.clock += 1
        row = None
        if sh.acquired is not None:
            row = sh.acquired[tid + sh.base, sh.base:sh.base + ctx.threads].copy()
        return Grant(cta_index(ctx), int(tid), sh.epoch, sh.clock, row, line)

    def _acquire(self, ctx, tid: int, grants):
        if grants:
            sh = ctx.shadow
            sh.clock += 1
            self.known.setdefault(cta_index(ctx), []).append(Known(tuple(grants), int(tid), sh.epoch, sh.clock))

    @staticmethod
    def _knows(ctx, k: Known, tids: np.ndarray) -> np.ndarray:
        """Whether threads `tids` of the running CTA are ordered after k's acquire."""
        sh = ctx.shadow
        ok = (tids == k.tid) | (sh.epoch > k.epoch)
        if sh.acquired is not None:
            ok |= sh.acquired[tids + sh.base, k.tid + sh.base] >= k.clock
        return ok

    # -- weak accesses ----------------------------------------------------------------------
    def _spans(self, memory, addrs, width, lengths):
        """(shadow or None, allocation, rows, byte offsets (rows, width), valid) for each
        allocation the accesses fall in (addresses already checked by the access itself)."""
        for a, pos, off in memory.locate(addrs, 1):
            rows = np.arange(addrs.size) if pos is None else pos
            offs = off[:, None] + np.arange(width)
            valid = np.ones(offs.shape, dtype=bool) if lengths is None else np.arange(width) < lengths[rows][:, None]
            valid &= offs < a.size
            yield self.bytes.get(a.base), a, rows, np.minimum(offs, max(a.size - 1, 0)), valid

    def _unordered(self, ctx, sh: _Accesses, tids, offs, valid) -> np.ndarray:
        """Bytes `offs` (valid ones) whose access recorded in `sh` nothing orders before threads
        `tids`' access now: another CTA's with no release-acquire chain, or another thread's of
        this CTA with no barrier or acquired arrival in between (race.py's order)."""
        me = cta_index(ctx)
        writer = sh.cta[offs]
        bad = valid & (writer != NOBODY)
        if not bad.any():
            return bad
        r, c = np.nonzero(bad)
        o = offs[r, c]
        t = tids[r]
        w_cta, w_tid, w_epoch, w_clock = writer[r, c], sh.tid[o], sh.epoch[o], sh.clock[o]
        mine = w_cta == me
        ok = mine & self._ordered_here(ctx, w_tid, w_epoch, w_clock, t)
        for k in self.known.get(me, ()):
            knows = ~mine & self._knows(ctx, k, t)
            if not knows.any():
                continue
            for g in k.grants:
                ok |= knows & (w_cta == g.cta) & g.covers(w_tid, w_epoch, w_clock)
        landed = ~ok & (sh.copy[o] != NOBODY) & (w_clock != IN_FLIGHT)
        if landed.any():
            ok[landed] = self._saw_landing(ctx, sh.copy[o][landed], t[landed])
        bad[r[ok], c[ok]] = False
        return bad

    def _saw_landing(self, ctx, copies, tids) -> np.ndarray:
        """Whether threads `tids` of the running CTA are ordered after the landing of TMA loads
        `copies` (GlobalOrder.copies indices): they saw a phase a landing completed, or acquired an
        arrival of a thread after it saw one (its first sight of the last phase it saw, a bound)."""
        me, sync, base = cta_index(ctx), ctx.shadow.sync, ctx.shadow.base
        ok = np.zeros(tids.size, dtype=bool)
        for copy in np.unique(copies).tolist():
            sel = copies == copy
            ids = tids[sel].astype(np.int64) + base
            got = np.zeros(ids.size, dtype=bool)
            for ctas, bar, phase in self.copies[copy]:
                seen = sync.seen.get(bar) if me in ctas else None
                if seen is None:
                    continue
                saw, when = seen[0] >= phase, seen[1]
                got |= saw[ids]
                if sync.acquired is not None and saw.any():
                    got |= (sync.acquired[np.ix_(ids, np.flatnonzero(saw))] >= when[saw]).any(axis=1)
            ok[sel] = got
        return ok

    @staticmethod
    def _ordered_here(ctx, w_tid, w_epoch, w_clock, tids) -> np.ndarray:
        """Whether writes of this CTA's threads w_tid (at w_epoch, w_clock) come before threads
        tids' access now: the same thread, a CTA barrier since, or an arrival of the writer
        after the write that the accessing thread acquired."""
        sh = ctx.shadow
        ok = ((w_tid == tids) & (w_clock != IN_FLIGHT)) | (w_epoch < sh.epoch)
        if sh.acquired is not None:
            ok |= sh.acquired[tids + sh.base, w_tid.astype(np.int64) + sh.base] >= w_clock
        return ok

    def _report(self, ctx, ins, what: str, sh: _Accesses, a, tids, offs, bad, did: str = "wrote"):
        r, c = np.argwhere(bad)[0]
        o = int(offs[r, c])
        w_cta = int(sh.cta[o])
        where = f"(thread {int(sh.tid[o])}, PTX line {int(sh.line[o])})"
        if did == "read" and int(sh.copy[o]) != NOBODY and int(sh.clock[o]) != IN_FLIGHT:
            ctx.fail(ins, f"{what} global memory that a TMA load (PTX line {int(sh.line[o])}) read, with nothing "
                          f"ordering this write after the copy: this thread neither saw the barrier phase the copy "
                          f"completed nor is ordered after a thread that did (by a barrier, or by waiting for an "
                          f"arrival such a thread made after it saw the phase)",
                     kind="race" if w_cta == cta_index(ctx) else "order", tid=int(tids[r]), address=a.base + o)
        if did == "read" and int(sh.clock[o]) == IN_FLIGHT:
            mine = w_cta == cta_index(ctx)
            whose = "this CTA" if mine else f"CTA {cta_of(ctx, w_cta)}"
            ctx.fail(ins, f"{what} global memory that a TMA load of {whose} {where} may still be reading: its reads "
                          f"are done when the copy has landed, which a wait on its mbarrier sees (the DSL's "
                          f"mbarrier_wait; threads that did not wait are ordered after a thread that did by a "
                          f"barrier or by an arrival of it they wait for)",
                     kind="race" if mine else "order", tid=int(tids[r]), address=a.base + o)
        if did == "wrote" and int(sh.clock[o]) == IN_FLIGHT:
            mine = w_cta == cta_index(ctx)
            whose = "this CTA" if mine else f"CTA {cta_of(ctx, w_cta)}"
            publish = "a barrier or an arrival publishes" if mine else "a barrier and a release publish"
            ctx.fail(ins, f"{what} global memory that a TMA store of {whose} {where} may still be writing: no "
                          f"cp.async.bulk.wait_group (without .read) of thread {int(sh.tid[o])} completed it before "
                          f"this access was ordered after it (wait_group.read only frees the store's shared source; "
                          f"the DSL's tma_store_wait(n, writes=True) waits for the writes, then {publish} them)",
                     kind="race" if mine else "order", tid=int(tids[r]), address=a.base + o)
        if w_cta == cta_index(ctx):
            ctx.fail(ins, f"global-memory race: {what} bytes that thread {int(sh.tid[o])} of this CTA {did} (PTX line "
                          f"{int(sh.line[o])}) with no barrier in between (nor an mbarrier arrival after the "
                          f"{'write' if did == 'wrote' else 'read'} that this thread waited for)", kind="race",
                     tid=int(tids[r]), address=a.base + o)
        ctx.fail(ins, f"{what} global memory that CTA {cta_of(ctx, w_cta)} {did} {where} with nothing ordering that "
                      f"{'write' if did == 'wrote' else 'read'} before this access: CTAs run side by side, so the "
                      f"{'writer' if did == 'wrote' else 'reader'} must release it (its threads meet at a barrier, "
                      f"then one thread's atom.release / atom.acq_rel, or a fence.acq_rel.gpu before a strong write) "
                      f"and this CTA acquire it (atom.acquire / atom.acq_rel / ld.acquire, or a fence after a strong "
                      f"read; then a barrier for its other threads) before the access",
                 kind="order", tid=int(tids[r]), address=a.base + o)

    def read(self, ctx, ins, tids, addrs, width: int, lengths=None, nc: bool = False, copy: int = NOBODY):
        """Weak reads of `width` bytes (the first lengths[i] of row i) at addrs by threads tids;
        with `copy` (new_copy()), a TMA load's, recorded as not done (landed() completes them)."""
        for sh, a, rows, offs, valid in self._spans(ctx.memory, addrs, width, lengths):
            if sh is None:   # (read before any write: a later write by another CTA is checked against it)
                sh = self.bytes[a.base] = _Bytes(a.size)
            if nc:
                hit = valid & (sh.cta[offs] != NOBODY)
                if hit.any():
                    r, c = np.argwhere(hit)[0]
                    o = int(offs[r, c])
                    ctx.fail(ins, f"ld.global.nc reads global memory that CTA {cta_of(ctx, int(sh.cta[o]))} wrote "
                                  f"during this launch (thread {int(sh.tid[o])}, PTX line {int(sh.line[o])}): the "
                                  f"non-coherent path is defined only for data no one writes while the kernel runs",
                             kind="order", tid=int(tids[rows][r]), address=a.base + o)
            bad = self._unordered(ctx, sh, tids[rows], offs, valid)
            if bad.any():
                self._report(ctx, ins, "reads", sh, a, tids[rows], offs, bad)
            ctx.shadow.clock += 1
            in_flight = copy != NOBODY
            if not in_flight:   # (a TMA load's read still in flight stays the record: it is the later one)
                valid = valid & (sh.read.clock[offs] != IN_FLIGHT)
            sh.read.record(offs[valid], cta_index(ctx), np.broadcast_to(tids[rows][:, None], offs.shape)[valid],
                           IN_FLIGHT_EPOCH if in_flight else ctx.shadow.epoch,
                           IN_FLIGHT if in_flight else ctx.shadow.clock, ins.line, copy)

    def write(self, ctx, ins, tids, addrs, width: int, in_flight: bool = False):
        """Weak writes of `width` bytes at addrs by threads tids (checked, then recorded); with
        `in_flight`, a TMA store's, recorded as not complete (complete() completes them)."""
        shadow = ctx.shadow
        for sh, a, rows, offs, valid in self._spans(ctx.memory, addrs, width, None):
            if sh is None:
                sh = self.bytes[a.base] = _Bytes(a.size)
            t = tids[rows]
            bad = self._unordered(ctx, sh, t, offs, valid)
            if bad.any():
                self._report(ctx, ins, "writes", sh, a, t, offs, bad)
            bad = self._unordered(ctx, sh.read, t, offs, valid)
            if bad.any():
                self._report(ctx, ins, "writes", sh.read, a, t, offs, bad, did="read")
            self._same_bytes(ctx, ins, a, t, offs, valid)
            o = offs[valid]
            shadow.clock += 1
            sh.record(o, cta_index(ctx), np.broadcast_to(t[:, None], offs.shape)[valid],
                      IN_FLIGHT_EPOCH if in_flight else shadow.epoch, IN_FLIGHT if in_flight else shadow.clock, ins.line)
            sh.read.cta[o] = NOBODY   # later reads read this write

    def complete(self, ctx, tid: int, addrs, width: int):
        """Thread tid's wait_group completed its TMA stores' writes of `width` bytes at addrs:
        those still recorded as in flight become its writes now (its own later accesses, a
        barrier or its release then order them)."""
        shadow = ctx.shadow
        shadow.clock += 1
        for sh, a, rows, offs, valid in self._spans(ctx.memory, addrs, width, None):
            if sh is None:
                continue
            o = offs[valid]
            mine = o[(sh.cta[o] == cta_index(ctx)) & (sh.tid[o] == tid) & (sh.clock[o] == IN_FLIGHT)]
            sh.epoch[mine], sh.clock[mine] = shadow.epoch, shadow.clock

    def new_copy(self) -> int:
        """An index for a TMA load's reads (landed() records where it lands)."""
        self.copies.append([])
        return len(self.copies) - 1

    def landed(self, ctx, reads, waiter: int, phase):
        """A TMA load's copy landed in the running CTA as its thread `waiter` waited for `phase`
        ((rank, barrier, phase) of the mbarrier it completes): the threads that see that phase are
        ordered after its reads (reads=(copy, CTA, thread, addrs, width) of its issue); the first
        landing (a multicast lands in several CTAs) makes the reads still in flight the waiter's."""
        copy, cta, tid, addrs, width = reads
        shadow = ctx.shadow
        cluster = getattr(ctx, "cluster", None)
        ctas = frozenset(cta_index(c) for c in cluster.ctxs) if cluster is not None else frozenset((cta_index(ctx),))
        self.copies[copy].append((ctas, phase[:-1], phase[-1]))
        shadow.clock += 1
        for sh, a, rows, offs, valid in self._spans(ctx.memory, addrs, width, None):
            if sh is None:
                continue
            rd = sh.read
            o = offs[valid]
            o = o[(rd.copy[o] == copy) & (rd.clock[o] == IN_FLIGHT)]
            rd.cta[o], rd.tid[o], rd.epoch[o], rd.clock[o] = cta_index(ctx), waiter, shadow.epoch, shadow.clock

    @staticmethod
    def _same_bytes(ctx, ins, a, tids, offs, valid):
        """Two threads of one instruction writing one byte: a race whichever value lands."""
        who = np.broadcast_to(tids[:, None], offs.shape)[valid]
        flat = offs[valid]
        if flat.size < 2:
            return
        order = np.lexsort((who, flat))
        f, w = flat[order], who[order]
        clash = (f[1:] == f[:-1]) & (w[1:] != w[:-1])
        if clash.any():
            i = int(np.flatnonzero(clash)[0])
            ctx.fail(ins, f"global-memory race: threads {int(w[i])} and {int(w[i + 1])} write the same bytes in one "
                          f"instruction", kind="race", tid=int(w[i + 1]), address=a.base + int(f[i]))

    # -- strong accesses and fences --------------------------------------------------------
    def strong(self, ctx, ins, tid: int, address: int, *, reads: bool, writes: bool, rmw: bool, sem: str):
        """One thread's strong access of the location at `address`, in thread order."""
        key = (cta_index(ctx), int(tid))
        if reads:
            seen = self.sequences.get(address, [])
            if sem in ("acquire", "acq_rel"):
                self._acquire(ctx, tid, seen)
            elif seen:
                self.pending.setdefault(key, []).extend(seen)
        if writes:
            grant = self._grant(ctx, tid, ins.line) if sem in ("release", "acq_rel") else self.fenced.get(key)
            if rmw:
                if grant is not None:
                    self.sequences.setdefault(address, []).append(grant)
            else:
                self.sequences[address] = [grant] if grant is not None else []

    def fence(self, ctx, ins, tids):
        """fence.acq_rel / fence.sc (gpu or system scope) by threads tids: releases what each did
        so far to its next strong write, and acquires what its strong reads before it saw."""
        me = cta_index(ctx)
        for t in np.asarray(tids).tolist():
            self.fenced[(me, t)] = self._grant(ctx, t, ins.line)
            self._acquire(ctx, t, self.pending.pop((me, t), None))


def semantics(parts) -> tuple:
    """(strong, sem) of a global ld / st / atom from its qualifiers: strong at gpu or system
    scope with .relaxed / .acquire / .release / .acq_rel / .volatile (atom: always, relaxed by
    default); a .cta scope orders nothing between CTAs."""
    quals = set(parts)
    sem = next((s for s in SEMANTICS if s in quals), None)
    if "volatile" in quals:
        sem = "relaxed"
    if parts and parts[0] == "atom" and sem is None:
        sem = "relaxed"
    if sem is None or "cta" in quals:
        return False, None
    return True, sem


__all__ = ["GlobalOrder", "Grant", "Known", "semantics", "cta_index"]
