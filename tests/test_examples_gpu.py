"""The DSL examples on the GPU at realistic sizes, against float64 references (marker `gpu`).

References run in float64 on torch (on the GPU) when torch is installed, else in numpy.
Each case also records its error and time through gpu_util.record ($TILEGEN_RECORD)."""
import math
import time

import numpy as np
import pytest

from gpu_util import record, requires_gpu
from seeds import seed
from test_examples import bg, fa, gs
from tilegen.arch.dtypes import numpy_dtype

pytestmark = [pytest.mark.gpu, requires_gpu]


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def matmul64(a, b):
    """float64 a @ b (numpy in and out), on the GPU through torch when it can."""
    torch = _torch()
    if torch is None:
        return np.matmul(a, b)
    ta, tb = (torch.from_numpy(np.ascontiguousarray(x)).cuda() for x in (a, b))
    return (ta @ tb).cpu().numpy()


def attention_reference(q, k, v, causal, scale=None):
    """(O, P |V|) in float64, like flash_attention.reference."""
    torch = _torch()
    if torch is None:
        return fa.reference(q, k, v, causal=causal, scale=scale)
    S, D = q.shape[1], q.shape[2]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    Q, K, V = (torch.from_numpy(x.astype(np.float64)).cuda() for x in (q, k, v))
    s = (Q @ K.transpose(1, 2)) * scale
    if causal:
        s = s.masked_fill(torch.ones(S, S, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    p = torch.softmax(s, dim=-1)
    return (p @ V).cpu().numpy(), (p @ V.abs()).cpu().numpy()


def _normal(rng, shape, dtype):
    return rng.standard_normal(shape, dtype=np.float32).astype(numpy_dtype(dtype))


# -- batched GEMM ------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype,shape", [
    ("f16", (16, 1024, 1024, 1024)), ("bf16", (8, 1024, 512, 2048)), ("f16", (7, 1000, 999, 1001)),
    ("bf16", (5, 129, 255, 70)), ("f16", (3, 1, 1, 1)), ("f16", (64, 256, 256, 64)),
], ids=lambda x: "x".join(map(str, x)) if isinstance(x, tuple) else x)
def test_batched_gemm_on_the_gpu(dtype, shape):
    batch, M, N, K = shape
    rng = np.random.default_rng(seed(shape))
    A, B = _normal(rng, (batch, M, K), dtype), _normal(rng, (batch, K, N), dtype)
    C, ms = bg.batched_matmul(A, B, device="gpu", time=True)
    assert not np.isnan(C).any(), "unwritten (NaN-poisoned) elements remain"
    err, limit = bg.error(C, A, B, matmul=matmul64), bg.error_limit(K)
    record("example_batched_gemm", dtype=dtype, batch=batch, M=M, N=N, K=K, err=err, limit=limit, ms=ms,
           tflops=2 * batch * M * N * K / ms / 1e9 if ms else None)
    assert err <= limit
    C2 = bg.batched_matmul(A, B, device="gpu")
    assert np.array_equal(C, C2), "repeat launches differ"


# -- GEMM + softmax ----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype,shape", [
    ("f16", (8192, 256, 1024)), ("bf16", (8192, 256, 1024)), ("f16", (8192, 100, 1024)),
    ("f16", (4099, 64, 77)), ("bf16", (1000, 129, 4096)), ("f16", (33, 1, 16)),
], ids=lambda x: "x".join(map(str, x)) if isinstance(x, tuple) else x)
def test_gemm_softmax_on_the_gpu(dtype, shape):
    M, N, K = shape
    rng = np.random.default_rng(seed(shape))
    A, B = _normal(rng, (M, K), dtype), _normal(rng, (K, N), dtype)
    scale = 1.0 / math.sqrt(K)
    C, ms = gs.gemm_softmax_call(A, B, scale=scale, device="gpu", time=True)
    ref = gs.reference(A, B, scale, matmul=matmul64)
    err, limit = gs.error(C, ref), gs.error_limit(A, B, scale, matmul=matmul64)
    record("example_gemm_softmax", dtype=dtype, M=M, N=N, K=K, err=err, limit=limit, ms=ms)
    assert err <= limit
    np.testing.assert_allclose(C.sum(axis=1), 1.0, rtol=1e-4)


# -- flash attention ---------------------------------------------------------------------------
ATTENTION = [  # (dtype, out_dtype, head_dim, causal, seq, batch*heads, kernel options)
    ("f16", "f16", 64, False, 2048, 16, {}),
    ("f16", "f16", 64, True, 2048, 16, {}),
    ("f16", "f16", 128, False, 2048, 16, {}),
    ("f16", "f16", 128, True, 2048, 16, {}),
    ("bf16", "bf16", 128, True, 1024, 16, {}),
    ("bf16", "bf16", 64, False, 1024, 8, {}),
    ("f16", "f32", 64, True, 1024, 8, {}),
    ("bf16", "f32", 128, False, 1000, 12, {}),          # ragged: 1000 keys
    ("f16", "f16", 128, True, 1537, 4, {}),             # ragged and causal
    ("f16", "f16", 64, True, 2048, 16, {"block_m": 128}),                # two m-atoms per warp
    ("f16", "f16", 64, False, 2048, 16, {"block_m": 128, "warps": 8}),
    ("f16", "f16", 128, True, 2048, 16, {"block_m": 128, "warps": 8}),
    ("bf16", "bf16", 128, False, 2048, 8, {"block_n": 128}),
]


@pytest.mark.parametrize("dtype,out_dtype,d,causal,seq,bh,opts", ATTENTION,
                         ids=lambda x: str(x) if not isinstance(x, dict) else "-".join(f"{k}{v}" for k, v in x.items()))
def test_flash_attention_on_the_gpu(dtype, out_dtype, d, causal, seq, bh, opts):
    rng = np.random.default_rng(seq * d + causal)
    q, k, v = (_normal(rng, (bh, seq, d), dtype) for _ in range(3))
    kernel = fa.compile_attention(d, dtype, out_dtype, causal, **opts)
    t0 = time.perf_counter()
    out, ms = fa.attention(q, k, v, causal=causal, out_dtype=out_dtype, device="gpu", kernel=kernel, time=True)
    wall = time.perf_counter() - t0
    assert not np.isnan(out.astype(np.float32)).any(), "unwritten (NaN-poisoned) elements remain"
    ref, magnitude = attention_reference(q, k, v, causal)
    err, limit = fa.relative_error(out, ref, magnitude), fa.error_limit(dtype, out_dtype)
    rel = float(np.linalg.norm(out.astype(np.float64) - ref) / np.linalg.norm(ref))
    flops = 4 * bh * seq * seq * d * (0.5 if causal else 1.0)
    record("example_flash_attention", dtype=dtype, out_dtype=out_dtype, head_dim=d, causal=causal, seq=seq,
           batch_heads=bh, options=opts, err=err, limit=limit, rel=rel, ms=ms, tflops=flops / ms / 1e9,
           wall_s=wall)
    assert err <= limit
    assert rel < (1e-2 if "bf16" not in (dtype, out_dtype) else 3e-2)
    out2 = fa.attention(q, k, v, causal=causal, out_dtype=out_dtype, device="gpu", kernel=kernel)
    assert np.array_equal(out.view(np.uint8), out2.view(np.uint8)), "repeat launches differ"
