"""Why the "graph" launch route did or did not save host time: in one process on the route
(TILEGEN_LAUNCH=graph), for a small and a large f16 problem on torch tensors, CPU microseconds per
call of the Launcher's remembered launch (replayed once its bytes repeat), the plain cuLaunchKernelEx
of the same buffer, cuGraphLaunch of the Replay's executable called directly, the capture check
alone, kernel.launch, kernel(A, B, out=C) (and over four outputs in turn, as a model's layers
call one kernel), tilegen.matmul and torch.matmul; the Replay's state after timing, and what one capture
and instantiation cost. Writes DIR/graph_probe.json.

    TILEGEN_LAUNCH=graph python3 tools/h200_graph_probe.py DIR
"""
import json
import os
import sys
import time

import torch

import tilegen
from tilegen.bench.host import per_call_us
from tilegen.runtime import driver, replay


def probe(n: int) -> dict:
    A, B = (torch.randn(n, n, device="cuda").half() for _ in range(2))
    C = torch.empty(n, n, device="cuda", dtype=torch.float16)
    kernel = tilegen.compile(tilegen.GemmSpec(dtype="f16", out_dtype="f16"))
    kernel(A, B, out=C)
    torch.cuda.synchronize()
    launcher = kernel.launcher()
    rep = launcher._replay
    if rep is None:
        raise SystemExit(f"the Launcher is on route {launcher.route!r}: run with TILEGEN_LAUNCH=graph")
    (run, grid, values), = kernel.fast_call._last[4]
    stream = torch.cuda.current_stream().cuda_stream
    for _ in range(replay.REPEATS + 1):
        run(grid, values, stream)
    torch.cuda.synchronize()
    built = rep.current.executable is not None
    # one capture + instantiation, timed: reset, repeat until built
    rep.reset()
    t0 = time.perf_counter()
    for _ in range(replay.REPEATS + 1):
        run(grid, values, stream)
    build_us = (time.perf_counter() - t0) * 1e6
    torch.cuda.synchronize()
    glaunch, is_capturing = replay._CALLS[0]
    graph = rep.current
    layers = [torch.empty_like(C) for _ in range(4)]   # one kernel, four argument sets in turn
    args = {"M": n, "N": n, "K": n, "A_ptr": A.data_ptr(), "A_ld": n, "B_ptr": B.data_ptr(), "B_ld": n,
            "C_ptr": C.data_ptr(), "C_ld": n, "alpha": 1.0, "beta": 0.0}
    sizes = {"M": n, "N": n, "K": n}
    fns = {
        "torch.matmul": lambda: torch.matmul(A, B, out=C),
        "Launcher (remembered, graph route)": lambda: run(grid, values, stream),
        "cuLaunchKernelEx alone (relaunch)": launcher.relaunch,
        "cuGraphLaunch alone (ctypes)": lambda: glaunch(*graph.args),
        "capture check alone": lambda: is_capturing(graph.args[1], rep._status_ref),
        "capture check (driver.capturing)": lambda: driver.capturing(stream),
        "kernel.launch(dict)": lambda: kernel.launch(args, sizes, stream=stream),
        "kernel(A, B, out=C)": lambda: kernel(A, B, out=C),
        "4 x kernel(A, B, out=Ci) in turn": lambda: [kernel(A, B, out=Ci) for Ci in layers],
        "tilegen.matmul(A, B, out=C)": lambda: tilegen.matmul(A, B, out=C),
    }
    timed = per_call_us(fns, torch.cuda.synchronize, 200, 15)
    ref = A.double() @ B.double()
    kernel(A, B, out=C)
    torch.cuda.synchronize()
    err = float(((C.double() - ref).norm() / ref.norm()).item())
    return {"n": n, "rel_err": err, "built_after_repeats": built, "graphs": len(rep.graphs),
            "built": sum(g.executable is not None for g in rep.graphs.values()), "broken": rep.broken,
            "reset_to_built_us": round(build_us, 1),
            "host_us": {k: {m: round(v, 3) for m, v in t.items()} for k, t in timed.items()}}


def main():
    out_dir = sys.argv[1]
    res = {"gpu": torch.cuda.get_device_name(), "rows": [probe(n) for n in (256, 2048)]}
    with open(os.path.join(out_dir, "graph_probe.json"), "w") as fh:
        json.dump(res, fh, indent=1)
    for row in res["rows"]:
        print(f"f16 {row['n']}^3: rel err {row['rel_err']:.2e}; built {row['built_after_repeats']}, after timing "
              f"{row['built']} of {row['graphs']} keys built, broken {row['broken']}, "
              f"reset->built {row['reset_to_built_us']} us")
        for k, t in row["host_us"].items():
            print(f"  {k:<36} {t['us']:8.2f} {t['us_min']:8.2f} {t['us_max']:8.2f}")


if __name__ == "__main__":
    main()
