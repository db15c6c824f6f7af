"""Warpgroup instructions of sm_90a: wgmma.mma_async (operands from shared memory, or A
from registers), wgmma.fence / commit_group / wait_group, and fence.proxy.async.

Each warpgroup (128 consecutive threads) runs its wgmma at issue: the operands are gathered
from shared memory through the two descriptors, multiplied exactly (float64) and added to
the accumulator registers. What the hardware leaves asynchronous is checked instead: the
bytes stay "in flight" until the wait_group that retires the group (writes to them are
errors), and a wgmma must not read bytes written through the generic proxy unless the
writer issued fence.proxy.async after the write (race.py).

Descriptor decoding follows the PTX ISA's matrix-descriptor section, written out here
independently of tilegen.arch (tests hold the two together): start address, leading and
stride byte offsets in 16-byte units, the swizzle mode in bits 62-63, the swizzle applied
to the computed address.
"""
from __future__ import annotations

import re
from functools import lru_cache

import numpy as np

from . import numerics as nm
from .atomics import build_order_fence
from .errors import SimError
from .mbarrier import build_fence_mbarrier_init
from .memory import MemoryFault
from .program import Imm, Mem, Reg, Vec
from .signals import Converge
from .state import Context, per_thread

GROUP = 128
_MMA = re.compile(r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k(\d+)\.f32\.(f16|bf16|tf32|e4m3|e5m2)"
                  r"\.(f16|bf16|tf32|e4m3|e5m2)$")
_K = {"f16": 16, "bf16": 16, "tf32": 8, "e4m3": 32, "e5m2": 32}
_BYTES = {"f16": 2, "bf16": 2, "tf32": 4, "e4m3": 1, "e5m2": 1}
_FP8 = ("e4m3", "e5m2")           # A and B may be either, independently
_TRANSPOSABLE = ("f16", "bf16")   # tf32 and fp8 take no imm-trans operands: both K-major
# swizzle code -> (span bytes, XOR source shift): address bits [4, 4+b) ^= bits [7, 7+b)
_SWIZZLE = {1: (128, 3), 2: (64, 2), 3: (32, 1)}


def _swizzle(addr, code):
    bits = _SWIZZLE[code][1]
    return addr ^ (((addr >> 7) & ((1 << bits) - 1)) << 4)


def operand_addresses(desc: int, rows: int, k: int, esize: int, k_major: bool) -> np.ndarray:
    """(rows, k) byte addresses an operand descriptor selects: rows = M (A) or N (B)."""
    code = (desc >> 62) & 3
    if code not in _SWIZZLE:
        raise ValueError(f"descriptor swizzle mode {code} (only 128B/64B/32B are modelled)")
    start = (desc & 0x3FFF) << 4
    lead = ((desc >> 16) & 0x3FFF) << 4
    stride = ((desc >> 32) & 0x3FFF) << 4
    span = _SWIZZLE[code][0]
    mn = np.arange(rows, dtype=np.int64)[:, None]
    kk = np.arange(k, dtype=np.int64)[None, :]
    if k_major:   # rows of `span` bytes along K; 8-row groups `stride` apart
        linear = start + (mn // 8) * stride + (mn % 8) * span + kk * esize
    else:         # MN runs along the span; 8-deep K groups `stride` apart, span-wide MN blocks `lead` apart
        per = span // esize
        linear = start + (mn // per) * lead + (kk // 8) * stride + (kk % 8) * span + (mn % per) * esize
    return _swizzle(linear, code)


@lru_cache(maxsize=None)
def _acc_positions(n: int):
    """(warp*32 + lane, register) -> (row, col) of the 64 x n accumulator, as flat indices."""
    w = np.arange(4)[:, None, None]
    lane = np.arange(32)[None, :, None]
    i = np.arange(n // 2)[None, None, :]
    row = 16 * w + (lane >> 2) + 8 * ((i >> 1) & 1)
    col = 8 * (i >> 2) + 2 * (lane & 3) + (i & 1)
    return (row * n + col).reshape(GROUP, n // 2)


@lru_cache(maxsize=None)
def _a_positions(k: int):
    """(warp*32 + lane, register, half) -> flat index into the 64 x k A of a register A
    operand: each warp's 16 rows in the mma.sync A order (ptx.md 6.2). tf32 (k 8): one
    element per register; 16-bit (k 16): element 2j in the low half of register j."""
    w = np.arange(4)[:, None, None, None]
    lane = np.arange(32)[None, :, None, None]
    j = np.arange(4)[None, None, :, None]
    half = np.arange(2 if k == 16 else 1)[None, None, None, :]
    g, t = lane >> 2, lane & 3
    row = 16 * w + g + 8 * (j & 1)
    col = (t + 4 * (j >> 1)) if k == 8 else (2 * t + half + 8 * (j >> 1))
    return np.broadcast_to(row * k + col, (4, 32, 4, half.size)).reshape(GROUP, 4, -1)


def _groups(ctx, ins):
    if ctx.threads % GROUP:
        ctx.unsupported(ins, f"{ins.opcode.split('.')[0]} in a CTA of {ctx.threads} threads (not whole warpgroups)")
    return ctx.threads // GROUP


def _aligned(ins, ctx):
    if ins.guard is not None:
        ctx.unsupported(ins, f"a guarded {ins.opcode} (.sync.aligned: every thread of the warpgroup runs it)")


def _warpgroups(ins, ctx: Context):
    """A function giving the warpgroups that run this instruction: all of them in lockstep
    code; in masked code those whose threads all run (part of one is a divergence)."""
    G = _groups(ctx, ins)
    every = list(range(G))
    if not ctx.masked:
        return lambda: every

    def running():
        m = ctx.active[:G * GROUP].reshape(G, GROUP)
        part = m.any(axis=1) & ~m.all(axis=1)
        if part.any():
            g = int(np.flatnonzero(part)[0])
            ctx.fail(ins, f"{op_name} is run by only part of warpgroup {g}: .sync.aligned, all 128 threads must "
                          f"run it together", kind="divergence", tid=g * GROUP + int(np.flatnonzero(~m[g])[0]))
        return np.flatnonzero(m.all(axis=1)).tolist()
    op_name = ins.opcode.split(".")[0]
    return running


def build_wgmma(ins, ctx: Context):
    """A wgmma instruction's closure; in masked code (warps parted) one that, reached by part of a
    warpgroup, waits there for the rest of it (Converge) before it runs."""
    run = _build_wgmma(ins, ctx)
    if not ctx.masked:
        return run
    G = _groups(ctx, ins)
    op_name = ins.opcode.split(".")[0]

    def converged():
        m = ctx.active[:G * GROUP].reshape(G, GROUP)
        part = m.any(axis=1) & ~m.all(axis=1)
        if part.any():
            g = int(np.flatnonzero(part)[0])
            return Converge(ins, SimError(
                f"{op_name} is run by only part of warpgroup {g}, and the rest of it never reaches this instruction: "
                f".sync.aligned, all 128 threads must run it together", kind="divergence", line=ins.line,
                text=ins.text, cta=ctx.cta, tid=g * GROUP + int(np.flatnonzero(~m[g])[0])))
        return run()
    return converged


def _build_wgmma(ins, ctx: Context):
    _aligned(ins, ctx)
    op = ins.opcode
    if op == "wgmma.fence.sync.aligned":
        return lambda: None           # the emulator runs each wgmma at issue: nothing to order
    running = _warpgroups(ins, ctx)
    if op == "wgmma.commit_group.sync.aligned":
        def commit():
            for g in running():
                ctx.wgmma_groups.setdefault(g, []).append(ctx.wgmma_uncommitted.pop(g, []))
                ctx.wgmma_held_groups.setdefault(g, []).append(ctx.wgmma_held_uncommitted.pop(g, {}))
        return commit
    if op == "wgmma.wait_group.sync.aligned":
        if len(ins.operands) != 1 or not isinstance(ins.operands[0], Imm):
            ctx.unsupported(ins, "wgmma.wait_group without an immediate count")
        keep = int(ins.operands[0].value)

        def wait():
            for g in running():
                groups = ctx.wgmma_groups.get(g, [])
                while len(groups) > keep:
                    for flat, line in groups.pop(0):
                        ctx.shadow.retire_async_read(g, flat, line)
                registers = ctx.wgmma_held_groups.get(g, [])
                del registers[:max(len(registers) - keep, 0)]
        return wait
    m = _MMA.match(op)
    if m is None:
        ctx.unsupported(ins, f"the instruction {op} (wgmma m64nNk16 f16/bf16, m64nNk8 tf32 or m64nNk32 "
                             f"e4m3/e5m2 with f32 accumulators only)")
    n, k, a_type, b_type = int(m.group(1)), int(m.group(2)), m.group(3), m.group(4)
    mixed_fp8 = a_type in _FP8 and b_type in _FP8
    if n % 8 or not 8 <= n <= 256 or k != _K[a_type] or (a_type != b_type and not mixed_fp8):
        ctx.unsupported(ins, f"the shape of {op}")
    ops = ins.operands
    transposable = a_type in _TRANSPOSABLE
    a_regs = ops[1].items if len(ops) > 1 and isinstance(ops[1], Vec) else None   # A from registers
    trans = (("trans-b",) if a_regs is not None else ("trans-a", "trans-b")) if transposable else ()
    if len(ops) != 6 + len(trans) or not all(isinstance(x, Imm) for x in ops[3:]):
        ctx.unsupported(ins, f"{op} other than {{d}}, {'{a0..a3}' if a_regs is not None else 'desc-a'}, "
                             f"desc-b, scale-d, 1, 1{''.join(', ' + x for x in trans)} with immediates")
    if a_regs is not None and _BYTES[a_type] == 1:
        ctx.unsupported(ins, f"{op} with A from registers (fp8 operands are read from shared memory here)")
    if a_regs is not None and len(a_regs) != 4:
        ctx.fail(ins, f"a register A of {op} must be a vector of 4 registers", kind="unsupported")
    d_items = ops[0].items if isinstance(ops[0], Vec) else ()
    if len(d_items) != n // 2:
        ctx.fail(ins, f"the accumulator of m64n{n} must be a vector of {n // 2} registers", kind="unsupported")
    imms = [int(x.value) for x in ops[3:]]
    scale_d, scale_a, scale_b = imms[:3]
    trans_a, trans_b = (0, 0) if not trans else ((0, imms[3]) if a_regs is not None else tuple(imms[3:]))
    if (scale_a, scale_b) != (1, 1) or scale_d not in (0, 1) or trans_a not in (0, 1) or trans_b not in (0, 1):
        ctx.unsupported(ins, f"{op} with scale-a/scale-b other than 1")
    read_a = (ctx.reader(ins, ops[1], np.uint64) if a_regs is None
              else [ctx.reader(ins, x, np.uint32) for x in a_regs])
    read_b = ctx.reader(ins, ops[2], np.uint64)
    accs = [ctx.reader(ins, x, np.float32) for x in d_items]
    puts = [ctx.writer(ins, x, np.float32) for x in d_items]
    pos = _acc_positions(n)
    # tf32: the f32 words in shared memory, truncated to their top 19 bits; fp8: the 256 codes' values
    decoders = {"f16": nm.f16_bits_to_f32, "bf16": nm.bf16_bits_to_f32, "tf32": nm.tf32_operand,
                "e4m3": nm.FP8_VALUES["e4m3"].__getitem__, "e5m2": nm.FP8_VALUES["e5m2"].__getitem__}
    decode_a, decode_b = decoders[a_type], decoders[b_type]
    esize = _BYTES[a_type]
    nt = ctx.threads

    def descriptor(read, g, what):
        d = per_thread(read(), nt)[g * GROUP:(g + 1) * GROUP]
        if (d != d[0]).any():
            ctx.fail(ins, f"the {what} descriptor differs between the threads of warpgroup {g}; it must be "
                          f"the same in all 128", kind="divergence", tid=g * GROUP + int(np.flatnonzero(d != d[0])[0]))
        return int(d[0])

    def gather(desc, rows, k_major, g, decode):
        try:
            addr = operand_addresses(desc, rows, k, esize, k_major)
        except ValueError as e:
            ctx.unsupported(ins, str(e))
        try:
            off = ctx.shared.offsets(addr.reshape(-1).astype(np.uint64), esize)
        except MemoryFault as f:  # name the warpgroup's first thread
            ctx.fault(ins, f, np.full(addr.size, g * GROUP))
        flat = (off[:, None] + np.arange(esize)).reshape(-1)
        v = ctx.shadow.issue_async_read(g, flat, ins.line)
        if v:
            ctx.fail(ins, ctx.explained(v), kind=v.kind, tid=g * GROUP, address=ctx.shared.base + v.offset)
        ctx.wgmma_uncommitted.setdefault(g, []).append((flat, ins.line))
        if (off % esize).any():
            ctx.fail(ins, f"a wgmma operand element not aligned to its {esize} bytes", kind="misaligned", tid=g * GROUP)
        return decode(ctx.shared.words(esize)[off // esize]).reshape(rows, k)

    def registers(g):
        """The warpgroup's 64 x k A from its threads' four registers."""
        words = np.stack([per_thread(r(), nt)[g * GROUP:(g + 1) * GROUP] for r in read_a], axis=1)
        if esize == 2:  # two 16-bit elements per register, the lower-indexed in the low half
            words = np.stack([words & 0xFFFF, words >> 16], axis=2)
        A = np.zeros(64 * k, np.float32)
        A[_a_positions(k)] = decode_a(words.reshape(GROUP, 4, -1).astype(np.uint32 if esize == 4 else np.uint16))
        return A.reshape(64, k)

    # the registers this wgmma holds until a wait_group retires it: its accumulator, and its A
    # when A comes from registers (guard_registers)
    held = {**{x.slot: (ins.line, ACCUMULATOR) for x in d_items},
            **{x.slot: (ins.line, A_OPERAND) for x in (a_regs or ()) if isinstance(x, Reg)}}

    def run():
        regs = np.stack([per_thread(r(), nt) for r in accs], axis=1).astype(np.float32)   # (threads, n/2)
        out = regs.copy()
        for g in running():
            ctx.wgmma_held_uncommitted.setdefault(g, {}).update(held)
            A = registers(g) if a_regs is not None else gather(descriptor(read_a, g, "A"), 64, trans_a == 0, g,
                                                                 decode_a)
            B = gather(descriptor(read_b, g, "B"), n, trans_b == 0, g, decode_b)        # (n, k)
            D = A.astype(np.float64) @ B.astype(np.float64).T
            mine = slice(g * GROUP, (g + 1) * GROUP)
            if scale_d:
                D = D.reshape(-1)
                D[pos] += regs[mine]
                D = D.reshape(64, n)
            out[mine] = D.reshape(-1)[pos].astype(np.float32)
        for i, put in enumerate(puts):
            put(np.ascontiguousarray(out[:, i]))
    return run


def build_fence(ins, ctx: Context):
    if ins.opcode == "fence.mbarrier_init.release.cluster":
        return build_fence_mbarrier_init(ins, ctx)
    if ins.opcode.split(".")[1] in ("acq_rel", "sc"):   # between CTAs, in global memory
        return build_order_fence(ins, ctx)
    if ins.opcode != "fence.proxy.async.shared::cta":
        ctx.unsupported(ins, f"the instruction {ins.opcode} (only fence.proxy.async.shared::cta, "
                             f"fence.mbarrier_init.release.cluster)")
    g = ctx.guard(ins)

    def run():
        if g is None:
            ctx.shadow.fence_async(None)
        else:
            ctx.shadow.fence_async(ctx.all_tids[g()])
    return run


ACCUMULATOR, A_OPERAND = "an accumulator", "a register A operand"
# opcode families whose first operand is not a register they write
_NO_DESTINATION = ("st", "red", "cp.async", "cp.async.bulk", "mbarrier", "bra", "bar", "barrier", "fence", "stmatrix",
                   "membar", "ret", "exit", "setmaxnreg", "griddepcontrol", "prefetch")


def held_slots(entry) -> frozenset:
    """The register slots some wgmma of the entry holds while in flight: accumulators and A."""
    slots = set()
    for ins in entry.instrs:
        if _MMA.match(ins.opcode):
            for op in ins.operands[:2]:
                if isinstance(op, Vec):
                    slots.update(x.slot for x in op.items if isinstance(x, Reg))
    return frozenset(slots)


def guard_registers(ins, ctx: Context, run, held: frozenset, family: str):
    """`run` (a non-wgmma instruction), failing first where it touches a register a wgmma still
    in flight holds, in a warpgroup that runs it: an accumulator read or written, or a register
    A written, before a wait_group retires that wgmma's group. Until then the registers belong
    to the tensor cores (PTX ISA, wgmma.mma_async: accessing them is undefined; ptxas
    serialises every wgmma of a kernel where it sees it). The emulator runs each wgmma at issue,
    so without this check an early read would see the final sum the hardware does not promise."""
    touched, written = {}, set()
    ops = ins.operands + ((ins.guard,) if ins.guard is not None else ())
    for i, op in enumerate(ops):
        for x in (op.items if isinstance(op, Vec) else (op.base if isinstance(op, Mem) else op,)):
            if isinstance(x, Reg) and x.slot in held:
                touched[x.slot] = x.name
                if i == 0 and family not in _NO_DESTINATION:
                    written.add(x.slot)
    if not touched:
        return run
    mine = frozenset(touched)
    runs_on = ctx.guard(ins)       # the threads that run it (its predicate, the running group's threads)

    def checked():
        for g, pending in ctx.wgmma_held_uncommitted.items():
            check(g, (pending,))
        for g, groups in ctx.wgmma_held_groups.items():
            check(g, groups)
        return run()

    def check(g, groups):
        for pending in groups:
            for slot in sorted(mine.intersection(pending)):
                line, role = pending[slot]
                if role == A_OPERAND and slot not in written:
                    continue          # reading a register A in flight is harmless
                threads = runs_on() if runs_on is not None else ctx.active
                if threads is not None and not np.asarray(threads)[g * GROUP:(g + 1) * GROUP].any():
                    return
                ctx.fail(ins, f"{touched[slot]} is {role} of warpgroup {g}'s wgmma at PTX line {line}, still in "
                              f"flight: a wgmma.wait_group must retire its group before other instructions "
                              f"{'read or write' if role == ACCUMULATOR else 'write'} it", kind="race", tid=g * GROUP)
    return checked


BUILDERS = {"wgmma": build_wgmma, "fence": build_fence}
