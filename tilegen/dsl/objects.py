"""The DSL's handles on tensors, shared tiles and fragments."""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..ir import tile as T
from .scalars import Int, wrap
from .trace import fail


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


# name -> function of the fragment arithmetic the operators below make (dsl/fragment_ops.py, which
# builds on this module, fills it when it is imported)
OPERATORS: dict = {}


class Arithmetic:
    """x + y, x - y, x * y, x / y and -x, element by element, on accumulator fragments and row
    vectors with numbers, tilegen.dsl.Float values, fragments and row vectors: the same ops as
    tilegen.dsl.add / sub / mul / div (each a new fragment or row vector). Comparisons have no
    meaning on a whole fragment: tilegen.dsl.maximum and tilegen.dsl.mask say what is meant."""

    def _op(self, fn: str, x, y):
        return OPERATORS[fn](x, y)

    def __add__(self, other):
        return self._op("add", self, other)

    def __radd__(self, other):
        return self._op("add", other, self)

    def __sub__(self, other):
        return self._op("sub", self, other)

    def __rsub__(self, other):
        return self._op("sub", other, self)

    def __mul__(self, other):
        return self._op("mul", self, other)

    def __rmul__(self, other):
        return self._op("mul", other, self)

    def __truediv__(self, other):
        return self._op("div", self, other)

    def __rtruediv__(self, other):
        return self._op("div", other, self)

    def __neg__(self):
        return self._op("scale", self, -1.0)

    def _compared(self, other):
        fail(f"{type(self).__name__.lower()}s are not compared as a whole (Python's max() and min() compare): "
             f"tilegen.dsl.maximum(x, y) takes the larger element by element, tilegen.dsl.mask(x, ...) sets "
             f"elements by their coordinates")

    __lt__ = __le__ = __gt__ = __ge__ = _compared


class Fragment(Arithmetic):
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
