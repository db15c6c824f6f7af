"""Fused epilogues, 3xTF32 and tilegen.matmul on the GPU against float64 (marker `gpu`)."""

import numpy as np
import pytest

import tilegen
from gpu_util import record, requires_gpu

pytestmark = [pytest.mark.gpu, requires_gpu]
SHAPES = [(1000, 999, 1001), (257, 130, 2049), (4099, 67, 129)]
TOL = {"f32": 2e-5, "f16": 2e-3, "bf16": 1.6e-2}


def _torch():
    return pytest.importorskip("torch")


def _act(torch, name, x):
    F = torch.nn.functional
    return {"none": lambda v: v, "relu": F.relu, "silu": F.silu, "gelu_erf": F.gelu,
            "gelu_tanh": lambda v: F.gelu(v, approximate="tanh")}[name](x)


@pytest.mark.parametrize("activation", ["none", "relu", "silu", "gelu_tanh", "gelu_erf"])
@pytest.mark.parametrize("dtype,out,bias,residual", [("bf16", "bf16", "col", False), ("f16", "f32", "row", True),
                                                     ("bf16", "f16", None, True), ("tf32", "f32", "col", True)])
def test_fused_epilogue(dtype, out, bias, residual, activation):
    torch = _torch()
    tdt = {"tf32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
    odt = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[out]
    spec = tilegen.GemmSpec(dtype=dtype, out_dtype=out, target="sm_90",
                            epilogue=tilegen.Epilogue(bias, activation, residual))
    kernel = tilegen.compile(spec)
    worst = 0.0
    for M, N, K in SHAPES:
        A = _padded(torch, M, K, tdt[dtype])  # in place, rows padded to 16 bytes as cp.async needs
        B = _padded(torch, K, N, tdt[dtype])
        C0 = torch.randn(M, N, device="cuda").to(odt)
        b = torch.randn(N if bias == "col" else M, device="cuda").to(odt) if bias else None
        R = torch.randn(M, N, device="cuda").to(odt) if residual else None
        C = C0.clone()
        kernel(A, B, out=C, alpha=0.5, beta=0.25, bias=b, residual=R)
        Af, Bf = A.double(), B.double()
        if dtype == "tf32":  # the reference sees the operands the tensor cores see
            Af, Bf = _tf32(torch, A).double(), _tf32(torch, B).double()
        x = 0.5 * (Af @ Bf) + 0.25 * C0.double()
        if bias == "col":
            x = x + b.double()[None, :]
        elif bias == "row":
            x = x + b.double()[:, None]
        ref = _act(torch, activation, x) + (R.double() if residual else 0)
        torch.cuda.synchronize()
        err = float((C.double() - ref).abs().max() / max(1.0, float(ref.abs().max())))
        tol = TOL[out] + (4 * K * 2.0 ** -24 if out == "f32" else 0)
        worst = max(worst, err / tol)
        assert err <= tol, f"{M}x{N}x{K}: {err:.3g} over {tol:.3g}"
    record("epilogue", dtype=dtype, out=out, bias=bias, residual=residual, activation=activation,
           worst_error_over_tolerance=worst)


def _padded(torch, rows, cols, dtype):
    per = 16 // torch.empty((), dtype=dtype).element_size()
    return torch.randn(rows, -(-cols // per) * per, device="cuda").to(dtype)[:, :cols]


def _tf32(torch, x):
    """Round f32 to tf32 as sm_90 kernels do (cvt.rn: nearest, ties to even) on the 13 low bits."""
    bits = x.contiguous().view(torch.int32)
    rounded = ((bits + 0xFFF + ((bits >> 13) & 1)) & ~0x1FFF).to(torch.int32)
    return rounded.view(torch.float32)


@pytest.mark.parametrize("shape", [(1024, 1024, 4096), (333, 517, 1999)])
def test_3xtf32_matches_cublas_f32_accuracy(shape):
    torch = _torch()
    M, N, K = shape
    A = torch.randn(M, K, device="cuda")
    B = torch.randn(K, N, device="cuda")
    ref = A.double() @ B.double()
    torch.backends.cuda.matmul.allow_tf32 = False
    err_cublas = float((torch.mm(A, B).double() - ref).norm() / ref.norm())
    C = tilegen.matmul(A, B, allow_tf32=False)
    torch.cuda.synchronize()
    err = float((C.double() - ref).norm() / ref.norm())
    C1 = tilegen.matmul(A, B, allow_tf32=True)
    err_tf32 = float((C1.double() - ref).norm() / ref.norm())
    record("3xtf32", M=M, N=N, K=K, err=err, err_cublas_f32=err_cublas, err_tf32=err_tf32)
    assert err <= 2 * err_cublas, f"3xTF32 {err:.3g} vs cuBLAS f32 {err_cublas:.3g}"
    assert err_tf32 > 50 * err


def test_matmul_on_torch_cupy_and_numpy():
    torch = _torch()
    A = torch.randn(300, 200, device="cuda", dtype=torch.bfloat16)
    B = torch.randn(200, 100, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(100, device="cuda", dtype=torch.bfloat16)
    C = tilegen.matmul(A, B, bias=bias, activation="gelu_tanh")
    assert isinstance(C, torch.Tensor) and C.dtype == torch.bfloat16 and C.is_cuda
    ref = torch.nn.functional.gelu(A.double() @ B.double() + bias.double(), approximate="tanh")
    assert float((C.double() - ref).abs().max()) < 1.6e-2 * float(ref.abs().max())
    # rows of 67 bf16 elements are not 16-byte aligned: matmul re-pitches them
    Am = torch.randn(129, 67, device="cuda", dtype=torch.bfloat16)
    Bm = torch.randn(67, 33, device="cuda", dtype=torch.bfloat16)
    Cm = tilegen.matmul(Am, Bm.t().contiguous().t())
    torch.cuda.synchronize()
    refm = Am.double() @ Bm.double()
    assert float((Cm.double() - refm).abs().max()) < 1.6e-2 * float(refm.abs().max())
    with pytest.raises(tilegen.LaunchError, match="16 bytes"):
        tilegen.compile(tilegen.GemmSpec(dtype="bf16"))(Am, Bm)
    An, Bn = A.float().cpu().numpy(), B.float().cpu().numpy()
    Cn = tilegen.matmul(An, Bn)  # numpy f32 through the GPU
    assert np.abs(Cn - An.astype(np.float64) @ Bn).max() < 1e-4
    cupy = pytest.importorskip("cupy")
    Ac, Bc = cupy.asarray(An), cupy.asarray(Bn)
    Cc = tilegen.matmul(Ac, Bc, allow_tf32=True)
    assert isinstance(Cc, cupy.ndarray)
    assert float(cupy.abs(Cc - cupy.asarray(An.astype(np.float64) @ Bn)).max()) < 5e-2
