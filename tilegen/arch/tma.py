"""TMA tensor maps (CUtensorMap, ptx.md 6.4-6.5, 7.4): the encoding's enums and limits, and
what a kernel declares of each map. The map itself is built at launch, from the tensor's
pointer, extents and pitch (runtime/tensormap.py on the GPU, sim/tma.py on the emulator).

A 2-D map of a matrix stored rows x cols (cols contiguous, `ld` elements between rows) lists
its dimensions innermost first: globalDim = (cols, rows), globalStrides = (ld * esize,),
boxDim = (box_cols, box_rows). The box is written to shared memory row by row (box_cols
contiguous), with the swizzle applied to the shared address; elements outside the matrix
arrive as zeros, and the transaction count is always the whole box.

A stack of matrices (`count` of them, `stride` elements apart) is a 3-D map: globalDim =
(cols, rows, count), globalStrides = (ld * esize, stride * esize), boxDim = (box_cols,
box_rows, 1), so a box stops at its own matrix's edges. A stride of 0 (every index reads
matrix 0) is a map of one matrix, which kernels read at index 0.
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
    batch_stride: str = ""   # a stack's map (3-D): the parameters of its stride and its count
    batches: str = ""

    @property
    def rank(self) -> int:
        return 3 if self.batch_stride else 2

    def to_data(self) -> dict:
        return asdict(self)

    @classmethod
    def from_data(cls, data: dict) -> "TensorMapDecl":
        return cls(**data)

    @property
    def names(self) -> tuple:
        """The arguments a map is built from, by name: (pointer, stored rows, stored cols, ld),
        and for a stack (stride, count)."""
        return (self.ptr, self.rows, self.cols, self.ld) + ((self.batch_stride, self.batches) if self.rank == 3 else ())

    def operand(self, args: dict) -> tuple:
        """The values of `names` in this launch's arguments."""
        ptr = args[self.ptr]
        return (int(ptr.ptr if hasattr(ptr, "ptr") else ptr),) + tuple(int(args[n]) for n in self.names[1:])

    def stack(self, rows: int, cols: int, ld: int, stride: int, count: int) -> tuple:
        """(matrices, bytes between them) of a stack's third dimension: one matrix where the
        stride is 0 (a broadcast; its bytes then any legal value) or there is one."""
        if stride == 0 or count <= 1:
            return 1, max(rows, 1) * self.pitch(rows, cols, ld)
        return count, stride * self.esize

    def pitch(self, rows: int, cols: int, ld: int) -> int:
        """The row pitch in bytes the map gets: one row's pitch is never used, so a single-row
        matrix gets the smallest legal one."""
        if rows == 1:
            return -(-max(cols, 1) * self.esize // STRIDE_ALIGN) * STRIDE_ALIGN
        return ld * self.esize

    def problem(self, ptr: int, rows: int, cols: int, ld: int, stride: int = 0, count: int = 1) -> Optional[str]:
        """Why TMA cannot describe this matrix (or stack of them), or None."""
        if self.rank == 3:
            matrices, apart = self.stack(rows, cols, ld, stride, count)
            if apart % STRIDE_ALIGN:
                return f"its matrices are {apart} bytes apart, not a multiple of {STRIDE_ALIGN}"
            if not 0 < apart < STRIDE_LIMIT:
                return f"its matrices are {apart} bytes apart, outside 1..2^40 - 1"
            if not 0 < matrices <= DIM_LIMIT:
                return f"its {matrices} matrices are outside 1..2^32"
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
