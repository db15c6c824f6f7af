"""Which shared-memory bytes each lane touches for a tile op: the one description both the
lowering (which turns it into address arithmetic) and the bank-conflict report read.

Coordinates are (stored row, byte column) of the shared tile, relative to the op's origin.
A fragment register whose elements sit in one 16-byte piece of a row comes from a
non-transposing ldmatrix; a register of two 16-bit elements from consecutive rows
(MN-major f16/bf16) from ldmatrix .trans; 32-bit elements of MN-major data from single
ld.shared.b32. Every ldmatrix plan is checked against tilegen.arch's ldmatrix table.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ..arch.ldmatrix import matrix_op
from ..arch.mma import MMA_ATOMS
from ..errors import IRError
from .builder import Builder

CHUNK = 16  # bytes per cp.async and per ldmatrix row
TRANSPOSE_BYTES = 4  # bytes per cp.async of a transposing copy: one 32-bit element


@dataclass(frozen=True)
class SharedAccess:
    """One warp-wide shared-memory instruction of a fragment load."""
    kind: str            # "ldmatrix" or "ld.shared.b32"
    regs: tuple          # ((i, j, r), ...) fragment registers it fills, in order
    trans: bool
    lanes: tuple         # per lane: (row, byte column) of the address it supplies

    @property
    def width(self) -> int:
        return CHUNK if self.kind == "ldmatrix" else 4


@dataclass(frozen=True)
class _Load:
    """What a fragment load's addresses depend on (so plans are cached across k-steps)."""
    atom: str
    operand: str
    tiles: tuple
    esize: int
    k_major: bool

    @property
    def map(self):
        a = MMA_ATOMS[self.atom]
        return {"A": a.a, "B": a.b, "C": a.c}[self.operand]

    @property
    def name(self) -> str:
        return f"{self.operand} fragment of {self.atom}"


def stored_bytes(ld: _Load, i, j, lane, r, e):
    """(stored row, byte column) of element e of register r of atom (i, j), relative to the
    fragment origin, in the shared tile's memory order."""
    row, col = ld.map.coord(lane, r, e)
    if ld.operand == "A":
        m, k = 16 * i + row, col
        sr, sc = (m, k) if ld.k_major else (k, m)
    else:
        k, n = row, 8 * j + col
        sr, sc = (n, k) if ld.k_major else (k, n)
    return sr, sc * ld.esize


def register_list(frag):
    tm, tn = frag.tiles
    return [(i, j, r) for i in range(tm) for j in range(tn) for r in range(frag.map.regs)]


def _block_origin(ld: _Load, i, j, r):
    """The 8-row x 16-byte block of shared memory register r of atom (i, j) comes from."""
    cells = [stored_bytes(ld, i, j, lane, r, e) for lane in range(32) for e in range(ld.map.elems)]
    return min(c[0] for c in cells), min(c[1] for c in cells)


def _check_ldmatrix(ld: _Load, group, origins, trans):
    """The ldmatrix table must deliver exactly the atom's fragment, halves in order."""
    table = matrix_op("ldmatrix", len(group), trans).fragment
    for slot, (i, j, r) in enumerate(group):
        for lane in range(32):
            got = []  # 16-bit units, low half first, as ldmatrix fills the register ...
            for e16 in range(2):
                mrow, mcol = table.coord(lane, slot, e16)
                got.append((origins[slot][0] + mrow - 8 * slot, origins[slot][1] + 2 * mcol))
            want = []  # ... and as the atom wants them, element 0 in the low bits
            for e in range(ld.map.elems):
                sr, sc = stored_bytes(ld, i, j, lane, r, e)
                for byte in range(0, max(ld.esize, 2), 2):
                    unit = (sr, sc + byte - (sc + byte) % 2)
                    if unit not in want:
                        want.append(unit)
            if got != want:
                raise IRError(f"{ld.name}: ldmatrix{'.trans' if trans else ''} would not deliver register {r} "
                              f"of atom ({i},{j}) to lane {lane} (gets {got}, needs {want})")


def fragment_accesses(op) -> list[SharedAccess]:
    """The shared loads a LoadFragment becomes, with each lane's address."""
    frag = op.frag
    return _plan(_Load(frag.atom.name, frag.operand, tuple(frag.tiles), op.src.dtype.bytes, op.k_major))


@lru_cache(maxsize=None)
def _plan(ld: _Load) -> list[SharedAccess]:
    tm, tn = ld.tiles
    regs = [(i, j, r) for i in range(tm) for j in range(tn) for r in range(ld.map.regs)]
    if ld.esize == 4 and not ld.k_major:
        return [SharedAccess("ld.shared.b32", ((i, j, r),), False,
                             tuple(stored_bytes(ld, i, j, lane, r, 0) for lane in range(32)))
                for (i, j, r) in regs]
    if ld.esize == 1 and not ld.k_major:
        raise IRError(f"{ld.name}: 8-bit operands must be K-major in shared memory")
    trans = ld.esize == 2 and not ld.k_major
    out = []
    for g0 in range(0, len(regs), 4):
        group = regs[g0:g0 + 4]
        if len(group) == 3:
            raise IRError(f"{ld.name}: {len(regs)} registers do not split into ldmatrix .x1/.x2/.x4")
        origins = [_block_origin(ld, i, j, r) for (i, j, r) in group]
        _check_ldmatrix(ld, group, origins, trans)
        lanes = []
        for lane in range(32):  # lane l supplies row (l & 7) of matrix l >> 3
            slot = (lane >> 3) % len(group)  # .x1/.x2 ignore the upper lanes
            lanes.append((origins[slot][0] + (lane & 7), origins[slot][1]))
        out.append(SharedAccess("ldmatrix", tuple(group), trans, tuple(lanes)))
    return out


def copy_chunk(b, c, layout):
    """(row, byte column) of chunk number c of a stage, with `b` a Builder: Values give
    instructions, Python ints give ints. Chunks are numbered panel by panel, row by row
    inside a panel, so 8 consecutive threads fill one 128-byte bank line of a panel (the
    16-byte stores of a quarter-warp then hit 32 distinct banks) and read contiguous global
    segments of at least 32 bytes."""
    per_panel_row = layout.panel_bytes // CHUNK if layout.swizzle else layout.row_bytes // CHUNK
    per_panel = layout.rows * per_panel_row
    panel = b.div(c, per_panel)
    inner = b.rem(c, per_panel)
    row = b.div(inner, per_panel_row)
    col = b.mad(panel, per_panel_row, b.rem(inner, per_panel_row))
    return row, b.mul(col, CHUNK)


def copy_chunks(tile, threads: int, i: int):
    """For copy iteration i: per thread, the (row, byte column) of the chunk it moves."""
    return _chunks(tile.layout, threads, i)


@lru_cache(maxsize=None)
def _chunks(layout, threads: int, i: int):
    b = Builder([])  # ints fold: no instructions are made
    return tuple(copy_chunk(b, t + i * threads, layout) for t in range(threads))


def copy_iterations(tile, threads: int) -> int:
    total = tile.layout.rows * tile.layout.row_bytes // CHUNK
    if total % threads:
        raise IRError(f"{tile.name}: {total} 16-byte chunks do not split evenly over {threads} threads")
    return total // threads


# ---- transposing copies -------------------------------------------------------------------
# The stage holds the tensor's block transposed, one 4-byte element per cp.async. A warp
# moves an 8-row x 16-byte block of the stage: lane l the element at row (l & 7), bytes
# 4 (l >> 3): in the tensor, 4 rows of 8 consecutive elements (four full 32-byte sectors);
# in a swizzled stage, 8 rows whose chunk is permuted by the row, so the 32 words land in
# 32 banks. Warp w takes blocks w, w + warps, ... (numbered row-block by row-block), so with
# as many warps as a row has chunks (or a multiple) each warp keeps its chunk column and
# every iteration steps a whole number of swizzle periods down the stage.

def transpose_element(b, t, layout, threads: int, i: int = 0):
    """(row, byte column) in the stage of the element thread t moves in iteration i of a
    transposing copy, with `b` a Builder (Values give instructions, ints fold)."""
    per_row = layout.row_bytes // CHUNK
    block = b.add(b.shr(t, 5), (threads // 32) * i)
    lane = b.and_(t, 31)
    row = b.mad(b.div(block, per_row), 8, b.and_(lane, 7))
    col = b.mad(b.rem(block, per_row), CHUNK, b.mul(b.shr(lane, 3), TRANSPOSE_BYTES))
    return row, col


@lru_cache(maxsize=None)
def transpose_elements(layout, threads: int, i: int):
    """For iteration i of a transposing copy: per thread, the (row, byte column) it moves."""
    b = Builder([])
    return tuple(transpose_element(b, t, layout, threads, i) for t in range(threads))


def transpose_iterations(tile, threads: int) -> int:
    layout = tile.layout
    if layout.esize != TRANSPOSE_BYTES:
        raise IRError(f"{tile.name}: a transposing copy moves {TRANSPOSE_BYTES}-byte elements, "
                      f"not {layout.esize}-byte ones")
    blocks = (layout.rows // 8) * (layout.row_bytes // CHUNK)
    if layout.rows % 8 or threads % 32 or blocks % (threads // 32):
        raise IRError(f"{tile.name}: a transposing copy moves 8-row x 16-byte blocks, one per warp; "
                      f"{layout.rows} rows of {layout.row_bytes} bytes do not split evenly over {threads // 32} warps")
    return blocks // (threads // 32)
