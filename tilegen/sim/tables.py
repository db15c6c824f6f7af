"""The emulator's own semantics of mma.sync and ldmatrix/stmatrix, written from the PTX ISA
(warp-level-matrix-fragment-mma-1684/1688/16816/16832, warp-level-matrix-instructions-
ldmatrix; see shared/reference/ptx.md sections 2 and 3). Nothing here reads tilegen.arch:
tests/test_sim_tables.py holds the two sets of tables together, so a bug in one shows.

Notation of the ISA: g = lane >> 2 ("groupID"), t = lane & 3 ("threadID_in_group").
Element i of a fragment sits in register i // P (P elements per 32-bit register, the
lower-indexed element in the low bits), at position i % P inside it.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

WARP = 32
BITS = {"tf32": 32, "f32": 32, "f16": 16, "bf16": 16, "e4m3": 8, "e5m2": 8}


def _g(lane):
    return lane >> 2


def _t(lane):
    return lane & 3


# ---- element formulas, straight from the ISA figures: (lane, i) -> (row, col) -------------

def _acc(lane, i):
    """C/D of every m16n8kK shape: c0,c1 row g; c2,c3 row g+8; col 2t + (i & 1)."""
    return _g(lane) + 8 * (i >> 1), 2 * _t(lane) + (i & 1)


def _a_tf32_k8(lane, i):
    """m16n8k8 .tf32 A: a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4)."""
    return _g(lane) + 8 * (i & 1), _t(lane) + 4 * (i >> 1)


def _b_tf32_k8(lane, i):
    """m16n8k8 .tf32 B: b0 (t, g), b1 (t+4, g)."""
    return _t(lane) + 4 * i, _g(lane)


def _a_tf32_k4(lane, i):
    """m16n8k4 .tf32 A: a0 (g, t), a1 (g+8, t)."""
    return _g(lane) + 8 * i, _t(lane)


def _b_tf32_k4(lane, i):
    """m16n8k4 .tf32 B: b0 (t, g)."""
    return _t(lane), _g(lane)


def _a_16bit_k16(lane, i):
    """m16n8k16 .f16/.bf16 A: row g + 8((i>>1)&1), col 2t + (i&1) + 8(i>>2)."""
    return _g(lane) + 8 * ((i >> 1) & 1), 2 * _t(lane) + (i & 1) + 8 * (i >> 2)


def _b_16bit_k16(lane, i):
    """m16n8k16 .f16/.bf16 B: row 2t + (i&1) + 8(i>>1), col g."""
    return 2 * _t(lane) + (i & 1) + 8 * (i >> 1), _g(lane)


def _a_16bit_k8(lane, i):
    """m16n8k8 .f16/.bf16 A: a0,a1 (g, 2t+{0,1}); a2,a3 (g+8, 2t+{0,1})."""
    return _g(lane) + 8 * (i >> 1), 2 * _t(lane) + (i & 1)


def _b_16bit_k8(lane, i):
    """m16n8k8 .f16/.bf16 B: b0,b1 (2t+{0,1}, g)."""
    return 2 * _t(lane) + i, _g(lane)


def _a_8bit_k32(lane, i):
    """m16n8k32 .e4m3/.e5m2 A: row g + 8((i>>2)&1), col 4t + (i&3) + 16(i>>3)."""
    return _g(lane) + 8 * ((i >> 2) & 1), 4 * _t(lane) + (i & 3) + 16 * (i >> 3)


def _b_8bit_k32(lane, i):
    """m16n8k32 .e4m3/.e5m2 B: row 4t + (i&3) + 16(i>>2), col g."""
    return 4 * _t(lane) + (i & 3) + 16 * (i >> 2), _g(lane)


# (k, operand bits) -> (A formula, A elements per lane, B formula, B elements per lane)
_OPERANDS = {
    (8, 32): (_a_tf32_k8, 4, _b_tf32_k8, 2),
    (4, 32): (_a_tf32_k4, 2, _b_tf32_k4, 1),
    (16, 16): (_a_16bit_k16, 8, _b_16bit_k16, 4),
    (8, 16): (_a_16bit_k8, 4, _b_16bit_k8, 2),
    (32, 8): (_a_8bit_k32, 16, _b_8bit_k32, 8),
}

# Legal type combinations per shape (.row.col only): operand types -> accumulator types.
_LEGAL = {
    (8, "tf32"): ("f32",), (4, "tf32"): ("f32",),
    (16, "f16"): ("f32", "f16"), (16, "bf16"): ("f32",),
    (8, "f16"): ("f32",), (8, "bf16"): ("f32",),
    (32, "e4m3"): ("f32",), (32, "e5m2"): ("f32",),
}


@dataclass(frozen=True)
class MmaLayout:
    """One mma.sync spelling: shape, types and where each (lane, reg, elem) sits."""

    m: int
    n: int
    k: int
    a_type: str
    b_type: str
    c_type: str
    d_type: str
    a: tuple   # a[lane][reg][elem] = (row, col) in the M x K tile
    b: tuple   # (k, n) in the K x N tile
    c: tuple   # (row, col) in the M x N tile; also D

    @property
    def a_regs(self) -> int:
        return len(self.a[0])

    @property
    def b_regs(self) -> int:
        return len(self.b[0])

    @property
    def c_regs(self) -> int:
        return len(self.c[0])


def _by_register(formula, count: int, bits: int) -> tuple:
    per = 32 // bits
    return tuple(tuple(tuple(formula(lane, r * per + e) for e in range(per)) for r in range(count // per))
                 for lane in range(WARP))


@lru_cache(maxsize=None)
def mma_layout(opcode: str) -> MmaLayout:
    """The layout of `mma.sync.aligned.mMnNkK.row.col.<d>.<a>.<b>.<c>`; ValueError if the
    spelling is not one of the sm_80/sm_89 forms this table covers."""
    parts = opcode.split(".")
    if len(parts) != 10 or parts[:3] != ["mma", "sync", "aligned"] or parts[4:6] != ["row", "col"]:
        raise ValueError(f"{opcode!r} is not an mma.sync.aligned.<shape>.row.col.<d>.<a>.<b>.<c> form")
    shape, d, a, b, c = parts[3], parts[6], parts[7], parts[8], parts[9]
    try:
        m, rest = shape[1:].split("n")
        n, k = rest.split("k")
        m, n, k = int(m), int(n), int(k)
    except ValueError:
        raise ValueError(f"bad mma shape {shape!r}") from None
    if (m, n) != (16, 8) or (k, a) not in _LEGAL or c != d or d not in _LEGAL[(k, a)]:
        raise ValueError(f"{opcode!r}: no such mma.sync form in the table")
    if BITS[a] != BITS[b] or (BITS[a] != 8 and a != b):
        raise ValueError(f"{opcode!r}: A and B types must match (fp8 may mix e4m3/e5m2)")
    fa, na, fb, nb = _OPERANDS[(k, BITS[a])]
    return MmaLayout(m, n, k, a, b, c, d, _by_register(fa, na, BITS[a]), _by_register(fb, nb, BITS[b]),
                     _by_register(_acc, 4, BITS[c]))


def mma_opcodes() -> list[str]:
    """Every spelling the table covers."""
    out = []
    for (k, a), accs in _LEGAL.items():
        bs = ("e4m3", "e5m2") if BITS[a] == 8 else (a,)
        for b in bs:
            for acc in accs:
                out.append(f"mma.sync.aligned.m16n8k{k}.row.col.{acc}.{a}.{b}.{acc}")
    return out


# ---- ldmatrix / stmatrix ------------------------------------------------------------------

@dataclass(frozen=True)
class MatrixMove:
    """ldmatrix/stmatrix .m8n8 .x{num} {.trans} .b16: matrix j's row r is addressed by lane
    8j + r; register j of lane l holds elements of matrix j."""

    num: int
    trans: bool
    frag: tuple   # frag[lane][reg][elem] = (row, col) in the (8*num) x 8 stack of matrices

    def address_lane(self, matrix: int, row: int) -> int:
        return 8 * matrix + row


def _matrix_elem(lane, reg, e, trans):
    # ISA figure "ldmatrix fragment layout": lane l holds row l/4, cols 2(l%4), 2(l%4)+1;
    # with .trans each matrix is delivered transposed.
    if trans:
        return 8 * reg + 2 * (lane % 4) + e, lane // 4
    return 8 * reg + lane // 4, 2 * (lane % 4) + e


@lru_cache(maxsize=None)
def matrix_move(num: int, trans: bool) -> MatrixMove:
    if num not in (1, 2, 4):
        raise ValueError(f".x{num}: ldmatrix/stmatrix move 1, 2 or 4 matrices")
    frag = tuple(tuple(tuple(_matrix_elem(lane, r, e, trans) for e in range(2)) for r in range(num))
                 for lane in range(WARP))
    return MatrixMove(num, bool(trans), frag)


def parse_matrix_opcode(opcode: str) -> tuple[str, int, bool]:
    """'ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16' -> ('ldmatrix', 4, True)."""
    parts = opcode.split(".")
    op = parts[0]
    quals = set(parts[1:])
    nums = [int(p[1:]) for p in parts if p in ("x1", "x2", "x4")]
    ok = (op in ("ldmatrix", "stmatrix") and {"sync", "aligned", "m8n8", "b16"} <= quals and len(nums) == 1
          and quals <= {"sync", "aligned", "m8n8", "b16", "x1", "x2", "x4", "trans", "shared", "shared::cta"})
    if not ok:
        raise ValueError(f"{opcode!r} is not an ldmatrix/stmatrix .m8n8 .b16 form the emulator runs")
    return op, nums[0], "trans" in quals


def as_array(coords) -> np.ndarray:
    """A (32, regs, elems, 2) int array of a coords table."""
    return np.array(coords, dtype=np.int64)
