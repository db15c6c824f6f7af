"""Lowering of tile ops to instructions, one function per op kind."""
from __future__ import annotations

from ...errors import IRError
from .. import tile as T
from ..builder import Builder
from ..instr import Comment, If, Instr, Loop, Role
from ..values import Addr, Imm, Sym
from .barrier import lower_barrier
from .context import LowerContext
from .copy import lower_copy
from .fragment import lower_fill, lower_load_fragment, lower_mma, lower_split
from .store import (lower_accumulate, lower_load_accumulator, lower_fetch_vector, lower_park_vector, lower_store, lower_store_row_vector,
                    lower_store_stage)
from .wgmma import (lower_fence_proxy_async, lower_wgmma, lower_wgmma_commit, lower_wgmma_fence,
                    lower_wgmma_wait)
from .elementwise import lower_elementwise, lower_mask, lower_row_reduce, lower_to_operand
from .mbarrier import cluster_size, cluster_sync, init_barriers, lower_arrive, lower_cluster_sync, lower_wait
from .tma import lower_tma_load, lower_tma_store, lower_tma_store_commit, lower_tma_store_wait


def _commit(b, ctx, op):
    b.emit(Instr("cp.async.commit_group"))
    ctx.kernel.features.add("cp.async")


def _wait(b, ctx, op):
    b.emit(Instr("cp.async.wait_group", (), (op.pending,)))


def _set_max_registers(b, ctx, op):
    ctx.kernel.features.add("setmaxnreg")
    b.emit(Instr(f"setmaxnreg.{'inc' if op.increase else 'dec'}.sync.aligned.u32", (), (Imm(op.count),),
                 comment=f"this warpgroup {'takes' if op.increase else 'gives back'} registers: {op.count} per thread"))


LOWERINGS = {
    T.CopyAsync: lower_copy,
    T.CommitGroup: _commit,
    T.WaitGroup: _wait,
    T.Barrier: lower_barrier,
    T.FillFragment: lower_fill,
    T.LoadFragment: lower_load_fragment,
    T.Mma: lower_mma,
    T.SplitTF32: lower_split,
    T.StoreFragment: lower_store,
    T.StoreRowVector: lower_store_row_vector,
    T.AccumulateFragment: lower_accumulate,
    T.LoadAccumulator: lower_load_accumulator,
    # sm_90a: warpgroup mma from shared memory
    T.Wgmma: lower_wgmma,
    T.WgmmaFence: lower_wgmma_fence,
    T.WgmmaCommit: lower_wgmma_commit,
    T.WgmmaWait: lower_wgmma_wait,
    T.FenceProxyAsync: lower_fence_proxy_async,
    # sm_90: TMA copies completing on mbarriers
    T.MBarrierArrive: lower_arrive,
    T.MBarrierWait: lower_wait,
    T.TmaLoad: lower_tma_load,
    T.TmaStore: lower_tma_store,
    T.TmaStoreCommit: lower_tma_store_commit,
    T.TmaStoreWait: lower_tma_store_wait,
    T.StoreStage: lower_store_stage,
    T.FetchVector: lower_fetch_vector,
    T.ParkVector: lower_park_vector,
    T.ClusterSync: lower_cluster_sync,
    # sm_90a: warp specialization
    T.SetMaxRegisters: _set_max_registers,
}
# Fragment arithmetic (softmax, attention): ir/lower/elementwise.py
LOWERINGS.update({
    T.Elementwise: lower_elementwise,
    T.RowReduce: lower_row_reduce,
    T.MaskFragment: lower_mask,
    T.FragmentToOperand: lower_to_operand,
})


def load_params(kernel) -> list:
    """The kernel's parameters in registers, in declaration order: ld.param each, and a
    pointer's global address (cvta.to.global) right after it; a tensor map's generic address."""
    out: list = []
    for p in kernel.params:
        if p.type == "tensormap":  # passed by value: TMA takes the parameter's generic address
            out.append(Instr("mov.b64", (p.value,), (Sym(p.name),)))
            out.append(Instr("cvta.param.u64", (p.value,), (p.value,)))
            continue
        out.append(Instr(f"ld.param.{p.type}", (p.value,), (Addr(Sym(p.name)),)))
        if p.global_value is not None:
            out.append(Instr("cvta.to.global.u64", (p.global_value,), (p.value,)))
    return out


def lower_tile_ops(kernel):
    """Replace every tile op by instructions; the parameters are loaded first (they define
    values the entry-time setup reads), then that setup, then the body."""
    prologue: list = []
    ctx = LowerContext(kernel, prologue)
    init_barriers(ctx)
    body = _lower_region(kernel.body, ctx)
    if cluster_size(kernel) > 1:   # no CTA leaves while a peer may still arrive on or copy into it
        end = Builder(body)
        end.comment("the cluster's CTAs leave together")
        cluster_sync(end)
    entry = [Comment("entry: thread ids, shared base, lane-dependent offsets")]
    kernel.body = load_params(kernel) + entry + prologue + body
    kernel.level = "instr"
    return kernel


def _lower_region(nodes, ctx):
    out: list = []
    b = Builder(out)
    for node in nodes:
        if isinstance(node, (Instr, Comment)):
            out.append(node)
        elif isinstance(node, Loop):
            node.body = _lower_region(node.body, ctx)
            out.append(node)
        elif isinstance(node, Role):   # single-thread ops inside pick the role's first thread
            outer, ctx.role = ctx.role, node
            node.body = _lower_region(node.body, ctx)
            ctx.role = outer
            out.append(node)
        elif isinstance(node, If):
            node.body = _lower_region(node.body, ctx)
            node.orelse = _lower_region(node.orelse, ctx)
            out.append(node)
        elif type(node) in LOWERINGS:
            if node.comment or node.loc:
                b.comment(" ".join(x for x in (node.comment, f"({node.loc})" if node.loc else "") if x))
            LOWERINGS[type(node)](b, ctx, node)
        else:
            raise IRError(f"no lowering for {type(node).__name__}")
    return out
