"""Tile primitives: what a kernel body calls. Each appends IR to the kernel being traced
and checks its arguments, pointing errors at the caller's line."""
from __future__ import annotations

import dataclasses
from contextlib import contextmanager

from ..arch.dtypes import dtype as _dtype
from ..arch.mma import MmaAtom, mma_atom
from ..arch.targets import target as _target
from ..arch.wgmma import FP8 as WGMMA_FP8
from ..arch.wgmma import WgmmaShape
from ..errors import DSLError, IRError
from ..ir import grid as G
from ..ir import tile as T
from ..ir.access import TRANSPOSE_BYTES, copy_iterations, transpose_iterations
from ..ir.alloc import shared_bytes, smem_limit
from ..ir.layout import SmemLayout
from ..ir.instr import Instr
from ..ir.values import Addr, Imm, Value
from .objects import Block, Fragment, SharedTile, Stage, Tensor, Vector
from .scalars import Float, Int, Pred, raw, wrap
from .trace import current, fail, made, user_location

_SPECIAL = {"x": 0, "y": 1, "z": 2}


def declare_param(name: str, ptype: str, pointer: bool = False) -> Value:
    """Declare a kernel parameter (loaded at the entry by lowering); a pointer's value is
    its global address."""
    tr = current()
    if any(p.name == name for p in tr.kernel.params):
        fail(f"parameter {name!r} is declared twice")
    reg = Value("b64" if ptype == "u64" else ("f32" if ptype == "f32" else "b32"), name)
    param = T.Param(name, ptype, reg, Value("b64", name[:-len("_ptr")] + "_g") if pointer else None)
    tr.kernel.params.append(param)
    return param.global_value if pointer else reg


def _identifier(name, what: str) -> None:
    """Names become PTX parameter names: ASCII identifiers only."""
    if not (isinstance(name, str) and name.isidentifier() and name.isascii()):
        fail(f"{what} {name!r}: a name must be an ASCII identifier (letters, digits and _, not starting with a "
             f"digit), as it names a kernel parameter")


def _symbol(name: str) -> Int:
    _identifier(name, "size name")
    tr = current()
    if name not in tr.kernel.symbols:
        declare_param(name, "u32")
        tr.kernel.symbols[name] = tr.kernel.param(name)
    return Int(tr.kernel.symbols[name].value)


def tensor(name: str, dtype: str, shape: tuple, layout: str = "row") -> Tensor:
    """Declare a matrix parameter: `shape` names its logical (rows, cols) size symbols,
    e.g. ("M", "K"); symbols shared between tensors are one parameter."""
    _identifier(name, "tensor")
    tr = current()
    try:
        dt = _dtype(dtype)
    except ValueError as e:
        fail(str(e))
    if layout not in ("row", "col"):
        fail(f"tensor {name}: layout={layout!r}; allowed: 'row', 'col'")
    if not (isinstance(shape, tuple) and len(shape) == 2 and all(isinstance(s, str) for s in shape)):
        fail(f"tensor {name}: shape must be two size names like ('M', 'K'), got {shape!r}")
    rows, cols = _symbol(shape[0]), _symbol(shape[1])
    gptr = declare_param(f"{name}_ptr", "u64", pointer=True)
    ld = declare_param(f"{name}_ld", "u32")
    stored = (rows, cols) if layout == "row" else (cols, rows)
    ir = T.GlobalTensor(name, dt, gptr, stored[0].raw, stored[1].raw, ld, layout, shape)
    tr.kernel.tensors.append(ir)
    tr.kernel.arrays.append(T.ArrayDecl(name, "matrix", gptr, tensor=ir))
    return Tensor(ir, (rows, cols))


def vector(name: str, dtype: str, size: str):
    """Declare a 1-D array parameter of `size` (a size symbol, e.g. "N") elements: bias vectors."""
    _identifier(name, "vector")
    try:
        dt = _dtype(dtype)
    except ValueError as e:
        fail(str(e))
    if not isinstance(size, str):
        fail(f"vector {name}: size must be a size name like 'N', got {size!r}")
    length = _symbol(size)
    gptr = declare_param(f"{name}_ptr", "u64", pointer=True)
    ir = T.GlobalVector(name, dt, gptr, length.raw)
    current().kernel.arrays.append(T.ArrayDecl(name, "vector", gptr, vector=ir))
    return Vector(ir, size)


def size(name: str) -> Int:
    """A size symbol (as a tensor's shape names one, e.g. "M") as a kernel Int: one u32
    parameter however many tensors and calls name it."""
    if not isinstance(name, str) or not name.isidentifier():
        fail(f"size: name must be an identifier like 'M', got {name!r}")
    return _symbol(name)


def scalar(name: str, type: str = "f32"):
    """Declare a scalar parameter: "f32" gives a Float, "u32" an Int."""
    _identifier(name, "scalar")
    if type == "f32":
        return Float(declare_param(name, "f32"))
    if type == "u32":
        return Int(declare_param(name, "u32"))
    fail(f"scalar {name}: type={type!r}; allowed: 'f32', 'u32'")


def device_scalar(name: str) -> Float:
    """Declare `<name>_ptr`, a pointer to one f32 in device memory: a value the host keeps on the
    GPU, such as a per-tensor scale. The Float is read where it is used (each use loads it, in the
    code of the role that uses it): a value loaded at the kernel's entry and held across its warp
    roles cost the fp8 GEMM 12% (run 232)."""
    _identifier(name, "device_scalar")
    ptr = declare_param(f"{name}_ptr", "u64", pointer=True)
    current().kernel.arrays.append(T.ArrayDecl(name, "scalar", ptr))

    def load():
        b = current().builder
        value = b.op("mov.f32", "f32", Imm(0.0, "f32"))
        b.emit(Instr("ld.global.f32", (value,), (Addr(ptr),), comment=f"{name}: one f32 in device memory"))
        return value

    return Float(make=load)


def program_id(axis: str = "x") -> Int:
    if axis not in _SPECIAL:
        fail(f"program_id axis {axis!r}; allowed: x, y, z")
    return Int(current().builder.special(f"%ctaid.{axis}", f"ctaid_{axis}"))


def num_programs(axis: str = "x") -> Int:
    if axis not in _SPECIAL:
        fail(f"num_programs axis {axis!r}; allowed: x, y, z")
    return Int(current().builder.special(f"%nctaid.{axis}", f"nctaid_{axis}"))


def thread_id() -> Int:
    return Int(current().builder.special("%tid.x", "tid"))


def warp_id() -> Int:
    """The warp's index in the CTA (tid / 32), uniform across the warp (kernel.py's
    _Trace.warp_index: computed once, at the entry)."""
    return Int(current().warp_index())


def lane_id() -> Int:
    return thread_id() & 31


def _compare(rel: str, a, b) -> Pred:
    x, y = raw(a), raw(b)
    if isinstance(x, int) and isinstance(y, int):
        return Pred({"lt": x < y, "le": x <= y, "gt": x > y, "ge": x >= y, "eq": x == y, "ne": x != y}[rel])
    return Pred(current().builder.cmp(rel, x, y))


def eq(a, b) -> Pred:
    """a == b on the GPU."""
    return _compare("eq", a, b)


def ne(a, b) -> Pred:
    """a != b on the GPU."""
    return _compare("ne", a, b)


def lt(a, b) -> Pred:
    """a < b on the GPU (unsigned 32-bit)."""
    return _compare("lt", a, b)


def is_zero(x: Float) -> Pred:
    """x == 0.0 on the GPU (+0 or -0; NaN is not zero), for a Float parameter such as beta."""
    if not isinstance(x, Float):
        fail("is_zero takes a tilegen.dsl.scalar (a Float)")
    return Pred(current().builder.op("setp.eq.f32", "pred", x.raw, Imm(0.0, "f32")))


def le(a, b) -> Pred:
    return _compare("le", a, b)


def gt(a, b) -> Pred:
    return _compare("gt", a, b)


def ge(a, b) -> Pred:
    return _compare("ge", a, b)


@contextmanager
def if_(cond: Pred):
    """Run the block when `cond` holds; `tilegen.dsl.else_()` may follow. The condition may differ
    between warps or threads (tg.eq(tg.warp_id(), 1)); a tg.barrier() of the whole CTA may not be
    inside such a branch (the threads that skip it never arrive)."""
    if not isinstance(cond, Pred):
        fail("if_ takes a condition built with tilegen.dsl.lt/le/gt/ge")
    tr = current()
    if isinstance(cond.raw, bool):  # known at trace time: trace the taken side only
        tr.pending_else = not cond.raw
        if cond.raw:
            yield
        else:
            with _discarded():
                yield
        return
    tr.pending_else = None
    with tr.builder.if_(cond.raw, comment=f"if ({user_location()})"):
        yield


@contextmanager
def else_():
    """The other side of the tilegen.dsl.if_ block just above."""
    tr = current()
    const = getattr(tr, "pending_else", "missing")
    if const == "missing":
        fail("else_ must follow a tilegen.dsl.if_ block")
    tr.pending_else = "missing"
    if const is True:
        yield
        return
    if const is False:
        with _discarded():
            yield
        return
    try:
        cm = tr.builder.else_()
        cm.__enter__()
    except ValueError:
        fail("else_ must directly follow a tilegen.dsl.if_ block")
    try:
        yield
    finally:
        cm.__exit__(None, None, None)


@contextmanager
def _discarded():
    """Trace into a throw-away region (the side of a constant condition that never runs)."""
    tr = current()
    tr.builder._regions.append([])
    try:
        yield
    finally:
        tr.builder._regions.pop()


SM_COUNT = G.SM_COUNT  # in a launch grid: the launching GPU's multiprocessor count


def _grid_operand(x) -> bool:
    return isinstance(x, (str, G.GridExpr))


def cdiv(a, b):
    """Ceiling division. On a size name or grid expression (cdiv("M", 128)) it describes
    part of the launch grid instead (tilegen.dsl.launch)."""
    if _grid_operand(a):
        try:
            return G.CeilDiv(G.as_expr(a), b)
        except ValueError as e:
            fail(f"cdiv: {e}")
    return (wrap(a) + (b - 1)) // b


def share(a, n: int):
    """In a launch grid: each of n rows' share of a count, a // n but at least 1, so that n
    rows of it fit in the count: share(tilegen.dsl.SM_COUNT, 3) CTAs per row of a persistent grid
    of three rows."""
    if not _grid_operand(a):
        fail(f"share: takes a size name or grid expression (share(tilegen.dsl.SM_COUNT, 3)), got {type(a).__name__}")
    try:
        return G.Share(G.as_expr(a), n)
    except ValueError as e:
        fail(f"share: {e}")


def divmod_by(a, n: int) -> tuple:
    """(a // n, a % n) of an Int and a positive int constant, without a division instruction
    (ptxas computes one by a constant through a float reciprocal each time it runs): for a
    pipeline's k-tile counter, (lap, stage) in a ring of n stages on every k-tile."""
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n < 2 ** 32:
        fail(f"divmod_by: n={n!r}; allowed: an int in 1 .. 2^32 - 1")
    if isinstance(a, int):
        return divmod(a, n)
    q, r = current().builder.divmod_const(raw(a), n)
    return Int(q), Int(r)


def minimum(a, b):
    """The smaller of two Ints; of two grid expressions (minimum(blocks, tilegen.dsl.SM_COUNT)),
    a grid expression."""
    if _grid_operand(a) or _grid_operand(b):
        try:
            return G.Min(G.as_expr(a), G.as_expr(b))
        except ValueError as e:
            fail(f"minimum: {e}")
    return Int(current().builder.min(raw(a), raw(b)))


def shared(name: str, dtype: str, rows: int, cols: int, *, stages: int = 1, swizzle: str = "128B",
           logical: str = "row", pad: int = 16) -> SharedTile:
    """A shared tile of `stages` buffers of rows x cols (cols contiguous); swizzle="pad" adds
    `pad` bytes to each row."""
    tr = current()
    if not all(isinstance(v, int) and v > 0 for v in (rows, cols, stages)):
        fail(f"shared {name}: rows, cols and stages must be positive Python ints")
    try:
        layout = SmemLayout(rows, cols, _dtype(dtype).bytes, swizzle, pad)
    except ValueError as e:
        fail(f"shared {name}: {e}")
    if logical not in ("row", "col"):
        fail(f"shared {name}: logical={logical!r}; allowed: 'row', 'col'")
    if any(t.name == name for t in tr.kernel.shared):
        fail(f"shared {name}: a shared tile of that name is already declared in this kernel (each needs its own name)")
    ir = T.SharedTile(name, _dtype(dtype), layout, stages)
    tr.kernel.shared.append(ir)
    _fits_shared(tr.kernel, name)
    return SharedTile(ir, logical)


def _fits_shared(kernel, name: str) -> None:
    """Refused at the declaration that takes the kernel's shared memory past what a block may use
    (the allocation pass would say so later, without the user's line)."""
    try:
        limit = smem_limit(kernel.target)
    except Exception:  # noqa: BLE001  (a target not known yet: the allocation pass checks it)
        return
    need = shared_bytes(kernel.shared, kernel.barriers)
    if need > limit:
        fail(f"shared {name}: with it the kernel's shared memory is {need} bytes, more than the {limit} a block may "
             f"use on {kernel.target} (" + ", ".join(f"{t.name} {t.stages} x {t.layout.stage_bytes} B"
                                                     for t in kernel.shared) + "): use fewer stages or smaller tiles")


def tile_op(op):
    """Append a tile op to the kernel being traced, located at the caller's line."""
    op.loc = user_location()
    tr = current()
    _check_homes(tr, op)
    tr.builder.emit(op)
    return op


def _check_homes(tr, op) -> None:
    """Each register fragment (or row vector) an op names belongs to the regions (loop and if_
    bodies) open where it was made (trace.made): used after one of them closed, it was made inside
    a body traced once, and a Python name rebound there (acc = tg.add(acc, 1.0) in a
    tilegen.dsl.range loop) does not carry from one iteration to the next; nor is it made where the
    body did not run. Refused, saying how to carry it."""
    open_ids = None
    for f in dataclasses.fields(op):
        x = getattr(op, f.name, None)
        home = tr.homes.get(id(x)) if isinstance(x, (T.Fragment, T.RowVector)) else None
        if home is None or home[0] is not x:
            continue
        if open_ids is None:
            open_ids = set(tr.builder.open_regions())
        if not set(home[1]) <= open_ids:
            fail(f"the fragment {x.name!r} was made at {home[2]} inside a loop or if_ body and is used here, after "
                 f"it: a body is traced once, so a name rebound in it (acc = tg.add(acc, 1.0)) does not carry "
                 f"from one iteration to the next, and a value made in an if_ is not made where it was skipped; "
                 f"write into a fragment made before the body instead: tg.add(acc, 1.0, out=acc), "
                 f"tg.assign(acc, x)")


def copy_async(dst: Stage, src: Block, comment: str = "", inbounds: tuple = ()):
    """Start copying the block of `src` that matches the stage's extent into `dst`.
    Elements outside the tensor arrive as zeros. `inbounds` names size symbols (e.g. ("K",))
    along which the caller guarantees the block lies inside the tensor: their bounds
    checks are left out of the copy.

    A tile declared with the other memory order than the tensor's (logical="col" for a
    row-major tensor, or the reverse) receives the block transposed; only 32-bit tiles can,
    since each element then moves by its own 4-byte cp.async."""
    if not isinstance(dst, Stage) or not isinstance(src, Block):
        fail("copy_async(dst=tile.stage(s), src=tensor.block(r, c))")
    tensor, tile = src.tensor, dst.tile
    if tensor.dtype != tile.ir.dtype:
        fail(f"copy_async: {tensor.ir.name} is {tensor.dtype}, {tile.ir.name} is {tile.ir.dtype}")
    transpose = tensor.layout != tile.logical
    if transpose and tile.ir.dtype.bytes != TRANSPOSE_BYTES:
        fail(f"copy_async: {tensor.ir.name} is {tensor.layout}-major but {tile.ir.name} is declared "
             f"logical={tile.logical!r}: a copy transposes only 32-bit elements, {tile.ir.dtype} tiles "
             f"keep the tensor's memory order")
    r0, c0 = tensor.ir.stored(src.row, src.col)
    _not_in_role("a cooperative copy (tilegen.dsl.copy_async)")
    check_stage(dst)
    threads = current().kernel.threads
    try:   # (every thread moves the same number of pieces: the lowering's rule, said at the user's line)
        (transpose_iterations if transpose else copy_iterations)(tile.ir, threads)
    except IRError as e:
        lay = tile.ir.layout
        what = f"copy_async into {tile.ir.name} ({lay.rows} x {lay.cols} {tile.ir.dtype}) with {threads} threads"
        if transpose:
            fail(f"{what}: {e}")
        fail(f"{what}: every thread moves the same number of 16-byte pieces, so the tile's "
             f"{lay.rows * lay.row_bytes // 16} pieces must be a multiple of {threads} (a larger tile, or fewer threads)")
    names = tensor.ir.shape_names
    if isinstance(inbounds, str):
        inbounds = (inbounds,)
    for n in inbounds:
        if n not in names:
            fail(f"copy_async: inbounds={n!r} is not a size of {tensor.ir.name}; its sizes are {names}")
    stored_names = names if tensor.layout == "row" else names[::-1]
    tile_op(T.CopyAsync(tile.ir, raw(dst.index), tensor.ir, raw(r0), raw(c0), comment=comment,
                         check_rows=stored_names[0] not in inbounds, check_cols=stored_names[1] not in inbounds,
                         transpose=transpose))


def check_stage(stage: Stage):
    if isinstance(stage.index.raw, int) and not 0 <= stage.index.raw < stage.tile.ir.stages:
        n = stage.tile.ir.stages
        fail(f"stage {stage.index.raw} of {stage.tile.ir.name}, which has {n} stage{'s' if n > 1 else ''} "
             f"(0..{n - 1}); a stage index that cycles is taken modulo the stages, e.g. sA[kt % {n}]")


def commit():
    tile_op(T.CommitGroup())


def wait(pending: int):
    """Wait until at most `pending` committed copy groups of this thread are in flight."""
    if not isinstance(pending, int) or pending < 0:
        fail(f"wait({pending!r}): the number of groups left pending must be an int >= 0")
    tile_op(T.WaitGroup(pending))


def barrier():
    """Wait until every thread of the CTA got here; inside a warp role, every thread of the
    role (the role's own named barrier)."""
    role = getattr(current(), "role_barrier", None)
    if role is not None:
        tile_op(T.Barrier(*role))
        return
    tile_op(T.Barrier())


def _not_in_role(what: str):
    r = getattr(current(), "role", None)
    if r is not None:
        fail(f"{what} inside the warp role {r!r}: it needs every thread of the CTA, and the other roles' "
             f"threads never take part; roles synchronise through mbarriers (tilegen.dsl.arrive / mbarrier_wait)")


def fragment(atom, operand: str, tiles: tuple, name: str = "") -> Fragment:
    """Registers for a grid of atoms: A takes (tm, 1), B (1, tn), C (tm, tn). C starts at zero."""
    if not isinstance(atom, MmaAtom):
        try:
            atom = mma_atom(atom)
        except ValueError as e:
            fail(str(e))
    if operand not in ("A", "B", "C"):
        fail(f"fragment operand {operand!r}; allowed: 'A', 'B', 'C'")
    if not (isinstance(tiles, tuple) and len(tiles) == 2 and all(isinstance(t, int) and t > 0 for t in tiles)):
        fail(f"fragment tiles must be a pair of positive ints, got {tiles!r}")
    if (operand == "A" and tiles[1] != 1) or (operand == "B" and tiles[0] != 1):
        fail(f"an {operand} fragment spans atoms along one dimension only: use "
             f"{'(tm, 1)' if operand == 'A' else '(1, tn)'}")
    frag = made(T.Fragment(name or operand.lower(), atom, operand, tiles))
    if operand == "C":
        tile_op(T.FillFragment(frag, 0.0))
    return Fragment(frag)


def load(frag: Fragment, src: Stage, row, col, comment: str = "", round: bool = True):
    """Load a fragment from a shared stage; (row, col) is its logical origin:
    (m, k) for A, (k, n) for B. tf32 fragments are rounded to tf32 unless round=False
    (then split_tf32 must follow)."""
    if not isinstance(frag, Fragment) or not isinstance(src, Stage):
        fail("load(fragment, tile.stage(s), row, col)")
    if frag.operand == "C":
        _load_accumulator(frag, src, row, col, add=False, what="load")
        return
    tile_dt = src.tile.ir.dtype.name
    want = (frag.atom.a_type if frag.operand == "A" else frag.atom.b_type).name   # (mixed fp8 atoms differ)
    if tile_dt != want and not (want == "tf32" and tile_dt == "f32"):  # tf32 is stored as f32
        fail(f"load: fragment of {want} from a {tile_dt} tile")
    k_major = (frag.operand == "A") == (src.tile.logical == "row")
    check_stage(src)
    tile_op(T.LoadFragment(frag.ir, src.tile.ir, raw(src.index), raw(row), raw(col), k_major, comment=comment,
                            round_tf32=bool(round)))


def split_tf32(hi: Fragment, lo: Fragment, finite_hi: Fragment = None):
    """hi holds f32 values (loaded with round=False): afterwards hi = tf32(x) and
    lo = tf32(x - hi), for three-product (3xTF32) GEMMs with f32 accuracy.

    With finite_hi (accumulator fragments of a tf32 atom, as a kernel that writes the parts
    to memory holds them): finite_hi = hi where x is finite, else 0, and lo = 0 where x is
    not finite. The products hi*hi + finite_hi*lo' + lo*finite_hi' then sum in one
    accumulator with no inf * 0 among the correction terms."""
    parts = (hi, lo) + ((finite_hi,) if finite_hi is not None else ())
    for f in parts:
        if not isinstance(f, Fragment) or f.atom.a_type.name != "tf32" or (f.operand == "C") != (finite_hi is not None):
            fail("split_tf32(hi, lo) takes two tf32 operand fragments; split_tf32(hi, lo, finite_hi) three "
                 "accumulator fragments of a tf32 atom")
    if any(f.operand != hi.operand or f.tiles != hi.tiles or f.atom is not hi.atom for f in parts):
        fail("split_tf32: the parts must be fragments of the same operand, atom and shape")
    tile_op(T.SplitTF32(hi.ir, lo.ir, finite_hi.ir if finite_hi is not None else None))


def mma(acc: Fragment, a: Fragment, b: Fragment, accumulate: bool = True):
    """acc += a @ b over the fragments' atom grid (acc = a @ b with accumulate=False)."""
    for f, want in ((acc, "C"), (a, "A"), (b, "B")):
        if not isinstance(f, Fragment) or f.operand != want:
            fail(f"mma(acc: C fragment, a: A fragment, b: B fragment); got {getattr(f, 'operand', f)!r} for {want}")
    if not (acc.atom is a.atom is b.atom):
        fail("mma: fragments of different atoms")
    if a.tiles[0] != acc.tiles[0] or b.tiles[1] != acc.tiles[1]:
        fail(f"mma: A {a.tiles} and B {b.tiles} do not cover accumulator {acc.tiles}")
    tile_op(T.Mma(acc.ir, a.ir, b.ir, accumulate=bool(accumulate)))


def wgmma(acc: Fragment, a, b: Stage, m0, k0: int, n0, accumulate: bool = True):
    """acc += A[m0 : m0+64, k0 : k0+k] @ B[k0 : k0+k, n0 : n0+n] for the calling warpgroup
    (sm_90a); k is 16 for f16/bf16 (8 for tf32) and n the accumulator's width. B is read
    from shared memory, A from shared memory (`a` a stage) or from registers (`a` each warp's
    A fragment of one atom: its 16 rows of the 64, loaded with tilegen.dsl.load; m0 is then None).
    tf32 stages must be K-major (A declared logical="row", B logical="col"); a tf32 A that is
    MN-major in shared memory goes through registers. m0 and n0 are the warpgroup's origin
    in the tiles (the same for its 4 warps), k0 a Python int; acc is each warp's (1, n/8)
    accumulator, holding its 16 rows. Issue tilegen.dsl.wgmma_fence() before (after the loads
    of register operands), tilegen.dsl.wgmma_commit() and tilegen.dsl.wgmma_wait(n) after: the
    registers and the stages are in use until the wait. accumulate=False: acc = A @ B (the
    accumulator restarts from zero)."""
    from_registers = isinstance(a, Fragment)
    if (not isinstance(acc, Fragment) or acc.operand != "C" or not isinstance(b, Stage)
            or not (isinstance(a, Stage) or from_registers)):
        fail("wgmma(accumulator fragment, A stage or A fragment, B stage, m0, k0, n0)")
    role = getattr(current(), "role_threads", None)
    threads = role[1] if role else current().kernel.threads
    if threads % 128 or (role and role[0] % 128):   # (a warpgroup's four warps issue it together)
        fail("wgmma runs on whole warpgroups of 128 threads (warps 4g .. 4g + 3); "
             + (f"this role runs threads {role[0]} .. {role[0] + role[1] - 1}" if role else
                f"the CTA has {threads} threads (launch a multiple of 128)"))
    dt = b.tile.ir.dtype.name
    a_dt = a.atom.a_type.name if from_registers else a.tile.ir.dtype.name
    if a_dt != dt and not (a_dt in WGMMA_FP8 and dt in WGMMA_FP8):
        fail(f"wgmma: A is {a_dt}, B is {dt}; only fp8 operands (e4m3, e5m2) may mix")
    if acc.tiles[0] != 1 or acc.atom.m != 16 or acc.atom.n != 8 or acc.atom.acc_type.name != "f32":
        fail(f"wgmma: the accumulator must be a (1, n/8) grid of f32 m16n8 atoms, got {acc.tiles} of {acc.atom}")
    try:
        shape = WgmmaShape(a_dt, 8 * acc.tiles[1], dt if dt != a_dt else "")
    except ValueError as e:
        fail(f"wgmma: {e}")
    if not isinstance(k0, int) or k0 < 0 or k0 % shape.k:
        fail(f"wgmma: k0={k0!r} must be a Python int, a multiple of {shape.k}")
    if from_registers:
        if a.operand != "A" or a.tiles != (1, 1) or a.atom.m != 16 or a.atom.k != shape.k:
            fail(f"wgmma: a register A must be one m16 x k{shape.k} A fragment (tiles (1, 1)), "
                 f"got operand {a.operand} {a.tiles} of {a.atom}")
        if m0 is not None:
            fail("wgmma: an A fragment already holds the warp's rows; pass m0=None")
    stages = (b,) if from_registers else (a, b)
    for st in stages:
        check_stage(st)
        if st.tile.ir.layout.mode not in ("128B", "64B", "32B"):
            fail(f"wgmma: {st.tile.ir.name} has layout {st.tile.ir.layout.mode!r}; wgmma reads swizzled "
                 f"tiles only (128B, 64B, 32B)")
    a_k_major = from_registers or a.tile.logical == "row"
    b_k_major = b.tile.logical == "col"
    if not shape.transposable and not (a_k_major and b_k_major):
        mn_major = a.tile.ir.name if not a_k_major else b.tile.ir.name
        fail(f"wgmma: {a_dt} operands must both be K-major in shared memory, but {mn_major} is MN-major; "
             f"declare it with logical='{'row' if not a_k_major else 'col'}' (a copy_async into it transposes)"
             + ("" if a_k_major else "; an MN-major A can go through registers (tilegen.dsl.load, then "
                "wgmma with the fragment)"))
    # an origin known at trace time must leave the wgmma's box inside the stage (past its end the
    # descriptor reads the next stage or tile, silently)
    for st, what, extents in ((None if from_registers else a, "A", (("m0", m0, 64, 0), ("k0", k0, shape.k, 1))),
                              (b, "B", (("k0", k0, shape.k, 0), ("n0", n0, shape.n, 1)))):
        if st is None:
            continue
        rows, cols = st.tile.ir.layout.rows, st.tile.ir.layout.cols
        logical = (rows, cols) if st.tile.logical == "row" else (cols, rows)
        for name, origin, extent, axis in extents:
            if isinstance(origin, int) and not isinstance(origin, bool) and origin + extent > logical[axis]:
                fail(f"wgmma: {name}={origin} reads {what}[{'rows' if axis == 0 else 'columns'} {origin}.."
                     f"{origin + extent - 1}] of {st.tile.ir.name}, whose stage is {logical[0]} x {logical[1]}")
    a_ir, a_stage, a_m0 = (a.ir, None, None) if from_registers else (a.tile.ir, raw(a.index), raw(m0))
    tile_op(T.Wgmma(acc.ir, a_ir, a_stage, a_m0, k0, b.tile.ir, raw(b.index), raw(n0),
                     a_k_major=a_k_major, b_k_major=b_k_major, shape=shape, accumulate=bool(accumulate)))


def wgmma_fence():
    """Before the first wgmma of a batch: earlier register writes of the accumulators (and
    reads of their results) are ordered before it."""
    tile_op(T.WgmmaFence())


def wgmma_commit():
    tile_op(T.WgmmaCommit())


def wgmma_wait(pending: int):
    """Wait until at most `pending` committed wgmma groups of this warpgroup are in flight."""
    if not isinstance(pending, int) or pending < 0:
        fail(f"wgmma_wait({pending!r}): the number of groups left pending must be an int >= 0")
    tile_op(T.WgmmaWait(pending))


def fence_proxy_async():
    """This thread's finished shared-memory writes (st.shared, cp.async after its wait) become
    visible to wgmma, which reads shared memory through the async proxy. A barrier must
    still follow before other warps' wgmmas read them."""
    tile_op(T.FenceProxyAsync())


def scale_vectors(names: tuple, row_scale, col_scale, what: str):
    """The IR vectors of row_scale (one f32 per row of the output, sized names[0]) and
    col_scale (per column, names[1]), checked."""
    out = []
    for vec, size, which in ((row_scale, names[0], "row_scale"), (col_scale, names[1], "col_scale")):
        if vec is None:
            out.append(None)
            continue
        if not isinstance(vec, Vector) or vec.size != size or vec.ir.dtype.name != "f32":
            fail(f"{what}: {which} must be an f32 tilegen.dsl.vector of size {size!r}")
        out.append(vec.ir)
    return out


def store(dst: Block, acc: Fragment, *, alpha: Float = None, beta: Float = None, bias=None,
          activation: str = "none", residual: Block = None, row_scale=None, col_scale=None):
    """dst = act(alpha * s_row * s_col * acc + beta * dst + bias) + residual for the
    accumulator's elements inside dst's tensor. bias is a vector whose size names dst's rows
    (one value per row) or columns (one per column); residual a block of a tensor of dst's
    shape; row_scale / col_scale f32 vectors of dst's row / column count.

    acc may also be a row vector (tilegen.dsl.row_sum(x), a running max): its rows go down column c
    of dst = tensor.block(r, c), rows r.., converted to the tensor's dtype (no epilogue)."""
    if isinstance(dst, Block) and isinstance(getattr(acc, "ir", None), T.RowVector):
        if any(v is not None for v in (alpha, beta, bias, residual, row_scale, col_scale)) or activation != "none":
            fail("store: a row vector is stored as it is (no alpha, beta, bias, activation, residual or scales)")
        if dst.tensor.layout != "row":
            fail(f"store: a row vector goes down a column of a row-major tensor; {dst.tensor.ir.name} is "
                 f"{dst.tensor.layout}-major")
        tile_op(T.StoreRowVector(dst.tensor.ir, acc.ir, raw(dst.row), raw(dst.col)))
        return
    if not isinstance(dst, Block) or not isinstance(acc, Fragment) or acc.operand != "C":
        fail("store(tensor.block(r, c), accumulator fragment or row vector)")
    if dst.tensor.dtype.name not in ("f32", "f16", "bf16"):
        fail(f"store: writes f32, f16 or bf16 tensors; {dst.tensor.ir.name} is {dst.tensor.dtype.name} (an "
             f"output of another dtype has no conversion here)")
    if (alpha is None) != (beta is None):   # (one given: the other's identity, C = alpha * acc or acc + beta * C)
        alpha, beta = (1.0 if alpha is None else alpha), (0.0 if beta is None else beta)
    alpha, beta = _float_operand(alpha, "alpha"), _float_operand(beta, "beta")
    act = T.canonical_activation(activation)
    if act is None:
        fail(f"store: activation={activation!r}; allowed: {T.activation_choices()}")
    axis = "col"
    if bias is not None:
        if not isinstance(bias, Vector):
            fail("store: bias must be a tilegen.dsl.vector(...)")
        names = dst.tensor.ir.shape_names
        if bias.size not in names:
            fail(f"store: bias has size {bias.size!r}; it must be {names[0]!r} (per row) or {names[1]!r} (per column)")
        axis = "row" if bias.size == names[0] else "col"
    if residual is not None:
        if not isinstance(residual, Block):
            fail("store: residual must be a tensor.block(r, c)")
        if residual.tensor.layout != dst.tensor.layout:
            fail(f"store: residual is {residual.tensor.layout}-major, the output {dst.tensor.layout}-major; "
                 f"they must share a layout (one address serves both)")
        if residual.tensor.ir.shape_names != dst.tensor.ir.shape_names:
            fail(f"store: residual has sizes {residual.tensor.ir.shape_names}, the output {dst.tensor.ir.shape_names}")
    rs, cs = scale_vectors(dst.tensor.ir.shape_names, row_scale, col_scale, "store")
    tile_op(T.StoreFragment(dst.tensor.ir, acc.ir, raw(dst.row), raw(dst.col),
                             alpha.raw if alpha is not None else None, beta.raw if beta is not None else None,
                             bias=bias.ir if bias is not None else None, bias_axis=axis, activation=act,
                             residual=residual.tensor.ir if residual is not None else None, row_scale=rs,
                             col_scale=cs))


def _float_operand(x, name: str):
    """A store's alpha or beta: a tilegen.dsl.scalar (a Float), a Python number (an f32 immediate),
    or None."""
    if x is None or isinstance(x, Float):
        return x
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return Float(Imm(float(x), "f32"))
    fail(f"store: {name} must be a number or a tilegen.dsl.scalar (a Float), got {type(x).__name__}")


def _load_accumulator(acc: Fragment, src: Stage, row, col, add: bool, what: str):
    """acc (+)= a row-major shared stage at (row, col): what another warp put there with store_stage."""
    tile = src.tile
    if tile.logical != "row":
        fail(f"{what}: an accumulator is read from a row-major tile; {tile.ir.name} is declared "
             f"{tile.logical}-major (its .T view: declare the tile the other way round)")
    if tile.ir.dtype.name not in ("f32", "f16", "bf16") or acc.ir.reg_type != "f32":
        fail(f"{what}: reads an f32, f16 or bf16 tile into an f32 accumulator; {tile.ir.name} is {tile.ir.dtype}, the "
             f"accumulator {acc.ir.reg_type}")
    check_stage(src)
    tile_op(T.LoadAccumulator(acc.ir, tile.ir, raw(src.index), raw(row), raw(col), add))


def accumulate(acc: Fragment, src, row=None, col=None):
    """acc += src's elements at the accumulator's positions: from a tensor's block (those outside
    it add nothing), an f32 accumulator and an f32, f16 or bf16 tensor (or its .T view), widened to
    f32: partial sums of split-K, or any tensor read into registers (into a fragment filled with 0
    first); or from a shared stage at (row, col) (a row-major f32, f16 or bf16 tile, such as the
    parts other warps wrote there with store_stage: warps that split a sum combine it this way)."""
    if isinstance(src, Stage) and isinstance(acc, Fragment) and acc.operand == "C":
        if row is None or col is None:
            fail("accumulate(accumulator, tile[stage], row, col): the fragment's origin in the tile")
        _load_accumulator(acc, src, row, col, add=True, what="accumulate")
        return
    if row is not None or col is not None:
        fail("accumulate(accumulator, tensor.block(r, c)): a block carries its origin (row and col are for a shared "
             "stage)")
    if not isinstance(src, Block) or not isinstance(acc, Fragment) or acc.operand != "C":
        fail("accumulate(accumulator fragment, tensor.block(r, c)) or accumulate(accumulator, tile[stage], row, col)")
    if src.tensor.dtype.name not in ("f32", "f16", "bf16") or acc.ir.reg_type != "f32":
        fail(f"accumulate: adds an f32, f16 or bf16 tensor into an f32 accumulator; {src.tensor.ir.name} is "
             f"{src.tensor.dtype}, the accumulator {acc.ir.reg_type}")
    tile_op(T.AccumulateFragment(src.tensor.ir, acc.ir, raw(src.row), raw(src.col)))


def range_(start, stop=None, step: int = 1):
    """A runtime loop, range(stop) or range(start, stop[, step]): the body is traced once and
    runs for start, start + step, ... below stop on the GPU (step a Python int >= 1)."""
    if stop is None:
        start, stop = 0, start
    if not isinstance(step, int) or isinstance(step, bool) or step < 1:
        fail(f"tilegen.dsl.range(start, stop, step={step!r}): the step must be a Python int >= 1 (a runtime loop "
             f"counts up)")
    tr = current()
    if step == 1:
        with tr.builder.loop(raw(start), raw(stop), hint="kt") as counter:
            yield Int(counter)
        return
    if isinstance(start, int) and isinstance(stop, int):
        trips = max(0, -(-(stop - start) // step))
    else:   # (unsigned: from min(start, stop), so that a stop below start runs no trip, as range does)
        trips = cdiv(stop if isinstance(start, int) and start == 0 else wrap(stop) - minimum(start, stop), step)
    with tr.builder.loop(0, raw(trips), hint="kt") as counter:
        yield Int(counter) * step + start


MAX_CLUSTER = 8   # CTAs per cluster without the non-portable attribute (ptx.md 6.9)


def launch(*, threads: int, grid, cluster=(1, 1, 1)):
    """Set the CTA size and the grid: (x, y, z), each an int, a size name or an expression
    of them, e.g. grid=(tilegen.dsl.cdiv("M", 128) * tilegen.dsl.cdiv("N", 128), "BATCH"); a
    persistent kernel takes tilegen.dsl.minimum(blocks, tilegen.dsl.SM_COUNT). The grid is data,
    evaluated at each launch from the sizes (tilegen/ir/grid.py); a size no tensor declares
    (such as "BATCH" above) is given at launch only. cluster=(x, y, z) (sm_90) launches the
    CTAs in clusters of that shape (dsl/cluster.py); the grid is rounded up to whole clusters,
    and SM_COUNT then counts the CTAs that fit at once in such clusters."""
    tr = current()
    if getattr(tr, "launched_at", None):
        fail(f"launch is given once per kernel; this one already set its threads and grid at {tr.launched_at}")
    tr.launched_at = user_location()
    if (not isinstance(cluster, (tuple, list)) or not 1 <= len(cluster) <= 3
            or not all(isinstance(c, int) and c >= 1 for c in cluster)):
        fail(f"cluster={cluster!r}; allowed: (x, y, z) of ints >= 1")
    cluster = tuple(cluster) + (1,) * (3 - len(cluster))
    size = cluster[0] * cluster[1] * cluster[2]
    if size > MAX_CLUSTER:
        fail(f"cluster={cluster}: {size} CTAs; at most {MAX_CLUSTER} per cluster")
    if size > 1:
        try:
            sm = _target(tr.kernel.target).sm
        except ValueError:
            sm = 90
        if sm < 90:
            fail(f"cluster={cluster} needs an sm_90 target or newer; this kernel is traced for {tr.kernel.target}: "
                 f"compile it with target='sm_90a'")
    tr.kernel.cluster = cluster
    if not isinstance(threads, int) or not 32 <= threads <= 1024 or threads % 32:
        fail(f"threads={threads!r}; allowed: a multiple of 32 from 32 to 1024")
    if callable(grid):
        fail("grid is data, not a function: write it as (x, y, z) of ints, size names and "
             "tilegen.dsl.cdiv / tilegen.dsl.minimum of them, e.g. (tilegen.dsl.cdiv('M', 128), 'BATCH', 1)")
    if _grid_operand(grid) or isinstance(grid, int):
        grid = (grid,)
    try:
        tr.kernel.grid = G.LaunchGrid(tuple(grid) if isinstance(grid, (tuple, list)) else grid, tr.kernel.cluster)
    except ValueError as e:
        fail(f"launch: {e}")
    tr.kernel.threads = threads


__all__ = ["lt", "le", "gt", "ge", "eq", "ne", "if_", "else_", "tensor", "vector", "split_tf32", "size", "scalar", "program_id", "num_programs", "thread_id", "warp_id", "lane_id", "cdiv", "divmod_by",
           "minimum", "shared", "copy_async", "commit", "wait", "barrier", "fragment", "load", "mma",
           "wgmma", "wgmma_fence", "wgmma_commit", "wgmma_wait", "fence_proxy_async",
           "store", "accumulate", "range_", "launch", "SM_COUNT", "DSLError"]
