"""Shared-memory tile layouts: where element (row, col) of a stage lives, in bytes.

A tile keeps its global memory order: `cols` is the contiguous dimension. With an XOR
swizzle of span S bytes (128B, 64B, 32B) the tile is cut into panels S bytes wide; each
panel stores its rows densely and the swizzle permutes the 16-byte chunks of a row by the
row's low bits, so that 16-byte copies and ldmatrix reads of 8 rows hit distinct banks.
"pad" keeps rows whole and adds 16 bytes to each; "none" packs rows densely.
Stages are 1024-byte aligned so every swizzle period starts on its boundary.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..arch.swizzle import SWIZZLE_MODES, Swizzle

STAGE_ALIGN = 1024
PAD_BYTES = 16


@dataclass(frozen=True)
class SmemLayout:
    rows: int
    cols: int      # contiguous elements per row
    esize: int     # bytes per element
    mode: str      # "128B", "64B", "32B", "pad", "none"
    pad: int = PAD_BYTES  # bytes added to each row in "pad" mode (a multiple of 16)

    def __post_init__(self):
        if self.mode in SWIZZLE_MODES:
            span = SWIZZLE_MODES[self.mode].span
            if self.row_bytes % span:
                raise ValueError(f"rows of {self.row_bytes} bytes are not a multiple of the {self.mode} span; allowed: "
                                 f"rows of a multiple of {span} bytes, or a narrower swizzle, 'pad' or 'none'")
            if (self.rows * span) % SWIZZLE_MODES[self.mode].period:
                raise ValueError(f"{self.rows} rows do not fill whole {self.mode} swizzle periods")
        elif self.mode not in ("pad", "none"):
            raise ValueError(f"swizzle={self.mode!r}; allowed: {', '.join(repr(m) for m in SWIZZLE_MODES)}, 'pad', 'none'")
        if self.pad <= 0 or self.pad % 16:
            raise ValueError(f"padding of {self.pad} bytes: rows must stay 16-byte aligned (16, 32, ...)")

    @property
    def row_bytes(self) -> int:
        return self.cols * self.esize

    @property
    def swizzle(self) -> Swizzle | None:
        return SWIZZLE_MODES.get(self.mode)

    @property
    def panel_bytes(self) -> int:
        """Width of one panel in bytes (the whole row when not swizzled)."""
        swz = self.swizzle
        return swz.span if swz else self.row_stride

    @property
    def row_stride(self) -> int:
        """Bytes between consecutive rows inside a panel."""
        if self.mode == "pad":
            return self.row_bytes + self.pad
        if self.swizzle:
            return self.swizzle.span
        return self.row_bytes

    @property
    def bytes(self) -> int:
        if self.swizzle:
            return self.rows * self.row_bytes
        return self.rows * self.row_stride

    @property
    def stage_bytes(self) -> int:
        return -(-self.bytes // STAGE_ALIGN) * STAGE_ALIGN

    def offset(self, row, col_byte):
        """Byte offset of byte `col_byte` of row `row` within one stage (ints or numpy arrays)."""
        swz = self.swizzle
        if swz is None:
            return row * self.row_stride + col_byte
        span = swz.span
        linear = (col_byte // span) * (self.rows * span) + row * span + col_byte % span
        return swz(linear)

    def element_offset(self, row, col):
        return self.offset(row, col * self.esize)
