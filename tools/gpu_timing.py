"""CUDA-event timing the GPU tools share: `events_ms(fn, reps)` runs fn once, then `rounds`
rounds of `reps` back-to-back calls between two events; the median and the fastest round's
milliseconds per call. `graph_us(fns)`: microseconds per call of a CUDA graph of `n` calls
taking the functions in turn (operand sets rotated), replayed `reps` times, the median.
`interleaved_us(fns, sets, reps)`: microseconds per call of each named function, its rounds
taking turns with the others' (each round `reps` calls over the operand sets in rotation), the
median. `max_relative_error(f, C, ref, scale)`: runs f once into a poisoned C, max |C - ref| /
scale. `against_torch(kernels, sets, **kw)`: torch.matmul, tilegen.matmul(**kw) and each compiled
kernel on operand sets (A, B, C): graph_us times, ratios to torch and errors against float64.
`checked_spec_us(spec, sets, ref)`: a spec's kernel checked on the first set against ref (normwise,
below 1e-2), then graph_us over the sets; or the error's first words when it fails or is refused."""
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


def interleaved_us(fns: dict, sets, reps: int, rounds: int = 7) -> dict:
    import torch

    times = {k: [] for k in fns}
    for f in fns.values():
        for s in sets:
            f(s)
    torch.cuda.synchronize()
    for _ in range(rounds):
        for name, f in fns.items():
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for r in range(reps):
                f(sets[r % len(sets)])
            e1.record()
            e1.synchronize()
            times[name].append(e0.elapsed_time(e1) * 1000 / reps)
    return {k: round(statistics.median(v), 2) for k, v in times.items()}


def max_relative_error(f, C, ref, scale) -> float:
    import torch

    C.fill_(float("nan"))
    f()
    torch.cuda.synchronize()
    return float(((C.double() - ref).abs() / scale).max())


def against_torch(kernels: dict, sets, **matmul_kw) -> dict:
    import torch

    import tilegen

    A, B, C = sets[0]
    ref = A.double() @ B.double()
    scale = A.double().abs() @ B.double().abs()
    fns = {"torch": lambda s: torch.matmul(s[0], s[1], out=s[2]),
           "matmul": lambda s: tilegen.matmul(s[0], s[1], out=s[2], **matmul_kw)}
    for name, k in kernels.items():
        fns[name] = (lambda k: lambda s: k(s[0], s[1], out=s[2]))(k)
    err = {name: max_relative_error(lambda f=f: f(sets[0]), C, ref, scale) for name, f in fns.items()}
    us = {name: round(graph_us([(lambda f, s: lambda: f(s))(f, s) for s in sets]), 2) for name, f in fns.items()}
    return dict(us=us, x_torch={k: round(us["torch"] / v, 3) for k, v in us.items()}, err=err)


def checked_spec_us(spec, sets, ref, tol: float = 1e-2):
    import torch

    import tilegen

    try:
        kern = tilegen.compile(spec)
        A, B, C = sets[0]
        C.fill_(float("nan"))
        kern(A, B, out=C)
        torch.cuda.synchronize()
        err = float(torch.linalg.norm(C.double() - ref) / torch.linalg.norm(ref))
        assert err < tol, err
        return graph_us([lambda A=A, B=B, C=C: kern(A, B, out=C) for A, B, C in sets])
    except Exception as e:  # noqa: BLE001  (a refused or wrong variant is a row entry, not a stop)
        return f"{type(e).__name__}: {e}"[:120]
