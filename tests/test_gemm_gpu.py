"""The generated GEMM on the GPU against float64 references (marker `gpu`)."""
import numpy as np
import pytest

import tilegen
from bounds import gemm_bound, gemm_error
from gpu_util import record, requires_gpu
from seeds import seed

pytestmark = [pytest.mark.gpu, requires_gpu]

# Thresholds on ||C - ref|| / ||ref|| that the issue asks for; gemm_bound is the derived one.
REL_LIMIT = {"tf32": 2e-3, "f16": 1e-2, "bf16": 1e-2}
SHAPES = [(128, 128, 64), (256, 384, 512), (1024, 1024, 1024), (512, 2048, 4096),
          (100, 77, 33), (1, 1, 1), (129, 255, 70)]


def _inputs(dtype, M, N, K, rng):
    from tilegen.arch.dtypes import numpy_dtype

    nd = numpy_dtype(dtype)
    A = rng.standard_normal((M, K)).astype(nd)
    B = rng.standard_normal((K, N)).astype(nd)
    return A, B


def _check(C, A, B, dtype, K, alpha=1.0, beta=0.0, C0=None, out_dtype="f32"):
    ref = alpha * (A.astype(np.float64) @ B.astype(np.float64))
    if beta:
        ref += beta * C0.astype(np.float64)
    assert not np.isnan(C.astype(np.float64)).any(), "unwritten (NaN-poisoned) elements remain"
    err = gemm_error(C, ref, A * abs(alpha) if alpha else A, B)
    rel = float(np.linalg.norm(C.astype(np.float64) - ref) / max(np.linalg.norm(ref), 1e-300))
    return err, rel


@pytest.mark.parametrize("dtype", ["tf32", "f16", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_gemm_matches_float64(dtype, shape):
    M, N, K = shape
    rng = np.random.default_rng(seed(dtype, shape))
    A, B = _inputs(dtype, M, N, K, rng)
    kernel = tilegen.compile(tilegen.GemmSpec(dtype=dtype))
    out = np.full((M, N), np.nan, dtype=np.float32)  # poison: unwritten elements stay NaN
    C = kernel(A, B, out=out)
    err, rel = _check(C, A, B, dtype, K)
    bound = gemm_bound(dtype, K)
    record("gemm_correctness", dtype=dtype, M=M, N=N, K=K, err=err, bound=bound, rel=rel)
    assert err <= bound, f"error {err:.3g} over the bound {bound:.3g}"
    if M * N * K >= 1 << 18:  # tiny problems have too few terms for a meaningful relative norm
        assert rel <= REL_LIMIT[dtype], f"relative error {rel:.3g} over {REL_LIMIT[dtype]}"


@pytest.mark.parametrize("dtype", ["tf32", "f16", "bf16"])
def test_alpha_beta(dtype):
    M, N, K = 300, 200, 160
    rng = np.random.default_rng(7)
    A, B = _inputs(dtype, M, N, K, rng)
    C0 = rng.standard_normal((M, N)).astype(np.float32)
    kernel = tilegen.compile(tilegen.GemmSpec(dtype=dtype))
    C = kernel(A, B, out=C0.copy(), alpha=0.5, beta=-2.0)
    ref = 0.5 * (A.astype(np.float64) @ B.astype(np.float64)) - 2.0 * C0
    err = gemm_error(C, ref, A, B)
    record("gemm_alpha_beta", dtype=dtype, M=M, N=N, K=K, err=err)
    assert err <= gemm_bound(dtype, K)


def test_repeat_launches_are_bit_identical():
    rng = np.random.default_rng(3)
    A, B = _inputs("f16", 512, 512, 512, rng)
    kernel = tilegen.compile(tilegen.GemmSpec(dtype="f16"))
    first = kernel(A, B)
    for _ in range(20):
        assert np.array_equal(kernel(A, B), first)


def test_torch_tensors_in_place():
    torch = pytest.importorskip("torch")
    A = torch.randn(256, 192, device="cuda", dtype=torch.float16)
    B = torch.randn(192, 320, device="cuda", dtype=torch.float16)
    out = torch.full((256, 320), float("nan"), device="cuda", dtype=torch.float32)
    kernel = tilegen.compile(tilegen.GemmSpec(dtype="f16"))
    got = kernel(A, B, out=out)
    assert got is out
    ref = A.double() @ B.double()
    torch.cuda.synchronize()
    assert not torch.isnan(out).any()
    assert float((out.double() - ref).norm() / ref.norm()) < 1e-5
