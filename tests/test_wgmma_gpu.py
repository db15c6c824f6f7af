"""The wgmma GEMM (sm_90a) on the GPU against float64 references (marker `gpu`, Hopper only).

Same checks as the mma.sync GEMM: every layout pair, ragged shapes, alpha/beta, NaN-poisoned
outputs, fused epilogues, repeat launches; operands are torch tensors used in place."""
import itertools

import numpy as np
import pytest

import tilegen
from bounds import fp8_wgmma_bound, gemm_bound
from gpu_util import record, requires_gpu
from seeds import seed
from test_gemm_layouts_gpu import EDGE, _errors, _matrix, repeat_launches

pytestmark = [pytest.mark.gpu, requires_gpu]

LAYOUTS = list(itertools.product(["row", "col"], ["row", "col"]))


@pytest.fixture(scope="module")
def torch():
    torch = pytest.importorskip("torch")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("wgmma needs a Hopper (sm_90) GPU")
    return torch


def _shapes(seed, n=10):
    rng = np.random.default_rng(seed)
    return EDGE + [tuple(int(x) for x in rng.integers(1, 4100, size=3)) for _ in range(n)]


def _check_all(torch, kernel, spec, shapes, gen, odt=None):
    odt = odt or torch.float32
    worst = 0.0
    for M, N, K in shapes:
        A = _matrix(torch, M, K, spec.a_layout, spec.dtype, gen)
        B = _matrix(torch, K, N, spec.b_layout, spec.dtype, gen)
        C0 = torch.randn(M, N, generator=gen, device="cuda").to(odt)
        out = C0.clone()
        kernel(A, B, out=out, alpha=0.75, beta=-1.5)
        torch.cuda.synchronize()
        assert not torch.isnan(out).any(), f"NaN in {M}x{N}x{K}"
        err, _ = _errors(torch, out, A, B, 0.75, -1.5, C0)
        bound = gemm_bound(spec.dtype, K, spec.out_dtype, truncated=spec.tf32_truncates)
        worst = max(worst, err / bound)
        assert err <= bound, f"{spec}: {M}x{N}x{K}: error {err:.3g} over the bound {bound:.3g}"
        out.fill_(float("nan"))   # beta = 0 never reads C, and every element is written
        kernel(A, B, out=out)
        torch.cuda.synchronize()
        assert not torch.isnan(out).any(), f"unwritten elements in {M}x{N}x{K}"
        err0, _ = _errors(torch, out, A, B, 1.0, 0.0, C0)
        assert err0 <= bound
    return worst


@pytest.mark.parametrize("layouts", LAYOUTS, ids=lambda x: "".join(l[0] for l in x))
@pytest.mark.parametrize("dtype", ["f16", "bf16", "tf32"])
def test_wgmma_layouts_and_shapes(torch, dtype, layouts):
    a_layout, b_layout = layouts
    spec = tilegen.GemmSpec(dtype=dtype, instruction="wgmma", a_layout=a_layout, b_layout=b_layout)
    gen = torch.Generator(device="cuda").manual_seed(seed(dtype, layouts))
    shapes = _shapes(seed(dtype, layouts, "wgmma")) + [(4096, 4096, 4096)]
    worst = _check_all(torch, tilegen.compile(spec), spec, shapes, gen)
    record("wgmma_layouts", dtype=dtype, a_layout=a_layout, b_layout=b_layout, shapes=len(shapes),
           worst_error_over_bound=worst)


SPECS = [dict(persistent=True), dict(persistent=True, a_layout="col", b_layout="col", group_m=4),
         dict(tile=(128, 128, 64), warps=(8, 1), stages=3), dict(tile=(256, 128, 64), warps=(16, 1)),
         dict(tile=(64, 128, 64), warps=(4, 2), stages=3), dict(swizzle="64B", group_m=16),
         dict(tile=(128, 256, 32), warps=(8, 1), stages=6), dict(tile=(128, 128, 64), warps=(8, 2)),
         dict(out_dtype="bf16", b_layout="col"), dict(out_dtype="f16", a_layout="col"),
         dict(dtype="tf32", tile=(128, 128, 32), warps=(1, 8), stages=6),
         dict(dtype="tf32", swizzle="64B", tile=(256, 128, 16), warps=(1, 8), stages=4, a_layout="col"),
         dict(dtype="tf32", persistent=True, b_layout="col"), dict(dtype="tf32", persistent=True),
         dict(dtype="tf32", a_layout="col", b_layout="col", tile=(128, 128, 32), warps=(8, 1), stages=6),
         # tf32, A and B row-major, warp-specialized on TMA: B through registers (consume_registers)
         dict(dtype="tf32", copy="tma"), dict(dtype="tf32", copy="tma", tile=(128, 128, 32), group_m=3),
         # tf32 MN-major operands copied K-major first (pretranspose), then the K-major kernel
         dict(dtype="tf32", pretranspose=True), dict(dtype="tf32", pretranspose=True, a_layout="col", b_layout="col"),
         dict(dtype="tf32", pretranspose=True, a_layout="col", out_dtype="bf16", tile=(128, 128, 32), stages=6),
         # tilegen.matmul's tf32 specs for 65-128 rows (A row-major)
         dict(dtype="tf32", tile=(64, 128, 32), warps=(1, 8), stages=6),
         dict(dtype="tf32", b_layout="col", tile=(64, 128, 64), warps=(4, 1), stages=4, persistent=False),
         dict(dtype="tf32", b_layout="col", tile=(64, 256, 32), warps=(4, 1), stages=4),
         # f32 (3xTF32): the operands' tf32 parts in one promoted tf32 product
         dict(dtype="f32"), dict(dtype="f32", a_layout="col", b_layout="col", out_dtype="bf16"),
         dict(dtype="f32", b_layout="col", promote=1, tile=(128, 128, 64), stages=3),
         # tilegen.matmul's medium-size specs on Hopper
         dict(tile=(64, 128, 64), warps=(4, 1), stages=6, a_layout="col", out_dtype="f16"),
         dict(dtype="bf16", tile=(128, 128, 64), warps=(8, 1), out_dtype="bf16", b_layout="col"),
         # 2-CTA clusters multicasting B (pairs along M) or A (along N)
         dict(cluster=(2, 1)), dict(cluster=(2, 1), b_layout="col", dtype="bf16", out_dtype="bf16"),
         dict(cluster=(1, 2), a_layout="col", out_dtype="f16"), dict(cluster=(1, 2), b_layout="col"),
         # split-K: the slices' f32 partials, then their ordered sum and the epilogue
         dict(split_k=2, persistent=False, out_dtype="f16"), dict(split_k=3, persistent=False, dtype="bf16", b_layout="col",
                                                             tile=(64, 128, 64), warps=(4, 1), stages=6),
         dict(dtype="tf32", split_k=2, persistent=False),
         # stream-K: whole waves, then the rest of the blocks shared out by k-tiles and fixed up
         dict(stream_k=True), dict(stream_k=True, dtype="bf16", out_dtype="bf16", b_layout="col", tile=(128, 128, 64)),
         dict(stream_k=True, a_layout="col", tile=(64, 128, 64), warps=(4, 1), stages=6, out_dtype="f16"),
         dict(stream_k=True, dtype="tf32", b_layout="col"),
         # ping-pong consumers, each warpgroup on 64x256 blocks of its own
         dict(pingpong=True, tile=(64, 256, 64), warps=(4, 1)),
         dict(pingpong=True, tile=(64, 256, 64), warps=(4, 1), dtype="bf16", out_dtype="bf16", a_layout="col",
              b_layout="col"),
         dict(pingpong=True, tile=(64, 256, 64), warps=(4, 1), stages=5, out_dtype="f16")]   # direct stores


@pytest.mark.parametrize("kw", SPECS, ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()))
def test_wgmma_spec_variants(torch, kw):
    spec = tilegen.GemmSpec(**{"dtype": "f16", "instruction": "wgmma", **kw})
    odt = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[spec.out_dtype]
    gen = torch.Generator(device="cuda").manual_seed(11)
    shapes = EDGE + [(1000, 1001, 999), (2048, 2048, 2048)]
    worst = _check_all(torch, tilegen.compile(spec), spec, shapes, gen, odt)
    record("wgmma_spec", spec=str(spec), shapes=len(shapes), worst_error_over_bound=worst)


@pytest.mark.parametrize("dtype, activation, bias_axis, extra",
                         [("bf16", "relu", "col", {}), ("bf16", "gelu_tanh", "col", {}), ("bf16", "silu", "col", {}),
                          ("tf32", "silu", "col", {}), ("tf32", "gelu_tanh", "row", {}),
                          ("bf16", "gelu_tanh", "col", dict(pingpong=True, tile=(64, 256, 64), warps=(4, 1))),
                          ("f16", "relu", "row", dict(pingpong=True, tile=(64, 256, 64), warps=(4, 1)))])
def test_wgmma_fused_epilogue(torch, dtype, activation, bias_axis, extra):
    """Same tolerance as the mma.sync epilogue tests (test_epilogue_gpu.py); tf32 with a
    row-major B stores C^T = B^T A^T transposed, bias and residual included."""
    from test_epilogue_gpu import TOL, _act

    spec = tilegen.GemmSpec(dtype=dtype, instruction="wgmma", out_dtype="bf16",
                            epilogue=tilegen.Epilogue(bias=bias_axis, activation=activation, residual=True), **extra)
    kernel = tilegen.compile(spec)
    gen = torch.Generator(device="cuda").manual_seed(3)
    worst = 0.0
    for M, N, K in [(1000, 999, 1001), (257, 130, 2049), (4099, 67, 129)]:
        A = _matrix(torch, M, K, "row", dtype, gen)
        B = _matrix(torch, K, N, "row", dtype, gen)
        bias = torch.randn(M if bias_axis == "row" else N, generator=gen, device="cuda").bfloat16()
        R = torch.randn(M, N, generator=gen, device="cuda").bfloat16()
        C0 = torch.randn(M, N, generator=gen, device="cuda").bfloat16()
        out = C0.clone()
        kernel(A, B, out=out, alpha=0.5, beta=0.25, bias=bias, residual=R)
        torch.cuda.synchronize()
        x = 0.5 * (A.double() @ B.double()) + 0.25 * C0.double() + (
            bias.double()[:, None] if bias_axis == "row" else bias.double()[None, :])
        ref = _act(torch, activation, x) + R.double()
        err = float((out.double() - ref).abs().max() / max(1.0, float(ref.abs().max())))
        worst = max(worst, err / TOL["bf16"])
        assert err <= TOL["bf16"], f"{M}x{N}x{K}: {err:.3g} over {TOL['bf16']:.3g}"
    record("wgmma_epilogue", dtype=dtype, activation=activation, bias=bias_axis, spec=str(spec),
           worst_error_over_tolerance=worst)


def test_wgmma_500_launches_bit_identical(torch):
    same = repeat_launches(torch, tilegen.GemmSpec(dtype="bf16", b_layout="col", instruction="wgmma"))
    record("wgmma_repeat", launches=500, identical=same)
    assert same == 500


def test_fp8_promoted_500_launches_bit_identical(torch):
    """fp8 promoted every k-tile (two accumulators taking turns), 1000 x 1001 x 999 (8 k-tiles,
    ragged edges), bf16 out NaN-poisoned before each launch: equal to the first bit for bit."""
    gen = torch.Generator(device="cuda").manual_seed(6)
    A = torch.randn(1000, 999, generator=gen, device="cuda").to(torch.float8_e4m3fn)
    W = torch.randn(1001, 999, generator=gen, device="cuda").to(torch.float8_e4m3fn)
    kernel = tilegen.compile(tilegen.GemmSpec(dtype="e4m3", out_dtype="bf16", instruction="wgmma", promote=1,
                                              frag_buffers=2))
    first = torch.empty(1000, 1001, device="cuda", dtype=torch.bfloat16)
    kernel(A, W.t(), out=first, repitch=True)
    out, same = torch.empty_like(first), 0
    for _ in range(500):
        out.fill_(float("nan"))
        kernel(A, W.t(), out=out, repitch=True)
        same += bool(torch.equal(out, first))
    record("fp8_promoted_repeat", launches=500, identical=same)
    assert same == 500


def test_stream_k_500_launches_bit_identical(torch):
    """1000 x 1001 x 999 on 128 x 256 tiles: 32 blocks, all shared out by k-tiles across every
    SM; each block's pieces are added in CTA order by the fix-up kernel."""
    same = repeat_launches(torch, tilegen.GemmSpec(dtype="bf16", b_layout="col", instruction="wgmma", stream_k=True))
    record("stream_k_repeat", launches=500, identical=same)
    assert same == 500


@pytest.mark.parametrize("dtype, out", [("e4m3", "bf16")])
def test_stream_k_fp8_and_fused_epilogue(torch, dtype, out):
    """fp8 (promoted) pieces, and the fix-up applying bias + GELU + residual once."""
    from test_epilogue_gpu import TOL, _act

    gen = torch.Generator(device="cuda").manual_seed(31)
    fp8 = tilegen.compile(tilegen.GemmSpec(dtype=dtype, out_dtype=out, instruction="wgmma", stream_k=True))
    for M, N, K in [(1000, 1001, 999), (2048, 2048, 4096), (300, 520, 4100)]:
        A = torch.randn(M, K, generator=gen, device="cuda").to(torch.float8_e4m3fn)
        W = torch.randn(N, K, generator=gen, device="cuda").to(torch.float8_e4m3fn)
        C = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
        fp8(A, W.t(), out=C, repitch=True)
        ref = A.double() @ W.t().double()
        err = float(((C.double() - ref).abs().max() / (A.double().abs() @ W.t().double().abs()).max()).item())
        assert err <= fp8_wgmma_bound(K, out, 256), f"{M}x{N}x{K}: {err:.3g}"
    spec = tilegen.GemmSpec(dtype="bf16", instruction="wgmma", out_dtype="bf16", stream_k=True,
                            epilogue=tilegen.Epilogue(bias="col", activation="gelu_tanh", residual=True))
    kernel = tilegen.compile(spec)
    for M, N, K in [(1000, 999, 1001), (4099, 67, 129), (1024, 4096, 4096)]:
        A = _matrix(torch, M, K, "row", "bf16", gen)
        B = _matrix(torch, K, N, "row", "bf16", gen)
        bias = torch.randn(N, generator=gen, device="cuda").bfloat16()
        R = torch.randn(M, N, generator=gen, device="cuda").bfloat16()
        C0 = torch.randn(M, N, generator=gen, device="cuda").bfloat16()
        out_t = C0.clone()
        kernel(A, B, out=out_t, alpha=0.5, beta=0.25, bias=bias, residual=R)
        x = 0.5 * (A.double() @ B.double()) + 0.25 * C0.double() + bias.double()[None, :]
        ref = _act(torch, "gelu_tanh", x) + R.double()
        err = float((out_t.double() - ref).abs().max() / max(1.0, float(ref.abs().max())))
        assert err <= TOL["bf16"], f"{M}x{N}x{K}: {err:.3g} over {TOL['bf16']:.3g}"


def test_split_k_500_launches_bit_identical(torch):
    """The slices' partials are added in slice order by one kernel: no run-to-run variation."""
    same = repeat_launches(torch, tilegen.GemmSpec(dtype="bf16", b_layout="col", instruction="wgmma", split_k=4,
                                                   persistent=False, tile=(64, 128, 64), warps=(4, 1), stages=6))
    record("split_k_repeat", launches=500, identical=same)
    assert same == 500



def _to_gpu(torch, x, layout):
    """A numpy matrix as a CUDA tensor stored in `layout` order."""
    if layout == "row":
        return torch.from_numpy(np.ascontiguousarray(x)).cuda()
    return torch.from_numpy(np.ascontiguousarray(x.T)).cuda().t()


@pytest.mark.parametrize("layouts", LAYOUTS, ids=lambda x: "".join(l[0] for l in x))
def test_wgmma_tf32_truncates_operands(torch, layouts):
    """wgmma reads tf32 operands in shared memory as their f32 words and keeps the top 19
    bits; the operand a kernel loads into registers is rounded first (cvt.rna). C is each
    operand element read that way, bit for bit, on the GPU and on the emulator
    (test_wgmma.tf32_copy_problems)."""
    from test_wgmma import tf32_as_read, tf32_copy_problems

    a_layout, b_layout = layouts
    spec = tilegen.GemmSpec(dtype="tf32", instruction="wgmma", a_layout=a_layout, b_layout=b_layout)
    kernel = tilegen.compile(spec)
    for A, B, want, source in tf32_copy_problems(np.random.default_rng(17)):
        got = kernel(_to_gpu(torch, A, a_layout), _to_gpu(torch, B, b_layout)).cpu().numpy()
        np.testing.assert_array_equal(got, tf32_as_read(spec, want, source))
        order = lambda x, lay: np.asfortranarray(x) if lay == "col" else x  # noqa: E731
        np.testing.assert_array_equal(kernel(order(A, a_layout), order(B, b_layout), device="sim"), got)
    record("wgmma_tf32_truncation", a_layout=a_layout, b_layout=b_layout, bit_exact=True)


@pytest.mark.parametrize("dtype, out", [("e4m3", "bf16"), ("e5m2", "f32"), ("e4m3", "f16")])
def test_wgmma_fp8(torch, dtype, out):
    """fp8 operands on wgmma (m64nNk32, both K-major: A row-major, B the transpose of a row-major
    matrix), against a float64 product of the same fp8 values, over ragged shapes."""
    tdt = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[dtype]
    odt = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[out]
    spec = tilegen.GemmSpec(dtype=dtype, out_dtype=out, instruction="wgmma")
    kernel = tilegen.compile(spec)
    gen = torch.Generator(device="cuda").manual_seed(21)
    worst = 0.0
    for M, N, K in EDGE + [(1000, 1001, 999), (2048, 2048, 2048), (300, 520, 4100)]:
        A = torch.randn(M, K, generator=gen, device="cuda").to(tdt)
        W = torch.randn(N, K, generator=gen, device="cuda").to(tdt)
        out_t = torch.full((M, N), float("nan"), device="cuda", dtype=odt)
        kernel(A, W.t(), out=out_t, alpha=0.5, repitch=True)   # rows of 7 bytes are re-pitched
        torch.cuda.synchronize()
        ref = 0.5 * (A.double() @ W.t().double())
        scale = (A.double().abs() @ W.t().double().abs()).max()
        err = float(((out_t.double() - ref).abs().max() / scale).item())
        bound = fp8_wgmma_bound(K, out, spec.tile.k * spec.promote)
        worst = max(worst, err / bound)
        assert err <= bound, f"{dtype} {M}x{N}x{K}: {err:.3g} over {bound:.3g}"
    record("wgmma_fp8", dtype=dtype, out_dtype=out, worst_error_over_bound=worst)



def test_fp8_matmul_with_row_and_column_scales(torch):
    """tilegen.matmul on torch float8 tensors laid out as torch._scaled_mm takes them, with
    per-row scales of A and per-column scales of B (f32 vectors on the GPU), against a float64
    product and beside torch._scaled_mm's own row-wise result."""
    gen = torch.Generator(device="cuda").manual_seed(31)
    for M, N, K in [(1000, 1001, 1024), (4096, 4096, 4096), (257, 300, 4100)]:
        A = torch.randn(M, K, generator=gen, device="cuda").to(torch.float8_e4m3fn)
        W = torch.randn(N, K, generator=gen, device="cuda").to(torch.float8_e4m3fn)
        sa = torch.rand(M, generator=gen, device="cuda") + 0.5
        sb = torch.rand(N, generator=gen, device="cuda") + 0.5
        C = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
        tilegen.matmul(A, W.t(), scale_a=sa, scale_b=sb, out=C)
        torch.cuda.synchronize()
        ref = (A.double() @ W.t().double()) * sa.double()[:, None] * sb.double()[None, :]
        scale = (A.double().abs() @ W.t().double().abs()) * 1.5 * 1.5
        err = float(((C.double() - ref).abs().max() / scale.max()).item())
        bound = fp8_wgmma_bound(K, "bf16", 256)
        assert err <= bound, f"{M}x{N}x{K}: {err:.3g} over {bound:.3g}"
        if M % 16 == 0 and N % 16 == 0 and K % 16 == 0:   # (cuBLASLt's fp8 shapes)
            lt = torch._scaled_mm(A, W.t(), scale_a=sa[:, None], scale_b=sb[None, :], out_dtype=torch.bfloat16)
            err_lt = float(((lt.double() - ref).abs().max() / scale.max()).item())
            record("fp8_rowwise", shape=[M, N, K], err=err, err_scaled_mm=err_lt)


def test_fp8_decoding_products(torch):
    """fp8 decoding's products through tilegen.matmul (a few rows against a wide W.T: up to 32 rows
    the swapped kernel, C^T = B^T A^T, past 16 rows in two blocks of them, and up to 64 rows against
    at most 4096 columns in 32-row blocks; then the warp-specialized
    64-row tiles; all promoted every k-tile) on ragged shapes, with per-tensor GPU scales and
    per-row / per-column vectors, bias and GELU, NaN-poisoned outputs, against float64 products of
    the same fp8 inputs."""
    import torch.nn.functional as F

    gen = torch.Generator(device="cuda").manual_seed(43)
    seen = set()
    for M, N, K, rowwise in [(3, 2100, 8240, False), (16, 4100, 9000, True), (7, 8704, 1040, False),
                             (13, 28800, 256, True), (17, 4096, 1100, False), (32, 5000, 4112, True),
                             (40, 12400, 2064, True), (48, 4000, 1040, False), (100, 4096, 4096, False),
                             (128, 9000, 1000, True)]:
        A = torch.randn(M, K, generator=gen, device="cuda").to(torch.float8_e4m3fn)
        W = torch.randn(N, K, generator=gen, device="cuda").to(torch.float8_e4m3fn)
        if rowwise:
            sa, sb = torch.rand(M, generator=gen, device="cuda") + 0.5, torch.rand(N, generator=gen, device="cuda") + 0.5
            sa64, sb64 = sa.double()[:, None], sb.double()[None, :]
        else:
            sa, sb = torch.tensor(0.75, device="cuda"), torch.tensor([1.5], device="cuda")
            sa64, sb64 = 0.75, 1.5
        bias = torch.randn(N, generator=gen, device="cuda").to(torch.bfloat16)
        C = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
        spec = tilegen.matmul.explain(A, W.t(), scale_a=sa, scale_b=sb, bias=bias, activation="gelu_tanh", out=C).spec
        seen.add((spec.instruction, spec.swap_ab, spec.promote))
        tilegen.matmul(A, W.t(), scale_a=sa, scale_b=sb, bias=bias, activation="gelu_tanh", out=C)
        torch.cuda.synchronize()
        pre = (A.double() @ W.t().double()) * sa64 * sb64 + bias.double()
        ref = F.gelu(pre, approximate="tanh")
        scale = (A.double().abs() @ W.t().double().abs()) * 1.5 * 1.5 + bias.double().abs()
        err = float(((C.double() - ref).abs() / scale).max())
        bound = fp8_wgmma_bound(K, "bf16", 128) * 1.2   # (GELU's slope is at most 1.13)
        assert err <= bound, f"{M}x{N}x{K}: {err:.3g} over {bound:.3g} ({spec})"
    assert seen == {("wgmma", True, 1), ("wgmma", False, 1)}, seen


@pytest.mark.parametrize("a, b", [("e4m3", "e5m2"), ("e5m2", "e4m3")])
def test_mixed_fp8_pairs(torch, a, b):
    """e4m3 x e5m2 through tilegen.matmul (the wgmma kernel with the atom naming B's type)."""
    tdt = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
    gen = torch.Generator(device="cuda").manual_seed(41)
    for M, N, K in [(1000, 1001, 1024), (2048, 2048, 4096)]:
        A = torch.randn(M, K, generator=gen, device="cuda").to(tdt[a])
        W = torch.randn(N, K, generator=gen, device="cuda").to(tdt[b])
        C = torch.full((M, N), float("nan"), device="cuda", dtype=torch.float32)
        tilegen.matmul(A, W.t(), out=C)
        torch.cuda.synchronize()
        assert tilegen.matmul.explain(A, W.t(), out=C).spec.b_dtype == b
        ref = A.double() @ W.t().double()
        scale = (A.double().abs() @ W.t().double().abs()).max()
        err = float(((C.double() - ref).abs().max() / scale).item())
        assert err <= fp8_wgmma_bound(K, "f32", 256), f"{a} x {b} {M}x{N}x{K}: {err:.3g}"


def test_wide_fp8_tiles_are_assembled_by_ptxas_without_spills(torch):
    """fp8 128x192 tiles hold 2 x 96 accumulator registers per math thread, which the driver's
    JIT spills (it does not honour setmaxnreg): where ptxas is here, the loaded kernel is ptxas's
    cubin, spills nothing, warns of nothing and matches a float64 product on a ragged shape."""
    import warnings

    from tilegen.codegen.ptxas import find_ptxas

    if find_ptxas() is None:
        pytest.skip("no ptxas here")
    gen = torch.Generator(device="cuda").manual_seed(seed("wide fp8"))
    M, N, K = 1500, 1000, 4100
    A = torch.randn(M, K, generator=gen, device="cuda").to(torch.float8_e4m3fn)
    W = torch.randn(N, K, generator=gen, device="cuda").to(torch.float8_e4m3fn)
    spec = tilegen.GemmSpec(dtype="e4m3", out_dtype="bf16", instruction="wgmma", b_layout="col", tile=(128, 192, 128))
    kernel = tilegen.compile(spec)
    with warnings.catch_warnings():
        warnings.simplefilter("error", tilegen.PerformanceWarning)   # no spills reported
        C = kernel(A, W.t(), repitch=True)   # rows of 4100 bytes: re-pitched
        torch.cuda.synchronize()
    fn = kernel.function()
    assert fn.local_bytes == 0, fn.info_log[:300]   # (the driver's JIT spills it: then ptxas's cubin)
    ref = A.double() @ W.t().double()
    err = float(((C.double() - ref).abs().max() / (A.double().abs() @ W.t().double().abs()).max()).item())
    bound = fp8_wgmma_bound(K, "bf16", spec.tile.k * spec.promote)
    record("wide_fp8", shape=[M, N, K], error=err, bound=bound)
    assert err <= bound, f"{err:.3g} over {bound:.3g}"


def test_matmul_takes_the_wide_fp8_tiles_it_can_load_without_spills(torch):
    """tilegen.matmul over 6144^2 outputs with K = 4096: the 128x192 kernel where ptxas is here
    (the loaded kernel keeps its registers), else 128x128; either way no PerformanceWarning and a
    result within the fp8 bound of a float64 product."""
    import warnings

    from tilegen.codegen.ptxas import find_ptxas

    gen = torch.Generator(device="cuda").manual_seed(seed("matmul wide fp8"))
    M = N = 6144
    K = 4096
    A = torch.randn(M, K, generator=gen, device="cuda").to(torch.float8_e4m3fn)
    W = torch.randn(N, K, generator=gen, device="cuda").to(torch.float8_e4m3fn)
    C = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("error", tilegen.PerformanceWarning)
        tilegen.matmul(A, W.t(), out=C)
        torch.cuda.synchronize()
    choice = tilegen.matmul.explain(A, W.t(), out=C)
    wide = find_ptxas() is not None
    assert tuple(choice.spec.tile) == ((128, 192, 128) if wide else (128, 128, 128)), choice.reason
    assert tilegen.compile(choice.spec).function().local_bytes == 0
    ref = A.double() @ W.t().double()
    err = float(((C.double() - ref).abs().max() / (A.double().abs() @ W.t().double().abs()).max()).item())
    bound = fp8_wgmma_bound(K, "bf16", choice.spec.tile.k * choice.spec.promote)
    record("matmul_wide_fp8", shape=[M, N, K], tile=list(choice.spec.tile), error=err, bound=bound)
    assert err <= bound, f"{err:.3g} over {bound:.3g}"
