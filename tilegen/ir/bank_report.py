"""Bank-conflict report of a tile-level kernel: for every shared-memory access a copy or a
fragment load becomes, the wavefronts one warp's instruction costs under tilegen.arch's
bank model, beside the ideal count.

Warp 0 is modelled at fragment origins that are known at compile time; an origin computed
at run time (a warp offset) is taken as 0, which keeps each row's position modulo the
8-row swizzle period whenever warp tiles are multiples of 8 rows, as tilegen's are.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..arch.banks import matrix_wavefronts, wavefronts
from ..errors import IRError
from . import tile as T
from .access import (TRANSPOSE_BYTES, copy_chunks, copy_iterations, fragment_accesses, transpose_elements,
                     transpose_iterations)
from .instr import walk


@dataclass(frozen=True)
class BankRow:
    what: str          # e.g. "cp.async sA" or "ldmatrix.x4 a <- sA"
    where: str         # the op's source line
    wavefronts: int
    ideal: int

    @property
    def conflict(self) -> float:
        return self.wavefronts / self.ideal


def _origin(x) -> int:
    return x if isinstance(x, int) else 0


def bank_report(kernel) -> list[BankRow]:
    rows: list[BankRow] = []
    seen = set()
    for op in walk(kernel.body):
        if isinstance(op, T.CopyAsync):
            tile = op.dst
            if ("copy", tile.name) in seen:
                continue
            seen.add(("copy", tile.name))
            worst = 0
            if op.transpose:  # every warp of the CTA: each moves its own blocks
                for i in range(transpose_iterations(tile, kernel.threads)):
                    lanes = transpose_elements(tile.layout, kernel.threads, i)
                    for w in range(0, kernel.threads, 32):
                        addrs = [tile.layout.offset(r, c) for r, c in lanes[w:w + 32]]
                        worst = max(worst, wavefronts(addrs, TRANSPOSE_BYTES))
                rows.append(BankRow(f"cp.async 4B transposing -> {tile.name}", op.loc, worst, 1))
                continue
            for i in range(copy_iterations(tile, kernel.threads)):
                lanes = copy_chunks(tile, kernel.threads, i)[:32]
                worst = max(worst, wavefronts([tile.layout.offset(r, c) for r, c in lanes], 16))
            rows.append(BankRow(f"cp.async 16B -> {tile.name}", op.loc, worst, 4))
        elif isinstance(op, T.LoadFragment):
            key = ("load", op.frag.name, op.src.name, op.col0 if isinstance(op.col0, int) else None,
                   op.row0 if isinstance(op.row0, int) else None)
            if key in seen:
                continue
            seen.add(key)
            frag, tile = op.frag, op.src
            if frag.operand == "A":
                o_row, o_col = (op.row0, op.col0) if op.k_major else (op.col0, op.row0)
            else:
                o_row, o_col = (op.col0, op.row0) if op.k_major else (op.row0, op.col0)
            r0, c0 = _origin(o_row), _origin(o_col) * tile.dtype.bytes
            worst, ideal, kind = 0, 1, ""
            for acc in fragment_accesses(op):
                addrs = [tile.layout.offset(r0 + r, c0 + c) for r, c in acc.lanes]
                if acc.kind == "ldmatrix":
                    num = len(acc.regs)
                    if any(a % 16 for a in addrs[:8 * num]):
                        raise IRError(f"fragment {frag.name} at ({op.row0}, {op.col0}) of {tile.name}: ldmatrix reads "
                                      f"16-byte rows of the tile, so the origin along its {tile.layout.cols}-element "
                                      f"rows must be a multiple of {16 // tile.dtype.bytes}"
                                      + (f" ({op.loc})" if op.loc else ""))
                    cost = matrix_wavefronts(addrs[:8 * num], num)
                    kind, ideal = f"ldmatrix.x{num}{'.trans' if acc.trans else ''}", num
                else:
                    cost = wavefronts(addrs, 4)
                    kind, ideal = "ld.shared.b32", 1
                worst = max(worst, cost)
            rows.append(BankRow(f"{kind} {frag.name} <- {tile.name} (k {_origin(op.col0 if frag.operand == 'A' else op.row0)})",
                                op.loc, worst, ideal))
    return rows


def format_bank_report(rows: list[BankRow]) -> str:
    if not rows:
        return "no shared-memory accesses"
    width = max(len(r.what) for r in rows)
    lines = [f"{'access':<{width}}  wavefronts  ideal  conflict  source"]
    for r in rows:
        lines.append(f"{r.what:<{width}}  {r.wavefronts:>10}  {r.ideal:>5}  {r.conflict:>7.1f}x  {r.where}")
    return "\n".join(lines)
