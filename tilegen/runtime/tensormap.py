"""Tensor maps for TMA on the GPU: cuTensorMapEncodeTiled through cuda.bindings (ptx.md 7.4),
filled from a kernel's declaration (arch.tma.TensorMapDecl) and one launch's pointer,
extents and pitch. The 128 bytes travel by value as the kernel parameter; the same
arguments give the same bytes, so they are cached."""
from __future__ import annotations

import ctypes
import threading

from ..arch import tma as A
from ..errors import LaunchError
from . import driver as _drv

CACHE_LIMIT = 4096            # maps kept per declaration
_by_decl: dict = {}           # TensorMapDecl -> {(ptr, rows, cols, ld[, stride, count]): bytes}
_by_id: dict = {}             # id(decl) -> (decl, its cache): found without hashing the declaration
_lock = threading.Lock()


def map_cache(decl: A.TensorMapDecl) -> dict:
    """The cache of decl's maps, {decl.names' values: bytes}."""
    entry = _by_id.get(id(decl))
    if entry is not None and entry[0] is decl:
        return entry[1]
    with _lock:
        cache = _by_decl.setdefault(decl, {})
        _by_id[id(decl)] = (decl, cache)
    return cache


def tensor_map_bytes(decl: A.TensorMapDecl, ptr: int, rows: int, cols: int, ld: int, *stack: int) -> bytes:
    """The CUtensorMap of this matrix (a stack's map: `stack` = (stride, count)) with decl's
    box and swizzle, as 128 bytes."""
    cache = map_cache(decl)
    key = (ptr, rows, cols, ld, *stack)
    got = cache.get(key)
    if got is not None:
        return got
    why = decl.problem(ptr, rows, cols, ld, *stack)
    if why is not None:
        raise LaunchError(f"{decl.tensor} cannot go through TMA: {why}")
    d = _drv.bindings()
    U64, U32 = d.cuuint64_t, d.cuuint32_t
    dims, strides, box = [cols, rows], [decl.pitch(rows, cols, ld)], [decl.box_cols, decl.box_rows]
    if decl.rank == 3:
        matrices, apart = decl.stack(rows, cols, ld, *stack)
        dims, strides, box = dims + [matrices], strides + [apart], box + [1]
    tm = _drv.check(d.cuTensorMapEncodeTiled(
        d.CUtensorMapDataType(A.DTYPE_CODE[decl.dtype]), decl.rank, ptr,
        [U64(x) for x in dims], [U64(x) for x in strides], [U32(x) for x in box], [U32(1)] * decl.rank,
        d.CUtensorMapInterleave(A.INTERLEAVE_NONE), d.CUtensorMapSwizzle(A.SWIZZLE_CODE[decl.swizzle]),
        d.CUtensorMapL2promotion(A.L2_PROMOTION_128B), d.CUtensorMapFloatOOBfill(A.OOB_FILL_ZEROS)),
        f"cuTensorMapEncodeTiled for {decl.tensor}")
    raw = ctypes.string_at(tm.getPtr(), A.TENSOR_MAP_BYTES)
    with _lock:
        if len(cache) >= CACHE_LIMIT:
            cache.clear()
        cache[key] = raw
    return raw


def fill_tensor_maps(decls, args: dict) -> dict:
    """args with each declared tensor map the caller did not give built from its tensor's
    arguments (a new dict; args itself when the kernel has none)."""
    if not decls:
        return args
    out = dict(args)
    for decl in decls:
        if decl.param in out:
            continue
        entry = _by_id.get(id(decl))    # the cache found without hashing the declaration (hot path)
        cache = entry[1] if entry is not None and entry[0] is decl else map_cache(decl)
        ptr = args[decl.ptr]
        if type(ptr) is not int:
            ptr = int(ptr.ptr if hasattr(ptr, "ptr") else ptr)
        key = (ptr, args[decl.rows], args[decl.cols], args[decl.ld]) + (
            (args[decl.batch_stride], args[decl.batches]) if decl.batch_stride else ())
        raw = cache.get(key)
        out[decl.param] = raw if raw is not None else tensor_map_bytes(decl, ptr, *(int(x) for x in key[1:]))
    return out
