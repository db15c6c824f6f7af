"""PyTorch and CuPy GPU arrays on the hot path.

`probe(x)` reads what a launch needs of an array in a few attribute reads: its pointer,
shape, strides (in elements), element type name and GPU ordinal, or None when `x` is not a
GPU array of a library known here (the general path, runtime/arrays.py describe_array,
then checks it and says what is wrong). Each library also gives its current stream on a
device (tilegen launches there, so it orders with the library's own work and with CUDA
graph capture) and new arrays from its own stream-ordered allocator.

The libraries are imported by their users, never here: a type is recognised by the module
it comes from, and the library's module object is taken from sys.modules.
"""
from __future__ import annotations

import sys
from typing import NamedTuple, Optional


class Probe(NamedTuple):
    ptr: int
    shape: tuple
    strides: tuple     # elements
    dtype: str         # numpy / ml_dtypes name: "float16", "bfloat16", "float32", "float8_e4m3fn", ...
    device: int        # CUDA ordinal


class _Torch:
    name = "torch"

    def __init__(self, torch):
        self.torch = torch
        self.dtypes = {getattr(torch, n): n for n in ("float16", "bfloat16", "float32", "float64",
                                                      "float8_e4m3fn", "float8_e5m2") if hasattr(torch, n)}
        self.by_name = {n: t for t, n in self.dtypes.items()}
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # an int, without a Stream object
        self.stream = raw if raw is not None else (lambda d: torch.cuda.current_stream(d).cuda_stream)

    def probe(self, t) -> Optional[Probe]:
        dev = t.get_device()
        dtype = self.dtypes.get(t.dtype)
        if dev < 0 or dtype is None:
            return None
        return Probe(t.data_ptr(), tuple(t.shape), t.stride(), dtype, dev)

    def empty(self, shape, dtype: str, device: int):
        return self.torch.empty(shape, dtype=self.by_name[dtype], device=f"cuda:{device}")


class _CuPy:
    name = "cupy"

    def __init__(self, cupy):
        self.cupy = cupy

    def probe(self, x) -> Optional[Probe]:
        itemsize = x.itemsize
        strides = x.strides
        if any(s % itemsize for s in strides):
            return None
        return Probe(x.data.ptr, x.shape, tuple(s // itemsize for s in strides), x.dtype.name, x.device.id)

    def stream(self, device: int) -> int:
        return self.cupy.cuda.get_current_stream().ptr

    def empty(self, shape, dtype: str, device: int):
        with self.cupy.cuda.Device(device):
            return self.cupy.empty(shape, dtype=dtype)


_LIBS: dict = {}   # array type -> its library adapter (or None: not one we know)
_ADAPTERS = {"torch": ("Tensor", _Torch), "cupy": ("ndarray", _CuPy)}


def library(x):
    """The adapter of x's library (probe, stream, empty), or None."""
    t = type(x)
    lib = _LIBS.get(t, False)
    if lib is False:
        lib = _LIBS[t] = _adapter_for(t)
    return lib


def _adapter_for(t):
    top = t.__module__.split(".")[0]
    entry = _ADAPTERS.get(top)
    mod = sys.modules.get(top)
    if entry is None or mod is None:
        return None
    cls_name, adapter = entry
    base = getattr(mod, cls_name, None)
    if not (isinstance(base, type) and issubclass(t, base)):
        return None
    for lib in _LIBS.values():  # one adapter per library
        if isinstance(lib, adapter):
            return lib
    return adapter(mod)


def probe(x) -> Optional[Probe]:
    lib = library(x)
    return None if lib is None else lib.probe(x)


__all__ = ["Probe", "library", "probe"]
