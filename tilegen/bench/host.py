"""Host cost per call: the CPU microseconds each way of running a GEMM spends before the GPU
has its work, in steady state (`tilegen bench --host`).

    torch.matmul(A, B, out=C)                 what cuBLAS costs through PyTorch (fp8: torch._scaled_mm)
    kernel.launch(args, sizes, stream=s)      a prepared launch (a dict of arguments)
    kernel(A, B, out=C)                       a compiled GemmKernel on torch (or CuPy) arrays
    tilegen.matmul(A, B, out=C)               the front door

Method: after warm-up calls (compile, load, first launch), `calls` calls are made back to
back with the host clock read before and after (no synchronisation inside; the GPU queue
holds them all), the GPU is drained, and this is repeated `reps` times; the median of the
per-call times is reported, with the minimum and maximum. Small problems keep each kernel
short, but the number is the host's either way: the launches are only enqueued.
"""
from __future__ import annotations

import statistics
import time

from .. import runtime
from ..gemm import GemmSpec, compile_gemm, matmul


def _per_call_us(fn, sync, calls: int, reps: int) -> dict:
    for _ in range(3):
        fn()
    sync()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - t0) * 1e6 / calls)
        sync()
    return {"us": statistics.median(samples), "us_min": min(samples), "us_max": max(samples)}


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
    if dtype in fp8:   # cuBLASLt through torch._scaled_mm; per-tensor scales of 1
        one = torch.ones((), device="cuda")
        out["torch.matmul"] = _per_call_us(lambda: torch._scaled_mm(A, B, scale_a=one, scale_b=one,
                                                                    out_dtype=torch.bfloat16), sync, calls, reps)
        kw = {"scale_a": 1.0, "scale_b": 1.0}
    else:   # (tf32: torch with TF32 allowed too, as cuBLAS runs it in the bench's rows)
        allowed = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
        try:
            out["torch.matmul"] = _per_call_us(lambda: torch.matmul(A, B, out=C), sync, calls, reps)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = allowed
    out["kernel.launch"] = _per_call_us(lambda: kernel.launch(args, sizes, stream=stream), sync, calls, reps)
    out["kernel(A, B, out=C)"] = _per_call_us(lambda: kernel(A, B, out=C), sync, calls, reps)
    out["tilegen.matmul"] = _per_call_us(lambda: matmul(A, B, out=C, **kw), sync, calls, reps)
    out["tilegen.matmul spec"] = str(matmul.explain(A, B, out=C, **kw).spec)
    try:
        import cupy
    except ImportError:
        return out
    if dtype not in ("bf16", *fp8):  # CuPy has no bfloat16 or fp8
        a, b, c = (cupy.asarray(x) for x in (A, B, C))  # the same memory, through __cuda_array_interface__
        out["kernel(A, B, out=C) cupy"] = _per_call_us(lambda: kernel(a, b, out=c), sync, calls, reps)
    return out


def format_host(res: dict) -> str:
    lines = [f"host microseconds per call, {res['dtype']} {res['size']}^3 (steady state, median of "
             f"{res['reps']} x {res['calls']} calls; launch route: {res['launch_route']})"]
    for name in ("torch.matmul", "kernel.launch", "kernel(A, B, out=C)", "kernel(A, B, out=C) cupy",
                 "tilegen.matmul"):
        if name in res:
            r = res[name]
            lines.append(f"  {name:28s} {r['us']:7.2f} us   (min {r['us_min']:.2f}, max {r['us_max']:.2f})")
    return "\n".join(lines)


__all__ = ["host_costs", "format_host"]
