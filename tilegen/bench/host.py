"""Host cost per call: the CPU microseconds each way of running a GEMM spends before the GPU
has its work, in steady state (`tilegen bench --host`).

    torch.matmul(A, B, out=C)                 what cuBLAS costs through PyTorch (fp8: torch._scaled_mm)
    driver call                               cuLaunchKernelEx alone on the buffer a launch packed: the
                                              floor of a kernel's launch (a repeated launch's graph
                                              replay, the default route, goes under it)
    kernel.launch(args, sizes, stream=s)      a prepared launch (a dict of arguments)
    kernel(A, B, out=C)                       a compiled GemmKernel on torch (or CuPy) arrays
    kernel(A, Bi, out=Ci), 4 in turn          the same over four weights and outputs in turn, per call
                                              (one kernel for each of a model's layers)
    as a DSL kernel: (A, B, C, alpha, beta)   the same kernel called as a kernel of one's own is
                                              (kernel.call_arrays: arrays by the names declared)
    a DSL kernel: scale(x, y, alpha=)         a kernel written in the DSL (y = alpha * x on two f32
                                              arrays), called as users call their own kernels
    tilegen.matmul(A, B, out=C)               the front door

Method: after warm-up calls (compile, load, first launch) and WARM_S seconds of calls (the
host's clock settles), `calls` calls of one way are made back to back with the host clock read
before and after (no synchronisation inside; the GPU queue holds them all) and the GPU is
drained; the ways take turns, and this is repeated `reps` times, so that every way sees the
same phases of the host's clock. The median of the per-call times is reported, with the
minimum and maximum. Small problems keep each kernel short, but the number is the host's
either way: the launches are only enqueued.
"""
from __future__ import annotations

import statistics
import time

from .. import runtime
from .. import dsl as tg
from ..frontend import compile as compile_kernel
from ..gemm import GemmSpec, compile_gemm, matmul


WARM_S = 0.5
LAYERS = "kernel(A, Bi, out=Ci), 4 in turn"
DSL = "as a DSL kernel: (A, B, C, alpha, beta)"
OWN = "a DSL kernel: scale(x, y, alpha=)"


@tg.kernel
def scale_kernel():
    """y = alpha * x, one 16 x 8 block per CTA: a kernel of one's own, for its call's host time."""
    tg.launch(threads=32, grid=(tg.cdiv("M", 16), tg.cdiv("N", 8), 1))
    X = tg.tensor("X", "f32", ("M", "N"))
    Y = tg.tensor("Y", "f32", ("M", "N"))
    x = tg.fragment("m16n8k16.f16.f32", "C", (1, 1))
    r, c = tg.program_id("x") * 16, tg.program_id("y") * 8
    tg.accumulate(x, X.block(r, c))
    tg.store(Y.block(r, c), x * tg.scalar("alpha"))


def per_call_us(fns: dict, sync, calls: int, reps: int) -> dict:
    """{name: {"us", "us_min", "us_max"}} for each of `fns`, measured in turns (see above)."""
    for fn in fns.values():
        for _ in range(3):
            fn()
    sync()
    end = time.perf_counter() + WARM_S
    while time.perf_counter() < end:
        for fn in fns.values():
            for _ in range(10):
                fn()
        sync()
    samples = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            samples[name].append((time.perf_counter() - t0) * 1e6 / calls)
            sync()
    return {name: {"us": statistics.median(s), "us_min": min(s), "us_max": max(s)} for name, s in samples.items()}


def host_costs(dtype: str = "bf16", size: int = 1024, calls: int = 200, reps: int = 25) -> dict:
    """Host microseconds per call of torch.matmul, a prepared launch, kernel(...) and
    tilegen.matmul on torch tensors (and kernel(...) on CuPy arrays when CuPy is there),
    for a size^3 problem of `dtype`, A and B row-major."""
    import torch

    fp8 = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}
    if dtype not in ("f16", "bf16", "tf32", "f32", *fp8):
        raise ValueError(f"host costs are measured for f16, bf16, tf32, f32, e4m3 and e5m2, not {dtype!r}")
    tdt = getattr(torch, fp8[dtype]) if dtype in fp8 else {"f16": torch.float16, "bf16": torch.bfloat16}.get(
        dtype, torch.float32)
    A = torch.randn(size, size, device="cuda").to(tdt)
    B = torch.randn(size, size, device="cuda").to(tdt)
    if dtype in fp8:   # K-major, as torch._scaled_mm takes them: B the transpose of a row-major matrix
        B = B.t()
    C = torch.empty(size, size, device="cuda", dtype=torch.bfloat16 if dtype in fp8 else A.dtype)
    sync = torch.cuda.synchronize
    out_dtype = "bf16" if dtype in fp8 else "f32" if dtype in ("tf32", "f32") else dtype
    spec = GemmSpec(dtype="tf32" if dtype == "f32" else dtype, out_dtype=out_dtype,
                    **({"b_layout": "col"} if dtype in fp8 else {}))
    kernel = compile_gemm(spec)
    args = {"M": size, "N": size, "K": size, "A_ptr": A.data_ptr(), "A_ld": size, "B_ptr": B.data_ptr(),
            "B_ld": size, "C_ptr": C.data_ptr(), "C_ld": size, "alpha": 1.0, "beta": 0.0}
    sizes = {"M": size, "N": size, "K": size}
    stream = torch.cuda.current_stream().cuda_stream
    out = {"dtype": dtype, "size": size, "calls": calls, "reps": reps, "launch_route": runtime.launch_route(),
           "kernel": kernel.name}
    kw = {"allow_tf32": True} if dtype == "tf32" else {}
    fns = {}
    if dtype in fp8:   # cuBLASLt through torch._scaled_mm; per-tensor scales of 1
        one = torch.ones((), device="cuda")
        fns["torch.matmul"] = lambda: torch._scaled_mm(A, B, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        kw = {"scale_a": 1.0, "scale_b": 1.0}
    else:
        fns["torch.matmul"] = lambda: torch.matmul(A, B, out=C)
    fns["kernel.launch"] = lambda: kernel.launch(args, sizes, stream=stream)
    launcher = kernel.launcher()
    if launcher.route in ("ex", "graph"):   # after the warm-up's launches the buffer holds this very launch
        kernel.launch(args, sizes, stream=stream)
        fns["driver call"] = launcher.relaunch
    fns["kernel(A, B, out=C)"] = lambda: kernel(A, B, out=C)
    layers = [(torch.empty_like(B), torch.empty_like(C)) for _ in range(4)]
    for Bi, _ in layers:
        Bi.copy_(B)
    fns[LAYERS] = lambda: [kernel(A, Bi, out=Ci) for Bi, Ci in layers]
    if kernel._array_names == ("A", "B", "C"):
        fns[DSL] = lambda: kernel.call_arrays(A, B, C, alpha=1.0, beta=0.0)
    scale, x, y = compile_kernel(scale_kernel), torch.randn(256, 256, device="cuda"), torch.empty(256, 256, device="cuda")
    fns[OWN] = lambda: scale(x, y, alpha=2.0)
    fns["tilegen.matmul"] = lambda: matmul(A, B, out=C, **kw)
    try:
        import cupy
    except ImportError:
        cupy = None
    if cupy is not None and dtype not in ("bf16", *fp8):  # CuPy has no bfloat16 or fp8
        a, b, c = (cupy.asarray(x) for x in (A, B, C))  # the same memory, through __cuda_array_interface__
        fns["kernel(A, B, out=C) cupy"] = lambda: kernel(a, b, out=c)
    allowed = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"   # (tf32: torch with TF32 allowed too, as in the bench's rows)
    try:
        out.update(per_call_us(fns, sync, calls, reps))
        out[LAYERS] = {k: v / len(layers) for k, v in out[LAYERS].items()}
    finally:
        torch.backends.cuda.matmul.allow_tf32 = allowed
    out["tilegen.matmul spec"] = str(matmul.explain(A, B, out=C, **kw).spec)
    return out


def format_host(res: dict) -> str:
    lines = [f"host microseconds per call, {res['dtype']} {res['size']}^3 (steady state, median of "
             f"{res['reps']} x {res['calls']} calls; launch route: {res['launch_route']})"]
    for name in ("torch.matmul", "driver call", "kernel.launch", "kernel(A, B, out=C)", "kernel(A, B, out=C) cupy",
                 LAYERS, DSL, OWN, "tilegen.matmul"):
        if name in res:
            r = res[name]
            lines.append(f"  {name:34s} {r['us']:7.2f} us   (min {r['us_min']:.2f}, max {r['us_max']:.2f})")
    return "\n".join(lines)


__all__ = ["host_costs", "format_host"]
