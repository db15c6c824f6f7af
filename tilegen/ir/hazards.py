"""Pipeline hazard check on tile-level IR: is every read of a shared stage covered by the
wait for its copies and a barrier, and is no stage overwritten while other warps may still
read it?

The program is walked in order as every thread runs it, for a range of problem sizes (every
size symbol set to each of SIZES): loops run as often as they would for those sizes, which
covers short problems (fewer tiles than stages), the steady state and the drain. A loop whose
trip count cannot be evaluated is unrolled for 1 .. 2*stages+1 iterations instead. Per (tile, stage) it tracks copies issued but not committed, committed groups not
yet waited for, data landed but not yet published by a barrier, and reads since the last
barrier. Reads by other warps since the last barrier are what a new copy must not race.
"""
from __future__ import annotations

from ..errors import IRError
from . import tile as T
from .instr import Comment, If, Instr, Loop
from .scalar_eval import ScalarEval


class HazardError(IRError):
    """A pipeline schedule that would read data before it lands or overwrite data in use."""


class _State:
    def __init__(self):
        self.uncommitted: list = []        # (tile, stage) copies not yet in a group
        self.groups: list[list] = []       # committed, not yet waited for
        self.unpublished: set = set()      # landed for the issuing thread, no barrier since
        self.written: set = set()
        self.read_since_barrier: dict = {}  # (tile, stage) -> op that read it
        self.guessed_trips = False          # some loop's trip count was unknown

    def copy(self) -> "_State":
        other = _State()
        other.uncommitted = list(self.uncommitted)
        other.groups = [list(g) for g in self.groups]
        other.unpublished = set(self.unpublished)
        other.written = set(self.written)
        other.read_since_barrier = dict(self.read_since_barrier)
        other.guessed_trips = self.guessed_trips
        return other

    def pending(self, key) -> bool:
        return key in self.uncommitted or any(key in g for g in self.groups)


def _where(op) -> str:
    return f" ({op.loc})" if op.loc else ""


def _stage(ev, op, tile):
    s = ev.value(op.stage)
    if s is None:
        raise HazardError(f"cannot tell which stage of {tile.name} this op touches{_where(op)}")
    return s % tile.stages if s >= tile.stages else s


MAX_TRIPS = 64  # sizes whose loops run longer only repeat the steady state: skipped


class _TooLong(Exception):
    pass


def _walk(nodes, ev, st, trips):
    for n in nodes:
        if isinstance(n, Instr):
            ev.step(n)
        elif isinstance(n, Comment):
            continue
        elif isinstance(n, Loop):
            start, stop = ev.value(n.start), ev.value(n.stop)
            if start is None or stop is None:
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
            if cond is None:  # unknown here: both branches must be safe; go on after the first
                saved = st.copy()
                _walk(n.orelse, ev, saved, trips)
                _walk(n.body, ev, st, trips)
            else:
                _walk(n.body if bool(cond) != n.negate else n.orelse, ev, st, trips)
        elif isinstance(n, T.CopyAsync):
            key = (n.dst.name, _stage(ev, n, n.dst))
            reader = st.read_since_barrier.get(key)
            if reader is not None:
                raise HazardError(f"copy into stage {key[1]} of {key[0]} overwrites a stage other warps may still "
                                  f"be reading (read{_where(reader)} with no barrier since){_where(n)}")
            st.uncommitted.append(key)
        elif isinstance(n, T.CommitGroup):
            st.groups.append(st.uncommitted)
            st.uncommitted = []
        elif isinstance(n, T.WaitGroup):
            done = st.groups[:len(st.groups) - n.pending] if n.pending else st.groups
            st.groups = st.groups[len(done):]
            for g in done:
                for key in g:
                    st.unpublished.add(key)
                    st.written.add(key)
        elif isinstance(n, T.Barrier):
            st.unpublished.clear()
            st.read_since_barrier.clear()
        elif isinstance(n, T.LoadFragment):
            key = (n.src.name, _stage(ev, n, n.src))
            if st.pending(key):
                raise HazardError(f"reads stage {key[1]} of {key[0]} while a cp.async into it may still be in "
                                  f"flight (wait for its group first){_where(n)}")
            if key in st.unpublished:
                raise HazardError(f"reads stage {key[1]} of {key[0]} before a barrier makes the other threads' "
                                  f"copies visible{_where(n)}")
            if key not in st.written:
                raise HazardError(f"reads stage {key[1]} of {key[0]} before anything was copied into it{_where(n)}")
            st.read_since_barrier.setdefault(key, n)


SIZES = (1, 7, 16, 33, 64, 100, 128, 192, 256, 320, 384, 512, 640, 1024, 2048)


def check_hazards(kernel):
    """Raise HazardError for the first unsafe step of the pipeline; return the kernel."""
    stages = max((t.stages for t in kernel.shared), default=1)
    symbols = set(kernel.symbols)
    for size in SIZES:
        for trips in range(1, 2 * stages + 2):
            params = {p.name: (size if p.name in symbols else 4096) for p in kernel.params if p.type == "u32"}
            st = _State()
            try:
                _walk(kernel.body, ScalarEval(params), st, trips)
            except _TooLong:
                break
            if st.uncommitted or st.groups:
                raise HazardError("the kernel ends with cp.async copies in flight: wait_group(0) before the end")
            if not st.guessed_trips:
                break  # every loop ran its real trip count: other guesses change nothing
    return kernel
