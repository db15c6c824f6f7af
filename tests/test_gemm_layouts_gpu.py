"""Every dtype x layout pair x output dtype on random ragged shapes, on the GPU (marker `gpu`).

Operands are torch tensors used in place: column-major operands are transposed views,
and leading dimensions are padded to 16 bytes (strided views), as cp.async needs."""
import itertools

import numpy as np
import pytest

import tilegen
from bounds import gemm_bound
from gpu_util import record, requires_gpu
from seeds import seed

pytestmark = [pytest.mark.gpu, requires_gpu]

DTYPES = ["tf32", "f16", "bf16"]
LAYOUTS = list(itertools.product(["row", "col"], ["row", "col"]))
EDGE = [(1, 1, 1), (7, 7, 7), (127, 129, 63), (4099, 1, 17), (1, 4099, 33), (16, 8, 4099), (257, 255, 1)]
RANDOM_SHAPES = 30


def _torch():
    return pytest.importorskip("torch")


def _matrix(torch, rows, cols, layout, dtype, gen):
    """A rows x cols tensor in `layout` whose leading dimension is padded to 16 bytes."""
    tdt = {"tf32": torch.float32, "f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[dtype]
    per = 16 // torch.empty((), dtype=tdt).element_size()
    if layout == "row":
        ld = -(-cols // per) * per
        base = torch.randn(rows, ld, generator=gen, device="cuda").to(tdt)
        return base[:, :cols]
    ld = -(-rows // per) * per
    base = torch.randn(cols, ld, generator=gen, device="cuda").to(tdt)
    return base[:, :rows].t()


def _shapes(seed):
    rng = np.random.default_rng(seed)
    return EDGE + [tuple(int(x) for x in rng.integers(1, 4100, size=3)) for _ in range(RANDOM_SHAPES)]


def _errors(torch, C, A, B, alpha, beta, C0):
    A64, B64 = A.double(), B.double()
    ref = alpha * (A64 @ B64) + (beta * C0.double() if beta else 0)
    diff = (C.double() - ref).norm()
    scale = (abs(alpha) * (A64.abs() @ B64.abs())).norm() + (abs(beta) * C0.double().abs()).norm()
    return float(diff / scale), float(diff / max(ref.norm(), 1e-300))


@pytest.mark.parametrize("out_dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("layouts", LAYOUTS, ids=lambda x: "".join(l[0] for l in x))
@pytest.mark.parametrize("dtype", DTYPES)
def test_layouts_and_shapes(dtype, layouts, out_dtype):
    torch = _torch()
    a_layout, b_layout = layouts
    spec = tilegen.GemmSpec(dtype=dtype, a_layout=a_layout, b_layout=b_layout, out_dtype=out_dtype)
    kernel = tilegen.compile(spec)
    odt = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[out_dtype]
    gen = torch.Generator(device="cuda").manual_seed(seed(dtype, layouts, out_dtype))
    shapes = _shapes(seed(dtype, layouts))
    if out_dtype != "f32":  # the full shape sweep runs with f32 output; others take the edge cases
        shapes = EDGE + shapes[len(EDGE):len(EDGE) + 5]
    worst = 0.0
    for M, N, K in shapes:
        A = _matrix(torch, M, K, a_layout, dtype, gen)
        B = _matrix(torch, K, N, b_layout, dtype, gen)
        alpha, beta = 0.75, -1.5
        C0 = torch.randn(M, N, generator=gen, device="cuda").to(odt)
        out = C0.clone()
        kernel(A, B, out=out, alpha=alpha, beta=beta)
        torch.cuda.synchronize()
        assert not torch.isnan(out).any(), f"NaN in {M}x{N}x{K}"
        err, rel = _errors(torch, out, A, B, alpha, beta, C0)
        bound = gemm_bound(dtype, K, out_dtype)
        worst = max(worst, err / bound)
        assert err <= bound, f"{M}x{N}x{K}: error {err:.3g} over the bound {bound:.3g}"
        # beta = 0 must not read C: poison it with NaN.
        out.fill_(float("nan"))
        kernel(A, B, out=out, alpha=1.0, beta=0.0)
        torch.cuda.synchronize()
        assert not torch.isnan(out).any(), f"unwritten elements in {M}x{N}x{K}"
        err0, _ = _errors(torch, out, A, B, 1.0, 0.0, C0)
        assert err0 <= bound
    record("gemm_layouts", dtype=dtype, a_layout=a_layout, b_layout=b_layout, out_dtype=out_dtype,
           shapes=len(shapes), worst_error_over_bound=worst)


def repeat_launches(torch, spec, launches=500) -> int:
    """How many of `launches` runs of the spec's kernel (bf16, B column-major, a ragged
    1000 x 1001 x 999 problem, output NaN-poisoned each time) equal the first run bit for bit."""
    gen = torch.Generator(device="cuda").manual_seed(5)
    A = _matrix(torch, 1000, 999, "row", "bf16", gen)
    B = _matrix(torch, 999, 1001, "col", "bf16", gen)
    kernel = tilegen.compile(spec)
    first = torch.empty(1000, 1001, device="cuda")
    kernel(A, B, out=first)
    out = torch.empty_like(first)
    same = 0
    for _ in range(launches):
        out.fill_(float("nan"))
        kernel(A, B, out=out)
        same += bool(torch.equal(out, first))
    return same


def test_500_launches_bit_identical():
    same = repeat_launches(_torch(), tilegen.GemmSpec(dtype="bf16", b_layout="col"))
    record("gemm_repeat", launches=500, identical=same)
    assert same == 500


def test_misaligned_in_place_operand_is_refused_clearly():
    torch = _torch()
    A = torch.randn(64, 33, device="cuda", dtype=torch.float16)  # rows of 66 bytes
    B = torch.randn(33, 64, device="cuda", dtype=torch.float16)
    kernel = tilegen.compile(tilegen.GemmSpec(dtype="f16"))
    with pytest.raises(tilegen.LaunchError, match="16"):
        kernel(A, B)
