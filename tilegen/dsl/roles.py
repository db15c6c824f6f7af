"""Warp roles (warp specialization, sm_90): parts of the CTA that run different code at once.

    with tilegen.dsl.role("producer", warps=(0, 4), registers=40):    # warpgroup 0
        ...   # one thread issues the TMA copies: single-thread ops pick the role's first thread
    with tilegen.dsl.role("consumer", warps=(4, 12), registers=232):  # warpgroups 1 and 2
        ...   # wgmma on the stages the producer filled

The roles synchronise through mbarriers. Inside a role tilegen.dsl.barrier() waits for the role's
own threads only (a named barrier per role); a cooperative cp.async copy is refused there
(it spreads over every thread of the CTA). `registers`
moves registers between warpgroups with setmaxnreg (sm_90a; the role must be whole
warpgroups): producers give theirs back, consumers take more, within the 64K of the SM.
"""
from __future__ import annotations

from contextlib import contextmanager

from ..arch.targets import SETMAXNREG_RANGE
from ..arch.targets import target as _target
from ..ir import tile as T
from .primitives import lt, thread_id, tile_op
from .trace import current, fail

WARPGROUP_WARPS = 4
MIN_REGISTERS, MAX_REGISTERS = SETMAXNREG_RANGE
MAX_NAMED_BARRIERS = 16                  # bar.sync 0..15; 0 is the CTA's


def default_registers(threads: int, tgt) -> int:
    """Registers per thread a kernel of `threads` threads gets at launch (one CTA per SM)."""
    return min(tgt.regs_per_thread, tgt.regs_per_sm // threads) // 8 * 8


@contextmanager
def role(name: str, warps: tuple, registers: int = None):
    """Run the block on warps [warps[0], warps[1]) only, at the same time as the other roles."""
    tr = current()
    kernel = tr.kernel
    n_warps = kernel.threads // 32
    if getattr(tr, "role", None) is not None:
        fail(f"role {name!r} inside the role {tr.role!r}: roles do not nest")
    if not (isinstance(warps, tuple) and len(warps) == 2 and all(isinstance(w, int) for w in warps)
            and 0 <= warps[0] < warps[1] <= n_warps):
        fail(f"role {name!r}: warps={warps!r}; allowed: (first, end) with 0 <= first < end <= {n_warps} "
             f"(the CTA has {kernel.threads} threads)")
    first, end = warps
    if registers is not None:
        try:
            tgt = _target(kernel.target)
        except ValueError:
            tgt = None
        if tgt is None or not tgt.arch_specific:
            fail(f"role {name!r}: registers= uses setmaxnreg, which needs target 'sm_90a' (this kernel is traced "
                 f"for {kernel.target})")
        if first % WARPGROUP_WARPS or end % WARPGROUP_WARPS:
            fail(f"role {name!r}: registers= needs whole warpgroups (warps a multiple of 4), got warps={warps!r}")
        if not isinstance(registers, int) or not MIN_REGISTERS <= registers <= MAX_REGISTERS or registers % 8:
            fail(f"role {name!r}: registers={registers!r}; allowed: a multiple of 8 in {MIN_REGISTERS}..{MAX_REGISTERS}")
    tid = thread_id()
    cond = lt(tid - 32 * first if first else tid, 32 * (end - first))   # unsigned: earlier warps wrap
    roles = getattr(tr, "roles_seen", 0) + 1
    if roles >= MAX_NAMED_BARRIERS:
        fail(f"role {name!r}: at most {MAX_NAMED_BARRIERS - 1} warp roles per kernel (one named barrier each)")
    tr.roles_seen = roles
    tr.role, tr.role_barrier, tr.role_threads = name, (roles, 32 * (end - first)), (32 * first, 32 * (end - first))
    try:
        with tr.builder.role(cond.raw, name, first, end):
            if registers is not None:
                start = default_registers(kernel.threads, tgt)
                if registers != start:
                    tile_op(T.SetMaxRegisters(registers, registers > start))
            yield
    finally:
        tr.role = tr.role_barrier = tr.role_threads = None


__all__ = ["role"]
