"""Operands prepared by first kernels (gemm/prepare.py), on the emulator: tf32 operands copied
K-major before the GEMM (GemmSpec(pretranspose=True)) and f32 operands split into tf32 parts for
3xTF32 on wgmma (GemmSpec(dtype="f32", instruction="wgmma")). The first kernels move or split bits
exactly, the GEMM around them is right on ragged shapes of every layout pair, and the specs keep
the kernel's defaults and rules."""
import numpy as np
import pytest

import tilegen
from bounds import gemm_bound, gemm_error
from seeds import seed
from tilegen.errors import SpecError
from tilegen.gemm import GemmSpec, compile_gemm
from tilegen.gemm.prepare import (A_PARTS, B_PARTS, BLOCK_COLS, BLOCK_ROWS, SPLIT_BLOCK, preparations, split3_kernel,
                                   transpose32_kernel)

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


def test_preparations_name_each_operand_with_16_byte_rows():
    spec = GemmSpec(dtype="tf32", instruction="wgmma", a_layout="col", b_layout="row", pretranspose=True)
    args = {"M": 70, "N": 200, "K": 45, "A_ptr": 1000, "A_ld": 72, "B_ptr": 2000, "B_ld": 201}
    (a, b), K = preparations(spec, args)
    assert K == 45 and a.kernel is b.kernel is transpose32_kernel("sm_90a")
    assert (a.operands, a.sizes, a.ld, a.nbytes) == (("A",), (45, 70), (48,), (70 * 48 * 4,))
    assert (b.operands, b.sizes, b.ld, b.nbytes) == (("B",), (45, 200), (48,), (200 * 48 * 4,))
    assert a.arguments(((1000, 72),), (5000,)) == {"ROWS": 45, "COLS": 70, "S_ptr": 1000, "S_ld": 72, "D_ptr": 5000,
                                                  "D_ld": 48}
    (s,), K = preparations(GemmSpec(dtype="f32", instruction="wgmma", b_layout="col"), args)   # both in one launch
    seg = SPLIT_BLOCK[1]    # 45 padded to one block of K
    assert K == 3 * seg and s.operands == ("A", "B") and s.sizes == (70, 200, 45, 3 * seg, seg)
    assert s.ld == (3 * seg, 3 * seg) and s.nbytes == (70 * 3 * seg * 4, 200 * 3 * seg * 4) and s.kind == "split"
    assert s.kernel is split3_kernel("sm_90a", False, False)
    assert s.arguments(((1000, 72), (2000, 201)), (5000, 9000)) == {
        "ROWS_A": 70, "ROWS_B": 200, "COLS": 45, "DCOLS": 3 * seg, "SEG": seg, "SA_ptr": 1000, "SA_ld": 72,
        "DA_ptr": 5000, "DA_ld": 3 * seg, "SB_ptr": 2000, "SB_ld": 201, "DB_ptr": 9000, "DB_ld": 3 * seg}
    (s,), _ = preparations(GemmSpec(dtype="f32", instruction="wgmma"), args)
    assert s.kernel is split3_kernel("sm_90a", False, True)

def _operand(rng, rows, cols, layout):
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    return x if layout == "row" else np.asfortranarray(x)


def _alpha_beta_error(kernel, rng, M, N, K, a_layout, b_layout):
    """(A, B, the error of kernel(A, B, out=C0, alpha=0.75, beta=-1.5) on the emulator against
    float64, relative to the magnitudes summed)."""
    A, B = _operand(rng, M, K, a_layout), _operand(rng, K, N, b_layout)
    C0 = rng.standard_normal((M, N)).astype(np.float32)
    out = C0.copy()
    kernel(A, B, out=out, alpha=0.75, beta=-1.5, device="sim")
    ref = 0.75 * (A.astype(np.float64) @ B.astype(np.float64)) - 1.5 * C0
    err = np.linalg.norm(out - ref) / (np.linalg.norm(0.75 * np.abs(A.astype(np.float64)) @ np.abs(B))
                                       + np.linalg.norm(1.5 * C0))
    return A, B, err


@pytest.mark.parametrize("a_layout, b_layout", [("row", "row"), ("col", "col"), ("col", "row")])
def test_pretransposed_gemm_on_ragged_shapes(a_layout, b_layout):
    """Through kernel(A, B) on the emulator: the K-major copies first, then the K-major kernel,
    alpha and beta over a poisoned-free C, against float64 with the truncated-tf32 bound."""
    spec = GemmSpec(dtype="tf32", instruction="wgmma", a_layout=a_layout, b_layout=b_layout, pretranspose=True)
    kernel = compile_gemm(spec)
    rng = np.random.default_rng(seed(a_layout, b_layout))
    for M, N, K in ((70, 200, 45), (129, 33, 130), (1, 7, 1)):
        A, B, err = _alpha_beta_error(kernel, rng, M, N, K, a_layout, b_layout)
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
    with pytest.raises(SpecError, match="True, False or 'A'"):
        GemmSpec(dtype="tf32", instruction="wgmma", pretranspose="yes")


# ---- 3xTF32 on wgmma: the split into tf32 parts ------------------------------------------------

TF32_MASK = np.uint32(0xFFFFE000)


def _rna_tf32(x: np.ndarray) -> np.ndarray:
    """cvt.rna.tf32.f32 (nearest, ties away from zero) on f32 bit patterns; NaN stays NaN."""
    u = x.view(np.uint32)
    r = ((u + np.uint32(0x1000)) & TF32_MASK).view(np.float32)
    return np.where(np.isnan(x), x, r)


def _parts(x: np.ndarray) -> dict:
    """hi, lo and finite_hi of the split as the PTX computes them (an overflowing rounding truncates)."""
    with np.errstate(invalid="ignore", over="ignore"):
        hi = _rna_tf32(x)
        over = np.isinf(hi) & np.isfinite(x)
        hi = np.where(over, (x.view(np.uint32) & TF32_MASK).view(np.float32), hi)
        finite = np.isfinite(x)
        rest = (x - hi).astype(np.float32)
        lo = np.where(over, (rest.view(np.uint32) & TF32_MASK).view(np.float32), _rna_tf32(rest))
        lo = np.where(finite, lo, np.float32(0))
        return {"hi": hi, "lo": lo.astype(np.float32), "finite_hi": np.where(finite, hi, np.float32(0))}


@pytest.mark.parametrize("a_transposed, b_transposed", [(False, False), (True, True), (False, True)],
                         ids=["k-major", "mn-major", "a-k-b-mn"])
def test_the_split_writes_each_part_exactly(a_transposed, b_transposed):
    """Each segment of each operand holds its part bit for bit (infinities, NaN, -0.0, the largest
    f32 whose rounding overflows, subnormals), the padding up to the next segment is zero and the
    row padding past the last segment is left alone: A's blocks and B's in one launch, their row
    counts (70 and 90, each ragged) and layouts differing."""
    from tilegen.sim import GlobalMemory, run_kernel

    rng = np.random.default_rng(7 + a_transposed + 2 * b_transposed)
    K = 45
    seg = -(-K // SPLIT_BLOCK[1]) * SPLIT_BLOCK[1]
    ld = 3 * seg + 4
    mem = GlobalMemory()
    args = {"COLS": K, "DCOLS": 3 * seg, "SEG": seg}
    operands = {}
    for name, rows, transposed in (("A", 70, a_transposed), ("B", 90, b_transposed)):
        X = (rng.standard_normal((rows, K)) * 2.0 ** rng.integers(-20, 20, (rows, K))).astype(np.float32)
        for v in (np.inf, -np.inf, np.nan, -0.0, np.finfo(np.float32).max, -np.finfo(np.float32).max, 1e-40):
            X[rng.integers(rows), rng.integers(K)] = v
        S = np.ascontiguousarray(X.T) if transposed else X
        ps, pd = mem.alloc(S.nbytes), mem.alloc(rows * ld * 4)
        mem.write(ps, S.tobytes())
        mem.write(pd, np.full((rows, ld), 0x7FC00123, np.uint32).tobytes())
        args.update({f"ROWS_{name}": rows, f"S{name}_ptr": ps, f"S{name}_ld": S.shape[1], f"D{name}_ptr": pd,
                     f"D{name}_ld": ld})
        operands[name] = (X, rows, pd)
    run_kernel(split3_kernel("sm_90a", a_transposed, b_transposed), args, args, memory=mem)
    for name, parts in (("A", A_PARTS), ("B", B_PARTS)):
        X, rows, pd = operands[name]
        D = np.frombuffer(mem.read(pd, rows * ld * 4), np.float32).reshape(rows, ld)
        want = _parts(X)
        for s, part in enumerate(parts):
            got = D[:, s * seg: s * seg + K]
            assert np.array_equal(got, want[part], equal_nan=True), (name, part)
            assert np.array_equal(np.signbit(got), np.signbit(want[part])) or part == "lo", (name, part)
            assert (D[:, s * seg + K: (s + 1) * seg] == 0).all(), (name, part)
        assert (D.view(np.uint32)[:, 3 * seg:] == 0x7FC00123).all(), name
        ok = np.isfinite(X) & (np.abs(X) < 1e30) & (np.abs(X) > 1e-30)   # the model: hi + lo is x to about 21 bits
        x64 = X[ok].astype(np.float64)
        assert (np.abs(want["hi"][ok] + want["lo"][ok].astype(np.float64) - x64) <= 2.0 ** -21 * np.abs(x64)).all()


@pytest.mark.parametrize("a_layout, b_layout", [("row", "row"), ("row", "col"), ("col", "col"), ("col", "row")])
def test_f32_on_wgmma_on_ragged_shapes(a_layout, b_layout):
    """3xTF32 as one promoted tf32 product of the parts, every layout pair, alpha/beta: f32's
    error bound against float64."""
    spec = GemmSpec(dtype="f32", instruction="wgmma", a_layout=a_layout, b_layout=b_layout, tile=(64, 128, 32),
                    warps=(4, 1))
    kernel = compile_gemm(spec)
    rng = np.random.default_rng(seed(a_layout, b_layout, "f32"))
    for M, N, K in ((70, 130, 45), (129, 33, 130), (1, 7, 1)):
        _, _, err = _alpha_beta_error(kernel, rng, M, N, K, a_layout, b_layout)
        assert err <= gemm_bound("f32", K), (M, N, K, err)


def test_f32_on_wgmma_is_the_promoted_tf32_kernel_of_the_parts():
    spec = GemmSpec(dtype="f32", instruction="wgmma")
    twin = spec.kernel_spec
    assert spec.splits_operands and spec.prepared_operands == ("A", "B") and not spec.tf32_truncates
    assert (twin.dtype, twin.a_layout, twin.b_layout, tuple(twin.tile), twin.promote) == \
        ("tf32", "row", "col", (128, 128, 32), 2)
    assert (spec.copy, spec.store, spec.persistent) == (twin.copy, twin.store, twin.persistent) == ("tma", "tma", True)
    assert compile_gemm(spec).ptx == compile_gemm(twin).ptx
    assert GemmSpec(dtype="f32", instruction="wgmma", promote=4).kernel_spec.promote == 4
    assert tilegen.gemm.parse_spec_text(tilegen.gemm.spec_to_text(spec)) == spec
    with pytest.raises(SpecError, match="writes them K-major already"):
        GemmSpec(dtype="f32", instruction="wgmma", pretranspose=True)
    with pytest.raises(SpecError, match="one long product"):
        GemmSpec(dtype="f32", instruction="wgmma", split_k=2, persistent=False)
    with pytest.raises(SpecError, match="promotion is built for"):
        GemmSpec(dtype="tf32", instruction="wgmma", promote=1)       # B row-major: through registers
    with pytest.raises(SpecError, match="warp-specialized TMA kernel does; promote=0 allows"):
        GemmSpec(dtype="f32", instruction="wgmma", copy="cp.async")
    with pytest.raises(SpecError, match="dtype"):
        GemmSpec(dtype="f64", instruction="wgmma", pretranspose=True)   # the dtype's own error first


def test_an_empty_inner_dimension_needs_no_first_kernel():
    """K = 0: no copies (nothing to read), C is the epilogue of a zero product, as in numpy."""
    spec = GemmSpec(dtype="tf32", instruction="wgmma", pretranspose=True, copy="cp.async", tile=(64, 128, 32),
                    warps=(4, 1), stages=3)
    assert preparations(spec, {"M": 5, "N": 7, "K": 0}) == ((), 0)
    C0 = np.arange(35, dtype=np.float32).reshape(5, 7)
    out = compile_gemm(spec)(np.zeros((5, 0), np.float32), np.zeros((0, 7), np.float32), out=C0.copy(), beta=2.0,
                             device="sim")
    assert np.array_equal(out, 2 * C0)
