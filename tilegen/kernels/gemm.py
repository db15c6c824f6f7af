"""The GEMM template, written in the tilegen DSL.

C = alpha * A @ B + beta * C. Each CTA computes a tile.m x tile.n block of C; its warps
split it into warp tiles of mma atoms. K is walked in tile.k steps through a pipeline of
`stages` shared-memory buffers filled by cp.async: while the tensor cores work on one
stage, the copies of the next stages are in flight.
"""
from __future__ import annotations

from .. import dsl as tg
from ..layout import operand_mode
from .wgmma_mainloop import WgmmaPipeline


def gemm_kernel_name(spec) -> str:
    t, w = spec.tile, spec.warps
    kind = ("_wgmma" if spec.instruction == "wgmma" else "") + ("_persistent" if spec.persistent else "")
    return (f"tilegen_gemm{kind}_{spec.dtype}_{spec.a_layout[0]}{spec.b_layout[0]}_{spec.out_dtype}_"
            f"{t.m}x{t.n}x{t.k}_w{w.m}x{w.n}_s{spec.stages}_{spec.swizzle}_fb{spec.frag_buffers}"
            + _epilogue_suffix(spec.epilogue))


def _epilogue_suffix(epi) -> str:
    parts = ([f"bias{epi.bias}"] if epi.bias else []) + ([epi.activation] if epi.activation != "none" else [])
    return "".join("_" + p for p in parts + (["residual"] if epi.residual else []))


def launch_grid(spec, sizes) -> tuple:
    """One CTA per tile.m x tile.n block of C, in one dimension; persistent kernels launch
    at most one CTA per SM, each walking blocks pid, pid + CTAs, ..."""
    blocks = -(-sizes["M"] // spec.tile.m) * -(-sizes["N"] // spec.tile.n)
    if spec.persistent:
        from ..runtime.driver import persistent_ctas

        blocks = min(blocks, persistent_ctas())
    return (blocks, 1, 1)


def block_origin(spec, index, M, N):
    """(m0, n0) of block `index` in the grouped launch order: spec.group_m consecutive
    blocks walk down M before moving along N, so the B blocks they share stay in L2."""
    BM, BN = spec.tile.m, spec.tile.n
    blocks_m, blocks_n = tg.cdiv(M, BM), tg.cdiv(N, BN)
    per_group = blocks_n * spec.group_m
    first_m = (index // per_group) * spec.group_m
    group_rows = tg.minimum(blocks_m - first_m, spec.group_m)
    in_group = index % per_group
    return (first_m + in_group % group_rows) * BM, (in_group // group_rows) * BN


@tg.kernel
def gemm(spec):
    BM, BN, BK = spec.tile
    WM, WN = spec.warp_tile
    S = spec.stages
    atom = spec.mma

    tg.launch(threads=spec.threads, grid=lambda sizes: launch_grid(spec, sizes))
    A = tg.tensor("A", spec.dtype, ("M", "K"), layout=spec.a_layout)
    B = tg.tensor("B", spec.dtype, ("K", "N"), layout=spec.b_layout)
    C = tg.tensor("C", spec.out_dtype, ("M", "N"))
    alpha = tg.scalar("alpha")
    beta = tg.scalar("beta")
    epi = spec.epilogue
    # Fused epilogue operands have the output's dtype: a bias per column (N) or per row (M)
    # and a residual of C's shape.
    bias = tg.vector("bias", spec.out_dtype, "N" if epi.bias == "col" else "M") if epi.bias else None
    R = tg.tensor("R", spec.out_dtype, ("M", "N")) if epi.residual else None
    M, K = A.shape
    N = B.shape[1]

    pid = tg.program_id()
    if not spec.persistent:  # this CTA's block of C
        m0, n0 = block_origin(spec, pid, M, N)

    a_rows, a_cols = spec.operand_tile("A")
    b_rows, b_cols = spec.operand_tile("B")
    # Each operand's layout (tilegen/layout.py operand_mode): the spec's swizzle, or padded rows
    # for 32-bit operands read with single loads.
    mode_a, pad_a = operand_mode(spec, "A")
    mode_b, pad_b = operand_mode(spec, "B")
    # Stages keep the tensors' memory order, except where a tf32 wgmma kernel transposes an
    # MN-major operand while copying it (spec.stage_layout).
    sA = tg.shared("sA", spec.dtype, a_rows, a_cols, stages=S, swizzle=mode_a, pad=pad_a,
                   logical=spec.stage_layout("A"))
    sB = tg.shared("sB", spec.dtype, b_rows, b_cols, stages=S, swizzle=mode_b, pad=pad_b,
                   logical=spec.stage_layout("B"))

    # Warps are laid out M-fastest: warp w owns rows (w % warps.m) and columns (w // warps.m).
    warp = tg.warp_id()
    wm = (warp % spec.warps.m) * WM
    wn = (warp // spec.warps.m) * WN
    if spec.instruction == "wgmma":
        pipe = WgmmaPipeline(spec, A, B, sA, sB, warp, wm, wn)
        if not spec.persistent:
            pipe.prologue(m0, n0)
            acc = pipe.k_loop(m0, n0)
            store_tile(spec, C, acc, m0 + wm, n0 + wn, alpha, beta, bias, R)
            return
        # Persistent: CTA pid takes blocks pid, pid + CTAs, ... While one block's accumulator
        # is stored, the copies of the next block's first tiles are already in flight.
        blocks = tg.cdiv(M, BM) * tg.cdiv(N, BN)
        ctas = tg.num_programs()
        pipe.prologue(*block_origin(spec, pid, M, N))
        for i in tg.range(0, tg.cdiv(blocks - pid, ctas)):
            m0, n0 = block_origin(spec, pid + i * ctas, M, N)
            acc = pipe.k_loop(m0, n0)
            tg.barrier()  # every warpgroup is done with the stages: refill them
            following = pid + (i + 1) * ctas
            with tg.if_(tg.lt(following, blocks)):
                pipe.prologue(*block_origin(spec, following, M, N))
            store_tile(spec, C, acc, m0 + wm, n0 + wn, alpha, beta, bias, R)
        return
    acc = tg.fragment(atom, "C", (WM // atom.m, WN // atom.n), name="acc")
    # With two sets of operand fragments the loads for k-step kk+1 are issued before the
    # mma of k-step kk, so shared-memory latency hides behind tensor-core work. f32 operands
    # (3xTF32) keep a low part beside each fragment: A@B ~ Ahi@Bhi + Ahi@Blo + Alo@Bhi.
    split = spec.split_tf32
    frags = [(tg.fragment(atom, "A", (WM // atom.m, 1), name=f"a{i}"),
              tg.fragment(atom, "B", (1, WN // atom.n), name=f"b{i}")) for i in range(spec.frag_buffers)]
    lows = [(tg.fragment(atom, "A", (WM // atom.m, 1), name=f"a{i}_lo"),
             tg.fragment(atom, "B", (1, WN // atom.n), name=f"b{i}_lo")) for i in range(spec.frag_buffers)] if split else []
    steps = BK // atom.k
    # The tensor cores add into their accumulator with truncation, a bias that grows with K:
    # f32-accuracy GEMMs sum each k-step's three products into a fresh partial fragment and
    # add that to the total with a correctly rounded f32 add.
    part = tg.fragment(atom, "C", (WM // atom.m, WN // atom.n), name="part") if split else None

    def load(buf, stage, kk):
        a, b = frags[buf]
        tg.load(a, sA[stage], wm, kk * atom.k, comment=f"k-step {kk}: fragment a{buf}", round=not split)
        tg.load(b, sB[stage], kk * atom.k, wn, comment=f"k-step {kk}: fragment b{buf}", round=not split)
        if split:
            tg.split_tf32(a, lows[buf][0])
            tg.split_tf32(b, lows[buf][1])

    def mma(buf):
        a, b = frags[buf]
        if not split:
            tg.mma(acc, a, b)
            return
        a_lo, b_lo = lows[buf]  # the small terms first, so they are not lost against the large one
        tg.mma(part, a, b_lo, accumulate=False)
        tg.mma(part, a_lo, b)
        tg.mma(part, a, b)
        tg.add(acc, part, out=acc)

    def wait_for_tile():
        # Group kt has landed once at most S-2 newer ones are pending; the barrier makes
        # every thread's copies visible and ends all reads of the stage refilled next.
        tg.wait(S - 2)
        tg.barrier()

    k_tiles = tg.cdiv(K, BK)
    # Prologue: fill stages 0 .. S-2. Blocks past K arrive as zeros and add nothing.
    for s in range(S - 1):
        tg.copy_async(sA[s], A.block(m0, s * BK), comment=f"prologue: stage {s} of A")
        tg.copy_async(sB[s], B.block(s * BK, n0), comment=f"prologue: stage {s} of B")
        tg.commit()
    if spec.frag_buffers == 2:
        wait_for_tile()
        load(0, 0, 0)

    def step(kt, prefetch_inside_k):
        if spec.frag_buffers == 1:
            return step_single(kt, prefetch_inside_k)
        stage = kt % S
        for kk in range(steps):
            buf = kk % 2
            if kk == 0:
                # Refill the stage read during the previous tile (the barrier that ended
                # that tile ended its reads), S-1 tiles ahead.
                ahead = kt + (S - 1)
                inside = ("K",) if prefetch_inside_k else ()
                tg.copy_async(sA[ahead % S], A.block(m0, ahead * BK), inbounds=inside,
                              comment="prefetch A, S-1 tiles ahead")
                tg.copy_async(sB[ahead % S], B.block(ahead * BK, n0), inbounds=inside,
                              comment="prefetch B, S-1 tiles ahead")
                tg.commit()
            if kk + 1 < steps:
                load(1 - buf, stage, kk + 1)
                mma(buf)
            else:  # last k-step: the next tile's first fragments come from the next stage
                if buf == 0:  # an odd number of k-steps: buffer 0 is still in use
                    mma(buf)
                wait_for_tile()
                load(0, (kt + 1) % S, 0)
                if buf == 1:
                    mma(buf)

    def step_single(kt, prefetch_inside_k):
        # One set of fragments: fewer registers, no overlap of loads with the mma.
        stage = kt % S
        wait_for_tile()
        for kk in range(steps):
            load(0, stage, kk)
            mma(0)
        ahead = kt + (S - 1)
        inside = ("K",) if prefetch_inside_k else ()
        tg.copy_async(sA[ahead % S], A.block(m0, ahead * BK), inbounds=inside, comment="prefetch A, S-1 tiles ahead")
        tg.copy_async(sB[ahead % S], B.block(ahead * BK, n0), inbounds=inside, comment="prefetch B, S-1 tiles ahead")
        tg.commit()

    # While the tile being prefetched is a whole one, its copies skip the test against K;
    # the tail iterations prefetch the partial tile (if any) and the zeros past the end.
    full_tiles = K // BK
    steady = full_tiles - tg.minimum(full_tiles, S - 1)
    for kt in tg.range(0, steady):
        step(kt, prefetch_inside_k=True)
    for kt in tg.range(steady, k_tiles):
        step(kt, prefetch_inside_k=False)

    tg.wait(0)
    store_tile(spec, C, acc, m0 + wm, n0 + wn, alpha, beta, bias, R)


def store_tile(spec, C, acc, row, col, alpha, beta, bias, R):
    """The epilogue: the warp's accumulator, through the spec's fused operations, into C at
    (row, col); a kernel that computes C^T = B^T A^T holds a block of C^T, stored transposed."""
    epi = spec.epilogue
    if spec.swaps_operands:
        C, R, row, col = C.T, (R.T if R is not None else None), col, row
    tg.store(C.block(row, col), acc, alpha=alpha, beta=beta, bias=bias, activation=epi.activation,
             residual=R.block(row, col) if R is not None else None)
