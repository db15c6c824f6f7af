"""Products of stacks of matrices and of vectors, as numpy.matmul and torch.matmul take them.

    A (..., M, K) @ B (..., K, N) -> (..., M, N)    batch dimensions broadcast
    A (K,) is one row and B (K,) one column; that dimension is dropped from the result.

matmul runs them one of two ways (`Stack.folded` says which; explain() says why):
- folded: B is one matrix (its batch dimensions are all 1) and A's matrices lie in memory as
  one taller matrix (their rows equally spaced: any C-contiguous A, such as activations of shape
  (batch, tokens, features)). Then the product is ONE GEMM of prod(batch) * M rows on views of A
  and of the result, without a copy: a linear layer runs at the speed of a plain 2-D call.
- per matrix: anything else (a batched B, A's matrices apart or column-major, a bias per row).
  One 2-D matmul per matrix of the broadcast batch, on views, each its own launch.

A bias is one vector for every matrix; a residual has the result's shape; per-row scales of A
(fp8) give one value per row of the whole stack, per-column scales of B one per column of it.
"""
from __future__ import annotations

from dataclasses import dataclass
import sys
from math import prod

import numpy as np

from ..arch.dtypes import dtype as arch_dtype
from ..arch.dtypes import numpy_dtype
from ..errors import LaunchError
from ..runtime import interop
from .call import bias_axis


def is_stack(A, B) -> bool:
    """Whether matmul(A, B) is not a plain product of two matrices."""
    return len(getattr(A, "shape", ())) != 2 or len(getattr(B, "shape", ())) != 2


@dataclass(frozen=True)
class Stack:
    batch: tuple          # the broadcast batch shape
    a_batch: tuple        # A's and B's own batch shapes (right-aligned against `batch`)
    b_batch: tuple
    M: int
    K: int
    N: int
    a_vector: bool        # A was 1-D (one row) / B was 1-D (one column)
    b_vector: bool
    folded: bool
    why: str

    @property
    def result_shape(self) -> tuple:
        return self.batch + ((self.M,) if not self.a_vector else ()) + ((self.N,) if not self.b_vector else ())

    @property
    def matrices(self) -> int:
        return prod(self.batch)


def _dims(x, name: str) -> tuple:
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise LaunchError(f"{name} is a {type(x).__name__}, not an array: pass a numpy array "
                          f"(np.asarray({name}, dtype=np.float32)) or a GPU array (PyTorch, CuPy)")
    shape = tuple(int(s) for s in x.shape)
    if not shape:
        raise LaunchError(f"{name} is a 0-d array (a scalar): matmul multiplies arrays of 1 or more dimensions, "
                          f"as numpy.matmul does (scale with alpha= instead)")
    return shape


def _strides(x) -> tuple:
    """Strides in elements (numpy and CuPy give bytes, PyTorch elements)."""
    stride = getattr(x, "stride", None)
    if callable(stride):
        return tuple(stride())
    return tuple(s // x.itemsize for s in x.strides)


def _merged(shape, strides):
    """(elements, stride of the innermost) of dimensions that read as one (each stride the span of
    the dimensions inside it; dimensions of size 1 do not count; stride None when all are 1), or
    None when they do not. On the hot path: one loop."""
    count, inner, span = 1, None, None
    for i in range(len(shape) - 1, -1, -1):
        n = shape[i]
        if n != 1:
            s = strides[i]
            if span is None:
                inner = s
            elif s != span:
                return None
            span = n * s
            count *= n
    return count, inner


def _rows_fold(shape: tuple, strides: tuple) -> bool:
    """Whether all dimensions but the last read as one, so reshape(-1, last) is a view."""
    return _merged(shape[:-1], strides[:-1]) is not None


def _folds_rows(x, vector_last: bool) -> bool:
    """Whether x reshapes to (rows, cols) as a view: all dimensions but the last read as one, or
    with vector_last (x holds a column per matrix: (..., M)) all of them."""
    shape, strides = tuple(int(s) for s in x.shape), _strides(x)
    return _rows_fold(shape + (1,), strides + (1,)) if vector_last else _rows_fold(shape, strides)


def folded_probe(p):
    """The probe (runtime/interop.py) of a stack of matrices as that of the one taller matrix its
    rows make, or None when they do not make one (or make none)."""
    ptr, shape, strides, dtype, device = p
    merged = _merged(shape[:-1], strides[:-1])
    if merged is None or not merged[0]:
        return None
    rows, pitch = merged
    return ptr, (rows, shape[-1]), (shape[-1] if pitch is None else pitch, strides[-1]), dtype, device


def flat_probe(p, count: int):
    """The probe of a stack (..., rows, cols) as (n, rows, cols) with n = 1 (one matrix for all:
    batch stride 0) or `count`, or None when its batch dimensions do not read as one."""
    ptr, shape, strides, dtype, device = p
    merged = _merged(shape[:-2], strides[:-2])
    if merged is None or merged[0] not in (1, count):
        return None
    n, stride = merged
    return ptr, (n, shape[-2], shape[-1]), (stride or 0, strides[-2], strides[-1]), dtype, device


def stack_of_products(pa, pb):
    """(batch shape, count, A's flat probe, B's) when probes of A (..., M, K) and a stack B
    (..., K, N) make a stack of products one batched launch runs (each operand's batch the
    whole batch or all 1), else None. The hot path of matmul on GPU stacks."""
    a_batch, b_batch = pa[1][:-2], pb[1][:-2]
    if a_batch == b_batch:
        batch = a_batch
    elif prod(a_batch) == 1 and len(a_batch) <= len(b_batch):
        batch = b_batch
    elif prod(b_batch) == 1 and len(b_batch) <= len(a_batch):
        batch = a_batch
    else:
        return None
    count = prod(batch)
    if count <= 1 or prod(b_batch) == 1:   # (one B: the folded product)
        return None
    fa, fb = flat_probe(pa, count), flat_probe(pb, count)
    return None if fa is None or fb is None else (tuple(batch), count, fa, fb)


def plan(A, B, *, out=None, bias=None) -> Stack:
    """How matmul multiplies these arrays (A or B not 2-D)."""
    a_shape, b_shape = _dims(A, "A"), _dims(B, "B")
    a_vector, b_vector = len(a_shape) == 1, len(b_shape) == 1
    if a_vector:
        a_shape = (1,) + a_shape
    if b_vector:
        b_shape = b_shape + (1,)
    (M, K), (K2, N) = a_shape[-2:], b_shape[-2:]
    if K != K2:
        raise LaunchError(f"A has shape {tuple(A.shape)} and B {tuple(B.shape)}: the inner dimensions differ "
                          f"({K} and {K2}); matmul takes A (..., M, K) and B (..., K, N)")
    a_batch, b_batch = a_shape[:-2], b_shape[:-2]
    try:   # (the common case, a stack against one matrix, without numpy's broadcasting machinery)
        batch = a_batch if not b_batch else b_batch if not a_batch else tuple(np.broadcast_shapes(a_batch, b_batch))
    except ValueError:
        raise LaunchError(f"A's batch dimensions {a_batch} and B's {b_batch} do not broadcast (each pair must be "
                          f"equal or one of them 1, as in numpy.matmul)") from None
    result = batch + ((M,) if not a_vector else ()) + ((N,) if not b_vector else ())
    if out is not None and tuple(int(s) for s in out.shape) != result:
        raise LaunchError(f"out has shape {tuple(out.shape)}; A {tuple(A.shape)} @ B {tuple(B.shape)} "
                          f"has shape {result}")
    if out is not None and prod(result) and any(n > 1 and s == 0 for n, s in zip(result, _strides(out))):
        raise LaunchError("out has a dimension of stride 0 (an expanded or broadcast view): its results would "
                          "overwrite each other; pass an out of its own memory")
    matrices = prod(batch)
    reason = None
    if prod(b_batch) != 1:
        reason = "B is a stack of matrices"
    elif not a_vector and not isinstance(A, np.ndarray) and not _folds_rows(A, False):   # (host arrays are copied)
        reason = "A's matrices do not lie in memory as one taller matrix"
    elif out is not None and not _folds_rows(out, b_vector):
        reason = "out's matrices do not lie in memory as one taller matrix"
    elif bias is not None and bias_axis(bias, M, N) != "col" and matrices > 1:
        reason = "the bias is per row of each matrix"
    if reason:
        why = f"{reason}: one {M} x {N} x {K} product per matrix, {matrices} launches"
    elif matrices == 1:
        what = "A is one row" if a_vector else "B is one column" if b_vector else "one matrix each"
        why = f"{what}: one {M} x {N} x {K} product"
    else:
        rows = matrices * M
        why = f"A's {matrices} matrices of {M} rows read as one {rows} x {K} matrix: one {rows} x {N} x {K} product"
    return Stack(batch, a_batch, b_batch, M, K, N, a_vector, b_vector, reason is None, why)


@dataclass(frozen=True)
class Flat:
    """A stack as one batched kernel takes it: A (1 or count, M, K), B (1 or count, K, N), out and
    the residual (count, M, N) or None; a stack of one is the same matrix for every product."""
    A: object
    B: object
    out: object
    residual: object


def _one_or_all(own: tuple, batch: tuple):
    """How many matrices an operand's batch holds for a flat batch index: 1 (all of its batch
    dimensions are 1) or all of them (its batch is the whole broadcast batch); None otherwise."""
    if prod(own) == 1:
        return 1
    return prod(batch) if (1,) * (len(batch) - len(own)) + tuple(own) == tuple(batch) else None


def _batch_folds(x, dims: int) -> bool:
    """Whether x's first `dims` dimensions read as one (reshape to (n, rows, cols) is a view)."""
    shape, strides = tuple(int(s) for s in x.shape), _strides(x)
    return _rows_fold(shape[:dims] + (1,), strides[:dims] + (1,))


def flat(stack: Stack, A, B, out=None, residual=None):
    """The stack as a batched kernel takes it (Flat), or None: an operand broadcast along some
    batch dimensions but not all, or a GPU array (or any out) whose matrices are not equally
    spaced."""
    M, K, N = stack.M, stack.K, stack.N
    na, nb = _one_or_all(stack.a_batch, stack.batch), _one_or_all(stack.b_batch, stack.batch)
    if na is None or nb is None:
        return None
    for x, dims in ((A, len(stack.a_batch)), (B, len(stack.b_batch))):
        if not isinstance(x, np.ndarray) and not _batch_folds(x, dims):
            return None
    if out is not None and not _batch_folds(out, len(stack.batch)):
        return None
    if residual is not None and tuple(int(s) for s in residual.shape) != stack.result_shape:
        raise LaunchError(f"residual has shape {tuple(residual.shape)}; it must have the result's shape "
                          f"{stack.result_shape}")
    full = (stack.matrices, M, N)
    return Flat(A.reshape(na, M, K), B.reshape(nb, K, N), None if out is None else out.reshape(full),
                None if residual is None else residual.reshape(full))


def _flat_scale(v, name: str, count: int, per: str):
    """A per-row (per-column) scale vector over the rows (columns) of the whole stack, flattened;
    per-tensor scales (numbers, one-element arrays) and None pass through."""
    if not _is_vector(v):
        return v
    size = prod(int(s) for s in v.shape)
    if size != count:
        raise LaunchError(f"{name} has {size} elements; with stacked operands a per-{per} scale has one for each "
                          f"{per} of the whole stack ({count}), in any shape (or pass one number)")
    return v.reshape(-1)


def _is_vector(v) -> bool:
    return v is not None and not isinstance(v, (int, float, np.number)) and len(getattr(v, "shape", ())) >= 1 \
        and prod(int(s) for s in v.shape) > 1


@dataclass(frozen=True)
class _Views:
    """The operands as the products take them: 2-D when folded, else stacks to index."""
    A: object
    B: object
    out: object
    residual: object
    scale_a: object
    scale_b: object


def _views(stack: Stack, A, B, out, residual, scale_a, scale_b) -> _Views:
    M, K, N = stack.M, stack.K, stack.N
    if residual is not None and tuple(int(s) for s in residual.shape) != stack.result_shape:
        raise LaunchError(f"residual has shape {tuple(residual.shape)}; it must have the result's shape "
                          f"{stack.result_shape}")
    scale_a = _flat_scale(scale_a, "scale_a", prod(stack.a_batch) * M, "row")
    scale_b = _flat_scale(scale_b, "scale_b", prod(stack.b_batch) * N, "column")
    if stack.folded:   # views (plan checked A and out fold; a residual may be copied)
        rows = stack.matrices * M
        return _Views(A.reshape(rows, K), B.reshape(K, N), None if out is None else out.reshape(rows, N),
                      None if residual is None else residual.reshape(rows, N), scale_a, scale_b)
    full = stack.batch + (M, N)
    return _Views(A.reshape(stack.a_batch + (M, K)), B.reshape(stack.b_batch + (K, N)),
                  None if out is None else out.reshape(full), None if residual is None else residual.reshape(full),
                  scale_a.reshape(stack.a_batch + (M,)) if _is_vector(scale_a) else scale_a,
                  scale_b.reshape(stack.b_batch + (N,)) if _is_vector(scale_b) else scale_b)


def _product(stack: Stack, v: _Views, idx: tuple) -> dict:
    """The 2-D arguments of the product for matrix `idx` of the batch."""
    if stack.folded:
        return dict(A=v.A, B=v.B, out=v.out, residual=v.residual, scale_a=v.scale_a, scale_b=v.scale_b)
    ia, ib = _own(idx, stack.a_batch), _own(idx, stack.b_batch)
    return dict(A=v.A[ia], B=v.B[ib], out=None if v.out is None else v.out[idx],
                residual=None if v.residual is None else v.residual[idx],
                scale_a=v.scale_a[ia] if _is_vector(v.scale_a) else v.scale_a,
                scale_b=v.scale_b[ib] if _is_vector(v.scale_b) else v.scale_b)


def _no_rows(stack: Stack, v: _Views) -> dict:
    """A product of no rows: what an empty batch's result dtype and library come from."""
    a = v.A.reshape(prod(int(s) for s in v.A.shape[:-1]), stack.K)[:0]
    return dict(A=a, B=_one_matrix(v.B, stack.K, stack.N), out=None, residual=None, scale_a=None, scale_b=None)


def first_product(stack: Stack, A, B, *, out=None, residual=None, scale_a=None, scale_b=None) -> dict:
    """The 2-D arguments of the first product matmul runs for a stack (what explain describes)."""
    v = _views(stack, A, B, out, residual, scale_a, scale_b)
    return _product(stack, v, (0,) * len(stack.batch)) if stack.folded or stack.matrices else _no_rows(stack, v)


def run(matmul2d, stack: Stack, A, B, *, out, residual, scale_a, scale_b, **options):
    """matmul over a stack (plan's Stack): folded into one product, else one per matrix."""
    v = _views(stack, A, B, out, residual, scale_a, scale_b)
    if stack.folded:
        c = matmul2d(**_product(stack, v, ()), **options)
        return c.reshape(stack.result_shape) if out is None else out
    result = v.out
    for idx in np.ndindex(*stack.batch):
        args = _product(stack, v, idx)
        if result is not None:
            args["out"] = result[idx]
        c = matmul2d(**args, **options)
        if result is None:   # the first product tells the result's dtype, library and device
            result = _empty(c, stack.batch + (stack.M, stack.N))
            result[idx] = c
    if result is None:       # an empty batch: no product runs; the dtype one would give
        rows = _no_rows(stack, v)
        spec = matmul2d.explain(rows["A"], rows["B"], bias=options.get("bias"), activation=options.get("activation"),
                                allow_tf32=options.get("allow_tf32")).spec
        result = new_array(A, stack.batch + (stack.M, stack.N), spec.out_dtype)
    return result.reshape(stack.result_shape) if out is None else out


def new_array(like, shape: tuple, dtype: str):
    """An uninitialised array of `shape` and tilegen dtype name `dtype` in like's library and device."""
    if isinstance(like, np.ndarray):
        return np.empty(shape, numpy_dtype(dtype))
    lib = interop.library(like)
    return lib.empty(shape, arch_dtype(dtype).storage, lib.probe(like)[interop.DEVICE])


def _own(idx: tuple, own_batch: tuple) -> tuple:
    """An operand's index into its own batch dimensions for index `idx` of the broadcast batch
    (dimensions right-aligned; a dimension of size 1 broadcasts)."""
    tail = idx[len(idx) - len(own_batch):]
    return tuple(0 if n == 1 else i for i, n in zip(tail, own_batch))


def _one_matrix(b3, K: int, N: int):
    """A K x N matrix of b3's dtype and library: its first, or zeros when it holds none."""
    if prod(int(s) for s in b3.shape):   # (numpy's .size is a count, PyTorch's a method)
        return b3.reshape(-1, K, N)[0]
    if isinstance(b3, np.ndarray):
        return np.zeros((K, N), b3.dtype)
    if hasattr(b3, "new_zeros"):      # PyTorch
        return b3.new_zeros((K, N))
    return _library_module(b3).zeros((K, N), b3.dtype)


def _empty(like, shape: tuple):
    """An uninitialised array of `shape` with like's dtype, library and device."""
    if isinstance(like, np.ndarray):
        return np.empty(shape, like.dtype)
    if hasattr(like, "new_empty"):    # PyTorch
        return like.new_empty(shape)
    cupy = _library_module(like)
    with cupy.cuda.Device(like.device.id):
        return cupy.empty(shape, like.dtype)


def _library_module(x):
    """x's library module (CuPy) as imported by the caller."""
    return sys.modules[type(x).__module__.split(".")[0]]
