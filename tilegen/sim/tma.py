"""TMA on the emulator: loads (cp.async.bulk.tensor.2d/3d ... .mbarrier::complete_tx::bytes),
stores (cp.async.bulk.tensor.2d/3d.global.shared::cta ... .bulk_group with commit_group and
wait_group.read), and the emulator's own tensor maps (2-D matrices, 3-D stacks of them).

A real CUtensorMap is opaque (the driver encodes it), so on the emulator the launch passes a
tensor map of the emulator's own format instead (`encode_tensor_map`, the same fields as
cuTensorMapEncodeTiled takes); run_kernel builds them from the kernel's declarations.

The copy reads its box when issued: box_rows rows of box_cols elements from (c1, c0)
(innermost coordinate first, signed) of matrix c2 of a stack, elements outside the matrix
(or the stack) as zeros; it writes shared
memory row by row with the map's swizzle applied to the shared address (ptx.md 6.5) when it
lands, and completes box bytes on its mbarrier (sim/mbarrier.py). The destination must be
128-byte aligned, and 1024-byte aligned with the 128B swizzle (the pattern wgmma expects).

A store reads its box from shared memory (unswizzling it) and writes the elements inside the
matrix to global memory when issued; its shared bytes count as read by the async proxy until
a wait_group.read of the issuing thread retires its bulk group: writing them before is
reported, and so is reading bytes the threads wrote without fence.proxy.async or without a
barrier ordering them before the issuing thread (SharedShadow.issue_bulk_read). Its global
writes count as in flight until a wait_group without .read of the issuing thread retires the
group (the completion makes them visible to that thread, PTX ISA, cp.async.bulk.wait_group):
until then nothing orders them before any access, the issuing thread's own included, so a
release before that completion publishes nothing (sim/ordering.py).
"""
from __future__ import annotations

import struct

import numpy as np

from ..arch import tma as A
from .errors import SimError
from .cluster import peer_context
from .mbarrier import BulkCopy, name_of, state
from .ordering import cta_index
from .memory import MemoryFault
from .program import Imm, Mem, TensorRef
from .state import Context, per_thread

MAGIC = b"TGTM"
# magic, version, ptr, rows, cols, pitch, box rows, box cols, esize, swizzle, matrices, bytes between them
_FORMAT = struct.Struct("<4sIQQQQIIIIQQ")
_SWIZZLE_BITS = {0: 0, 1: 1, 2: 2, 3: 3}
_SPAN = {1: 32, 2: 64, 3: 128}
RANKS = (2, 3)
OPCODES = {f"cp.async.bulk.tensor.{r}d.shared::cluster.global{tile}.mbarrier::complete_tx::bytes"
           for r in RANKS for tile in (".tile", "")}
MULTICAST = ".multicast::cluster"   # + a 16-bit CTA mask operand: the box lands in every CTA of the mask
STORE_OPCODES = {f"cp.async.bulk.tensor.{r}d.global.shared::cta{tile}.bulk_group" for r in RANKS for tile in (".tile", "")}


def encode_tensor_map(decl: A.TensorMapDecl, ptr: int, rows: int, cols: int, ld: int, *stack: int) -> bytes:
    """The emulator's 128-byte tensor map of this matrix, or of a stack of them (`stack` =
    (stride, count)): the fields cuTensorMapEncodeTiled takes."""
    why = decl.problem(ptr, rows, cols, ld, *stack)
    if why is not None:
        raise SimError(f"{decl.tensor} cannot go through TMA: {why}")
    matrices, apart = decl.stack(rows, cols, ld, *stack) if decl.rank == 3 else (1, 0)
    raw = _FORMAT.pack(MAGIC, 1, ptr, rows, cols, decl.pitch(rows, cols, ld), decl.box_rows, decl.box_cols, decl.esize,
                       A.SWIZZLE_CODE[decl.swizzle], matrices, apart)
    return raw.ljust(A.TENSOR_MAP_BYTES, b"\0")


def fill_tensor_maps(decls, args: dict) -> dict:
    """args with the kernel's tensor maps the caller did not give, in the emulator's format."""
    if not decls:
        return args
    out = dict(args)
    for decl in decls:
        if decl.param not in out:
            out[decl.param] = encode_tensor_map(decl, *decl.operand(args))
    return out


def _decode_map(ins, ctx, name: str):
    raw = bytes(ctx.params[name][:_FORMAT.size])
    magic, version, ptr, rows, cols, pitch, box_rows, box_cols, esize, swz, matrices, apart = _FORMAT.unpack(raw)
    if magic != MAGIC or version != 1:
        ctx.fail(ins, f"parameter {name} does not hold an emulator tensor map (a map encoded by the CUDA driver is "
                      f"opaque to the emulator: let run_kernel build it)", kind="tma")
    return ptr, rows, cols, pitch, box_rows, box_cols, esize, swz, matrices, apart


def build_bulk(ins, ctx: Context):
    if ins.opcode in STORE_OPCODES:
        return _build_store(ins, ctx)
    if ins.opcode == "cp.async.bulk.commit_group":
        return _build_commit(ins, ctx)
    if ins.opcode in ("cp.async.bulk.wait_group.read", "cp.async.bulk.wait_group"):
        return _build_wait(ins, ctx)
    multicast = ins.opcode.endswith(MULTICAST)
    if ins.opcode.removesuffix(MULTICAST) not in OPCODES:
        ctx.unsupported(ins, f"the instruction {ins.opcode} (of the bulk copies, only 2-D TMA loads completing on "
                             f"an mbarrier)")
    ops = ins.operands
    rank = _rank(ins)
    if len(ops) != 3 + multicast or not isinstance(ops[0], Mem) or not isinstance(ops[1], TensorRef) \
            or not isinstance(ops[2], Mem) or len(ops[1].coords) != rank:
        ctx.unsupported(ins, f"{ins.opcode} with these operands ([dst], [tensor map, {{{_coord_names(rank)}}}], "
                             f"[mbarrier]{', ctaMask' if multicast else ''})")
    dst = ctx.address(ins, ops[0])
    bar = ctx.address(ins, ops[2])
    desc = ctx.reader(ins, ops[1].desc, np.uint64)
    coords = [ctx.reader(ins, c, np.uint32) for c in ops[1].coords]
    mask = ctx.reader(ins, ops[3], np.uint32) if multicast else None
    guard = ctx.guard(ins)
    n = ctx.threads

    def run():
        tids = ctx.all_tids if guard is None else ctx.all_tids[guard()]
        d_all, b_all, m_all = per_thread(dst(), n), per_thread(bar(), n), per_thread(desc(), n)
        c_all = [per_thread(c(), n).view(np.int32) for c in coords]
        k_all = per_thread(mask(), n) if multicast else None
        for t in tids.tolist():
            ranks = _mask_ranks(ins, ctx, t, int(k_all[t])) if multicast else (ctx.rank,)
            _issue(ins, ctx, t, int(d_all[t]), int(b_all[t]), int(m_all[t]), tuple(int(c[t]) for c in c_all), ranks)
    return run


def _rank(ins) -> int:
    """The dimensions of a bulk tensor copy's coordinates (its .2d / .3d)."""
    return int(ins.opcode.split(".")[4][0])


def _coord_names(rank: int) -> str:
    return ", ".join(f"c{i}" for i in range(rank))


def _mask_ranks(ins, ctx, tid, mask: int) -> tuple:
    """The CTA ranks a multicast's 16-bit mask selects."""
    size = ctx.cluster.size if ctx.cluster is not None else 1
    ranks = tuple(r for r in range(16) if mask >> r & 1)
    if not ranks or mask >> 16 or ranks[-1] >= size:
        ctx.fail(ins, f"a TMA multicast with CTA mask {mask:#x}: its bits must name CTAs of the cluster (ranks 0.."
                      f"{size - 1}), at least one", kind="cluster", tid=tid)
    return ranks


def _map_of(ins, ctx, tid, desc):
    """(parameter name, the map's fields, bytes per box row) of a tensor-map operand, whose
    rank must be the instruction's."""
    name = ctx.param_at.get(desc)
    if name is None:
        ctx.fail(ins, f"the tensor-map operand {desc:#x} is not the address of a kernel parameter "
                      f"(mov.b64 + cvta.param of a .param .b8 [128])", kind="tma", tid=tid)
    fields = _decode_map(ins, ctx, name)
    box_cols, esize, swz, _, apart = fields[5:]
    if (3 if apart else 2) != _rank(ins):
        ctx.fail(ins, f"a {_rank(ins)}-D TMA copy through {name}, a {3 if apart else 2}-D tensor map", kind="tma",
                 tid=tid)
    row_bytes = box_cols * esize
    if swz and row_bytes != _SPAN[swz]:
        ctx.unsupported(ins, f"a swizzled box whose rows ({row_bytes} bytes) are not the swizzle span")
    return name, fields, row_bytes


def _issue(ins, ctx, tid, dst, bar_addr, desc, coords, ranks):
    name, (ptr, rows, cols, pitch, box_rows, box_cols, esize, swz, matrices, apart), row_bytes = \
        _map_of(ins, ctx, tid, desc)
    c0, c1, ptr, rows = _in_stack(coords, ptr, rows, matrices, apart)
    offs = _box_offsets(ins, ctx, tid, dst, box_rows, row_bytes, swz, "the TMA destination")
    try:
        bar_off = int(ctx.shared.offsets(np.array([bar_addr], dtype=np.uint64), 8)[0])
    except MemoryFault as f:
        ctx.fail(ins, f.reason, kind="bounds", tid=tid, address=f.address)
    dests = [peer_context(ins, ctx, r, "a TMA multicast", tid) for r in ranks]
    for d in dests:   # the barrier must exist in every CTA the box lands in
        if d is ctx:
            state(ins, ctx, bar_off, tid)
        elif bar_off not in d.mbarriers:
            ctx.fail(ins, f"a TMA multicast completes on {name_of(d, bar_off)} of CTA rank {d.rank} before that CTA "
                          f"initialised it (a cluster barrier after mbarrier.init orders the two)", kind="mbarrier",
                     tid=tid)
    # the box, read now: rows c1.., columns c0.., zeros outside the matrix (and the stack)
    reads = None
    box = np.zeros((box_rows, row_bytes), dtype=np.uint8)
    r_lo, r_hi = max(c1, 0), min(c1 + box_rows, rows)
    k_lo, k_hi = max(c0, 0), min(c0 + box_cols, cols)
    if r_lo < r_hi and k_lo < k_hi:
        for r in range(r_lo, r_hi):
            try:
                got = ctx.memory.read(ptr + r * pitch + k_lo * esize, (k_hi - k_lo) * esize)
            except (MemoryFault, SimError) as e:
                ctx.fail(ins, f"the TMA copy from {name} reads row {r} outside every allocation ({e})",
                         kind="bounds", tid=tid)
            box[r - c1, (k_lo - c0) * esize:(k_hi - c0) * esize] = got
        if ctx.order is not None:   # between CTAs (ordering.py): in flight until the copy lands
            copy = ctx.order.new_copy()
            addrs, width = _order_rows(ins, ctx, tid, ptr, pitch, esize, r_lo, r_hi, k_lo, k_hi, write=False, copy=copy)
            reads = (copy, cta_index(ctx), tid, addrs, width)
    for d in dests:
        v = d.shadow.issue_bulk(tid + ctx.shadow.base, offs, ins.line, foreign=True)
        if v:
            where = "" if d is ctx else f" (the multicast into CTA rank {d.rank})"
            ctx.fail(ins, v.message + where, kind=v.kind, tid=tid, address=d.shared.base + v.offset)
        d.bulk.append(BulkCopy(bar_off, offs, box.reshape(-1), box_rows * row_bytes, ins.line, reads))
        d.progress += 1


def _box_offsets(ins, ctx, tid, addr, box_rows, row_bytes, swz, what: str):
    """The shared offsets of a box at `addr` (row by row, the swizzle applied)."""
    align = 1024 if swz == 3 else A.SMEM_ALIGN
    if (addr - ctx.shared.base) % align and addr % align:
        ctx.fail(ins, f"{what} {addr:#x} is not {align}-byte aligned", kind="misaligned", tid=tid, address=addr)
    try:
        ctx.shared.offsets(np.array([addr], dtype=np.uint64), box_rows * row_bytes)
    except MemoryFault as f:
        ctx.fail(ins, f.reason, kind="bounds", tid=tid, address=f.address)
    linear = addr + np.arange(box_rows * row_bytes, dtype=np.int64)
    bits = _SWIZZLE_BITS[swz]
    swizzled = linear ^ (((linear >> 7) & ((1 << bits) - 1)) << 4) if bits else linear
    return swizzled - ctx.shared.base


def _build_store(ins, ctx):
    ops = ins.operands
    if len(ops) != 2 or not isinstance(ops[0], TensorRef) or not isinstance(ops[1], Mem) \
            or len(ops[0].coords) != _rank(ins):
        ctx.unsupported(ins, f"{ins.opcode} with these operands ([tensor map, {{{_coord_names(_rank(ins))}}}], [src])")
    src = ctx.address(ins, ops[1])
    desc = ctx.reader(ins, ops[0].desc, np.uint64)
    coords = [ctx.reader(ins, c, np.uint32) for c in ops[0].coords]
    guard = ctx.guard(ins)
    n = ctx.threads

    def run():
        tids = ctx.all_tids if guard is None else ctx.all_tids[guard()]
        s_all, m_all = per_thread(src(), n), per_thread(desc(), n)
        c_all = [per_thread(c(), n).view(np.int32) for c in coords]
        for t in tids.tolist():
            _store(ins, ctx, t, int(s_all[t]), int(m_all[t]), tuple(int(c[t]) for c in c_all))
    return run


def _in_stack(coords, ptr, rows, matrices, apart):
    """(c0, c1, the matrix's pointer, its rows) of a box at `coords`: a matrix index outside
    the stack leaves no row inside."""
    c0, c1 = coords[:2]
    if len(coords) == 3:
        if not 0 <= coords[2] < matrices:
            return c0, c1, ptr, 0
        ptr += coords[2] * apart
    return c0, c1, ptr, rows


def _store(ins, ctx, tid, src, desc, coords):
    name, (ptr, rows, cols, pitch, box_rows, box_cols, esize, swz, matrices, apart), row_bytes = \
        _map_of(ins, ctx, tid, desc)
    c0, c1, ptr, rows = _in_stack(coords, ptr, rows, matrices, apart)
    offs = _box_offsets(ins, ctx, tid, src, box_rows, row_bytes, swz, "the TMA store's source")
    v = ctx.shadow.issue_bulk_read(tid, offs, ins.line)
    if v:
        ctx.violation(ins, v, np.array([tid]))
    box = ctx.shared.data[offs].reshape(box_rows, row_bytes)
    r_lo, r_hi = max(c1, 0), min(c1 + box_rows, rows)
    k_lo, k_hi = max(c0, 0), min(c0 + box_cols, cols)
    for r in range(r_lo, r_hi) if k_lo < k_hi else ():
        try:
            ctx.memory.write(ptr + r * pitch + k_lo * esize, box[r - c1, (k_lo - c0) * esize:(k_hi - c0) * esize])
        except (MemoryFault, SimError) as e:
            ctx.fail(ins, f"the TMA store to {name} writes row {r} outside every allocation ({e})", kind="bounds", tid=tid)
    if ctx.order is not None and r_lo < r_hi and k_lo < k_hi:   # between CTAs (ordering.py): in flight
        rows = _order_rows(ins, ctx, tid, ptr, pitch, esize, r_lo, r_hi, k_lo, k_hi, write=True)
        ctx.bulk_writes.setdefault(tid, [[]])[-1].append(rows)
    ctx.bulk_reads.setdefault(tid, [[]])[-1].append((offs, ins.line))


def _order_rows(ins, ctx, tid, ptr, pitch, esize, r_lo, r_hi, k_lo, k_hi, write: bool, copy: int = -1):
    """The box's rows in global memory as thread tid's weak accesses, when issued (a store's
    writes, a load's reads in flight); (their addresses, bytes per row)."""
    rows = np.arange(r_lo, r_hi, dtype=np.uint64)
    addrs = np.uint64(ptr + k_lo * esize) + rows * np.uint64(pitch)
    tids = np.full(rows.size, tid, dtype=np.int64)
    width = (k_hi - k_lo) * esize
    if write:
        ctx.order.write(ctx, ins, tids, addrs, width, in_flight=True)
    else:
        ctx.order.read(ctx, ins, tids, addrs, width, copy=copy)
    return addrs, width


def _build_commit(ins, ctx):
    guard = ctx.guard(ins)

    def run():
        tids = ctx.all_tids if guard is None else ctx.all_tids[guard()]
        for t in tids.tolist():
            ctx.bulk_reads.setdefault(t, [[]]).append([])
            ctx.bulk_writes.setdefault(t, [[]]).append([])
    return run


def _build_wait(ins, ctx):
    if len(ins.operands) != 1 or not isinstance(ins.operands[0], Imm):
        ctx.unsupported(ins, f"{ins.opcode} without an immediate count")
    keep = int(ins.operands[0].value)
    complete = not ins.opcode.endswith(".read")   # the writes done too, not only the shared reads
    guard = ctx.guard(ins)

    def run():
        tids = ctx.all_tids if guard is None else ctx.all_tids[guard()]
        for t in tids.tolist():
            for offs, line in _retire(ctx.bulk_reads, t, keep):
                ctx.shadow.retire_bulk_read(t, offs, line)
            if complete:
                for addrs, width in _retire(ctx.bulk_writes, t, keep):
                    if ctx.order is not None:
                        ctx.order.complete(ctx, t, addrs, width)
    return run


def _retire(groups_of: dict, t: int, keep: int) -> list:
    """The entries of thread t's committed groups past the newest `keep`, taken out (the last
    list collects entries not yet committed)."""
    groups = groups_of.get(t)
    if not groups:
        return []
    closed, out = groups[:-1], []
    while len(closed) > keep:
        out.extend(closed.pop(0))
    groups_of[t] = closed + groups[-1:]
    return out


def pending_store_reads(ctx):
    """(thread, PTX line) of a TMA store whose shared reads no wait_group.read retired, or None."""
    for t, groups in ctx.bulk_reads.items():
        for g in groups:
            if g:
                return t, g[0][1]
    return None


BUILDERS = {"cp.async.bulk": build_bulk}

__all__ = ["BUILDERS", "encode_tensor_map", "fill_tensor_maps", "pending_store_reads"]
