"""The floor under a launch's host time: CPU microseconds per call of the driver's launch of an
empty kernel, by the bytes of its parameters, beside tilegen's own launches of the same kernels
and the cheapest launch torch makes from Python. Issue 14 asks kernel.launch for <= 4 us; the
driver call tilegen makes measured 4.2-4.9 us on the H200 host (runs 47, 320) with a GEMM's
parameters (three 128-byte tensor maps and 14 scalars, about 520 bytes). This says whether that
is the platform's floor for any launch, or grows with the parameters (then passing the tensor
maps through global memory would cut it).

Rows (each an empty kernel, `ret;`, launched back to back on one stream, `calls` at a time
between synchronisations, the ways taking turns: tilegen.bench.host.per_call_us):
    ctypes no-op           cuCtxGetCurrent through ctypes: what a ctypes call costs by itself
    torch sleep(0)         torch.cuda._sleep(0): one kernel launched by torch's C++
    Ex P                   cuLaunchKernelEx through ctypes, arguments prepared (tilegen's route)
    plain P                cuLaunchKernel through ctypes, arguments prepared, kernelParams
    extra P                cuLaunchKernel with the parameters as one buffer (CU_LAUNCH_PARAM_BUFFER_POINTER)
    Launcher P             tilegen's runtime.Launcher (the packed values launched again)
for P = 0, 8, 128, 512, 1024 and 4096 bytes of parameters (one .b8 array, 16-byte aligned; 4096 is
the most a launch takes on sm_90 before CUDA 12.1's 32 KB). Writes DIR/launch_floor.json.

    python3 tools/h200_launch_floor.py DIR [calls] [reps]
"""
import ctypes
import json
import os
import sys

import torch

from tilegen import runtime
from tilegen.bench.host import per_call_us

SIZES = (0, 8, 128, 512, 1024, 4096)
CU_LAUNCH_PARAM_BUFFER_POINTER = 1
CU_LAUNCH_PARAM_BUFFER_SIZE = 2
CU_LAUNCH_PARAM_END = 0


def ptx_of(sizes) -> str:
    """One module with an empty kernel per parameter size: k<P>."""
    lines = [".version 8.0", ".target sm_90", ".address_size 64", ""]
    for p in sizes:
        param = f"(.param .align 16 .b8 p[{p}])" if p else "()"
        lines += [f".visible .entry k{p}{param}", "{", "    ret;", "}", ""]
    return "\n".join(lines)


def main():
    out_dir = sys.argv[1]
    calls = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    reps = int(sys.argv[3]) if len(sys.argv) > 3 else 25
    torch.cuda.init()
    torch.empty(1, device="cuda")   # (torch's primary context current: tilegen shares it)
    runtime.ensure_context(0)
    stream = torch.cuda.current_stream().cuda_stream
    lib = ctypes.CDLL("libcuda.so.1")
    ex, plain, current = lib.cuLaunchKernelEx, lib.cuLaunchKernel, lib.cuCtxGetCurrent
    ex.argtypes, ex.restype = [ctypes.c_void_p] * 4, ctypes.c_int
    u = ctypes.c_uint
    plain.argtypes = [ctypes.c_void_p, u, u, u, u, u, u, u, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    plain.restype = ctypes.c_int
    current.argtypes, current.restype = [ctypes.c_void_p], ctypes.c_int
    ctx = ctypes.c_void_p()
    ptx = ptx_of(SIZES)
    fns = {"ctypes no-op": lambda: current(ctypes.byref(ctx)),
           "torch sleep(0)": lambda: torch.cuda._sleep(0)}
    keep = []
    for p in SIZES:
        f = runtime.load_module(ptx, f"k{p}")
        h = ctypes.c_void_p(int(f.handle))
        storage = ctypes.create_string_buffer(max(p, 16))
        pointers = (ctypes.c_void_p * 1)(ctypes.addressof(storage))
        params = ctypes.c_void_p(ctypes.addressof(pointers) if p else 0)
        # CUlaunchConfig: grid 1 1 1, block 32 1 1, shared 0, (pad), stream, attrs NULL, 0 attrs
        config = ctypes.create_string_buffer(56)
        ctypes.memmove(config, (ctypes.c_uint * 7)(1, 1, 1, 32, 1, 1, 0), 28)
        ctypes.c_uint64.from_buffer(config, 32).value = stream
        cfg = ctypes.c_void_p(ctypes.addressof(config))
        size = ctypes.c_size_t(p)
        extra = (ctypes.c_void_p * 5)(CU_LAUNCH_PARAM_BUFFER_POINTER, ctypes.addressof(storage),
                                      CU_LAUNCH_PARAM_BUFFER_SIZE, ctypes.addressof(size), CU_LAUNCH_PARAM_END)
        keep += [storage, pointers, config, size, extra]
        s = ctypes.c_void_p(stream)
        fns[f"Ex {p}"] = lambda cfg=cfg, h=h, params=params: ex(cfg, h, params, None)
        fns[f"plain {p}"] = lambda h=h, params=params, s=s: plain(h, 1, 1, 1, 32, 1, 1, 0, s, params, None)
        if p:
            fns[f"extra {p}"] = lambda h=h, s=s, e=ctypes.c_void_p(ctypes.addressof(extra)): plain(
                h, 1, 1, 1, 32, 1, 1, 0, s, None, e)
        launcher = runtime.Launcher(f, ("u64",) * (p // 8), 32, 0)
        values = (0,) * (p // 8)
        grid = (1, 1, 1)
        launcher(grid, values, stream)
        fns[f"Launcher {p}"] = lambda launcher=launcher, values=values, grid=grid: launcher(grid, values, stream)
    for name, fn in fns.items():   # every way launches (a refused launch returns an error code)
        err = fn()
        if isinstance(err, int) and err != 0 and name != "ctypes no-op":
            raise SystemExit(f"{name}: CUDA error {err}")
    torch.cuda.synchronize()
    timed = per_call_us(fns, torch.cuda.synchronize, calls, reps)
    res = {"gpu": torch.cuda.get_device_name(), "calls": calls, "reps": reps,
           "host_us": {k: {m: round(v, 3) for m, v in t.items()} for k, t in timed.items()}}
    with open(os.path.join(out_dir, "launch_floor.json"), "w") as fh:
        json.dump(res, fh, indent=1)
    print(f"{'way':<18} {'us/call':>8} {'min':>8} {'max':>8}")
    for k, t in timed.items():
        print(f"{k:<18} {t['us']:8.2f} {t['us_min']:8.2f} {t['us_max']:8.2f}")


if __name__ == "__main__":
    main()
