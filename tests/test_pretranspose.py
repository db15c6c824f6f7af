"""tf32 operands copied K-major before the GEMM (GemmSpec(pretranspose=True), gemm/transpose.py),
on the emulator: the transposing copy moves bits exactly, the GEMM around it is right on ragged
shapes of every MN-major layout pair, and the spec keeps the K-major kernel's defaults and rules."""
import numpy as np
import pytest

import tilegen
from bounds import gemm_bound, gemm_error
from tilegen.errors import SpecError
from tilegen.gemm import GemmSpec, compile_gemm
from tilegen.gemm.transpose import BLOCK_COLS, BLOCK_ROWS, kmajor_copies, transpose32_kernel

pytest.importorskip("lark")


def _transposed(S: np.ndarray, rows: int, cols: int, d_ld: int) -> np.ndarray:
    """D (cols x d_ld, poisoned first) after the transposing copy of S[:rows, :cols] (S's pitch is its width)."""
    from tilegen.sim import GlobalMemory, run_kernel

    mem = GlobalMemory()
    ps = mem.alloc(S.nbytes)
    mem.write(ps, S.tobytes())
    pd = mem.alloc(cols * d_ld * 4)
    mem.write(pd, np.full((cols, d_ld), 0x7FC00123, np.uint32).tobytes())   # a NaN no copy writes
    sizes = {"ROWS": rows, "COLS": cols}
    run_kernel(transpose32_kernel("sm_90a"), {**sizes, "S_ptr": ps, "S_ld": S.shape[1], "D_ptr": pd, "D_ld": d_ld},
               sizes, memory=mem)
    return np.frombuffer(mem.read(pd, cols * d_ld * 4), np.uint32).reshape(cols, d_ld)


@pytest.mark.parametrize("rows, cols, s_ld", [(37, 150, 153), (2 * BLOCK_COLS + 1, BLOCK_ROWS - 1, 64), (1, 1, 1),
                                              (BLOCK_COLS, 2 * BLOCK_ROWS, 2 * BLOCK_ROWS)])
def test_the_transposing_copy_moves_bits_exactly(rows, cols, s_ld):
    """Every element lands transposed bit for bit (NaN payloads, -0.0, infinities, subnormals),
    ragged edges included, and the destination's row padding is left alone (TMA clips)."""
    rng = np.random.default_rng(rows * 1000 + cols)
    S = rng.integers(0, 2 ** 32, size=(rows, s_ld), dtype=np.uint32)
    specials = np.array([0x80000000, 0x7F800000, 0xFF800000, 0x7FC0BEEF, 0x00000001], np.uint32)
    S.flat[rng.choice(S.size, size=min(S.size, 5), replace=False)] = specials[:min(S.size, 5)]
    d_ld = -(-rows // 4) * 4 + 4
    D = _transposed(S, rows, cols, d_ld)
    assert np.array_equal(D[:, :rows], S[:, :cols].T)
    assert (D[:, rows:] == 0x7FC00123).all()


def test_kmajor_copies_name_each_mn_major_operand_with_16_byte_rows():
    spec = GemmSpec(dtype="tf32", instruction="wgmma", a_layout="col", b_layout="row", pretranspose=True)
    args = {"M": 70, "N": 200, "K": 45, "A_ptr": 1000, "A_ld": 72, "B_ptr": 2000, "B_ld": 201}
    (a, ta, na), (b, tb, nb) = kmajor_copies(spec, args)
    assert (a, ta["ROWS"], ta["COLS"], ta["S_ptr"], ta["S_ld"], ta["D_ld"], na) == ("A", 45, 70, 1000, 72, 48, 70 * 48 * 4)
    assert (b, tb["ROWS"], tb["COLS"], tb["S_ptr"], tb["S_ld"], tb["D_ld"], nb) == ("B", 45, 200, 2000, 201, 48, 200 * 48 * 4)


def _operand(rng, rows, cols, layout):
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    return x if layout == "row" else np.asfortranarray(x)


@pytest.mark.parametrize("a_layout, b_layout", [("row", "row"), ("col", "col"), ("col", "row")])
def test_pretransposed_gemm_on_ragged_shapes(a_layout, b_layout):
    """Through kernel(A, B) on the emulator: the K-major copies first, then the K-major kernel,
    alpha and beta over a poisoned-free C, against float64 with the truncated-tf32 bound."""
    spec = GemmSpec(dtype="tf32", instruction="wgmma", a_layout=a_layout, b_layout=b_layout, pretranspose=True)
    kernel = compile_gemm(spec)
    rng = np.random.default_rng(hash((a_layout, b_layout)) % 2 ** 31)
    for M, N, K in ((70, 200, 45), (129, 33, 130), (1, 7, 1)):
        A, B = _operand(rng, M, K, a_layout), _operand(rng, K, N, b_layout)
        C0 = rng.standard_normal((M, N)).astype(np.float32)
        out = C0.copy()
        kernel(A, B, out=out, alpha=0.75, beta=-1.5, device="sim")
        ref = 0.75 * (A.astype(np.float64) @ B.astype(np.float64)) - 1.5 * C0
        err = np.linalg.norm(out - ref) / (np.linalg.norm(0.75 * np.abs(A.astype(np.float64)) @ np.abs(B))
                                           + np.linalg.norm(1.5 * C0))
        assert err <= gemm_bound("tf32", K, truncated=True), (M, N, K, err)
        plain = kernel(A, B, device="sim")
        assert gemm_error(plain, A.astype(np.float64) @ B, A, B) <= gemm_bound("tf32", K, truncated=True)


def test_pretransposed_gemm_with_a_fused_epilogue():
    from tilegen.gemm.spec import Epilogue

    spec = GemmSpec(dtype="tf32", instruction="wgmma", pretranspose=True, epilogue=Epilogue(bias="col", activation="relu"))
    rng = np.random.default_rng(3)
    A, B = _operand(rng, 66, 40, "row"), _operand(rng, 40, 130, "row")
    bias = rng.standard_normal(130).astype(np.float32)
    out = compile_gemm(spec)(A, B, bias=bias, device="sim")
    ref = np.maximum(A.astype(np.float64) @ B + bias, 0)
    assert gemm_error(out, ref, A, B) <= gemm_bound("tf32", 40, truncated=True)


def test_a_pretranspose_spec_is_its_k_major_twin_after_the_copies():
    spec = GemmSpec(dtype="tf32", instruction="wgmma", pretranspose=True)
    twin = GemmSpec(dtype="tf32", instruction="wgmma", b_layout="col")
    assert (spec.a_layout, spec.b_layout, spec.transposed_operands) == ("row", "row", ("B",))
    assert spec.kernel_spec == twin and twin.kernel_spec is twin
    for f in ("tile", "warps", "copy", "store", "persistent", "stages", "swizzle"):
        assert getattr(spec, f) == getattr(twin, f), f
    assert not spec.swaps_operands and spec.register_operand is None and spec.tf32_truncates
    assert spec.smem_bytes() == twin.smem_bytes()
    assert compile_gemm(spec).ptx == compile_gemm(twin).ptx
    explicit = GemmSpec(dtype="tf32", instruction="wgmma", pretranspose=True, tile=(128, 128, 32), stages=6)
    assert (tuple(explicit.tile), explicit.stages, explicit.kernel_spec.tile) == ((128, 128, 32), 6, explicit.tile)
    assert tilegen.gemm.parse_spec_text(tilegen.gemm.spec_to_text(spec)) == spec


@pytest.mark.parametrize("kw, says", [
    (dict(dtype="f16", instruction="wgmma"), "tf32 on wgmma"),
    (dict(dtype="tf32"), "tf32 on wgmma"),
    (dict(dtype="tf32", instruction="wgmma", b_layout="col"), "already K-major"),
    (dict(dtype="tf32", instruction="wgmma", split_k=2, persistent=False), "split_k or stream_k"),
    (dict(dtype="tf32", instruction="wgmma", a_layout="diag"), "'row', 'col'"),
    (dict(dtype="tf32", instruction="wgmma", tile=(128, 256, 32), stages=6), "stages"),   # the twin's own rules
])
def test_pretranspose_refusals(kw, says):
    with pytest.raises(SpecError, match=says):
        GemmSpec(pretranspose=True, **kw)
    with pytest.raises(SpecError, match="True or False"):
        GemmSpec(dtype="tf32", instruction="wgmma", pretranspose="yes")
