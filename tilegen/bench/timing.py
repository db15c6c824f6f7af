"""Timing kernels on the GPU with CUDA events.

Method (the same for tilegen, cuBLAS and Triton):
- every call is bracketed by its own pair of events on the stream that runs it, and the
  reported time is the median over many calls, after a warm-up;
- call i uses buffer set i % n_sets (rotation), so the operands of one call are not left in
  L2 by the call before it;
- before each batch of calls the stream is held by a delay kernel while Python enqueues the
  whole batch, so Python's launch overhead never shows up as idle GPU time between a start
  event and its kernel.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

from .. import runtime
from .peak import SpinKernel

MAX_BATCH = 64
MAX_DELAY_MS = 40.0


@dataclass
class TimingOptions:
    warmup_ms: float = 50.0
    rep_ms: float = 250.0
    warmup: int | None = None     # counts override the milliseconds when given
    reps: int | None = None
    min_reps: int = 10
    max_reps: int = 1000

    def warmup_count(self, est_ms: float) -> int:
        if self.warmup is not None:
            return max(0, self.warmup)
        return int(min(10000, max(1, -(-self.warmup_ms // max(est_ms, 1e-3)))))

    def rep_count(self, est_ms: float) -> int:
        if self.reps is not None:
            return max(1, self.reps)
        n = int(-(-self.rep_ms // max(est_ms, 1e-3)))
        return max(self.min_reps, min(self.max_reps, n))


@dataclass
class Timing:
    ms: float                        # median
    ms_min: float
    ms_max: float
    reps: int
    samples: list = field(default_factory=list, repr=False)

    def as_dict(self) -> dict:
        return {"ms": self.ms, "ms_min": self.ms_min, "ms_max": self.ms_max, "reps": self.reps}


def summarize(samples) -> Timing:
    s = [float(x) for x in samples]
    if not s:
        raise ValueError("no timing samples")
    return Timing(statistics.median(s), min(s), max(s), len(s), s)


class EventPool:
    """Reusable timing events (tilegen.runtime.Event) recorded on one stream."""

    def __init__(self, stream=None, device: int = 0):
        self.stream = stream  # None: the legacy default stream; else a stream handle (int)
        self.device = device
        self._events = []

    def get(self, n: int) -> list:
        while len(self._events) < n:
            self._events.append(runtime.Event(self.device))
        return self._events[:n]

    def record(self, event) -> None:
        event.record(self.stream)

    def elapsed(self, start, end) -> float:
        """Milliseconds between two recorded events (waits for `end`)."""
        return runtime.elapsed_ms(start, end)


class Delay:
    """Holds the stream busy for about `ms` milliseconds. `spin(units)` enqueues a kernel
    whose run time is proportional to `units`; calibrate() measures the ratio."""

    def __init__(self, spin, name: str):
        self._spin = spin
        self.name = name
        self.ms_per_unit = None

    def calibrate(self, events: EventPool, units: int = 1_000_000) -> None:
        self._spin(units // 10)  # first launch: load and JIT out of the measurement
        e0, e1 = events.get(2)
        events.record(e0)
        self._spin(units)
        events.record(e1)
        ms = events.elapsed(e0, e1)
        self.ms_per_unit = max(ms, 1e-3) / units

    def __call__(self, ms: float) -> None:
        if self.ms_per_unit is None or ms <= 0:
            return
        self._spin(max(1, int(min(ms, MAX_DELAY_MS) / self.ms_per_unit)))


def make_delay(backend, target, events, log):
    """The stream-holding kernel used while Python enqueues a batch (see timing.py)."""
    spin = backend.spin()
    name = "torch.cuda._sleep"
    if spin is None:
        try:
            spin = SpinKernel(target, stream=backend.stream)
            name = "tilegen spin kernel"
        except Exception as e:  # noqa: BLE001
            log(f"no delay kernel ({type(e).__name__}: {e}): Python launch overhead may show in small sizes")
            return None
    delay = Delay(spin, name)
    try:
        delay.calibrate(events)
    except Exception as e:  # noqa: BLE001
        log(f"delay kernel failed ({type(e).__name__}: {e}); timing without it")
        return None
    return delay


def time_back_to_back(call, n_sets: int, events: EventPool, opts: TimingOptions, batch: int = 20) -> Timing:
    """Median GPU time per call of call(i) made back to back, as a user's loop makes them:
    events around batches of `batch` calls, no delay kernel, so host time the GPU waits for
    is counted (what triton.testing.do_bench measures). `call` must have run once already."""
    n_sets = max(1, int(n_sets))
    counter = [0]

    def run(n: int) -> float:
        e0, e1 = events.get(2)
        events.record(e0)
        for _ in range(n):
            call(counter[0] % n_sets)
            counter[0] += 1
        events.record(e1)
        return events.elapsed(e0, e1) / n

    est = run(3)
    for _ in range(opts.warmup_count(est)):
        call(counter[0] % n_sets)
        counter[0] += 1
    reps = max(5, min(200, opts.rep_count(est * batch) if opts.reps is None else opts.reps))
    return summarize([run(batch) for _ in range(reps)])


def time_pair_back_to_back(first, second, n_sets: int, events: EventPool, opts: TimingOptions,
                           batch: int = 20) -> tuple:
    """time_back_to_back of two calls whose batches alternate, so that clock drift and heat
    weigh on both alike: (Timing of first, Timing of second)."""
    n_sets = max(1, int(n_sets))
    counter = [0]

    def run(call, n: int) -> float:
        e0, e1 = events.get(2)
        events.record(e0)
        for _ in range(n):
            call(counter[0] % n_sets)
            counter[0] += 1
        events.record(e1)
        return events.elapsed(e0, e1) / n

    est = max(run(first, 3), run(second, 3))
    for _ in range(opts.warmup_count(est)):
        first(counter[0] % n_sets)
        second(counter[0] % n_sets)
        counter[0] += 1
    reps = max(5, min(200, opts.rep_count(est * batch) if opts.reps is None else opts.reps))
    a, b = [], []
    for _ in range(reps):
        a.append(run(first, batch))
        b.append(run(second, batch))
    return summarize(a), summarize(b)


def time_calls(call, n_sets: int, events: EventPool, opts: TimingOptions, delay: Delay | None = None) -> Timing:
    """Median GPU time of call(i) (i = buffer set), each call between its own events.

    `call` must already have run once (JIT, autotuning) before this is used."""
    n_sets = max(1, int(n_sets))
    counter = [0]

    def next_set() -> int:
        i = counter[0] % n_sets
        counter[0] += 1
        return i

    def batch(n: int, delay_ms: float) -> tuple[list, float]:
        evs = events.get(2 * n)
        if delay is not None:
            delay(delay_ms)
        t0 = time.perf_counter()
        for j in range(n):
            events.record(evs[2 * j])
            call(next_set())
            events.record(evs[2 * j + 1])
        cpu_ms = (time.perf_counter() - t0) * 1e3 / n
        return [events.elapsed(evs[2 * j], evs[2 * j + 1]) for j in range(n)], cpu_ms

    # Estimate the GPU time per call and the CPU time to enqueue one (events included).
    est, cpu_ms = batch(5, 10.0)
    est_ms = statistics.median(est)

    for _ in range(opts.warmup_count(est_ms)):
        call(next_set())

    n = opts.rep_count(est_ms)
    samples: list = []
    per_batch = max(1, min(MAX_BATCH, int(MAX_DELAY_MS / max(cpu_ms * 1.5, 1e-3))))
    while len(samples) < n:
        k = min(per_batch, n - len(samples))
        got, cpu = batch(k, 1.5 * k * cpu_ms + 0.2)
        cpu_ms = max(cpu_ms, cpu)
        samples.extend(got)
    return summarize(samples)

