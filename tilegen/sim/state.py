"""The state one launch runs on: the register file of the current CTA (one numpy array per
register, over the CTA's threads), special registers, shared memory with its shadow,
the cp.async groups in flight, and helpers the op builders share (operand readers and
writers, guards, error reports).

Register arrays are never written in place: every instruction binds a new array, so a
fresh CTA starts by pointing every register at one shared zero array.

While every thread is at the same instruction the CTA runs in lockstep on code decoded for
the whole CTA. Once warps part (a branch or exit taken by some threads, as warp-specialized
kernels do on the role of each warp), the runner switches to code decoded with `masked`
set: there every instruction is guarded by `active`, the threads of the group now running.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Callable, Optional

import numpy as np

from .errors import SimError
from .memory import MemoryFault, SharedMemory
from .program import Imm, Instr, Mem, Reg, Special, Sym
from .race import SharedShadow, Violation

# Storage of each declared register type: 32-bit integers as uint32, floats as floats.
STORAGE = {
    "b8": np.uint8, "u8": np.uint8, "s8": np.uint8,
    "b16": np.uint16, "u16": np.uint16, "s16": np.uint16, "f16": np.uint16, "bf16": np.uint16,
    "b32": np.uint32, "u32": np.uint32, "s32": np.uint32, "f16x2": np.uint32, "bf16x2": np.uint32,
    "f32": np.float32,
    "b64": np.uint64, "u64": np.uint64, "s64": np.uint64, "f64": np.float64,
    "pred": np.bool_,
}

# The numpy type an instruction type suffix computes in.
TYPE = {
    "b8": np.uint8, "u8": np.uint8, "s8": np.int8,
    "b16": np.uint16, "u16": np.uint16, "s16": np.int16, "f16": np.uint16, "bf16": np.uint16,
    "b32": np.uint32, "u32": np.uint32, "s32": np.int32, "f32": np.float32,
    "f16x2": np.uint32, "bf16x2": np.uint32, "tf32": np.uint32,
    "b64": np.uint64, "u64": np.uint64, "s64": np.int64, "f64": np.float64,
    "pred": np.bool_,
}

# Special registers the emulator models (%clock and friends are not).
SPECIALS = frozenset({f"%{n}.{a}" for n in ("tid", "ntid", "ctaid", "nctaid", "clusterid", "nclusterid",
                                           "cluster_ctaid", "cluster_nctaid") for a in "xyz"}
                     | {"%laneid", "%warpid", "%nwarpid", "%smid", "%nsmid", "%gridid", "%cluster_ctarank",
                        "%cluster_nctarank"})

_UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
PARAM_WINDOW = 0x7E00_0000_0000   # addresses of kernel parameters (far from global allocations)
PARAM_SLOT = 1 << 12
_STORE = {t: np.dtype(d) for t, d in STORAGE.items()}


def convert_bits(a: np.ndarray, to) -> np.ndarray:
    """Reinterpret `a` as dtype `to`; of a different size, truncate to or zero-extend from
    the low bits (how PTX moves a value between registers and narrower/wider types)."""
    to = np.dtype(to)
    if a.dtype == to:
        return a
    if to == np.bool_ or a.dtype == np.bool_:
        return a.astype(to)
    if a.dtype.itemsize == to.itemsize:
        return a.view(to)
    u = a.view(_UNSIGNED[a.dtype.itemsize]).astype(_UNSIGNED[to.itemsize])
    return u.view(to)


class Context:
    """Everything the closures of a decoded entry share. Launch values are set by `bind`,
    per-CTA state is reset by `start_cta`, so the decoded code is reused across launches."""

    def __init__(self, entry, threads: int, shared_size: int, shared_base: int, shared_symbols: dict):
        self.entry = entry
        self.threads = threads
        self.params: dict = {}                # name -> raw bytes (uint8), set per launch
        self.grid = (1, 1, 1)
        self.memory = None
        self.shared_symbols = shared_symbols  # name -> shared address
        self.shared_size, self.shared_base = shared_size, shared_base
        self.shared: Optional[SharedMemory] = None   # allocated per launch (see bind)
        self.shadow: Optional[SharedShadow] = None
        self.order = None                     # the launch's sim.ordering.GlobalOrder (set by the runner)
        self.R: list = [None] * len(entry.regs)
        zeros = {}
        for t in {r.type for r in entry.regs}:
            z = np.zeros(threads, dtype=STORAGE[t])
            z.flags.writeable = False         # shared by every register: never written in place
            zeros[t] = z
        self._fresh = [zeros[r.type] for r in entry.regs]
        self.tid = np.arange(threads, dtype=np.uint32)
        self.all_tids = np.arange(threads, dtype=np.int64)
        self.cta = (0, 0, 0)
        self.specials = {}
        self.uncommitted: list = []           # cp.async batches not yet in a group
        self.groups: list = []                # committed batches, oldest first (AsyncBatch.group per thread)
        self.commits = np.zeros(threads, dtype=np.int64)   # cp.async groups each thread has committed
        self.wgmma_uncommitted: dict = {}     # warpgroup -> shared byte offsets of wgmmas not yet in a group
        self.wgmma_groups: dict = {}          # warpgroup -> its committed wgmma groups, oldest first
        self.wgmma_held_uncommitted: dict = {}  # warpgroup -> {register slot: (wgmma line, role)} not yet in a group
        self.wgmma_held_groups: dict = {}      # warpgroup -> those of its committed groups, oldest first (sim/wgmma.py)
        # .param arrays (tensor maps) have addresses in a window of their own (mov.b64 %rd, name)
        self.param_address = {name: PARAM_WINDOW + PARAM_SLOT * i for i, (name, _, _) in enumerate(entry.params)}
        self.param_at = {a: name for name, a in self.param_address.items()}
        self.mbarriers: dict = {}             # shared offset -> sim.mbarrier.MBarrierState
        self.bulk: list = []                  # TMA copies issued, not yet landed (sim/tma.py)
        self.bulk_reads: dict = {}            # thread -> its TMA stores' bulk groups, the last still open
        self.bulk_writes: dict = {}           # thread -> the global rows of those groups not yet complete
        self.barrier_names: dict = {}         # shared offset -> "name[stage]", for messages
        self.masked = False                   # decoding the code for warps that have parted
        self.active: Optional[np.ndarray] = None   # at run time, the running group's threads
        self.masked_code: Optional[list] = None    # that code, decoded when first needed
        self.progress = 0                     # counts arrivals, copies and barriers (deadlock detection)
        self.cluster = None                   # sim/cluster.py: the CTAs running side by side with this one
        self.cluster_dims = (1, 1, 1)
        self.rank = 0                         # %cluster_ctarank
        self.cluster_phase: dict = {}
        self.solo_barrier = None

    # -- per launch and per CTA -------------------------------------------------------------
    def bind(self, params: dict, grid: tuple, memory):
        """Set the values of one launch; memory=None releases them (and shared memory)."""
        self.params, self.grid, self.memory = params, grid, memory
        if memory is None:
            self.shared = self.shadow = None
        else:
            self.shared = SharedMemory(self.shared_size, self.shared_base)
            if self.cluster is None:
                self.shadow = SharedShadow(self.shared_size, self.threads)
            else:
                self.shadow = SharedShadow(self.shared_size, sync=self.cluster.sync, base=self.rank * self.threads)

    def start_cta(self, cta: tuple):
        self.cta = cta
        self.R[:] = self._fresh
        self.shared.clear()
        self.shadow.reset()
        self.uncommitted = []
        self.groups = []
        self.commits[:] = 0
        self.wgmma_uncommitted = {}
        self.wgmma_groups = {}
        self.wgmma_held_uncommitted = {}
        self.wgmma_held_groups = {}
        self.active = None
        self.mbarriers = {}
        self.bulk = []
        self.bulk_reads = {}
        self.bulk_writes = {}
        self.cluster_phase = {}   # thread -> the cluster-barrier phase it arrived in (sim/cluster.py)
        self.solo_barrier = None
        n = self.threads
        full = lambda v: np.full(n, v, dtype=np.uint32)  # noqa: E731
        tid = self.tid
        self.specials = {
            "%tid.x": tid, "%tid.y": full(0), "%tid.z": full(0),
            "%ntid.x": full(n), "%ntid.y": full(1), "%ntid.z": full(1),
            "%ctaid.x": full(cta[0]), "%ctaid.y": full(cta[1]), "%ctaid.z": full(cta[2]),
            "%nctaid.x": full(self.grid[0]), "%nctaid.y": full(self.grid[1]), "%nctaid.z": full(self.grid[2]),
            "%laneid": tid & np.uint32(31), "%warpid": tid >> np.uint32(5),
            "%nwarpid": full(-(-n // 32)), "%smid": full(0), "%nsmid": full(1), "%gridid": full(0),
        }
        dims = self.cluster_dims
        for i, a in enumerate("xyz"):
            self.specials[f"%cluster_ctaid.{a}"] = full(cta[i] % dims[i])
            self.specials[f"%cluster_nctaid.{a}"] = full(dims[i])
            self.specials[f"%clusterid.{a}"] = full(cta[i] // dims[i])
            self.specials[f"%nclusterid.{a}"] = full(self.grid[i] // dims[i])
        self.rank = cta[0] % dims[0] + dims[0] * (cta[1] % dims[1] + dims[1] * (cta[2] % dims[2]))
        self.specials["%cluster_ctarank"] = full(self.rank)
        self.specials["%cluster_nctarank"] = full(dims[0] * dims[1] * dims[2])

    def shadow_barrier(self):
        """A CTA-wide barrier completed: accesses before it are ordered before those after."""
        self.shadow.barrier()

    # -- operands ---------------------------------------------------------------------------
    def reader(self, ins: Instr, op, dtype) -> Callable[[], object]:
        """A function returning operand `op` as `dtype` (an array over threads or a scalar)."""
        dtype = np.dtype(dtype)
        R = self.R
        if isinstance(op, Reg):
            s = op.slot
            store = _STORE[op.type]
            if store == dtype:
                return lambda: R[s]
            return lambda: convert_bits(R[s], dtype)
        if isinstance(op, Special):
            name = op.name
            if name not in SPECIALS:
                self.unsupported(ins, f"special register {name}")
            return lambda: convert_bits(self.specials[name], dtype)
        if isinstance(op, Imm):
            return _const(self.immediate(ins, op, dtype))
        if isinstance(op, Sym) and op.name in self.shared_symbols:
            return _const(np.array(self.shared_symbols[op.name], dtype=dtype)[()])
        if isinstance(op, Sym) and op.name in self.param_address:
            return _const(np.array(self.param_address[op.name], dtype=dtype)[()])
        self.unsupported(ins, f"operand {op!r}")

    def immediate(self, ins: Instr, op: Imm, dtype):
        return _immediate(op, np.dtype(dtype))

    def writer(self, ins: Instr, op, dtype) -> Callable[[object], None]:
        """A function storing a value of `dtype` into register `op`, honouring the guard."""
        if not isinstance(op, Reg):
            self.unsupported(ins, f"destination {op!r}")
        R, s = self.R, op.slot
        store = _STORE[op.type]
        dtype = np.dtype(dtype)
        n = self.threads
        g = self.guard(ins)
        if g is None:
            if store == dtype:
                def put(v):
                    if getattr(v, "shape", None) != (n,):
                        v = np.full(n, v, dtype=store)
                    elif v.dtype != store:     # never let numpy's type promotion leak in
                        v = v.astype(store)
                    R[s] = v
            else:
                def put(v):
                    v = np.asarray(v, dtype=dtype)
                    R[s] = convert_bits(v if v.shape == (n,) else np.full(n, v, dtype=dtype), store)
            return put

        def put_guarded(v):
            v = convert_bits(np.broadcast_to(np.asarray(v, dtype=dtype), (n,)), store)
            R[s] = np.where(g(), v, R[s])
        return put_guarded

    def guard(self, ins: Instr) -> Optional[Callable[[], np.ndarray]]:
        """None for an unguarded instruction, else a function giving the active-thread mask
        (in masked code, always a function: the guard and the running group's threads)."""
        R = self.R
        if self.masked:
            if ins.guard is None:
                return lambda: self.active
            s = ins.guard.slot
            if ins.guard_neg:
                return lambda: self.active & ~R[s]
            return lambda: self.active & R[s]
        if ins.guard is None:
            return None
        s = ins.guard.slot
        if ins.guard_neg:
            return lambda: ~R[s]
        return lambda: R[s]

    def address(self, ins: Instr, op) -> Callable[[], np.ndarray]:
        """The address of a memory operand [reg+imm] / [sym] as a uint64 array (or scalar)."""
        if not isinstance(op, Mem):
            self.unsupported(ins, f"memory operand {op!r}")
        off = np.uint64(op.offset & (2 ** 64 - 1))
        if isinstance(op.base, Reg):
            read = self.reader(ins, op.base, np.uint64)
            if op.offset == 0:
                return read
            return lambda: read() + off
        if isinstance(op.base, Sym) and op.base.name in self.shared_symbols:
            a = np.uint64(self.shared_symbols[op.base.name]) + off
            return lambda: a
        if op.base is None:
            return lambda: off
        self.unsupported(ins, f"address {op!r}")

    # -- errors -----------------------------------------------------------------------------
    def fail(self, ins: Instr, message: str, *, kind: str, tid=None, address=None):
        raise SimError(message, kind=kind, line=ins.line, text=ins.text, cta=self.cta,
                       tid=None if tid is None else int(tid), address=None if address is None else int(address))

    def fault(self, ins: Instr, f: MemoryFault, tids: np.ndarray):
        self.fail(ins, f.reason, kind="bounds", tid=tids[f.index], address=f.address)

    def violation(self, ins: Instr, v: Violation, tids: np.ndarray):
        self.fail(ins, self.explained(v), kind=v.kind, tid=tids[v.row], address=self.shared.base + v.offset)

    def explained(self, v: Violation) -> str:
        """v's message; for a read of a TMA copy still landing, with the mbarrier it completes
        on and that phase's number and parity (what a wait on the wrong parity did not wait for)."""
        if v.kind != "pending":
            return v.message
        copy = next((c for c in self.bulk if (c.offs == v.offset).any()), None)
        bar = self.mbarriers.get(copy.bar) if copy is not None else None
        if bar is None:
            return v.message
        name = self.barrier_names.get(copy.bar, f"the mbarrier at shared offset {copy.bar}")
        return v.message + f" ({name}: the copy completes its phase {bar.phase}, parity {bar.phase & 1})"

    def unsupported(self, ins: Instr, what: str):
        raise SimError(f"the emulator does not support {what}", kind="unsupported", line=ins.line,
                       text=ins.text, cta=None)


@lru_cache(maxsize=4096)
def _immediate(op: Imm, dtype: np.dtype):
    """An immediate as a numpy scalar of `dtype`: integers wrap to its width (-1 -> all
    ones), 0f/0d floats keep their exact bits."""
    if dtype.kind == "f":
        if op.is_float and dtype.itemsize == 4 and op.bits <= 0xFFFFFFFF:
            return np.uint32(op.bits).view(np.float32)
        return dtype.type(op.value)
    if dtype == np.bool_:
        return np.bool_(op.value)
    unsigned = _UNSIGNED[dtype.itemsize]
    if op.is_float:
        return unsigned(op.bits & ((1 << (8 * dtype.itemsize)) - 1)).view(dtype)
    return unsigned(int(op.value) & ((1 << (8 * dtype.itemsize)) - 1)).view(dtype)


def per_thread(x, n: int) -> np.ndarray:
    """x as an array over the n threads (registers already are; immediates broadcast)."""
    if getattr(x, "shape", None) == (n,):
        return x
    return np.broadcast_to(x, (n,))


def _const(v):
    return lambda: v
