"""tilegen.matmul on stacks of matrices and on vectors, as numpy.matmul takes them (gemm/batch.py),
on the emulator: one folded product where A's matrices read as one, else one per matrix."""
import numpy as np
import pytest

import ml_dtypes
import tilegen
from bounds import gemm_bound

F16 = np.float16


def _rand(shape, seed, dtype=F16):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _check(C, A, B, bias=None, residual=None, dtype="f16"):
    """C against the float64 numpy.matmul of the same operands, bounded per element row by the
    magnitudes the sums run through (so a wrong matrix of the stack is far outside)."""
    A64, B64 = A.astype(np.float64), B.astype(np.float64)
    ref = np.matmul(A64, B64)
    scale = np.matmul(np.abs(A64), np.abs(B64))
    if bias is not None:
        ref, scale = ref + bias, scale + np.abs(bias)
    if residual is not None:
        ref, scale = ref + residual.astype(np.float64), scale + np.abs(residual.astype(np.float64))
    assert C.shape == ref.shape
    assert np.all(np.abs(C.astype(np.float64) - ref) <= gemm_bound(dtype, A.shape[-1], dtype) * (scale + 1e-30))


@pytest.mark.parametrize("a_shape, b_shape, folded", [
    ((2, 3, 20, 24), (24, 17), True),          # activations (batch, tokens, features) @ W: one product
    ((2, 3, 20, 24), (1, 24, 17), True),       # B's batch dimensions all 1
    ((2, 3, 20, 24), (3, 24, 17), False),      # a stack of B, broadcast over A's first dimension
    ((2, 1, 20, 24), (1, 3, 24, 17), False),   # both broadcast
    ((24,), (24, 17), True),                   # a row vector
    ((2, 20, 24), (24,), True),                # a column vector
    ((24,), (4, 24, 17), False),
    ((24,), (24,), True),                      # a dot product: a 0-d result, as numpy's
])
def test_stacks_and_vectors_multiply_as_numpy_matmul(a_shape, b_shape, folded):
    A, B = _rand(a_shape, 1), _rand(b_shape, 2)
    C = tilegen.matmul(A, B, device="sim")
    _check(C, A, B)
    reason = tilegen.matmul.explain(A, B).reason
    assert ("per matrix" not in reason) == folded, reason


def test_out_bias_and_residual_over_a_folded_stack():
    A, B = _rand((3, 10, 24), 3), _rand((24, 16), 4)
    bias = np.linspace(-1, 1, 16).astype(np.float32)
    residual = _rand((3, 10, 16), 5)
    out = np.full((3, 10, 16), np.nan, F16)
    C = tilegen.matmul(A, B, bias=bias, residual=residual, out=out, device="sim")
    assert C is out and not np.isnan(out).any()
    _check(out, A, B, bias=bias, residual=residual)


def test_a_bias_per_row_and_an_out_that_does_not_fold_run_per_matrix():
    A, B = _rand((3, 10, 24), 6), _rand((24, 16), 7)
    bias = np.linspace(-1, 1, 10).astype(np.float32)   # per row of each matrix
    choice = tilegen.matmul.explain(A, B, bias=bias)
    assert "bias is per row" in choice.reason and choice.spec.epilogue.bias == "row"
    _check(tilegen.matmul(A, B, bias=bias, device="sim"), A, B, bias=bias[:, None])
    out = np.full((16, 10, 3), np.nan, F16).transpose(2, 1, 0)   # (3, 10, 16), its matrices apart
    assert "out's matrices" in tilegen.matmul.explain(A, B, out=out).reason
    assert tilegen.matmul(A, B, out=out, device="sim") is out
    _check(out, A, B)


def test_empty_batches_give_empty_results_of_the_products_dtype():
    A, B = _rand((0, 20, 24), 8), _rand((24, 17), 9)
    C = tilegen.matmul(A, B, device="sim")
    assert C.shape == (0, 20, 17) and C.dtype == F16
    C = tilegen.matmul(_rand((2, 20, 24), 8, np.float32), _rand((0, 1, 24, 17), 9, np.float32), device="sim")
    assert C.shape == (0, 2, 20, 17) and C.dtype == np.float32


def test_fp8_activations_with_a_scale_per_token():
    """x (batch, tokens, features) in e4m3 against W.T, one scale per token in x's shape."""
    x = _rand((2, 9, 64), 10, ml_dtypes.float8_e4m3fn)
    W = _rand((40, 64), 11, ml_dtypes.float8_e4m3fn)
    sa = np.random.default_rng(12).uniform(0.5, 2, (2, 9)).astype(np.float32)
    C = tilegen.matmul(x, W.T, scale_a=sa, out_dtype="f32", device="sim")
    want = np.matmul(x.astype(np.float64), W.T.astype(np.float64)) * sa[..., None]
    assert C.shape == (2, 9, 40) and np.max(np.abs(C - want)) <= 1e-5 * np.max(np.abs(want))
    with pytest.raises(tilegen.LaunchError, match="scale_a has 9 elements.*whole stack \\(18\\)"):
        tilegen.matmul(x, W.T, scale_a=sa[0], device="sim")


@pytest.mark.parametrize("a, b, kw, message", [
    ((2, 3, 20, 24), (5, 24), {}, "inner dimensions differ"),
    ((2, 3, 20, 24), (4, 24, 17), {}, "do not broadcast"),
    ((2, 20, 24), (24, 17), dict(out=np.empty((2, 17, 20), F16)), "out has shape \\(2, 17, 20\\).*\\(2, 20, 17\\)"),
    ((2, 20, 24), (24, 17), dict(residual=np.empty((20, 17), F16)), "residual has shape"),
])
def test_stacks_that_do_not_fit_are_explained(a, b, kw, message):
    with pytest.raises(tilegen.LaunchError, match=message):
        tilegen.matmul(_rand(a, 1), _rand(b, 2), device="sim", **kw)


def test_a_scalar_is_refused_as_numpy_does():
    with pytest.raises(tilegen.LaunchError, match="0-d array"):
        tilegen.matmul(np.float16(2.0), _rand((4, 4), 1), device="sim")


def test_the_fast_paths_fold_reads_strides_as_reshape_does():
    """folded_probe (PyTorch / CuPy arrays) folds exactly when reshape(-1, K) would be a view."""
    from tilegen.gemm.batch import folded_probe

    for shape, order in [((2, 3, 5, 8), None), ((2, 5, 8), (1, 0, 2)), ((1, 5, 8), None), ((4, 1, 8), None),
                         ((3, 5, 8), (0, 2, 1)), ((2, 5, 8), "sliced")]:
        x = np.zeros(shape, np.float32)
        if order == "sliced":
            x = np.zeros((2, 7, 8), np.float32)[:, 1:6]
        elif order is not None:
            x = np.zeros(tuple(shape[i] for i in np.argsort(order)), np.float32).transpose(order)
        strides = tuple(s // 4 for s in x.strides)
        p = folded_probe((1000, x.shape, strides, "float32", 0))
        view = x.reshape(-1, x.shape[-1])
        is_view = np.shares_memory(view, x)
        assert (p is not None) == is_view, (shape, order)
        if p is not None:
            assert p[1] == view.shape and (view.shape[0] == 1 or p[2] == tuple(s // 4 for s in view.strides))
