"""GEMM specs beyond the defaults on the GPU: tiles from 64x64 to 256x128, 4 and 8 warps,
2 to 5 stages, every swizzle and padding, both fragment-buffer counts (marker `gpu`)."""
import numpy as np
import pytest

import tilegen
from tilegen.arch.dtypes import numpy_dtype
from bounds import gemm_bound, gemm_error
from gpu_util import record, requires_gpu

pytestmark = [pytest.mark.gpu, requires_gpu]

SPECS = [
    dict(dtype="f16", tile=(64, 64, 32), warps=(2, 2), stages=2),
    dict(dtype="bf16", tile=(128, 256, 32), warps=(2, 4), stages=3),
    dict(dtype="f16", tile=(256, 128, 32), warps=(4, 2), stages=4, a_layout="col"),
    dict(dtype="bf16", tile=(128, 128, 64), warps=(2, 2), stages=5, swizzle="pad", b_layout="col"),
    dict(dtype="f16", tile=(128, 128, 64), warps=(2, 2), stages=3, swizzle="none", frag_buffers=1),
    dict(dtype="f16", tile=(128, 128, 32), warps=(2, 2), stages=4, swizzle="64B", group_m=1),
    dict(dtype="tf32", tile=(64, 64, 32), warps=(2, 2), stages=2, a_layout="col", b_layout="col"),
    dict(dtype="tf32", tile=(128, 256, 32), warps=(2, 4), stages=3, b_layout="col"),
    dict(dtype="tf32", tile=(256, 128, 16), warps=(4, 2), stages=5, swizzle="64B", frag_buffers=2),
    dict(dtype="tf32", tile=(128, 128, 32), warps=(2, 2), stages=3, swizzle="pad", a_layout="col"),
    dict(dtype="bf16", tile=(64, 128, 32), warps=(1, 2), stages=3, out_dtype="bf16", acc_dtype="f32"),
    dict(dtype="f16", tile=(128, 128, 32), warps=(2, 2), stages=3, acc_dtype="f16", out_dtype="f16"),
    dict(dtype="bf16", tile=(64, 64, 128), warps=(2, 2), stages=6, split_k=4, out_dtype="bf16"),
    dict(dtype="f16", split_k=3, b_layout="col", a_layout="col"),
]
SHAPES = [(1000, 999, 1001), (257, 130, 2049), (64, 64, 64)]


@pytest.mark.parametrize("kw", SPECS, ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()))
def test_spec_variants(kw):
    spec = tilegen.GemmSpec(target="sm_90", **kw)
    kernel = tilegen.compile(spec)
    rng = np.random.default_rng(len(str(kw)))
    worst = 0.0
    for M, N, K in SHAPES:
        A = rng.standard_normal((M, K)).astype(numpy_dtype(spec.dtype))
        B = rng.standard_normal((K, N)).astype(numpy_dtype(spec.dtype))
        out = np.full((M, N), np.nan, dtype=numpy_dtype(spec.out_dtype))
        C = kernel(A, B, out=out)
        assert not np.isnan(C.astype(np.float64)).any()
        ref = A.astype(np.float64) @ B.astype(np.float64)
        err = gemm_error(C, ref, A, B)
        bound = gemm_bound(spec.dtype, K, spec.out_dtype, spec.acc_dtype)
        worst = max(worst, err / bound)
        assert err <= bound, f"{M}x{N}x{K}: {err:.3g} over {bound:.3g}"
    record("gemm_spec_variant", spec=str(spec), shapes=len(SHAPES), worst_error_over_bound=worst)


def test_user_dsl_kernel_on_the_gpu():
    """The one-warp kernel of tests/test_dsl.py, written by hand in the DSL, on the GPU."""
    from test_dsl import one_tile
    from tilegen.runtime import DeviceBuffer

    k = tilegen.compile(one_tile)
    rng = np.random.default_rng(9)
    A = rng.integers(-3, 4, (16, 32)).astype(np.float16)
    B = rng.integers(-3, 4, (32, 16)).astype(np.float16)
    C = np.full((16, 16), np.nan, np.float32)
    bufs = [DeviceBuffer.from_host(x) for x in (A, B, C)]
    k.launch({"M": 16, "K": 32, "N": 16, "A_ptr": bufs[0].ptr, "A_ld": 32, "B_ptr": bufs[1].ptr, "B_ld": 16,
              "C_ptr": bufs[2].ptr, "C_ld": 16}, {"M": 16, "N": 16, "K": 32})
    bufs[2].copy_to_host(C)
    assert np.array_equal(C, A.astype(np.float32) @ B.astype(np.float32))
