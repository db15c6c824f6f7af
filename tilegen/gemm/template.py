"""The GEMM template, written in the tilegen DSL.

C = act(alpha * A @ B + beta * C + bias) + residual. Each CTA computes tile.m x tile.n
blocks of C; its warps split a block into warp tiles. K is walked by the main loop of the
spec's instruction family (gemm/mainloops/), and the block is stored through the fused
epilogue (gemm/epilogue.py).
"""
from __future__ import annotations

from .. import dsl as tg
from .epilogue import store_block
from .layouts import operand_mode
from .spec import STREAM_K_FIXUP


def gemm_kernel_name(spec) -> str:
    t, w = spec.tile, spec.warps
    kind = (spec.mainloop.kernel_tag + ("_tma" if spec.copy == "tma" else "") + ("_persistent" if spec.persistent else "")
            + ("_tmastore" if spec.store == "tma" else "")
            + (f"_cluster{spec.cluster[0]}x{spec.cluster[1]}" if spec.cluster != (1, 1) else "")
            + (f"_splitk{spec.split_k}" if spec.split_k > 1 else "") + ("_streamk" if spec.stream_k else "")
            + ("_pingpong" if spec.pingpong else "") + ("_batched" if spec.batched else "")
            + (f"_promote{spec.promote}" if spec.promote else "") + ("_swapped" if spec.swap_ab else ""))
    dtypes = spec.dtype if spec.b_dtype == spec.dtype else f"{spec.dtype}x{spec.b_dtype}"
    # (fields whose other values change the PTX too, named where they are not the default, so that
    # two kernels of one name are one kernel in profiles and logs)
    kind += (f"_acc{spec.acc_dtype}" if spec.acc_dtype != "f32" else "") + (
        f"_g{spec.group_m}" if spec.group_m != 8 else "")
    return (f"tilegen_gemm{kind}_{dtypes}_{spec.a_layout[0]}{spec.b_layout[0]}_{spec.out_dtype}_"
            f"{t.m}x{t.n}x{t.k}_w{w.m}x{w.n}_s{spec.stages}_{spec.swizzle}_fb{spec.frag_buffers}"
            + _epilogue_suffix(spec.epilogue))


def _epilogue_suffix(epi) -> str:
    parts = ([f"bias{epi.bias}"] if epi.bias else []) + ([epi.activation] if epi.activation != "none" else [])
    parts += (["residual"] if epi.residual else []) + (["scalerows"] if epi.scale_rows else []) \
        + (["scalecols"] if epi.scale_cols else []) + (["devscalea"] if epi.device_scale_a else []) \
        + (["devscaleb"] if epi.device_scale_b else [])
    return "".join("_" + p for p in parts)


def epilogue_scalars(epi) -> tuple:
    """(alpha, beta), alpha times the per-tensor scales the kernel reads from device memory
    (Epilogue(device_scale_a=, device_scale_b=): parameters scale_a_ptr, scale_b_ptr)."""
    alpha, beta = tg.scalar("alpha"), tg.scalar("beta")
    for name, on in (("scale_a", epi.device_scale_a), ("scale_b", epi.device_scale_b)):
        if on:
            alpha = alpha * tg.device_scalar(name)
    return alpha, beta


def scale_vectors(epi) -> tuple:
    """The epilogue's f32 scale vectors: per row of C ("scale_a", length M: the scales of A's
    rows) and per column ("scale_b", length N: those of B's columns), or None."""
    return (tg.vector("scale_a", "f32", "M") if epi.scale_rows else None,
            tg.vector("scale_b", "f32", "N") if epi.scale_cols else None)


class KSlice:
    """An operand seen through one slice of K (split-K): blocks are the tensor's own, shifted
    by k0 along K, and K reads as the slice's length, so a main loop walks only the slice.
    Copies past the slice's end may fetch the next slice's data; the loop never multiplies it."""

    def __init__(self, tensor, operand: str, k0, k_len):
        self.tensor, self.operand, self.k0 = tensor, operand, k0
        rows, cols = tensor.shape
        self.shape = (rows, k_len) if operand == "A" else (k_len, cols)

    def block(self, row, col):
        return self.tensor.block(row, col + self.k0) if self.operand == "A" else self.tensor.block(row + self.k0, col)

    def __getattr__(self, name):
        return getattr(self.tensor, name)


def slice_length(spec, K):
    """Columns of K in each split-K slice: whole k-tiles, as even as they go (the last slice
    the shortest; with fewer k-tiles than slices, the last ones empty)."""
    return tg.cdiv(tg.cdiv(K, spec.tile.k), spec.split_k) * spec.tile.k


def split_rows(spec, M):
    """Rows of one slice's partial sums in the workspace: M rounded up to whole blocks, so no
    block of one slice reaches into the next."""
    return tg.cdiv(M, spec.tile.m) * spec.tile.m


STREAM_K_MIN_PIECE = 8   # k-tiles: fewer CTAs share the last blocks when that keeps pieces this long


def _maximum(a, b):
    return a + b - tg.minimum(a, b)


class StreamK:
    """The work of persistent CTA `pid` of `ctas` under stream-K (spec.stream_k).

    The blocks of C that fill whole waves go as usual: block pid + i * ctas for i < waves.
    The k-tiles of the remaining blocks (fewer than `ctas`) are laid end to end and cut into
    nearly equal ranges, one for each of the first `sharers` CTAs: as many CTAs as keep a
    range STREAM_K_MIN_PIECE k-tiles long (a block's pieces are added by one fix-up thread in
    turn), but no fewer than the shared blocks, so that a range is never longer than a
    block's K and meets at most two blocks: its pieces. Each piece's f32 sum goes to the
    workspace W at rows (2 pid + block % 2) * tile.m (two CTAs never share a slot), and
    stream_k_fixup adds a block's pieces in CTA order and applies the epilogue: the same
    sums every run. Both kernels compute this split alike (the fix-up from the workspace's
    rows, 2 * ctas * tile.m)."""

    def __init__(self, spec, M, N, K, ctas):
        BM, BN = spec.tile.m, spec.tile.n
        self.spec = spec
        self.k_tiles = k_tiles = tg.cdiv(K, spec.tile.k)
        blocks = tg.cdiv(M, BM) * tg.cdiv(N, BN)
        self.waves = blocks // ctas
        self.first_shared = self.waves * ctas        # the first block shared out by k-tiles
        shared = blocks - self.first_shared
        self.total = total = shared * k_tiles
        sharers = _maximum(shared, tg.minimum(ctas, total // STREAM_K_MIN_PIECE))
        self.sharers = sharers - tg.minimum(sharers, 1) + 1     # (at least 1: no shared block, no range)

    def start(self, c):
        """First k-tile (of the shared ones, end to end) of CTA c's range; c <= sharers."""
        return (c * self.total) // self.sharers

    def pieces(self, pid):
        """CTA pid's pieces: (block among the shared ones, its first k-tile, k-tiles, k-tiles of
        the range before it); a piece with no k-tiles is skipped."""
        k_tiles = self.k_tiles
        start = self.start(tg.minimum(pid, self.sharers))
        end = self.start(tg.minimum(pid + 1, self.sharers))
        b0 = start // k_tiles
        end0 = tg.minimum(end, (b0 + 1) * k_tiles)
        return ((b0, start - b0 * k_tiles, end0 - start, 0), (b0 + 1, 0, end - end0, end0 - start))

    def slot_row(self, cta, block):
        """First workspace row of CTA `cta`'s piece of shared block `block`."""
        return (2 * cta + block % 2) * self.spec.tile.m


class TmaStack:
    """A stack of products on the warp-specialized TMA kernel (spec.batched with copy="tma"):
    each operand a stack of matrices (tg.batched_tensor) whose TMA copies go through one 3-D map
    of the stack, so every box stops at its own matrix's edges (any M, N, K), a broadcast
    operand (stride 0) is read at matrix 0, and matrices may lie anywhere 16-byte strides
    reach. The persistent walk covers every block of every matrix: block j is block j % per of
    matrix j // per. A block is named by its first row among the stack's rows (matrix * M +
    row, one number through the pipeline); `place` finds the matrix and its row again."""

    def __init__(self, spec, out_dtype, residual: bool):
        self.spec = spec
        self.A = tg.batched_tensor("A", spec.dtype, ("M", "K"), layout=spec.a_layout)
        self.B = tg.batched_tensor("B", spec.b_dtype, ("K", "N"), layout=spec.b_layout)
        # (split-K too: the last slice to finish a block stores it through the epilogue)
        self.C = tg.batched_tensor("C", out_dtype, ("M", "N"))
        self.R = tg.batched_tensor("R", out_dtype, ("M", "N")) if residual else None
        self.k0 = 0   # the first column of K this CTA's blocks read (split-K: its slice's)
        self.M, self.N = tg.size("M"), tg.size("N")
        self.per = tg.cdiv(self.M, spec.tile.m) * tg.cdiv(self.N, spec.tile.n)   # blocks per matrix
        self.blocks = self.per * tg.size("BATCH")

    def origin(self, j):
        """(first stack row, column) of block j of the walk."""
        m0, n0 = block_origin(self.spec, j % self.per, self.M, self.N)
        return (j // self.per) * self.M + m0, n0

    def place(self, stack, row):
        """(the matrix of `stack` that a block at stack row `row` is in, the block's row in it)."""
        b = row // self.M
        return stack.batch(b), row - b * self.M

    def operand_blocks(self, m0, n0):
        """(A's block, B's block) of the block at stack row m0 as functions of a k-tile's first
        column (pipeline.operand_blocks): the block's matrix is found once, here."""
        b = m0 // self.M
        A, B, m, k0 = self.A.batch(b), self.B.batch(b), m0 - b * self.M, self.k0
        return (lambda k: A.block(m, k0 + k)), (lambda k: B.block(k0 + k, n0))


def launch_grid(spec):
    """One CTA per tile.m x tile.n block of C, in one dimension; persistent kernels launch
    at most one CTA per SM, each walking blocks pid, pid + CTAs, ... In clusters (pairs of
    CTAs) the unit is a pair's block (cluster_block) and every pair's two CTAs walk the same.
    Stream-K launches a CTA on every SM (fewer only when there are fewer k-tiles in all)."""
    cm, cn = spec.cluster
    blocks = tg.cdiv("M", spec.tile.m * cm) * tg.cdiv("N", spec.tile.n * cn)
    ctas = blocks * (cm * cn) if cm * cn > 1 else blocks
    if spec.stream_k:   # every SM, as long as each can have a k-tile
        return (tg.minimum(blocks * tg.cdiv("K", spec.tile.k), tg.SM_COUNT), 1, 1)
    if spec.batched and spec.persistent:   # every block of every matrix of a stack (TmaStack), a row per K slice
        # (a share of the SMs per slice row: rows of cdiv(SMs, S) CTAs would overflow the GPU
        # by up to S - 1, and those CTAs would wait for a second wave)
        return (tg.minimum(blocks * "BATCH", tg.share(tg.SM_COUNT, spec.split_k)), spec.split_k, 1)
    if spec.batched:     # a row of blocks per matrix of the stack
        return (blocks, "BATCH", 1)
    return (tg.minimum(ctas, tg.SM_COUNT) if spec.persistent else blocks, spec.split_k, 1)


def block_origin(spec, index, M, N):
    """(m0, n0) of block `index` in the grouped launch order: spec.group_m consecutive
    blocks walk down M before moving along N, so the B blocks they share stay in L2. In a
    cluster the blocks are a pair's (tile.m * 2 x tile.n along M, or the other way)."""
    BM, BN = spec.tile.m * spec.cluster[0], spec.tile.n * spec.cluster[1]
    blocks_m, blocks_n = tg.cdiv(M, BM), tg.cdiv(N, BN)
    per_group = blocks_n * spec.group_m
    first_m = (index // per_group) * spec.group_m
    group_rows = tg.minimum(blocks_m - first_m, spec.group_m)
    in_group = index % per_group
    return (first_m + in_group % group_rows) * BM, (in_group // group_rows) * BN


@tg.kernel
def gemm(spec):
    tg.launch(threads=spec.threads, grid=launch_grid(spec), cluster=(spec.cluster[0] * spec.cluster[1], 1, 1))
    epi = spec.epilogue
    # a stack of products (spec.batched): each matrix `<name>_batch_stride` elements after the
    # one before; grid row y multiplies matrix y of each
    # (on the warp-specialized kernel, stacks through 3-D tensor maps: TmaStack)
    stack = TmaStack(spec, spec.out_dtype, epi.residual) if spec.batched and spec.persistent else None
    matrix = tg.batched_tensor if spec.batched else tg.tensor
    C = alpha = beta = bias = R = None
    scales = (None, None)
    if stack is not None:
        A, B, C, R = stack.A, stack.B, stack.C, stack.R
    else:
        A = matrix("A", spec.dtype, ("M", "K"), layout=spec.a_layout)
        B = matrix("B", spec.b_dtype, ("K", "N"), layout=spec.b_layout)   # (a mixed fp8 pair: the atom's B type)
    if spec.split_k == 1 or stack is not None:   # (2-D split-K: the second kernel, split_k_sum, has C and the epilogue)
        if stack is None:
            C = matrix("C", spec.out_dtype, ("M", "N"))
        alpha, beta = epilogue_scalars(epi)
        # Fused epilogue operands have the output's dtype: a bias per column (N) or per row (M)
        # (one for every matrix of a stack) and a residual of C's shape.
        bias = tg.vector("bias", spec.out_dtype, "N" if epi.bias == "col" else "M") if epi.bias else None
        if stack is None:
            R = matrix("R", spec.out_dtype, ("M", "N")) if epi.residual else None
        scales = scale_vectors(epi)
    if spec.batched and stack is None:
        b = tg.program_id("y")
        A, B, C, R = (x.batch(b) if x is not None else None for x in (A, B, C, R))
    M, N = (stack.M, stack.N) if stack is not None else (A.shape[0], B.shape[1])

    pid = tg.program_id()
    if not spec.persistent:  # this CTA's block of C
        m0, n0 = block_origin(spec, pid, M, N)
    if spec.split_k > 1:     # this CTA's slice of K; its partial sums go to the workspace W
        split = tg.program_id("y")
        K = A.shape[1]
        per_slice = slice_length(spec, K)
        k0 = tg.minimum(split * per_slice, K)
        k_len = tg.minimum(K - k0, per_slice)
        A, B = KSlice(A, "A", k0, k_len), KSlice(B, "B", k0, k_len)
        if stack is None:
            W = tg.tensor("W", "f32", ("WM", "N"))
        else:   # slice s of matrix b: matrix s * BATCH + b of an M x N stack (count: what a map would span)
            W = tg.batched_tensor("W", "f32", ("M", "N"))
            stack.k0 = k0
    # Stages keep the tensors' memory order unless the family transposes an operand while
    # copying it (spec.stage_layout); layouts are the spec's swizzle, or padded rows for
    # 32-bit operands read with single loads (gemm/layouts.py).
    sA, sB = (tg.shared(f"s{op}", spec.dtype if op == "A" else spec.b_dtype, *spec.operand_tile(op), stages=spec.stages,
                        swizzle=operand_mode(spec, op)[0], pad=operand_mode(spec, op)[1],
                        logical=spec.stage_layout(op)) for op in "AB")
    # Warps are laid out M-fastest: warp w owns rows (w % warps.m) and columns (w // warps.m);
    # in a warp-specialized kernel w counts from the first math warp, after the producer's.
    warp = tg.warp_id() - spec.mainloop.producer_warps(spec)
    if spec.pingpong:   # each consumer group's warps count from 0
        warp = warp % spec.warps.count
    wm = (warp % spec.warps.m) * spec.warp_tile[0]
    wn = (warp // spec.warps.m) * spec.warp_tile[1]
    pipe = spec.mainloop.pipeline(spec, A, B, sA, sB, warp, wm, wn)

    def store(acc, m0, n0):
        if stack is not None:   # (m0: a stack row; the warp's rows are offsets in its matrix)
            (c, m0), r = stack.place(C, m0), stack.place(R, m0)[0] if R is not None else None
            store_block(spec, c, acc, m0 + wm, n0 + wn, alpha, beta, bias, r, scales)
            return
        store_block(spec, C, acc, m0 + wm, n0 + wn, alpha, beta, bias, R, scales)

    if spec.split_k > 1 and stack is not None:   # the walk of the stack's blocks over this CTA's slice
        # Each slice's partial sums of a block go to W, and its CTA counts itself in at the
        # block's counter (tilegen.dsl.counters); the last slice to arrive adds every slice's, in
        # slice order (so every run adds them alike, whichever comes last), and stores C
        # through the epilogue: one launch. Slices past K's end are empty: they walk nothing,
        # and the others do not count them (a TMA stack has K > 0: call.stack_problem).
        F = tg.counters("F")
        slices = tg.cdiv(K, per_slice)
        blocks_m, blocks_n = tg.cdiv(stack.M, spec.tile.m), tg.cdiv(stack.N, spec.tile.n)

        def part(s, b, m0, n0):   # slice s's partial sums of this warp's block (of C^T where swapped)
            w = W.batch(s * tg.size("BATCH") + b)
            return w.T.block(n0 + wn, m0 + wm) if spec.swaps_operands else w.block(m0 + wm, n0 + wn)

        def store_partial(acc, row, n0):
            b = row // stack.M
            m0 = row - b * stack.M
            tg.store(part(split, b, m0, n0), acc)
            block = (b * blocks_m + m0 // spec.tile.m) * blocks_n + n0 // spec.tile.n
            with tg.if_(F.last_arrival(block, slices)):
                total = tg.fragment(acc.atom, "C", acc.tiles, name="total")
                for s in range(spec.split_k):
                    with tg.if_(tg.lt(s, slices)):
                        tg.accumulate(total, part(s, b, m0, n0))
                store(total, row, n0)
        pipe.operand_blocks, pipe.place = stack.operand_blocks, stack.place
        ctas = tg.num_programs()
        walk = tg.cdiv(stack.blocks - pid, ctas) * tg.minimum(k_len, 1)
        pipe.run(walk, lambda i: stack.origin(pid + i * ctas), store_partial, None, None, None)
        return
    if spec.split_k > 1:
        pipe.prologue(m0, n0)
        acc = pipe.k_loop(m0, n0)
        row, col = split * split_rows(spec, M) + m0 + wm, n0 + wn
        # (an accumulator of C^T, spec.swaps_operands, goes out through the transposed view)
        tg.store(W.T.block(col, row) if spec.swaps_operands else W.block(row, col), acc)
        return
    if not spec.persistent:
        pipe.prologue(m0, n0)
        store(pipe.k_loop(m0, n0), m0, n0)
        return
    # Persistent: CTA pid takes blocks pid, pid + CTAs, ... While one block's accumulator
    # is stored, the copies of the next block's first k-tiles are already in flight.
    blocks = tg.cdiv(M, spec.tile.m) * tg.cdiv(N, spec.tile.n)
    ctas = tg.num_programs()
    if spec.cluster != (1, 1):   # pairs of CTAs walk pairs of blocks; this CTA takes its half
        cm = spec.cluster[0]
        pairs = tg.cdiv(M, spec.tile.m * cm) * tg.cdiv(N, spec.tile.n * spec.cluster[1])
        cid, clusters, rank = tg.cluster_id(), tg.num_clusters(), tg.cluster_rank()

        def pair_origin(i):
            m0, n0 = block_origin(spec, cid + i * clusters, M, N)
            return (m0 + rank * spec.tile.m, n0) if cm == 2 else (m0, n0 + rank * spec.tile.n)
        pipe.run(tg.cdiv(pairs - cid, clusters), pair_origin, store, C, alpha, beta, bias, R, scales)
        return
    if spec.stream_k:   # whole waves of blocks, then pieces of the rest (StreamK)
        sk = StreamK(spec, M, N, A.shape[1], ctas)
        W = tg.tensor("W", "f32", ("WM", "WN"))

        def store_piece(acc, block):
            tg.store(W.block(sk.slot_row(pid, block) + wm, wn), acc)
        pipe.run(sk.waves, lambda i: block_origin(spec, pid + i * ctas, M, N), store, C, alpha, beta, bias, R, scales,
                 pieces=[(lambda b=b: block_origin(spec, sk.first_shared + b, M, N), b, kt0, n, off, store_piece)
                         for b, kt0, n, off in sk.pieces(pid)])
        return
    if stack is not None:       # each block of the walk in its matrix of the stack
        pipe.operand_blocks, pipe.place = stack.operand_blocks, stack.place
        pipe.run(tg.cdiv(stack.blocks - pid, ctas), lambda i: stack.origin(pid + i * ctas), store, C, alpha, beta,
                 bias, R, scales)
        return
    if spec.warp_specialized:   # a producer role requests them (gemm/mainloops/wgmma.py)
        pipe.run(tg.cdiv(blocks - pid, ctas), lambda i: block_origin(spec, pid + i * ctas, M, N), store, C, alpha, beta,
                 bias, R, scales)
        return
    pipe.prologue(*block_origin(spec, pid, M, N))
    for i in tg.range(0, tg.cdiv(blocks - pid, ctas)):
        m0, n0 = block_origin(spec, pid + i * ctas, M, N)
        acc = pipe.k_loop(m0, n0)
        tg.barrier()  # every warpgroup is done with the stages: refill them
        following = pid + (i + 1) * ctas
        with tg.if_(tg.lt(following, blocks)):
            pipe.prologue(*block_origin(spec, following, M, N))
        store(acc, m0, n0)


@tg.kernel
def split_k_sum(spec):
    """The second kernel of 2-D split-K: C = act(alpha * (W_0 + W_1 + ...) + beta * C + bias) +
    residual, the slices' partial sums added in slice order (so every run adds them alike). (A
    split-K stack's last slice to finish a block adds them in the GEMM kernel: gemm above.)"""
    BM, BN = REDUCE_TILE
    tg.launch(threads=32 * REDUCE_WARPS[0] * REDUCE_WARPS[1], grid=(tg.cdiv("M", BM) * tg.cdiv("N", BN), 1, 1))
    epi = spec.epilogue
    C = tg.tensor("C", spec.out_dtype, ("M", "N"))
    alpha, beta = epilogue_scalars(epi)
    bias = tg.vector("bias", spec.out_dtype, "N" if epi.bias == "col" else "M") if epi.bias else None
    R = tg.tensor("R", spec.out_dtype, ("M", "N")) if epi.residual else None
    scales = scale_vectors(epi)
    pid = tg.program_id()
    W = tg.tensor("W", "f32", ("WM", "N"))
    M, N = C.shape
    rows = split_rows(spec, M)
    blocks_n = tg.cdiv(N, BN)
    m0, n0 = (pid // blocks_n) * BM, (pid % blocks_n) * BN
    warp = tg.warp_id()
    wm, wn = (warp % REDUCE_WARPS[0]) * (BM // REDUCE_WARPS[0]), (warp // REDUCE_WARPS[0]) * (BN // REDUCE_WARPS[1])
    atom = "m16n8k16.f16.f32"
    acc = tg.fragment(atom, "C", (BM // REDUCE_WARPS[0] // 16, BN // REDUCE_WARPS[1] // 8), name="sum")
    for s in range(spec.split_k):
        tg.accumulate(acc, W.block(s * rows + m0 + wm, n0 + wn))
    tg.store(C.block(m0 + wm, n0 + wn), acc, alpha=alpha, beta=beta, bias=bias, activation=epi.activation,
             residual=R.block(m0 + wm, n0 + wn) if R is not None else None, row_scale=scales[0], col_scale=scales[1])


REDUCE_TILE = (64, 128)     # the sum kernel's block of C: 4 warps of 32 x 64
REDUCE_WARPS = (2, 2)


@tg.kernel
def stream_k_fixup(spec):
    """The second kernel of stream-K: for each block shared out by k-tiles (StreamK), C =
    act(alpha * (its pieces added in CTA order) + beta * C + bias) + residual. One CTA per
    STREAM_K_FIXUP part of such a block; the workspace's rows say how many CTAs the first
    kernel ran (2 * tile.m each)."""
    BM, BN = spec.tile.m, spec.tile.n
    FM, FN = STREAM_K_FIXUP
    parts_n = BN // FN
    parts = (BM // FM) * parts_n
    blocks = tg.cdiv("M", BM) * tg.cdiv("N", BN)
    ctas = launch_grid(spec)[0]
    tg.launch(threads=32 * REDUCE_WARPS[0] * REDUCE_WARPS[1], grid=((blocks % ctas) * parts, 1, 1))
    epi = spec.epilogue
    W = tg.tensor("W", "f32", ("WM", "WN"))
    C = tg.tensor("C", spec.out_dtype, ("M", "N"))
    K = tg.scalar("K", "u32")
    alpha, beta = epilogue_scalars(epi)
    bias = tg.vector("bias", spec.out_dtype, "N" if epi.bias == "col" else "M") if epi.bias else None
    R = tg.tensor("R", spec.out_dtype, ("M", "N")) if epi.residual else None
    scales = scale_vectors(epi)
    M, N = C.shape
    sk = StreamK(spec, M, N, K, W.shape[0] // (2 * BM))
    k_tiles = sk.k_tiles
    pid = tg.program_id()
    block, part = pid // parts, pid % parts
    pm, pn = (part // parts_n) * FM, (part % parts_n) * FN
    m0, n0 = block_origin(spec, sk.first_shared + block, M, N)
    warp = tg.warp_id()
    wm, wn = (warp % REDUCE_WARPS[0]) * (FM // REDUCE_WARPS[0]), (warp // REDUCE_WARPS[0]) * (FN // REDUCE_WARPS[1])
    acc = tg.fragment("m16n8k16.f16.f32", "C", (FM // REDUCE_WARPS[0] // 16, FN // REDUCE_WARPS[1] // 8), name="sum")
    # the CTAs whose ranges meet this block: from the one holding its first k-tile to the one
    # holding its last (CTA c's range starts at sk.start(c) = (c * total) // sharers)
    total, sharers = sk.total, sk.sharers
    first_cta = ((block * k_tiles + 1) * sharers - 1) // total
    last_cta = (((block + 1) * k_tiles) * sharers - 1) // total
    for c in tg.range(first_cta, last_cta + 1):   # (no range is empty: sharers <= total)
        tg.accumulate(acc, W.block(sk.slot_row(c, block) + pm + wm, pn + wn))
    row, col = m0 + pm + wm, n0 + pn + wn
    tg.store(C.block(row, col), acc, alpha=alpha, beta=beta, bias=bias, activation=epi.activation,
             residual=R.block(row, col) if R is not None else None, row_scale=scales[0], col_scale=scales[1])


def trace_gemm(spec):
    """The tile-level IR of a GemmSpec's kernel (with pretranspose: the K-major kernel that runs
    after the operands' transposing copies)."""
    spec = spec.kernel_spec
    return gemm.trace(spec=spec, target=spec.target, name=gemm_kernel_name(spec))


def trace_split_k_sum(spec):
    """The tile-level IR of a split-K spec's second kernel (the sum and the epilogue)."""
    return split_k_sum.trace(spec=spec, target=spec.target, name=gemm_kernel_name(spec) + "_sum")


def trace_stream_k_fixup(spec):
    """The tile-level IR of a stream-K spec's second kernel (the pieces' sums and the epilogue)."""
    return stream_k_fixup.trace(spec=spec, target=spec.target, name=gemm_kernel_name(spec) + "_fixup")


__all__ = ["gemm", "TmaStack", "trace_gemm", "trace_split_k_sum", "trace_stream_k_fixup", "split_k_sum", "stream_k_fixup",
           "gemm_kernel_name", "launch_grid", "block_origin", "slice_length", "split_rows", "KSlice", "StreamK"]
