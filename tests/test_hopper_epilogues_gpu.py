"""Every fused epilogue on the kernels tilegen.matmul picks on Hopper, as users call it (marker
`gpu`, needs an sm_90 GPU): dtype x layout x activation, bias per row or column, residual, the
16-bit and f32 outputs, beta = 0 (the epilogue through shared memory and TMA stores) and beta != 0
(direct stores), on ragged shapes; and fp8 over its type pairs x scale kinds x outputs. Against
float64: the largest error of an element over the largest magnitude the sums run through (|alpha|
|A| @ |B| + |beta C| + |bias| + |R|, the scales included)."""

import pytest

import tilegen
from bounds import fp8_wgmma_bound, gemm_bound
from gpu_util import record, requires_gpu

pytestmark = [pytest.mark.gpu, requires_gpu]
LAYOUTS = ["rr", "rc", "cr", "cc"]
ACTIVATIONS = ["none", "relu", "silu", "gelu_tanh", "gelu_erf"]
SHAPES = [(1000, 999, 1001, 0.0), (2500, 1100, 700, 0.25)]   # (M, N, K, beta)
SLOPE = 1.2   # the activations' largest slope (GELU's 1.13) with room for their own f32 arithmetic


@pytest.fixture(scope="module")
def torch():
    torch = pytest.importorskip("torch")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Hopper kernels need an sm_90 GPU")
    return torch


def _activation(torch, name, x):
    F = torch.nn.functional
    return {"none": lambda v: v, "relu": F.relu, "silu": F.silu, "gelu_erf": F.gelu,
            "gelu_tanh": lambda v: F.gelu(v, approximate="tanh")}[name](x)


def _stored(torch, rows, cols, dtype, layout, gen):
    """A rows x cols matrix of fresh random values, row-major or a column-major view."""
    if layout == "r":
        return torch.randn(rows, cols, generator=gen, device="cuda").to(dtype)
    return torch.randn(cols, rows, generator=gen, device="cuda").to(dtype).t()


CASES = [(d, lay, act) for d in ("f16", "bf16", "tf32") for lay in LAYOUTS for act in ACTIVATIONS]


@pytest.mark.parametrize("dtype, layout, activation", CASES)
def test_every_epilogue_on_the_hopper_kernels(torch, dtype, layout, activation):
    i = CASES.index((dtype, layout, activation))
    bias_axis = (None, "row", "col")[i // 3 % 3]   # (apart from the output dtype's turn, i % 3)
    residual = i % 2 == 0
    tdt = {"f16": torch.float16, "bf16": torch.bfloat16, "tf32": torch.float32}[dtype]
    out_name = "f32" if dtype == "tf32" else (dtype, "f32", "bf16" if dtype == "f16" else "f16")[i % 3]
    odt = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[out_name]
    gen = torch.Generator(device="cuda").manual_seed(1000 + i)
    worst, specs = 0.0, []
    for M, N, K, beta in SHAPES:
        A = _stored(torch, M, K, tdt, layout[0], gen)
        B = _stored(torch, K, N, tdt, layout[1], gen)
        bias = torch.randn(M if bias_axis == "row" else N, generator=gen, device="cuda").to(odt) if bias_axis else None
        R = torch.randn(M, N, generator=gen, device="cuda").to(odt) if residual else None
        C0 = torch.randn(M, N, generator=gen, device="cuda").to(odt)
        out = C0.clone() if beta else torch.full((M, N), float("nan"), device="cuda", dtype=odt)
        kw = dict(bias=bias, activation=None if activation == "none" else activation, residual=R, alpha=0.5,
                  beta=beta, out=out, allow_tf32=True)
        spec = tilegen.matmul.explain(A, B, **kw).spec
        specs.append(str(spec))
        if dtype != "tf32":   # (16-bit products of these sizes run on the warp-specialized TMA kernels)
            assert (spec.instruction, spec.copy) == ("wgmma", "tma"), spec
        tilegen.matmul(A, B, **kw)
        torch.cuda.synchronize()
        x = 0.5 * (A.double() @ B.double()) + beta * C0.double()
        mag = 0.5 * (A.double().abs() @ B.double().abs()) + beta * C0.double().abs()
        if bias is not None:
            b64 = bias.double()[:, None] if bias_axis == "row" else bias.double()[None, :]
            x, mag = x + b64, mag + b64.abs()
        ref = _activation(torch, activation, x)
        if R is not None:
            ref, mag = ref + R.double(), mag + R.double().abs()
        assert not torch.isnan(out).any(), f"{M}x{N}x{K}: NaN left in the output ({spec})"
        err = float(((out.double() - ref).abs()).max() / mag.max())
        bound = SLOPE * gemm_bound(dtype, K, out_name, truncated=dtype == "tf32")
        worst = max(worst, err / bound)
        assert err <= bound, f"{M}x{N}x{K} beta={beta}: {err:.3g} over {bound:.3g} ({spec})"
    record("hopper_epilogue", dtype=dtype, layout=layout, activation=activation, bias=bias_axis,
           residual=residual, out_dtype=out_name, specs=specs, worst_error_over_bound=worst)


FP8_PAIRS = [("e4m3", "e4m3"), ("e4m3", "e5m2"), ("e5m2", "e4m3")]
SCALE_KINDS = ["float", "tensor0d", "tensor1", "rows_cols"]
FP8_CASES = [(a, b, s) for a, b in FP8_PAIRS for s in SCALE_KINDS]


@pytest.mark.parametrize("a_dtype, b_dtype, scales", FP8_CASES)
def test_fp8_pairs_scale_kinds_and_outputs(torch, a_dtype, b_dtype, scales):
    """fp8 through tilegen.matmul as torch._scaled_mm takes it (A row-major, B a column-major
    view), ragged shapes (K of 999: rows re-pitched), with bias + GELU or a residual in turn."""
    import torch.nn.functional as F

    i = FP8_CASES.index((a_dtype, b_dtype, scales))
    tdt = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
    out_name = ("bf16", "f16", "f32")[i % 3]
    odt = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[out_name]
    gen = torch.Generator(device="cuda").manual_seed(2000 + i)
    worst = 0.0
    for M, N, K in [(1000, 1001, 999), (257, 300, 4100), (2048, 2048, 2048)]:
        A = torch.randn(M, K, generator=gen, device="cuda").to(tdt[a_dtype])
        W = torch.randn(N, K, generator=gen, device="cuda").to(tdt[b_dtype])
        if scales == "rows_cols":
            sa, sb = torch.rand(M, generator=gen, device="cuda") + 0.5, torch.rand(N, generator=gen, device="cuda") + 0.5
            sa64, sb64 = sa.double()[:, None], sb.double()[None, :]
        else:
            va, vb = 0.75, 1.5
            sa, sb = {"float": (va, vb), "tensor0d": (torch.tensor(va, device="cuda"), torch.tensor(vb, device="cuda")),
                      "tensor1": (torch.tensor([va], device="cuda"), torch.tensor([vb], device="cuda"))}[scales]
            sa64, sb64 = va, vb
        fused = i % 2 == 0
        bias = torch.randn(N, generator=gen, device="cuda").to(odt) if fused else None
        R = None if fused else torch.randn(M, N, generator=gen, device="cuda").to(odt)
        C = torch.full((M, N), float("nan"), device="cuda", dtype=odt)
        kw = dict(scale_a=sa, scale_b=sb, bias=bias, activation="gelu_tanh" if fused else None, residual=R, out=C)
        spec = tilegen.matmul.explain(A, W.t(), **kw).spec
        assert (spec.instruction, spec.dtype, spec.b_dtype) == ("wgmma", a_dtype, b_dtype), spec
        tilegen.matmul(A, W.t(), **kw)
        torch.cuda.synchronize()
        x = (A.double() @ W.t().double()) * sa64 * sb64
        mag = (A.double().abs() @ W.t().double().abs()) * (1.5 * 1.5 if scales == "rows_cols" else sa64 * sb64)
        if fused:
            x, mag = x + bias.double()[None, :], mag + bias.double().abs()[None, :]
            ref = F.gelu(x, approximate="tanh")
        else:
            ref, mag = x + R.double(), mag + R.double().abs()
        err = float(((C.double() - ref).abs()).max() / mag.max())
        bound = SLOPE * fp8_wgmma_bound(K, out_name, 256)
        worst = max(worst, err / bound)
        assert err <= bound, f"{a_dtype} x {b_dtype} {M}x{N}x{K} {scales}: {err:.3g} over {bound:.3g} ({spec})"
    record("fp8_pairs_scales", a=a_dtype, b=b_dtype, scales=scales, out_dtype=out_name, fused=i % 2 == 0,
           worst_error_over_bound=worst)
