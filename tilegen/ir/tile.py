"""Tile level of the IR: global tensors, shared tiles, register fragments and the ops
that move and multiply them. Passes lower these to instructions (ir/instr.py)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..arch.dtypes import DType
from ..arch.mma import MmaAtom
from .layout import STAGE_ALIGN, SmemLayout
from .values import Value


# -- objects ---------------------------------------------------------------------------------
@dataclass(eq=False)
class Param:
    """A scalar kernel parameter (.param .u32 / .f32 / .u64), loaded into `value` at the
    kernel's entry; a pointer to global memory is also converted to a global address,
    `global_value` (cvta.to.global)."""

    name: str
    type: str  # "u32", "s32", "f32", "u64"
    value: Value
    global_value: Optional[Value] = None


@dataclass(eq=False)
class GlobalTensor:
    """A 2-D matrix in global memory, as stored: `rows` x `cols`, `cols` contiguous,
    `ld` elements between rows. `logical` says how the kernel indexes it: "row" means
    logical (r, c) is stored (r, c); "col" means it is stored (c, r)."""

    name: str
    dtype: DType
    ptr: Value        # b64 global address
    rows: Value       # stored rows (b32)
    cols: Value       # stored columns (b32)
    ld: Value         # b32, elements
    logical: str = "row"
    shape_names: tuple = ()  # the logical (rows, cols) size symbols, e.g. ("M", "K")
    batch: Optional["TensorBatch"] = None   # a matrix of a stack (dsl/batched.py): which one

    def stored(self, r, c):
        return (r, c) if self.logical == "row" else (c, r)


@dataclass(eq=False)
class TensorBatch:
    """What makes a tensor one matrix of a stack: the stack's first matrix (whose pointer its
    tensor maps take), the stack's stride (elements between matrices) and count, and this
    matrix's TMA coordinate (its index, 0 where the stride is 0: every index reads matrix 0).
    TMA reaches it through a 3-D map (cols, rows, matrices), so boxes stop at its edges."""

    stack: "GlobalTensor"
    stride: Value     # b32 parameter, elements
    count: str        # the size symbol of the matrices (a parameter once a tensor map needs it)
    coord: Value      # b32


@dataclass(eq=False)
class GlobalVector:
    """A 1-D array in global memory of `length` elements (bias vectors)."""

    name: str
    dtype: DType
    ptr: Value        # b64 global address
    length: Value     # b32


@dataclass(eq=False)
class ArrayDecl:
    """A memory parameter as the kernel declared it (kept in declaration order): what a call
    of the kernel on arrays takes for it (compiler/arrays.py). `kind` is "matrix" (a tensor),
    "stack" (a batched tensor: its matrices `stride` elements apart, `count` of them),
    "vector", "counters" (u32, zero before the launch) or "scalar" (one f32 in memory)."""

    name: str
    kind: str
    ptr: Value                              # the pointer parameter's register
    tensor: Optional[GlobalTensor] = None   # a matrix's or a stack's (its first matrix)
    vector: Optional[GlobalVector] = None
    stride: Optional[Value] = None          # a stack's
    count: str = ""                         # a stack's size symbol of the matrices


@dataclass(eq=False)
class SharedTile:
    """`stages` copies of a tile with `layout`, at byte `offset` of the kernel's shared memory."""

    name: str
    dtype: DType
    layout: SmemLayout
    stages: int
    offset: int = 0   # assigned by the shared-memory allocation pass
    align: int = STAGE_ALIGN   # of its offset: whole swizzle periods; 16 for a staged vector

    @property
    def bytes(self) -> int:
        if self.align < STAGE_ALIGN:   # a small one-stage tile (a staged vector) takes its own bytes
            return self.layout.bytes * self.stages
        return self.layout.stage_bytes * self.stages


@dataclass(eq=False)
class Fragment:
    """A warp's registers for a grid of `tiles` = (tm, tn) mma atoms of one operand.

    A covers (16*tm) x atom.k, B covers atom.k x (8*tn), C covers (16*tm) x (8*tn).
    regs[(i, j)] lists the atom's registers for atom (i, j)."""

    name: str
    atom: MmaAtom
    operand: str       # "A", "B" or "C"
    tiles: tuple       # (tm, tn); A uses (tm, 1), B (1, tn)
    regs: dict = field(default_factory=dict)

    def __post_init__(self):
        if not self.regs:  # one register Value per atom register, named for the PTX reader
            tm, tn = self.tiles
            self.regs = {(i, j): [Value(self.reg_type, f"{self.name}") for _ in range(self.map.regs)]
                         for i in range(tm) for j in range(tn)}

    @property
    def map(self):
        return {"A": self.atom.a, "B": self.atom.b, "C": self.atom.c}[self.operand]

    @property
    def reg_type(self) -> str:
        if self.operand == "C" and self.atom.acc_type.bits == 32:
            return "f32"
        return "b32"


@dataclass(eq=False)
class MBarrier:
    """`stages` mbarriers in shared memory (8 bytes each, at byte `offset`, set by the
    allocation pass). A phase of one completes when `arrivals` threads have arrived and the
    bytes its arrivals announced (expect_tx) have landed; then the next phase begins. Every
    barrier is initialised at the kernel's entry, before any op uses it."""

    name: str
    stages: int
    arrivals: int
    offset: int = 0

    BYTES = 8


@dataclass(eq=False)
class TensorMap:
    """A TMA descriptor of `tensor` (a CUtensorMap, 128 bytes, a kernel parameter passed by
    value) whose box is `box_rows` x `box_cols` stored elements, written to shared memory
    with `swizzle` ("128B", "64B", "32B" or "none"). The host builds it at each launch from
    the tensor's pointer, extents and pitch; elements outside the tensor arrive as zeros."""

    name: str            # the parameter's name
    tensor: GlobalTensor
    box_rows: int
    box_cols: int
    swizzle: str
    param: Optional[Param] = None
    batch: Optional[TensorBatch] = None   # a stack's map: 3-D, boxes of one matrix (TensorBatch)

    BYTES = 128
    ALIGN = 64


# Activations a StoreFragment applies (ir/lower/activations.py emits each). "gelu" names
# PyTorch's default GELU, the erf form.
ACTIVATIONS = ("none", "relu", "gelu_tanh", "gelu_erf", "silu")
ACTIVATION_ALIASES = {"gelu": "gelu_erf"}


def canonical_activation(name):
    """The ACTIVATIONS entry `name` spells (aliases resolved), or None if it is none."""
    name = name.lower() if isinstance(name, str) else name   # (ReLU, GELU, None as well)
    name = ACTIVATION_ALIASES.get(name, name) if isinstance(name, str) else name
    return name if name in ACTIVATIONS else None


def activation_choices() -> str:
    """The legal spellings, for messages."""
    return ", ".join(ACTIVATIONS + tuple(f"{a} (= {c})" for a, c in ACTIVATION_ALIASES.items()))


# -- ops -------------------------------------------------------------------------------------
@dataclass(eq=False)
class TileOp:
    loc: str = field(default="", kw_only=True)       # user source "file:line"
    comment: str = field(default="", kw_only=True)


@dataclass(eq=False)
class CopyAsync(TileOp):
    """Copy one stage of `dst` from the stored block of `src` at (row0, col0), 16 bytes
    per cp.async, zero-filling whatever lies outside src's rows x cols. A front-end that
    knows the block's rows (or columns) lie inside the tensor clears check_rows (check_cols)
    and the bounds test of that dimension is left out. With `transpose` the stage holds the
    block transposed (src's stored rows become the stage's stored columns), each 4-byte
    element moved by its own cp.async; row0/col0 and the checks still name src's stored
    dimensions."""

    dst: SharedTile
    stage: object      # Value or int
    src: GlobalTensor
    row0: object       # stored row of the block (Value or int)
    col0: object       # stored column
    check_rows: bool = True
    check_cols: bool = True
    transpose: bool = False


@dataclass(eq=False)
class CommitGroup(TileOp):
    pass


@dataclass(eq=False)
class WaitGroup(TileOp):
    pending: int


@dataclass(eq=False)
class Barrier(TileOp):
    """bar.sync: every thread of the CTA, or inside a warp role the role's `threads` threads
    on their own barrier `ident` (1..15; 0 is the CTA's)."""

    ident: int = 0
    threads: int = 0


@dataclass(eq=False)
class FillFragment(TileOp):
    frag: Fragment
    value: float = 0.0


@dataclass(eq=False)
class LoadFragment(TileOp):
    """Load `frag` from one stage of `src`. (row0, k0) is the fragment's origin in the
    operand's logical coordinates: (m, k) for A, (k, n) for B. Either may be a Value."""

    frag: Fragment
    src: SharedTile
    stage: object
    row0: object
    col0: object
    k_major: bool = True   # the shared tile's contiguous dimension is K
    round_tf32: bool = True  # tf32 atoms: round on load (cvt.rna); off when a SplitTF32 follows


@dataclass(eq=False)
class LoadAccumulator(TileOp):
    """frag = (or with `add`, +=) one stage of the row-major shared tile `src` at the fragment's
    elements' (row0 + r, col0 + c), widened to f32: an accumulator read back from shared memory
    (another warp's part, written there by StoreStage)."""

    frag: Fragment
    src: SharedTile
    stage: object
    row0: object
    col0: object
    add: bool = False


@dataclass(eq=False)
class SplitTF32(TileOp):
    """`hi` holds f32 values; afterwards hi = tf32(x) and lo = tf32(x - tf32(x)), so that
    hi + lo carries about 21 of x's 24 significant bits (3xTF32). With `finite_hi`, the parts
    of a product summed in one accumulator (gemm/prepare.py): finite_hi = hi where x is
    finite, else 0, and lo = 0 where x is not finite, so that no correction term is inf * 0."""

    hi: Fragment
    lo: Fragment
    finite_hi: Optional[Fragment] = None


@dataclass(eq=False)
class Mma(TileOp):
    """acc += a @ b; with accumulate=False, acc = a @ b (the old acc is not read)."""
    acc: Fragment
    a: Fragment
    b: Fragment
    accumulate: bool = True


@dataclass(eq=False)
class Wgmma(TileOp):
    """acc += A @ B for a warpgroup (sm_90a), B read from shared memory.

    A is the 64 x shape.k slice of stage `a_stage` of `a` at logical (a_m0, k0), or, when
    `a` is a Fragment, each warp's 16 x shape.k rows of it in registers (a_stage, a_m0 None);
    B is the shape.k x shape.n slice of stage `b_stage` of `b` at logical (k0, b_n0). The
    origins are the warpgroup's; acc is each warp's (1, n / 8) grid of m16n8 accumulator
    atoms (its 16 rows of the 64). The instruction only starts the work: the registers and
    shared memory stay in use until a WgmmaWait retires its group."""

    acc: Fragment
    a: object          # SharedTile, or Fragment (A from registers)
    a_stage: object
    a_m0: object
    k0: int
    b: SharedTile
    b_stage: object
    b_n0: object
    a_k_major: bool
    b_k_major: bool
    shape: object      # arch.wgmma.WgmmaShape
    accumulate: bool = True


@dataclass(eq=False)
class WgmmaFence(TileOp):
    """Order earlier register accesses of accumulators before the wgmmas that follow."""


@dataclass(eq=False)
class WgmmaCommit(TileOp):
    """Close the wgmmas issued since the last commit into one group."""


@dataclass(eq=False)
class WgmmaWait(TileOp):
    """Wait until at most `pending` wgmma groups of this warpgroup are in flight."""
    pending: int


@dataclass(eq=False)
class FenceProxyAsync(TileOp):
    """Make this thread's completed shared-memory writes (st.shared, retired cp.async)
    visible to the async proxy, which wgmma reads through."""


@dataclass(eq=False)
class TmaStore(TileOp):
    """One thread stores stage `stage` of `src` to the block of `tmap`'s tensor at stored
    (row0, col0) with TMA, one box per swizzle panel; elements outside the tensor are not
    written. The stores join this thread's bulk group (TmaStoreCommit)."""

    src: SharedTile
    stage: object
    tmap: TensorMap
    row0: object
    col0: object
    matrix: object = 0   # the matrix of a stack's map (TensorBatch.coord)


@dataclass(eq=False)
class TmaStoreCommit(TileOp):
    """Close this thread's TMA stores issued since the last commit into a bulk group."""


@dataclass(eq=False)
class TmaStoreWait(TileOp):
    """Wait until at most `pending` of this thread's bulk groups still read shared memory
    (their sources may then be written again), or with `writes`, until at most `pending`
    are not complete (their writes to global memory done and visible to this thread, which
    may then publish them to other CTAs)."""

    pending: int = 0
    writes: bool = False


@dataclass(eq=False)
class SetMaxRegisters(TileOp):
    """setmaxnreg (sm_90a): the warpgroups that run it take (increase) or give back
    (not increase) registers, to `count` per thread."""

    count: int
    increase: bool


# -- TMA and mbarriers (sm_90): ir/lower/tma.py, ir/lower/mbarrier.py -------------------------
# MBarrierArrive.one_per: the units of which one thread (the first) arrives, and their threads
ONE_PER = {"warp": 32, "warpgroup": 128}


@dataclass(eq=False)
class MBarrierArrive(TileOp):
    """Arrive on stage `stage` of `bar`: every thread that runs it, or with `single` one
    thread (the first of those that run it). `expect_bytes` > 0 also announces that many
    bytes of TMA copies completing on this phase (mbarrier.arrive.expect_tx)."""

    bar: MBarrier
    stage: object        # Value or int
    expect_bytes: int = 0
    single: bool = False
    cta: object = None   # the cluster rank (Value or int) whose barrier it is; None: this CTA's
    one_per: str = ""    # a key of ONE_PER: one thread of each warp / warpgroup (its first) arrives


@dataclass(eq=False)
class MBarrierWait(TileOp):
    """Wait until the phase of stage `stage` of `bar` whose parity is `parity` (0 or 1, a
    Value or int) has completed: the phases complete in order 0, 1, 0, 1, ..."""

    bar: MBarrier
    stage: object
    parity: object


@dataclass(eq=False)
class ClusterSync(TileOp):
    """Every thread of every CTA of the cluster arrives, then waits for all the others
    (barrier.cluster.arrive + wait): accesses before it, in any CTA, are ordered before
    those after it."""


@dataclass(eq=False)
class TmaLoad(TileOp):
    """One thread copies the stored block of `tmap`'s tensor at (row0, col0) into stage
    `stage` of `dst`, one TMA box per swizzle panel of the tile; the copies complete on
    stage `bar_stage` of `bar` (dst.layout.bytes of them). Elements outside the tensor
    arrive as zeros."""

    dst: SharedTile
    stage: object
    tmap: TensorMap
    row0: object         # stored row of the block
    col0: object         # stored column
    bar: MBarrier
    bar_stage: object
    multicast: object = None   # a mask of cluster ranks (Value or int): the boxes land in each of them
    part: object = 0           # this CTA copies part `part` of `parts` equal shares of the stage's panels
    parts: int = 1
    matrix: object = 0         # the matrix of a stack's map (TensorBatch.coord)


@dataclass(eq=False)
class StoreFragment(TileOp):
    """C[row0.., col0..] = act(alpha * frag + beta * C + bias) + residual, only the elements
    inside dst's rows x cols (beta == 0 never reads C). bias_axis "col" adds bias[col],
    "row" adds bias[row]; residual is read at the same (row, col) as C."""

    dst: GlobalTensor
    frag: Fragment
    row0: object
    col0: object
    alpha: Optional[Value] = None
    beta: Optional[Value] = None
    bias: Optional[GlobalVector] = None
    bias_axis: str = "col"
    activation: str = "none"
    residual: Optional[GlobalTensor] = None
    row_scale: Optional[GlobalVector] = None   # f32, one per row: frag * row_scale[row] * col_scale[col] first
    col_scale: Optional[GlobalVector] = None


@dataclass(eq=False)
class StoreRowVector(TileOp):
    """dst[row0 + r, col] = vec's row r for the rows inside dst's tensor, converted to its
    dtype: one lane of the lanes holding a row writes it (the one whose elements start it)."""

    dst: GlobalTensor
    vec: "RowVector"
    row0: object
    col: object


@dataclass(eq=False)
class AccumulateFragment(TileOp):
    """frag += src[row0.., col0..] for the f32 accumulator's elements inside src's rows x
    cols (those outside add nothing): partial sums written by other CTAs (split-K)."""

    src: GlobalTensor
    frag: Fragment
    row0: object
    col0: object


@dataclass(eq=False)
class StoreStage(TileOp):
    """Stage `stage` of `dst`[r, c] = alpha * frag[row0 + r, part's first column + c], in
    dst's dtype, for the columns of part `part` of `parts` equal slices of the fragment's
    atoms (ir/lower/store.py): the accumulator on its way to a TMA store."""

    dst: SharedTile
    stage: object
    frag: Fragment
    row0: object
    part: int = 0
    parts: int = 1
    alpha: Optional[Value] = None
    # The fused epilogue (as StoreFragment's): the slice goes to `out` at (out_row0, out_col0),
    # which places the bias and the residual and bounds their loads. The bias and the scales
    # may be StagedVectors: read from shared memory, indexed from the block's first row and
    # column (this slice's columns start at part * the slice's width).
    out: Optional[GlobalTensor] = None
    out_row0: object = 0
    out_col0: object = 0
    bias: Optional[GlobalVector] = None
    bias_axis: str = "col"
    activation: str = "none"
    residual: Optional[GlobalTensor] = None
    row_scale: Optional[GlobalVector] = None
    col_scale: Optional[GlobalVector] = None
    vector_buffer: object = 0   # which buffer of the staged vectors (StagedVector.buffers) it reads
    # A barrier inside the op: the staged vectors are read first, then `sync` (protecting dst
    # from its previous readers), then the values computed and stored, so the loads' latency
    # overlaps the wait. The staged vectors must be published before the op.
    sync: Optional[Barrier] = None


@dataclass(eq=False)
class StagedVector:
    """One block's slice of a global vector on its way to a TMA-store epilogue: `length`
    elements from the block's first row (or column), fetched by the `threads` threads from
    `first_thread` on well before the epilogue (FetchVector: thread t takes elements t, t +
    threads, ...), in the shared tile `tile` once the main loop is done (ParkVector), and read
    there by StoreStage, which indexes it from the block's first row or column. The loads'
    latency hides behind the main loop instead of the epilogue. With `buffers` = 2 the tile
    holds two blocks' slices: one block's can be fetched and parked while the previous one's
    is read.

    4-byte elements go straight into the tile with cp.async (`by_copy`), so no register load is
    in flight across the main loop's wgmma_fence (measured within noise of the register path);
    narrower ones (cp.async copies 4 bytes at least) go through registers, stored at ParkVector."""

    name: str
    vec: GlobalVector
    length: int
    tile: SharedTile    # one row of `length` elements of vec's dtype
    first_thread: int
    threads: int
    regs: list = field(default_factory=list)
    buffers: int = 1

    def __post_init__(self):
        if not self.regs and not self.by_copy:   # 16-bit elements sit in the low half of a b32 register
            self.regs = [Value("b32", self.name) for _ in range(self.per_thread)]

    @property
    def by_copy(self) -> bool:
        """Fetched with cp.async into the tile (4-byte elements), not through registers."""
        return self.vec.dtype.bytes == 4

    @property
    def per_thread(self) -> int:
        return -(-self.length // self.threads)


@dataclass(eq=False)
class FetchVector(TileOp):
    """vec[origin + element] for this thread's elements of sv (0 past the vector's end) into
    its registers, or with sv.by_copy into its tile: issued now, waited for at ParkVector."""

    sv: StagedVector
    origin: object
    buffer: object = 0


@dataclass(eq=False)
class ParkVector(TileOp):
    """sv's tile = what FetchVector loaded, each thread writing (or, by_copy, waiting for) its
    own elements; a barrier of the same threads must come before StoreStage reads the tile."""

    sv: StagedVector
    buffer: object = 0


# -- fragment arithmetic: softmax and attention (lowered by ir/lower/elementwise.py) ---------
def row_slots(atom: MmaAtom) -> tuple:
    """The rows of an accumulator atom that lane 0 holds, in order: (0, 8) for m16n8. Every
    lane holds as many rows, at the same offsets from its own first row."""
    cmap = atom.c
    return tuple(sorted({cmap.coord(0, r, e)[0] for r in range(cmap.regs) for e in range(cmap.elems)}))


@dataclass(eq=False)
class RowVector:
    """One f32 value per row of a (16*tm)-row accumulator fragment, held by the lanes that
    own the row (for m16n8 atoms: the 4 lanes of a quad). regs[(i, s)] is the value of row
    16*i + row_slots(atom)[s] + (the lane's row offset) of m-atom i."""

    name: str
    atom: MmaAtom
    tm: int
    regs: dict = field(default_factory=dict)

    def __post_init__(self):
        if not self.regs:
            self.regs = {(i, s): Value("f32", self.name) for i in range(self.tm)
                         for s in range(len(row_slots(self.atom)))}


ELEMENTWISE_FNS = ("copy", "add", "sub", "mul", "div", "max", "exp", "exp2", "add_if_finite")


@dataclass(eq=False)
class Elementwise(TileOp):
    """out = fn(x, y) element by element (unary fns: copy, exp, exp2 read x only).

    out is an f32 accumulator Fragment or a RowVector. x and y are each a Fragment of out's
    shape, a RowVector (broadcast along the columns of each row), a float constant or an
    f32 scalar Value. out may be one of its inputs (each element reads only its own)."""

    fn: str
    out: object
    x: object
    y: object = None


@dataclass(eq=False)
class RowReduce(TileOp):
    """out[row] = max or sum of src's elements in that row, over all of src's columns
    (within the lane, then across the lanes that share the row, with shfl.sync.bfly)."""

    fn: str            # "max" or "sum"
    out: RowVector
    src: Fragment


@dataclass(frozen=True)
class MaskLinear:
    """A sum of signed terms: "row", "col" (the element's coordinates), Values and ints."""

    terms: tuple       # ((+1 or -1, term), ...)


@dataclass(frozen=True)
class MaskCompare:
    rel: str           # "lt", "le", "gt", "ge", "eq", "ne" (signed 32-bit)
    lhs: MaskLinear
    rhs: MaskLinear


@dataclass(frozen=True)
class MaskLogic:
    op: str            # "and", "or", "not"
    args: tuple        # of MaskCompare / MaskLogic


@dataclass(eq=False)
class MaskFragment(TileOp):
    """out = value where cond(row, col) holds, else src. (row, col) are the element's
    coordinates: (row0, col0) plus its place in the fragment."""

    out: Fragment
    src: Fragment
    row0: object
    col0: object
    cond: object       # MaskCompare or MaskLogic
    value: float


@dataclass(eq=False)
class FragmentToOperand(TileOp):
    """dst (an A fragment, (tm, 1) atoms of dst.atom) = src's columns col0 .. col0 + dst.atom.k,
    rounded to dst's 16-bit type: register for register, no data leaves the lane."""

    dst: Fragment
    src: Fragment
    col0: int

