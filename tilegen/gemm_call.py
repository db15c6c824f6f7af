"""Calling a GEMM kernel: check the operands, place them on the GPU, launch, return C.

Host (numpy) operands are copied into pitched device buffers whose rows are padded to
16 bytes, so any shape runs; GPU arrays (__cuda_array_interface__ or DLPack) are used in
place and must already meet the kernel's layout and alignment."""
from __future__ import annotations

import numpy as np

from .arch.dtypes import numpy_dtype
from .errors import LaunchError

ALIGN = 16


def _is_host(x) -> bool:
    return isinstance(x, np.ndarray)


def _check_host(x, name: str, want: np.dtype, dtype_name: str):
    if not isinstance(x, np.ndarray):
        raise LaunchError(f"{name} must be a 2-D array (numpy, or a GPU array with __cuda_array_interface__ "
                          f"or DLPack), got {type(x).__name__}")
    if x.ndim != 2:
        raise LaunchError(f"{name} must be 2-D, got shape {x.shape}")
    if x.dtype != want:
        raise LaunchError(f"{name} has dtype {x.dtype}; this kernel takes {want} ({dtype_name})")


def _pitched(stored: np.ndarray) -> tuple[np.ndarray, int]:
    """A copy of `stored` with each row padded to a multiple of 16 bytes; returns (copy, ld)."""
    rows, cols = stored.shape
    per = ALIGN // stored.itemsize
    ld = max(per, -(-cols // per) * per)
    buf = np.zeros((rows, ld), dtype=stored.dtype)
    buf[:, :cols] = stored
    return buf, ld


def run_gemm(kernel, A, B, *, out=None, alpha=1.0, beta=0.0, device=None):
    spec = kernel.spec
    in_dt = numpy_dtype(spec.dtype)
    out_dt = numpy_dtype(spec.out_dtype)
    try:
        alpha, beta = float(alpha), float(beta)
    except (TypeError, ValueError):
        raise LaunchError(f"alpha and beta must be real numbers, got {alpha!r}, {beta!r}") from None
    if device == "sim":
        from .sim.gemm import run_gemm_sim

        return run_gemm_sim(kernel, A, B, out=out, alpha=alpha, beta=beta)
    if device not in (None, "gpu", "cuda") and not isinstance(device, int):
        raise LaunchError(f"device={device!r}; allowed: None, 'gpu', 'sim' or a GPU index")
    if all(_is_host(x) for x in (A, B)) and (out is None or _is_host(out)):
        from . import runtime

        if device is None and not runtime.gpu_available():  # no GPU: the emulator, said plainly
            import sys

            print("tilegen: no GPU found; running on the CPU emulator (device='sim')", file=sys.stderr)
            from .sim.gemm import run_gemm_sim

            return run_gemm_sim(kernel, A, B, out=out, alpha=alpha, beta=beta)
        return _run_host(kernel, A, B, out, alpha, beta, in_dt, out_dt,
                         device if isinstance(device, int) else 0)
    return _run_device(kernel, A, B, out, alpha, beta, in_dt, out_dt)


def _shapes(A, B, out):
    M, K = A.shape
    K2, N = B.shape
    if K != K2:
        raise LaunchError(f"A is {M} x {K} but B is {K2} x {N}: inner dimensions differ")
    if out is not None and tuple(out.shape) != (M, N):
        raise LaunchError(f"out has shape {tuple(out.shape)}; expected ({M}, {N})")
    return M, N, K


def _run_host(kernel, A, B, out, alpha, beta, in_dt, out_dt, device):
    from .runtime import DeviceBuffer

    spec = kernel.spec
    _check_host(A, "A", in_dt, spec.dtype)
    _check_host(B, "B", in_dt, spec.dtype)
    if out is not None:
        _check_host(out, "out", out_dt, spec.out_dtype)
        if not out.flags.writeable:
            raise LaunchError("out is read-only")
    M, N, K = _shapes(A, B, out)
    if beta != 0.0 and out is None:
        raise LaunchError("beta != 0 reads C from out=; pass out")
    if out is None:
        out = np.empty((M, N), dtype=out_dt)
    if M == 0 or N == 0:
        return out
    a_stored, lda = _pitched(A if spec.a_layout == "row" else A.T)
    b_stored, ldb = _pitched(B if spec.b_layout == "row" else B.T)
    c_host = np.ascontiguousarray(out)
    bufs = [DeviceBuffer.from_host(a_stored, device), DeviceBuffer.from_host(b_stored, device),
            DeviceBuffer.from_host(c_host, device)]
    try:
        args = {"M": M, "N": N, "K": K, "A_ptr": bufs[0].ptr, "A_ld": lda, "B_ptr": bufs[1].ptr,
                "B_ld": ldb, "C_ptr": bufs[2].ptr, "C_ld": N, "alpha": alpha, "beta": beta}
        kernel.launch(args, {"M": M, "N": N, "K": K}, device=device)
        bufs[2].copy_to_host(c_host)
    finally:
        for b in bufs:
            b.close()
    if c_host is not out:
        out[...] = c_host
    return out


def _run_device(kernel, A, B, out, alpha, beta, in_dt, out_dt):
    from .runtime.arrays import describe_array

    spec = kernel.spec
    a = describe_array(A, name="A", dtype=in_dt, shape=None, layout=spec.a_layout, writable=False, align=ALIGN)
    b = describe_array(B, name="B", dtype=in_dt, shape=None, layout=spec.b_layout, writable=False, align=ALIGN)
    M, K = a.rows, a.cols
    if b.rows != K:
        raise LaunchError(f"A is {M} x {K} but B is {b.rows} x {b.cols}: inner dimensions differ")
    N = b.cols
    if out is None:
        if beta != 0.0:
            raise LaunchError("beta != 0 reads C from out=; pass out")
        out = _empty_like_device(A, (M, N), out_dt)
    c = describe_array(out, name="out", dtype=out_dt, shape=(M, N), layout="row", writable=True, align=None)
    if M == 0 or N == 0:
        return out
    args = {"M": M, "N": N, "K": K, "A_ptr": a.ptr, "A_ld": a.ld, "B_ptr": b.ptr, "B_ld": b.ld,
            "C_ptr": c.ptr, "C_ld": c.ld, "alpha": alpha, "beta": beta}
    kernel.launch(args, {"M": M, "N": N, "K": K}, stream=_stream_of(A))
    return out


def _empty_like_device(x, shape, dtype):
    """A new GPU array of the same library as `x` (torch or CuPy)."""
    mod = type(x).__module__.split(".")[0]
    if mod == "torch":
        import torch

        tdt = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[np.dtype(dtype).name]
        return torch.empty(shape, dtype=tdt, device=x.device)
    if mod == "cupy":
        import cupy

        return cupy.empty(shape, dtype=dtype)
    raise LaunchError(f"pass out= for GPU arrays of type {type(x).__name__}")


def _stream_of(x):
    """Launch on the array library's current stream, so tilegen orders with its work."""
    mod = type(x).__module__.split(".")[0]
    if mod == "torch":
        import torch

        return torch.cuda.current_stream(x.device).cuda_stream
    if mod == "cupy":
        import cupy

        return cupy.cuda.get_current_stream().ptr
    return None
