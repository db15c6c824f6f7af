"""ldmatrix / stmatrix of tilegen.arch against the PTX ISA (ptx.md sections 1.3, 2.6, 3).

The "hardware" below is a numpy model of ldmatrix/stmatrix written from ptx.md 3.1 alone:
lanes 8j..8j+7 supply the row addresses of matrix j; without .trans lane l gets the word of
row l/4 at columns 2(l%4), 2(l%4)+1; with .trans it gets (row 2(l%4), col l/4) low and
(row 2(l%4)+1, col l/4) high. The model is then used to load operand tiles with the lane
address formulas of ptx.md 3.2/3.3 and the registers are compared with tilegen's mma maps.
"""
from __future__ import annotations

import numpy as np
import pytest

from tilegen.arch import LDMATRIX, MMA_ATOMS, STMATRIX, matrix_op

WARP = 32
OPS = [(op, num, trans) for op in ("ldmatrix", "stmatrix") for num in (1, 2, 4) for trans in (False, True)]


def _table(op):
    return {"ldmatrix": LDMATRIX, "stmatrix": STMATRIX}[op]


# ---------------------------------------------------------------------------------------------
# numpy model of the instructions (shared memory = a flat uint8 array)
# ---------------------------------------------------------------------------------------------

def _row(smem: np.ndarray, addr: int) -> np.ndarray:
    assert addr % 16 == 0, "ldmatrix row addresses must be 16-byte aligned"
    return smem[addr:addr + 16].view(np.uint16)     # 8 16-bit elements


def hw_ldmatrix(smem: np.ndarray, addrs, num: int, trans: bool) -> np.ndarray:
    """Registers (32, num) uint32 that ldmatrix.x<num>{.trans} leaves in each lane."""
    regs = np.zeros((WARP, num), np.uint32)
    for j in range(num):
        m = [_row(smem, addrs[8 * j + r]) for r in range(8)]   # matrix j, as stored
        for lane in range(WARP):
            if trans:
                lo, hi = m[2 * (lane % 4)][lane // 4], m[2 * (lane % 4) + 1][lane // 4]
            else:
                lo, hi = m[lane // 4][2 * (lane % 4)], m[lane // 4][2 * (lane % 4) + 1]
            regs[lane, j] = int(lo) | (int(hi) << 16)
    return regs


def hw_stmatrix(smem: np.ndarray, addrs, num: int, trans: bool, regs: np.ndarray) -> None:
    """The store direction of the same layout."""
    for j in range(num):
        m = [_row(smem, addrs[8 * j + r]) for r in range(8)]   # views: writes land in smem
        for lane in range(WARP):
            lo, hi = int(regs[lane, j]) & 0xFFFF, int(regs[lane, j]) >> 16
            if trans:
                m[2 * (lane % 4)][lane // 4], m[2 * (lane % 4) + 1][lane // 4] = lo, hi
            else:
                m[lane // 4][2 * (lane % 4)], m[lane // 4][2 * (lane % 4) + 1] = lo, hi


def _half(regs, lane, r, e):
    return (int(regs[lane, r]) >> (16 * e)) & 0xFFFF


def _smem_tile(rows: int, ld: int, seed: int, itemsize: int = 2):
    """A row-major tile of distinct random bit patterns, `ld` elements per row, in smem bytes."""
    rng = np.random.default_rng(seed)
    n = rows * ld
    if itemsize == 2:
        vals = rng.permutation(1 << 16)[:n].astype(np.uint16).reshape(rows, ld)
    else:
        vals = rng.choice(1 << 31, size=n, replace=False).astype(np.uint32).reshape(rows, ld)
    return vals, vals.reshape(-1).view(np.uint8).copy()


def _scattered_stack(num: int, seed: int):
    """8*num rows of 8 halves placed at random, non-contiguous 16-byte slots."""
    rng = np.random.default_rng(seed)
    stack = rng.permutation(1 << 16)[:8 * num * 8].astype(np.uint16).reshape(8 * num, 8)
    slots = rng.permutation(4 * 8 * num)[:8 * num]
    smem = np.zeros(16 * 4 * 8 * num, np.uint8)
    addrs = [int(s) * 16 for s in slots]
    for r, a in enumerate(addrs):
        smem[a:a + 16] = stack[r].view(np.uint8)
    return stack, smem, addrs


# ---------------------------------------------------------------------------------------------
# The tables themselves
# ---------------------------------------------------------------------------------------------

def test_table_covers_x1_x2_x4_with_and_without_trans():
    for op in ("ldmatrix", "stmatrix"):
        assert set(_table(op)) == {(n, t) for n in (1, 2, 4) for t in (False, True)}


@pytest.mark.parametrize("op, num, trans", OPS)
def test_fragment_is_bijection_onto_stack(op, num, trans):
    ml = _table(op)[(num, trans)]
    f = ml.fragment
    assert (ml.op, ml.num, ml.trans) == (op, num, trans)
    assert (f.rows, f.cols, f.regs, f.elems) == (8 * num, 8, num, 2)
    tab = np.array(f.coords, np.int64).reshape(-1, 2)
    assert len(tab) == 8 * num * 8
    assert tab[:, 0].min() >= 0 and tab[:, 0].max() < 8 * num
    assert tab[:, 1].min() >= 0 and tab[:, 1].max() < 8
    assert len({tuple(x) for x in tab}) == 8 * num * 8
    assert f.is_bijection()


def _isa_coord(lane: int, j: int, e: int, trans: bool):
    """ptx.md 3.1: register j holds matrix j; element e is the low (0) / high (1) half."""
    if not trans:
        row, col = lane // 4, 2 * (lane % 4) + e
    else:   # the non-trans fragment of the transposed matrix
        col, row = lane // 4, 2 * (lane % 4) + e
    return 8 * j + row, col


@pytest.mark.parametrize("op, num, trans", OPS)
def test_fragment_equals_isa_semantics(op, num, trans):
    f = _table(op)[(num, trans)].fragment
    wrong = [(lane, j, e) for lane in range(WARP) for j in range(num) for e in range(2)
             if f.coord(lane, j, e) != _isa_coord(lane, j, e, trans)]
    assert not wrong, f"{op}.x{num}{'.trans' if trans else ''}: wrong at (lane, reg, elem) {wrong[:8]}"


@pytest.mark.parametrize("num, trans", [(n, t) for n in (1, 2, 4) for t in (False, True)])
@pytest.mark.parametrize("seed", [0, 1])
def test_ldmatrix_model_delivers_what_the_map_says(num, trans, seed):
    ml = LDMATRIX[(num, trans)]
    stack, smem, addrs = _scattered_stack(num, seed)
    # lane 8j + r supplies row r of matrix j (tilegen's row_address_lane must agree)
    by_lane = [None] * WARP
    for j in range(num):
        for r in range(8):
            by_lane[ml.row_address_lane(j, r)] = addrs[8 * j + r]
    assert by_lane[:8 * num] == addrs
    regs = hw_ldmatrix(smem, by_lane, num, trans)
    f = ml.fragment
    for lane in range(WARP):
        for j in range(num):
            for e in range(2):
                assert _half(regs, lane, j, e) == stack[f.coord(lane, j, e)], (lane, j, e)


@pytest.mark.parametrize("num, trans", [(n, t) for n in (1, 2, 4) for t in (False, True)])
def test_stmatrix_model_stores_what_the_map_says(num, trans):
    ml = STMATRIX[(num, trans)]
    stack, _, addrs = _scattered_stack(num, seed=7)
    regs = np.zeros((WARP, num), np.uint32)
    f = ml.fragment
    for lane in range(WARP):
        for j in range(num):
            lo, hi = (int(stack[f.coord(lane, j, e)]) for e in range(2))
            regs[lane, j] = lo | (hi << 16)
    smem = np.zeros(16 * 4 * 8 * num, np.uint8)
    hw_stmatrix(smem, addrs, num, trans, regs)
    for r, a in enumerate(addrs):
        assert np.array_equal(smem[a:a + 16].view(np.uint16), stack[r]), r
    # and the ldmatrix of the same addresses reads the registers back (ptx.md 3.1 roundtrip)
    assert np.array_equal(hw_ldmatrix(smem, addrs, num, trans), regs)


def test_ldmatrix_and_stmatrix_share_the_fragment_layout():
    for key in LDMATRIX:
        assert LDMATRIX[key].fragment.coords == STMATRIX[key].fragment.coords


def test_address_lanes():
    for (num, trans), ml in LDMATRIX.items():
        assert list(ml.address_lanes()) == list(range(8 * num))   # x1: 0-7, x2: 0-15, x4: all
        assert [ml.row_address_lane(j, r) for j in range(num) for r in range(8)] == list(range(8 * num))


SPELLINGS = {
    ("ldmatrix", 1, False): "ldmatrix.sync.aligned.m8n8.x1.shared.b16",
    ("ldmatrix", 2, False): "ldmatrix.sync.aligned.m8n8.x2.shared.b16",
    ("ldmatrix", 4, False): "ldmatrix.sync.aligned.m8n8.x4.shared.b16",
    ("ldmatrix", 1, True): "ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16",
    ("ldmatrix", 2, True): "ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16",
    ("ldmatrix", 4, True): "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16",
    ("stmatrix", 1, False): "stmatrix.sync.aligned.m8n8.x1.shared.b16",
    ("stmatrix", 2, False): "stmatrix.sync.aligned.m8n8.x2.shared.b16",
    ("stmatrix", 4, False): "stmatrix.sync.aligned.m8n8.x4.shared.b16",
    ("stmatrix", 1, True): "stmatrix.sync.aligned.m8n8.x1.trans.shared.b16",
    ("stmatrix", 2, True): "stmatrix.sync.aligned.m8n8.x2.trans.shared.b16",
    ("stmatrix", 4, True): "stmatrix.sync.aligned.m8n8.x4.trans.shared.b16",
}


@pytest.mark.parametrize("op, num, trans", OPS)
def test_spelling_and_floors(op, num, trans):
    ml = matrix_op(op, num, trans)
    assert ml is _table(op)[(num, trans)]
    assert ml.instruction == SPELLINGS[(op, num, trans)]
    if op == "stmatrix":
        assert ml.min_sm == 90 and tuple(ml.min_ptx) == (7, 8)
    else:
        # ldmatrix: sm_75; the ISA says PTX 6.5, ptxas accepts it from 7.0 with sm_80
        assert ml.min_sm == 75 and tuple(ml.min_ptx) in {(6, 5), (7, 0)}


@pytest.mark.parametrize("args", [("ldmatrix", 3), ("ldmatrix", 8), ("ldmatrix", 0), ("ldsm", 4),
                                  ("stmatrix", 16), (None, 4)])
def test_matrix_op_unknown_is_value_error(args):
    with pytest.raises(ValueError, match="allowed"):
        matrix_op(*args)


# ---------------------------------------------------------------------------------------------
# Loading mma operands (ptx.md 2.6, 3.2, 3.3)
# ---------------------------------------------------------------------------------------------

F16_ATOMS = ["m16n8k16.f16.f32", "m16n8k16.bf16.f32", "m16n8k16.f16.f16"]
POSITIONS = [(0, 0, 16), (16, 8, 64), (8, 24, 72)]   # (tile row offset, tile col offset, ld)


@pytest.mark.parametrize("atom_name", F16_ATOMS)
@pytest.mark.parametrize("m0, k0, ld", POSITIONS)
def test_ldmatrix_x4_loads_m16n8k16_a_fragment(atom_name, m0, k0, ld):
    # ptx.md 3.2 row 1: A (M x K, K contiguous), lane l -> row m0 + l%8 + 8((l>>3)&1), col k0 + 8(l>>4)
    A, smem = _smem_tile(m0 + 16, ld, seed=m0 + ld)
    assert k0 + 16 <= ld
    addrs = [((m0 + (l % 8) + 8 * ((l >> 3) & 1)) * ld + k0 + 8 * (l >> 4)) * 2 for l in range(WARP)]
    regs = hw_ldmatrix(smem, addrs, 4, trans=False)
    amap = MMA_ATOMS[atom_name].a
    assert amap.regs == 4 and amap.elems == 2
    for lane in range(WARP):
        for r in range(4):
            for e in range(2):
                row, col = amap.coord(lane, r, e)
                assert _half(regs, lane, r, e) == A[m0 + row, k0 + col], (lane, r, e)


@pytest.mark.parametrize("atom_name", F16_ATOMS)
@pytest.mark.parametrize("n0, k0, ld", POSITIONS)
def test_ldmatrix_x4_loads_two_b_fragments_from_n_by_k(atom_name, n0, k0, ld):
    # ptx.md 3.2 row 2: B stored N x K; lane l -> row n0 + l%8 + 8(l>>4), col k0 + 8((l>>3)&1)
    Bnk, smem = _smem_tile(n0 + 16, ld, seed=3 + n0)
    addrs = [((n0 + (l % 8) + 8 * (l >> 4)) * ld + k0 + 8 * ((l >> 3) & 1)) * 2 for l in range(WARP)]
    regs = hw_ldmatrix(smem, addrs, 4, trans=False)
    bmap = MMA_ATOMS[atom_name].b
    assert bmap.regs == 2 and bmap.elems == 2
    for tile in range(2):               # R0,R1: n-tile n0; R2,R3: n-tile n0+8
        for lane in range(WARP):
            for r in range(2):
                for e in range(2):
                    k, n = bmap.coord(lane, r, e)
                    assert _half(regs, lane, 2 * tile + r, e) == Bnk[n0 + 8 * tile + n, k0 + k]


@pytest.mark.parametrize("atom_name", F16_ATOMS)
@pytest.mark.parametrize("k0, n0, ld", POSITIONS)
def test_ldmatrix_x4_trans_loads_two_b_fragments_from_k_by_n(atom_name, k0, n0, ld):
    # ptx.md 3.2 row 3: B stored K x N (N contiguous), .trans;
    # lane l -> row k0 + l%8 + 8((l>>3)&1), col n0 + 8(l>>4)
    Bkn, smem = _smem_tile(k0 + 16, ld, seed=5 + k0)
    addrs = [((k0 + (l % 8) + 8 * ((l >> 3) & 1)) * ld + n0 + 8 * (l >> 4)) * 2 for l in range(WARP)]
    regs = hw_ldmatrix(smem, addrs, 4, trans=True)
    bmap = MMA_ATOMS[atom_name].b
    for tile in range(2):
        for lane in range(WARP):
            for r in range(2):
                for e in range(2):
                    k, n = bmap.coord(lane, r, e)
                    assert _half(regs, lane, 2 * tile + r, e) == Bkn[k0 + k, n0 + 8 * tile + n]


@pytest.mark.parametrize("atom_name", F16_ATOMS)
def test_ldmatrix_x4_trans_loads_a_fragment_from_k_by_m(atom_name):
    # ptx.md 2.6: MN-major A (stored K x M) uses .trans. Matrices j = 0..3 must be the
    # (rows g | g+8) x (k | k+8) quarters in register order: lane l -> row k0 + l%8 + 8(l>>4),
    # col m0 + 8((l>>3)&1) (derived from 3.1 the same way as the rows of 3.2).
    k0, m0, ld = 16, 8, 40
    At, smem = _smem_tile(k0 + 16, ld, seed=11)
    addrs = [((k0 + (l % 8) + 8 * (l >> 4)) * ld + m0 + 8 * ((l >> 3) & 1)) * 2 for l in range(WARP)]
    regs = hw_ldmatrix(smem, addrs, 4, trans=True)
    amap = MMA_ATOMS[atom_name].a
    for lane in range(WARP):
        for r in range(4):
            for e in range(2):
                m, k = amap.coord(lane, r, e)
                assert _half(regs, lane, r, e) == At[k0 + k, m0 + m]


@pytest.mark.parametrize("m0, k0, ld", [(0, 0, 8), (16, 4, 32), (8, 8, 36)])
def test_ldmatrix_x4_on_tf32_pairs_loads_m16n8k8_tf32_a_fragment(m0, k0, ld):
    # ptx.md 3.3: K-major tf32 viewed as pairs of 16-bit halves; an "8x8 b16 matrix" is then
    # 8 rows x 4 tf32. Lanes 0-7 rows 0-7 at k0, 8-15 rows 8-15 at k0, 16-23 rows 0-7 at k0+4,
    # 24-31 rows 8-15 at k0+4 (tf32 columns; 4 bytes each).
    A, smem = _smem_tile(m0 + 16, ld, seed=ld, itemsize=4)
    addrs = [((m0 + (l % 8) + 8 * ((l >> 3) & 1)) * ld + k0 + 4 * (l >> 4)) * 4 for l in range(WARP)]
    regs = hw_ldmatrix(smem, addrs, 4, trans=False)
    amap = MMA_ATOMS["m16n8k8.tf32.f32"].a
    assert amap.regs == 4 and amap.elems == 1
    for lane in range(WARP):
        for r in range(4):
            row, col = amap.coord(lane, r, 0)
            assert int(regs[lane, r]) == int(A[m0 + row, k0 + col]), (lane, r)


def test_ldmatrix_x2_on_tf32_pairs_loads_m16n8k8_tf32_b_fragment():
    # ptx.md 3.3: B stored N x K (K contiguous): .x2 with lanes 0-7 at k0 and 8-15 at k0+4.
    n0, k0, ld = 8, 4, 36
    Bnk, smem = _smem_tile(n0 + 8, ld, seed=2, itemsize=4)
    addrs = [((n0 + (l % 8)) * ld + k0 + 4 * ((l >> 3) & 1)) * 4 for l in range(16)] + [None] * 16
    regs = hw_ldmatrix(smem, addrs, 2, trans=False)
    bmap = MMA_ATOMS["m16n8k8.tf32.f32"].b
    assert bmap.regs == 2 and bmap.elems == 1
    for lane in range(WARP):
        for r in range(2):
            k, n = bmap.coord(lane, r, 0)
            assert int(regs[lane, r]) == int(Bnk[n0 + n, k0 + k]), (lane, r)


def test_trans_on_tf32_pairs_splits_values():
    # ptx.md 3.3: never .trans on 32-bit data: every register would mix halves of two tf32 values.
    A, smem = _smem_tile(16, 8, seed=9, itemsize=4)
    addrs = [((l % 8) + 8 * ((l >> 3) & 1)) * 8 * 4 + 16 * (l >> 4) for l in range(WARP)]
    regs = hw_ldmatrix(smem, addrs, 4, trans=True)
    whole = set(int(x) for x in A.reshape(-1))
    assert not any(int(x) in whole for x in regs.reshape(-1))


def test_fp8_k_major_rows_give_m16n8k32_a_register_0():
    # ptx.md 2.6: non-trans ldmatrix on K-major 8-bit data: lane l receives row l/4,
    # bytes 4(l%4)..4(l%4)+3 = R0 of the m16n8k32 fragment.
    rng = np.random.default_rng(4)
    A = rng.integers(0, 256, (16, 32), dtype=np.uint8)
    smem = A.reshape(-1).copy()
    # matrices j = R0..R3: rows g | g+8 at k 0 | 16 (16 bytes = 16 fp8 per ldmatrix row)
    addrs = [((l % 8) + 8 * ((l >> 3) & 1)) * 32 + 16 * (l >> 4) for l in range(WARP)]
    regs = hw_ldmatrix(smem, addrs, 4, trans=False)
    amap = MMA_ATOMS["m16n8k32.e4m3.f32"].a
    assert amap.regs == 4 and amap.elems == 4
    for lane in range(WARP):
        for r in range(4):
            for e in range(4):
                row, col = amap.coord(lane, r, e)
                assert (int(regs[lane, r]) >> (8 * e)) & 0xFF == A[row, col], (lane, r, e)
