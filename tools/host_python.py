"""tilegen's own Python on the hot path, measured on any machine: the fast paths of kernel(A, B,
out=C) and tilegen.matmul(A, B, out=C) over the emulator's stand-in GPU (tests/sim_device.py)
with launches that do nothing, layer by layer, so what tilegen adds to the driver's launch and
the array library's attribute reads can be watched without a GPU (issue 14's host times: the
driver call and torch's probes are measured on the GPU host, `tilegen bench --host`).

Rows: microseconds per call, the median of `reps` rounds of `calls` calls:
    kernel(a, b, out=c)       the whole call (GemmKernel.__call__ -> FastCall -> launcher)
    FastCall(...)             from the arrays (the adapter's three probes included)
    FastCall.run(probed)      the remembered launch from probes made already
    3 probes                  the stand-in adapter's probes (numpy dtype names: not torch's cost)
    matmul(a, b, out=c)       tilegen.matmul's remembered choice and launch
    4 layers in turn          kernel(a, bi, out=ci) over four weights and outputs in turn, per call
                              (as a model calls one kernel for each of its layers)
    launcher (no-op)          the stand-in launcher's call itself
    2 probes (x, y)           the stand-in's probes of the DSL kernel's arrays (numpy's float32 name)
    kernel.launch(args, ...)  a prepared launch of a dict of arguments (the same dict each call)
    as a DSL kernel           kernel.call_arrays(a, b, c, alpha=1.0, beta=0.0): the GEMM kernel called
                              as a kernel of one's own (compiler/call.py): a remembered call, then
                              kernel.launch's remembered launch
    a DSL kernel (x, y, ...)  a kernel written in the DSL (two f32 tensors and a scalar): a remembered
                              call handed straight to its Launcher
tilegen's own time is kernel(...) less the probes and the no-op launcher's call.

    python3 tools/host_python.py [calls] [reps]
"""
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(1, os.path.join(REPO, "tests"))

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
from _pytest.monkeypatch import MonkeyPatch  # noqa: E402

import sim_device  # noqa: E402
import tilegen  # noqa: E402
from tilegen.bench.host import scale_kernel  # noqa: E402
from tilegen.runtime import interop  # noqa: E402


def per_call_us(fn, calls: int, reps: int) -> float:
    for _ in range(calls // 4):
        fn()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(samples)


def main():
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 15
    patches = MonkeyPatch()
    dev = sim_device.SimDevice(patches)
    patches.setattr(sim_device._Launcher, "__call__", lambda self, grid, values, stream=0: None)
    kernel = tilegen.compile(tilegen.GemmSpec(dtype="bf16", out_dtype="bf16", instruction="wgmma",
                                              tile=(64, 128, 64), warps=(4, 1), stages=3))
    host = np.zeros((256, 256), ml_dtypes.bfloat16)
    a, b, c = dev.array(host), dev.array(host), dev.empty((256, 256), "bfloat16")
    layers = [(dev.array(host), dev.empty((256, 256), "bfloat16")) for _ in range(4)]
    lib = interop.library(a)
    pa, pb, pc = lib.probe(a), lib.probe(b), lib.probe(c)
    fast, launcher = kernel.fast_call, kernel.launcher(0)
    scale = tilegen.compile(scale_kernel)
    x, y = dev.array(np.zeros((64, 64), np.float32)), dev.empty((64, 64), "float32")
    args = {"M": 256, "N": 256, "K": 256, "A_ptr": a.ptr, "A_ld": 256, "B_ptr": b.ptr, "B_ld": 256, "C_ptr": c.ptr,
            "C_ld": 256, "alpha": 1.0, "beta": 0.0}
    args = {n: args[n] for n, _ in kernel.params if n in args}
    sizes = {"M": 256, "N": 256, "K": 256}
    rows = {
        "kernel(a, b, out=c)": lambda: kernel(a, b, out=c),
        "FastCall(...)": lambda: fast(a, b, c, None, None, 1.0, 0.0, False),
        "FastCall.run(probed)": lambda: fast.run(lib, pa, pb, c, pc, None, None, 1.0, 0.0, False),
        "3 probes": lambda: (lib.probe(a), lib.probe(b), lib.probe(c)),
        "matmul(a, b, out=c)": lambda: tilegen.matmul(a, b, out=c),
        "launcher (no-op)": lambda: launcher((1, 1, 1), (), 0),
        "4 layers in turn": lambda: [kernel(a, bi, out=ci) for bi, ci in layers],
        "kernel.launch(args, ...)": lambda: kernel.launch(args, sizes, stream=0),
        "as a DSL kernel": lambda: kernel.call_arrays(a, b, c, alpha=1.0, beta=0.0),
        "a DSL kernel (x, y, ...)": lambda: scale(x, y, alpha=2.0),
        "2 probes (x, y)": lambda: (lib.probe(x), lib.probe(y)),
    }
    got = {name: per_call_us(fn, calls, reps) for name, fn in rows.items()}
    got["4 layers in turn"] /= len(layers)
    for name, us in got.items():
        print(f"{name:<24} {us:7.3f} us")
    own = got["kernel(a, b, out=c)"] - got["3 probes"] - got["launcher (no-op)"]
    print(f"{'tilegen own, kernel(...)':<24} {own:7.3f} us")
    own = got["a DSL kernel (x, y, ...)"] - got["2 probes (x, y)"] - got["launcher (no-op)"]
    print(f"{'tilegen own, DSL kernel':<24} {own:7.3f} us")
    patches.undo()


if __name__ == "__main__":
    main()
