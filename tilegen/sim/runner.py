"""Launching PTX on the emulator: pack the parameters, lay out shared memory, decode the
entry once, then run the grid CTA by CTA (all threads of a CTA at once).

Shared memory: static arrays first, then the dynamic (.extern) array, in a window that
starts at `shared_base` (default 16: 16-byte aligned but not 1024-aligned, so a kernel
that assumes the .align of its extern array, instead of rounding the base up itself,
shows it). The dynamic array gets the full size the launch asks for.
"""
from __future__ import annotations

import itertools
import math
import numbers
import re
import threading
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Optional

import numpy as np

from .cluster import MAX_CLUSTER, Cluster
from .signals import END, Barrier, Converge, Diverge, Exit, Wait
from .decode import decode
from .errors import SimError
from ..errors import missing_arguments
from .mbarrier import name_of
from .memory import GlobalMemory
from .ordering import GlobalOrder
from .parser import parse_ptx
from .progress import ticking
from .program import Program
from .state import Context
from .tma import fill_tensor_maps, pending_store_reads

SHARED_BASE = 16
MAX_JUMPS = 10_000_000        # per CTA: a kernel looping longer than this is stuck
_LOCK = threading.Lock()

_PARAM_DTYPE = {"u8": np.uint8, "s8": np.int8, "b8": np.uint8, "u16": np.uint16, "s16": np.int16,
                "b16": np.uint16, "u32": np.uint32, "s32": np.int32, "b32": np.uint32, "f32": np.float32,
                "u64": np.uint64, "s64": np.int64, "b64": np.uint64, "f64": np.float64}


@dataclass
class LaunchStats:
    ctas: int = 0
    instructions: int = 0     # dynamic count, summed over CTAs (one per CTA-wide step)


def _pack_param(name, type_, nbytes, value) -> np.ndarray:
    if isinstance(value, (bytes, bytearray, memoryview)) or (isinstance(value, np.ndarray) and value.ndim):
        raw = np.frombuffer(bytes(value), dtype=np.uint8) if not isinstance(value, np.ndarray) \
            else np.ascontiguousarray(value).reshape(-1).view(np.uint8)
        if raw.size != nbytes and isinstance(value, np.ndarray) and type_ in ("u64", "b64", "s64"):
            raise SimError(f"parameter {name} (.{type_}) takes an address, not an array ({value.dtype} {value.shape}): "
                           f"put the array in the emulator's memory (address = memory.alloc(a.nbytes); "
                           f"memory.write(address, a)) and pass the address")
        if raw.size != nbytes:
            raise SimError(f"parameter {name} takes {nbytes} bytes, got {raw.size}")
        return raw.copy()
    dt = np.dtype(_PARAM_DTYPE[type_])
    if nbytes != dt.itemsize:
        raise SimError(f"parameter {name} is an array of {nbytes} bytes: pass bytes")
    if dt.kind == "f":
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
            raise SimError(f"parameter {name} (.{type_}): {value!r} ({type(value).__name__}) is not a real number")
        with np.errstate(over="ignore"):
            rounded = dt.type(value)
        if math.isfinite(float(value)) and not np.isfinite(rounded):   # (a finite value its rounding takes to inf)
            raise SimError(f"parameter {name} (.{type_}): {float(value)!r} overflows {dt.name} (largest "
                           f"{float(np.finfo(dt).max):.8g})")
        return np.array([value], dtype=dt).view(np.uint8)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise SimError(f"parameter {name} (.{type_}): {value!r} ({type(value).__name__}) is not an integer")
    v, bits = int(value), 8 * dt.itemsize
    # as the GPU's launch packs them (runtime/params.py): unsigned from 0, signed both ways; a bit type either
    lo = -(1 << (bits - 1)) if type_[0] in "sb" else 0
    hi = (1 << (bits - 1)) - 1 if type_[0] == "s" else (1 << bits) - 1
    if not lo <= v <= hi:
        raise SimError(f"parameter {name} (.{type_}): {v} is out of range {lo}..{hi}")
    return np.array([v & ((1 << bits) - 1)], dtype=np.dtype(f"u{dt.itemsize}")).view(np.uint8)


def _params(entry, args: dict) -> dict:
    names = [p[0] for p in entry.params]
    missing = [n for n in names if n not in args]
    extra = [n for n in args if n not in names]
    if missing or extra:
        raise SimError(f"{entry.name}: " + "; ".join(
            x for x in (f"missing arguments {', '.join(missing)}" if missing else "",
                        f"unknown arguments {', '.join(extra)}" if extra else "") if x)
            + f" (parameters: {', '.join(names)})")
    return {n: _pack_param(n, t, size, args[n]) for n, t, size in entry.params}


def _shared_layout(program: Program, entry, base: int, dynamic_bytes: int):
    symbols, at = {}, base
    for d in program.shared + entry.shared:
        if d.size is None:
            continue
        at = -(-at // d.align) * d.align
        symbols[d.name] = at
        at += d.size
    dyn = -(-at // 16) * 16
    for d in program.shared + entry.shared:
        if d.size is None:
            symbols[d.name] = dyn   # every extern array aliases the dynamic block
    return symbols, dyn + int(dynamic_bytes) - base


def launch(ptx, grid, threads: int, args: dict, *, memory: GlobalMemory, entry: Optional[str] = None,
           shared_bytes: int = 0, shared_base: int = SHARED_BASE, barriers=(), cluster=None,
           stats: Optional[LaunchStats] = None) -> LaunchStats:
    """Run `entry` of a PTX module (text or parsed Program) over `grid` CTAs of `threads`
    threads; pointer arguments are addresses in `memory`. `barriers` ((name, offset from
    the 1024-aligned dynamic shared base, stages)) name the mbarriers in messages. `cluster`
    (x, y, z), or the entry's .reqnctapercluster: the CTAs of each cluster run side by side
    (sim/cluster.py). `stats`, if given, is counted into as the CTAs finish (and returned)."""
    program = parse_ptx(ptx) if isinstance(ptx, str) else ptx
    ent = program.entry(entry)
    grid = tuple(int(g) for g in (tuple(grid) + (1, 1, 1))[:3])
    threads = int(threads)
    if threads <= 0 or min(grid) < 0:
        raise SimError(f"launch of {ent.name}: grid {grid} and {threads} threads")
    if ent.reqntid is not None:
        want = int(np.prod(ent.reqntid))
        if tuple(ent.reqntid[1:]) not in ((), (1,), (1, 1)) or want != threads:
            raise SimError(f"{ent.name} declares .reqntid {', '.join(map(str, ent.reqntid))}; "
                           f"the launch has {threads} threads (the emulator runs 1-D blocks)")
    dims = _cluster_dims(ent, grid, cluster)
    size = int(np.prod(dims))
    params = _params(ent, args)
    symbols, shared_size = _shared_layout(program, ent, int(shared_base), shared_bytes)
    key = (ent.name, threads, shared_size, int(shared_base), tuple(sorted(symbols.items())))
    taken = []
    with _LOCK:  # take the decoded code out of the cache while running (another thread decodes anew)
        for r in range(size):
            taken.append(program.decoded.pop(key + (r,), (None, None)))
    for r, (ctx, code) in enumerate(taken):
        if ctx is None:
            ctx = Context(ent, threads, shared_size, int(shared_base), symbols)
            taken[r] = (ctx, decode(ctx))
    ctxs = [c for c, _ in taken]
    group = Cluster(ctxs) if size > 1 else None
    names = _barrier_names(program, ent, int(shared_base), symbols, barriers)
    order = GlobalOrder()   # global memory between the CTAs of this launch
    for r, ctx in enumerate(ctxs):
        ctx.cluster, ctx.cluster_dims, ctx.rank = group, dims, r
        ctx.barrier_names = names
        ctx.order = order
        ctx.bind(params, grid, memory)
    stats = stats if stats is not None else LaunchStats()
    try:
        with np.errstate(all="ignore"):
            if group is None:
                ctx, code = taken[0]
                for z, y, x in itertools.product(range(grid[2]), range(grid[1]), range(grid[0])):
                    ctx.start_cta((x, y, z))
                    stats.instructions += _run_cta(ctx, code)
                    stats.ctas += 1
            else:
                cx, cy, cz = dims
                for z, y, x in itertools.product(range(0, grid[2], cz), range(0, grid[1], cy), range(0, grid[0], cx)):
                    ctas = [(x + i % cx, y + (i // cx) % cy, z + i // (cx * cy)) for i in range(size)]
                    stats.instructions += group.run(ctas, [c for _, c in taken], _run_cta)
                    stats.ctas += size
    except SimError as e:
        if e.line is not None and isinstance(ptx, str):
            e.at_source(source_of(ptx.splitlines(), e.line))
        raise
    finally:
        for r, (ctx, code) in enumerate(taken):
            ctx.bind({}, (1, 1, 1), None)
            ctx.cluster, ctx.cluster_dims, ctx.rank, ctx.order = None, (1, 1, 1), 0, None
            with _LOCK:
                program.decoded[key + (r,)] = (ctx, code)
    return stats


_LOCATION = re.compile(r"^\s*// \(([^()]+:\d+)\)\s*$")   # what the generator writes before an op's code


def source_of(lines, line: int) -> str:
    """Where PTX line `line` comes from, as the comments a tilegen kernel's PTX carries before
    each op say it: "file.py:NN (the op)", or "" for PTX without them."""
    what = ""
    for i in range(min(line, len(lines)) - 2, -1, -1):
        text = lines[i].strip()
        if text.startswith(".visible") or text.startswith(".entry"):
            break
        if not text.startswith("//"):
            continue
        m = _LOCATION.match(lines[i])
        if m:
            return m.group(1) + (f" ({what})" if what else "")
        if not what and not text.startswith("// role"):
            what = text[2:].strip()
    return ""


def _cluster_dims(ent, grid, cluster) -> tuple:
    dims = tuple(int(c) for c in (tuple(cluster) + (1, 1, 1))[:3]) if cluster else ent.cluster or (1, 1, 1)
    if ent.cluster is not None and cluster and tuple(ent.cluster) != dims:
        raise SimError(f"{ent.name} declares .reqnctapercluster {', '.join(map(str, ent.cluster))}; the launch asks "
                       f"for clusters of {dims}")
    size = int(np.prod(dims))
    if min(dims) < 1 or size > MAX_CLUSTER:
        raise SimError(f"launch of {ent.name}: clusters of {dims}; each dimension >= 1, at most {MAX_CLUSTER} CTAs")
    if any(g % c for g, c in zip(grid, dims)):
        raise SimError(f"launch of {ent.name}: the grid {grid} is not a whole number of clusters of {dims}")
    return dims


def _barrier_names(program, ent, base: int, symbols: dict, barriers) -> dict:
    """shared offset -> "name[stage]" of a tilegen kernel's mbarriers (its dynamic array is
    rounded up to 1024 bytes inside the kernel)."""
    dyn = [symbols[d.name] for d in program.shared + ent.shared if d.size is None]
    if not barriers or not dyn:
        return {}
    start = -(-dyn[0] // 1024) * 1024
    return {start + off + 8 * s - base: f"{name}[{s}]" for name, off, stages in barriers for s in range(stages)}


def _run_cta(ctx: Context, code: list) -> int:
    """Run one CTA in lockstep; when its threads part, go on with one program counter per
    group of threads (_Apart) until they are together again."""
    n = len(code)
    pc = steps = 0
    jumps = [0]
    try:
        while pc < n:
            nxt = code[pc]()
            steps += 1
            if nxt is None:
                pc += 1
            elif nxt.__class__ is int:
                if nxt == END:
                    break
                pc = nxt
                _count_jump(ctx, jumps, pc)
            else:
                apart = _Apart(ctx, jumps)
                pc, more = apart.run(pc, nxt, np.ones(ctx.threads, dtype=bool))
                steps += more
                if pc is None:
                    break
        if ctx.bulk:   # (on the GPU the CTA's shared memory may go to another CTA while the copy writes it)
            c = ctx.bulk[0]
            ins = next(i for i in ctx.entry.instrs if i.line == c.line)
            raise SimError(f"the CTA ends while a TMA copy into its shared memory has not landed: nothing waited on "
                           f"{name_of(ctx, c.bar)} for it; wait for the phase it completes (mbarrier try_wait) before "
                           f"the kernel exits", kind="tma", line=c.line, text=ins.text, cta=ctx.cta)
        left = pending_store_reads(ctx)
        if left is not None:
            tid, line = left
            ins = next(i for i in ctx.entry.instrs if i.line == line)
            raise SimError("the CTA ends while a TMA store still reads shared memory: wait for it "
                           "(cp.async.bulk.wait_group.read) before the kernel exits", kind="tma", line=line,
                           text=ins.text, cta=ctx.cta, tid=tid)
    except SimError:
        raise
    except Exception as e:  # an emulator bug: say where it happened
        ins = ctx.entry.instrs[min(pc, n - 1)]
        raise SimError(f"internal emulator error ({type(e).__name__}: {e})", kind="internal",
                       line=ins.line, text=ins.text, cta=ctx.cta) from e
    finally:
        ctx.active = None
    return steps


def _count_jump(ctx, jumps, pc):
    jumps[0] += 1
    if jumps[0] > MAX_JUMPS:
        ins = ctx.entry.instrs[pc]
        raise SimError(f"CTA {ctx.cta} took more than {MAX_JUMPS} branches: an endless loop?",
                       kind="hang", line=ins.line, text=ins.text, cta=ctx.cta)


class _Group:
    """Threads at one program counter. `at_barrier`: waiting at a bar.sync; `converging`: waiting
    at a warpgroup instruction for the rest of its warpgroup (a Converge); `stuck`: its last
    turn ended on a wait that nothing in flight can complete: (the deadlock to report, the
    value of ctx.progress then)."""

    def __init__(self, pc: int, mask: np.ndarray):
        self.pc, self.mask = pc, mask
        self.at_barrier = None
        self.converging = None
        self.stuck = None

    @property
    def waiting(self) -> bool:
        return self.at_barrier is not None or self.converging is not None


class _Apart:
    """The CTA after its threads parted: groups of threads, each with its program counter,
    run in turn on the masked code. A group runs until it waits (a barrier, an incomplete
    mbarrier phase) or leaves; groups at the same instruction merge. When one group holds
    every thread again, the CTA goes back to lockstep (run returns its pc)."""

    def __init__(self, ctx: Context, jumps: list):
        self.ctx, self.jumps = ctx, jumps
        if ctx.masked_code is None:
            ctx.masked_code = decode(ctx, masked=True)
        self.code = ctx.masked_code
        self.steps = 0

    def run(self, pc: int, signal, mask: np.ndarray):
        """Start from lockstep code at `pc` that returned `signal` for the threads `mask`;
        returns (pc to resume lockstep at, or None when the CTA ended; steps)."""
        self.live = mask.copy()
        self.groups = []
        for g in self._split(_Group(pc, mask), signal):
            self._add(g)
        turn = 0
        while self.groups:
            ready = [g for g in self.groups if not g.waiting]
            if not ready:
                apart = next((g for g in self.groups if g.converging is not None), None)
                if apart is not None:   # (what it waits for waits at a barrier it cannot pass, or left)
                    raise apart.converging.error
                raise self._barrier_deadlock()
            g = ready[turn % len(ready)]
            turn += 1
            for h in self._step(g):
                self._add(h)
            self._release_barriers()
            self._merge()
            self._converge()
            if self._deadlocked():
                if self.ctx.cluster is None:
                    raise self._deadlock()
                self.ctx.cluster.block(self.ctx, self._deadlock())   # a peer CTA may move it
            if len(self.groups) == 1 and self.live.all() and not self.groups[0].waiting:
                self.ctx.active = None
                return self.groups[0].pc, self.steps
        return None, self.steps

    def _add(self, g):
        if g.mask.any():
            self.groups.append(g)

    def _step(self, g: _Group) -> list:
        """Run group g until it waits, parts or ends; returns the groups it became."""
        ctx, code, n = self.ctx, self.code, len(self.code)
        self.groups.remove(g)
        ctx.active = g.mask
        g.stuck = None
        pc = g.pc
        while pc < n:
            nxt = code[pc]()
            self.steps += 1
            if nxt is None:
                pc += 1
                continue
            if nxt.__class__ is int:
                if nxt == END:
                    self.live &= ~g.mask
                    return []
                pc = nxt
                _count_jump(ctx, self.jumps, pc)
                continue
            g.pc = pc
            return self._split(g, nxt)
        self.live &= ~g.mask
        return []

    def _split(self, g: _Group, signal) -> list:
        """The groups g becomes after `signal`."""
        if isinstance(signal, Diverge):
            return [_Group(g.pc + 1, g.mask & ~signal.taken), _Group(signal.target, signal.taken)]
        if isinstance(signal, Exit):
            self.live &= ~signal.leaving
            return [_Group(g.pc + 1, g.mask & ~signal.leaving)]
        if isinstance(signal, Barrier):
            g.at_barrier = signal
            return [g]
        if isinstance(signal, Converge):
            g.converging = signal   # (its pc stays: the instruction runs once the warpgroup is whole)
            return [g]
        if isinstance(signal, Wait):
            g.pc += 0 if signal.again else 1
            g.stuck = signal.stuck
            return [g]
        raise TypeError(f"unknown signal {signal!r}")

    def _merge(self):
        by_pc = {}
        for g in self.groups:
            key = (g.pc, g.at_barrier is not None, g.converging is not None)
            if key in by_pc:
                h = by_pc[key]
                h.mask = h.mask | g.mask
                h.stuck = h.stuck if g.stuck is not None else None
            else:
                by_pc[key] = g
        self.groups = list(by_pc.values())

    def _converge(self):
        """Groups waiting at a warpgroup instruction go on once (merged with the others that came
        to it) they hold every thread of the warpgroups they touch; one whose missing threads have
        left the kernel never will."""
        n = self.ctx.threads - self.ctx.threads % 128
        for g in self.groups:
            if g.converging is None:
                continue
            m = g.mask[:n].reshape(-1, 128)
            part = m.any(axis=1) & ~m.all(axis=1)
            if not part.any():
                g.converging = None
                continue
            w = int(np.flatnonzero(part)[0])
            missing = ~m[w] & self.live[128 * w:128 * (w + 1)]
            if not missing.any():
                raise g.converging.error

    def _release_barriers(self):
        """Complete every barrier that its threads have all reached: the CTA's (every live
        thread) or a role's named one (its count); the groups waiting there go on."""
        ctx = self.ctx
        for ident in sorted({g.at_barrier.ident for g in self.groups if g.at_barrier is not None}):
            waiting = [g for g in self.groups if g.at_barrier is not None and g.at_barrier.ident == ident]
            count = waiting[0].at_barrier.count
            arrived = np.zeros_like(self.live)
            for g in waiting:
                arrived |= g.mask
            need = int(self.live.sum()) if count is None else count
            got = int(arrived.sum())
            if got < need:
                continue
            if got > need:
                ins = waiting[0].at_barrier.ins
                raise SimError(f"barrier {ident}, {count}: {got} threads arrive, more than its count", kind="deadlock",
                               line=ins.line, text=ins.text, cta=ctx.cta)
            self._whole_warps(ident, waiting, arrived)
            if count is None:
                ctx.shadow_barrier()
            else:   # the participants' accesses before it are ordered before theirs after it
                key = ("bar", ctx.rank, ident, ctx.progress)
                tids = np.flatnonzero(arrived)
                for t in tids.tolist():
                    ctx.shadow.release(t, key)
                ctx.shadow.acquire(tids, key)
            reductions = {g.at_barrier.ins.line for g in waiting if g.at_barrier.reduce is not None}
            if reductions:
                if len(reductions) > 1 or any(g.at_barrier.reduce is None for g in waiting):
                    ins = waiting[0].at_barrier.ins
                    raise SimError(f"barrier {ident} is met at different instructions (PTX lines "
                                   f"{', '.join(str(g.at_barrier.ins.line) for g in waiting)}), one of them a bar.red: "
                                   f"every thread must reach the same reduction", kind="divergence", line=ins.line,
                                   text=ins.text, cta=ctx.cta)
                waiting[0].at_barrier.reduce(arrived)
            ctx.progress += 1
            for g in waiting:
                g.at_barrier = None
                g.pc += 1

    def _whole_warps(self, ident: int, waiting: list, arrived: np.ndarray) -> None:
        """bar.sync, bar.red and barrier.sync.aligned are .aligned: the threads of a warp execute
        the same one together (PTX ISA, bar / barrier). A barrier that part of a warp reaches while
        the warp's other threads left the kernel or wait at another barrier instruction is undefined
        on the GPU (it hangs or releases early), so it is reported here."""
        ins = waiting[0].at_barrier.ins
        if ins.opcode.startswith("barrier.") and not ins.opcode.endswith(".aligned"):
            return   # (barrier.sync without .aligned may be reached by part of a warp)
        n = self.ctx.threads
        for w in np.unique(np.flatnonzero(arrived) // 32).tolist():
            lanes = slice(32 * w, min(32 * (w + 1), n))
            part = arrived[lanes]
            lines = sorted({g.at_barrier.ins.line for g in waiting if g.mask[lanes].any()})
            if part.all() and len(lines) == 1:
                continue
            came = np.flatnonzero(part) + 32 * w
            if not part.all():
                t = 32 * w + int(np.flatnonzero(~part)[0])
                what = (f"is reached by part of warp {w} (threads {int(came[0])}..{int(came[-1])}, {came.size} of "
                        f"them) while thread {t} {'left the kernel' if not self.live[t] else 'is elsewhere'}")
            else:
                what = (f"is reached by warp {w}'s threads at different barrier instructions (PTX lines "
                        f"{', '.join(map(str, lines))})")
            raise SimError(f"barrier {ident} {what}: {ins.opcode} is .aligned, so every thread of a warp must execute "
                           f"the same one together (a barrier inside a branch that splits a warp)",
                           kind="divergence", line=ins.line, text=ins.text, cta=self.ctx.cta, tid=int(came[0]))

    def _barrier_deadlock(self) -> SimError:
        """Every live thread waits at a barrier that cannot complete."""
        first = next(g.at_barrier for g in self.groups)
        where = ", ".join(sorted({f"bar.sync {g.at_barrier.ident} (PTX line {g.at_barrier.ins.line}, "
                                  f"{int(g.mask.sum())} threads)" for g in self.groups}))
        return SimError(f"deadlock: every thread waits at a barrier that cannot complete: {where}", kind="deadlock",
                        line=first.ins.line, text=first.ins.text, cta=self.ctx.cta)

    def _deadlock(self) -> SimError:
        """The first stuck group's report, with what every other group waits for."""
        stuck = [g.stuck[0] for g in self.groups if g.stuck is not None]
        first = stuck[0]
        others = [e.message.removeprefix("deadlock: ") for e in stuck[1:]]
        others += [f"warp {int(np.flatnonzero(g.mask)[0]) // 32} waits at bar.sync (PTX line {g.at_barrier.ins.line})"
                   for g in self.groups if g.at_barrier is not None]
        others += [f"warp {int(np.flatnonzero(g.mask)[0]) // 32} waits for the rest of its warpgroup at PTX line "
                   f"{g.converging.ins.line}" for g in self.groups if g.converging is not None]
        message = first.message + "".join(f"; meanwhile {o}" for o in others)
        return SimError(message, kind=first.kind, line=first.line, text=first.text, cta=first.cta, tid=first.tid)

    def _deadlocked(self) -> bool:
        """Every group is at a barrier or stuck on a wait that nothing in flight can complete,
        and nothing happened since it got stuck (ctx.progress counts arrivals and copies)."""
        ready = [g for g in self.groups if not g.waiting]
        return bool(ready) and all(g.stuck is not None and g.stuck[1] == self.ctx.progress for g in ready)


EMULATOR_SM_COUNT = 3  # persistent kernels on the emulator: a few CTAs, so each walks several tiles


def run_kernel(kernel, args: dict, sizes: dict, memory: Optional[GlobalMemory] = None, *,
               shared_base: int = SHARED_BASE, progress: bool = True) -> LaunchStats:
    """Run a tilegen.Kernel on the emulator: args by parameter name (pointers are addresses
    in `memory`, default tilegen.sim.global_memory()), grid from kernel.grid(sizes) with
    EMULATOR_SM_COUNT multiprocessors. A run still going after a few seconds says how far it
    got, every few seconds (sim/progress.py; progress=False for callers that say their own)."""
    given = memory is not None
    memory = memory if given else global_memory()
    if not given:   # (pointers from a GlobalMemory of the caller's, which was not passed: say so)
        for name, ptr in args.items():
            if not (name.endswith("_ptr") and isinstance(ptr, int) and ptr):
                continue
            a = memory.at_or_below(ptr)
            if a is None or ptr > a.end:
                raise SimError(f"{kernel.name}: {name} = 0x{ptr:x} is in no allocation of the emulator's shared "
                               f"tilegen.sim.global_memory(): pass memory= the GlobalMemory it was allocated in")
    args = fill_tensor_maps(getattr(kernel, "tensor_maps", ()), args)
    names = [n for n, _ in kernel.params]
    missing = [n for n in names if n not in args]
    if missing:
        raise SimError(f"{kernel.name}: {missing_arguments(missing, args)}")
    differ = [f"{k} = {v} in sizes but {args[k]} in args" for k, v in sizes.items()
              if isinstance(args.get(k), numbers.Integral) and not isinstance(args[k], bool) and args[k] != v]
    if differ:   # the grid would cover one problem and the kernel walk another
        raise SimError(f"{kernel.name}: {'; '.join(differ)} (the grid is sized from sizes, the kernel reads args)")
    problem = getattr(kernel, "leading_problem", lambda a, s: "")(args, sizes)
    if problem:
        raise SimError(f"{kernel.name}: {problem}")
    grid = kernel.grid(sizes, EMULATOR_SM_COUNT)
    stats, total = LaunchStats(), math.prod(grid)

    def status(seconds: float) -> str:
        done = stats.ctas
        said = f"emulating {kernel.name}: {seconds:.0f} s, {done} of {total} CTAs done"
        if done:   # (the pace so far says how long the rest takes)
            return f"{said}, about {seconds / done * (total - done):.0f} s left at this pace"
        return (f"{said} (a CTA of many loop trips is slow here: a trip count computed from sizes, e.g. a u32 "
                f"subtraction that wrapped, may be far larger than meant)")

    try:
        with ticking(status) if progress else nullcontext():
            return launch(kernel.ptx, grid, kernel.threads, {n: args[n] for n in names}, memory=memory,
                          entry=kernel.name, shared_bytes=kernel.smem_bytes, shared_base=shared_base,
                          barriers=getattr(kernel, "barriers", ()), stats=stats)
    except SimError as e:
        if e.address is not None:
            e.within_argument(_argument_at(memory, {n: args[n] for n in names if n.endswith("_ptr")}, e.address))
        raise


def _argument_at(memory: GlobalMemory, pointers: dict, address: int) -> str:
    """The pointer argument whose allocation `address` falls in or lies past, as "X_ptr + n
    bytes" (the nearest pointer at or below it), or ""."""
    a = memory.at_or_below(address)
    if a is None:
        return ""
    inside = [(n, int(v)) for n, v in pointers.items()
              if isinstance(v, numbers.Integral) and a.base <= int(v) <= address]
    if not inside:
        return ""
    name, at = max(inside, key=lambda p: p[1])
    return f"{name} + {address - at} bytes"


_GLOBAL: Optional[GlobalMemory] = None


def global_memory() -> GlobalMemory:
    """The process-wide emulated global memory used when no other is given."""
    global _GLOBAL
    if _GLOBAL is None:
        _GLOBAL = GlobalMemory()
    return _GLOBAL
