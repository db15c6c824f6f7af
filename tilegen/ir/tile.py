"""Tile level of the IR: global tensors, shared tiles, register fragments and the ops
that move and multiply them. Passes lower these to instructions (ir/instr.py)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..arch.dtypes import DType
from ..arch.mma import MmaAtom
from ..layout import SmemLayout
from .values import Value


# -- objects ---------------------------------------------------------------------------------
@dataclass(eq=False)
class Param:
    """A scalar kernel parameter (.param .u32 / .f32 / .u64)."""

    name: str
    type: str  # "u32", "s32", "f32", "u64"
    value: Value  # the register it is loaded into at entry


@dataclass(eq=False)
class GlobalTensor:
    """A 2-D matrix in global memory, as stored: `rows` x `cols`, `cols` contiguous,
    `ld` elements between rows. `logical` says how the kernel indexes it: "row" means
    logical (r, c) is stored (r, c); "col" means it is stored (c, r)."""

    name: str
    dtype: DType
    ptr: Value        # b64 global address
    rows: Value       # stored rows (b32)
    cols: Value       # stored columns (b32)
    ld: Value         # b32, elements
    logical: str = "row"
    shape_names: tuple = ()  # the logical (rows, cols) size symbols, e.g. ("M", "K")

    def stored(self, r, c):
        return (r, c) if self.logical == "row" else (c, r)


@dataclass(eq=False)
class SharedTile:
    """`stages` copies of a tile with `layout`, at byte `offset` of the kernel's shared memory."""

    name: str
    dtype: DType
    layout: SmemLayout
    stages: int
    offset: int = 0   # assigned by the shared-memory allocation pass

    @property
    def bytes(self) -> int:
        return self.layout.stage_bytes * self.stages


@dataclass(eq=False)
class Fragment:
    """A warp's registers for a grid of `tiles` = (tm, tn) mma atoms of one operand.

    A covers (16*tm) x atom.k, B covers atom.k x (8*tn), C covers (16*tm) x (8*tn).
    regs[(i, j)] lists the atom's registers for atom (i, j)."""

    name: str
    atom: MmaAtom
    operand: str       # "A", "B" or "C"
    tiles: tuple       # (tm, tn); A uses (tm, 1), B (1, tn)
    regs: dict = field(default_factory=dict)

    def __post_init__(self):
        if not self.regs:  # one register Value per atom register, named for the PTX reader
            tm, tn = self.tiles
            self.regs = {(i, j): [Value(self.reg_type, f"{self.name}") for _ in range(self.map.regs)]
                         for i in range(tm) for j in range(tn)}

    @property
    def map(self):
        return {"A": self.atom.a, "B": self.atom.b, "C": self.atom.c}[self.operand]

    @property
    def reg_type(self) -> str:
        if self.operand == "C" and self.atom.acc_type.bits == 32:
            return "f32"
        return "b32"


# -- ops -------------------------------------------------------------------------------------
@dataclass(eq=False)
class TileOp:
    loc: str = field(default="", kw_only=True)       # user source "file:line"
    comment: str = field(default="", kw_only=True)


@dataclass(eq=False)
class CopyAsync(TileOp):
    """Copy one stage of `dst` from the stored block of `src` at (row0, col0), 16 bytes
    per cp.async, zero-filling whatever lies outside src's rows x cols. A front-end that
    knows the block's rows (or columns) lie inside the tensor clears check_rows (check_cols)
    and the bounds test of that dimension is left out."""

    dst: SharedTile
    stage: object      # Value or int
    src: GlobalTensor
    row0: object       # stored row of the block (Value or int)
    col0: object       # stored column
    check_rows: bool = True
    check_cols: bool = True


@dataclass(eq=False)
class CommitGroup(TileOp):
    pass


@dataclass(eq=False)
class WaitGroup(TileOp):
    pending: int


@dataclass(eq=False)
class Barrier(TileOp):
    pass


@dataclass(eq=False)
class FillFragment(TileOp):
    frag: Fragment
    value: float = 0.0


@dataclass(eq=False)
class LoadFragment(TileOp):
    """Load `frag` from one stage of `src`. (row0, k0) is the fragment's origin in the
    operand's logical coordinates: (m, k) for A, (k, n) for B. Either may be a Value."""

    frag: Fragment
    src: SharedTile
    stage: object
    row0: object
    col0: object
    k_major: bool = True   # the shared tile's contiguous dimension is K


@dataclass(eq=False)
class Mma(TileOp):
    acc: Fragment
    a: Fragment
    b: Fragment


@dataclass(eq=False)
class StoreFragment(TileOp):
    """C[row0.., col0..] = alpha * frag + beta * C (beta == 0 never reads C), only the
    elements inside dst's rows x cols."""

    dst: GlobalTensor
    frag: Fragment
    row0: object
    col0: object
    alpha: Optional[Value] = None
    beta: Optional[Value] = None
