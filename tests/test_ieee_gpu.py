"""IEEE specials on the GPU (marker `gpu`): the checks of tests/test_ieee.py on the H200, with
the default kernels of every path (mma.sync, wgmma, 3xTF32, fp8, epilogues) and through
tilegen.matmul on PyTorch tensors."""
import zlib

import numpy as np
import pytest

import tilegen
from gpu_util import record, requires_gpu
from ieee import check, epilogue_operands, operands

pytestmark = [pytest.mark.gpu, requires_gpu]

KERNELS = [
    dict(dtype="f16"), dict(dtype="bf16", out_dtype="bf16"), dict(dtype="tf32"), dict(dtype="f32"),
    dict(dtype="f32", a_layout="col", b_layout="col"), dict(dtype="e5m2"), dict(dtype="e4m3", out_dtype="bf16"),
    dict(dtype="f16", instruction="wgmma"), dict(dtype="bf16", instruction="wgmma", b_layout="col", out_dtype="bf16"),
    dict(dtype="tf32", instruction="wgmma"), dict(dtype="f16", instruction="wgmma", persistent=True),
    dict(dtype="f32", instruction="wgmma"), dict(dtype="f32", instruction="wgmma", a_layout="col"),   # tf32 parts
]
EPILOGUES = [tilegen.Epilogue(), tilegen.Epilogue(bias="col", activation="relu"),
             tilegen.Epilogue(bias="row", activation="gelu", residual=True), tilegen.Epilogue(activation="silu")]


@pytest.mark.parametrize("epilogue", EPILOGUES, ids=lambda e: f"{e.bias}-{e.activation}-{e.residual}")
@pytest.mark.parametrize("kw", KERNELS, ids=lambda kw: "-".join(str(v) for v in kw.values()))
def test_specials_on_the_gpu(kw, epilogue):
    spec = tilegen.GemmSpec(**kw, epilogue=epilogue)
    rng = np.random.default_rng(zlib.crc32(repr(spec).encode()))
    for M, N, K in ((300, 257, 129), (64, 64, 64)):
        A, B = operands(spec, M, N, K, rng, n_specials=6)
        extra = epilogue_operands(spec, M, N, rng)
        C = tilegen.compile(spec)(A, B, **extra)
        check(spec, C, A, B, extra)
    record("ieee_gpu", spec=str(spec), ok=True)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_specials_through_matmul_on_torch_tensors(dtype):
    torch = pytest.importorskip("torch")
    spec_dtype = {"float16": "f16", "bfloat16": "bf16", "float32": "f32"}[dtype]
    spec = tilegen.GemmSpec(dtype=spec_dtype, out_dtype="f32" if dtype == "float32" else spec_dtype)
    rng = np.random.default_rng(5)
    for M, N, K in ((2048, 2048, 512), (100, 90, 80)):   # the wgmma preset, then a small kernel
        A, B = operands(spec, M, N, K, rng, n_specials=8)
        tdt = getattr(torch, dtype)
        At = torch.from_numpy(A.astype(np.float32)).to("cuda", tdt)
        Bt = torch.from_numpy(B.astype(np.float32)).to("cuda", tdt)
        C = tilegen.matmul(At, Bt).float().cpu().numpy()
        check(spec, C, A, B, {})
