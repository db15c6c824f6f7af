"""wgmma (sm_90a): warpgroup matrix multiply with operands in shared memory.

One `wgmma.mma_async` multiplies a 64 x k slice of A by a k x N slice of B for a warpgroup
(4 consecutive warps, the first a multiple of 4); both operands are read from shared memory
through 64-bit matrix descriptors, the accumulator lives in registers:

| operands    | k  | N                   | accumulator | MN-major operands (transpose) |
| ----------- | -- | ------------------- | ----------- | ----------------------------- |
| f16 / bf16  | 16 | 8, 16, ..., 256     | f32         | yes (imm-trans-a / -b = 1)    |
| tf32        | 8  | 8, 16, ..., 256     | f32         | no: both operands K-major     |
| e4m3 / e5m2 | 32 | 8, 16, ..., 256     | f32         | no: both operands K-major;    |
|             |    |                     |             | A and B of either type        |

tf32 operands are 32-bit words of which the tensor cores read the top 19 bits: an f32 value
in shared memory is truncated (rounded toward zero) to tf32, not rounded to nearest.

Accumulator register i of warp w, lane (g = lane >> 2, t = lane & 3) holds
row 16w + g + 8((i >> 1) & 1), column 8(i >> 2) + 2t + (i & 1): per warp a 16 x N tile
laid out as N/8 mma.sync m16n8 C fragments side by side (ptx.md 6.2, checked on the H200).

Descriptor (ptx.md 6.3): bits 0-13 start address >> 4, 16-29 leading byte offset >> 4,
32-45 stride byte offset >> 4, 62-63 swizzle (1 = 128B, 2 = 64B, 3 = 32B). For tiles in the
panel layout of tilegen.layout (panels `span` bytes wide, rows dense inside a panel, the
XOR swizzle on addresses from a 1024-byte aligned base):

| operand major-ness | element (mn, k) is read at                                   | LBO         | SBO        |
| ------------------ | ------------------------------------------------------------ | ----------- | ---------- |
| K-major            | start + (mn // 8) SBO + (mn % 8) span + k * esize            | (unused) 16 | 8 * span   |
| MN-major           | start + (mn // P) LBO + (k // 8) SBO + (k % 8) span + (mn % P) esize, P = span / esize | panel bytes | 8 * span |

and the hardware applies the swizzle to that address. Advancing k inside a K-major row adds
the byte offset to the start address; MN-major k-steps of 16 rows add 2 * SBO.
"""
from __future__ import annotations

from dataclasses import dataclass

from .dtypes import FP8   # (A and B may mix these two)
from .swizzle import SWIZZLE_MODES

WARPGROUP = 4          # warps
M = 64                 # rows of A per instruction
K_BY_DTYPE = {"f16": 16, "bf16": 16, "tf32": 8, "e4m3": 32, "e5m2": 32}
TRANSPOSABLE = ("f16", "bf16")   # dtypes whose operands may be MN-major
N_RANGE = range(8, 257, 8)
SWIZZLE_CODE = {"128B": 1, "64B": 2, "32B": 3}
START_MASK = 0x3FFFF   # the descriptor addresses the 256 KB shared window in 16-byte units


@dataclass(frozen=True)
class WgmmaShape:
    """One m64nNk wgmma with both operands in shared memory and f32 accumulation."""

    dtype: str
    n: int
    b_dtype: str = ""   # B's dtype where it differs from A's (fp8 pairs); "" = dtype

    def __post_init__(self):
        if self.dtype not in K_BY_DTYPE:
            raise ValueError(f"wgmma operand dtype {self.dtype!r}; allowed: {', '.join(K_BY_DTYPE)}")
        if self.b_dtype and self.b_dtype != self.dtype and not (self.dtype in FP8 and self.b_dtype in FP8):
            raise ValueError(f"wgmma operands {self.dtype} x {self.b_dtype}: only fp8 (e4m3, e5m2) may mix")
        if self.n not in N_RANGE:
            raise ValueError(f"wgmma N = {self.n}; allowed: multiples of 8 from 8 to 256")

    @property
    def k(self) -> int:
        return K_BY_DTYPE[self.dtype]

    @property
    def acc_regs(self) -> int:
        """f32 accumulator registers per thread."""
        return self.n // 2

    @property
    def transposable(self) -> bool:
        """Whether the operands may be MN-major in shared memory (imm-trans-a / -b)."""
        return self.dtype in TRANSPOSABLE

    def instruction(self) -> str:
        return f"wgmma.mma_async.sync.aligned.m{M}n{self.n}k{self.k}.f32.{self.dtype}.{self.b_dtype or self.dtype}"


def descriptor_strides(mode: str, rows: int, k_major: bool) -> tuple[int, int]:
    """(leading, stride) byte offsets of an operand stored in the panel layout `mode`
    (a swizzle) with `rows` rows per panel."""
    if mode not in SWIZZLE_CODE:
        raise ValueError(f"wgmma operands need a swizzled layout ({', '.join(SWIZZLE_CODE)}), not {mode!r}")
    span = SWIZZLE_MODES[mode].span
    if k_major:
        return 16, 8 * span   # the leading offset is unused for swizzled K-major operands
    return rows * span, 8 * span


def descriptor_high(mode: str, leading: int, stride: int) -> tuple[int, int]:
    """The constant parts of a descriptor: (bits 16-31 of the low word, the high word)."""
    return ((leading & START_MASK) >> 4) << 16, ((stride & START_MASK) >> 4) | (SWIZZLE_CODE[mode] << 30)


def encode_descriptor(address: int, mode: str, leading: int, stride: int) -> int:
    lo_bits, hi = descriptor_high(mode, leading, stride)
    return ((address & START_MASK) >> 4) | lo_bits | (hi << 32)


@dataclass(frozen=True)
class Descriptor:
    """A decoded matrix descriptor."""

    start: int       # bytes
    leading: int     # bytes
    stride: int      # bytes
    mode: str        # "128B", "64B", "32B" or "none"

    @classmethod
    def decode(cls, d: int) -> "Descriptor":
        code = (d >> 62) & 3
        mode = {v: k for k, v in SWIZZLE_CODE.items()}.get(code, "none")
        return cls((d & 0x3FFF) << 4, ((d >> 16) & 0x3FFF) << 4, ((d >> 32) & 0x3FFF) << 4, mode)

    def address(self, mn, k, esize: int, k_major: bool):
        """Shared-memory byte address the hardware reads for element (mn, k) (ints or numpy arrays)."""
        if self.mode == "none":
            raise ValueError("descriptors without a swizzle are not modelled")
        swz = SWIZZLE_MODES[self.mode]
        span = swz.span
        if k_major:
            linear = self.start + (mn // 8) * self.stride + (mn % 8) * span + k * esize
        else:
            per = span // esize
            linear = (self.start + (mn // per) * self.leading + (k // 8) * self.stride
                      + (k % 8) * span + (mn % per) * esize)
        return swz(linear)


def accumulator_coord(warp: int, lane: int, i: int) -> tuple[int, int]:
    """(row, col) within the 64 x N result of accumulator register i of warp `warp` (0..3)."""
    g, t = lane >> 2, lane & 3
    return 16 * warp + g + 8 * ((i >> 1) & 1), 8 * (i >> 2) + 2 * t + (i & 1)
