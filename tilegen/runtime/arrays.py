"""User arrays -> kernel operands: what the kernel needs to know, checked with clear errors.

A kernel sees a matrix as (ptr, rows, cols, ld, layout): `rows` x `cols` is the LOGICAL
shape (A is M x K whatever its layout); layout "row" means the last dim is contiguous
(stride 1 element) and `ld` is the stride of the first dim; "col" means the first dim is
contiguous and `ld` is the stride of the last dim. ld may exceed the extent (strided views).

Accepted inputs:
- numpy arrays (host): described in place; `needs_copy` says to copy them to the GPU.
- objects exposing __cuda_array_interface__ (CuPy, Numba, PyTorch CUDA tensors): used in place.
- DLPack producers (__dlpack__ / __dlpack_device__) on CUDA (device type 2): used in place;
  on the CPU (device type 1) they become numpy arrays.
Host bf16/fp8 arrays use the ml_dtypes types (bfloat16, float8_e4m3fn, float8_e5m2).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import NamedTuple, Optional

import numpy as np

from ..arch import dtypes as arch_dtypes
from ..errors import LaunchError
from . import dlpack as _dl
from .interop import DEVICE as _DEVICE, DTYPE as _DTYPE, PTR as _PTR, SHAPE as _SHAPE, STRIDES as _STRIDES
from .interop import probe as _probe

LAYOUTS = ("row", "col")


@dataclass(frozen=True)
class OperandView:
    name: str
    ptr: int                # address of element (0, 0): device, or host when needs_copy
    rows: int               # logical shape
    cols: int
    ld: int                 # elements between consecutive rows ("row") / columns ("col")
    layout: str             # "row" | "col"
    dtype: np.dtype
    nbytes: int             # bytes from ptr to one past the last element
    needs_copy: bool        # a host array: copy `nbytes` from ptr to the GPU before launching
    device: Optional[int]   # CUDA ordinal of device arrays (None for host or unknown)
    host: Optional[np.ndarray] = field(default=None, repr=False, compare=False)
    stream: Optional[int] = None  # producer's stream from __cuda_array_interface__, if any
    keepalive: object = field(default=None, repr=False, compare=False)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def shape(self) -> tuple[int, int]:
        return self.rows, self.cols


@dataclass
class _Raw:
    """What an array says about itself, before any checking. Strides are in bytes."""
    kind: str               # "numpy" | "cuda_array_interface" | "dlpack"
    ptr: int
    shape: tuple
    strides: tuple
    dtype: object           # np.dtype, or a str when the producer's type is unknown to numpy
    itemsize: int
    readonly: bool
    device: Optional[int] = None
    host: Optional[np.ndarray] = None
    stream: Optional[int] = None
    keepalive: object = None


def _c_strides(shape, itemsize) -> tuple:
    out, acc = [], itemsize
    for n in reversed(shape):
        out.insert(0, acc)
        acc *= max(int(n), 1)
    return tuple(out)


def _from_numpy(x: np.ndarray) -> _Raw:
    return _Raw("numpy", int(x.ctypes.data), tuple(x.shape), tuple(x.strides), x.dtype,
                x.dtype.itemsize, not x.flags.writeable, host=x, keepalive=x)


def _pointer_device(ptr: int) -> Optional[int]:
    """The CUDA ordinal owning a device pointer, from the driver; None when unknown."""
    try:
        from cuda.bindings import driver as d

        r = d.cuPointerGetAttribute(d.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr)
        return int(r[1]) if int(r[0]) == 0 else None
    except Exception:  # no cuda-python, no driver, or not a CUDA pointer
        return None


def _object_device(x, ptr: int) -> Optional[int]:
    """Which GPU a device array lives on: DLPack device, .device.id/.index, or the driver."""
    try:
        kind, ordinal = x.__dlpack_device__()
        if int(kind) in (_dl.KDL_CUDA, 13):
            return int(ordinal)
    except Exception:
        pass
    dev = getattr(x, "device", None)
    for attr in ("id", "index"):  # CuPy Device.id, torch.device.index
        v = getattr(dev, attr, None)
        if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
            return int(v)
    return _pointer_device(ptr)


def _from_cai(x, cai: dict, name: str) -> _Raw:
    try:
        shape = tuple(int(n) for n in cai["shape"])
        typestr = cai["typestr"]
        ptr, readonly = cai["data"]
    except (KeyError, TypeError, ValueError):
        raise LaunchError(f"{name}: __cuda_array_interface__ lacks shape/typestr/data: "
                          f"{cai!r}") from None
    if cai.get("mask") is not None:
        raise LaunchError(f"{name} is a masked array (__cuda_array_interface__ 'mask'); "
                          f"tilegen takes plain arrays")
    try:
        dt = np.dtype(typestr)
        itemsize = dt.itemsize
    except TypeError:
        dt, itemsize = str(typestr), 0
    strides = cai.get("strides")
    strides = _c_strides(shape, itemsize) if strides is None else tuple(int(s) for s in strides)
    ptr = int(ptr or 0)
    return _Raw("cuda_array_interface", ptr, shape, strides, dt, itemsize, bool(readonly),
                device=_object_device(x, ptr), stream=cai.get("stream"), keepalive=x)


def _from_dlpack(x, name: str) -> _Raw:
    try:
        kind, ordinal = (int(v) for v in x.__dlpack_device__())
    except Exception as e:
        raise LaunchError(f"{name}: __dlpack_device__() failed: {e}") from None
    if kind == _dl.KDL_CPU:
        try:
            return _from_numpy(np.from_dlpack(x))
        except Exception as e:
            raise LaunchError(f"{name}: a CPU DLPack array numpy cannot read ({e}); "
                              f"pass a numpy array") from None
    if kind not in (_dl.KDL_CUDA, 13):
        where = _dl.DEVICE_NAMES.get(kind, f"device type {kind}")
        raise LaunchError(f"{name} lives on {where} (DLPack device type {kind}); tilegen runs on "
                          f"CUDA GPUs (device type 2) or copies host numpy arrays")
    try:
        capsule = _dl.export_capsule(x)
        info = _dl.read_capsule(capsule)
    except Exception as e:  # e.g. a tensor that requires grad refuses to export
        raise LaunchError(f"{name}: DLPack export failed: {e}") from None
    if info.lanes != 1:
        raise LaunchError(f"{name} has vector elements ({info.lanes} lanes); tilegen takes scalars")
    if info.dtype in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        dt = _ml_dtype(info.dtype)
    else:
        try:
            dt = np.dtype(info.dtype)
        except TypeError:  # a DLPack type numpy does not know: reported by name
            dt = info.dtype
    strides = tuple(s * info.itemsize for s in info.strides)
    return _Raw("dlpack", info.ptr, info.shape, strides, dt, info.itemsize, info.readonly,
                device=info.device_id, keepalive=(x, capsule))


def _ml_dtype(name: str):
    try:
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))
    except (ImportError, AttributeError):
        return name


def _from_probe(x, p: tuple) -> _Raw:
    """A PyTorch or CuPy GPU array from its adapter's probe (runtime/interop.py): what the fast
    paths read of it, its dtype named (bf16 and fp8 too, which __cuda_array_interface__ cannot
    name) without a DLPack export."""
    name = p[_DTYPE]
    dt = _ml_dtype(name) if name in _ML_DTYPES else np.dtype(name)
    isz = dt.itemsize
    return _Raw("probe", int(p[_PTR]), tuple(int(n) for n in p[_SHAPE]), tuple(int(e) * isz for e in p[_STRIDES]), dt,
                isz, False, device=p[_DEVICE], keepalive=x)


_ML_DTYPES = ("bfloat16", "float8_e4m3fn", "float8_e5m2")


def _inspect(x, name: str) -> _Raw:
    if isinstance(x, np.ndarray):
        return _from_numpy(x)
    p = _probe(x)
    if p is not None:
        return _from_probe(x, p)
    cai_error = None
    if hasattr(type(x), "__cuda_array_interface__") or hasattr(x, "__cuda_array_interface__"):
        try:
            raw = _from_cai(x, x.__cuda_array_interface__, name)
        except LaunchError:
            raise
        except Exception as e:  # e.g. torch bf16 tensors refuse it; DLPack may still work
            cai_error = e
        else:
            # typestr '|V2' (torch bf16) does not name the type; DLPack does.
            vague = not isinstance(raw.dtype, np.dtype) or raw.dtype.kind == "V"
            if not (vague and hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__")):
                return raw
    if hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__"):
        return _from_dlpack(x, name)
    if cai_error is not None:
        raise LaunchError(f"{name}: __cuda_array_interface__ failed ({cai_error}) and the "
                          f"object offers no DLPack")
    raise LaunchError(f"{name} is a {type(x).__name__}; pass a numpy array, or a GPU array "
                      f"exposing __cuda_array_interface__ or DLPack (CuPy, PyTorch, JAX)")


def _layout_of(shape, strides, itemsize) -> Optional[str]:
    """ "row" if the last dim has unit stride, "col" if the first does; extent-1 dims fit any."""
    if len(shape) != 2 or not itemsize:
        return None
    if shape[1] == 1 or strides[1] == itemsize:
        return "row"
    if shape[0] == 1 or strides[0] == itemsize:
        return "col"
    return None


def detect_layout(x) -> Optional[str]:
    """ "row", "col", or None (not 2-D, or no dimension with stride 1 element)."""
    raw = _inspect(x, "array")
    return _layout_of(raw.shape, raw.strides, raw.itemsize)


def _expected_dtype(dtype):
    """(numpy dtype, label) for a tilegen dtype name / DType, or a numpy dtype."""
    if isinstance(dtype, (str, arch_dtypes.DType)) and str(dtype) in arch_dtypes.DTYPES:
        d = arch_dtypes.dtype(str(dtype))
        npd = arch_dtypes.numpy_dtype(d)
        return npd, f"{npd.name} ({d.name})"
    npd = np.dtype(dtype)
    return npd, npd.name


def _dtype_name(dt) -> str:
    return dt.name if isinstance(dt, np.dtype) else str(dt)


def _convert_hint(name: str, raw: _Raw, want: np.dtype) -> str:
    if raw.kind != "numpy":
        return ""
    if want.name in ("float16", "float32"):
        return f"; convert with {name}.astype(np.{want.name})"
    return f"; convert with {name}.astype(ml_dtypes.{want.name})"


def describe_array(x, *, name: str, dtype, shape=None, layout: Optional[str] = None,
                   writable: bool = False, align: Optional[int] = None, device: int = 0,
                   dims: Optional[tuple[str, str]] = None, on_gpu: bool = False) -> OperandView:
    """Check `x` as a 2-D kernel operand and describe it; LaunchError says what is wrong.

    dtype     tilegen dtype name ("f16", "tf32", ...) or a numpy dtype
    shape     expected LOGICAL (rows, cols); None entries match any extent
    layout    "row" or "col" required; None accepts either (the view says which)
    writable  the kernel writes it (outputs): read-only arrays are refused
    align     bytes the base address and the leading dimension must be multiples of (e.g. 16)
    device    the GPU the kernel runs on; device arrays elsewhere are refused
    dims      names of the two dims for messages, e.g. ("M", "K")
    on_gpu    the array must be on the GPU (the other arrays of the call are): a host array is refused
    """
    if layout is not None and layout not in LAYOUTS:
        raise LaunchError(f"layout={layout!r}; allowed: 'row', 'col'")
    raw = _inspect(x, name)

    # rank and type
    if len(raw.shape) != 2:
        raise LaunchError(f"{name} must be a 2-D matrix; got a {len(raw.shape)}-D array of "
                          f"shape {tuple(raw.shape)}")
    view = _describe(raw, name, dtype, shape, layout, writable, align, device, dims)
    if on_gpu:
        _refuse_host(view, x)
    return view


def _refuse_host(view: OperandView, x) -> None:
    """A host array among GPU ones would be read at its host address by the kernel: said instead."""
    if view.needs_copy:
        raise LaunchError(f"{view.name} is a {type(x).__name__} on the host while other arrays of the call are on the "
                          f"GPU: pass every array on the GPU (PyTorch: torch.from_numpy(x).cuda()), or every one as a "
                          f"numpy array")


def _checked_dtype(raw: _Raw, name: str, dtype) -> np.dtype:
    """The numpy dtype `dtype` names, which `raw` must have (else a LaunchError)."""
    want, label = _expected_dtype(dtype)
    got = raw.dtype
    if not (isinstance(got, np.dtype) and got == want):
        hint = _convert_hint(name, raw, want)
        if isinstance(got, np.dtype) and got.kind == "V" and got.itemsize == want.itemsize:
            hint = (f"; typestr {got.str!r} does not say which {got.itemsize}-byte type it is: "
                    f"pass the array through DLPack (e.g. torch, JAX), which names it")
        raise LaunchError(f"{name} has dtype {_dtype_name(got)}; this kernel takes {label}{hint}")
    return want


def _describe(raw: _Raw, name: str, dtype, shape, layout, writable, align, device, dims,
              stack: bool = False) -> OperandView:
    """describe_array of what a 2-D array says about itself (`stack`: the matrices of a stack of
    them, whose fixes are said for the whole stack)."""
    want = _checked_dtype(raw, name, dtype)
    isz = want.itemsize

    # shape
    rows, cols = raw.shape
    if shape is not None:
        exp = tuple(shape)
        if len(exp) != 2 or any(e is not None and e != g for e, g in zip(exp, (rows, cols))):
            names = f"({dims[0]}, {dims[1]}) = " if dims else ""
            shown = tuple("any" if e is None else e for e in exp)
            raise LaunchError(f"{name} has shape ({rows}, {cols}); this kernel expects "
                              f"{names}({', '.join(map(str, shown))})")
    if rows == 0 or cols == 0:
        raise LaunchError(f"{name} is empty (shape ({rows}, {cols})); tilegen kernels need at "
                          f"least one element")

    # strides: whole elements, positive where they matter
    strides = raw.strides
    for axis, (n, s) in enumerate(zip((rows, cols), strides)):
        if n <= 1:
            continue  # a stride over an extent of 0 or 1 is never used (numpy 2 gives empty arrays stride 0)
        if s % isz:
            raise LaunchError(f"{name} has stride {s} bytes in dim {axis}, not a multiple of its "
                              f"{isz}-byte elements; make a copy with np.ascontiguousarray")
        if s < 0:
            raise LaunchError(f"{name} has a negative stride in dim {axis} (strides "
                              f"{strides} bytes, e.g. a reversed view); make a copy with "
                              f"np.ascontiguousarray({name})")
        if s == 0:
            raise LaunchError(f"{name} has stride 0 in dim {axis} (a broadcast view); make a "
                              f"real copy with np.ascontiguousarray({name})")
    elem_strides = tuple(s // isz for s in strides)

    # layout and leading dimension
    found = _layout_of((rows, cols), strides, isz)
    fits = {"row": cols == 1 or strides[1] == isz, "col": rows == 1 or strides[0] == isz}
    if found is None:
        raise LaunchError(f"{name} has no dimension with stride 1 element (strides "
                          f"{elem_strides} elements); tilegen needs a row-major or column-major "
                          f"matrix: copy it with np.ascontiguousarray({name})")
    use = layout or found
    if not fits[use]:
        if use == "row":
            fix = (f"make a row-major copy with np.ascontiguousarray({name}) (PyTorch: "
                   f"{name}.contiguous())")
        else:
            fix = (f"make a column-major copy with np.asfortranarray({name}), or, if you hold "
                   f"its transpose {name}t row-major, pass {name}t.T") if not stack else (
                   f"pass the row-major stack of its transposes {name}t (count, columns, rows) as "
                   f"{name}t.transpose(0, 2, 1) (PyTorch: {name}t.transpose(1, 2))")
        kinds = {"row": "row-major (last dim contiguous)",
                 "col": "column-major (first dim contiguous)"}
        raise LaunchError(f"{name} is {kinds[found]}, strides {elem_strides} elements; this "
                          f"kernel takes {name} {kinds[use]}: {fix}")
    if use == "row":
        ld = elem_strides[0] if rows > 1 else cols
        if ld < cols:
            raise LaunchError(f"{name}'s rows overlap (row stride {ld} < {cols} columns)")
        span = (rows - 1) * ld + cols
    else:
        ld = elem_strides[1] if cols > 1 else rows
        if ld < rows:
            raise LaunchError(f"{name}'s columns overlap (column stride {ld} < {rows} rows)")
        span = (cols - 1) * ld + rows

    # where it lives, and whether it may be written
    if raw.kind != "numpy" and raw.device is not None and raw.device != device:
        raise LaunchError(f"{name} is on GPU {raw.device}; this kernel runs on GPU {device}: "
                          f"move it there first (PyTorch: {name}.to('cuda:{device}'))")
    if writable and raw.readonly:
        raise LaunchError(f"{name} is read-only, but the kernel writes it; pass a writable array")

    # alignment of 16-byte copies
    if align:
        if raw.kind != "numpy" and raw.ptr % align:
            raise LaunchError(f"{name}'s base address 0x{raw.ptr:x} is not {align}-byte aligned; "
                              f"the kernel moves {align}-byte chunks: pass an array that starts "
                              f"on a {align}-byte boundary (e.g. a fresh allocation, not an "
                              f"offset view)")
        outer = rows if use == "row" else cols
        if outer > 1 and (ld * isz) % align:
            step = align // isz if align % isz == 0 else align
            raise LaunchError(f"{name}'s leading dimension is {ld} elements ({ld * isz} bytes), "
                              f"not a multiple of {align} bytes; the kernel moves {align}-byte "
                              f"chunks: pad it to a multiple of {step} elements (allocate wider "
                              f"and slice)")

    return OperandView(name=name, ptr=raw.ptr, rows=rows, cols=cols, ld=int(ld), layout=use,
                       dtype=want, nbytes=int(span * isz), needs_copy=raw.kind == "numpy",
                       device=None if raw.kind == "numpy" else raw.device, host=raw.host,
                       stream=raw.stream, keepalive=raw.keepalive)


class StackView(NamedTuple):
    """A stack of matrices: its first matrix (nbytes spanning the whole stack), how many, and
    the elements from one matrix's start to the next (0: every index reads the same one)."""
    matrix: OperandView
    count: int
    stride: int


def describe_stack(x, *, name: str, dtype, layout: Optional[str] = None, writable: bool = False,
                   align: Optional[int] = None, device: int = 0, on_gpu: bool = False) -> StackView:
    """Check `x` as a stack of matrices (count, rows, cols: each matrix as describe_array
    takes it) and describe it; LaunchError says what is wrong."""
    raw = _inspect(x, name)
    if len(raw.shape) != 3:
        raise LaunchError(f"{name} is a stack of matrices: pass a 3-D array (count, rows, cols), not a "
                          f"{len(raw.shape)}-D array of shape {tuple(raw.shape)}")
    count, apart = int(raw.shape[0]), int(raw.strides[0])
    if count == 0:
        raise LaunchError(f"{name} is empty (shape {tuple(raw.shape)}); tilegen kernels need at least one element")
    view = _describe(replace(raw, shape=raw.shape[1:], strides=raw.strides[1:]), name, dtype, None, layout,
                     writable, align, device, None, stack=True)
    isz = view.itemsize
    if count == 1:
        apart = view.nbytes
    if apart % isz or apart < 0:
        raise LaunchError(f"{name}'s matrices are {apart} bytes apart, not a positive multiple of its {isz}-byte "
                          f"elements; make a copy with np.ascontiguousarray({name})")
    if apart < view.nbytes and writable:
        what = "the same matrix (stride 0, a broadcast view)" if apart == 0 else "overlapping matrices"
        raise LaunchError(f"{name} holds {what}, but the kernel writes it: pass a stack of its own "
                          f"matrices (np.ascontiguousarray({name}))")
    if align and count > 1 and apart % align:
        raise LaunchError(f"{name}'s matrices are {apart} bytes apart, not a multiple of {align} bytes; the kernel "
                          f"moves {align}-byte chunks: pad each matrix (allocate a larger stack and slice)")
    view = replace(view, name=name, nbytes=(count - 1) * apart + view.nbytes)
    if on_gpu:
        _refuse_host(view, x)
    return StackView(view, count, apart // isz)


def describe_vector(x, *, name: str, dtype, writable: bool = False, device: int = 0,
                    also: tuple = (), on_gpu: bool = False) -> OperandView:
    """Check `x` as a 1-D array of contiguous elements of `dtype` (or of a dtype in `also`) and
    describe it as a one-row matrix; LaunchError says what is wrong."""
    raw = _inspect(x, name)
    if len(raw.shape) != 1:
        raise LaunchError(f"{name} is a vector: pass a 1-D array, not a {len(raw.shape)}-D array of shape "
                          f"{tuple(raw.shape)}")
    if isinstance(raw.dtype, np.dtype) and any(raw.dtype == np.dtype(d) for d in also):
        dtype = raw.dtype
    if raw.shape[0] > 1 and raw.strides[0] != raw.itemsize:
        raise LaunchError(f"{name}'s elements are {raw.strides[0]} bytes apart; the kernel reads them side by side: "
                          f"pass a contiguous vector (np.ascontiguousarray({name}), PyTorch: {name}.contiguous())")
    view = _describe(replace(raw, shape=(1, raw.shape[0]), strides=(0, raw.strides[0])), name, dtype, None, "row",
                     writable, None, device, None)
    if on_gpu:
        _refuse_host(view, x)
    return view


def describe_scalar(x, *, name: str, device: int = 0, on_gpu: bool = False) -> OperandView:
    """Check `x` as one float32 in memory (an array of one element, of any shape) and describe it;
    LaunchError says what is wrong."""
    raw = _inspect(x, name)
    if int(np.prod(raw.shape, dtype=np.int64)) != 1:
        raise LaunchError(f"{name} is one f32 in memory: pass a one-element float32 array, not one of shape "
                          f"{tuple(raw.shape)}")
    view = _describe(replace(raw, shape=(1, 1), strides=(0, 0)), name, np.float32, None, "row", False, None, device,
                     None)
    if on_gpu:
        _refuse_host(view, x)
    return view


# -- host arrays: what a call copies to the GPU (or the emulator) checks first -----------------
def check_host(x, name: str, want: np.dtype, dtype_name: str, ndim: int = 2) -> None:
    """`x` is a numpy array of `ndim` dimensions and dtype `want`, not a masked array; else a
    LaunchError saying what to pass."""
    if not isinstance(x, np.ndarray):
        raise LaunchError(f"{name} must be a {ndim}-D array (numpy, or a GPU array with __cuda_array_interface__ "
                          f"or DLPack), got {type(x).__name__}")
    if x.ndim != ndim:
        stack = " (a stack of matrices: a GemmSpec(batched=True) kernel, or tilegen.matmul, takes stacks)" \
            if ndim == 2 and x.ndim > 2 else ""
        raise LaunchError(f"{name} must be {ndim}-D, got shape {x.shape}{stack}")
    refuse_masked(x, name)
    if x.dtype != want:
        hint = ""
        if x.dtype.newbyteorder("=") == want:   # (the same type in the other byte order)
            hint = f": {name} is byte-swapped, pass " + (
                "an array in the machine's byte order" if name == "out" else f"{name}.astype({name}.dtype.newbyteorder('='))")
        elif name != "out" and x.dtype.kind in "fiu":
            hint = f": pass {name}.astype(np.{want.name})" if want.name in ("float16", "float32") else \
                f": pass {name}.astype(ml_dtypes.{want.name})"
        raise LaunchError(f"{name} has dtype {x.dtype}; this kernel takes {want} ({dtype_name}){hint}")


def refuse_masked(x, name: str) -> None:
    """A numpy masked array is refused: its mask would be ignored, every element read."""
    if isinstance(x, np.ma.MaskedArray):
        raise LaunchError(f"{name} is a numpy masked array: the kernel would read every element, masked or not; "
                          f"pass {name}.filled(0) (or {name}.data to ignore the mask)")


def check_writable(out: np.ndarray, name: str = "out") -> None:
    """A host array a kernel writes can take the result: writable, and no two of its elements
    in one place (a broadcast, stride-0 axis would have every row written over the last)."""
    if not out.flags.writeable:
        raise LaunchError(f"{name} is read-only, but the kernel writes it; pass a writable array")
    if out.size and any(stride == 0 and size > 1 for stride, size in zip(out.strides, out.shape)):
        raise LaunchError(f"{name} has strides {out.strides} for shape {out.shape}: its elements overlap (an axis of "
                          f"stride 0); pass an array whose elements are distinct")


def padded_ld(cols: int, itemsize: int, align: int) -> int:
    """The elements from one row's start to the next when rows of `cols` are padded to a multiple
    of `align` bytes (at least one such span)."""
    per = max(align // itemsize, 1) if align else 1
    return max(per, -(-cols // per) * per)


def pitched_copy(stored: np.ndarray, align: int) -> tuple[np.ndarray, int]:
    """(a copy of `stored` (..., rows, cols) with each row padded to a multiple of `align` bytes
    (at least one such span; never empty, so its address stays mapped), its ld in elements)."""
    cols = stored.shape[-1]
    ld = padded_ld(cols, stored.itemsize, align)
    buf = np.zeros(tuple(max(n, 1) for n in stored.shape[:-1]) + (ld,), dtype=stored.dtype)
    buf[tuple(slice(0, n) for n in stored.shape[:-1]) + (slice(0, cols),)] = stored
    return buf, ld
