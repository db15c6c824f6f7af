"""CUDA-event timing the GPU tools share: `events_ms(fn, reps)` runs fn once, then `rounds`
rounds of `reps` back-to-back calls between two events; the median and the fastest round's
milliseconds per call. `graph_us(fns)`: microseconds per call of a CUDA graph of `n` calls
taking the functions in turn (operand sets rotated), replayed `reps` times, the median."""
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


def graph_us(fns, n: int = 24, reps: int = 25) -> float:
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):   # (first calls outside the capture: compile, load, remember)
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(n):
            fns[i % len(fns)]()
    g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        g.replay()
        e1.record()
        torch.cuda.synchronize()
        ts.append(e0.elapsed_time(e1) * 1e3 / n)
    return round(statistics.median(ts), 2)
