"""mbarriers (sm_90, ptx.md 6.6): initialisation at the kernel's entry, arrive (with the
bytes a phase's TMA copies will deliver), and the wait for a phase of a given parity.

Every barrier is initialised by thread 0 before the body, made visible with
fence.mbarrier_init and a CTA barrier, so no op of the body can see it uninitialised.
A wait is a loop around mbarrier.try_wait.parity, which may return before the phase
completes.
"""
from __future__ import annotations

from .. import tile as T
from ..instr import Instr, SpinWait
from ..values import Addr, Imm, Sym, Value
from .smem import value_key

SHARED = "shared::cta"


def barrier_address(b, ctx, bar, stage):
    """The shared-window address of stage `stage` (a Value or int) of `bar`, computed once
    per region."""
    key = ("mbarrier", bar.name, value_key(stage), id(b.region))
    if key not in ctx.addresses:
        ctx.addresses[key] = b.add(b.add(ctx.smem, bar.offset), b.mul(stage, bar.BYTES))
    return ctx.addresses[key]


def first_thread(ctx):
    """A predicate true on one thread only, the one that issues single-thread ops: thread 0,
    or inside a warp role the role's first thread."""
    first = 32 * ctx.role.first_warp if ctx.role is not None else 0
    key = ("first-thread", first)
    if key not in ctx.addresses:
        ctx.addresses[key] = ctx.pro.cmp("eq", ctx.tid, first)
    return ctx.addresses[key]


def first_of_each(ctx, unit: str):
    """A predicate true on the first thread of each warp ("warp") or warpgroup ("warpgroup")."""
    key = ("first-of-each", unit)
    if key not in ctx.addresses:
        size = T.ONE_PER[unit]
        ctx.addresses[key] = ctx.pro.cmp("eq", ctx.pro.op("and.b32", "b32", ctx.tid, size - 1, hint=f"in_{unit}"), 0)
    return ctx.addresses[key]


def init_barriers(ctx):
    """Thread 0 initialises every stage of every barrier with its arrival count, then the
    initialisation is fenced and published to the CTA (and to the TMA unit)."""
    kernel, pro = ctx.kernel, ctx.pro
    if not kernel.barriers:
        return
    kernel.features.add("mbarrier")
    first = first_thread(ctx)   # (the roles start in the body: thread 0)
    pro.comment("mbarriers: thread 0 initialises them, a fence and a CTA barrier publish them")
    for bar in kernel.barriers:
        for s in range(bar.stages):
            pro.emit(Instr(f"mbarrier.init.{SHARED}.b64", (), (Addr(barrier_address(pro, ctx, bar, s)),
                                                                  Imm(bar.arrivals)), pred=first,
                           comment=f"{bar.name}[{s}]: {bar.arrivals} arrival{'s' if bar.arrivals > 1 else ''}"))
    pro.emit(Instr("fence.mbarrier_init.release.cluster", (), (), pred=first))
    pro.emit(Instr("bar.sync", (), (0,)))
    if cluster_size(kernel) > 1:   # peers arrive on these barriers and multicast onto them
        pro.comment("every CTA of the cluster has its barriers before any peer uses them")
        cluster_sync(pro)


def cluster_size(kernel) -> int:
    x, y, z = kernel.cluster
    return x * y * z


def cluster_sync(b):
    """barrier.cluster.arrive + wait: every thread of the cluster."""
    b.emit(Instr("barrier.cluster.arrive.release", (), ()))
    b.emit(Instr("barrier.cluster.wait.acquire", (), ()))


def lower_arrive(b, ctx, op):
    ctx.kernel.features.add("mbarrier")
    addr = Addr(barrier_address(b, ctx, op.bar, op.stage))
    pred = first_thread(ctx) if op.single else first_of_each(ctx, op.one_per) if op.one_per else None
    if op.cta is not None:   # a peer's barrier: its shared::cluster address, then a release there
        ctx.kernel.features.add("cluster")
        remote = b.op("mapa.shared::cluster.u32", "b32", addr.base, op.cta, hint="peer_bar", pred=pred)
        # the default .release.cta, as CUTLASS's ClusterBarrier::arrive(cta_id): .release.cluster
        # measured 25-30% slower on the H200 (docs/perf_notes.md section 23)
        b.emit(Instr("mbarrier.arrive.shared::cluster.b64", (), (Sym("_"), Addr(remote)), pred=pred,
                     comment=f"{op.bar.name}: arrive on cluster CTA {op.cta if isinstance(op.cta, int) else 'peer'}"))
        return
    if op.expect_bytes:
        b.emit(Instr(f"mbarrier.arrive.expect_tx.{SHARED}.b64", (), (Sym("_"), addr, Imm(op.expect_bytes)),
                     pred=pred, comment=f"{op.bar.name}: arrive, expecting {op.expect_bytes} bytes"))
    else:
        b.emit(Instr(f"mbarrier.arrive.{SHARED}.b64", (), (Sym("_"), addr), pred=pred))


def lower_wait(b, ctx, op):
    ctx.kernel.features.add("mbarrier")
    addr = Addr(barrier_address(b, ctx, op.bar, op.stage))
    done = Value("pred", "phase_done")
    test = Instr(f"mbarrier.try_wait.parity.{SHARED}.b64", (done,), (addr, op.parity))
    b.emit(SpinWait([test], done, comment=f"wait for {op.bar.name}'s phase of parity {_text(op.parity)}"))


def _text(x) -> str:
    return str(x) if isinstance(x, int) else (x.hint or "p")


def lower_cluster_sync(b, ctx, op):
    ctx.kernel.features.add("cluster")
    cluster_sync(b)


__all__ = ["barrier_address", "cluster_size", "cluster_sync", "first_thread", "init_barriers", "lower_arrive",
           "lower_cluster_sync", "lower_wait"]
