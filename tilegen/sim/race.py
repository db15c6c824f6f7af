"""Race detector for shared memory: per-byte shadow state in numpy arrays.

The CTA's timeline is cut into barrier intervals ("epochs"): bar.sync ends one. Ordinary
accesses of two different threads to the same byte are ordered only if a bar.sync lies
between them, so within one epoch:
- a read of a byte another thread wrote is a race (read-after-write without barrier);
- a write of a byte another thread read or wrote is a race (write-after-read / -write);
- cp.async writes land at an unknown time between the issue and the wait that retires
  them: a read of a byte with a copy still pending is a bug, and the issue counts as a
  write (so it must not hit bytes another thread read in this epoch: "overwrites a stage
  another warp may still be reading"). The copy becomes the issuing thread's write in the
  epoch of its wait, so other threads need a bar.sync after the wait before reading.

TMA copies (cp.async.bulk.tensor) write through the async proxy from their issue until an
mbarrier wait sees the phase they complete on: reading their bytes before that is a bug, the
issue counts as a write (so the stage must be free), and once landed the bytes count as
written by nobody in particular: every thread that waited on the barrier may read them, and
wgmma may too without a proxy fence. A completed mbarrier phase that every thread of the
CTA arrived on orders like a bar.sync.

mbarriers order too (release / acquire): an arrival releases what its thread did before it,
and a wait that sees the phase complete acquires those arrivals. A thread may write bytes
another thread read in this epoch if it acquired an arrival that thread made after the
read (a warp-specialized producer refilling a stage the consumers released), and read
bytes another thread wrote if it acquired an arrival that thread made after the write. The order is
direct only (not transitive). A byte read by several threads keeps the set of their warps:
a write is ordered after those reads when the writer acquired, from every thread of each of
those warps, an arrival made after the byte's last read (a role's named barrier between a
block's epilogue reading a staged vector and the next block's write of it); conservative.

wgmma (sm_90a) reads shared memory through the async proxy, from its issue until the
wgmma.wait_group that retires it:
- generic writes (st.shared, retired cp.async) must be followed by fence.proxy.async of the
  writing thread before a wgmma reads them ("unfenced" bytes);
- its bytes may not be written while it is in flight; once retired they count as read by
  its warpgroup in the current epoch, so other warpgroups need a bar.sync before writing.

Each check returns None or a Violation for the first offending (row, byte); the caller
names the thread and the PTX line.

Clusters (sm_90): each CTA has its own shadow of its own shared memory, and the CTAs of a
cluster share one `Sync` (the clock, the arrivals released and acquired) over one space of
thread ids: thread t of the CTA of rank r is r * threads + t there (`base`), so a consumer in
one CTA releasing a stage by an arrival on its peer's barrier orders its reads before the
peer producer's multicast into that stage. The methods take the CTA's own thread ids.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

NOBODY = -1
SEVERAL = -2      # more than one thread read the byte in the current epoch
WARPGROUP_READER = -3  # readers -3, -4, ...: warpgroup 0, 1, ... (a retired wgmma read)
WARPGROUP_THREADS = 128
WARP_THREADS = 32


@dataclass
class Violation:
    row: int          # index into the access's thread array
    offset: int       # byte offset in shared memory
    message: str
    kind: str         # "pending", "race" (read/write after write), "war" (write after read)


class Sync:
    """What the shadows of one cluster's CTAs share: the clock the accesses and arrivals are
    stamped with, and who released and acquired which arrivals, over `threads` thread ids."""

    def __init__(self, threads: int):
        self.threads = int(threads)
        self.reset()

    def reset(self):
        self.clock = 0
        self.acquired = None      # (threads, threads): [t, u] the latest arrival of u that t acquired
        self.released: dict = {}  # (barrier, phase) -> (threads,) clock of each thread's arrival
        # (rank, barrier) -> ((threads,) the last phase each thread saw complete, (threads,) the clock it
        # first saw that one at): phases complete in order, so this is all that "saw phase p" needs
        self.seen: dict = {}


class SharedShadow:
    def __init__(self, size: int, threads: int = 1024, sync: Optional[Sync] = None, base: int = 0):
        n = max(int(size), 1)
        self.sync = sync if sync is not None else Sync(threads)
        self.own_sync = sync is None
        self.threads = self.sync.threads      # thread ids: this CTA's are base .. base + its threads
        self.base = int(base)
        self.writer = np.full(n, NOBODY, dtype=np.int16)     # thread ids: a CTA has <= 1024
        self.w_epoch = np.full(n, -1, dtype=np.int32)
        self.w_line = np.zeros(n, dtype=np.int32)
        self.reader = np.full(n, NOBODY, dtype=np.int16)
        self.r_epoch = np.full(n, -1, dtype=np.int32)
        self.r_line = np.zeros(n, dtype=np.int32)
        self.r_clock = np.zeros(n, dtype=np.int64)            # when the byte was last read
        self.r_warps = np.zeros(n, dtype=np.uint64)           # ... by which warps (bit w % 64), this epoch
        self.w_clock = np.zeros(n, dtype=np.int64)            # ... and written
        self.pending = np.zeros(n, dtype=np.int32)           # cp.async copies not yet retired
        self.p_tid = np.full(n, NOBODY, dtype=np.int16)
        self.p_line = np.zeros(n, dtype=np.int32)
        self.unfenced = np.zeros(n, dtype=bool)              # generic writes no async-proxy fence covers
        self.inflight = np.zeros(n, dtype=np.int32)          # wgmma reads not yet retired
        self.i_line = np.zeros(n, dtype=np.int32)
        self.bulk = np.zeros(n, dtype=np.int32)              # TMA copies not yet landed
        self.b_line = np.zeros(n, dtype=np.int32)
        self.epoch = 0

    def reset(self):
        for a, v in ((self.writer, NOBODY), (self.w_epoch, -1), (self.reader, NOBODY),
                     (self.r_epoch, -1), (self.pending, 0), (self.p_tid, NOBODY),
                     (self.unfenced, False), (self.inflight, 0), (self.bulk, 0), (self.r_clock, 0), (self.w_clock, 0),
                     (self.r_warps, 0)):
            a.fill(v)
        self.epoch = 0
        if self.own_sync:   # a cluster's runner resets its Sync once for all its CTAs
            self.sync.reset()

    # the cluster's shared clock and arrival tables
    clock = property(lambda self: self.sync.clock, lambda self, v: setattr(self.sync, "clock", v))
    acquired = property(lambda self: self.sync.acquired, lambda self, v: setattr(self.sync, "acquired", v))
    released = property(lambda self: self.sync.released)

    def _ids(self, tids):
        """This CTA's thread ids in the cluster's space."""
        return tids + self.base if self.base else tids

    def barrier(self):
        self.epoch += 1

    # -- mbarrier release / acquire ------------------------------------------------------------
    def release(self, tid: int, key):
        """Thread `tid` arrives on (barrier, phase): what it did so far is released."""
        tid = self._ids(tid)
        self.clock += 1
        rel = self.released.get(key)
        if rel is None:
            rel = self.released[key] = np.full(self.threads, -1, dtype=np.int64)
            old = [k for k in self.released if k[:-1] == key[:-1] and k[-1] < key[-1] - 1]
            for k in old:   # only the last two phases of a barrier can still be waited for
                del self.released[k]
        rel[tid] = self.clock

    def acquire(self, tids: np.ndarray, key):
        """Threads `tids` saw (barrier, phase) complete: they acquire its arrivals."""
        seen = self.sync.seen.get(key[:-1])
        if seen is None:
            seen = self.sync.seen[key[:-1]] = (np.full(self.threads, -1, dtype=np.int64),
                                               np.full(self.threads, -1, dtype=np.int64))
        ids = np.atleast_1d(self._ids(tids))
        ids = ids[seen[0][ids] < key[-1]]
        if ids.size:
            self.clock += 1
            seen[0][ids], seen[1][ids] = key[-1], self.clock
        rel = self.released.get(key)
        if rel is None:
            return
        tids = self._ids(tids)
        if self.acquired is None:
            self.acquired = np.full((self.threads, self.threads), -1, dtype=np.int64)
        self.acquired[tids] = np.maximum(self.acquired[tids], rel)

    def _released_to(self, t, rd, offs, clock):
        """Accesses of bytes offs by threads rd (at clock[offs]) that threads t acquired (t,
        rd, offs broadcast together): ordered before t's access, no conflict."""
        if self.acquired is None:
            return np.zeros(np.broadcast(t, rd, offs).shape, dtype=bool)
        t = np.broadcast_to(t, np.broadcast(t, rd, offs).shape)
        rd = np.broadcast_to(rd, t.shape)
        when = clock[offs]
        thread = rd >= 0
        group = rd <= WARPGROUP_READER
        out = np.zeros(t.shape, dtype=bool)
        if thread.any():
            out[thread] = self.acquired[t[thread], rd[thread]] >= np.broadcast_to(when, t.shape)[thread]
        if group.any():  # a warpgroup's retired wgmma: any of its threads' later arrivals
            g = WARPGROUP_READER - rd[group]
            per_group = self.acquired.reshape(self.threads, -1, WARPGROUP_THREADS).max(axis=2) \
                if self.threads % WARPGROUP_THREADS == 0 else None
            if per_group is not None:
                out[group] = per_group[t[group], g] >= np.broadcast_to(when, t.shape)[group]
        several = rd == SEVERAL
        if several.any() and self.threads % WARP_THREADS == 0 and self.threads <= 64 * WARP_THREADS:
            # every thread of every warp that read: an arrival after the last read, acquired
            per_warp = self.acquired.reshape(self.threads, -1, WARP_THREADS).min(axis=2)
            masks = np.broadcast_to(self.r_warps[offs], t.shape)[several]
            tt, late = t[several], np.broadcast_to(when, t.shape)[several]
            ok = np.ones(tt.shape, dtype=bool)
            for w in range(per_warp.shape[1]):
                read_by_w = (masks >> np.uint64(w)) & np.uint64(1) == 1
                if read_by_w.any():
                    ok &= ~read_by_w | (per_warp[tt, w] >= late)
            out[several] = ok
        return out

    # -- checks -----------------------------------------------------------------------------
    def _first(self, bad, offs) -> Optional[tuple]:
        if not bad.any():
            return None
        r, c = np.argwhere(bad)[0]
        return int(r), int(offs[r, c])

    def _bulk_pending(self, offs, what: str) -> Optional[Violation]:
        hit = self._first(self.bulk[offs] > 0, offs)
        if hit:
            r, o = hit
            return Violation(r, o, f"{what} shared memory a TMA copy (issued at PTX line {self.b_line[o]}) is still "
                                   f"writing: no mbarrier wait has seen the phase it completes on", "pending")
        return None

    def read(self, tids: np.ndarray, offs: np.ndarray, line: int) -> Optional[Violation]:
        """tids (n,), offs (n, w) byte offsets read by thread tids[i]."""
        tids = self._ids(tids)
        t = tids[:, None]
        v = self._bulk_pending(offs, "reads")
        if v:
            return v
        hit = self._first(self.pending[offs] > 0, offs)
        if hit:
            r, o = hit
            return Violation(r, o, f"reads shared memory whose cp.async is still pending (issued by "
                                   f"thread {self.p_tid[o]} at PTX line {self.p_line[o]}; no "
                                   f"cp.async.wait_group has retired it)", "pending")
        hit = self._first(self._unordered_writes(t, offs), offs)
        if hit:
            r, o = hit
            return Violation(r, o, f"shared-memory race: reads bytes that thread {self.writer[o]} wrote "
                                   f"(PTX line {self.w_line[o]}) with no bar.sync in between", "race")
        self._note_reads(tids, offs, line)
        return None

    def _unordered_writes(self, t, offs) -> np.ndarray:
        """Bytes offs (read by threads t, broadcast) that another thread wrote in this epoch
        with no arrival of it after the write acquired by t."""
        w = self.writer[offs]
        conflict = (self.w_epoch[offs] == self.epoch) & (w != t) & (w != NOBODY)
        if conflict.any() and self.acquired is not None:
            conflict &= ~self._released_to(t, w, offs, self.w_clock)
        return conflict

    def _note_reads(self, tids, offs, line):
        t = np.broadcast_to(tids[:, None], offs.shape)
        fresh = self.r_epoch[offs] != self.epoch
        self.r_warps[offs[fresh]] = 0
        warps = tids // WARP_THREADS
        for w in np.unique(warps).tolist():   # one warp at a time: its duplicates OR the same bit
            o = offs[warps == w]
            self.r_warps[o] |= np.uint64(1 << (w % 64))
        prev = self.reader[offs]
        new = np.where(fresh | (prev == t), t, SEVERAL)
        self.reader[offs] = new
        self.r_epoch[offs] = self.epoch
        self.r_line[offs] = line
        self.clock += 1
        self.r_clock[offs] = self.clock
        # Duplicates inside this access: the scatter kept one thread per byte; any other
        # thread that read the byte makes it SEVERAL.
        after = self.reader[offs]
        clash = (after != t) & (after != SEVERAL)
        if clash.any():
            self.reader[offs[clash]] = SEVERAL

    def _war(self, tids, offs, what: str) -> Optional[Violation]:
        t = tids[:, None]
        hit = self._first(self.inflight[offs] > 0, offs)
        if hit:
            r, o = hit
            return Violation(r, o, f"{what} overwrites shared memory that a wgmma or TMA store still in flight reads "
                                   f"(issued at PTX line {self.i_line[o]}; no wgmma.wait_group / cp.async.bulk."
                                   f"wait_group.read has retired it)", "war")
        rd = self.reader[offs]
        own_group = (rd <= WARPGROUP_READER) & (WARPGROUP_READER - rd == t // WARPGROUP_THREADS)
        conflict = (self.r_epoch[offs] == self.epoch) & (rd != t) & (rd != NOBODY) & ~own_group
        if conflict.any() and self.acquired is not None:
            conflict &= ~self._released_to(t, rd, offs, self.r_clock)
        hit = self._first(conflict, offs)
        if hit:
            r, o = hit
            rd_o = int(self.reader[o])
            who = ("several threads" if rd_o == SEVERAL else f"thread {rd_o}" if rd_o >= 0
                   else f"the wgmma of warpgroup {WARPGROUP_READER - rd_o}")
            return Violation(r, o, f"{what} overwrites a stage another warp may still be reading: "
                                   f"{who} read these bytes (last at PTX line {self.r_line[o]}) and no "
                                   f"bar.sync separates that read from this write (nor an mbarrier arrival after the read that this "
                                   f"thread waited for)", "war")
        w = self.writer[offs]
        hit = self._first((self.w_epoch[offs] == self.epoch) & (w != t) & (w != NOBODY), offs)
        if hit:
            r, o = hit
            return Violation(r, o, f"shared-memory race: {what} writes bytes that thread {self.writer[o]} "
                                   f"wrote (PTX line {self.w_line[o]}) with no bar.sync in between", "race")
        return None

    def write(self, tids: np.ndarray, offs: np.ndarray, line: int, what: str = "st.shared") -> Optional[Violation]:
        tids = self._ids(tids)
        v = self._bulk_pending(offs, f"{what} writes")
        if v:
            return v
        hit = self._first(self.pending[offs] > 0, offs)
        if hit:
            r, o = hit
            return Violation(r, o, f"{what} writes shared memory that a pending cp.async (issued by thread "
                                   f"{self.p_tid[o]} at PTX line {self.p_line[o]}) is still writing", "pending")
        v = self._war(tids, offs, what)
        if v:
            return v
        self._note_writes(tids, offs, line)
        return None

    def _note_writes(self, tids, offs, line):
        self.writer[offs] = np.broadcast_to(tids[:, None], offs.shape)
        self.w_epoch[offs] = self.epoch
        self.w_line[offs] = line
        self.unfenced[offs] = True
        self.clock += 1
        self.w_clock[offs] = self.clock

    # -- the async proxy (wgmma) -------------------------------------------------------------
    def fence_async(self, tids: Optional[np.ndarray]):
        """fence.proxy.async by threads `tids` (None: every thread of the CTA): their
        completed writes become visible to the async proxy."""
        if tids is None:
            self.unfenced[:] = False
        else:
            self.unfenced &= ~np.isin(self.writer, self._ids(tids))

    def _unfenced(self, flat, who: str, engine: str) -> Optional[Violation]:
        """A read through the async proxy of bytes written through the generic one with no
        fence.proxy.async after the write."""
        hit = self._first(self.unfenced[flat], flat)
        if hit:
            _, o = hit
            return Violation(0, o, f"{who} reads bytes that thread {self.writer[o]} wrote through the generic proxy "
                                   f"(PTX line {self.w_line[o]}) with no fence.proxy.async after the write: {engine} "
                                   f"reads shared memory through the async proxy", "proxy")
        return None

    def issue_async_read(self, group: int, offs: np.ndarray, line: int) -> Optional[Violation]:
        """A wgmma of warpgroup `group` starts reading bytes `offs` (1-D)."""
        flat = offs[None, :]
        v = self._bulk_pending(flat, "the wgmma reads")
        if v:
            return v
        hit = self._first(self.pending[flat] > 0, flat)
        if hit:
            _, o = hit
            return Violation(0, o, f"wgmma reads shared memory whose cp.async is still pending (issued by thread "
                                   f"{self.p_tid[o]} at PTX line {self.p_line[o]})", "pending")
        hit = self._first(self.w_epoch[flat] == self.epoch, flat)
        if hit:
            _, o = hit
            return Violation(0, o, f"shared-memory race: the wgmma reads bytes that thread {self.writer[o]} wrote "
                                   f"(PTX line {self.w_line[o]}) with no bar.sync in between", "race")
        v = self._unfenced(flat, "the wgmma", "wgmma")
        if v:
            return v
        np.add.at(self.inflight, offs, 1)
        self.i_line[offs] = line
        return None

    def retire_async_read(self, group: int, offs: np.ndarray, line: int = 0):
        """wgmma.wait_group retired a wgmma (issued at PTX line `line`): its bytes count as
        read by its warpgroup now."""
        np.subtract.at(self.inflight, offs, 1)
        self.r_line[offs] = line
        whole = group + self.base // WARPGROUP_THREADS
        self.reader[offs] = WARPGROUP_READER - whole
        self.r_warps[offs] = np.uint64(0xF << ((4 * whole) % 64))   # its four warps (a later reader adds its own)
        self.r_epoch[offs] = self.epoch
        self.clock += 1
        self.r_clock[offs] = self.clock

    def issue_async(self, tids: np.ndarray, offs: np.ndarray, line: int) -> Optional[Violation]:
        """A cp.async may write its bytes any time from now until its wait."""
        tids = self._ids(tids)
        v = self._war(tids, offs, "cp.async")
        if v:
            return v
        np.add.at(self.pending, offs.reshape(-1), 1)
        self.p_tid[offs] = np.broadcast_to(tids[:, None], offs.shape)
        self.p_line[offs] = line
        return None

    def retire_async(self, tids: np.ndarray, offs: np.ndarray, line: int):
        """The wait of the issuing thread retired the copy: it is now that thread's write."""
        np.subtract.at(self.pending, offs.reshape(-1), 1)
        self._note_writes(self._ids(tids), offs, line)

    # -- TMA -----------------------------------------------------------------------------------
    def issue_bulk(self, tid: int, offs: np.ndarray, line: int, foreign: bool = False) -> Optional[Violation]:
        """A TMA copy issued by thread `tid` will write bytes `offs` (1-D) until it lands
        (foreign: a multicast from another CTA of the cluster, `tid` in the cluster's space)."""
        tid = tid if foreign else self._ids(tid)
        flat = offs[None, :]
        v = self._bulk_pending(flat, "a TMA copy writes")
        if v:
            return v
        hit = self._first(self.pending[flat] > 0, flat)
        if hit:
            _, o = hit
            return Violation(0, o, f"a TMA copy writes shared memory a pending cp.async (issued by thread "
                                   f"{self.p_tid[o]} at PTX line {self.p_line[o]}) is still writing", "pending")
        v = self._war(np.array([tid]), flat, "a TMA copy")
        if v:
            return v
        np.add.at(self.bulk, offs, 1)
        self.b_line[offs] = line
        return None

    def issue_bulk_read(self, tid: int, offs: np.ndarray, line: int) -> Optional[Violation]:
        """A TMA store issued by thread `tid` reads bytes `offs` (1-D) through the async proxy
        until a wait_group.read of that thread retires it."""
        tid = self._ids(tid)
        flat = offs[None, :]
        v = self._bulk_pending(flat, "a TMA store reads")
        if v:
            return v
        hit = self._first(self._unordered_writes(np.array([[tid]]), flat), flat)
        if hit:
            _, o = hit
            return Violation(0, o, f"shared-memory race: a TMA store reads bytes that thread {self.writer[o]} wrote "
                                   f"(PTX line {self.w_line[o]}) with no barrier ordering that write before the store",
                             "race")
        v = self._unfenced(flat, "a TMA store", "TMA")
        if v:
            return v
        np.add.at(self.inflight, offs, 1)
        self.i_line[offs] = line
        return None

    def retire_bulk_read(self, tid: int, offs: np.ndarray, line: int = 0):
        """A wait_group.read retired a TMA store (issued at PTX line `line`): its bytes count
        as read by `tid` now."""
        np.subtract.at(self.inflight, offs, 1)
        self.r_line[offs] = line
        self.reader[offs] = self._ids(tid)
        self.r_warps[offs] = np.uint64(1 << ((int(self._ids(tid)) // WARP_THREADS) % 64))
        self.r_epoch[offs] = self.epoch
        self.clock += 1
        self.r_clock[offs] = self.clock

    def land_bulk(self, offs: np.ndarray):
        """The copy landed and a wait saw it: its bytes are ordered before whoever waited."""
        np.subtract.at(self.bulk, offs, 1)
        self.writer[offs] = NOBODY
        self.w_epoch[offs] = -1
        self.unfenced[offs] = False
