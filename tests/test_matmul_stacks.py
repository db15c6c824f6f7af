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


FOLDED, BATCHED, EACH = "read as one", "batched kernel", "product per matrix"


@pytest.mark.parametrize("a_shape, b_shape, how", [
    ((2, 3, 20, 24), (24, 17), FOLDED),        # activations (batch, tokens, features) @ W: one product
    ((2, 3, 20, 24), (1, 24, 17), FOLDED),     # B's batch dimensions all 1
    ((2, 3, 20, 24), (2, 3, 24, 17), BATCHED), # a stack of products: one launch
    ((20, 24), (5, 24, 17), BATCHED),          # one A for every B (batch stride 0)
    ((2, 3, 20, 24), (3, 24, 17), EACH),       # B broadcast along one batch dimension only
    ((2, 1, 20, 24), (1, 3, 24, 17), EACH),    # both broadcast
    ((24,), (24, 17), "one row"),              # a row vector
    ((2, 20, 24), (24,), FOLDED),              # a column vector
    ((24,), (4, 24, 17), BATCHED),
    ((24,), (24,), "one row"),                 # a dot product: a 0-d result, as numpy's
])
def test_stacks_and_vectors_multiply_as_numpy_matmul(a_shape, b_shape, how):
    A, B = _rand(a_shape, 1), _rand(b_shape, 2)
    C = tilegen.matmul(A, B, device="sim")
    _check(C, A, B)
    reason = tilegen.matmul.explain(A, B).reason
    assert how in reason, reason
    assert type(C) is type(np.matmul(A, B))   # (a dot product: a numpy scalar, as numpy's)


@pytest.mark.parametrize("dtype, name, allow_tf32", [(F16, "f16", None), (ml_dtypes.bfloat16, "bf16", None),
                                                    (np.float32, "f32", False), (np.float32, "tf32", True)])
def test_a_batched_kernel_runs_a_stack_in_one_launch(monkeypatch, dtype, name, allow_tf32):
    """Ragged products (no size a multiple of a tile), matrices column-major, one A broadcast
    (batch stride 0), alpha, beta, bias and residual: one launch (the per-matrix path would fail)."""
    import tilegen.gemm.batch as batch

    monkeypatch.setattr(batch, "run", lambda *a, **k: pytest.fail("ran matrix by matrix"))
    A = _rand((1, 50, 33), 13, dtype).swapaxes(1, 2)          # (1, 33, 50), column-major: one A for all
    B = _rand((3, 40, 50), 14, dtype).swapaxes(1, 2)          # (3, 50, 40), each matrix column-major
    bias = np.linspace(-1, 1, 40).astype(np.float32)
    residual = _rand((3, 33, 40), 15, np.float32)
    out = _rand((3, 33, 40), 16, np.float32)
    before = out.astype(np.float64)
    spec = tilegen.matmul.explain(A, B, bias=bias, residual=residual, out=out, allow_tf32=allow_tf32).spec
    assert spec.batched and spec.dtype == name and (spec.a_layout, spec.b_layout) == ("col", "col")
    C = tilegen.matmul(A, B, bias=bias, residual=residual, out=out, alpha=0.5, beta=-2.0, allow_tf32=allow_tf32,
                       device="sim")
    assert C is out
    A64, B64 = A.astype(np.float64), B.astype(np.float64)
    ref = 0.5 * np.matmul(A64, B64) - 2.0 * before + bias + residual
    scale = 0.5 * np.matmul(np.abs(A64), np.abs(B64)) + 2.0 * np.abs(before) + np.abs(bias) + np.abs(residual)
    assert np.all(np.abs(out - ref) <= gemm_bound(name, 50) * scale)


def test_out_bias_and_residual_over_a_folded_stack():
    A, B = _rand((3, 10, 24), 3), _rand((24, 16), 4)
    bias = np.linspace(-1, 1, 16).astype(F16)
    residual = _rand((3, 10, 16), 5)
    out = np.full((3, 10, 16), np.nan, F16)
    C = tilegen.matmul(A, B, bias=bias, residual=residual, out=out, device="sim")
    assert C is out and not np.isnan(out).any()
    _check(out, A, B, bias=bias, residual=residual)


def test_a_bias_per_row_and_an_out_that_does_not_fold_take_the_batched_kernel():
    A, B = _rand((3, 10, 24), 6), _rand((24, 16), 7)
    bias = np.linspace(-1, 1, 10).astype(F16)   # per row of each matrix: a batched kernel's
    choice = tilegen.matmul.explain(A, B, bias=bias)
    assert "batched kernel" in choice.reason and choice.spec.epilogue.bias == "row"
    _check(tilegen.matmul(A, B, bias=bias, device="sim"), A, B, bias=bias[:, None])
    out = np.full((3, 12, 16), np.nan, F16)[:, :10]   # (3, 10, 16), its matrices apart
    assert "batched kernel" in tilegen.matmul.explain(A, B, out=out).reason
    assert tilegen.matmul(A, B, out=out, device="sim") is out
    _check(out, A, B)


def test_a_stacks_bias_as_numpy_broadcasts_it():
    """Over a stack of square products: an M x 1 bias is per row of each matrix (the batched
    kernel), a 1 x N one per column (the folded product)."""
    A, B = _rand((3, 16, 24), 10), _rand((24, 16), 11)
    b = np.linspace(-1, 1, 16).astype(F16)
    assert tilegen.matmul.explain(A, B, bias=b[:, None]).spec.epilogue.bias == "row"
    _check(tilegen.matmul(A, B, bias=b[:, None], device="sim"), A, B, bias=b[:, None])
    assert tilegen.matmul.explain(A, B, bias=b[None, :]).spec.epilogue.bias == "col"
    _check(tilegen.matmul(A, B, bias=b[None, :], device="sim"), A, B, bias=b[None, :])


def test_empty_batches_give_empty_results_of_the_products_dtype():
    A, B = _rand((0, 20, 24), 8), _rand((24, 17), 9)
    C = tilegen.matmul(A, B, device="sim")
    assert C.shape == (0, 20, 17) and C.dtype == F16
    C = tilegen.matmul(_rand((2, 20, 24), 8, np.float32), _rand((0, 1, 24, 17), 9, np.float32), device="sim")
    assert C.shape == (0, 2, 20, 17) and C.dtype == np.float32


@pytest.mark.parametrize("a_shape, b_shape, out_dtype", [
    ((3, 0, 9), (3, 9, 7), None), ((3, 5, 9), (3, 9, 0), None), ((0, 9), (3, 9, 7), None),
    ((0, 9), (9, 7), "f32"), ((3, 0, 9), (3, 9, 7), "f32")])
def test_an_empty_m_or_n_gives_an_empty_result(a_shape, b_shape, out_dtype):
    """numpy 2 gives every empty array strides of 0: tilegen's own empty output (and an empty out
    given) had been refused as a broadcast view whose elements overlap."""
    A, B = np.ones(a_shape, F16), np.ones(b_shape, F16)
    want = np.matmul(A, B)
    C = tilegen.matmul(A, B, out_dtype=out_dtype, device="sim")
    assert C.shape == want.shape and C.dtype == (np.float32 if out_dtype else F16)
    out = np.empty(want.shape, C.dtype)
    assert tilegen.matmul(A, B, out=out, device="sim") is out
    k = tilegen.compile(tilegen.GemmSpec(dtype="f16", batched=len(want.shape) == 3))
    if len(a_shape) == len(b_shape):
        assert k(A, B, device="sim").shape == want.shape


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


def test_fp8_stacks_with_per_tensor_number_scales_run_as_one_launch(monkeypatch):
    """Per-tensor scales the host holds only scale alpha: a stack with them takes the batched kernel,
    as without them (not one launch per matrix), and its result carries both scales."""
    import importlib

    mm = importlib.import_module("tilegen.gemm.matmul")
    x = _rand((3, 9, 64), 13, ml_dtypes.float8_e4m3fn)
    Wt = _rand((3, 40, 64), 14, ml_dtypes.float8_e4m3fn).swapaxes(1, 2)   # (a weight per matrix, K-major)
    choice = tilegen.matmul.explain(x, Wt, scale_a=0.5, scale_b=np.float32(3.0), out_dtype="f32")
    assert choice.spec.batched and "one launch of a batched kernel" in choice.reason
    monkeypatch.setattr(mm.batch, "run", lambda *a, **k: pytest.fail("run matrix by matrix"))
    C = tilegen.matmul(x, Wt, scale_a=0.5, scale_b=np.float32(3.0), alpha=2.0, out_dtype="f32", device="sim")
    want = 3.0 * np.matmul(x.astype(np.float64), Wt.astype(np.float64))
    assert C.shape == (3, 9, 40) and np.max(np.abs(C - want)) <= 1e-5 * np.max(np.abs(want))


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


def test_stacks_on_hopper_take_the_warp_specialized_kernel(monkeypatch):
    """On sm_90 a 16-bit stack takes the warp-specialized TMA kernel (template.TmaStack) with the
    largest STACK_TILES tile that still gives each SM a CTA, whatever its M and K and whether an
    operand is one matrix for all; up to 32 rows per product and K from STACK_SWAP_MIN_K the
    swapped kernel (C^T = B^T A^T, 16 or 32 rows as wgmma's n, STACK_SWAPPED); a bias per row
    takes the cp.async kernel, one grid row per matrix."""
    import importlib

    mm = importlib.import_module("tilegen.gemm.matmul")
    monkeypatch.setattr(mm, "_target", lambda: "sm_90")
    monkeypatch.setattr(mm, "_tuned", lambda *a, **k: None)

    def stack(count, M, K, N, na=None):
        return np.zeros((na or count, M, K), np.float16), np.zeros((count, K, N), np.float16)

    monkeypatch.setattr(mm, "_sm_count", lambda: 132)
    narrow = (64, 64, 64)   # (STACK_NARROW: at most 66 such blocks, half the SMs)
    for args, tile in [((16, 1024, 1024, 1024), (128, 256, 64)), ((64, 256, 128, 256), (128, 128, 64)),
                                   ((64, 128, 64, 128), (64, 128, 64)), ((4, 4096, 4096, 4096), (128, 256, 64)),
                                   ((8, 100, 64, 128), narrow), ((8, 128, 100, 128), narrow),
                                   ((8, 128, 64, 128, 1), narrow),           # M, K with B row-major, one A
                                   ((32, 1, 128, 4096), (16, 128, 128)), ((32, 16, 4096, 128), (16, 64, 64)),
                                   ((34, 16, 4096, 128), (16, 64, 64)), ((32, 16, 4096, 256), (16, 64, 64)),
                                   ((32, 32, 4096, 128), (32, 64, 64)), ((32, 33, 4096, 128), narrow),
                                   ((32, 17, 1023, 128), narrow),       # (K under STACK_SWAP_MIN_K: not swapped)
                                   ((8, 16, 64, 8192), (16, 128, 128)),   # (scores, K <= 128: STACK_SWAPPED_SHORT_K)
                                   ((32, 1, 256, 4096), (16, 128, 128)), ((32, 1, 512, 4096), (64, 128, 64)),
                                   ((32, 1, 512, 128), (16, 64, 64)),      # (few blocks, short K: STACK_SWAPPED_FEW)
                                   ((32, 16, 768, 128), (16, 64, 64)), ((32, 17, 128, 4096), (64, 128, 64)),
                                   ((8, 128, 128, 4096), (128, 128, 64))]:   # few rows, short K: products alone
                                                                             # take mma.sync or a non-persistent kernel
        choice = mm.explain(*stack(*args))
        spec = choice.spec
        assert spec.batched and spec.persistent and spec.copy == "tma" and tuple(spec.tile) == tile, choice
        assert "3-D tensor map" in choice.reason
        assert spec.swap_ab == (tile[0] <= 32) and ("C^T = B^T A^T" in choice.reason) == spec.swap_ab, choice
        assert ("the narrow tile" in choice.reason) == (tile == narrow), choice
        assert spec.stages == {narrow: 8, (16, 64, 64): 4 if args[2] < 1024 else 16, (32, 64, 64): 12,
                               (16, 128, 128): 6}.get(tile, spec.stages), choice
    A, B = stack(8, 100, 64, 128)
    spec = mm.explain(A, B, bias=np.zeros(100, np.float16)).spec   # (per row: M elements)
    assert spec.batched and not spec.persistent and spec.copy == "cp.async" and spec.epilogue.bias == "row", spec


def test_a_batched_kernel_called_on_stacks():
    """kernel(A, B) of a batched spec: stacks in, a stack out; clear refusals otherwise."""
    k = tilegen.compile(tilegen.GemmSpec(dtype="f16", batched=True, tile=(64, 64, 32)))
    A, B = _rand((3, 20, 30), 20), _rand((1, 30, 25), 21)
    C = k(A, B, device="sim")
    assert C.shape == (3, 20, 25) and C.dtype == np.float32
    _check(C, A, B, dtype="f32")
    with pytest.raises(tilegen.LaunchError, match="multiplies stacks"):
        k(A[0], B, device="sim")
    with pytest.raises(tilegen.LaunchError, match="each must hold 1 or 3"):
        k(A, _rand((2, 30, 25), 22), device="sim")
    with pytest.raises(tilegen.SpecError, match="bias per row"):
        tilegen.GemmSpec(dtype="bf16", instruction="wgmma", batched=True, copy="tma", epilogue=tilegen.Epilogue(bias="row"))


def test_what_the_review_of_stacks_found(monkeypatch):
    """An empty stack of products, a residual of the wrong shape, a batched kernel called with a
    bias or residual that does not fit, an out that overlaps itself, and stacks longer than one
    launch's grid (GRID_Y, made 2 here: 5 products in 3 launches)."""
    import tilegen.gemm.call as call

    C = tilegen.matmul(_rand((0, 3, 4), 1), _rand((0, 4, 5), 2), device="sim")
    assert C.shape == (0, 3, 5) and C.dtype == F16
    A, B = _rand((2, 3, 4), 3), _rand((2, 4, 5), 4)
    with pytest.raises(tilegen.LaunchError, match="residual has shape \\(2, 5, 3\\)"):
        tilegen.matmul(A, B, residual=_rand((2, 5, 3), 5), device="sim")
    with pytest.raises(tilegen.LaunchError, match="stride 0"):
        tilegen.matmul(A, B, out=np.broadcast_to(np.zeros((1, 3, 5), F16), (2, 3, 5)), device="sim")
    k = tilegen.compile(tilegen.GemmSpec(dtype="f16", batched=True, tile=(64, 64, 32),
                                         epilogue=tilegen.Epilogue(bias="col", residual=True)))
    bias, res = np.ones(5, np.float32), np.ones((2, 3, 5), np.float32)
    with pytest.raises(tilegen.LaunchError, match="bias has shape \\(2,\\)"):
        k(A, B, bias=np.ones(2, np.float32), residual=res, device="sim")
    with pytest.raises(tilegen.LaunchError, match="residual has shape \\(1, 3, 5\\)"):
        k(A, B, bias=bias, residual=res[:1], device="sim")
    with pytest.raises(tilegen.LaunchError, match="alpha must be a real number"):
        k(A, B, bias=bias, residual=res, alpha="x", device="sim")
    monkeypatch.setattr(call, "GRID_Y", 2)
    A5, B5 = _rand((5, 20, 24), 6), _rand((5, 24, 17), 7)
    _check(k(A5, B5, bias=bias[:1].repeat(17), residual=np.zeros((5, 20, 17), np.float32), device="sim"),
           A5, B5, bias=np.ones(17), dtype="f32")


def _bf16_stack(count, rows, cols, seed, row_major):
    """A stack of (rows x cols) bf16 matrices, stored row-major or as a column-major view."""
    bf = ml_dtypes.bfloat16
    return _rand((count, rows, cols), seed, bf) if row_major else _rand((count, cols, rows), seed, bf).swapaxes(1, 2)


def _check_epilogue_stacks(k, M, N, K, a_layout, b_layout, out_dtype, seed):
    """A batched kernel with a bias per column and a residual on three ragged products, alpha 0.5 and
    beta -1, against float64: then B broadcast (stride 0, read at matrix 0) and, with A row-major,
    A's matrices 8 rows apart more than they need."""
    A = _bf16_stack(3, M, K, seed, a_layout == "row")
    B = _bf16_stack(3, K, N, seed + 1, b_layout == "row")
    bias, res = np.linspace(-1, 1, N).astype(out_dtype), _rand((3, M, N), seed + 2, out_dtype)

    def check(A, B):
        out = _rand((3, M, N), seed + 3, out_dtype)
        before = out.astype(np.float64)
        C = k(A, B, out=out, bias=bias, residual=res, alpha=0.5, beta=-1.0, device="sim")
        A64, B64, b64, r64 = (x.astype(np.float64) for x in (A, B, bias, res))
        ref = 0.5 * np.matmul(A64, B64) - before + b64 + r64
        scale = 0.5 * np.matmul(np.abs(A64), np.abs(B64)) + np.abs(before) + np.abs(b64) + np.abs(r64)
        bound = gemm_bound("bf16", K, "f32" if out_dtype == np.float32 else "bf16")
        assert C is out and np.all(np.abs(out.astype(np.float64) - ref) <= bound * scale)

    check(A, B)
    check(A, B[1:2])
    if a_layout == "row":
        gapped = _bf16_stack(3, M + 8, K, seed + 4, True)
        gapped[:, :M] = A
        check(gapped[:, :M], B)


@pytest.mark.parametrize("a_layout, b_layout, M, K", [("row", "col", 50, 40), ("row", "row", 100, 72),
                                                    ("col", "row", 64, 64)])
def test_the_warp_specialized_kernel_runs_any_stack(a_layout, b_layout, M, K):
    """A batched spec with TMA copies (template.TmaStack) on the emulator: three products whose
    M, N and K are not multiples of the tile (blocks stop at each matrix's edge: a 50-row matrix
    in 64-row tiles, a K of 40 or 72 in 64-deep k-tiles), bias per column, residual, alpha and
    beta; then B broadcast (one matrix for the stack) and A's matrices strided apart (a view
    with gaps between them)."""
    spec = tilegen.GemmSpec(dtype="bf16", out_dtype="f32", instruction="wgmma", batched=True, copy="tma",
                            a_layout=a_layout, b_layout=b_layout, tile=(64, 128, 64), warps=(4, 1), stages=4,
                            epilogue=tilegen.Epilogue(bias="col", residual=True))
    k = tilegen.compile(spec)
    assert spec.persistent and {m.rank for m in k.tensor_maps} == {3}
    _check_epilogue_stacks(k, M, 40, K, a_layout, b_layout, np.float32, seed=30)


@pytest.mark.parametrize("a_layout, b_layout, K", [("row", "row", 300), ("col", "row", 100), ("row", "col", 64)])
def test_split_k_stacks(a_layout, b_layout, K):
    """split_k on the TMA stack kernel: each row of persistent CTAs walks every block of the stack
    over its slice of K, its f32 partial sums into a workspace matrix per slice and product
    (poisoned by the emulator's launch), and the last slice to arrive at a block's counter adds
    them in slice order into C with the epilogue (bias per column, residual, alpha, beta), in the
    same launch. K of 300 in slices of 128 (the last 44 deep), 100 (the third slice empty) and 64
    (two empty): an empty slice is walked by no CTA and not waited for. Ragged M and N; then B
    broadcast and A's matrices strided apart."""
    spec = tilegen.GemmSpec(dtype="bf16", out_dtype="bf16", instruction="wgmma", batched=True, copy="tma",
                            a_layout=a_layout, b_layout=b_layout, tile=(64, 128, 64), warps=(4, 1), stages=4,
                            split_k=3, epilogue=tilegen.Epilogue(bias="col", residual=True))
    k = tilegen.compile(spec)
    assert spec.persistent and spec.store == "direct"
    assert "atom.acq_rel.gpu.global.add.u32" in k.ptx and "bar.red.or.pred" in k.ptx
    _check_epilogue_stacks(k, 70, 136, K, a_layout, b_layout, ml_dtypes.bfloat16, seed=50)


def test_split_k_stacks_refuse_partial_sums_4_gib_apart():
    """A split-K stack's workspace holds an M x N f32 matrix per slice and product, reached by a 32-bit
    byte stride: products of 2^30 outputs or more are refused with the reason (before any memory)."""
    from tilegen.gemm.call import stack_problem

    spec = tilegen.GemmSpec(dtype="bf16", instruction="wgmma", batched=True, copy="tma", split_k=2,
                            tile=(64, 64, 64), warps=(4, 1), stages=8)
    assert stack_problem(spec, 32768, 32767, 4096, 2) is None
    assert "4 GiB" in stack_problem(spec, 32768, 32768, 4096, 2)
    assert stack_problem(spec.replace(split_k=1), 32768, 32768, 4096, 2) is None
    many = spec.replace(split_k=16)                                           # (slice * count + matrix: u32)
    assert "32-bit index" in stack_problem(many, 1, 1, 4096, 2 ** 28) and stack_problem(many, 1, 1, 4096, 2 ** 28 - 1) is None
    k = tilegen.compile(spec)   # a prepared launch is refused before any memory or launch
    with pytest.raises(tilegen.LaunchError, match="4 GiB"):
        k.launch({"BATCH": 2}, {"M": 32768, "N": 32768, "K": 4096, "BATCH": 2})
    with pytest.raises(tilegen.SpecError, match="split only on the warp-specialized TMA kernel"):
        tilegen.GemmSpec(dtype="bf16", instruction="wgmma", batched=True, split_k=2)   # (a stack's default: cp.async)


@pytest.mark.parametrize("slices", [2, 3, 5, 7, 16])
def test_a_split_stack_never_launches_more_ctas_than_sms(slices):
    """The persistent split stack's grid: a row of CTAs per slice, each row a share of the SMs, so
    the rows never exceed them (cdiv rows of 27 for 5 slices of 132 SMs made 135 CTAs, three of
    them waiting for a second wave); a row is never empty, and a stack of few blocks launches
    only those."""
    spec = tilegen.GemmSpec(dtype="bf16", instruction="wgmma", batched=True, copy="tma", split_k=slices,
                            tile=(64, 64, 64), warps=(4, 1), stages=8)
    k = tilegen.compile(spec)
    for sms in (16, 114, 132):
        x, y, z = k.grid({"M": 4096, "N": 4096, "K": 8192, "BATCH": 8}, sms)
        assert y == slices and z == 1 and x * slices <= sms and x == sms // slices
    assert k.grid({"M": 64, "N": 128, "K": 8192, "BATCH": 3}, 132) == (6, slices, 1)
    assert k.launch_grid.to_data()[0][2][0] == "share"


def test_decode_stacks_split_k_on_hopper(monkeypatch):
    """matmul on Hopper splits K for stacks whose blocks leave SMs idle and whose K is long
    (long-context decoding's scores @ values: a few rows per head, K of 16K and more): slices of at
    least STACK_SLICE_K_TILES k-tiles (half that where at most a quarter of the SMs would be busy), at most
    STACK_MAX_SLICES, no more CTAs than SMs (blocks of the narrow tile, STACK_NARROW, where so few); explain
    says so. Stacks with blocks for every SM, or K of 2048, are not split (nor 64 blocks at K = 4096). The
    swapped kernel of up to 32 rows per product splits only where its blocks keep at most a quarter of the
    SMs busy, in slices of STACK_SLICE_K_TILES k-tiles (run 225)."""
    import importlib

    mm = importlib.import_module("tilegen.gemm.matmul")
    monkeypatch.setattr(mm, "_target", lambda: "sm_90")
    monkeypatch.setattr(mm, "_tuned", lambda *a, **k: None)
    monkeypatch.setattr(mm, "_sm_count", lambda: 132)
    for (count, M, N, K), split in [((32, 1, 128, 16384), 1), ((32, 16, 128, 16384), 1), ((8, 128, 128, 65536), 4),
                                    ((4, 64, 128, 65536), 8), ((64, 1, 64, 16384), 1), ((2, 16, 128, 12800), 3),
                                    ((8, 16, 128, 16384), 4), ((8, 32, 128, 65536), 8), ((32, 16, 128, 4096), 1),
                                    ((8, 128, 128, 4096), 2), ((64, 1, 64, 2048), 1), ((32, 16, 4096, 16384), 1),
                                    ((8, 1000, 128, 16384), 1), ((4, 48, 128, 65536), 8)]:
        A, B = np.zeros((count, M, K), F16), np.zeros((count, K, N), F16)
        choice = mm.explain(A, B)
        assert choice.spec.batched and choice.spec.persistent and choice.spec.split_k == split, (count, M, N, K, choice)
        assert (f"K split in {split} slices" in choice.reason) == (split > 1), choice.reason
    monkeypatch.setattr(mm, "_target", lambda: "sm_90")
    monkeypatch.setattr(mm, "STACK_SLICE_K_TILES", 16)
    A, B = _rand((3, 5, 2200), 60), _rand((3, 2200, 72), 61)     # 6 swapped blocks, 35 k-tiles: 2 slices, on the emulator
    spec = mm.explain(A, B).spec
    assert spec.swap_ab and spec.split_k == 2
    _check(tilegen.matmul(A, B, device="sim"), A, B)
    A, B = _rand((2, 40, 1100), 62), _rand((2, 1100, 72), 63)   # (the narrow tile's split: 4 blocks, 18 k-tiles)
    spec = mm.explain(A, B).spec
    assert not spec.swap_ab and spec.split_k == 2
    _check(tilegen.matmul(A, B, device="sim"), A, B)


def test_tma_stacks_with_beta_zero_store_through_shared_memory():
    """beta = 0 takes the TMA-store epilogue: each slice of C goes out through a 3-D map of C's
    stack, so a block of a 50-row matrix writes its own 50 rows only (the rows after it belong
    to the next matrix: poisoned here, and checked)."""
    spec = tilegen.GemmSpec(dtype="f16", out_dtype="f16", instruction="wgmma", batched=True, copy="tma",
                            tile=(64, 128, 64), warps=(4, 1), stages=4)
    k = tilegen.compile(spec)
    assert k.spec.store == "tma"
    A, B = _rand((3, 50, 72), 35), _rand((3, 72, 136), 36)
    out = np.full((3, 50, 136), np.nan, F16)
    C = k(A, B, out=out, device="sim")
    A64, B64 = A.astype(np.float64), B.astype(np.float64)
    assert C is out and np.all(np.abs(out - np.matmul(A64, B64)) <= gemm_bound("f16", 72, "f16")
                               * np.matmul(np.abs(A64), np.abs(B64)) + 2.0 ** -14)


@pytest.mark.parametrize("dtype, K", [("tf32", 40), ("e4m3", 200)])
def test_tma_stacks_of_tf32_and_fp8(dtype, K):
    """The TMA stack kernel with 4-byte and fp8 operands (both K-major; fp8 promoted), ragged M, N
    and K; tf32 with B row-major (C^T = B^T A^T) is refused."""
    from tilegen.arch.dtypes import numpy_dtype

    spec = tilegen.GemmSpec(dtype=dtype, out_dtype="f32", instruction="wgmma", batched=True, copy="tma", b_layout="col",
                            tile=(64, 128, 32 if dtype == "tf32" else 128), warps=(4, 1), stages=4)
    A = _rand((3, 56, K), 40, numpy_dtype(dtype))
    B = _rand((3, 40, K), 41, numpy_dtype(dtype)).swapaxes(1, 2)
    C = tilegen.compile(spec)(A, B, device="sim")
    A64, B64 = A.astype(np.float64), B.astype(np.float64)
    scale = np.matmul(np.abs(A64), np.abs(B64))
    assert np.all(np.abs(C - np.matmul(A64, B64)) <= gemm_bound(dtype if dtype == "tf32" else "f16", K, "f32",
                                                                 truncated=True) * scale)
    with pytest.raises(tilegen.SpecError, match="batched"):
        tilegen.GemmSpec(dtype="tf32", instruction="wgmma", batched=True, copy="tma", b_layout="row")


def test_tma_stacks_refuse_an_empty_k(monkeypatch):
    """K = 0 is not a TMA stack (TMA describes no empty matrix): matmul takes the cp.async batched
    kernel, whose result is the epilogue of a zero product, as numpy's."""
    import importlib

    mm = importlib.import_module("tilegen.gemm.matmul")
    monkeypatch.setattr(mm, "_target", lambda: "sm_90")
    monkeypatch.setattr(mm, "_tuned", lambda *a, **k: None)
    A, B = np.zeros((2, 128, 0), F16), np.zeros((2, 0, 128), F16)
    assert not mm.explain(A, B).spec.persistent
    C = tilegen.matmul(A, B, bias=np.ones(128, F16), device="sim")
    assert C.shape == (2, 128, 128) and np.all(C == 1)


def test_unaligned_stacks_are_copied_once_per_distinct_matrix(monkeypatch):
    """BatchedCall's aligned copies (call._aligned_stack) from probes, with a stand-in array library:
    a stack of 77-element rows gets rows of 80 and one 2-D copy of all its rows; an operand expanded
    from one matrix (stride 0) one matrix and one copy, read at stride 0; a column-major stack its
    stored rows (its columns) re-pitched; an aligned stack stays in place."""
    import tilegen.gemm.call as call
    from tilegen.arch.dtypes import dtype

    copies = []
    monkeypatch.setattr(call, "copy_2d", lambda *a: copies.append(a))

    class Lib:
        made = []

        def empty(self, shape, dt, dev):
            self.made.append(shape)
            return 0x7000_0000 + 0x100_0000 * len(self.made)

        def probe(self, buf):
            return (buf, None, None, None, 0)

    f16, lib = dtype("f16"), Lib()

    def place(probe, row=True):
        keep = []
        placed = call._aligned_stack(lib, probe, row, f16, 0, keep)
        if placed[1] is not None:
            call._copy_stack(*placed[1], 7)
        return placed, keep

    (p, copy), keep = place((0x1000, (64, 77, 77), (77 * 77, 77, 1), "float16", 0))
    assert p[1:3] == (80, 77 * 80) and lib.made[-1] == (64 * 77 * 80,) and len(copies) == 1
    assert copies[-1][1:] == (160, 0x1000, 154, 154, 64 * 77, 7)
    (p, copy), keep = place((0x1000, (64, 77, 77), (0, 77, 1), "float16", 0))   # expanded from one matrix
    assert p[1:3] == (80, 0) and lib.made[-1] == (77 * 80,) and len(copies) == 2 and copies[-1][5] == 77
    (p, copy), keep = place((0x2002, (4, 37, 21), (777, 1, 37), "float16", 0), row=False)   # (K, N) column-major
    assert p[1:] == (40, 21 * 40, (37, 21)) and copies[-1][1:] == (80, 0x2002, 74, 74, 4 * 21, 7)
    (p, copy), keep = place((0x3000, (4, 64, 80), (64 * 80, 80, 1), "float16", 0))
    assert copy is None and not keep and p == (0x3000, 80, 64 * 80, (64, 80))


@pytest.mark.parametrize("tile, warps, split", [((16, 64, 64), (1, 4), 1), ((32, 128, 64), (1, 8), 1),
                                               ((16, 64, 64), (1, 4), 3), ((16, 128, 128), (1, 8), 1)])
def test_swapped_stacks_on_the_emulator(tile, warps, split):
    """GemmSpec(swap_ab=True): the stack kernel computes C^T = B^T A^T from shared memory (B's stage
    as wgmma's MN-major A, A's as its K-major B) and stores C transposed, through the whole epilogue
    (alpha, beta with C read, a bias per column, GELU, a residual); ragged M, N and K, two
    warpgroups each taking their own 64 columns, and split K added by the last slice."""
    spec = tilegen.GemmSpec(dtype="f16", out_dtype="f16", instruction="wgmma", batched=True, copy="tma", swap_ab=True,
                            tile=tile, warps=warps, stages=6, split_k=split,
                            epilogue=tilegen.Epilogue(bias="col", activation="gelu_tanh", residual=True))
    k = tilegen.compile(spec)
    assert k.spec.store == "direct" and "_swapped" in k.name
    count, M, N, K = 3, 13, 150, 700
    A, B = _rand((count, M, K), 70), _rand((count, K, N), 71)
    bias, R = _rand((N,), 72), _rand((count, M, N), 73)
    C0 = _rand((count, M, N), 74)
    out = C0.copy()
    C = k(A, B, out=out, alpha=0.5, beta=-0.75, bias=bias, residual=R, device="sim")
    A64, B64 = A.astype(np.float64), B.astype(np.float64)
    x = 0.5 * np.matmul(A64, B64) - 0.75 * C0.astype(np.float64) + bias.astype(np.float64)
    want = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3))) + R.astype(np.float64)
    scale = 0.5 * np.matmul(np.abs(A64), np.abs(B64)) + np.abs(x) + np.abs(want)
    assert C is out and np.all(np.abs(C - want) <= gemm_bound("f16", K, "f16") * scale + 2.0 ** -14)
    with pytest.raises(tilegen.SpecError, match="swap_ab"):
        tilegen.GemmSpec(dtype="tf32", instruction="wgmma", swap_ab=True)
    with pytest.raises(tilegen.SpecError, match="swap_ab"):
        tilegen.GemmSpec(dtype="bf16", instruction="wgmma", swap_ab=True, tile=(16, 64, 64), warps=(1, 4),
                         split_k=2, persistent=False)
