"""Kernel arguments and launch shapes, checked and converted without touching the GPU.

`pack_args` turns [(value, kind), ...] into the tuple-of-tuples form cuLaunchKernel takes
((v0, v1, ...), (ctype0, ctype1, ...)) (ptx.md 7.3). Each kind matches one PTX parameter
type; values are range-checked here because ctypes would silently wrap or round them.
"""
from __future__ import annotations

import ctypes
import math
import numbers

from ..arch.dtypes import F32_INF_FROM, F32_MAX
from ..errors import LaunchError

# kind -> (ctypes type, PTX .param type it feeds)
ARG_KINDS = {
    "ptr": (ctypes.c_void_p, ".u64"),
    "u32": (ctypes.c_uint32, ".u32"),
    "s32": (ctypes.c_int32, ".s32"),
    "u64": (ctypes.c_uint64, ".u64"),
    "f32": (ctypes.c_float, ".f32"),
    "f64": (ctypes.c_double, ".f64"),
    "tensormap": (ctypes.c_char * 128, ".b8[128]"),   # a CUtensorMap by value (arch/tma.py)
}

_INT_RANGE = {"u32": (0, 2**32 - 1), "s32": (-2**31, 2**31 - 1), "u64": (0, 2**64 - 1),
              "ptr": (0, 2**64 - 1)}

GRID_MAX = (2**31 - 1, 65535, 65535)
BLOCK_MAX = (1024, 1024, 64)
THREADS_MAX = 1024


def _pointer_value(value, where: str) -> int:
    """A device address from an int, a CUdeviceptr or anything with an int `.ptr`."""
    if getattr(value, "needs_copy", False):
        raise LaunchError(f"{where}: {getattr(value, 'name', 'the operand')} is a host array; "
                          f"copy it to the GPU first (DeviceBuffer.from_host)")
    if hasattr(value, "ptr") and not isinstance(value, numbers.Number):
        value = value.ptr
    if value is None or isinstance(value, (bool, float, str, bytes)):
        raise LaunchError(f"{where}: {value!r} is not a device pointer; pass an int address, "
                          f"a DeviceBuffer or an OperandView")
    try:
        return int(value)  # CUdeviceptr and numpy integers convert with int()
    except (TypeError, ValueError):
        raise LaunchError(f"{where}: {type(value).__name__} is not a device pointer; pass an "
                          f"int address, a DeviceBuffer or an OperandView") from None


def pack_arg(value, kind: str, index: int = 0):
    """(ctypes value, ctypes type) for one kernel argument; LaunchError when it does not fit."""
    where = f"kernel argument {index} ({kind})"
    if kind not in ARG_KINDS:
        raise LaunchError(f"kernel argument {index}: kind {kind!r} is not one of "
                          f"{', '.join(ARG_KINDS)}")
    ctype = ARG_KINDS[kind][0]
    if kind == "tensormap":
        if not isinstance(value, (bytes, bytearray)) or len(value) != ctypes.sizeof(ctype):
            raise LaunchError(f"{where}: expected the {ctypes.sizeof(ctype)} bytes of a tensor map, got "
                              f"{type(value).__name__}")
        return ctype.from_buffer_copy(bytes(value)), ctype
    if kind == "ptr":
        v = _pointer_value(value, where)
    elif kind in ("u32", "s32", "u64"):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise LaunchError(f"{where}: {value!r} ({type(value).__name__}) is not an integer")
        v = int(value)
    else:
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise LaunchError(f"{where}: {value!r} ({type(value).__name__}) is not a real number")
        v = float(value)
        if kind == "f32" and math.isfinite(v) and abs(v) >= F32_INF_FROM:   # (its rounding is infinite)
            raise LaunchError(f"{where}: {v!r} overflows float32 (largest {F32_MAX:.8g})")
        return ctype(v), ctype
    lo, hi = _INT_RANGE[kind]
    if not lo <= v <= hi:
        raise LaunchError(f"{where}: {v} is out of range {lo}..{hi}")
    # pointers travel as plain ints with c_void_p (cuda-bindings' special case)
    return (v if kind == "ptr" else ctype(v)), ctype


def pack_args(args) -> tuple[tuple, tuple]:
    """[(value, kind), ...] -> ((values...), (ctypes types...)) for cuLaunchKernel."""
    values, types = [], []
    for i, item in enumerate(args):
        if not (isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[1], str)):
            raise LaunchError(f"kernel argument {i}: expected a (value, kind) pair with kind one "
                              f"of {', '.join(ARG_KINDS)}; got {item!r}")
        v, t = pack_arg(item[0], item[1], i)
        values.append(v)
        types.append(t)
    return tuple(values), tuple(types)


def _dims(what: str, dims, limits) -> tuple[int, int, int]:
    if isinstance(dims, numbers.Integral) and not isinstance(dims, bool):
        dims = (dims,)
    if not isinstance(dims, (tuple, list)) or not 1 <= len(dims) <= 3:
        raise LaunchError(f"{what} must be a tuple of 1 to 3 positive ints (x, y, z); got {dims!r}")
    out = []
    for axis, n, hi in zip("xyz", tuple(dims) + (1,) * (3 - len(dims)), limits):
        if isinstance(n, bool) or not isinstance(n, numbers.Integral):
            raise LaunchError(f"{what}.{axis} = {n!r} is not an int")
        if not 1 <= int(n) <= hi:
            raise LaunchError(f"{what}.{axis} = {n} is out of range 1..{hi}")
        out.append(int(n))
    return out[0], out[1], out[2]


def check_launch_dims(grid, block) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """Normalise grid and block to 3-tuples and check them against the CUDA limits."""
    g = _dims("grid", grid, GRID_MAX)
    b = _dims("block", block, BLOCK_MAX)
    if b[0] * b[1] * b[2] > THREADS_MAX:
        raise LaunchError(f"block {b} has {b[0] * b[1] * b[2]} threads; at most {THREADS_MAX} "
                          f"threads per block")
    return g, b
