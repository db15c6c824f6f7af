"""What each fragment probe must output, computed on the CPU from tilegen.arch's tables.

Given the 32-bit words a probe was fed and the words it gave back, these functions decode
the inputs with the current tables, do the instruction's work in numpy (A @ B + C, or a
move of 16-bit elements; for wgmma, A and B read from a shared-memory image through the
descriptors) and compare. They are used on live GPU results and on recorded
ones alike, so a committed GPU dump keeps guarding the tables on machines without a GPU.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..arch.dtypes import numpy_dtype
from ..arch.wgmma import Descriptor, accumulator_coord

_UINT = {8: np.uint8, 16: np.uint16, 32: np.uint32}


@dataclass(frozen=True)
class Mismatch:
    probe: str
    where: str                  # "lane 5 reg 2", "shared row 3 word 1", ...
    got: Optional[int] = None   # 32-bit words
    want: Optional[int] = None
    note: str = ""

    def __str__(self) -> str:
        s = f"{self.probe}: {self.where}"
        if self.got is not None:
            s += f": got 0x{self.got:08x}, want 0x{self.want:08x}"
        return s + (f" ({self.note})" if self.note else "")


# ---- words <-> elements <-> values -----------------------------------------------------

def unpack(words, bits: int) -> np.ndarray:
    """(..., regs) uint32 words -> (..., regs, 32/bits) raw elements, element 0 = low bits."""
    w = np.asarray(words, dtype=np.uint64)
    n = 32 // bits
    shifts = (bits * np.arange(n)).astype(np.uint64)
    raw = (w[..., None] >> shifts) & np.uint64((1 << bits) - 1)
    return raw.astype(_UINT[bits])


def pack(raw, bits: int) -> np.ndarray:
    """Inverse of unpack: (..., regs, 32/bits) raw elements -> (..., regs) uint32 words."""
    r = np.asarray(raw, dtype=np.uint64)
    shifts = (bits * np.arange(r.shape[-1])).astype(np.uint64)
    return (r << shifts).sum(axis=-1, dtype=np.uint64).astype(np.uint32)


def to_values(raw, dtype) -> np.ndarray:
    """Raw element bits -> float64 values of a tilegen dtype (tf32 travels as f32 bits)."""
    return np.asarray(raw).view(numpy_dtype(dtype)).astype(np.float64)


def from_values(values, dtype) -> np.ndarray:
    """float64 values -> raw bits of a tilegen dtype (rounded to nearest)."""
    npd = numpy_dtype(dtype)
    return np.asarray(values, dtype=np.float64).astype(npd).view(_UINT[8 * npd.itemsize])


# ---- tables ----------------------------------------------------------------------------

def gather(frag, matrix) -> np.ndarray:
    """(32, regs, elems) array of matrix[row, col] at the map's coordinates."""
    t = frag.table()
    return np.asarray(matrix)[t[..., 0], t[..., 1]]


def scatter(frag, elements):
    """The (rows, cols) matrix the map says `elements` (32, regs, elems) hold.

    Returns (matrix, problem): problem is a string when the map does not cover every
    element of its tile exactly once (then the matrix is not meaningful).
    """
    t = frag.table()
    rows, cols = t[..., 0].ravel(), t[..., 1].ravel()
    if rows.min() < 0 or cols.min() < 0 or rows.max() >= frag.rows or cols.max() >= frag.cols:
        return None, f"{frag.name} has coordinates outside its {frag.rows}x{frag.cols} tile"
    count = np.zeros((frag.rows, frag.cols), dtype=np.int64)
    np.add.at(count, (rows, cols), 1)
    if (count != 1).any():
        return None, f"{frag.name} does not cover its tile exactly once"
    elements = np.asarray(elements)
    out = np.zeros((frag.rows, frag.cols), dtype=elements.dtype)
    out[rows, cols] = elements.ravel()
    return out, None


def _words(a, shape) -> np.ndarray:
    a = np.asarray(a, dtype=np.int64)
    if a.shape != shape:
        raise ValueError(f"expected words of shape {shape}, got {a.shape}")
    if (a < 0).any() or (a >= 2**32).any():
        raise ValueError("words must be 32-bit unsigned")
    return a.astype(np.uint32)


def _compare(probe: str, got, want, where) -> list[Mismatch]:
    bad = np.argwhere(got != want)
    return [Mismatch(probe, where(*idx), int(got[tuple(idx)]), int(want[tuple(idx)]))
            for idx in bad]


# ---- the three probe kinds -------------------------------------------------------------

def check_mma(probe: str, atom, inputs: dict, out) -> list[Mismatch]:
    """inputs a/b/c: (32, regs) words fed to the lanes; out: (32, C regs) D words."""
    def decode(words, frag, dt):
        raw = unpack(_words(words, (32, frag.regs)), dt.bits)
        return scatter(frag, to_values(raw, dt))

    a, pa = decode(inputs["a"], atom.a, atom.a_type)
    b, pb = decode(inputs["b"], atom.b, atom.b_type)
    c, pc = decode(inputs["c"], atom.c, atom.acc_type)
    for p in (pa, pb, pc):
        if p:
            return [Mismatch(probe, "table", note=p)]
    d = a @ b + c  # exact: the inputs are small integers
    want_raw = from_values(gather(atom.c, d), atom.acc_type)
    got = _words(out, (32, atom.c.regs))
    got_vals = to_values(unpack(got, atom.acc_type.bits), atom.acc_type)
    want_vals = to_values(want_raw, atom.acc_type)
    want = pack(want_raw, atom.acc_type.bits)
    bad = (got_vals != want_vals).any(axis=-1)  # compare values: +0 and -0 both pass
    return [Mismatch(probe, f"lane {lane} reg {reg}", int(got[lane, reg]), int(want[lane, reg]))
            for lane, reg in np.argwhere(bad)]


def _stacked_rows(op, offsets, probe: str):
    """slot of each row of the (8*num) x 8 stack: from the lane the table says addresses it."""
    rows = 8 * op.num
    offsets = np.asarray(offsets, dtype=np.int64)
    slots, problems = [], []
    for i in range(rows):
        lane = op.row_address_lane(i // 8, i % 8)
        off = int(offsets[lane])
        if off % 16 or not 0 <= off < 16 * rows:
            problems.append(Mismatch(probe, f"offsets[{lane}]", note=f"offset {off} is not a "
                                     f"16-byte row of the {rows}-row tile"))
        slots.append(off // 16)
    return slots, problems


def check_ldmatrix(probe: str, op, inputs: dict, out) -> list[Mismatch]:
    """inputs shared: (8*num, 4) words by slot, offsets: (32,) byte offsets; out (32, num)."""
    rows = 8 * op.num
    shared = unpack(_words(inputs["shared"], (rows, 4)), 16).reshape(rows, 8)
    slots, problems = _stacked_rows(op, inputs["offsets"], probe)
    if problems:
        return problems
    stack = shared[slots]
    want = pack(gather(op.fragment, stack), 16)
    got = _words(out, (32, op.num))
    return _compare(probe, got, want, lambda lane, reg: f"lane {lane} reg {reg}")


def check_stmatrix(probe: str, op, inputs: dict, out) -> list[Mismatch]:
    """inputs regs: (32, num) words, offsets: (32,); out: (8*num, 4) shared words by slot."""
    rows = 8 * op.num
    stack, problem = scatter(op.fragment, unpack(_words(inputs["regs"], (32, op.num)), 16))
    if problem:
        return [Mismatch(probe, "table", note=problem)]
    slots, problems = _stacked_rows(op, inputs["offsets"], probe)
    if problems:
        return problems
    shared = np.full((rows, 8), 0xFFFF, dtype=np.uint16)  # the probe poisons the tile first
    shared[slots] = stack
    want = pack(shared.reshape(rows, 4, 2), 16)
    got = _words(out, (rows, 4))
    return _compare(probe, got, want, lambda row, word: f"shared row {row} word {word}")


def check_wgmma(probe: str, case, inputs: dict, out) -> list[Mismatch]:
    """inputs shared: the image's words, desc: (steps, 4) descriptor words; out: (128, N/2).

    Each step's A (64 x k) and B (N x k) are read from the image where tilegen.arch.wgmma's
    decoded descriptors say; D = sum over steps of A B^T, placed by the accumulator map.
    """
    image = _words(inputs["shared"], (case.image_bytes // 4,)).view(np.uint8)
    desc = _words(inputs["desc"], (case.steps, 4)).view(np.uint64)
    k, n, esize = case.shape.k, case.shape.n, case.esize
    operands = case.operands()
    d = np.zeros((64, n))
    for step in range(case.steps):
        values = []
        for (_, rows, k_major, dtype, _), word in zip(operands, desc[step]):
            try:
                addr = Descriptor.decode(int(word)).address(
                    np.arange(rows)[:, None], np.arange(k)[None, :], esize, k_major)
            except ValueError as e:
                return [Mismatch(probe, f"step {step} descriptor", note=str(e))]
            if addr.min() < 0 or addr.max() + esize > image.size:
                return [Mismatch(probe, f"step {step} descriptor", note="addresses outside the image")]
            raw = image[addr[..., None] + np.arange(esize)].reshape(rows, k * esize)
            values.append(to_values(raw.view(_UINT[8 * esize]), dtype))
        d += values[0] @ values[1].T   # exact: small integers
    warp, lane, reg = np.meshgrid(np.arange(4), np.arange(32), np.arange(n // 2), indexing="ij")
    row, col = accumulator_coord(warp, lane, reg)
    want_vals = d[row, col].reshape(128, n // 2)
    got = _words(out, (128, n // 2))
    got_vals = to_values(got, "f32")
    want = pack(from_values(want_vals, "f32")[..., None], 32)
    return [Mismatch(probe, f"thread {t} reg {r}", int(got[t, r]), int(want[t, r]))
            for t, r in np.argwhere(got_vals != want_vals)]


CHECKS = {"mma": check_mma, "ldmatrix": check_ldmatrix, "stmatrix": check_stmatrix, "wgmma": check_wgmma}
