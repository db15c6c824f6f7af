"""TMA copies and the mbarriers they complete on (sm_90): what a Hopper pipeline is made of.

    full = tilegen.dsl.mbarrier("full", stages=S)           # one arrival per phase
    tilegen.dsl.arrive(full[s], expect_bytes=sA.stage_bytes + sB.stage_bytes, single=True)
    tilegen.dsl.tma_load(sA[s], A.block(m0, k0), full[s])  # one thread issues each copy
    tilegen.dsl.tma_load(sB[s], B.block(k0, n0), full[s])
    tilegen.dsl.mbarrier_wait(full[s], parity)              # the phase of that parity completed

A barrier's phase completes when its `arrivals` arrivals came and the bytes announced with
expect_bytes landed; phases alternate parity 0, 1, 0, ... Barriers are initialised at the
kernel's entry. The emulator checks the protocol: a wait that can never complete, a stage
read before its copy completed, a copy into a stage still being read, announced bytes that
the copies do not deliver.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..arch.targets import target as _target
from ..ir import tile as T
from ..ir.layout import SmemLayout
from ..ir.values import Value
from .objects import Block, Fragment, Stage, Tensor, Vector
from .primitives import check_stage, scale_vectors, size, tile_op
from .scalars import Float, Int, raw, wrap
from .trace import current, fail

MAX_ARRIVALS = (1 << 20) - 1
MAX_TX_BYTES = (1 << 20) - 1
MAX_BOX = 256   # elements per dimension of a TMA box
SWIZZLE_ROWS = 8   # rows of one swizzle atom: a share of a stage's rows starts on one


class MBarrier:
    """`stages` mbarriers; bar[s] names one."""

    def __init__(self, ir: T.MBarrier):
        self.ir = ir

    def __getitem__(self, s) -> "BarrierStage":
        s = wrap(s)
        if isinstance(s.raw, int) and not 0 <= s.raw < self.ir.stages:
            fail(f"{self.ir.name}[{s.raw}]: it has {self.ir.stages} stage{'s' if self.ir.stages > 1 else ''}")
        return BarrierStage(self, s)


@dataclass
class BarrierStage:
    bar: MBarrier
    index: Int


def _needs_sm90(what: str):
    tgt = current().kernel.target
    try:
        sm = _target(tgt).sm
    except ValueError:
        return
    if sm < 90:
        fail(f"{what} needs an sm_90 target or newer (TMA and mbarriers are Hopper's); this kernel "
             f"is traced for {tgt}: compile it with target='sm_90a'")


def mbarrier(name: str, stages: int = 1, arrivals: int = 1) -> MBarrier:
    """Declare `stages` mbarriers in shared memory; a phase of each completes after
    `arrivals` arrivals (and the bytes announced for it)."""
    _needs_sm90("mbarrier")
    tr = current()
    if not isinstance(stages, int) or stages < 1:
        fail(f"mbarrier {name}: stages={stages!r}; allowed: an int >= 1")
    if not isinstance(arrivals, int) or not 1 <= arrivals <= MAX_ARRIVALS:
        fail(f"mbarrier {name}: arrivals={arrivals!r}; allowed: 1..{MAX_ARRIVALS}")
    if any(b.name == name for b in tr.kernel.barriers):
        fail(f"mbarrier {name!r} is declared twice")
    ir = T.MBarrier(name, stages, arrivals)
    tr.kernel.barriers.append(ir)
    return MBarrier(ir)


def arrive(bar: BarrierStage, expect_bytes: int = 0, single: bool = False, cta=None, one_per: str = ""):
    """Arrive on bar: every thread that runs this counts one arrival, or with single=True only
    one of them, or with one_per="warp" / "warpgroup" the first thread of each warp or
    warpgroup that runs it. expect_bytes announces the bytes of this phase's TMA copies.
    cta=r (an int or Int): the arrival goes to that barrier in the CTA of rank r of the
    cluster."""
    if not isinstance(bar, BarrierStage):
        fail("arrive(barrier[stage], expect_bytes=0, single=False, cta=None, one_per='')")
    if one_per and (one_per not in T.ONE_PER or single):
        fail(f"arrive: one_per={one_per!r}; allowed: 'warp' or 'warpgroup' (and not with single=True)")
    if not isinstance(expect_bytes, int) or not 0 <= expect_bytes <= MAX_TX_BYTES:
        fail(f"arrive: expect_bytes={expect_bytes!r}; allowed: 0..{MAX_TX_BYTES}")
    if cta is not None:
        size = _cluster_size()
        if size == 1:
            fail("arrive(..., cta=...): the kernel has no cluster; launch it with tilegen.dsl.launch(..., cluster=(2, 1, 1))")
        if expect_bytes:
            fail("arrive(..., cta=...): a remote arrival announces no bytes (expect_bytes on the CTA's own barrier)")
        c = raw(wrap(cta))
        if isinstance(c, int) and not 0 <= c < size:
            fail(f"arrive: cta={c}; the cluster has ranks 0..{size - 1}")
        cta = c
    tile_op(T.MBarrierArrive(bar.bar.ir, raw(bar.index), expect_bytes, bool(single), cta, one_per))


def _cluster_size() -> int:
    x, y, z = current().kernel.cluster
    return x * y * z


def mbarrier_wait(bar: BarrierStage, parity):
    """Wait until bar's phase of this parity (0 or 1) has completed. Phases alternate: the
    n-th completion (from 0) has parity n % 2."""
    if not isinstance(bar, BarrierStage):
        fail("mbarrier_wait(barrier[stage], parity)")
    p = raw(wrap(parity))
    if isinstance(p, int) and p not in (0, 1):
        fail(f"mbarrier_wait: parity={parity!r}; allowed: 0, 1 (or an Int that is)")
    if not isinstance(p, (int, Value)):
        fail(f"mbarrier_wait: parity={parity!r}; allowed: 0, 1 or an Int")
    tile_op(T.MBarrierWait(bar.bar.ir, raw(bar.index), p))


def _tensor_map(tensor, layout, box_rows: int = None) -> T.TensorMap:
    """The kernel's tensor map of `tensor` with the box of one panel of `layout` (or
    `box_rows` of its rows), made once; for a matrix of a stack, the stack's 3-D map."""
    tr = current()
    batch = tensor.batch
    if batch is not None:
        tensor = batch.stack
        size(batch.count)   # (the map's extent: a parameter from now on)
    box_rows = box_rows or layout.rows
    box_cols = layout.panel_bytes // layout.esize if layout.swizzle else layout.cols
    swizzle = layout.mode if layout.swizzle else "none"
    for m in tr.kernel.tensor_maps:
        if m.tensor.name == tensor.name and (m.box_rows, m.box_cols, m.swizzle, m.batch is None) == (
                box_rows, box_cols, swizzle, batch is None):
            return m
    count = sum(m.tensor.name == tensor.name for m in tr.kernel.tensor_maps)
    name = f"{tensor.name}_tmap" + (str(count) if count else "")
    param = T.Param(name, "tensormap", Value("b64", name))
    tmap = T.TensorMap(name, tensor, box_rows, box_cols, swizzle, param, batch)
    tr.kernel.params.append(param)
    tr.kernel.tensor_maps.append(tmap)
    return tmap


def tma_load(dst: Stage, src: Block, bar: BarrierStage, *, multicast: int = None, part=0, parts: int = 1):
    """One thread copies the block of `src` that matches the stage's extent into `dst` with
    TMA; the copies complete on `bar` (announce dst.tile.stage_bytes with arrive). Elements
    outside the tensor arrive as zeros. The stage keeps the tensor's memory order.

    In a cluster: multicast=mask (an int, bit r for the CTA of rank r) lands the copy in the
    same stage of every CTA of the mask, completing on the same barrier in each; part=i (int
    or Int) of parts=n copies only the i-th of n equal shares of the stage (of its 128-byte
    panels where n divides them, else of each panel's rows), so n CTAs that each multicast
    their share fill the stage together (each still announces the whole stage's bytes on its
    own barrier)."""
    _needs_sm90("tma_load")
    if not isinstance(dst, Stage) or not isinstance(src, Block) or not isinstance(bar, BarrierStage):
        fail("tma_load(tile[stage], tensor.block(r, c), barrier[stage], multicast=None, part=0, parts=1)")
    size = _cluster_size()
    if multicast is not None:
        if size == 1:
            fail("tma_load(..., multicast=...): the kernel has no cluster; launch it with "
                 "tilegen.dsl.launch(..., cluster=(2, 1, 1))")
        if not isinstance(multicast, int) or not 0 < multicast < (1 << size):
            fail(f"tma_load: multicast={multicast!r}; allowed: an int mask of the cluster's ranks, 1..{(1 << size) - 1}")
    if not isinstance(parts, int) or parts < 1:
        fail(f"tma_load: parts={parts!r}; allowed: an int >= 1")
    part = raw(wrap(part))
    if isinstance(part, int) and not 0 <= part < parts:
        fail(f"tma_load: part={part} of parts={parts}; allowed 0..{parts - 1}")
    tensor, tile = src.tensor, dst.tile
    if tensor.dtype != tile.ir.dtype:
        fail(f"tma_load: {tensor.ir.name} is {tensor.dtype}, {tile.ir.name} is {tile.ir.dtype}")
    if tensor.layout != tile.logical:
        fail(f"tma_load: {tensor.ir.name} is {tensor.layout}-major but {tile.ir.name} is declared "
             f"logical={tile.logical!r}: TMA keeps the tensor's memory order (declare the tile "
             f"logical={tensor.layout!r})")
    layout = _tma_layout_ok("tma_load", tile)
    panels = layout.row_bytes // layout.panel_bytes if layout.swizzle else 1
    box_rows = layout.rows
    if panels % parts:   # a share of each panel's rows, whole swizzle atoms (8 rows) of them
        box_rows = layout.rows // parts
        if layout.rows % parts or box_rows % SWIZZLE_ROWS:
            fail(f"tma_load: parts={parts} must divide {tile.ir.name}'s {panels} panel{'s' if panels > 1 else ''} "
                 f"(128-byte-wide column slices of its stored rows) or its {layout.rows} stored rows into shares of "
                 f"a multiple of {SWIZZLE_ROWS} rows")
    check_stage(dst)
    r0, c0 = tensor.ir.stored(src.row, src.col)
    tmap = _tensor_map(tensor.ir, layout, box_rows)
    tile_op(T.TmaLoad(tile.ir, raw(dst.index), tmap, raw(wrap(r0)), raw(wrap(c0)), bar.bar.ir, raw(bar.index),
                      multicast, part, parts, _matrix(tensor)))


def _tma_layout_ok(what: str, tile):
    layout = tile.ir.layout
    if layout.mode == "pad":
        fail(f"{what}: {tile.ir.name} has padded rows; TMA moves swizzled (128B, 64B, 32B) or dense "
             f"('none') tiles")
    cols = layout.panel_bytes // layout.esize if layout.swizzle else layout.cols
    if layout.rows > MAX_BOX or cols > MAX_BOX:
        fail(f"{what}: a box of {layout.rows} x {cols} elements; a TMA box has at most {MAX_BOX} per dimension")
    if not layout.swizzle and layout.row_bytes % 16:
        fail(f"{what}: {tile.ir.name}'s rows are {layout.row_bytes} bytes; TMA boxes need a multiple of 16")
    return layout


class StagedVector:
    """One block's slice of a vector, fetched early (4-byte elements by cp.async into shared
    memory, 16-bit ones into registers) and parked in shared memory for store_stage
    (staged_vector). A 4-byte fetch writes the tile at once: after the barrier that follows
    the last read of the previous slice."""

    def __init__(self, ir: T.StagedVector, vector: Vector):
        self.ir = ir
        self.vector = vector
        self.size = vector.size


def staged_vector(vec: Vector, length: int, name: str = "", buffers: int = 1) -> StagedVector:
    """Room for `length` elements of `vec` (a block's rows or columns) on their way to a
    TMA-store epilogue, spread over the threads of the current role (or the CTA):

        sb = tilegen.dsl.staged_vector(bias, BN)
        tilegen.dsl.fetch_vector(sb, n0)     # the loads start, before the main loop
        ...                               # the main loop hides their latency
        tilegen.dsl.park_vector(sb)           # into shared memory
        tilegen.dsl.barrier()
        tilegen.dsl.store_stage(..., bias=sb) # read from shared memory

    buffers=2 keeps two blocks' slices (fetch_vector / park_vector / store_stage name the
    buffer): the next block's can be parked, and published by a barrier the epilogue has
    anyway, while this block's is read.
    """
    tr = current()
    if not isinstance(vec, Vector):
        fail("staged_vector: vec must be a tilegen.dsl.vector(...)")
    if not isinstance(length, int) or length < 1:
        fail(f"staged_vector: length={length!r}; allowed: a positive int (the block's rows or columns)")
    if buffers not in (1, 2):
        fail(f"staged_vector: buffers={buffers!r}; allowed: 1 or 2")
    first, threads = getattr(tr, "role_threads", None) or (0, tr.kernel.threads)
    name = name or f"s{vec.ir.name}{len(tr.kernel.shared)}"
    layout_cols = -(-length * vec.ir.dtype.bytes // 16) * 16 // vec.ir.dtype.bytes   # rows of whole 16 bytes
    tile = T.SharedTile(name, vec.ir.dtype, SmemLayout(1, layout_cols, vec.ir.dtype.bytes, "none"), buffers,
                        align=16)
    tr.kernel.shared.append(tile)
    return StagedVector(T.StagedVector(name, vec.ir, length, tile, first, threads, buffers=buffers), vec)


def fetch_vector(sv: StagedVector, origin, buffer=0) -> None:
    """Start loading vec[origin .. origin + length - 1] (0 past its end) for sv's `buffer`:
    4-byte elements by cp.async into sv's shared tile, narrower ones into registers."""
    if not isinstance(sv, StagedVector):
        fail("fetch_vector: sv must come from tilegen.dsl.staged_vector(...)")
    _same_threads(sv, "fetch_vector")
    tile_op(T.FetchVector(sv.ir, raw(wrap(origin)), _buffer(sv, buffer, "fetch_vector")))


def park_vector(sv: StagedVector, buffer=0) -> None:
    """The fetched elements in sv's shared tile (its `buffer`): written from registers, or the
    thread's copies waited for (a barrier must follow before reads)."""
    if not isinstance(sv, StagedVector):
        fail("park_vector: sv must come from tilegen.dsl.staged_vector(...)")
    _same_threads(sv, "park_vector")
    tile_op(T.ParkVector(sv.ir, _buffer(sv, buffer, "park_vector")))


def _buffer(sv: StagedVector, buffer, what: str):
    if isinstance(buffer, int) and not 0 <= buffer < sv.ir.buffers:
        fail(f"{what}: buffer={buffer} of {sv.ir.name}, which has {sv.ir.buffers}")
    return raw(wrap(buffer))


def _same_threads(sv: StagedVector, what: str) -> None:
    tr = current()
    here = getattr(tr, "role_threads", None) or (0, tr.kernel.threads)
    if here != (sv.ir.first_thread, sv.ir.threads):
        fail(f"{what}: {sv.ir.name} was declared for threads {sv.ir.first_thread}..+{sv.ir.threads}, but runs on "
             f"threads {here[0]}..+{here[1]}: fetch and park it in the role that declared it")


def store_stage(dst: Stage, acc: Fragment, row, part: int = 0, parts: int = 1, alpha: Float = None, *,
                out: Block = None, bias=None, activation: str = "none", residual=None, row_scale=None,
                col_scale=None, vector_buffer=0, sync: bool = False):
    """Write the accumulator's rows row.. (this warp's), converted to dst's dtype, into the
    stage: its columns split in `parts` equal slices, slice `part` (dst holds one slice: its
    columns are the slice's). On the way: act(alpha * acc + bias) + residual, where `out` is
    the block of the output the slice will be stored to (it places the bias, a vector along
    its rows or columns, and the residual, a tensor of its shape). The stage then goes out
    with tma_store (after fence_proxy_async and a barrier of the threads that wrote it).

    Staged vectors are read from their `vector_buffer`. sync=True puts the barrier that must
    come before writing the stage (its previous store has read it) inside the op, after the
    staged vectors are read: their loads overlap the wait (they must then have been published
    by an earlier barrier)."""
    if not isinstance(dst, Stage) or not isinstance(acc, Fragment) or acc.operand != "C":
        fail("store_stage(tile[stage], accumulator fragment, row, part=0, parts=1)")
    tile = dst.tile
    if tile.logical != "row":
        fail(f"store_stage: {tile.ir.name} must be declared row-major (logical='row')")
    tm, tn = acc.ir.tiles
    if not isinstance(parts, int) or parts < 1 or tn % parts or not isinstance(part, int) or not 0 <= part < parts:
        fail(f"store_stage: part={part!r} of parts={parts!r}; parts must divide the accumulator's {tn} atom columns "
             f"and 0 <= part < parts")
    rows, cols = acc.ir.atom.m * tm, acc.ir.atom.n * tn // parts
    if tile.ir.layout.cols != cols or tile.ir.layout.rows < rows:
        fail(f"store_stage: {tile.ir.name} is {tile.ir.layout.rows} x {tile.ir.layout.cols}; a slice of this "
             f"accumulator is {rows} rows (one warp's) x {cols} columns: the stage's columns must be the slice's")
    if tile.ir.dtype.name not in ("f16", "bf16", "f32"):
        fail(f"store_stage: {tile.ir.name} is {tile.ir.dtype}; allowed: f16, bf16, f32")
    if alpha is not None and not isinstance(alpha, Float):
        fail("store_stage: alpha must be a tilegen.dsl.scalar (a Float)")
    act = T.canonical_activation(activation)
    if act is None:
        fail(f"store_stage: activation={activation!r}; allowed: {T.activation_choices()}")
    axis = "col"
    if bias is not None or residual is not None or row_scale is not None or col_scale is not None:
        if not isinstance(out, Block) or out.tensor.layout != "row":
            fail("store_stage: a bias, residual or scale needs out=the row-major tensor's block the slice goes to")
        names = out.tensor.ir.shape_names
        if bias is not None:
            if not isinstance(bias, (Vector, StagedVector)) or bias.size not in names:
                fail(f"store_stage: bias must be a tilegen.dsl.vector (or staged_vector) of size {names[0]!r} (per row) "
                     f"or {names[1]!r} (per column)")
            axis = "row" if bias.size == names[0] else "col"
        if residual is not None and (not isinstance(residual, Tensor) or residual.layout != "row"
                                     or residual.ir.shape_names != names):
            fail(f"store_stage: residual must be a row-major tilegen.dsl.tensor of sizes {names}")
    block = {"row": tile.ir.layout.rows, "col": acc.ir.atom.n * tn}   # the block's, from its first
    for vec, along in ((bias, axis), (row_scale, "row"), (col_scale, "col")):
        if isinstance(vec, StagedVector) and vec.ir.length < block[along]:
            fail(f"store_stage: {vec.ir.name} stages {vec.ir.length} elements; the block has {block[along]} "
                 f"{along}s from its first")
    unstaged = [v.vector if isinstance(v, StagedVector) else v for v in (row_scale, col_scale)]
    rs, cs = scale_vectors(out.tensor.ir.shape_names, *unstaged, "store_stage") if out is not None else (None, None)
    rs, cs = (v.ir if isinstance(v, StagedVector) else ir for v, ir in ((row_scale, rs), (col_scale, cs)))
    check_stage(dst)
    staged = [v for v in (bias, row_scale, col_scale) if isinstance(v, StagedVector)]
    for v in staged:
        _buffer(v, vector_buffer, "store_stage")
    if not isinstance(sync, bool):
        fail(f"store_stage: sync={sync!r}; allowed: True or False")
    tr = current()
    role = getattr(tr, "role_barrier", None)
    tile_op(T.StoreStage(tile.ir, raw(dst.index), acc.ir, raw(wrap(row)), part, parts,
                         alpha.raw if alpha is not None else None,
                         out=out.tensor.ir if out is not None else None,
                         out_row0=raw(wrap(out.row)) if out is not None else 0,
                         out_col0=raw(wrap(out.col)) if out is not None else 0,
                         bias=bias.ir if bias is not None else None, bias_axis=axis, activation=act,
                         residual=residual.ir if residual is not None else None, row_scale=rs, col_scale=cs,
                         vector_buffer=raw(wrap(vector_buffer)) if staged else 0,
                         sync=(T.Barrier(*role) if role is not None else T.Barrier()) if sync else None))


def tma_store(dst: Block, src: Stage):
    """One thread stores the stage into the block of `dst` it covers with TMA; elements
    outside the tensor are left alone. Write the stage first (store_stage), then
    fence_proxy_async and a barrier; before writing the stage again, tma_store_wait."""
    _needs_sm90("tma_store")
    if not isinstance(dst, Block) or not isinstance(src, Stage):
        fail("tma_store(tensor.block(r, c), tile[stage])")
    tensor, tile = dst.tensor, src.tile
    if tensor.dtype != tile.ir.dtype:
        fail(f"tma_store: {tensor.ir.name} is {tensor.dtype}, {tile.ir.name} is {tile.ir.dtype}")
    if tensor.layout != tile.logical:
        fail(f"tma_store: {tensor.ir.name} is {tensor.layout}-major but {tile.ir.name} is declared "
             f"logical={tile.logical!r}: TMA keeps the tensor's memory order")
    layout = _tma_layout_ok("tma_store", tile)
    check_stage(src)
    r0, c0 = tensor.ir.stored(dst.row, dst.col)
    tmap = _tensor_map(tensor.ir, layout)
    tile_op(T.TmaStore(tile.ir, raw(src.index), tmap, raw(wrap(r0)), raw(wrap(c0)), _matrix(tensor)))


def _matrix(tensor):
    """The stack coordinate of a matrix of a stack (dsl/batched.py), else 0."""
    return tensor.ir.batch.coord if tensor.ir.batch is not None else 0


def tma_store_commit():
    """Close the TMA stores issued since the last commit into one bulk group."""
    tile_op(T.TmaStoreCommit())


def tma_store_wait(pending: int = 0, *, writes: bool = False):
    """Wait until at most `pending` bulk groups still read their shared stages (the stages may
    then be written again). With writes=True, until at most `pending` are not complete: their
    writes to global memory are done and visible to the storing thread, which may then publish
    them to other CTAs (a barrier, then a release such as counters' last_arrival). Waiting for
    the reads alone publishes nothing: the writes may still be in flight."""
    if not isinstance(pending, int) or isinstance(pending, bool) or pending < 0:
        fail(f"tma_store_wait({pending!r}): the number of groups left pending must be an int >= 0")
    if not isinstance(writes, bool):
        fail(f"tma_store_wait(writes={writes!r}): writes must be True or False")
    tile_op(T.TmaStoreWait(pending, writes))


__all__ = ["MBarrier", "BarrierStage", "mbarrier", "arrive", "mbarrier_wait", "tma_load", "store_stage", "tma_store",
           "StagedVector", "staged_vector", "fetch_vector", "park_vector",
           "tma_store_commit", "tma_store_wait"]
