"""Stream-K (GemmSpec.stream_k) on the warp-specialized wgmma kernel: the blocks of C past
the last whole wave of persistent CTAs are shared out by k-tiles evenly across the CTAs
(as many as keep pieces STREAM_K_MIN_PIECE k-tiles long); each CTA's pieces go to an f32
workspace and a second kernel adds each block's pieces in CTA order and applies the
epilogue. On the emulator (3 CTAs, EMULATOR_SM_COUNT, or more where a test says): blocks
fewer than the CTAs, a whole wave plus shared blocks, no shared block, fewer sharing CTAs
than CTAs, the fused epilogue with beta, fp8 with promotion, every layout."""
import numpy as np
import pytest

import tilegen
from bounds import gemm_bound, gemm_error
from tilegen.arch.dtypes import numpy_dtype
from tilegen.errors import SpecError
from tilegen.gemm.template import STREAM_K_MIN_PIECE
from tilegen.ir.grid import LaunchGrid, Min, Mod, SM_COUNT, Size

SMALL = dict(instruction="wgmma", stream_k=True, tile=(64, 128, 64), warps=(4, 1))


def _run(spec, M, N, K, alpha=1.0, beta=0.0, seed=0, **epi):
    rng = np.random.default_rng(seed)
    dt, bt, od = numpy_dtype(spec.dtype), numpy_dtype(spec.b_dtype), numpy_dtype(spec.out_dtype)
    A = rng.standard_normal((M, K)).astype(dt)
    B = rng.standard_normal((K, N)).astype(bt)
    A, B = (np.asfortranarray(x) if lay == "col" else x for x, lay in ((A, spec.a_layout), (B, spec.b_layout)))
    C0 = rng.standard_normal((M, N)).astype(od)
    C = np.full((M, N), np.nan, dtype=od) if beta == 0 else C0.copy()   # poisoned unless read
    C = tilegen.compile(spec)(A, B, out=C, alpha=alpha, beta=beta, device="sim", **epi)
    ref = alpha * (A.astype(np.float64) @ B.astype(np.float64)) + beta * C0.astype(np.float64)
    return C, ref, A, B


def sharers(shared, k_tiles, ctas):
    """How many CTAs share the blocks past the whole waves (StreamK): enough for pieces of
    STREAM_K_MIN_PIECE k-tiles, no fewer than the blocks, at least one."""
    return max(1, shared, min(ctas, shared * k_tiles // STREAM_K_MIN_PIECE))


def shares(M, N, K, spec, sms=3):
    """(whole waves, blocks shared out, k-tiles per sharing CTA's range) of a shape, as StreamK cuts it."""
    blocks, k_tiles = -(-M // spec.tile.m) * -(-N // spec.tile.n), -(-K // spec.tile.k)
    ctas = min(blocks * k_tiles, sms)
    shared = blocks % ctas
    return blocks // ctas, shared, shared * k_tiles / sharers(shared, k_tiles, ctas)


@pytest.mark.parametrize("kw, shape, cut", [
    (dict(dtype="f16", out_dtype="f32"), (261, 128, 1280), (1, 2, 40 / 3)),   # a wave, then 2 blocks over 3 CTAs
    (dict(dtype="f16", out_dtype="f16"), (100, 200, 300), (1, 1, 5.0)),       # a short block: one CTA takes it
    (dict(dtype="bf16", out_dtype="bf16"), (64, 256, 832), (0, 2, 26 / 3)),   # fewer blocks than CTAs
    (dict(dtype="bf16", out_dtype="f32"), (120, 100, 1000), (0, 2, 32 / 3)),
    (dict(dtype="bf16", out_dtype="bf16"), (64 * 6, 100, 65), (2, 0, 0.0)),   # whole waves: no pieces
    (dict(dtype="f16", out_dtype="f32"), (64, 128, 100), (0, 1, 2.0)),        # 2 k-tiles, 1 block: 2 CTAs, 1 sharer
    (dict(dtype="f16", out_dtype="f32"), (64 * 4, 128, 64), (1, 1, 1.0)),
    (dict(dtype="f16", out_dtype="f32", a_layout="col", b_layout="col"), (200, 130, 1100), (2, 2, 12.0)),
    (dict(dtype="f16", out_dtype="f32", a_layout="col", b_layout="row"), (70, 250, 129), (1, 1, 3.0)),
])
def test_stream_k_on_the_emulator(kw, shape, cut):
    spec = tilegen.GemmSpec(**{**SMALL, **kw})
    assert shares(*shape, spec) == cut
    C, ref, A, B = _run(spec, *shape)
    assert gemm_error(C, ref, A, B) <= gemm_bound(spec.dtype, shape[2], spec.out_dtype)


@pytest.mark.parametrize("promote, buffers", [(1, 2), (1, 1), (2, 1)])
def test_stream_k_fp8_with_promotion(promote, buffers):
    """fp8 pieces run the promoted loop: every k-tile, two accumulators taking turns over pieces
    of odd and even k-tile counts, or the warpgroups staggered by half a k-tile; every 2
    (GemmSpec's default), groups staggered across the two math warpgroups."""
    import ml_dtypes
    spec = tilegen.GemmSpec(dtype="e4m3", out_dtype="f32", instruction="wgmma", stream_k=True, promote=promote,
                            frag_buffers=buffers)
    assert spec.promote == promote and tuple(spec.tile) == (128, 128, 128)
    N, K = 140, 128 * 12 + 7
    rng = np.random.default_rng(5)
    A = rng.standard_normal((400, K)).astype(ml_dtypes.float8_e4m3fn)
    B = np.asfortranarray(rng.standard_normal((K, N)).astype(ml_dtypes.float8_e4m3fn))
    for m, cut in ((400, (2, 2, 26 / 3)), (130, (1, 1, 13.0)), (300, (2, 0, 0.0))):
        assert shares(m, N, K, spec) == cut
        a = A[:m]
        ref = a.astype(np.float64) @ B.astype(np.float64)
        C = tilegen.compile(spec)(a, B, device="sim")
        bound = gemm_bound("f16", K, "f32") * np.abs(a.astype(np.float64)) @ np.abs(B.astype(np.float64))
        assert (np.abs(C - ref) <= bound).all(), m


def test_stream_k_applies_the_epilogue_once_after_the_pieces():
    spec = tilegen.GemmSpec(**SMALL, dtype="f16", out_dtype="f32",
                            epilogue=tilegen.Epilogue(bias="col", activation="relu"))
    M, N, K = 261, 128, 1280
    assert shares(M, N, K, spec) == (1, 2, 40 / 3)
    rng = np.random.default_rng(9)
    bias = rng.standard_normal(N).astype(np.float32)
    for beta in (0.0, -1.5):
        C, ref, A, B = _run(spec, M, N, K, alpha=0.5, beta=beta, seed=4, bias=bias)
        ref = np.maximum(ref + bias[None, :], 0)
        assert gemm_error(C, ref, A, B) <= gemm_bound("f16", K, "f32"), beta


def test_stream_k_schedule_covers_every_k_tile_once():
    """StreamK's ranges, as the fix-up kernel finds them: for each shared block, the CTAs from
    first_cta to last_cta with non-empty ranges cover its k-tiles exactly once, in order, and
    no range is longer than a block's K (at most two pieces)."""
    for blocks, ctas, k_tiles in [(5, 3, 6), (1, 3, 1), (131, 132, 64), (4, 132, 64), (7, 5, 1), (3, 7, 2),
                                  (4100, 132, 64), (240, 132, 4), (9, 8, 16), (133, 132, 2)]:
        shared = blocks % ctas
        if shared == 0:
            continue
        n = sharers(shared, k_tiles, ctas)
        total = shared * k_tiles
        start = [(min(c, n) * total) // n for c in range(ctas + 1)]
        assert all(start[c + 1] - start[c] <= k_tiles for c in range(ctas))
        assert all(start[c + 1] - start[c] >= min(STREAM_K_MIN_PIECE, k_tiles) or start[c + 1] == start[c]
                   for c in range(ctas)) or n == shared
        for b in range(shared):
            first = ((b * k_tiles + 1) * n - 1) // total
            last = (((b + 1) * k_tiles) * n - 1) // total
            covered = []
            for c in range(first, last + 1):
                lo, hi = max(start[c], b * k_tiles), min(start[c + 1], (b + 1) * k_tiles)
                if start[c] < start[c + 1]:
                    assert lo < hi, (blocks, ctas, k_tiles, b, c)   # a non-empty range meets the block
                    covered += range(lo, hi)
            assert covered == list(range(b * k_tiles, (b + 1) * k_tiles)), (blocks, ctas, k_tiles, b)


def test_stream_k_kernels_and_grid():
    spec = tilegen.GemmSpec(**SMALL, dtype="bf16", out_dtype="bf16")
    k = tilegen.compile(spec)
    assert "_streamk_" in k.name and {"W_ptr", "W_ld", "WM", "WN", "C_ptr"} <= {n for n, _ in k.params}
    fix = k.second_kernel()
    assert fix is k.second_kernel() and fix.name == k.name + "_fixup"
    # the first kernel: a CTA per SM (fewer only with fewer k-tiles); the fix-up one CTA per
    # 64 x 64 part of each shared block, blocks % CTAs of them
    first, grid = k.launch_grid.evaluator(), fix.launch_grid.evaluator()
    assert first({"M": 64 * 4, "N": 128, "K": 64}, 132) == (4, 1, 1)
    assert first({"M": 64 * 4, "N": 128, "K": 6400}, 132) == (132, 1, 1)
    assert grid({"M": 64 * 5, "N": 128, "K": 640}, 3) == (2 * 2, 1, 1)
    assert grid({"M": 64 * 6, "N": 128, "K": 640}, 3) == (0, 1, 1)
    assert grid({"M": 64 * 4, "N": 128, "K": 640}, 132) == (4 * 2, 1, 1)
    assert grid({"M": 64 * 4, "N": 128, "K": 64}, 132) == (0, 1, 1)     # 4 k-tiles, 4 CTAs: whole blocks
    assert grid({"M": 0, "N": 128, "K": 640}, 132) == (0, 1, 1)
    g = LaunchGrid((Mod(Size("M"), Min(Size("N"), SM_COUNT)), 1, 1))
    assert LaunchGrid.from_data(g.to_data()) == g and "%" in str(g)


@pytest.mark.parametrize("kw, field", [
    (dict(dtype="f16", instruction="wgmma", persistent=False), "stream_k"),
    (dict(dtype="f16", target="sm_90"), "stream_k"),
    (dict(dtype="f16", instruction="wgmma", cluster=(2, 1)), "stream_k"),
    (dict(dtype="f16", instruction="wgmma", stream_k=1), "stream_k"),
    (dict(dtype="f16", instruction="wgmma", split_k=2, persistent=False), "stream_k"),
])
def test_stream_k_refuses_what_it_does_not_build(kw, field):
    with pytest.raises(SpecError, match=field):
        tilegen.GemmSpec(**{"stream_k": True, **kw})
    assert tilegen.GemmSpec(dtype="f16", instruction="wgmma", tile=(64, 192, 64), warps=(4, 1), stream_k=True).stream_k


def test_stream_k_with_fewer_sharers_than_ctas(monkeypatch):
    """One shared block of 16 k-tiles on 8 CTAs: 2 CTAs take pieces of 8 (STREAM_K_MIN_PIECE),
    the other 6 only their whole-wave block."""
    import tilegen.sim.runner as runner
    monkeypatch.setattr(runner, "EMULATOR_SM_COUNT", 8)
    spec = tilegen.GemmSpec(**SMALL, dtype="bf16", out_dtype="f32")
    M, N, K = 64 * 9, 128, 64 * 16
    assert shares(M, N, K, spec, sms=8) == (1, 1, 8.0) and sharers(1, 16, 8) == 2
    C, ref, A, B = _run(spec, M, N, K, seed=8)
    assert gemm_error(C, ref, A, B) <= gemm_bound("bf16", K, "f32")


def test_stream_k_refuses_what_its_32_bit_schedule_cannot_cut():
    from tilegen.gemm.call import check_stream_k_range
    spec = tilegen.GemmSpec(dtype="bf16", instruction="wgmma", stream_k=True)
    check_stream_k_range(spec, 4096, 4096, 1 << 20, 132)       # 512 blocks x 16384 k-tiles x 132: fits
    with pytest.raises(tilegen.LaunchError, match="32-bit schedule"):
        check_stream_k_range(spec, 4096, 4096, 1 << 22, 132)
    check_stream_k_range(spec.replace(stream_k=False), 4096, 4096, 1 << 22, 132)
