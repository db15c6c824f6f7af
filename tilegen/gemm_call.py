"""Calling a GEMM kernel: check the operands, place them on the GPU (or the emulator),
launch, return C.

Host (numpy) operands are copied into pitched buffers whose rows are padded to 16 bytes,
so any shape runs; GPU arrays (__cuda_array_interface__ or DLPack) are used in place and
must already meet the kernel's layout and alignment. The fused epilogue's operands (a
bias vector, a residual matrix) have the output's dtype."""
from __future__ import annotations

import sys

import numpy as np

from .arch.dtypes import numpy_dtype
from .errors import LaunchError

ALIGN = 16


def _is_host(x) -> bool:
    return isinstance(x, np.ndarray)


def _check_host(x, name: str, want: np.dtype, dtype_name: str, ndim: int = 2):
    if not isinstance(x, np.ndarray):
        raise LaunchError(f"{name} must be a {ndim}-D array (numpy, or a GPU array with __cuda_array_interface__ "
                          f"or DLPack), got {type(x).__name__}")
    if x.ndim != ndim:
        raise LaunchError(f"{name} must be {ndim}-D, got shape {x.shape}")
    if x.dtype != want:
        raise LaunchError(f"{name} has dtype {x.dtype}; this kernel takes {want} ({dtype_name})")


def _pitched(stored: np.ndarray) -> tuple[np.ndarray, int]:
    """A copy of `stored` with each row padded to a multiple of 16 bytes; returns (copy, ld)."""
    rows, cols = stored.shape
    per = ALIGN // stored.itemsize
    ld = max(per, -(-cols // per) * per)
    buf = np.zeros((max(rows, 1), ld), dtype=stored.dtype)  # never empty: addresses must stay mapped
    buf[:rows, :cols] = stored
    return buf, ld


def _shapes(A, B, out):
    M, K = A.shape
    K2, N = B.shape
    if K != K2:
        raise LaunchError(f"A is {M} x {K} but B is {K2} x {N}: inner dimensions differ")
    if out is not None and tuple(out.shape) != (M, N):
        raise LaunchError(f"out has shape {tuple(out.shape)}; expected ({M}, {N})")
    return M, N, K


def _check_epilogue(spec, bias, residual):
    epi = spec.epilogue
    if (bias is None) != (epi.bias is None):
        if bias is None:
            raise LaunchError(f"this kernel adds a bias per {epi.bias}: pass bias=")
        raise LaunchError("bias= needs a spec with Epilogue(bias='row' or 'col'); this kernel has no bias")
    if (residual is None) == epi.residual:
        if residual is None:
            raise LaunchError("this kernel adds a residual: pass residual=")
        raise LaunchError("residual= needs a spec with Epilogue(residual=True); this kernel has none")


def run_gemm(kernel, A, B, *, out=None, alpha=1.0, beta=0.0, bias=None, residual=None, device=None,
             repitch=False):
    spec = kernel.spec
    try:
        alpha, beta = float(alpha), float(beta)
    except (TypeError, ValueError):
        raise LaunchError(f"alpha and beta must be real numbers, got {alpha!r}, {beta!r}") from None
    _check_epilogue(spec, bias, residual)
    if device not in (None, "gpu", "cuda", "sim") and not isinstance(device, int):
        raise LaunchError(f"device={device!r}; allowed: None, 'gpu', 'sim' or a GPU index")
    host = all(x is None or _is_host(x) for x in (A, B, out, bias, residual))
    if device == "sim":
        if not host:
            raise LaunchError("device='sim' runs on numpy arrays; pass numpy arrays (or run on the GPU)")
        return _run_host(kernel, A, B, out, alpha, beta, bias, residual, _SimMemory())
    if host:
        from . import runtime

        if device is None and not runtime.gpu_available():  # no GPU: the emulator, said plainly
            print("tilegen: no GPU found; running on the CPU emulator (device='sim')", file=sys.stderr)
            return _run_host(kernel, A, B, out, alpha, beta, bias, residual, _SimMemory())
        return _run_host(kernel, A, B, out, alpha, beta, bias, residual,
                         _GpuMemory(device if isinstance(device, int) else 0))
    return _run_device(kernel, A, B, out, alpha, beta, bias, residual, repitch)


class _GpuMemory:
    """Host arrays through device buffers."""

    def __init__(self, device: int):
        self.device = device
        self.buffers = {}

    def put(self, host: np.ndarray) -> int:
        from .runtime import DeviceBuffer

        buf = DeviceBuffer.from_host(host, self.device)
        self.buffers[buf.ptr] = buf
        return buf.ptr

    def get(self, ptr: int, host: np.ndarray):
        self.buffers[ptr].copy_to_host(host)

    def launch(self, kernel, args, sizes):
        kernel.launch(args, sizes, device=self.device)

    def close(self):
        for buf in self.buffers.values():
            buf.close()


class _SimMemory:
    """Host arrays through the CPU emulator's global memory."""

    def __init__(self):
        from .sim.memory import GlobalMemory

        self.memory = GlobalMemory()

    def put(self, host: np.ndarray) -> int:
        ptr = self.memory.alloc(host.nbytes)
        self.memory.write(ptr, host)
        return ptr

    def get(self, ptr: int, host: np.ndarray):
        host[...] = self.memory.read(ptr, host.nbytes).view(host.dtype).reshape(host.shape)

    def launch(self, kernel, args, sizes):
        from .sim.runner import run_kernel

        run_kernel(kernel, args, sizes, self.memory)

    def close(self):
        pass


def _run_host(kernel, A, B, out, alpha, beta, bias, residual, memory):
    spec = kernel.spec
    in_dt, out_dt = numpy_dtype(spec.dtype), numpy_dtype(spec.out_dtype)
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
    try:
        args = {"M": M, "N": N, "K": K, "A_ptr": memory.put(a_stored), "A_ld": lda,
                "B_ptr": memory.put(b_stored), "B_ld": ldb, "C_ptr": memory.put(c_host), "C_ld": N,
                "alpha": alpha, "beta": beta}
        if bias is not None:
            length = N if spec.epilogue.bias == "col" else M
            _check_host(bias, "bias", out_dt, spec.out_dtype, ndim=1)
            if bias.shape[0] != length:
                raise LaunchError(f"bias has {bias.shape[0]} elements; a bias per {spec.epilogue.bias} needs {length}")
            args["bias_ptr"] = memory.put(np.ascontiguousarray(bias))
        if residual is not None:
            _check_host(residual, "residual", out_dt, spec.out_dtype)
            if residual.shape != (M, N):
                raise LaunchError(f"residual has shape {residual.shape}; expected ({M}, {N})")
            args["R_ptr"], args["R_ld"] = memory.put(np.ascontiguousarray(residual)), N
        memory.launch(kernel, args, {"M": M, "N": N, "K": K})
        memory.get(args["C_ptr"], c_host)
    finally:
        memory.close()
    if c_host is not out:
        out[...] = c_host
    return out


def _aligned(view, stream, keep: list):
    """(pointer, ld) of `view`, re-pitched into a fresh 16-byte aligned device buffer when its
    base or row pitch does not allow 16-byte copies."""
    esize = view.dtype.itemsize
    if view.ptr % ALIGN == 0 and (view.ld * esize) % ALIGN == 0:
        return view.ptr, view.ld
    from .runtime import DeviceBuffer
    from .runtime.memory import copy_2d

    rows, cols = (view.rows, view.cols) if view.layout == "row" else (view.cols, view.rows)
    per = ALIGN // esize
    ld = max(per, -(-cols // per) * per)
    buf = DeviceBuffer(max(rows, 1) * ld * esize)
    keep.append(buf)
    copy_2d(buf.ptr, ld * esize, view.ptr, view.ld * esize, cols * esize, rows, stream)
    return buf.ptr, ld


def _run_device(kernel, A, B, out, alpha, beta, bias, residual, repitch=False):
    from .runtime.arrays import describe_array

    spec = kernel.spec
    in_dt, out_dt = numpy_dtype(spec.dtype), numpy_dtype(spec.out_dtype)
    align = None if repitch else ALIGN
    a = describe_array(A, name="A", dtype=in_dt, shape=None, layout=spec.a_layout, writable=False, align=align)
    b = describe_array(B, name="B", dtype=in_dt, shape=None, layout=spec.b_layout, writable=False, align=align)
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
    stream = _stream_of(A)
    keep: list = []  # re-pitched copies live until the kernel has run
    a_ptr, a_ld = _aligned(a, stream, keep) if repitch else (a.ptr, a.ld)
    b_ptr, b_ld = _aligned(b, stream, keep) if repitch else (b.ptr, b.ld)
    args = {"M": M, "N": N, "K": K, "A_ptr": a_ptr, "A_ld": a_ld, "B_ptr": b_ptr, "B_ld": b_ld,
            "C_ptr": c.ptr, "C_ld": c.ld, "alpha": alpha, "beta": beta}
    if bias is not None:
        length = N if spec.epilogue.bias == "col" else M
        if tuple(getattr(bias, "shape", ())) != (length,):
            raise LaunchError(f"bias must have shape ({length},) for a bias per {spec.epilogue.bias}, "
                              f"got {tuple(getattr(bias, 'shape', ()))}")
        args["bias_ptr"] = describe_array(bias.reshape(1, length), name="bias", dtype=out_dt, shape=(1, length),
                                          layout="row").ptr
    if residual is not None:
        r = describe_array(residual, name="residual", dtype=out_dt, shape=(M, N), layout="row")
        args["R_ptr"], args["R_ld"] = r.ptr, r.ld
    kernel.launch(args, {"M": M, "N": N, "K": K}, stream=stream)
    if keep:
        from .runtime.memory import synchronize

        synchronize()  # the copies must outlive the kernel that reads them
        for buf in keep:
            buf.close()
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
