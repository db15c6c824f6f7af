"""Shared-memory addresses of tile elements, swizzle included, as instructions.

An address is split into a per-thread register part and a compile-time part. For swizzled
layouts the XOR only mixes a row's low bits into the 16-byte chunk field, so when the
compile-time row offset is a whole number of swizzle periods and the compile-time chunk
bits do not overlap the thread's own chunk bits, the address of every k-step and atom is

    (stage_base + T) ^ X + D

with T the thread's offset (one register, shared by all k-steps), X the compile-time chunk
bits (one xor) and D the compile-time rows and panels (the instruction's immediate). Cases
that do not fit fall back to computing the whole offset.
"""
from __future__ import annotations

from ..values import known_align


def emit_linear(b, layout, row, col_byte):
    """The offset of (row, col_byte) in a swizzled layout's panels before the XOR (ints fold)."""
    span = layout.swizzle.span
    panel = b.div(col_byte, span)
    return b.add(b.mad(panel, layout.rows * span, b.mul(row, span)), b.rem(col_byte, span))


def emit_offset(b, layout, row, col_byte):
    """The byte offset of (row, col_byte) in one stage of `layout` (Values or ints)."""
    swz = layout.swizzle
    if swz is None:
        return b.mad(row, layout.row_stride, col_byte)
    linear = emit_linear(b, layout, row, col_byte)
    mask = (1 << swz.bits) - 1
    return b.xor(linear, b.shl(b.and_(b.shr(linear, swz.base + swz.shift), mask), swz.base))


def stage_base(b, ctx, tile, stage):
    """Address of `stage` of `tile` in the shared window."""
    return b.add(b.add(ctx.smem, tile.offset), b.mul(stage, tile.layout.stage_bytes))


def _splits(layout, row, col):
    """The compile-time XOR bits X when the address splits as (thread part ^ X) + D, else None.

    Needed: the compile-time column sits in its own 16-byte chunks, its chunk bits and the
    compile-time row's swizzle-key bits are disjoint from every value the runtime parts can
    take (so sums are ORs there), and the runtime warp parts cannot reach those bits."""
    row_warp, _, row_values, row_ct = row
    col_warp, _, col_values, col_ct = col
    swz = layout.swizzle
    if swz is None:
        return 0
    span = swz.span
    cm = col_ct % span
    if cm % 16:
        return None
    key_shift = 7 - (span.bit_length() - 1)        # key = (row >> key_shift) & mask
    period_rows = 1 << (key_shift + swz.bits)      # rows after which the key repeats
    low = row_ct % period_rows                     # must add without carries: disjoint bits
    if low and known_align(row_warp) < period_rows:
        return None
    # the runtime column's warp part: its bits below the span must lie above the lane's and the
    # compile-time chunk's (a warp 64 bytes in, a chunk 32 bytes in: disjoint, no carries)
    col_align = min(known_align(col_warp), span)
    if any((v % span) & cm or v % span + cm >= col_align for v in col_values):
        return None
    if any(v & low for v in row_values):
        return None
    return cm ^ (((low >> key_shift) & ((1 << swz.bits) - 1)) << 4)


def shared_address(b, ctx, tile, stage, row, col):
    """(register, immediate) addressing element (row, col) of `stage` of `tile`.

    row = (runtime warp part, runtime lane part, the lane part's possible values,
    compile-time int); col likewise, in bytes. Per-thread parts are computed once per
    region and reused."""
    layout = tile.layout
    row_warp, row_lane, _, row_ct = row
    col_warp, col_lane, _, col_ct = col
    xor_bits = _splits(layout, row, col)
    if xor_bits is None:
        off = emit_offset(b, layout, b.add(b.add(row_warp, row_lane), row_ct),
                          b.add(b.add(col_warp, col_lane), col_ct))
        return b.add(cached_stage_base(b, ctx, tile, stage), off), 0
    key = ("thread", tile.name, value_key(stage), value_key(row_warp), value_key(row_lane), value_key(col_warp),
           value_key(col_lane), id(b.region))
    thread = ctx.addresses.get(key)
    if thread is None:
        off = emit_offset(b, layout, b.add(row_warp, row_lane), b.add(col_warp, col_lane))
        thread = b.add(cached_stage_base(b, ctx, tile, stage), off)
        ctx.addresses[key] = thread
    swz = layout.swizzle
    if swz is None:
        return thread, row_ct * layout.row_stride + col_ct
    span = swz.span
    disp = (col_ct // span) * layout.rows * span + row_ct * span
    return b.xor(thread, xor_bits), disp


def value_key(x):
    return ("int", x) if isinstance(x, int) else id(x)


def cached_stage_base(b, ctx, tile, stage):
    key = ("stage", tile.name, value_key(stage), id(b.region))
    if key not in ctx.addresses:
        ctx.addresses[key] = stage_base(b, ctx, tile, stage)
    return ctx.addresses[key]
