"""TMA tensor maps (CUtensorMap, ptx.md 6.4-6.5, 7.4): the encoding's enums and limits, and
what a kernel declares of each map. The map itself is built at launch, from the tensor's
pointer, extents and pitch (runtime/tensormap.py on the GPU, sim/tma.py on the emulator).

A 2-D map of a matrix stored rows x cols (cols contiguous, `ld` elements between rows) lists
its dimensions innermost first: globalDim = (cols, rows), globalStrides = (ld * esize,),
boxDim = (box_cols, box_rows). The box is written to shared memory row by row (box_cols
contiguous), with the swizzle applied to the shared address; elements outside the matrix
arrive as zeros, and the transaction count is always the whole box.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

TENSOR_MAP_BYTES = 128
TENSOR_MAP_ALIGN = 64      # of the .param holding it (and of the host object cuTensorMapEncodeTiled fills)
BOX_MAX = 256              # elements per box dimension
ADDRESS_ALIGN = 16         # bytes, of the tensor's base address
STRIDE_ALIGN = 16          # bytes, of each global stride
STRIDE_LIMIT = 1 << 40     # global strides stay below this
DIM_LIMIT = 1 << 32        # elements per dimension, at most
SMEM_ALIGN = 128           # bytes, of the shared destination (1024 for 128B swizzle to match wgmma)

# CUtensorMapDataType: fp8 has no code of its own, it travels as UINT8.
DTYPE_CODE = {"f16": 6, "bf16": 9, "f32": 7, "tf32": 7, "e4m3": 0, "e5m2": 0}
# CUtensorMapSwizzle
SWIZZLE_CODE = {"none": 0, "32B": 1, "64B": 2, "128B": 3}
INTERLEAVE_NONE = 0
L2_PROMOTION_128B = 2
OOB_FILL_ZEROS = 0         # CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE: out-of-bounds elements read as zeros


@dataclass(frozen=True)
class TensorMapDecl:
    """A kernel's tensor-map parameter `param`, of the matrix `tensor` whose pointer, stored
    extents and pitch are the parameters (or size symbols) ptr, rows, cols and ld."""

    param: str
    tensor: str
    dtype: str
    esize: int
    ptr: str
    rows: str
    cols: str
    ld: str
    box_rows: int
    box_cols: int
    swizzle: str

    def to_data(self) -> dict:
        return asdict(self)

    @classmethod
    def from_data(cls, data: dict) -> "TensorMapDecl":
        return cls(**data)

    def operand(self, args: dict) -> tuple:
        """(pointer, stored rows, stored cols, ld) of this launch's arguments."""
        ptr = args[self.ptr]
        return int(ptr.ptr if hasattr(ptr, "ptr") else ptr), int(args[self.rows]), int(args[self.cols]), int(args[self.ld])

    def pitch(self, rows: int, cols: int, ld: int) -> int:
        """The row pitch in bytes the map gets: one row's pitch is never used, so a single-row
        matrix gets the smallest legal one."""
        if rows == 1:
            return -(-max(cols, 1) * self.esize // STRIDE_ALIGN) * STRIDE_ALIGN
        return ld * self.esize

    def problem(self, ptr: int, rows: int, cols: int, ld: int) -> Optional[str]:
        """Why TMA cannot describe this matrix, or None."""
        pitch = self.pitch(rows, cols, ld)
        if ptr % ADDRESS_ALIGN:
            return f"its address {ptr:#x} is not a multiple of {ADDRESS_ALIGN} bytes"
        if pitch % STRIDE_ALIGN:
            return f"its rows are {pitch} bytes apart, not a multiple of {STRIDE_ALIGN}"
        if not 0 < pitch < STRIDE_LIMIT:
            return f"its row pitch of {pitch} bytes is outside 1..2^40 - 1"
        if not (0 < rows <= DIM_LIMIT and 0 < cols <= DIM_LIMIT):
            return f"its extents {rows} x {cols} are outside 1..2^32"
        if rows > 1 and ld < cols:
            return f"its leading dimension {ld} is smaller than its {cols} columns"
        return None
