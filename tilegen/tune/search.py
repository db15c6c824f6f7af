"""The tuner: enumerate, prune, compile in parallel, time on the GPU within a budget, verify, cache.

Order of work for one problem (dtype, layouts, M, N, K, out dtype):

| step      | what                                                                           |
| --------- | ------------------------------------------------------------------------------ |
| enumerate | space.enumerate_space: valid, distinct specs; pruned points with reasons       |
| anchors   | GemmSpec's default for the problem, then the cached best (if any): always timed |
| phase 1   | one spec per shape (tile, warps, stages, frag_buffers) with the automatic      |
|           | swizzle and group_m 8, in order of space.prior_ms, until 65% of the budget     |
| phase 2   | swizzle and group_m variants of the 3 fastest shapes, until the budget's end   |
| finalists | the 3 fastest and the default re-timed with longer runs (bench-like)           |
| accept    | the fastest finalist whose result matches the reference; stored in the cache   |

Compilation (trace, passes, PTX, ptxas's register/spill report) and, on the GPU, the driver's
link of the PTX to a cubin (stored in the disk cache, where the runtime's own load finds it)
run ahead in a thread pool: ptxas runs in subprocesses and the driver calls release the GIL,
so they really are parallel. The pool only works while the main thread waits for a candidate
that is not ready yet (`Gate`): candidates that are ready are timed back to back with the pool
idle, so neither the GIL nor the host's CPUs disturb a measurement. Every candidate is checked
against the reference on its first launch (a wrong kernel never wins); one that fails to
compile, is refused by ptxas's numbers, fails to load or launch, or computes a wrong result
scores infinity and is recorded with its reason. A candidate whose quick 3-call screen is more
than SCREEN_FACTOR times slower than the best so far keeps that screen time and is not timed
further.
"""
from __future__ import annotations

import contextlib
import math
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Optional

from ..compiler.cache import source_hash
from ..errors import DeviceError
from ..frontend import compile as tg_compile
from ..gemm import tuned as _store
from ..gemm.spec import OUT_DTYPES, GemmSpec
from . import space as S
from .measure import GpuMeasurer

INF = math.inf
PHASE1_SHARE = 0.65
TOP_SHAPES = 3
FINALISTS = 3
SCREEN_FACTOR = 1.25
OK_STATUSES = ("ok", "screened")


def tflops(m: int, n: int, k: int, ms: float) -> float:
    if not ms or not math.isfinite(ms) or ms <= 0:
        return 0.0
    return 2.0 * m * n * k / (ms * 1e-3) / 1e12


def _first_line(e: BaseException, limit: int = 300) -> str:
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:limit]


@dataclass
class Trial:
    """One candidate the tuner compiled (and, unless refused, ran)."""
    spec: GemmSpec
    phase: str                        # default, cached, shape, variant
    status: str = "not-run"           # ok, screened, pruned, compile-error, launch-error, wrong, not-run
    ms: float = INF                   # search timing (median), or the screen's for "screened"
    final_ms: Optional[float] = None  # the finalists' longer timing
    error: str = ""
    registers: Optional[int] = None
    spill_bytes: Optional[int] = None
    rel_err: Optional[float] = None
    prior: float = INF
    compile_s: Optional[float] = None

    @property
    def score(self) -> float:
        """Milliseconds; infinity for anything that did not run correctly."""
        if self.status not in OK_STATUSES:
            return INF
        return self.final_ms if self.final_ms is not None else self.ms

    def as_dict(self, m: int, n: int, k: int) -> dict:
        return {"spec": S.spec_text(self.spec), "phase": self.phase, "status": self.status,
                "ms": None if not math.isfinite(self.ms) else self.ms, "final_ms": self.final_ms,
                "tflops": round(tflops(m, n, k, self.score), 2), "registers": self.registers,
                "spill_bytes": self.spill_bytes, "rel_err": self.rel_err, "error": self.error or None}


@dataclass
class TuneResult:
    """What tune() found. spec is None when no candidate ran correctly (see error)."""
    spec: Optional[GemmSpec]
    tflops: float
    candidates: list                  # Trial, in the order they were tried
    table: str                        # the trials as text, fastest first
    problem: dict = field(default_factory=dict)
    default_spec: Optional[GemmSpec] = None
    default_tflops: float = 0.0
    ms: float = INF
    rel_err: Optional[float] = None
    pruned: list = field(default_factory=list)   # space.Pruned (before compiling)
    space_size: int = 0
    elapsed_s: float = 0.0
    stored: Optional[str] = None
    gpu: Optional[str] = None
    driver: Optional[str] = None
    reference: Optional[str] = None
    error: str = ""

    @property
    def tried(self) -> int:
        return len(self.candidates)

    @property
    def speedup(self) -> Optional[float]:
        if self.tflops and self.default_tflops:
            return self.tflops / self.default_tflops
        return None

    def as_dict(self) -> dict:
        m, n, k = (self.problem.get(x) for x in ("M", "N", "K"))
        return {"problem": self.problem, "gpu": self.gpu, "driver": self.driver,
                "spec": _store.spec_to_dict(self.spec) if self.spec else None,
                "spec_text": S.spec_text(self.spec) if self.spec else None,
                "tflops": round(self.tflops, 2), "ms": None if not math.isfinite(self.ms) else self.ms,
                "rel_err": self.rel_err, "reference": self.reference,
                "default_spec": S.spec_text(self.default_spec) if self.default_spec else None,
                "default_tflops": round(self.default_tflops, 2),
                "speedup": None if self.speedup is None else round(self.speedup, 3),
                "tried": self.tried, "space_size": self.space_size,
                "pruned_before_compile": S.SpaceResult([], self.pruned).reasons(),
                "elapsed_s": round(self.elapsed_s, 1), "stored": self.stored, "error": self.error or None,
                "candidates": [t.as_dict(m, n, k) for t in self.candidates]}


# ---- compiling -------------------------------------------------------------------------

@dataclass
class Compiled:
    kernel: object = None
    registers: Optional[int] = None
    spill_bytes: Optional[int] = None
    problem: Optional[str] = None      # why ptxas's numbers refuse it ("registers (ptxas): ...", "spills")
    error: Optional[str] = None        # the compile error
    seconds: float = 0.0
    load_error: Optional[str] = None   # a JIT/load failure seen before (it would repeat)
    prelinked: bool = False            # its cubin was linked by the pool (prepare() only loads it)


class Gate:
    """Lets the compile pool work only while the tuner is not measuring.

    Workers run each job inside `work()`, which waits while the gate is closed. The tuner
    `close()`s it (waiting for the jobs in flight) before it measures and `open()`s it while it
    waits for a candidate that is not ready. It starts open."""

    def __init__(self):
        self._cond = threading.Condition()
        self._open = True
        self._active = 0

    @contextlib.contextmanager
    def work(self):
        with self._cond:
            while not self._open:
                self._cond.wait()
            self._active += 1
        try:
            yield
        finally:
            with self._cond:
                self._active -= 1
                self._cond.notify_all()

    def open(self) -> None:
        with self._cond:
            self._open = True
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._open = False
            while self._active:
                self._cond.wait()

    @property
    def is_open(self) -> bool:
        return self._open

    @contextlib.contextmanager
    def quiet(self):
        """Closed for the block (jobs in flight finished), then as it was before."""
        was_open = self._open
        self.close()
        try:
            yield
        finally:
            if was_open:
                self.open()


class KernelPool:
    """Compiled candidates, kept for the process: tuning several sizes of one dtype compiles,
    runs ptxas on and JIT-loads each spec once. compile_fn / resources_fn default to
    tilegen.compile and Kernel.resources; tests pass fakes."""

    def __init__(self, compile_fn: Optional[Callable] = None, resources_fn: Optional[Callable] = None):
        self.compile_fn = compile_fn or tg_compile
        self.resources_fn = resources_fn or (lambda kernel: kernel.resources)
        self._done: dict = {}
        self._lock = threading.Lock()

    def get(self, spec: GemmSpec, gate: Optional[Gate] = None, prelink: Optional[Callable] = None,
            skip: Optional[threading.Event] = None) -> Optional[Compiled]:
        """The compiled candidate (compiled now, or remembered). `prelink(kernel)`, when given,
        links it for the GPU in this thread too (once; its failures are left to prepare()).
        None, with no work done, when `skip` is set by the time the gate lets the job in."""
        gate = gate or Gate()
        with self._lock:
            c = self._done.get(spec)
        if c is None or (prelink is not None and c.kernel is not None and c.problem is None and not c.prelinked):
            with gate.work():
                if skip is not None and skip.is_set():
                    return None
                if c is None:
                    c = self._compile(spec)
                    with self._lock:
                        c = self._done.setdefault(spec, c)
                if prelink is not None and c.kernel is not None and c.problem is None and not c.prelinked:
                    try:
                        c.prelinked = bool(prelink(c.kernel))
                    except Exception:  # noqa: BLE001  (prepare() JITs it again and reports the error)
                        c.prelinked = False
        return c

    def _compile(self, spec: GemmSpec) -> Compiled:
        t0 = time.perf_counter()
        try:
            kernel = self.compile_fn(spec)
        except Exception as e:  # noqa: BLE001  (a codegen bug must not stop the search)
            return Compiled(error=_first_line(e, 500), seconds=time.perf_counter() - t0)
        c = Compiled(kernel=kernel)
        try:
            res = self.resources_fn(kernel)  # None without ptxas
        except Exception as e:  # noqa: BLE001
            res = None
            c.problem = f"ptxas: {_first_line(e)}"
        if res is not None:
            c.registers = int(res.registers)
            c.spill_bytes = int(res.spill_stores) + int(res.spill_loads)
            if c.spill_bytes or getattr(res, "stack_frame", 0):
                c.problem = (f"spills (ptxas): {res.spill_stores} B stores, {res.spill_loads} B loads, "
                             f"{getattr(res, 'stack_frame', 0)} B stack at {res.registers} registers")
            else:
                c.problem = S.register_problem(spec, c.registers, "ptxas")
        c.seconds = time.perf_counter() - t0
        return c

    def note_load_error(self, spec: GemmSpec, error: str) -> None:
        with self._lock:
            c = self._done.get(spec)
            if c is not None:
                c.load_error = error


_DEFAULT_POOL: Optional[KernelPool] = None


def default_pool() -> KernelPool:
    global _DEFAULT_POOL
    if _DEFAULT_POOL is None:
        _DEFAULT_POOL = KernelPool()
    return _DEFAULT_POOL


# ---- progress --------------------------------------------------------------------------

class Progress:
    """One line per candidate on stderr (a redrawn status line on a terminal)."""

    def __init__(self, enabled: bool, title: str, budget_s: float, clock, stream=None):
        self.enabled = enabled
        self.title = title
        self.budget_s = budget_s
        self.clock = clock
        self.t0 = clock()
        self.stream = stream or sys.stderr
        self.tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self._dirty = False

    def line(self, msg: str) -> None:
        if not self.enabled:
            return
        if self._dirty:
            self.stream.write("\n")
            self._dirty = False
        self.stream.write(f"[tune {self.title}] {msg}\n")
        self.stream.flush()

    def trial(self, i: int, total: int, t: Trial, best: Optional[Trial], m: int, n: int, k: int) -> None:
        if not self.enabled:
            return
        el = self.clock() - self.t0
        frac = min(1.0, el / self.budget_s) if self.budget_s > 0 else 1.0
        bar = "#" * int(frac * 20)
        what = (f"{tflops(m, n, k, t.score):6.1f} TF/s" if t.status in OK_STATUSES else t.status)
        if t.status == "screened":
            what += " (screened)"
        best_txt = (f"best {tflops(m, n, k, best.score):.1f} ({S.spec_text(best.spec)})" if best else "best --")
        msg = (f"[{bar:<20}] {el:5.1f}/{self.budget_s:.0f}s {i}/{total} {t.phase:7s} "
               f"{S.spec_text(t.spec):34s} {what} | {best_txt}")
        if t.status not in OK_STATUSES and t.error and not self.tty:
            msg += f" | {t.error[:120]}"
        if self.tty:
            self.stream.write("\r\x1b[2K[tune " + self.title + "] " + msg[:200])
            self._dirty = True
            if t.status in ("compile-error", "launch-error", "wrong"):
                self.line(f"{S.spec_text(t.spec)}: {t.status}: {t.error[:200]}")
        else:
            self.line(msg)
        self.stream.flush()

    def done(self) -> None:
        if self._dirty:
            self.stream.write("\n")
            self.stream.flush()
            self._dirty = False


# ---- the search ------------------------------------------------------------------------

def format_table(trials: list, m: int, n: int, k: int, limit: Optional[int] = None) -> str:
    """The trials, fastest first, then the ones that did not run (with why)."""
    order = sorted(trials, key=lambda t: (t.score, t.status))
    if limit is not None:
        order = order[:limit]
    head = f"{'#':>3}  {'spec':34s} {'phase':7s} {'regs':>4s} {'ms':>8s} {'TFLOP/s':>8s}  status"
    lines = [head, "-" * len(head)]
    for i, t in enumerate(order, 1):
        ms = t.score
        regs = "--" if t.registers is None else str(t.registers)
        ms_txt = f"{ms:8.4f}" if math.isfinite(ms) else f"{'inf':>8s}"
        status = t.status + (f": {t.error[:100]}" if t.error and t.status not in OK_STATUSES else "")
        lines.append(f"{i:>3}  {S.spec_text(t.spec):34s} {t.phase:7s} {regs:>4s} {ms_txt} "
                     f"{tflops(m, n, k, ms):8.1f}  {status}")
    return "\n".join(lines)


class Tuner:
    def __init__(self, dtype: str, a_layout: str, b_layout: str, m: int, n: int, k: int, *, out_dtype: str,
                 budget_s: float, measurer, pool: KernelPool, target: str = "sm_90", sms: int = S.DEFAULT_SMS,
                 space: S.SearchSpace = S.SearchSpace(), previous: Optional[GemmSpec] = None,
                 progress: bool = True, workers: Optional[int] = None, clock: Callable = time.monotonic,
                 log_stream=None, started: Optional[float] = None, prelink: bool = True):
        self.dtype, self.a_layout, self.b_layout = dtype, a_layout, b_layout
        self.m, self.n, self.k = m, n, k
        self.out_dtype = out_dtype
        self.budget_s = float(budget_s)
        self.measurer = measurer
        self.pool = pool
        self.target = target
        self.sms = sms
        self.space = space
        self.previous = previous
        self.workers = workers or max(1, min(16, (os.cpu_count() or 2)))
        self.clock = clock
        self.started = clock() if started is None else started
        size = f"{m}^3" if m == n == k else f"{m}x{n}x{k}"
        self.progress = Progress(progress, f"{dtype} {a_layout[0]}{b_layout[0]} {size}", budget_s, clock, log_stream)
        self.gate = Gate()
        self.prelink = getattr(measurer, "prelink", None) if prelink else None
        self.trials: list = []
        self.priors: dict = {}
        self.fatal: Optional[str] = None

    # -- candidates ----------------------------------------------------------------------
    def _prior(self, spec: GemmSpec) -> float:
        try:
            return S.prior_ms(spec, self.m, self.n, self.k, self.sms)
        except Exception:  # noqa: BLE001
            return INF

    def plan(self):
        """(anchors, phase-1 list, every candidate) before any compilation."""
        sp = S.enumerate_space(self.dtype, self.a_layout, self.b_layout, self.out_dtype, self.target, self.space)
        self.space_result = sp
        default = S.default_spec(self.dtype, self.a_layout, self.b_layout, self.out_dtype, self.target,
                                 self.space.instruction)
        anchors = [("default", default)]
        if self.previous is not None and self.previous != default:
            anchors.append(("cached", self.previous))
        taken = {s for _, s in anchors}
        self.priors = {s: self._prior(s) for s in sp.candidates}
        phase1 = S.diverse_order([s for s in sp.candidates if S.base_variant(s) and s not in taken], self.priors)
        return default, anchors, phase1, sp.candidates

    def phase2(self, candidates: list, tried: set) -> list:
        ranked = sorted((t for t in self.trials if math.isfinite(t.score)), key=lambda t: t.score)
        shapes = []
        for t in ranked:
            sh = S.shape_of(t.spec)
            if sh not in shapes:
                shapes.append(sh)
            if len(shapes) == TOP_SHAPES:
                break
        per_shape = []
        for sh in shapes:
            vs = sorted((s for s in candidates if S.shape_of(s) == sh and s not in tried),
                        key=lambda s: (self.priors.get(s, INF), S.spec_text(s)))
            per_shape.append(vs)
        out = []
        for i in range(max((len(v) for v in per_shape), default=0)):
            out.extend(v[i] for v in per_shape if i < len(v))
        return out

    # -- one candidate -------------------------------------------------------------------
    def best(self) -> Optional[Trial]:
        ok = [t for t in self.trials if t.status == "ok"]
        return min(ok, key=lambda t: t.ms) if ok else None

    def run_one(self, spec: GemmSpec, phase: str, compiled: Compiled) -> Trial:
        t = Trial(spec, phase, prior=self.priors.get(spec, INF))
        t.registers, t.spill_bytes, t.compile_s = compiled.registers, compiled.spill_bytes, compiled.seconds
        if compiled.error is not None:
            t.status, t.error = "compile-error", compiled.error
            return t
        if compiled.problem is not None:
            t.status, t.error = "pruned", compiled.problem
            return t
        if compiled.load_error is not None:
            t.status, t.error = "launch-error", compiled.load_error
            return t
        kernel, ms_ = compiled.kernel, self.measurer
        try:
            if compiled.prelinked:
                ms_.prepare(kernel)   # loads the stored cubin: quick
            else:
                self.gate.open()      # the driver JITs here: let the pool work meanwhile
                try:
                    ms_.prepare(kernel)
                finally:
                    self.gate.close()
        except Exception as e:  # noqa: BLE001
            t.status, t.error = "launch-error", "load: " + _first_line(e, 400)
            self.pool.note_load_error(spec, t.error)
            self._health(e)
            return t
        try:  # the gate is closed: nothing else runs in this process while we measure
            ok, rel, bound = ms_.check(kernel)
            t.rel_err = rel
            if not ok:
                t.status, t.error = "wrong", f"relative error {rel:.3g} > bound {bound:.1e} against the reference"
                return t
            best = self.best()
            if best is not None:
                quick = ms_.screen(kernel)
                if quick > SCREEN_FACTOR * best.ms:
                    t.status, t.ms = "screened", quick
                    return t
            t.ms = ms_.time(kernel)
            t.status = "ok"
        except Exception as e:  # noqa: BLE001
            t.status, t.error = "launch-error", _first_line(e, 400)
            self._health(e)
        return t

    def _health(self, e: BaseException) -> None:
        healthy = getattr(self.measurer, "healthy", None)
        if healthy is not None and not healthy():
            self.fatal = f"the CUDA context is unusable after {_first_line(e)}; stopping the search"

    # -- the loop ------------------------------------------------------------------------
    def _run_list(self, items: list, executor, tried: set, total: int) -> None:
        """Run (spec, phase, deadline) items in order; a spec is started only before its deadline.
        The pool compiles (and links) up to 2 x workers specs ahead."""
        items = [it for it in items if it[0] not in tried]
        futures: dict = {}
        stale = threading.Event()  # set when we leave: queued jobs then skip their work
        ahead = 2 * self.workers
        nxt = 0

        def submit(s):
            return executor.submit(self.pool.get, s, self.gate, self.prelink, stale)

        def top_up(i):
            nonlocal nxt
            nxt = max(nxt, i)
            while nxt < len(items) and nxt < i + ahead:
                s = items[nxt][0]
                if s not in futures:
                    futures[s] = submit(s)
                nxt += 1

        try:
            for i, (spec, phase, deadline) in enumerate(items):
                if self.fatal or self.clock() >= deadline:
                    break
                top_up(i)
                fut = futures.pop(spec, None) or submit(spec)
                top_up(i + 1)
                if not fut.done():  # the pool works only while we wait; ready ones are timed back to back
                    self.gate.open()
                    try:
                        compiled = fut.result()
                    finally:
                        self.gate.close()
                else:
                    compiled = fut.result()
                trial = self.run_one(spec, phase, compiled)
                tried.add(spec)
                self.trials.append(trial)
                self.progress.trial(len(self.trials), total, trial, self.best(), self.m, self.n, self.k)
        finally:
            stale.set()
            for f in futures.values():
                f.cancel()

    def finalize(self, default: GemmSpec):
        """Re-time the finalists with longer runs; accept the fastest that passes its check."""
        ok = sorted((t for t in self.trials if t.status == "ok"), key=lambda t: t.ms)
        finalists = ok[:FINALISTS]
        d = next((t for t in self.trials if t.spec == default and t.status == "ok"), None)
        if d is not None and d not in finalists:
            finalists.append(d)
        for t in finalists:
            if self.fatal:
                break
            try:
                t.final_ms = self.measurer.time(self.pool.get(t.spec).kernel, final=True)
            except Exception as e:  # noqa: BLE001
                t.status, t.error = "launch-error", "final timing: " + _first_line(e)
                self._health(e)
        for t in sorted((t for t in finalists if t.status == "ok"), key=lambda t: t.score):
            if self.fatal:
                break
            try:
                ok_, rel, bound = self.measurer.check(self.pool.get(t.spec).kernel)
            except Exception as e:  # noqa: BLE001
                t.status, t.error = "launch-error", "final check: " + _first_line(e)
                self._health(e)
                continue
            t.rel_err = rel
            if ok_:
                return t
            t.status, t.error = "wrong", f"final check: relative error {rel:.3g} > bound {bound:.1e}"
        return None

    def run(self) -> TuneResult:
        t0 = self.started  # the budget counts from tune()'s start: operand setup included
        default, anchors, phase1, candidates = self.plan()
        reserve = min(10.0, 0.15 * self.budget_s)
        end = t0 + self.budget_s - reserve
        phase1_end = t0 + PHASE1_SHARE * (self.budget_s - reserve)
        total = len(anchors) + len(phase1)
        self.progress.line(f"{len(candidates)} candidates after pruning ({len(self.space_result.pruned)} "
                           f"points pruned: {self.space_result.reasons()}); {len(phase1)} shapes; "
                           f"budget {self.budget_s:.0f}s; {self.workers} compile threads")
        tried: set = set()
        executor = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="tilegen-tune")
        self.gate.close()  # opened only while waiting for a candidate (see _run_list)
        try:
            first = [(spec, phase, INF) for phase, spec in anchors]  # anchors run whatever the budget
            first += [(spec, "shape", phase1_end) for spec in phase1]
            self._run_list(first, executor, tried, total)
            if not self.fatal:
                more = self.phase2(candidates, tried)
                if more:
                    self.progress.line(f"phase 2: {len(more)} swizzle/group_m variants of the "
                                       f"{min(TOP_SHAPES, len(more))} fastest shapes")
                self._run_list([(spec, "variant", end) for spec in more], executor, tried, total + len(more))
            winner = None if self.fatal else self.finalize(default)
        finally:
            self.gate.open()  # jobs already started must be able to finish
            executor.shutdown(wait=True, cancel_futures=True)  # at most the jobs in flight
            self.progress.done()
        m, n, k = self.m, self.n, self.k
        d = next((t for t in self.trials if t.spec == default), None)
        res = TuneResult(
            spec=winner.spec if winner else None,
            tflops=tflops(m, n, k, winner.score) if winner else 0.0,
            candidates=list(self.trials),
            table=format_table(self.trials, m, n, k),
            problem={"dtype": self.dtype, "a_layout": self.a_layout, "b_layout": self.b_layout,
                     "M": m, "N": n, "K": k, "out_dtype": self.out_dtype, "target": self.target},
            default_spec=default,
            default_tflops=tflops(m, n, k, d.score) if d else 0.0,
            ms=winner.score if winner else INF,
            rel_err=winner.rel_err if winner else None,
            pruned=list(self.space_result.pruned),
            space_size=len(candidates),
            elapsed_s=self.clock() - t0,
            reference=getattr(self.measurer, "reference_name", None),
        )
        if winner is None:
            res.error = self.fatal or "no candidate ran correctly (see the table)"
        return res


# ---- the public entry point ------------------------------------------------------------

def _check_problem(dtype, a_layout, b_layout, M, N, K, out_dtype, budget_s) -> tuple:
    if dtype not in S.TUNE_DTYPES:
        raise ValueError(f"dtype {dtype!r}: the tuner handles {', '.join(S.TUNE_DTYPES)}")
    a, b = _store.normalize_layout(a_layout), _store.normalize_layout(b_layout)
    for name, v in (("M", M), ("N", N), ("K", K)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}={v!r}: a positive int")
    if out_dtype not in OUT_DTYPES:
        raise ValueError(f"out_dtype {out_dtype!r}: allowed {', '.join(OUT_DTYPES)}")
    if not (isinstance(budget_s, (int, float)) and budget_s > 0):
        raise ValueError(f"budget_s={budget_s!r}: a positive number of seconds")
    return a, b


def tune(dtype: str, a_layout: str, b_layout: str, M: int, N: int, K: int, *, out_dtype: str = "f32",
         budget_s: float = 60, device: int = 0, progress: bool = True, space: Optional[S.SearchSpace] = None,
         measurer=None, pool: Optional[KernelPool] = None, store: bool = True, workers: Optional[int] = None,
         clock: Callable = time.monotonic, log_stream=None, prelink: bool = True) -> TuneResult:
    """Search tile, warps, stages, swizzle, group_m and frag_buffers for C = A @ B on GPU `device`
    within about `budget_s` seconds; the best spec is checked against a reference and stored in
    the tuned-config store (see tilegen.gemm.tuned, docs/tuning.md).

    a_layout / b_layout: "row" or "col" ("r" / "c" accepted). `measurer` and `pool` replace the
    GPU and the compiler (tests); without a GPU the GpuMeasurer raises tilegen.DeviceError.
    prelink=False leaves every driver link to the main thread (one at a time)."""
    a, b = _check_problem(dtype, a_layout, b_layout, M, N, K, out_dtype, budget_s)
    if measurer is None and (isinstance(device, bool) or not isinstance(device, int) or device < 0):
        raise ValueError(f"device={device!r}: tuning times kernels on a GPU, device=0, 1, ... (the CPU emulator's "
                         f"times say nothing of a GPU's)")
    started = clock()
    own = measurer is None
    log = (lambda msg: print(f"[tune] {msg}", file=log_stream or sys.stderr, flush=True)) if progress else None
    if own:
        try:
            measurer = GpuMeasurer(dtype, a, b, M, N, K, out_dtype, device=device, log=log)
        except DeviceError as e:   # (the runtime's advice to use the emulator does not apply here)
            raise DeviceError(f"{str(e).split('; install the NVIDIA driver')[0].split('; pass device=')[0]}: tuning "
                              f"needs an NVIDIA GPU (tilegen.matmul without a tuned config takes the measured "
                              f"presets)") from None
    try:
        info = getattr(measurer, "info", None)
        target = getattr(measurer, "target", None) or "sm_90"
        sms = getattr(info, "sm_count", None) or S.DEFAULT_SMS
        gpu = getattr(measurer, "gpu_key", None)
        if gpu is None and info is not None:
            gpu = (info.name, info.driver_version)
        previous = None
        if gpu is not None:
            try:
                entry = _store.load(dtype, a, b, M, N, K, out_dtype, *gpu)
                previous = entry["spec"] if entry else None
            except Exception:  # noqa: BLE001  (a bad entry only loses the anchor)
                previous = None
            if previous is not None and previous.instruction != (space or S.SearchSpace()).instruction:
                previous = None   # a cached spec of the other family is not an anchor of this search
            if previous is not None and previous.instruction == "mma.sync" and previous.target != target:
                try:
                    previous = previous.replace(target=target)
                except Exception:  # noqa: BLE001
                    previous = None
        tuner = Tuner(dtype, a, b, M, N, K, out_dtype=out_dtype, budget_s=budget_s, measurer=measurer,
                      pool=pool or default_pool(), target=target, sms=sms, space=space or S.SearchSpace(),
                      previous=previous, progress=progress, workers=workers, clock=clock, log_stream=log_stream,
                      started=started, prelink=prelink)
        result = tuner.run()
    finally:
        if own:
            measurer.close()
    if gpu is not None:
        result.gpu, result.driver = gpu[0], _store.normalize_driver(gpu[1])
    if store and result.spec is not None and gpu is not None:
        path = _store.store(result.spec, M, N, K, gpu[0], gpu[1], source=source_hash(), tflops=round(result.tflops, 2),
                            ms=result.ms, default_tflops=round(result.default_tflops, 2),
                            default_spec=S.spec_text(result.default_spec), budget_s=budget_s,
                            tried=result.tried, rel_err=result.rel_err)
        result.stored = str(path) if path else None
    return result


__all__ = ["tune", "Tuner", "TuneResult", "Trial", "KernelPool", "Gate", "format_table", "tflops",
           "default_pool", "SCREEN_FACTOR"]
