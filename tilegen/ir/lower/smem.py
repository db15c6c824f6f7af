"""Shared-memory addresses of tile elements, swizzle included, as instructions."""
from __future__ import annotations


def emit_offset(b, layout, row, col_byte):
    """The byte offset of (row, col_byte) in one stage of `layout` (Values or ints)."""
    swz = layout.swizzle
    if swz is None:
        return b.mad(row, layout.row_stride, col_byte)
    span = swz.span
    panel = b.div(col_byte, span)
    linear = b.add(b.mad(panel, layout.rows * span, b.mul(row, span)), b.rem(col_byte, span))
    mask = (1 << swz.bits) - 1
    return b.xor(linear, b.shl(b.and_(b.shr(linear, swz.base + swz.shift), mask), swz.base))


def stage_base(b, ctx, tile, stage):
    """Address of `stage` of `tile` in the shared window."""
    return b.add(b.add(ctx.smem, tile.offset), b.mul(stage, tile.layout.stage_bytes))
