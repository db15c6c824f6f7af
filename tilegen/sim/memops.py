"""Loads, stores and asynchronous copies: ld/st (.param, .global, .shared; scalar and
.v2/.v4), cp.async with commit_group / wait_group.

Every access is bounds-checked and alignment-checked (to the full access width, as PTX
requires); shared accesses also go through the race detector. cp.async reads its source
when issued but writes shared memory only when a wait_group retires its group.
"""
from __future__ import annotations

import numpy as np

from .memory import MemoryFault
from .ordering import semantics
from .program import Imm, Mem, Reg, Sym, Vec
from .state import STORAGE, TYPE, Context, per_thread

_WIDTH = {"b8": 1, "u8": 1, "s8": 1, "b16": 2, "u16": 2, "s16": 2, "f16": 2, "bf16": 2,
          "b32": 4, "u32": 4, "s32": 4, "f32": 4, "b64": 8, "u64": 8, "s64": 8, "f64": 8}
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
# Qualifiers that change nothing for a sequential emulator.
_IGNORED = {"weak", "volatile", "relaxed", "acquire", "release", "cta", "gpu", "sys", "ca", "cg", "cs",
            "lu", "cv", "wb", "wt", "nc", "L1::evict_normal", "L1::no_allocate", "L2::64B", "L2::128B",
            "L2::256B", "L2::cache_hint"}


def _decode(ins, ctx):
    """ld/st opcode -> (space, count, type)."""
    parts = ins.opcode.split(".")
    t = parts[-1]
    space, count = None, 1
    for p in parts[1:-1]:
        if p in ("param", "global", "shared", "shared::cta", "local", "const"):
            space = "shared" if p.startswith("shared") else p
        elif p in ("v2", "v4"):
            count = int(p[1])
        elif p not in _IGNORED:
            ctx.unsupported(ins, f"the qualifier .{p} of {ins.opcode}")
    if space is None:
        ctx.unsupported(ins, f"{ins.opcode}: generic addressing (name .global or .shared)")
    if space in ("local", "const"):
        ctx.unsupported(ins, f"{ins.opcode}: .{space} memory")
    if t not in _WIDTH:
        ctx.unsupported(ins, f"{ins.opcode}: type .{t}")
    return space, count, t


def _items(op):
    return op.items if isinstance(op, Vec) else (op,)


def _value_dtype(t):
    """What a loaded element is, as numpy: floats as floats, integers as raw unsigned bits
    (signed loads are sign-extended on the way into a wider register)."""
    if t in ("f32", "f64"):
        return np.dtype(TYPE[t])
    return np.dtype(_UINT[_WIDTH[t]])


def _writers(ins, ctx, dests, t):
    """One store function per destination register; signed narrow loads sign-extend."""
    vdt = _value_dtype(t)
    puts = []
    for d in dests:
        if not isinstance(d, Reg):
            ctx.unsupported(ins, f"destination {d!r}")
        store = np.dtype(STORAGE[d.type])
        if t.startswith("s") and store.itemsize > vdt.itemsize:
            signed = np.dtype(f"i{vdt.itemsize}")
            wide = np.dtype(f"i{store.itemsize}")
            put = ctx.writer(ins, d, wide)
            puts.append(lambda v, put=put, signed=signed, wide=wide: put(v.view(signed).astype(wide)))
        else:
            puts.append(ctx.writer(ins, d, vdt))
    return puts


def _misaligned(ctx, ins, addrs, align, tids, what):
    bad = (addrs % np.uint64(align)) != 0
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        ctx.fail(ins, f"misaligned {what}: the address must be a multiple of {align} bytes",
                 kind="misaligned", tid=tids[i], address=int(addrs[i]))


# ---- ld ---------------------------------------------------------------------------------------

def build_ld(ins, ctx: Context):
    space, count, t = _decode(ins, ctx)
    if len(ins.operands) != 2:
        ctx.unsupported(ins, f"{ins.opcode} with {len(ins.operands)} operands")
    dst, src = ins.operands
    dests = _items(dst)
    if len(dests) != count:
        ctx.unsupported(ins, f"{ins.opcode} into {len(dests)} registers")
    width = _WIDTH[t]
    puts = _writers(ins, ctx, dests, t)
    vdt = _value_dtype(t)
    if space == "param":
        return _ld_param(ins, ctx, src, width, count, vdt, puts)
    addr = ctx.address(ins, src)
    guard = ctx.guard(ins)
    n = ctx.threads
    all_tids = ctx.all_tids
    shared = space == "shared"
    nbytes = width * count
    span = np.arange(nbytes)
    strong, sem = semantics(ins.opcode.split("."))
    nc = "nc" in ins.opcode.split(".")

    def run():
        a = per_thread(addr(), n)
        if guard is None:
            tids, act = all_tids, None
        else:
            act = guard()
            if not act.any():
                return
            tids = all_tids[act]
            a = a[act]
        a = a.astype(np.uint64, copy=False)
        _misaligned(ctx, ins, a, nbytes, tids, f"{nbytes}-byte load")
        try:
            if shared:
                off = ctx.shared.offsets(a, nbytes)
                v = ctx.shadow.read(tids, off[:, None] + span, ins.line)
                if v:
                    ctx.violation(ins, v, tids)
                words = ctx.shared.words(width)[(off // width)[:, None] + np.arange(count)]
            else:
                words = ctx.memory.load(a, width, count)
        except MemoryFault as f:
            ctx.fault(ins, f, tids)
        if not shared and ctx.order is not None:   # between CTAs (ordering.py)
            if strong:
                for t, at in zip(tids.tolist(), a.tolist()):
                    ctx.order.strong(ctx, ins, t, at, reads=True, writes=False, rmw=False, sem=sem)
            else:
                ctx.order.read(ctx, ins, tids, a, nbytes, nc=nc)
        if act is not None:
            full = np.zeros((n, count), dtype=words.dtype)
            full[act] = words
            words = full
        words = words.view(vdt)
        for i, put in enumerate(puts):
            put(np.ascontiguousarray(words[:, i]))
    return run


def _ld_param(ins, ctx, src, width, count, vdt, puts):
    sizes = {name: size for name, _, size in ctx.entry.params}
    if not isinstance(src, Mem) or not isinstance(src.base, Sym) or src.base.name not in sizes:
        ctx.unsupported(ins, f"ld.param from {src!r} (name a kernel parameter)")
    name = src.base.name
    lo, hi = src.offset, src.offset + width * count
    if lo < 0 or hi > sizes[name]:
        ctx.fail(ins, f"ld.param reads bytes {lo}..{hi} of parameter {name}, which has {sizes[name]}",
                 kind="bounds")
    n = ctx.threads

    def run():  # the values of this launch (the decoded code is reused across launches)
        vals = ctx.params[name][lo:hi].view(vdt)
        for i, put in enumerate(puts):
            put(np.full(n, vals[i]))
    return run


# ---- st ---------------------------------------------------------------------------------------

def build_st(ins, ctx: Context):
    space, count, t = _decode(ins, ctx)
    if space == "param":
        ctx.unsupported(ins, "st.param")
    if len(ins.operands) != 2:
        ctx.unsupported(ins, f"{ins.opcode} with {len(ins.operands)} operands")
    dst, src = ins.operands
    items = _items(src)
    if len(items) != count:
        ctx.unsupported(ins, f"{ins.opcode} of {len(items)} values")
    width = _WIDTH[t]
    udt = _UINT[width]
    readers = [ctx.reader(ins, x, udt) for x in items]
    addr = ctx.address(ins, dst)
    guard = ctx.guard(ins)
    n = ctx.threads
    all_tids = ctx.all_tids
    shared = space == "shared"
    nbytes = width * count
    span = np.arange(nbytes)
    strong, sem = semantics(ins.opcode.split("."))

    def run():
        a = per_thread(addr(), n)
        vals = np.stack([per_thread(r(), n) for r in readers], axis=1)
        if guard is None:
            tids = all_tids
        else:
            act = guard()
            if not act.any():
                return
            tids, a, vals = all_tids[act], a[act], vals[act]
        a = a.astype(np.uint64, copy=False)
        _misaligned(ctx, ins, a, nbytes, tids, f"{nbytes}-byte store")
        try:
            if shared:
                off = ctx.shared.offsets(a, nbytes)
                v = ctx.shadow.write(tids, off[:, None] + span, ins.line, "st.shared")
                if v:
                    ctx.violation(ins, v, tids)
                ctx.shared.words(width)[(off // width)[:, None] + np.arange(count)] = vals
            else:
                ctx.memory.store(a, vals, width)
        except MemoryFault as f:
            ctx.fault(ins, f, tids)
        if not shared and ctx.order is not None:   # between CTAs (ordering.py)
            if strong:
                for t, at in zip(tids.tolist(), a.tolist()):
                    ctx.order.strong(ctx, ins, t, at, reads=False, writes=True, rmw=False, sem=sem)
            else:
                ctx.order.write(ctx, ins, tids, a, nbytes)
    return run


# ---- cp.async ---------------------------------------------------------------------------------

class AsyncBatch:
    """The copies one cp.async instruction issued (a row per thread): written to shared memory
    at retirement. `group`: each row's cp.async group among its thread's (None: uncommitted)."""

    __slots__ = ("tids", "offs", "data", "line", "group")

    def __init__(self, tids, offs, data, line, group=None):
        self.tids, self.offs, self.data, self.line, self.group = tids, offs, data, line, group

    def rows(self, pick, group=None):
        return AsyncBatch(self.tids[pick], self.offs[pick], self.data[pick], self.line, group)


def build_cp_async(ins, ctx: Context):
    parts = ins.opcode.split(".")
    if ins.opcode == "cp.async.commit_group":
        return _commit(ins, ctx)
    if parts[:3] == ["cp", "async", "wait_group"] or ins.opcode == "cp.async.wait_all":
        return _wait(ins, ctx)
    quals = set(parts[2:])
    if not ({"shared", "global"} <= quals or {"shared::cta", "global"} <= quals) or not quals & {"ca", "cg"}:
        ctx.unsupported(ins, ins.opcode)
    if quals - {"ca", "cg", "shared", "shared::cta", "global"} - _IGNORED:
        ctx.unsupported(ins, f"the qualifiers of {ins.opcode}")
    ops = ins.operands
    if len(ops) not in (3, 4) or not isinstance(ops[2], Imm):
        ctx.unsupported(ins, f"{ins.opcode} with these operands")
    size = int(ops[2].value)
    if size not in (4, 8, 16) or ("cg" in quals and size != 16):
        ctx.fail(ins, f"cp-size {size}: .ca copies 4, 8 or 16 bytes, .cg only 16", kind="unsupported")
    dst, src = ctx.address(ins, ops[0]), ctx.address(ins, ops[1])
    srcsize = None
    ignore_src = None
    if len(ops) == 4:
        if isinstance(ops[3], Reg) and ops[3].type == "pred":
            ignore_src = ctx.reader(ins, ops[3], np.bool_)
        else:
            srcsize = ctx.reader(ins, ops[3], np.uint32)
    guard = ctx.guard(ins)
    n = ctx.threads
    all_tids = ctx.all_tids
    span = np.arange(size)

    def run():
        d = per_thread(dst(), n).astype(np.uint64)
        s = per_thread(src(), n).astype(np.uint64)
        if srcsize is not None:
            k = per_thread(srcsize(), n).astype(np.int64)
        elif ignore_src is not None:
            k = np.where(ignore_src(), 0, size).astype(np.int64)
        else:
            k = np.full(n, size, dtype=np.int64)
        tids = all_tids
        if guard is not None:
            act = guard()
            if not act.any():
                return
            tids, d, s, k = all_tids[act], d[act], s[act], k[act]
        _misaligned(ctx, ins, d, size, tids, f"cp.async destination ({size} bytes)")
        _misaligned(ctx, ins, s, size, tids, f"cp.async source ({size} bytes)")
        if (k > size).any():
            i = int(np.flatnonzero(k > size)[0])
            ctx.fail(ins, f"cp.async src-size {int(k[i])} exceeds cp-size {size} (undefined behaviour)",
                     kind="bounds", tid=tids[i], address=int(s[i]))
        try:
            off = ctx.shared.offsets(d, size)
        except MemoryFault as f:
            ctx.fault(ins, f, tids)
        try:
            data = ctx.memory.load_bytes(s, k, size)   # zero-fill past src-size
        except MemoryFault as f:
            ctx.fault(ins, f, tids)
        empty = np.flatnonzero(k == 0)
        if empty.size:
            # src-size 0 reads nothing, but the address is still translated: it must lie in an
            # allocation (conservative: the H200 faulted on such a copy with a wild address).
            try:
                ctx.memory.locate(s[empty], 1)
            except MemoryFault as f:
                i = int(empty[f.index])
                ctx.fail(ins, f"cp.async with src-size 0 from an address outside every allocation "
                              f"({ctx.memory.describe(int(s[i]))})", kind="bounds", tid=tids[i], address=int(s[i]))
        if ctx.order is not None:   # between CTAs (ordering.py)
            ctx.order.read(ctx, ins, tids, s, size, lengths=k)
        offs = off[:, None] + span
        v = ctx.shadow.issue_async(tids, offs, ins.line)
        if v:
            ctx.violation(ins, v, tids)
        ctx.uncommitted.append(AsyncBatch(tids, offs, data, ins.line))
    return run


def _running(ins, ctx):
    """A function giving the threads that execute the instruction: its guard's, and in code
    decoded for warps that parted (ctx.masked, at decode time) the running group's; else all."""
    guard = ctx.guard(ins)
    if guard is not None:
        return guard
    every = np.ones(ctx.threads, dtype=bool)
    return lambda: every


def _commit_rows(ctx, running):
    """The running threads' uncommitted copies become their next group (groups are per thread,
    as on the GPU: warps in roles commit and wait on their own)."""
    left = []
    for b in ctx.uncommitted:
        mine = running[b.tids]
        if mine.any():
            ctx.groups.append(b.rows(mine, ctx.commits[b.tids[mine]]))
        if not mine.all():
            left.append(b.rows(~mine))
    ctx.uncommitted = left
    ctx.commits[running] += 1


def _commit(ins, ctx):
    running = _running(ins, ctx)

    def run():
        _commit_rows(ctx, running())
    return run


def _wait(ins, ctx):
    if ins.opcode == "cp.async.wait_all":
        keep = 0
        commit_first = True
    else:
        if len(ins.operands) != 1 or not isinstance(ins.operands[0], Imm):
            ctx.unsupported(ins, f"{ins.opcode} without an immediate count")
        keep = int(ins.operands[0].value)
        commit_first = False

    threads = _running(ins, ctx)

    def run():
        running = threads()
        if commit_first:
            _commit_rows(ctx, running)
        # A running thread's groups complete in commit order: all but its newest `keep` retire
        # (in issue order, so a later copy of the same bytes lands last).
        left = []
        for b in ctx.groups:
            done = running[b.tids] & (b.group < ctx.commits[b.tids] - keep)
            if done.any():
                ctx.shared.data[b.offs[done]] = b.data[done]
                ctx.shadow.retire_async(b.tids[done], b.offs[done], b.line)
            if not done.all():
                left.append(b.rows(~done, b.group[~done]))
        ctx.groups = left
    return run


BUILDERS = {"ld": build_ld, "st": build_st, "cp.async": build_cp_async}
