"""Pipeline hazard check on tile-level IR: is every read of a shared stage covered by the
wait for its copies and a barrier, and is no stage overwritten while other warps may still
read it?

The program is walked in order as every thread runs it, for a range of problem sizes (every
size symbol set to each of SIZES): loops run as often as they would for those sizes, which
covers short problems (fewer tiles than stages), the steady state and the drain. A loop whose
trip count cannot be evaluated is unrolled for 1 .. 2*stages+1 iterations instead. Per (tile, stage) it tracks copies issued but not committed, committed groups not
yet waited for, data landed but not yet published by a barrier, and reads since the last
barrier. Reads by other warps since the last barrier are what a new copy must not race.

wgmma reads its stages asynchronously: from its issue until the wgmma_wait that retires its
group the stage may not be written, and after that only once a barrier shows that every
warpgroup retired it. It reads through the async proxy, so landed copies need a
fence_proxy_async before it, and its accumulator may not be read until it is retired.
An A operand in registers is read the same way: loaded before a wgmma_fence, and not
loaded again until the wgmma that reads it is retired; and registers other instructions
wrote (an accumulator's zero fill, elementwise ops) need a wgmma_fence before a wgmma uses
them as its accumulator or A (PTX ISA, wgmma.fence).

TMA copies complete on an mbarrier: a stage they fill may be read once a wait on that
barrier saw the phase complete (by every thread that waits, through the async proxy: no
barrier or fence is needed). A wait for a phase that cannot complete (too few arrivals, or
announced bytes the copies do not deliver) is a deadlock. Stage reads made before an
arrival are released to the threads that wait for that arrival's phase.

Warp roles (warp specialization) run at the same time as each other, which this walk, one
thread of control, cannot follow: it checks the code outside the roles and leaves the roles
to the emulator, which runs each group of warps with its own program counter and checks
the same protocol at run time (sim/runner.py, sim/mbarrier.py, sim/race.py).

A branch whose condition depends on the thread (tg.if_ on the warp or the lane; a condition
whose instructions reach %tid.x) goes both ways in one CTA: both sides are walked and the walk
goes on with what either left (State.merge: pending, unpublished, read or written on either, the
arrivals of both sides); a CTA-wide barrier or copy_async inside it is refused (the threads that go
the other way never do their part), so is single-thread work (TMA, a single arrival) under a branch
thread 0 skips; arrivals count the threads that take the branch, a load's origin is checked for
the warps that take it, and a loop whose trip count depends on the thread runs the guessed counts. Stage indices are thread 0's, and branches on the block index go block
0's way: the emulator checks those as it runs.
"""
from __future__ import annotations

from ..errors import HazardError
from . import tile as T
from .instr import Comment, If, Instr, Loop, Role
from .verify import fragment_bounds
from .scalar_eval import ScalarEval
from .values import Sym, Value


class _State:
    def __init__(self, threads: int = 0):
        self.threads = threads              # of the CTA: each arrives on a non-single arrive
        self.uncommitted: list = []        # (tile, stage) copies not yet in a group
        self.groups: list[list] = []       # committed, not yet waited for
        self.unpublished: set = set()      # landed for the issuing thread, no barrier since
        self.written: set = set()
        self.read_since_barrier: dict = {}  # (tile, stage) -> op that read it
        self.guessed_trips = False          # some loop's trip count was unknown
        self.role_waits: set = set()        # barriers waited on inside the warp roles the walk passed by
        self.origins_checked: set = set()   # loads whose runtime origin was checked (shared by the walks)
        self.unfenced: set = set()          # landed copies no fence_proxy_async covers yet
        self.wgmma_open: list = []          # (key, op, acc) of wgmmas not yet committed
        self.wgmma_groups: list = []        # committed, not yet retired by wgmma_wait
        self.wgmma_retired: dict = {}       # key -> op: retired by this warpgroup, no barrier since
        self.unfenced_frags: dict = {}      # fragment id -> load since the last wgmma_fence
        self.phases: dict = {}              # (barrier, stage) -> _Phase, the phase in progress
        self.completed: dict = {}           # (barrier, stage) -> phases completed so far
        self.tma_pending: dict = {}         # (tile, stage) -> the TmaLoad still landing in it
        self.tma_barrier: dict = {}         # (tile, stage) -> the (barrier, stage) that copy completes on
        self.passed: dict = {}              # (barrier, stage) -> (wait, parity) that returned at once since its last copy
        self.branches: list = []            # (cond, arm taken) of the branches some threads skip, walked now
        self.varies: dict = {}              # Value -> whether it depends on the thread (shared by the walks)

    def copy(self) -> "_State":
        other = _State(self.threads)
        other.uncommitted = list(self.uncommitted)
        other.groups = [list(g) for g in self.groups]
        other.unpublished = set(self.unpublished)
        other.written = set(self.written)
        other.read_since_barrier = dict(self.read_since_barrier)
        other.guessed_trips = self.guessed_trips
        other.unfenced = set(self.unfenced)
        other.wgmma_open = list(self.wgmma_open)
        other.wgmma_groups = [list(g) for g in self.wgmma_groups]
        other.wgmma_retired = dict(self.wgmma_retired)
        other.unfenced_frags = dict(self.unfenced_frags)
        other.phases = {k: v.copy() for k, v in self.phases.items()}
        other.completed = dict(self.completed)
        other.tma_pending = dict(self.tma_pending)
        other.tma_barrier, other.passed = dict(self.tma_barrier), dict(self.passed)
        other.branches, other.varies = list(self.branches), self.varies
        other.role_waits, other.origins_checked = self.role_waits, self.origins_checked
        return other

    def merge(self, other: "_State", before: dict) -> None:
        """What either of two ways through a branch may have left (the branch differs between threads,
        so some threads took each): what is pending, unpublished, read or written on either; the
        arrivals and bytes of both on each mbarrier phase (`before`: each phase's when the branch
        began, counted once)."""
        self.uncommitted += [k for k in other.uncommitted if k not in self.uncommitted]
        self.groups = _merged_groups(self.groups, other.groups)
        self.unpublished |= other.unpublished
        self.written |= other.written
        for key, op in other.read_since_barrier.items():
            self.read_since_barrier.setdefault(key, op)
        self.guessed_trips |= other.guessed_trips
        self.unfenced |= other.unfenced
        self.wgmma_open += [x for x in other.wgmma_open if x not in self.wgmma_open]
        self.wgmma_groups = _merged_groups(self.wgmma_groups, other.wgmma_groups)
        for key, ph in other.phases.items():   # (each way's threads arrived: both counts, less what came before)
            mine = self.phases.get(key)
            if mine is None:
                self.phases[key] = ph
                continue
            arrivals, expected = before.get(key, (0, 0))
            mine.arrivals += ph.arrivals - arrivals
            mine.expected += ph.expected - expected
            mine.copies += [c for c in ph.copies if c not in mine.copies]
            mine.released |= ph.released
        for key, done in other.completed.items():
            self.completed[key] = max(done, self.completed.get(key, 0))
        for d_mine, d_theirs in ((self.wgmma_retired, other.wgmma_retired), (self.unfenced_frags, other.unfenced_frags),
                                 (self.tma_pending, other.tma_pending), (self.tma_barrier, other.tma_barrier),
                                 (self.passed, other.passed)):
            for key, value in d_theirs.items():
                d_mine.setdefault(key, value)

    def phase(self, key) -> "_Phase":
        if key not in self.phases:
            self.phases[key] = _Phase()
        return self.phases[key]

    def wgmma_reading(self, key):
        return next((op for k, op, _ in self.wgmma_open + [x for g in self.wgmma_groups for x in g] if k == key), None)

    def wgmma_writing(self, frag):
        return next((op for _, op, acc in self.wgmma_open + [x for g in self.wgmma_groups for x in g]
                     if acc is frag), None)

    def pending(self, key) -> bool:
        return key in self.uncommitted or any(key in g for g in self.groups)


class _Phase:
    """The phase in progress of one mbarrier stage: arrivals so far, bytes announced, the TMA
    copies completing on it, and the stage reads its arrivals release."""

    def __init__(self):
        self.arrivals = 0
        self.expected = 0
        self.copies: list = []      # (tile key, TmaLoad, bytes)
        self.released: set = set()  # stage keys read before an arrival on this phase

    def copy(self) -> "_Phase":
        other = _Phase()
        other.arrivals, other.expected = self.arrivals, self.expected
        other.copies, other.released = list(self.copies), set(self.released)
        return other


def _where(op) -> str:
    return f" ({op.loc})" if op.loc else ""


def _stage(ev, op, tile, field: str = "stage"):
    s = ev.value(getattr(op, field))
    if s is None:
        raise HazardError(f"cannot tell which stage of {tile.name} this op touches{_where(op)}")
    if not 0 <= s < tile.stages:   # the address would fall in whatever follows the tile
        raise HazardError(f"stage {s} of {tile.name}, which has {tile.stages} stage{'s' if tile.stages > 1 else ''} "
                          f"(0..{tile.stages - 1}){_where(op)}: take the stage index modulo the stages")
    return s


MAX_TRIPS = 64  # sizes whose loops run longer only repeat the steady state: skipped


class _TooLong(Exception):
    pass


def _barriers_waited(nodes) -> set:
    """The names of the mbarriers waited on anywhere in `nodes`."""
    names = set()
    for n in nodes:
        if isinstance(n, T.MBarrierWait):
            names.add(n.bar.name)
        for body in (getattr(n, "body", None), getattr(n, "orelse", None)):
            if isinstance(body, list):
                names |= _barriers_waited(body)
    return names


def _walk(nodes, ev, st, trips):
    for n in nodes:
        if isinstance(n, Instr):
            ev.step(n)
        elif isinstance(n, Role):   # (its waits are the emulator's to check: here only which barriers)
            st.role_waits |= _barriers_waited(n.body)
        elif isinstance(n, Comment):
            continue
        elif isinstance(n, Loop):
            start, stop = ev.value(n.start), ev.value(n.stop)
            if start is None or stop is None or _varies(ev, n.start, st.varies) or _varies(ev, n.stop, st.varies):
                # (unknown, or thread 0's count is not every thread's: the guessed counts)
                st.guessed_trips = True
                count = trips
            else:
                count = max(0, stop - start)
                if count > MAX_TRIPS:
                    raise _TooLong()
            start = start or 0
            for it in range(count):
                ev.env[n.counter] = start + it
                _walk(n.body, ev, st, trips)
        elif isinstance(n, If):
            cond = ev.value(n.cond)
            if _varies(ev, n.cond, st.varies):   # (some threads take each way: both are walked, then merged)
                before = {k: (ph.arrivals, ph.expected) for k, ph in st.phases.items()}
                other = st.copy()
                other.branches.append((n.cond, n.negate))
                _walk(n.orelse, ev, other, trips)
                st.branches.append((n.cond, not n.negate))
                _walk(n.body, ev, st, trips)
                st.branches.pop()
                st.merge(other, before)
            elif cond is None:  # unknown here: both branches must be safe; go on after the first
                saved = st.copy()
                _walk(n.orelse, ev, saved, trips)
                _walk(n.body, ev, st, trips)
            else:
                _walk(n.body if bool(cond) != n.negate else n.orelse, ev, st, trips)
        else:
            RULES[type(n)](n, ev, st)


def _merged_groups(mine: list, theirs: list) -> list:
    """Two ways' lists of groups still pending (oldest first; cp.async or wgmma), merged: the longer
    (fewer waited for on its way), each of its newest groups joined by the other's group of that age."""
    longer, shorter = (mine, theirs) if len(mine) >= len(theirs) else (theirs, mine)
    for group, other in zip(longer[len(longer) - len(shorter):], shorter):
        group += [k for k in other if k not in group]
    return longer


def _varies(ev, x, memo: dict) -> bool:
    """Whether x depends on the thread (%tid.x, through the instructions that made it): a branch on
    it may go one way in some threads and the other way in others (tg.if_(warp == 1))."""
    if isinstance(x, Sym):
        return x.name == "%tid.x"
    if not isinstance(x, Value):
        return False
    known = memo.get(x)
    if known is None:
        instr = ev.defs.get(x)
        memo[x] = False   # (cycles through loop-carried registers end here)
        known = memo[x] = instr is not None and any(_varies(ev, y, memo) for y in instr.ins)
    return known


def _takes(ev, branches, tid: int, memo: dict) -> bool:
    """Whether thread `tid` takes every branch of `branches` the way it is walked (unknown: it may)."""
    return all(ev.at_thread(cond, tid, memo) in (None, taken) for cond, taken in branches)


def _taken_by(ev, branches, warp: int) -> bool:
    """Whether some thread of `warp` takes every branch of `branches` the way it was walked."""
    return any(_takes(ev, branches, 32 * warp + lane, {}) for lane in range(32))


def _in_branch_refused(n, st, what: str) -> None:
    """`what` is work of every thread of the CTA together: inside a branch some threads skip, their
    part of it is never done."""
    if st.branches:
        raise HazardError(f"{what} inside a branch whose condition differs between threads (on the warp or the "
                          f"lane){_where(n)}: it is every thread's work together, and the threads that go the other way "
                          f"never do their part; put it outside the branch (or give the warps roles)")


def _arriving(ev, st, every: int) -> int:
    """How many arrive when the first thread of each `every` arrives (1: each thread), inside the
    branches on the thread being walked: those whose threads take them."""
    if not st.branches:
        return st.threads // every
    return sum(_takes(ev, st.branches, t, {}) for t in range(0, st.threads, every))


def _first_thread_runs(n, ev, st, what: str) -> None:
    """`what` runs on the CTA's first thread only (outside roles): inside branches, thread 0 must take them."""
    if not _takes(ev, st.branches, 0, {}):
        raise HazardError(f"{what} runs on the CTA's first thread, which does not take this branch{_where(n)}: it "
                          f"never runs; issue it where thread 0 goes (or give the warps roles)")


def _copy_async(n, ev, st):
    _in_branch_refused(n, st, "copy_async (its pieces are spread over every thread of the CTA)")
    key = (n.dst.name, _stage(ev, n, n.dst))
    _check_refill(n, st, key, "copy")
    st.uncommitted.append(key)


def _commit(n, ev, st):
    st.groups.append(st.uncommitted)
    st.uncommitted = []


def _wait(n, ev, st, pending=None):
    st.groups, done = _retire(st.groups, n.pending if pending is None else pending)
    for g in done:
        for key in g:
            st.unpublished.add(key)
            st.written.add(key)
            st.unfenced.add(key)


def _retire_all(st):
    """cp.async.wait_all: every copy of the thread lands (for it alone, until a barrier)."""
    _wait(None, None, st, pending=0)


def _barrier(n, ev, st):
    if st.branches and not getattr(n, "threads", 0):
        raise HazardError(f"a barrier of the whole CTA inside a branch whose condition differs between threads "
                          f"(on the warp or the lane){_where(n)}: the threads that go the other way never arrive, "
                          f"and bar.sync must be reached by every thread together; put it after the branch (or "
                          f"give the warps roles, whose barriers are their own)")
    st.unpublished.clear()
    st.read_since_barrier.clear()
    st.wgmma_retired.clear()


def _fence_proxy_async(n, ev, st):
    st.unfenced.clear()


def _wgmma(n, ev, st):
    from_registers = isinstance(n.a, T.Fragment)
    for tile in ((n.b,) if from_registers else (n.a, n.b)):
        key = (tile.name, _stage(ev, n, tile, "a_stage" if tile is n.a else "b_stage"))
        _check_read(st, key, n)
        if key in st.unfenced:
            raise HazardError(f"wgmma reads stage {key[1]} of {key[0]} written by cp.async with no "
                              f"fence_proxy_async since (wgmma reads through the async proxy){_where(n)}")
        st.wgmma_open.append((key, n, n.acc))
    written = st.unfenced_frags.get(id(n.acc))
    if written is not None:
        raise HazardError(f"wgmma accumulates into fragment {n.acc.name}, written{_where(written)} by other "
                          f"instructions with no wgmma_fence since (the fence orders their register writes before "
                          f"the wgmma's: tilegen.dsl.wgmma_fence() first){_where(n)}")
    if from_registers:  # A's registers, too, are read until the group retires
        load = st.unfenced_frags.get(id(n.a))
        if load is not None:
            raise HazardError(f"wgmma reads fragment {n.a.name}, loaded{_where(load)} with no wgmma_fence "
                              f"since (the fence orders register writes before the wgmma){_where(n)}")
        st.wgmma_open.append((_registers(n.a), n, n.acc))


def _wgmma_fence(n, ev, st):
    st.unfenced_frags.clear()


def _writes_fragment(field: str, reads: bool = True):
    """The rule of an op that writes the registers of fragment `field` with ordinary
    instructions (after the reads rule, where it reads accumulators too): a wgmma may use them
    only after a wgmma_fence (PTX ISA, wgmma.fence)."""
    def rule(n, ev, st):
        if reads:
            _reads_accumulators(n, ev, st)
        frag = getattr(n, field)
        if isinstance(frag, T.Fragment):
            st.unfenced_frags[id(frag)] = n
    return rule


def _wgmma_commit(n, ev, st):
    st.wgmma_groups.append(st.wgmma_open)
    st.wgmma_open = []


def _wgmma_wait(n, ev, st):
    st.wgmma_groups, done = _retire(st.wgmma_groups, n.pending)
    for g in done:
        for key, op, _ in g:
            st.wgmma_retired[key] = op


def _reads_accumulators(n, ev, st):
    for frag in _fragments_of(n):
        tc = st.wgmma_writing(frag)
        if tc is not None:
            uncommitted = any(op is tc for _, op, _ in st.wgmma_open)   # (a wait retires committed groups only)
            first = "wgmma_commit(), then wgmma_wait(0)," if uncommitted else "wgmma_wait(0)"
            raise HazardError(f"reads accumulator {frag.name} while a wgmma{_where(tc)} may still be writing "
                              f"it: {first} first{_where(n)}")


def _vector_key(ev, n, sv, field: str = "buffer"):
    """(tile, buffer) of a staged vector an op touches."""
    return (sv.tile.name, _stage(ev, n, sv.tile, field))


def _fetch_vector(n, ev, st):
    """By cp.async (StagedVector.by_copy) the tile is written from the fetch on, as by
    copy_async: its copies are in flight until the park waits for them."""
    if n.sv.by_copy:
        key = _vector_key(ev, n, n.sv)
        _check_refill(n, st, key, "fetch (cp.async)")
        st.uncommitted.append(key)


def _park_vector(n, ev, st):
    """A write of each thread's own elements (by_copy: cp.async.wait_all, which waits for
    every copy of the thread): no other thread's read of the tile may lack a barrier since,
    and the others see the elements after the next barrier."""
    if n.sv.by_copy:
        _commit(n, ev, st)
        _retire_all(st)
        return
    key = _vector_key(ev, n, n.sv)
    _check_refill(n, st, key, "park")
    st.written.add(key)
    st.unpublished.add(key)


def _store_stage(n, ev, st):
    """Reads the accumulator and its staged vectors; with `sync`, a barrier follows the reads;
    then writes the stage, as park does: no other thread's read of it may lack a barrier since,
    and other threads read it (tg.load / tg.accumulate of an accumulator) after the next one."""
    _reads_accumulators(n, ev, st)
    for sv in (n.bias, n.row_scale, n.col_scale):
        if isinstance(sv, T.StagedVector):
            key = _vector_key(ev, n, sv, "vector_buffer")
            _check_read(st, key, n)
            st.read_since_barrier.setdefault(key, n)
    if n.sync is not None:
        _barrier(n.sync, ev, st)
    key = (n.dst.name, _stage(ev, n, n.dst))
    _check_refill(n, st, key, "store_stage")
    st.written.add(key)
    st.unpublished.add(key)


def _check_origin(n, ev, st):
    """A load's runtime origin, for each warp (its lane 0) where it is known: inside the tile
    (a constant one is verify's to check). Each load once per check_hazards."""
    key = (id(n), ev.value(n.row0), ev.value(n.col0), tuple(st.branches))   # (again where the origin moved)
    if key in st.origins_checked or all(isinstance(o, int) for o in (n.row0, n.col0)):
        return
    st.origins_checked.add(key)
    for w in range(st.threads // 32):
        if st.branches and not _taken_by(ev, st.branches, w):
            continue   # (this warp does not run the load)
        memo = {}
        for origin, extent, limit in fragment_bounds(n):
            at = ev.at_thread(origin, 32 * w, memo)
            if at is not None and not 0 <= at <= limit - extent:
                rows, cols = (ev.at_thread(x, 32 * w, memo) for x in (n.row0, n.col0))
                raise HazardError(f"fragment {n.frag.name} at ({rows}, {cols}) for warp {w} does not fit in "
                                  f"{n.src.name} ({n.src.layout.rows}x{n.src.layout.cols}): it would read another "
                                  f"tile's shared memory{_where(n)}")


def _load_fragment(n, ev, st):
    _check_origin(n, ev, st)
    tc = st.wgmma_reading(_registers(n.frag))
    if tc is not None:
        raise HazardError(f"load overwrites fragment {n.frag.name} while a wgmma{_where(tc)} may still be "
                          f"reading it: a wgmma_wait must retire that wgmma first{_where(n)}")
    st.unfenced_frags[id(n.frag)] = n
    key = (n.src.name, _stage(ev, n, n.src))
    _check_read(st, key, n)
    st.read_since_barrier.setdefault(key, n)


def _load_accumulator(n, ev, st):
    """Reads a stage into an accumulator's registers (reading them first with `add`)."""
    tc = st.wgmma_writing(n.frag)
    if tc is not None and not n.add:
        raise HazardError(f"load overwrites accumulator {n.frag.name} while a wgmma{_where(tc)} may still be writing "
                          f"it: wgmma_wait(0) first{_where(n)}")
    _check_origin(n, ev, st)
    _writes_fragment("frag", reads=n.add)(n, ev, st)
    key = (n.src.name, _stage(ev, n, n.src))
    _check_read(st, key, n)
    st.read_since_barrier.setdefault(key, n)


def _check_refill(n, st, key, what: str):
    """A new write into a stage: no wgmma may still read it, and no other warp's read of it may
    lack a barrier (or a completed mbarrier phase its readers arrived on) since."""
    tc = st.wgmma_reading(key)
    if tc is not None:
        raise HazardError(f"{what} into stage {key[1]} of {key[0]} overwrites a stage a wgmma{_where(tc)} may "
                          f"still be reading (no wgmma_wait has retired it){_where(n)}")
    tc = st.wgmma_retired.get(key)
    if tc is not None:
        raise HazardError(f"{what} into stage {key[1]} of {key[0]}: this warpgroup's wgmma{_where(tc)} is "
                          f"retired, but other warpgroups' may still read it: a barrier (or an mbarrier its "
                          f"readers arrive on) must come first{_where(n)}")
    reader = st.read_since_barrier.get(key)
    if reader is not None:
        raise HazardError(f"{what} into stage {key[1]} of {key[0]} overwrites a stage other warps may still "
                          f"be reading (read{_where(reader)} with no barrier since){_where(n)}")
    if key in st.tma_pending:
        raise HazardError(f"{what} into stage {key[1]} of {key[0]}, where a TMA copy{_where(st.tma_pending[key])} "
                          f"has not been waited for{_where(n)}")


def _barrier_key(ev, n, field: str = "stage"):
    s = ev.value(getattr(n, field))
    if s is None:
        raise HazardError(f"cannot tell which stage of mbarrier {n.bar.name} this op uses{_where(n)}")
    return (n.bar.name, s % n.bar.stages)


def _tma_load(n, ev, st):
    _first_thread_runs(n, ev, st, "a TMA copy")
    key = (n.dst.name, _stage(ev, n, n.dst))
    _check_refill(n, st, key, "TMA copy")
    # a share of the stage multicast by every CTA of the cluster fills it whole (the peers,
    # running the same code with their own part, deliver the rest)
    nbytes = n.dst.layout.bytes if n.parts == 1 or n.multicast is not None else n.dst.layout.bytes // n.parts
    bkey = _barrier_key(ev, n, "bar_stage")
    st.phase(bkey).copies.append((key, n, nbytes))
    st.tma_pending[key] = n
    st.tma_barrier[key] = bkey
    st.passed.pop(bkey, None)


def _arrive(n, ev, st):
    if n.single:
        _first_thread_runs(n, ev, st, "a single arrival")
    ph = st.phase(_barrier_key(ev, n))
    ph.arrivals += 1 if n.single else _arriving(ev, st, T.ONE_PER.get(n.one_per, 1))
    ph.expected += n.expect_bytes
    # what this thread read before arriving is released to whoever waits for the phase
    ph.released.update(st.read_since_barrier)
    ph.released.update(st.wgmma_retired)


def _mbarrier_wait(n, ev, st):
    key = _barrier_key(ev, n)
    parity = ev.value(n.parity)
    if parity is None:
        raise HazardError(f"cannot tell which parity this wait on {n.bar.name} expects{_where(n)}")
    done = st.completed.get(key, 0)
    if (done & 1) != (parity & 1):
        st.passed[key] = (n, parity)
        return  # the phase of that parity is the one completed last: no wait
    ph = st.phase(key)
    delivered = sum(b for _, _, b in ph.copies)
    if ph.arrivals < n.bar.arrivals or delivered != ph.expected:
        why = []
        if ph.arrivals < n.bar.arrivals:
            why.append(f"{ph.arrivals} of its {n.bar.arrivals} arrivals came")
        if delivered != ph.expected:
            why.append(f"its arrivals announced {ph.expected} bytes and its TMA copies deliver {delivered}")
        raise HazardError(f"waits for phase {done} (parity {parity & 1}) of {key[0]}[{key[1]}], which never "
                          f"completes: {'; '.join(why)}: a deadlock{_where(n)}")
    for tile_key, _, _ in ph.copies:  # landed, through the async proxy, and seen by every waiter
        st.tma_pending.pop(tile_key, None)
        st.written.add(tile_key)
        st.unpublished.discard(tile_key)
        st.unfenced.discard(tile_key)
    for k in ph.released:
        st.read_since_barrier.pop(k, None)
        st.wgmma_retired.pop(k, None)
    st.completed[key] = done + 1
    del st.phases[key]


def _no_hazard(n, ev, st):
    """Register-only ops the pipeline schedule cannot break."""


# The rule of each tile op (a new op adds its entry; ops that touch only registers take
# _no_hazard).
RULES = {
    T.CopyAsync: _copy_async,
    T.CommitGroup: _commit,
    T.WaitGroup: _wait,
    T.Barrier: _barrier,
    T.FillFragment: _writes_fragment("frag", reads=False),
    T.LoadFragment: _load_fragment,
    T.Mma: _no_hazard,
    T.SplitTF32: _no_hazard,
    T.StoreFragment: _reads_accumulators,
    T.StoreRowVector: _no_hazard,
    T.AccumulateFragment: _writes_fragment("frag"),
    T.LoadAccumulator: _load_accumulator,
    T.Wgmma: _wgmma,
    T.WgmmaFence: _wgmma_fence,
    T.WgmmaCommit: _wgmma_commit,
    T.WgmmaWait: _wgmma_wait,
    T.FenceProxyAsync: _fence_proxy_async,
    T.Elementwise: _writes_fragment("out"),
    T.RowReduce: _reads_accumulators,
    T.MaskFragment: _writes_fragment("out"),
    T.FragmentToOperand: _writes_fragment("dst"),
    T.MBarrierArrive: _arrive,
    T.MBarrierWait: _mbarrier_wait,
    T.TmaLoad: _tma_load,
    T.ClusterSync: _barrier,
    T.SetMaxRegisters: _no_hazard,
    # The TMA-store epilogue runs in warp roles (walked by the emulator, see the module doc)
    T.StoreStage: _store_stage,
    T.FetchVector: _fetch_vector,
    T.ParkVector: _park_vector,
    T.TmaStore: lambda n, ev, st: _first_thread_runs(n, ev, st, "a TMA store"),
    T.TmaStoreCommit: lambda n, ev, st: _first_thread_runs(n, ev, st, "a TMA store's commit"),
    T.TmaStoreWait: lambda n, ev, st: _first_thread_runs(n, ev, st, "a TMA store's wait"),
}


def _registers(frag):
    """The key under which a wgmma's register operand is tracked while in flight."""
    return ("registers", id(frag))


def _retire(groups, pending):
    """(groups still in flight, groups retired) once at most `pending` of them may remain:
    groups complete in commit order."""
    done = groups[:max(0, len(groups) - pending)]
    return groups[len(done):], done


def _check_read(st, key, n):
    if key in st.tma_pending:
        bkey = st.tma_barrier.get(key)
        passed = st.passed.get(bkey)
        if passed is not None:   # a wait ran, on the parity of a phase already complete
            wait, parity = passed
            done = st.completed.get(bkey, 0)
            raise HazardError(f"reads stage {key[1]} of {key[0]}{_where(n)} before its TMA copy"
                              f"{_where(st.tma_pending[key])} landed: the wait on {bkey[0]}[{bkey[1]}]{_where(wait)} "
                              f"asked for parity {parity & 1}, "
                              + (f"of phase {done - 1}, complete already" if done else
                                 "which a new mbarrier counts as complete (the phase before its first)")
                              + f", so it returned at once; the copy completes phase {done} (parity {done & 1})")
        raise HazardError(f"reads stage {key[1]} of {key[0]}{_where(n)} before waiting on the mbarrier that "
                          f"its TMA copy{_where(st.tma_pending[key])} completes on")
    if key in st.uncommitted:   # (no group to wait for: a wait_group waits only for committed groups)
        raise HazardError(f"reads stage {key[1]} of {key[0]} while a cp.async into it may still be in flight: "
                          f"the copy was never committed into a group (tilegen.dsl.commit() after the copies, then "
                          f"tilegen.dsl.wait(n) for its group){_where(n)}")
    if st.pending(key):
        raise HazardError(f"reads stage {key[1]} of {key[0]} while a cp.async into it may still be in "
                          f"flight (wait for its group first){_where(n)}")
    if key in st.unpublished:
        raise HazardError(f"reads stage {key[1]} of {key[0]} before a barrier makes the other threads' "
                          f"copies visible{_where(n)}")
    if key not in st.written:
        raise HazardError(f"reads stage {key[1]} of {key[0]} before anything was copied into it{_where(n)}")


def _fragments_of(op):
    """The fragments an op reads (epilogue and fragment arithmetic)."""
    return [v for v in vars(op).values() if isinstance(v, T.Fragment)]


SIZES = (1, 7, 16, 33, 64, 100, 128, 192, 256, 320, 384, 512, 640, 1024, 2048)


def check_hazards(kernel):
    """Raise HazardError for the first unsafe step of the pipeline; return the kernel."""
    stages = max((t.stages for t in kernel.shared), default=1)
    symbols = set(kernel.symbols)
    checked: set = set()
    for size in SIZES:
        for trips in range(1, 2 * stages + 2):
            params = {p.name: (size if p.name in symbols else 4096) for p in kernel.params if p.type == "u32"}
            st = _State(kernel.threads)
            st.origins_checked = checked
            try:
                _walk(kernel.body, ScalarEval(params, kernel.params), st, trips)
            except _TooLong:
                break
            if st.uncommitted or st.groups:
                raise HazardError("the kernel ends with cp.async copies in flight: wait_group(0) before the end")
            unwaited = {k: op for k, op in st.tma_pending.items() if op.bar.name not in st.role_waits}
            if unwaited:   # (a copy on a barrier some warp role waits on: the emulator checks that wait)
                (tile, stage), op = next(iter(unwaited.items()))
                bkey = st.tma_barrier.get((tile, stage))
                passed = st.passed.get(bkey)
                if passed is not None:   # a wait there was, on the parity of a phase already complete
                    wait, parity = passed
                    done = st.completed.get(bkey, 0)
                    raise HazardError(
                        f"the kernel ends with a TMA copy into stage {stage} of {tile}{_where(op)} that nothing "
                        f"waited for: the wait on {bkey[0]}[{bkey[1]}]{_where(wait)} asked for parity {parity & 1}, "
                        + (f"of phase {done - 1}, complete already" if done else
                           "which a new mbarrier counts as complete (the phase before its first)")
                        + f", so it returned at once; the copy completes phase {done} (parity {done & 1})")
                raise HazardError(f"the kernel ends with a TMA copy into stage {stage} of {tile}{_where(op)} "
                                  f"that nothing waited for")
            if st.wgmma_open or st.wgmma_groups:
                raise HazardError("the kernel ends with wgmmas in flight: wgmma_commit and wgmma_wait(0) before the end")
            if not st.guessed_trips:
                break  # every loop ran its real trip count: other guesses change nothing
    return kernel
