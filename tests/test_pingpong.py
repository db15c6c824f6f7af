"""Ping-pong consumers (GemmSpec.pingpong) on the warp-specialized wgmma kernel: two consumer
warpgroups, each multiplying whole blocks of its own (alternate ones of the CTA's walk) and
storing them, so one's epilogue runs while the other's wgmmas do. A consumer starts waiting on
a block's stages only after the other has waited on all of the block before (the `turn`
mbarriers): a parity names only the last two phases of a stage. On the emulator, whose
protocol checks catch a consumer running ahead."""
import ml_dtypes
import numpy as np
import pytest

import tilegen
from bounds import gemm_bound, gemm_error
from tilegen.errors import SpecError
from tilegen.sim.errors import SimError

PP = dict(instruction="wgmma", pingpong=True, warps=(4, 1))


def _run(spec, M, N, K, seed=0, **kw):
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((M, K)).astype(np.float16)
    B = rng.standard_normal((K, N)).astype(np.float16)
    C = tilegen.compile(spec)(A, B, out=np.full((M, N), np.nan, np.float32), device="sim", **kw)
    return C, A.astype(np.float64) @ B.astype(np.float64), A, B


@pytest.mark.parametrize("shape", [(64 * 5 + 3, 256, 200), (100, 200, 300), (64, 128, 64), (448, 384, 576)])
def test_pingpong_on_the_emulator(shape):
    spec = tilegen.GemmSpec(**PP, dtype="f16", out_dtype="f32", tile=(64, 128, 64))
    k = tilegen.compile(spec)
    assert spec.threads == 3 * 128 and "_pingpong_" in k.name
    assert spec.smem_bytes() >= k.smem_bytes   # both consumers' staging buffers counted
    C, ref, A, B = _run(spec, *shape)
    assert gemm_error(C, ref, A, B) <= gemm_bound("f16", shape[2], "f32")


def test_pingpong_fused_epilogue_and_fp8():
    spec = tilegen.GemmSpec(**PP, dtype="f16", out_dtype="f32", tile=(64, 128, 64),
                            epilogue=tilegen.Epilogue(bias="col", activation="relu"))
    rng = np.random.default_rng(3)
    bias = rng.standard_normal(256).astype(np.float32)
    C, ref, A, B = _run(spec, 300, 256, 130, bias=bias)
    assert gemm_error(C, np.maximum(ref + bias[None, :], 0), A, B) <= gemm_bound("f16", 130, "f32")
    fp8 = tilegen.GemmSpec(**PP, dtype="e4m3", out_dtype="f32", tile=(64, 128, 128))
    assert fp8.promote == 2
    A8 = rng.standard_normal((200, 600)).astype(ml_dtypes.float8_e4m3fn)
    B8 = np.asfortranarray(rng.standard_normal((600, 140)).astype(ml_dtypes.float8_e4m3fn))
    ref8 = A8.astype(np.float64) @ B8.astype(np.float64)
    bound = gemm_bound("f16", 600, "f32") * np.abs(A8.astype(np.float64)) @ np.abs(B8.astype(np.float64))
    assert (np.abs(tilegen.compile(fp8)(A8, B8, device="sim") - ref8) <= bound).all()


def test_a_consumer_that_does_not_take_turns_is_caught(monkeypatch):
    """Without the turn wait, the second consumer waits on its first block's stages while the
    first consumer's are still in the ring: its parity names a phase that has not come yet, the
    wait passes, and the emulator sees the wgmma read a stage TMA is still writing."""
    from tilegen.dsl import tma as dsl_tma
    from tilegen.gemm.mainloops import wgmma as loops

    real = dsl_tma.mbarrier_wait

    def skip_turns(bar, parity):
        if bar.bar.ir.name != "turn":
            real(bar, parity)
    monkeypatch.setattr(loops.tg, "mbarrier_wait", skip_turns)
    spec = tilegen.GemmSpec(**PP, dtype="f16", out_dtype="f32", tile=(64, 128, 64), group_m=3)   # (uncached)
    with pytest.raises(SimError, match="still writing|mbarrier"):
        _run(spec, 64 * 5, 128, 64 * 6)


@pytest.mark.parametrize("kw", [dict(warps=(8, 1), tile=(128, 256, 64)), dict(cluster=(2, 1)),
                                dict(stream_k=True), dict(persistent=False), dict(pingpong=1)])
def test_pingpong_refuses_what_it_does_not_build(kw):
    with pytest.raises(SpecError, match="pingpong|warps"):
        tilegen.GemmSpec(**{**PP, "dtype": "f16", "tile": (64, 256, 64), **kw})


def test_pingpong_with_direct_stores():
    """5 stages of 64x256x64 leave no room for the TMA-store buffers: direct stores, per consumer."""
    spec = tilegen.GemmSpec(**PP, dtype="f16", out_dtype="f32", tile=(64, 256, 64), stages=5)
    assert spec.store == "direct"
    C, ref, A, B = _run(spec, 200, 300, 130, seed=6)
    assert gemm_error(C, ref, A, B) <= gemm_bound("f16", 130, "f32")


def test_pingpong_reads_c_with_beta():
    rng = np.random.default_rng(7)
    spec = tilegen.GemmSpec(**PP, dtype="f16", out_dtype="f32", tile=(64, 128, 64),
                            epilogue=tilegen.Epilogue(bias="row", activation="gelu_tanh", residual=True))
    M, N, K = 200, 260, 150
    A, B = rng.standard_normal((M, K)).astype(np.float16), rng.standard_normal((K, N)).astype(np.float16)
    C0, R = rng.standard_normal((M, N)).astype(np.float32), rng.standard_normal((M, N)).astype(np.float32)
    bias = rng.standard_normal(M).astype(np.float32)
    C = tilegen.compile(spec)(A, B, out=C0.copy(), alpha=0.5, beta=-1.5, bias=bias, residual=R, device="sim")
    x = 0.5 * (A.astype(np.float64) @ B.astype(np.float64)) - 1.5 * C0 + bias[:, None]
    ref = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3))) + R
    assert np.max(np.abs(C - ref)) <= 1e-3 * max(1.0, np.max(np.abs(ref)))


def test_matmul_takes_pingpong_for_fused_epilogues_on_hopper(monkeypatch):
    import importlib

    mm = importlib.import_module("tilegen.gemm.matmul")
    monkeypatch.setattr(mm, "_target", lambda: "sm_90")
    monkeypatch.setattr(mm, "_tuned", lambda *a, **k: None)
    A, b = np.zeros((4096, 4096), np.float16), np.zeros(4096, np.float16)
    short = mm.explain(A[:, :2048], A[:2048], bias=b, activation="gelu_tanh")
    assert short.spec.pingpong and tuple(short.spec.tile) == (64, 256, 64) and "ping-pong" in short.reason
    assert not mm.explain(A, A, bias=b, activation="gelu_tanh").spec.pingpong     # K = 4096: cooperative
    assert mm.explain(A, A, bias=b, activation="gelu_tanh", residual=A).spec.pingpong   # ... unless a residual
    assert not mm.explain(A[:, :1024], A[:1024]).spec.pingpong      # plain products stay cooperative
    e4m3 = np.zeros((4096, 4096), ml_dtypes.float8_e4m3fn)
    assert not mm.explain(e4m3, e4m3.T, scale_a=np.ones(4096, np.float32)).spec.pingpong   # fp8: not measured faster


def test_ladder_step_10_without_turns_is_caught():
    """examples/hopper_ladder/step10_pingpong.py with each consumer's turn wait removed: consumer 1
    waits on its first block's stages while consumer 0's k-tiles still fill them."""
    from ladder_util import common, planted

    k = planted("step10_pingpong", "step10", ("tg.mbarrier_wait(turn[c], ((i - 1) // 2) & 1)", "pass"))
    with pytest.raises(SimError, match="still writing|mbarrier|phase"):
        common.check(k, 64 * 5, 256, 64 * 6, device="sim", seed=1, out=np.float16)
