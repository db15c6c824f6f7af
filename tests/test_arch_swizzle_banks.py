"""Swizzles, the shared-memory bank model and shared-memory tile layouts (ptx.md section 5).

Every scenario of the table in ptx.md 5.4 is written out: the per-lane byte addresses are
computed here from the described layout (the swizzle applied to byte offsets where the row
says swizzled, with the formulas of 5.2/5.3 written out on their own).
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tilegen.arch import SWIZZLE_MODES, Swizzle, matrix_wavefronts, swizzle_mode, wavefronts
from tilegen.ir.layout import SmemLayout

WARP = 32

# ptx.md 5.3, in byte units: (B, M, S), period in bytes
MODES = {"128B": ((3, 4, 3), 1024), "64B": ((2, 4, 3), 512), "32B": ((1, 4, 3), 256)}


def swz128(off: int) -> int:
    """ptx.md 5.4: swz(off) = off ^ (((off >> 7) & 7) << 4)."""
    return off ^ (((off >> 7) & 7) << 4)


def swz64(off: int) -> int:
    """ptx.md 5.3: 64B mode moves bits 4-5 by bits 7-8."""
    return off ^ (((off >> 7) & 3) << 4)


def cute_swizzle(x, B, M, S):
    """ptx.md 5.2: swz(x) = x ^ ((x >> S) & (((1 << B) - 1) << M))."""
    return x ^ ((x >> S) & (((1 << B) - 1) << M))


# ---------------------------------------------------------------------------------------------
# Swizzle
# ---------------------------------------------------------------------------------------------

def test_swizzle_modes_are_the_cute_swizzles():
    assert set(SWIZZLE_MODES) == set(MODES)
    for name, ((B, M, S), period) in MODES.items():
        swz = SWIZZLE_MODES[name]
        assert (swz.bits, swz.base, swz.shift) == (B, M, S)
        assert swz.period == period
        assert swz.span == int(name[:-1])          # the row length whose chunks get permuted
        assert swizzle_mode(name) is swz


def _check_bijection_and_involution(swz: Swizzle, blocks: int = 3):
    p = swz.period
    x = np.arange(blocks * p, dtype=np.int64)
    y = swz(x)
    for b in range(blocks):
        blk = y[b * p:(b + 1) * p]
        assert np.array_equal(np.sort(blk), x[b * p:(b + 1) * p]), f"{swz} not a bijection on block {b}"
    assert np.array_equal(swz(y), x), f"{swz} not an involution"
    # ints behave like arrays
    for v in {0, p - 1, p + p // 2, blocks * p - 1}:
        assert swz(v) == int(y[v])


@pytest.mark.parametrize("name", sorted(MODES))
def test_mode_is_bijection_and_involution_per_period(name):
    _check_bijection_and_involution(SWIZZLE_MODES[name])


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 4).flatmap(lambda B: st.tuples(st.just(B), st.integers(0, 5), st.integers(B, 6))))
def test_any_swizzle_is_bijection_and_involution(bms):
    B, M, S = bms
    swz = Swizzle(B, M, S)
    assert swz.period == 1 << (B + M + S)
    assert swz.span == 1 << (B + M)
    _check_bijection_and_involution(swz, blocks=2)
    x = np.arange(2 * swz.period, dtype=np.int64)
    assert np.array_equal(swz(x), cute_swizzle(x, B, M, S))
    # the low M bits (the moving unit) never change
    assert np.array_equal(swz(x) & ((1 << M) - 1), x & ((1 << M) - 1))


def test_128b_is_the_xor_of_row_bits_into_chunk_bits():
    swz = SWIZZLE_MODES["128B"]
    for off in range(0, 3 * 1024):
        assert swz(off) == swz128(off)
        assert swz(off) == off ^ (((off >> 7) & 7) << 4)
    assert swz(np.arange(4096)).tolist() == [swz128(o) for o in range(4096)]


@pytest.mark.parametrize("bms", [(3, 4, 2), (2, 0, 1), (-1, 4, 3), (3, -1, 3)])
def test_invalid_swizzle_parameters(bms):
    with pytest.raises(ValueError):
        Swizzle(*bms)


@pytest.mark.parametrize("bad", ["256B", "128b", "", None, 128, "pad"])
def test_unknown_swizzle_mode(bad):
    with pytest.raises(ValueError) as e:
        swizzle_mode(bad)
    for name in MODES:
        assert name in str(e.value)


# ---------------------------------------------------------------------------------------------
# Bank model: the ptx.md 5.4 table, scenario by scenario
# ---------------------------------------------------------------------------------------------

def lda_rows(m0: int, k0_bytes: int, row_bytes: int, swz=None, row_stride=None):
    """Row addresses of ldmatrix.x4 for an m16 x k16 A block (ptx.md 3.2 row 1), in lane order."""
    stride = row_stride or row_bytes
    out = []
    for lane in range(WARP):
        off = (m0 + lane % 8 + 8 * ((lane >> 3) & 1)) * stride + k0_bytes + 16 * (lane >> 4)
        out.append(swz(off) if swz else off)
    return out


@pytest.mark.parametrize("m0, k0", [(0, 0), (16, 16), (48, 48), (8, 56)])
def test_f16_128B_rows_ldmatrix_x4(m0, k0):
    # f16, 64 halves = 128 B per row, ldmatrix.x4 on a 16x16 block: unswizzled 32, 128B swizzle 4
    assert matrix_wavefronts(lda_rows(m0, 2 * k0, 128), 4) == 32
    assert matrix_wavefronts(lda_rows(m0, 2 * k0, 128, swz128), 4) == 4


@pytest.mark.parametrize("swizzled", [False, True])
def test_f16_128B_rows_cp_async_16B(swizzled):
    # cp.async 16 B, 8 consecutive threads per row: 4 either way
    for row0 in (0, 4, 8, 60):
        addrs = [(row0 + i // 8) * 128 + 16 * (i % 8) for i in range(WARP)]
        if swizzled:
            addrs = [swz128(a) for a in addrs]
        assert wavefronts(addrs, 16) == 4


@pytest.mark.parametrize("m0, k0", [(0, 0), (16, 16), (8, 0)])
def test_f16_64B_rows_ldmatrix_x4(m0, k0):
    # f16, 32 halves = 64 B per row: unswizzled 16; 64B swizzle 4
    assert matrix_wavefronts(lda_rows(m0, 2 * k0, 64), 4) == 16
    assert matrix_wavefronts(lda_rows(m0, 2 * k0, 64, swz64), 4) == 4


@pytest.mark.parametrize("m0, k0", [(0, 0), (16, 16), (8, 56)])
def test_f16_rows_padded_to_144B_ldmatrix_x4(m0, k0):
    assert matrix_wavefronts(lda_rows(m0, 2 * k0, 128, row_stride=144), 4) == 4


def test_f32_128B_rows_scalar_a0():
    # a0 = A[g][k0 + t], 32 floats per row: unswizzled 8, 128B swizzle 1
    for k0 in (0, 4, 8, 28):
        addrs = [(lane >> 2) * 128 + 4 * (k0 + (lane & 3)) for lane in range(WARP)]
        assert wavefronts(addrs, 4) == 8
        assert wavefronts([swz128(a) for a in addrs], 4) == 1


def test_f32_128B_rows_ldmatrix_x4_of_tf32_pairs():
    # ptx.md 3.3 addresses (k0 + 4 floats = +16 bytes for lanes 16-31): unswizzled 32, 128B swizzle 4
    for k0 in (0, 8, 24):
        rows = [((lane % 8) + 8 * ((lane >> 3) & 1)) * 128 + 4 * (k0 + 4 * (lane >> 4)) for lane in range(WARP)]
        assert matrix_wavefronts(rows, 4) == 32
        assert matrix_wavefronts([swz128(a) for a in rows], 4) == 4


def test_f32_rows_padded_to_36_floats_scalar_a0():
    addrs = [(lane >> 2) * 144 + 4 * (lane & 3) for lane in range(WARP)]
    assert wavefronts(addrs, 4) == 1


@pytest.mark.parametrize("stride, want", [(32, 4), (36, 2), (40, 1), (72, 1), (8, 1)])
def test_f32_n_major_b_scalar_b0(stride, want):
    # b0 = B[t][g] with B stored K x N, row stride `stride` floats
    addrs = [4 * ((lane & 3) * stride + (lane >> 2)) for lane in range(WARP)]
    assert wavefronts(addrs, 4) == want


def test_f32_m_major_a_scalar_a0():
    # a0 = At[t][g], At stored K x M with 128-byte rows: unswizzled 4, 128B swizzle 2
    addrs = [(lane & 3) * 128 + 4 * (lane >> 2) for lane in range(WARP)]
    assert wavefronts(addrs, 4) == 4
    assert wavefronts([swz128(a) for a in addrs], 4) == 2


@pytest.mark.parametrize("stride, want", [(64, 8), (72, 2)])
def test_f32_c_staging_v2_store(stride, want):
    # st.shared.v2.f32 of (c0, c1) at C[g][2t], row stride `stride` floats
    addrs = [4 * ((lane >> 2) * stride + 2 * (lane & 3)) for lane in range(WARP)]
    assert wavefronts(addrs, 8) == want


# ---------------------------------------------------------------------------------------------
# Bank model: sanity and errors
# ---------------------------------------------------------------------------------------------

def _model(addrs, width):
    """ptx.md 5.1 written out: phases of 128 bytes; per phase max distinct words in one bank."""
    per_phase = 128 // width
    total = 0
    for p in range(0, WARP, per_phase):
        banks = {}
        for a in addrs[p:p + per_phase]:
            if a is None:
                continue
            for w in range(a // 4, a // 4 + width // 4):
                banks.setdefault(w % 32, set()).add(w)
        total += max((len(v) for v in banks.values()), default=0)
    return total


def test_bank_model_basics():
    assert wavefronts([0] * WARP, 4) == 1                      # broadcast of one word
    assert wavefronts([4 * i for i in range(WARP)], 4) == 1    # 32 banks, one word each
    assert wavefronts([128 * i for i in range(WARP)], 4) == 32  # all in bank 0
    assert wavefronts([8 * i for i in range(WARP)], 8) == 2    # two half-warps
    assert wavefronts([16 * i for i in range(WARP)], 16) == 4  # four quarter-warps
    assert wavefronts([None] * 31 + [4], 4) == 1               # inactive lanes cost nothing
    # 8- and 16-byte requests are served a half-/quarter-warp at a time, even when broadcast
    assert wavefronts([0] * WARP, 8) == 2
    assert wavefronts([0] * WARP, 16) == 4
    assert wavefronts([None] * 16 + [8 * i for i in range(16)], 8) == 1
    assert wavefronts([16 * i for i in range(8)] + [None] * 24, 16) == 1
    assert matrix_wavefronts([16 * i for i in range(8)], 1) == 1
    assert matrix_wavefronts([128 * i for i in range(16)], 2) == 16


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([4, 8, 16]).flatmap(
    lambda w: st.tuples(st.just(w), st.lists(st.one_of(st.none(), st.integers(0, 255).map(lambda i: i * w)),
                                             min_size=WARP, max_size=WARP))))
def test_bank_model_matches_written_out_model(wa):
    width, addrs = wa
    assert wavefronts(addrs, width) == _model(addrs, width)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([1, 2, 4]).flatmap(
    lambda n: st.tuples(st.just(n), st.lists(st.integers(0, 255).map(lambda i: 16 * i),
                                             min_size=8 * n, max_size=8 * n))))
def test_matrix_wavefronts_matches_written_out_model(na):
    num, rows = na
    want = sum(_model(rows[8 * j:8 * j + 8] + [None] * 24, 16) for j in range(num))
    assert matrix_wavefronts(rows, num) == want


@pytest.mark.parametrize("width", [0, 1, 2, 3, 12, 32, 64])
def test_wavefronts_bad_width(width):
    with pytest.raises(ValueError):
        wavefronts([0] * WARP, width)


@pytest.mark.parametrize("n", [0, 16, 31, 33])
def test_wavefronts_needs_32_lanes(n):
    with pytest.raises(ValueError):
        wavefronts([0] * n, 4)


@pytest.mark.parametrize("width, addr", [(4, 2), (8, 4), (16, 8), (16, 4), (4, 1)])
def test_wavefronts_misaligned(width, addr):
    with pytest.raises(ValueError):
        wavefronts([0] * 31 + [addr], width)


@pytest.mark.parametrize("num, count", [(3, 24), (8, 64), (0, 0), (4, 8), (1, 16)])
def test_matrix_wavefronts_bad_shape(num, count):
    with pytest.raises(ValueError):
        matrix_wavefronts([16 * i for i in range(count)], num)


@pytest.mark.parametrize("addr", [8, 4, 1, 24])
def test_matrix_wavefronts_misaligned(addr):
    with pytest.raises(ValueError):
        matrix_wavefronts([16 * i for i in range(7)] + [addr], 1)


# ---------------------------------------------------------------------------------------------
# SmemLayout
# ---------------------------------------------------------------------------------------------

LAYOUTS = [
    (64, 64, 2, "128B"), (128, 64, 2, "128B"), (32, 128, 2, "128B"), (64, 32, 4, "128B"),
    (16, 128, 1, "128B"), (8, 256, 1, "128B"), (64, 32, 2, "64B"), (32, 64, 2, "64B"),
    (64, 16, 2, "32B"), (32, 16, 4, "32B"), (64, 64, 2, "pad"), (48, 36, 4, "pad"),
    (64, 64, 2, "none"), (24, 8, 2, "none"), (16, 24, 2, "pad"),
]


@pytest.mark.parametrize("rows, cols, esize, mode", LAYOUTS)
def test_layout_offsets_distinct_inside_stage_and_chunks_contiguous(rows, cols, esize, mode):
    L = SmemLayout(rows, cols, esize, mode)
    row_bytes = cols * esize
    assert L.row_bytes == row_bytes
    assert L.stage_bytes % 1024 == 0 and L.stage_bytes >= rows * row_bytes
    r = np.repeat(np.arange(rows), row_bytes)
    b = np.tile(np.arange(row_bytes), rows)
    off = np.asarray(L.offset(r, b)).reshape(rows, row_bytes)
    assert len(np.unique(off)) == rows * row_bytes              # distinct
    assert off.min() >= 0 and off.max() < L.stage_bytes         # inside the stage
    chunks = off.reshape(rows, row_bytes // 16, 16)
    assert np.all(chunks[..., 0] % 16 == 0)                     # 16-byte chunks stay aligned...
    assert np.all(chunks - chunks[..., :1] == np.arange(16))    # ...and contiguous
    for row, col in [(0, 0), (rows - 1, cols - 1), (rows // 2, cols // 3)]:
        assert L.element_offset(row, col) == L.offset(row, col * esize) == off[row, col * esize]


def test_layout_128B_with_128_byte_rows_is_tma_swizzle_128b():
    # ptx.md 5.3/6.5: a 128B-swizzled box of 128-byte rows holds logical byte L at L ^ (((L>>7)&7)<<4)
    for esize, cols in ((2, 64), (4, 32), (1, 128)):
        L = SmemLayout(64, cols, esize, "128B")
        for row in range(64):
            for b in range(0, 128, 4):
                assert L.offset(row, b) == swz128(row * 128 + b)


@pytest.mark.parametrize("rows, cols, esize", [(64, 64, 2), (128, 32, 4), (32, 128, 1)])
def test_layout_128B_ldmatrix_rows_are_conflict_free(rows, cols, esize):
    L = SmemLayout(rows, cols, esize, "128B")
    assert L.row_bytes == 128
    for r0 in range(rows - 7):
        for chunk in range(8):
            addrs = [int(L.offset(r0 + i, 16 * chunk)) for i in range(8)]
            assert matrix_wavefronts(addrs, 1) == 1, (r0, chunk)
    # a whole m16n8k16 A load (ptx.md 3.2 row 1) at every 16 x 16 block: the ideal 4
    if esize == 2:
        for m0 in range(0, rows - 15, 16):
            for k0 in range(0, cols, 16):
                addrs = [int(L.element_offset(m0 + lane % 8 + 8 * ((lane >> 3) & 1), k0 + 8 * (lane >> 4)))
                         for lane in range(WARP)]
                assert matrix_wavefronts(addrs, 4) == 4


@pytest.mark.parametrize("rows, cols, esize, mode", [
    (64, 64, 2, "128B"), (32, 128, 2, "128B"), (64, 32, 4, "128B"), (64, 128, 1, "128B"),
    (64, 32, 2, "64B"), (64, 16, 2, "32B"), (64, 64, 2, "none"), (64, 64, 2, "pad")])
def test_layout_cp_async_copy_pattern_is_ideal(rows, cols, esize, mode):
    # thread i copies 16-byte chunk i % chunks_per_row of row i // chunks_per_row
    L = SmemLayout(rows, cols, esize, mode)
    cpr = L.row_bytes // 16
    for warp in range(rows * cpr // WARP):
        tids = range(WARP * warp, WARP * (warp + 1))
        addrs = [int(L.offset(t // cpr, 16 * (t % cpr))) for t in tids]
        assert wavefronts(addrs, 16) == 4, warp     # 32 x 16 B = 4 x 128 B: the ideal


@pytest.mark.parametrize("rows, cols, esize, mode", [
    (64, 32, 2, "128B"),   # 64-byte rows under the 128-byte swizzle
    (4, 64, 2, "128B"),    # 4 rows do not fill a 1024-byte period
    (64, 64, 2, "256B"),   # unknown mode
    (64, 64, 2, None),
])
def test_layout_rejects_bad_modes(rows, cols, esize, mode):
    with pytest.raises(ValueError):
        SmemLayout(rows, cols, esize, mode)
