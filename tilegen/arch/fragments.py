"""Fragment maps: which lane holds which element of a warp-wide tile, in which register."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

WARP = 32


def group_id(lane: int) -> int:
    """PTX "groupID": the lane's row within an 8-row group."""
    return lane >> 2


def thread_in_group(lane: int) -> int:
    """PTX "threadID_in_group"."""
    return lane & 3


@dataclass(frozen=True)
class FragmentMap:
    """(lane, register, element-in-register) -> (row, col) of a `rows` x `cols` tile.

    Packed registers hold `elems` elements; element 0 sits in the low bits.
    For an mma operand B the tile is K x N, so (row, col) = (k, n).
    """

    name: str
    rows: int
    cols: int
    regs: int
    elems: int
    coords: tuple  # coords[lane][reg][elem] == (row, col)

    @classmethod
    def from_formula(cls, name: str, rows: int, cols: int, regs: int, elems: int,
                     where: Callable[[int, int, int], tuple[int, int]]) -> "FragmentMap":
        coords = tuple(
            tuple(tuple(where(lane, r, e) for e in range(elems)) for r in range(regs))
            for lane in range(WARP)
        )
        return cls(name, rows, cols, regs, elems, coords)

    def coord(self, lane: int, reg: int, elem: int = 0) -> tuple[int, int]:
        return self.coords[lane][reg][elem]

    def table(self):
        """numpy int array of shape (32, regs, elems, 2) holding (row, col)."""
        import numpy as np

        return np.array(self.coords, dtype=np.int64)

    def owners(self) -> dict[tuple[int, int], tuple[int, int, int]]:
        """(row, col) -> (lane, reg, elem); the inverse map."""
        out = {}
        for lane in range(WARP):
            for r in range(self.regs):
                for e in range(self.elems):
                    out[self.coords[lane][r][e]] = (lane, r, e)
        return out

    def is_bijection(self) -> bool:
        """Every element of the tile is held exactly once."""
        seen = [c for lane in self.coords for reg in lane for c in reg]
        full = {(r, c) for r in range(self.rows) for c in range(self.cols)}
        return len(seen) == len(full) and set(seen) == full

    def lane_grid(self) -> str:
        """The tile as text: each cell 'T<lane>:<reg>[.<elem>]'."""
        owners = self.owners()
        cells = []
        for r in range(self.rows):
            row = []
            for c in range(self.cols):
                lane, reg, e = owners[(r, c)]
                row.append(f"T{lane}:{reg}" + (f".{e}" if self.elems > 1 else ""))
            cells.append(row)
        width = max(len(x) for row in cells for x in row)
        head = " " * 5 + " ".join(f"{c:>{width}}" for c in range(self.cols))
        lines = [f"{self.name} ({self.rows}x{self.cols}; T<lane>:<register>"
                 + ("[.<element>]" if self.elems > 1 else "") + ")", head]
        for r, row in enumerate(cells):
            lines.append(f"{r:>4} " + " ".join(f"{x:>{width}}" for x in row))
        return "\n".join(lines)
