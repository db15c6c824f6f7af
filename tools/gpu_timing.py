"""CUDA-event timing the GPU tools share: `events_ms(fn, reps)` runs fn once, then `rounds`
rounds of `reps` back-to-back calls between two events; the median and the fastest round's
milliseconds per call."""
from __future__ import annotations

import statistics


def events_ms(fn, reps: int, rounds: int = 5) -> dict:
    import torch

    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / reps)
    return {"ms": statistics.median(times), "ms_min": min(times)}
