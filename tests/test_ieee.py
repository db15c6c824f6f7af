"""IEEE specials on the emulator: NaN and +-inf propagate through every path (mma.sync,
wgmma, 3xTF32, fp8, every epilogue) exactly as in an f32-accumulating GEMM (tests/ieee.py)."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tilegen
from ieee import check, epilogue_operands, operands

# small kernels, so the emulator runs each draw quickly
KERNELS = [
    dict(dtype="f16", tile=(32, 32, 32), warps=(1, 1)),
    dict(dtype="bf16", tile=(32, 32, 32), warps=(1, 1), out_dtype="bf16", a_layout="col"),
    dict(dtype="f16", tile=(32, 32, 32), warps=(1, 1), out_dtype="f16", b_layout="col"),
    dict(dtype="tf32", tile=(32, 32, 16), warps=(1, 1)),
    dict(dtype="f32", tile=(32, 32, 16), warps=(1, 1)),                                   # 3xTF32
    dict(dtype="f32", tile=(32, 32, 16), warps=(1, 1), a_layout="col", b_layout="col"),
    dict(dtype="e5m2", tile=(32, 32, 64), warps=(1, 1)),
    dict(dtype="e4m3", tile=(32, 32, 64), warps=(1, 1), out_dtype="bf16"),
    dict(dtype="f16", instruction="wgmma", tile=(64, 32, 32), warps=(4, 1), stages=3),
    dict(dtype="tf32", instruction="wgmma", tile=(64, 32, 32), warps=(4, 1), stages=3, b_layout="col"),
    dict(dtype="f32", instruction="wgmma", tile=(64, 32, 32), warps=(4, 1), stages=3, a_layout="col"),  # tf32 parts
]
EPILOGUES = [tilegen.Epilogue(), tilegen.Epilogue(activation="relu"), tilegen.Epilogue(bias="col", activation="gelu"),
             tilegen.Epilogue(bias="row", activation="silu", residual=True),
             tilegen.Epilogue(activation="gelu_tanh", residual=True)]


def _run(kw, epilogue, M, N, K, seed, n_specials, alpha=1.0):
    spec = tilegen.GemmSpec(**kw, epilogue=epilogue)
    rng = np.random.default_rng(seed)
    A, B = operands(spec, M, N, K, rng, n_specials)
    extra = epilogue_operands(spec, M, N, rng)
    C = tilegen.compile(spec)(A, B, alpha=alpha, device="sim", **extra)
    check(spec, C, A, B, extra, alpha)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(KERNELS), st.sampled_from(EPILOGUES), st.integers(1, 40), st.integers(1, 40),
       st.integers(1, 40), st.integers(0, 2 ** 31), st.integers(0, 4))
def test_specials_propagate_as_in_an_f32_gemm(kw, epilogue, M, N, K, seed, n_specials):
    _run(kw, epilogue, M, N, K, seed, n_specials)


@pytest.mark.parametrize("kw", [KERNELS[4], KERNELS[5], KERNELS[10]], ids=["rr", "cc", "wgmma-parts"])
def test_3xtf32_keeps_infinities(kw):
    """The case that was wrong: 3xTF32 split +-inf into inf + (inf - inf) = NaN, and an
    infinite hi part met a 0 lo part of the other operand (inf * 0 = NaN)."""
    spec = tilegen.GemmSpec(**kw)
    A = np.ones((8, 8), np.float32)
    B = np.ones((8, 8), np.float32)        # exact in tf32: every lo part is 0
    A[2, 3], A[5, 1] = np.inf, -np.inf
    C = tilegen.compile(spec)(np.asfortranarray(A) if spec.a_layout == "col" else A,
                              np.asfortranarray(B) if spec.b_layout == "col" else B, device="sim")
    assert np.isposinf(C[2]).all() and np.isneginf(C[5]).all()
    assert np.isfinite(np.delete(C, [2, 5], axis=0)).all()


@pytest.mark.parametrize("kw", [dict(tile=(32, 32, 16), warps=(1, 1)),
                                dict(instruction="wgmma", tile=(64, 32, 32), warps=(4, 1), stages=3)],
                         ids=["mma.sync", "wgmma-parts"])
def test_near_the_largest_f32_3xtf32_stays_finite(kw):
    """Rounding the largest f32 to tf32 overflows; the split truncates it instead, so a product
    with a small number is finite, as in f32."""
    spec = tilegen.GemmSpec(dtype="f32", **kw)
    A = np.zeros((4, 4), np.float32)
    A[0, 0] = np.finfo(np.float32).max   # its tf32 rounding overflows
    B = np.full((4, 4), 2.0 ** -100, np.float32)
    C = tilegen.compile(spec)(A, B, device="sim")
    assert np.isfinite(C).all() and C[0, 0] == pytest.approx(float(np.finfo(np.float32).max) * 2.0 ** -100, rel=1e-6)


@pytest.mark.parametrize("kw", [dict(tile=(32, 32, 16), warps=(1, 1)),
                                dict(instruction="wgmma", tile=(64, 32, 32), warps=(4, 1), stages=3)],
                         ids=["mma.sync", "wgmma-parts"])
def test_the_largest_f32_times_one_is_itself_in_3xtf32(kw):
    """hi + lo of a value whose tf32 rounding overflows stays finite: with lo rounded up, the
    largest f32 times 1 summed to 2^128 and gave inf (numpy: the largest f32)."""
    top = np.finfo(np.float32).max
    A = np.zeros((4, 4), np.float32)
    A[0, 0], A[1, 0], A[2, 0] = top, -np.nextafter(top, np.float32(0)), np.float32(3.4025e38)
    B = np.zeros((4, 4), np.float32)
    B[0, :] = 1.0
    C = tilegen.compile(tilegen.GemmSpec(dtype="f32", **kw))(A, B, device="sim")
    assert np.isfinite(C).all()
    np.testing.assert_allclose(C[:3, 0], A[:3, 0], rtol=2.0 ** -21)


def test_relu_keeps_nan():
    spec = tilegen.GemmSpec(dtype="f16", tile=(32, 32, 32), warps=(1, 1), epilogue=tilegen.Epilogue(activation="relu"))
    A = np.ones((4, 4), np.float16)
    A[1, 1] = np.nan
    C = tilegen.compile(spec)(A, np.ones((4, 4), np.float16), device="sim")
    assert np.isnan(C[1]).all() and (C[[0, 2, 3]] == 4).all()


def test_alpha_zero_times_inf_is_nan():
    spec = tilegen.GemmSpec(dtype="bf16", tile=(32, 32, 32), warps=(1, 1))
    _run(dict(dtype="bf16", tile=(32, 32, 32), warps=(1, 1)), spec.epilogue, 9, 7, 5, seed=3, n_specials=3, alpha=0.0)


@pytest.mark.parametrize("kw", [KERNELS[0], KERNELS[4], KERNELS[8]], ids=["mma.sync", "3xtf32", "wgmma"])
def test_zeros_keep_their_signs(kw):
    """C = alpha * A @ B (beta = 0: C unread) signs its zeros as numpy does: alpha = -0.0
    flips the sign of every product, +0.0 keeps it."""
    spec = tilegen.GemmSpec(**kw)
    rng = np.random.default_rng(4)
    dt = {"f16": np.float16, "f32": np.float32}[spec.dtype]
    A, B = rng.standard_normal((9, 13)).astype(dt), rng.standard_normal((13, 7)).astype(dt)
    k = tilegen.compile(spec)
    for alpha in (0.0, -0.0):
        want = np.signbit(np.float32(alpha) * (A.astype(np.float32) @ B.astype(np.float32)))
        C = k(A, B, alpha=alpha, out=np.full((9, 7), np.nan, np.float32), device="sim")
        assert (C == 0).all() and (np.signbit(C) == want).all(), alpha
