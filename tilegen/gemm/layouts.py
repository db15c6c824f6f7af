"""The shared-memory layouts of a GEMM's operand stages: which tilegen.ir.layout mode each
operand of a GemmSpec takes."""
from __future__ import annotations

from ..ir.layout import PAD_BYTES, SmemLayout

# 32-bit MN-major operands are read with single 4-byte loads (ldmatrix cannot transpose 32-bit
# data): lanes t = 0..3 read rows t, lanes g = 0..7 read columns g. A row pitch of 8 words modulo
# 32 banks puts those 32 words in 32 banks (ptx.md 5.4); the XOR swizzles leave a 2-way conflict.
MN_32BIT_PAD = 32


def operand_mode(spec, operand: str) -> tuple[str, int]:
    """(layout mode, padding bytes) of operand "A" or "B" of a GemmSpec: its swizzle, except for
    32-bit MN-major operands copied with cp.async, which take rows padded by 32 bytes (unless
    swizzle="none"); TMA writes no padding, so theirs keep the swizzle (a 2-way conflict)."""
    if (spec.operand_dtype.bytes == 4 and not spec.is_k_major(operand) and spec.swizzle != "none"
            and spec.copy != "tma"):
        return "pad", MN_32BIT_PAD
    return spec.swizzle, PAD_BYTES


def smem_layout(spec, operand: str) -> SmemLayout:
    """The layout of one stage of operand "A" or "B" of a GemmSpec."""
    rows, cols = spec.operand_tile(operand)
    mode, pad = operand_mode(spec, operand)
    return SmemLayout(rows, cols, spec.operand_dtype.bytes, mode, pad)
