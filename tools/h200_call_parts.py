"""Where the host time of kernel(A, B, out=C) goes on a GPU host: the call, beside its parts
measured alone in the same turns (tilegen.bench.host.per_call_us), f16 2048^3 on torch tensors.

Rows, CPU microseconds per call:
    torch.matmul             cuBLAS through PyTorch, for scale
    driver call              cuLaunchKernelEx alone on the buffer the launch packed (Launcher.relaunch)
    Launcher(grid, args)     tilegen's prepared launch of the remembered arguments
    kernel.launch(dict)      a prepared launch from a dict of arguments
    3 probes                 the torch adapter's reads of A, B and C (pointer, shape, strides, dtype, device)
    current stream           torch's current stream as an int
    FastCall.run(probed)     the fast path from probes already made, its launch included
    kernel(A, B, out=C)      the whole call
tilegen's own share of kernel(...) is the call less the probes, the stream and the Launcher's call.

    python3 tools/h200_call_parts.py DIR [calls] [reps]
"""
import json
import os
import sys

import torch

import tilegen
from tilegen.bench.host import per_call_us
from tilegen.runtime import interop


def main():
    out_dir = sys.argv[1]
    calls = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    reps = int(sys.argv[3]) if len(sys.argv) > 3 else 25
    n = 2048
    A, B = (torch.randn(n, n, device="cuda").half() for _ in range(2))
    C = torch.empty(n, n, device="cuda", dtype=torch.float16)
    kernel = tilegen.compile(tilegen.GemmSpec(dtype="f16", out_dtype="f16"))
    kernel(A, B, out=C)
    torch.cuda.synchronize()
    ref = A.double() @ B.double()
    err = float(((C.double() - ref).norm() / ref.norm()).item())
    if not err < 1e-2:
        raise SystemExit(f"kernel(A, B, out=C) is wrong: relative error {err}")
    lib = interop.library(A)
    pa, pb, pc = lib.probe(A), lib.probe(B), lib.probe(C)
    fast = kernel.fast_call
    stream = torch.cuda.current_stream().cuda_stream
    args = {"M": n, "N": n, "K": n, "A_ptr": A.data_ptr(), "A_ld": n, "B_ptr": B.data_ptr(), "B_ld": n,
            "C_ptr": C.data_ptr(), "C_ld": n, "alpha": 1.0, "beta": 0.0}
    sizes = {"M": n, "N": n, "K": n}
    launcher = kernel.launcher()
    (run, grid, values), = fast._last[4]   # the remembered launch of kernel(A, B, out=C)
    fns = {
        "torch.matmul": lambda: torch.matmul(A, B, out=C),
        "Launcher(grid, args)": lambda: run(grid, values, stream),
        "kernel.launch(dict)": lambda: kernel.launch(args, sizes, stream=stream),
        "3 probes": lambda: (lib.probe(A), lib.probe(B), lib.probe(C)),
        "current stream": lambda: lib.stream(0),
        "FastCall.run(probed)": lambda: fast.run(lib, pa, pb, C, pc, None, None, 1.0, 0.0, False),
        "kernel(A, B, out=C)": lambda: kernel(A, B, out=C),
    }
    run(grid, values, stream)
    fns["driver call"] = launcher.relaunch   # (the buffer holds the remembered launch: every way packs the same)
    timed = per_call_us(fns, torch.cuda.synchronize, calls, reps)
    t = {k: v["us"] for k, v in timed.items()}
    own = t["kernel(A, B, out=C)"] - t["3 probes"] - t["current stream"] - t["Launcher(grid, args)"]
    res = {"gpu": torch.cuda.get_device_name(), "kernel": kernel.name, "calls": calls, "reps": reps,
           "rel_err": err, "tilegen_own_us": round(own, 3),
           "host_us": {k: {m: round(v, 3) for m, v in x.items()} for k, x in timed.items()}}
    with open(os.path.join(out_dir, "call_parts.json"), "w") as fh:
        json.dump(res, fh, indent=1)
    print(f"{kernel.name}, f16 {n}^3, relative error {err:.2e}")
    print(f"{'part':<24} {'us/call':>8} {'min':>8} {'max':>8}")
    for k, x in timed.items():
        print(f"{k:<24} {x['us']:8.2f} {x['us_min']:8.2f} {x['us_max']:8.2f}")
    print(f"{'tilegen own, kernel(...)':<24} {own:8.2f}")


if __name__ == "__main__":
    main()
