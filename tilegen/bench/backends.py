"""Where the bench's GPU arrays come from, and who plays cuBLAS.

- torch (preferred): tensors on the GPU, cuBLAS through torch.mm (TF32 enabled for tf32
  rows), a full reference check against an f32 cuBLAS GEMM, Triton when it imports;
- cupy: arrays from CuPy, cuBLAS through cupy.matmul (CUPY_TF32=1 for tf32; no bf16);
- cuda-python: tilegen's own DeviceBuffers, tilegen only, results checked on the host.

A matrix is always allocated as its stored (contiguous) form; a column-major operand is the
transposed view of a contiguous K x M (or N x K) array, for every implementation alike.
"""
from __future__ import annotations

import contextlib
import os

import numpy as np


from .. import runtime
from ..arch.dtypes import FP8, numpy_dtype


class Unsupported(RuntimeError):
    """This backend cannot do what was asked (e.g. cuBLAS bf16 through CuPy)."""


def pick_backend(name: str = "auto", device: int = 0):
    """The first of torch, cupy, cuda-python that works (or the one named)."""
    errors = []
    order = {"auto": ("torch", "cupy", "cuda-python"), "torch": ("torch",), "cupy": ("cupy",),
             "cuda-python": ("cuda-python",)}[name]
    for n in order:
        try:
            return {"torch": TorchBackend, "cupy": CupyBackend, "cuda-python": RawBackend}[n](device)
        except Exception as e:  # noqa: BLE001  (not installed, or no GPU seen by it)
            errors.append(f"{n}: {type(e).__name__}: {e}")
    raise RuntimeError("no array backend works: " + "; ".join(errors))


class TorchBackend:
    name = "torch"

    def __init__(self, device: int = 0):
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("torch.cuda.is_available() is False")
        self.torch = torch
        self.device = torch.device("cuda", device)
        torch.cuda.init()
        torch.cuda.set_device(self.device)
        self.version = torch.__version__
        self._dt = {"tf32": torch.float32, "f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
        for name, attr in (("e4m3", "float8_e4m3fn"), ("e5m2", "float8_e5m2")):
            if hasattr(torch, attr):
                self._dt[name] = getattr(torch, attr)
        self.cublas_name = "torch.mm (cuBLAS); fp8: torch._scaled_mm (cuBLASLt)"
        self._gen = torch.Generator(device=self.device)
        self._gen.manual_seed(1234)

    @property
    def stream(self):
        h = int(self.torch.cuda.current_stream(self.device).cuda_stream)
        return None if h == 0 else h

    def random(self, rows: int, cols: int, dtype: str):
        # N(0, 1) values: never zeros, exact in every input type for the reference (fp8: rounded to it)
        if dtype in FP8:
            return self.torch.randn(rows, cols, device=self.device, generator=self._gen).to(self._dt[dtype])
        return self.torch.randn(rows, cols, device=self.device, dtype=self._dt[dtype], generator=self._gen)

    def empty(self, rows: int, cols: int, dtype: str):
        return self.torch.empty(rows, cols, device=self.device, dtype=self._dt[dtype])

    def ptr(self, x) -> int:
        return int(x.data_ptr())

    def t(self, x):
        return x.t()

    def fill_nan(self, x) -> None:
        x.fill_(float("nan"))

    def synchronize(self) -> None:
        self.torch.cuda.synchronize(self.device)

    @contextlib.contextmanager
    def tf32(self, enabled: bool):
        """TF32 tensor cores for f32 matmuls on ("high") or off ("highest") inside the block."""
        torch = self.torch
        old = torch.get_float32_matmul_precision()
        try:
            torch.set_float32_matmul_precision("high" if enabled else "highest")
            restore = lambda: torch.set_float32_matmul_precision(old)  # noqa: E731
        except RuntimeError:  # a torch that insists on its newer per-backend setting
            m = torch.backends.cuda.matmul
            prev = m.fp32_precision
            m.fp32_precision = "tf32" if enabled else "ieee"
            restore = lambda: setattr(m, "fp32_precision", prev)  # noqa: E731
        try:
            yield
        finally:
            restore()

    def cublas(self, dtype: str, A, B, C):
        """A call computing C = A @ B with cuBLAS; TF32 follows the tf32() block around it. fp8:
        torch._scaled_mm (cuBLASLt) with unit per-tensor scales, into C's dtype."""
        torch = self.torch
        if dtype in FP8:
            one = torch.ones((), device=self.device)
            return lambda A=A, B=B, C=C: torch._scaled_mm(A, B, scale_a=one, scale_b=one, out_dtype=C.dtype)
        return lambda A=A, B=B, C=C: torch.mm(A, B, out=C)  # run inside tf32(dtype == "tf32")

    def cublas_out_dtype(self, dtype: str) -> str:
        return "f32" if dtype == "tf32" else "bf16" if dtype in FP8 else dtype

    def reference(self, A, B):
        """A @ B in f32 by cuBLAS with TF32 off (f16/bf16 products are exact in f32)."""
        with self.tf32(False):
            return self.torch.mm(A.float(), B.float())

    def rel_err(self, C, ref) -> float:
        d = (C.double() - ref.double()).norm()
        n = ref.double().norm()
        return float(d / n) if float(n) > 0 else float(d)

    def to_host(self, x) -> np.ndarray:
        return x.float().cpu().numpy().astype(np.float64)

    def release(self) -> None:
        self.torch.cuda.empty_cache()

    def spin(self):
        """A units -> busy-stream function (torch.cuda._sleep counts GPU cycles), or None."""
        sleep = getattr(self.torch.cuda, "_sleep", None)
        return None if sleep is None else (lambda cycles: sleep(int(cycles)))


class CupyBackend:
    name = "cupy"

    def __init__(self, device: int = 0):
        os.environ.setdefault("CUPY_TF32", "1")  # read by CuPy's cuBLAS calls on f32 arrays
        import cupy

        cupy.cuda.Device(device).use()
        cupy.cuda.runtime.getDeviceCount()
        self.cupy = cupy
        self.version = cupy.__version__
        self.cublas_name = "cupy.matmul (cuBLAS)"
        self._np = {"tf32": np.float32, "f32": np.float32, "f16": np.float16}
        self._rng = cupy.random.default_rng(1234)

    @property
    def stream(self):
        h = int(self.cupy.cuda.get_current_stream().ptr)
        return None if h == 0 else h

    def random(self, rows, cols, dtype):
        x = self._rng.standard_normal((rows, cols), dtype=np.float32)
        if dtype == "bf16":  # CuPy has no bfloat16: keep the top 16 bits of each f32
            return (x.view(np.uint32) >> 16).astype(np.uint16)
        return x.astype(self._np[dtype])

    def empty(self, rows, cols, dtype):
        if dtype == "bf16":
            return self.cupy.empty((rows, cols), dtype=np.uint16)
        return self.cupy.empty((rows, cols), dtype=self._np[dtype])

    def ptr(self, x) -> int:
        return int(x.data.ptr)

    def t(self, x):
        return x.T

    def fill_nan(self, x) -> None:
        if x.dtype == np.uint16:
            x.fill(0xFFFF)
        else:
            x.fill(np.nan)

    def synchronize(self) -> None:
        self.cupy.cuda.get_current_stream().synchronize()

    def cublas(self, dtype, A, B, C):
        if dtype == "bf16":
            raise Unsupported("CuPy has no bfloat16 GEMM")
        if dtype == "tf32" and os.environ.get("CUPY_TF32") != "1":
            raise Unsupported("CuPy computes f32 GEMMs in full f32 unless CUPY_TF32=1 is set before import")
        cupy = self.cupy
        return lambda A=A, B=B, C=C: cupy.matmul(A, B, out=C)

    def cublas_out_dtype(self, dtype):
        return "f32" if dtype == "tf32" else dtype

    def tf32(self, enabled: bool):
        return contextlib.nullcontext()  # fixed by CUPY_TF32 at import

    reference = None  # results are checked on the host (sampled rows)

    def to_host(self, x) -> np.ndarray:
        h = self.cupy.asnumpy(x)
        if h.dtype == np.uint16:
            import ml_dtypes

            h = h.view(ml_dtypes.bfloat16)
        return h.astype(np.float64)

    def release(self) -> None:
        self.cupy.get_default_memory_pool().free_all_blocks()

    def spin(self):
        return None


class DeviceMatrix:
    """A contiguous rows x cols matrix in a tilegen DeviceBuffer."""

    def __init__(self, buf, rows, cols, dtype):
        self.buf, self.rows, self.cols, self.dtype = buf, rows, cols, dtype


class RawBackend:
    name = "cuda-python"

    def __init__(self, device: int = 0):
        runtime.ensure_context(device)
        self.device = device
        self.version = None
        self.cublas_name = None
        self._rng = np.random.default_rng(1234)

    stream = None

    def _np(self, dtype):
        return numpy_dtype("f32" if dtype == "tf32" else dtype)

    def random(self, rows, cols, dtype):
        host = self._rng.standard_normal((rows, cols), dtype=np.float32).astype(self._np(dtype))
        return DeviceMatrix(runtime.DeviceBuffer.from_host(host, self.device), rows, cols, dtype)

    def empty(self, rows, cols, dtype):
        return DeviceMatrix(runtime.DeviceBuffer(rows * cols * self._np(dtype).itemsize, self.device), rows, cols, dtype)

    def ptr(self, x) -> int:
        return x.buf.ptr

    def t(self, x):
        raise Unsupported("no transposed views without torch or CuPy")

    def fill_nan(self, x) -> None:
        x.buf.fill_bytes(0xFF)  # all-ones bits are a NaN in f32, f16 and bf16

    def synchronize(self) -> None:
        runtime.synchronize(self.device)

    def cublas(self, dtype, A, B, C):
        raise Unsupported("cuBLAS needs torch or CuPy")

    def cublas_out_dtype(self, dtype):
        return "f32" if dtype == "tf32" else dtype

    def tf32(self, enabled: bool):
        return contextlib.nullcontext()

    reference = None

    def to_host(self, x) -> np.ndarray:
        h = np.empty((x.rows, x.cols), dtype=self._np(x.dtype))
        x.buf.copy_to_host(h)
        return h.astype(np.float64)

    def release(self) -> None:
        pass

    def spin(self):
        return None
