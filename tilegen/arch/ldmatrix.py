"""ldmatrix / stmatrix: warp-wide moves of 8x8 matrices of 16-bit elements.

| op       | .num       | .trans | min target | min PTX (with .shared) |
| -------- | ---------- | ------ | ---------- | ---------------------- |
| ldmatrix | x1, x2, x4 | either | sm_75      | 7.0 (6.5 in the ISA)   |
| stmatrix | x1, x2, x4 | either | sm_90      | 7.8                    |

Lanes 8i .. 8i+7 supply the 16-byte-aligned row addresses of matrix i. Register i of a
lane holds two elements of matrix i: without .trans (row lane/4, cols 2(lane%4) + {0,1});
with .trans (rows 2(lane%4) + {0,1}, col lane/4). Rows and columns are those of the
matrix as stored; matrix i occupies rows 8i .. 8i+7 of the map's tile.
"""
from __future__ import annotations

from dataclasses import dataclass

from .fragments import FragmentMap


@dataclass(frozen=True)
class MatrixLoad:
    op: str          # "ldmatrix" or "stmatrix"
    num: int         # matrices moved: 1, 2 or 4
    trans: bool
    min_sm: int
    min_ptx: tuple[int, int]
    fragment: FragmentMap  # (lane, reg, elem) -> (row, col) in the (8*num) x 8 stack

    @property
    def instruction(self) -> str:
        return (f"{self.op}.sync.aligned.m8n8.x{self.num}"
                + (".trans" if self.trans else "") + ".shared.b16")

    def row_address_lane(self, matrix: int, row: int) -> int:
        """The lane that supplies the address of `row` of `matrix`."""
        return 8 * matrix + row

    def address_lanes(self) -> range:
        return range(8 * self.num)


def _matrix_op(op: str, num: int, trans: bool) -> MatrixLoad:
    def where(lane, r, e):
        if trans:
            return 8 * r + 2 * (lane % 4) + e, lane // 4
        return 8 * r + lane // 4, 2 * (lane % 4) + e

    name = f"{op}.x{num}" + (".trans" if trans else "")
    frag = FragmentMap.from_formula(name, 8 * num, 8, num, 2, where)
    if op == "ldmatrix":
        return MatrixLoad(op, num, trans, 75, (7, 0), frag)
    return MatrixLoad(op, num, trans, 90, (7, 8), frag)


LDMATRIX = {(n, t): _matrix_op("ldmatrix", n, t) for n in (1, 2, 4) for t in (False, True)}
STMATRIX = {(n, t): _matrix_op("stmatrix", n, t) for n in (1, 2, 4) for t in (False, True)}


def matrix_op(op: str, num: int, trans: bool = False) -> MatrixLoad:
    table = {"ldmatrix": LDMATRIX, "stmatrix": STMATRIX}.get(op)
    if table is None or (num, bool(trans)) not in table:
        raise ValueError(f"unknown matrix op {op}.x{num}; allowed: ldmatrix/stmatrix x1, x2, x4 (.trans optional)")
    return table[(num, bool(trans))]
