"""Reading a DLPack capsule with ctypes: pointer, device, shape, strides, dtype.

tilegen consumes DLPack to use GPU arrays in place (PyTorch, CuPy, JAX). Only the struct
layout of dlpack.h is needed; the capsule (kept alive by the caller) owns the tensor, and
its destructor calls the producer's deleter, so nothing here frees anything.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

KDL_CPU = 1
KDL_CUDA = 2
DEVICE_NAMES = {1: "CPU", 2: "CUDA", 3: "CUDA host (pinned)", 4: "OpenCL", 7: "Vulkan",
                8: "Metal", 9: "VPI", 10: "ROCm", 11: "ROCm host", 13: "CUDA managed",
                14: "oneAPI"}

READ_ONLY_FLAG = 1  # DLPACK_FLAG_BITMASK_READ_ONLY (DLPack >= 1.0)

# (type code, bits) -> numpy dtype name (ml_dtypes for bfloat16 and fp8)
DLPACK_DTYPES = {
    (0, 8): "int8", (0, 16): "int16", (0, 32): "int32", (0, 64): "int64",
    (1, 8): "uint8", (1, 16): "uint16", (1, 32): "uint32", (1, 64): "uint64",
    (2, 16): "float16", (2, 32): "float32", (2, 64): "float64",
    (4, 16): "bfloat16", (6, 8): "bool",
    (10, 8): "float8_e4m3fn", (12, 8): "float8_e5m2",
}


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):  # capsule name "dltensor"
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):  # capsule name "dltensor_versioned"
    _fields_ = [("version", DLPackVersion), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p), ("flags", ctypes.c_uint64),
                ("dl_tensor", DLTensor)]


_get_name = ctypes.pythonapi.PyCapsule_GetName
_get_name.restype, _get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype, _get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]


@dataclass(frozen=True)
class DLPackInfo:
    ptr: int                   # data + byte_offset
    device_type: int
    device_id: int
    shape: tuple
    strides: tuple             # in elements (compact row-major when the producer gave none)
    dtype: str                 # numpy/ml_dtypes name, or "code<c>/<bits>bits" when unknown
    itemsize: int
    lanes: int
    readonly: bool


def read_capsule(capsule) -> DLPackInfo:
    """Decode a "dltensor" or "dltensor_versioned" capsule (not consumed, not renamed)."""
    name = _get_name(capsule)
    if name == b"dltensor":
        t = DLManagedTensor.from_address(_get_pointer(capsule, name)).dl_tensor
        readonly = False
    elif name == b"dltensor_versioned":
        m = DLManagedTensorVersioned.from_address(_get_pointer(capsule, name))
        if m.version.major != 1:
            raise ValueError(f"DLPack version {m.version.major}.{m.version.minor} is not supported")
        t, readonly = m.dl_tensor, bool(m.flags & READ_ONLY_FLAG)
    else:
        raise ValueError(f"not a live DLPack capsule (name {name!r}); was it used already?")
    ndim = int(t.ndim)
    shape = tuple(int(t.shape[i]) for i in range(ndim))
    if t.strides:
        strides = tuple(int(t.strides[i]) for i in range(ndim))
    else:
        strides, acc = [], 1
        for n in reversed(shape):
            strides.insert(0, acc)
            acc *= n
        strides = tuple(strides)
    code, bits, lanes = int(t.dtype.code), int(t.dtype.bits), int(t.dtype.lanes)
    return DLPackInfo(
        ptr=int(t.data or 0) + int(t.byte_offset), device_type=int(t.device.device_type),
        device_id=int(t.device.device_id), shape=shape, strides=strides,
        dtype=DLPACK_DTYPES.get((code, bits), f"code{code}/{bits}bits"),
        itemsize=max(1, bits * lanes // 8), lanes=lanes, readonly=readonly)


def export_capsule(x, stream=None):
    """x.__dlpack__(...), asking for a versioned capsule when the producer can give one."""
    kwargs = {} if stream is None else {"stream": stream}
    try:
        return x.__dlpack__(max_version=(1, 0), **kwargs)
    except TypeError:  # producers older than DLPack 1.0 take no max_version
        return x.__dlpack__(**kwargs)
