"""The DSL's handles on tensors, shared tiles and fragments."""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..ir import tile as T
from .scalars import Int, wrap


class Tensor:
    """A kernel parameter matrix. `shape` is logical (rows, cols); `layout` "row" stores
    rows contiguously, "col" stores columns contiguously (the transpose is row-major)."""

    def __init__(self, ir: T.GlobalTensor, shape: tuple):
        self.ir = ir
        self.shape = shape  # (Int, Int), logical
        self._transpose = None

    @property
    def layout(self) -> str:
        return self.ir.logical

    @property
    def dtype(self):
        return self.ir.dtype

    @property
    def T(self) -> "Tensor":
        """The transpose: the same memory indexed (col, row), with the other layout."""
        if self._transpose is None:
            flip = "col" if self.ir.logical == "row" else "row"
            ir = replace(self.ir, logical=flip, shape_names=self.ir.shape_names[::-1])
            self._transpose = Tensor(ir, self.shape[::-1])
            self._transpose._transpose = self
        return self._transpose

    def block(self, row, col) -> "Block":
        """The block whose top-left logical element is (row, col); its extent is that of
        the shared tile or fragment it meets."""
        return Block(self, wrap(row), wrap(col))


class Vector:
    """A 1-D kernel parameter array of `size` elements (a size symbol)."""

    def __init__(self, ir, size: str):
        self.ir = ir
        self.size = size


@dataclass
class Block:
    tensor: Tensor
    row: Int
    col: Int


class SharedTile:
    """`stages` buffers of a rows x cols tile in shared memory (cols contiguous)."""

    def __init__(self, ir: T.SharedTile, logical: str):
        self.ir = ir
        self.logical = logical  # "row": logical (r, c) stored at (r, c); "col": at (c, r)

    @property
    def T(self) -> "SharedTile":
        """The transpose: the same buffers indexed (col, row)."""
        return SharedTile(self.ir, "col" if self.logical == "row" else "row")

    @property
    def stage_bytes(self) -> int:
        """The bytes of one stage's data (what a TMA copy of a stage delivers)."""
        return self.ir.layout.bytes

    def stage(self, s) -> "Stage":
        return Stage(self, wrap(s))

    def __getitem__(self, s) -> "Stage":
        return self.stage(s)


@dataclass
class Stage:
    tile: SharedTile
    index: Int


class Fragment:
    """A warp's registers for a grid of mma atoms of one operand (A, B or C)."""

    def __init__(self, ir: T.Fragment):
        self.ir = ir

    @property
    def atom(self):
        return self.ir.atom

    @property
    def operand(self) -> str:
        return self.ir.operand

    @property
    def tiles(self) -> tuple:
        return self.ir.tiles
