"""Split-K (GemmSpec.split_k): K cut in slices, one CTA per block and slice writing f32
partial sums into a workspace, then a second kernel adding them in slice order and applying
the epilogue. On the emulator: every instruction family, ragged and empty slices, the fused
epilogue, alpha/beta, the transposed accumulator of tf32 with a row-major B."""
import numpy as np
import pytest

import tilegen
from bounds import gemm_bound, gemm_error
from tilegen.arch.dtypes import numpy_dtype
from tilegen.errors import SpecError


def _run(spec, M, N, K, alpha=1.0, beta=0.0, seed=0):
    rng = np.random.default_rng(seed)
    dt, od = numpy_dtype(spec.dtype), numpy_dtype(spec.out_dtype)
    A = rng.standard_normal((M, K)).astype(dt)
    B = rng.standard_normal((K, N)).astype(dt)
    A, B = (np.asfortranarray(x) if lay == "col" else x for x, lay in ((A, spec.a_layout), (B, spec.b_layout)))
    C0 = rng.standard_normal((M, N)).astype(od)
    kw = {"bias": rng.standard_normal(N if spec.epilogue.bias == "col" else M).astype(od)} if spec.epilogue.bias else {}
    C = tilegen.compile(spec)(A, B, out=C0.copy(), alpha=alpha, beta=beta, device="sim", **kw)
    ref = alpha * (A.astype(np.float64) @ B.astype(np.float64)) + beta * C0.astype(np.float64)
    if spec.epilogue.bias:
        ref = ref + (kw["bias"][None, :] if spec.epilogue.bias == "col" else kw["bias"][:, None])
    if spec.epilogue.activation == "relu":
        ref = np.maximum(ref, 0)
    return C, ref, A, B


@pytest.mark.parametrize("kw, shape", [
    (dict(dtype="f16", out_dtype="f16", split_k=2, target="sm_90"), (100, 130, 300)),
    (dict(dtype="bf16", out_dtype="bf16", split_k=3, target="sm_90", tile=(64, 64, 128), warps=(2, 2), stages=4),
     (1, 300, 1000)),
    (dict(dtype="f16", split_k=4, target="sm_90"), (70, 90, 100)),            # K = 100: two slices empty
    (dict(dtype="f16", out_dtype="f16", instruction="wgmma", split_k=2, persistent=False, b_layout="col"),
     (130, 260, 300)),
    (dict(dtype="tf32", instruction="wgmma", split_k=2, persistent=False), (100, 70, 200)),   # C^T accumulators
    (dict(dtype="f32", split_k=2, target="sm_90", a_layout="col"), (33, 40, 70)),            # 3xTF32
])
def test_split_k_on_the_emulator(kw, shape):
    spec = tilegen.GemmSpec(**kw)
    C, ref, A, B = _run(spec, *shape)
    assert gemm_error(C, ref, A, B) <= gemm_bound(spec.dtype, shape[2], spec.out_dtype,
                                                   truncated=spec.tf32_truncates)


def test_split_k_applies_the_epilogue_once_after_the_sum():
    spec = tilegen.GemmSpec(dtype="f16", out_dtype="f32", split_k=3, target="sm_90",
                            epilogue=tilegen.Epilogue(bias="row", activation="relu"))
    for beta in (0.0, -1.5):
        C, ref, A, B = _run(spec, 65, 70, 260, alpha=0.5, beta=beta, seed=4)
        assert gemm_error(C, ref, A, B) <= gemm_bound("f16", 260, "f32"), beta


def test_split_k_kernels():
    spec = tilegen.GemmSpec(dtype="bf16", out_dtype="bf16", split_k=3, target="sm_90")
    k = tilegen.compile(spec)
    names = [n for n, _ in k.params]
    assert "C_ptr" not in names and {"W_ptr", "W_ld", "WM"} <= set(names) and k.name.endswith("_fb2")
    assert "_splitk3_" in k.name and k.grid({"M": 300, "N": 200, "K": 64}) == (3 * 2, 3, 1)
    second = k.split_sum_kernel()
    assert second is k.split_sum_kernel() and second.name == k.name + "_sum"
    assert {"W_ptr", "C_ptr", "alpha", "beta"} <= {n for n, _ in second.params}
    # the slices are added in order, one accumulate per slice, before the one store
    ir = second.ir
    assert [line.split("+=")[1].split("[")[0].strip() for line in ir.splitlines() if "+=" in line] == ["W"] * 3


def test_split_k_spec_rules():
    with pytest.raises(SpecError, match="split_k=0"):
        tilegen.GemmSpec(dtype="f16", split_k=0)
    with pytest.raises(SpecError, match="an int in 1..16"):
        tilegen.GemmSpec(dtype="f16", split_k=17)
    with pytest.raises(SpecError, match="persistent=False"):
        tilegen.GemmSpec(dtype="f16", instruction="wgmma", persistent=True, split_k=2)
    s = tilegen.GemmSpec(dtype="f16", instruction="wgmma", split_k=2)   # persistent left to its default
    assert not s.persistent and s.copy == "tma" and s.store == "direct"
    assert tilegen.GemmSpec.from_text(s.to_text()) == s


@pytest.mark.parametrize("kw, shape", [
    (dict(dtype="e4m3", out_dtype="bf16", instruction="wgmma",
          epilogue=tilegen.Epilogue(scale_rows=True, scale_cols=True)), (130, 260, 300)),   # the TMA-store epilogue
    (dict(dtype="e4m3", out_dtype="f32", instruction="wgmma",
          epilogue=tilegen.Epilogue(scale_cols=True, bias="col", activation="relu")), (70, 100, 200)),
    (dict(dtype="f16", out_dtype="f32", target="sm_90", epilogue=tilegen.Epilogue(scale_rows=True)), (70, 90, 64)),
    (dict(dtype="e4m3", out_dtype="f32", target="sm_89", split_k=2,
          epilogue=tilegen.Epilogue(scale_rows=True, scale_cols=True)), (33, 40, 300)),   # after split-K's sum
])
def test_row_and_column_scales_on_the_emulator(kw, shape):
    """Epilogue(scale_rows=, scale_cols=): A @ B's rows times scale_a, columns times scale_b,
    before alpha, the bias and the activation, on both store paths."""
    spec = tilegen.GemmSpec(**kw)
    M, N, K = shape
    rng = np.random.default_rng(8)
    dt, od = numpy_dtype(spec.dtype), numpy_dtype(spec.out_dtype)
    A = rng.standard_normal((M, K)).astype(dt)
    B = rng.standard_normal((K, N)).astype(dt)
    B = np.asfortranarray(B) if spec.b_layout == "col" else B
    sa = rng.uniform(0.5, 2, M).astype(np.float32) if spec.epilogue.scale_rows else None
    sb = rng.uniform(0.5, 2, N).astype(np.float32) if spec.epilogue.scale_cols else None
    extra = {"bias": rng.standard_normal(N).astype(od)} if spec.epilogue.bias else {}
    C = tilegen.compile(spec)(A, B, alpha=0.5, scale_a=sa, scale_b=sb, device="sim", **extra)
    ref = 0.5 * (A.astype(np.float64) @ B.astype(np.float64))
    ref = ref * (sa[:, None] if sa is not None else 1) * (sb[None, :] if sb is not None else 1)
    if extra:
        ref = np.maximum(ref + extra["bias"][None, :], 0)
    scale = np.abs(A.astype(np.float64)) @ np.abs(B.astype(np.float64)) * 2   # the scales are at most 2
    assert np.linalg.norm(C.astype(np.float64) - ref) <= gemm_bound("f16", K, spec.out_dtype) * np.linalg.norm(scale)
    with pytest.raises(tilegen.LaunchError, match="pass scale_"):
        tilegen.compile(spec)(A, B, device="sim")
