"""PyTorch and CuPy GPU arrays on the hot path.

`probe(x)` reads what a launch needs of an array in a few attribute reads: a plain tuple
(pointer, shape, strides in elements, element type name, GPU ordinal), or None when `x` is
not a GPU array of a library known here (the general path, runtime/arrays.py
describe_array, then checks it and says what is wrong). Each library also gives its current stream on a
device (tilegen launches there, so it orders with the library's own work and with CUDA
graph capture) and new arrays from its own stream-ordered allocator.

The libraries are imported by their users, never here: a type is recognised by the module
it comes from, and the library's module object is taken from sys.modules.
"""
from __future__ import annotations

import sys
from typing import Optional

# A probe: (ptr, shape, strides in elements, dtype name as numpy / ml_dtypes spell it, such as
# "float16", "bfloat16", "float8_e4m3fn", CUDA ordinal). A plain tuple: it is made per call.
PTR, SHAPE, STRIDES, DTYPE, DEVICE = range(5)


class _Torch:
    name = "torch"

    def __init__(self, torch):
        self.torch = torch
        self.dtypes = {getattr(torch, n): n for n in ("float16", "bfloat16", "float32", "float64",
                                                      "float8_e4m3fn", "float8_e5m2") if hasattr(torch, n)}
        self.by_name = {n: t for t, n in self.dtypes.items()}
        self.devices = {}
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # an int, without a Stream object
        self.stream = raw if raw is not None else (lambda d: torch.cuda.current_stream(d).cuda_stream)

    def probe(self, t) -> Optional[tuple]:
        dev = t.get_device()
        dtype = self.dtypes.get(t.dtype)
        if dev < 0 or dtype is None:
            return None
        return t.data_ptr(), t.shape, t.stride(), dtype, dev

    def empty(self, shape, dtype: str, device: int):
        where = self.devices.get(device)
        if where is None:   # (a device object made once: parsing "cuda:N" each call costs a microsecond)
            where = self.devices[device] = self.torch.device("cuda", device)
        return self.torch.empty(shape, dtype=self.by_name[dtype], device=where)


class _CuPy:
    name = "cupy"

    def __init__(self, cupy):
        self.cupy = cupy
        self.names = {}  # numpy dtype -> its name, read once per dtype
        self.current = cupy.cuda.get_current_stream

    def probe(self, x) -> Optional[tuple]:
        itemsize = x.itemsize
        strides = x.strides
        if len(strides) == 2:
            s0, s1 = strides
            if s0 % itemsize or s1 % itemsize:
                return None
            strides = (s0 // itemsize, s1 // itemsize)
        elif any(s % itemsize for s in strides):
            return None
        else:
            strides = tuple(s // itemsize for s in strides)
        dt = x.dtype
        name = self.names.get(dt)
        if name is None:
            name = self.names[dt] = dt.name
        data = x.data
        return data.ptr, x.shape, strides, name, data.device_id

    def stream(self, device: int) -> int:
        return self.current().ptr

    def empty(self, shape, dtype: str, device: int):
        with self.cupy.cuda.Device(device):
            return self.cupy.empty(shape, dtype=dtype)


_LIBS: dict = {}   # array type -> its library adapter (or None: not one we know)
LIBRARIES = _LIBS  # (read on hot paths: LIBRARIES.get(type(x)) before library(x) fills it in)
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


def probe(x) -> Optional[tuple]:
    lib = library(x)
    return None if lib is None else lib.probe(x)


__all__ = ["library", "probe", "LIBRARIES", "PTR", "SHAPE", "STRIDES", "DTYPE", "DEVICE"]
