"""The GEMM main loop on wgmma (sm_90a): cp.async fills the stages, each warpgroup's tensor
cores read them straight from shared memory.

Every thread copies; each warpgroup (4 warps stacked along M) multiplies its 64-row slice
of the stage by its columns of B. The wgmmas of a tile run asynchronously while the next
tile is waited for, so a stage is free again only once the wgmmas of the tile after it
have been issued and their predecessors retired (wgmma_wait(1)) by every warpgroup (the
barrier of the following tile). Hence the copies run stages - 2 tiles ahead:

    tile kt:  wait for its copies; fence (cp.async wrote through the generic proxy, wgmma
              reads through the async proxy); barrier; issue its wgmmas; refill the stage
              of tile kt - 2 with tile kt + stages - 2; wgmma_wait(1) (tile kt - 1 retired)

A tf32 operand that is MN-major in shared memory cannot be read by wgmma (spec.register_operand):
wgmma takes it as A from registers instead. Each warp retires its previous k-tile's wgmmas
(wgmma_wait(0): the registers are free again), loads its 16 rows of every k-step (rounded
to tf32), fences once and issues the k-tile's wgmmas; the other warpgroup's wgmmas keep the
tensor cores busy meanwhile (measured faster than retiring and reloading one k-step at a
time, docs/perf_notes.md section 15). With a row-major B the kernel computes
C^T = B^T A^T (spec.swaps_operands): wgmma's A is the warpgroup's 64 columns of B, its B
the whole tile of A read as A^T, and the accumulator holds a block of C^T, stored transposed.

Persistent kernels (spec.persistent) run one CTA per SM over several blocks of C: the
prologue copies of the next block start before this block's accumulator is stored.

With copy="tma" (the default for f16/bf16) one thread requests each k-tile with TMA (one box
per 128-byte panel of a stage, zeros past the edges) completing on the stage's `full`
mbarrier; every thread releases a stage on its `empty` mbarrier once the wgmmas reading it
are retired, and the stage is requested again when all have:

    tile kt:  wait full[kt % S]; issue its wgmmas; wgmma_wait(1) (tile kt - 1 retired);
              release tile kt - 1's stage; once every thread did, request tile kt + S - 1 into it

so S - 1 k-tiles are in flight while the tensor cores work, with no CTA barrier in the loop
(docs/perf_notes.md section 17).
"""
from __future__ import annotations

from ... import dsl as tg
from ...dsl.roles import default_registers
from ...arch import wgmma as W
from ...arch.dtypes import dtype as arch_dtype
from ...arch.swizzle import SWIZZLE_MODES
from ...errors import SpecError
from ...ir.layout import SmemLayout
from ..layouts import smem_layout
from .base import MainLoop
from .mma_sync import DEFAULT_TILE

WG_ROWS = W.M
# Two warpgroups of m64n256, four stages of 128-byte K rows (192 KB of shared memory).
DEFAULT_WGMMA_TILE = {"f16": (128, 256, 64), "bf16": (128, 256, 64), "tf32": (128, 256, 32),
                      # fp8: 128-byte K rows; 128 columns leave registers for promotion's f32 total
                      "e4m3": (128, 128, 128), "e5m2": (128, 128, 128)}
# tf32 with a row-major B computes C^T = B^T A^T: two warpgroups of 64 columns of C, each
# issuing m64n256 over the tile's 256 rows, B^T from registers (docs/perf_notes.md section 15).
TF32_ROW_B = ((256, 128, 32), (1, 8))
SWAPPED_TILE_WARPS = ((16, 64, 64), (1, 4))   # swap_ab: 16 rows of A by 64 columns of B, one warpgroup


class WgmmaLoop(MainLoop):
    """Rules of the wgmma kernels. Each warpgroup (4 warps stacked along M) multiplies a 64-row
    slice of the tile straight from shared memory: warps.m is a multiple of 4, every warp
    tile is 16 rows high (tile.m = 16 * warps.m) and at most 256 columns wide; the copies run
    stages - 2 tiles ahead of the tensor cores (one more stage is still being read by them).
    wgmma reads tf32 from shared memory only K-major; only its A may come from registers.
    So a tf32 kernel with a row-major (N-major) B computes C^T = B^T A^T (swaps_operands):
    its warpgroups are 4 warps side by side along N (warps (1, 4k), tile.n = 16 * warps.n,
    tile.m at most 256), each loading its 64 columns of B into registers. A column-major A
    goes through registers too (register_operand), or, in a swapped kernel, is transposed
    while copied (stage_layout). The tensor cores truncate the f32 values they read from
    shared memory to tf32; register operands are rounded to nearest (tf32_truncates)."""

    instruction = "wgmma"
    kernel_tag = "_wgmma"
    default_stages = 4
    persistent = True
    copies = ("cp.async", "tma")
    stores = ("direct", "tma")
    clusters = True
    TMA_DTYPES = ("f16", "bf16")   # in any layout (fp8 and tf32: K-major operands only, tma_copies)
    STAGING_PARTS = (2, 3, 4, 6, 8, 16)   # a block of C goes out through shared memory in this many slices
    STAGING_BUFFERS = 2             # ... alternating between two buffers: one fills while TMA reads the other

    def tma_copies(self, spec) -> bool:
        """Whether TMA can fill the stages as the tensors lie: 16-bit operands in any layout
        (wgmma transposes them), tf32 with both operands K-major (A row-major, B column-major:
        wgmma reads 32-bit operands K-major only, and TMA does not transpose), or, in the
        warp-specialized kernel, the one MN-major tf32 operand going through registers
        (consume_registers): A and B row-major (C^T = B^T A^T: A^T is K-major, B into
        registers) or both column-major (A into registers, B K-major)."""
        if spec.batched and spec.copy != "tma":   # (a stack through TMA: template.TmaStack)
            return False
        if spec.dtype in self.TMA_DTYPES:
            return True
        if self.swaps_operands(spec):   # tf32 A and B row-major: A^T K-major, B into registers
            return spec.a_layout == "row" and spec.persistent is not False   # (the warp-specialized kernel)
        if self.register_operand(spec) == "A":   # tf32 A column-major, B column-major: A into registers
            return spec.b_layout == "col" and spec.persistent is not False
        return (spec.dtype in ("tf32",) + W.FP8
                and self.register_operand(spec) is None and spec.a_layout == "row" and spec.b_layout == "col")

    def default_persistent(self, spec) -> bool:
        """The warp-specialized TMA kernel where TMA can copy: as fast as one CTA per block at
        square sizes and 1.15-1.25x at short K (docs/perf_notes.md section 18). tf32 with an
        operand through registers takes it only when asked (copy="tma", as tilegen.matmul does
        where a ptxas assembles it: the driver's JIT alone spills it; docs/perf_notes.md
        section 47)."""
        return (self.tma_copies(spec) and spec.copy in ("auto", "tma") and (spec.split_k == 1 or spec.batched)
                and (spec.copy == "tma" or not self._register_on_tma(spec)))

    def _register_on_tma(self, spec) -> bool:
        """tf32 whose MN-major operand would go through registers on the TMA kernel (and 16-bit
        swap_ab, which defaults to cp.async; fp8's swap_ab defaults to the warp-specialized kernel,
        the one that promotes)."""
        return (self.swaps_operands(spec) and spec.dtype not in W.FP8) or self.register_operand(spec) is not None

    def default_store(self, spec) -> str:
        """TMA stores where they can (warp-specialized, whole-width warp tiles, room for the
        staging buffer): 1.06-1.20x the direct stores (docs/perf_notes.md section 18)."""
        return "tma" if self._tma_store_problem(spec) is None else "direct"

    def _tma_store_problem(self, spec):
        """Why a spec cannot store with TMA, or None."""
        if not spec.warp_specialized:
            return "only the warp-specialized kernels (persistent, copy=tma) store with TMA"
        if spec.split_k > 1:
            return "split-K stores f32 partial sums (C is written by a second kernel, or on a stack by the last slice to finish a block)"
        if spec.warps.n != 1:
            return "TMA stores need warps (n, 1): each warp's accumulator spans the block's columns"
        if self.store_staging(spec) is None:
            if not any(self._slice_fits(spec, parts) for parts in self.STAGING_PARTS):
                widths = [n for n in range(8, 257, 8) if any(self._slice_fits(spec, p, n) for p in self.STAGING_PARTS)]
                counts = ", ".join(map(str, self.STAGING_PARTS[:-1])) + f" or {self.STAGING_PARTS[-1]}"
                return (f"the block's {spec.tile.n} columns of {spec.out_dtype} do not cut into {counts} slices of "
                        f"whole 128-byte rows (at most 1024 bytes each), as a TMA store through shared memory "
                        f"needs: tile widths that do, up to 256, are {', '.join(map(str, widths))}")
            return "no slice of the block of C fits in the shared memory the stages leave"
        return None

    @staticmethod
    def _slice_fits(spec, parts: int, n: int = None) -> bool:
        """Whether a block of C (n columns: the tile's) cut into `parts` column slices gives slices
        TMA stores through 128-byte swizzled rows: whole 8-column groups, rows a multiple of 128
        bytes, at most 1024."""
        n, osize = n or spec.tile.n, arch_dtype(spec.out_dtype).bytes
        cols = n // parts
        return not (n % parts or (n // 8) % parts or (cols * osize) % 128 or cols * osize > 4 * 128 * 2)

    def store_staging(self, spec):
        """(parts, layout, vector buffers) of the shared buffers a block of C goes out through
        (STAGING_BUFFERS of `layout`): the fewest slices whose buffers fit beside the stages
        (128-byte swizzled rows), with the epilogue's staged vectors double-buffered where they
        are 16-bit and that fits too (run()), or None."""
        t, osize = spec.tile, {"f32": 4, "f16": 2, "bf16": 2}[spec.out_dtype]
        for vector_buffers in ((2, 1) if self.double_buffers_vectors(spec) else (1,)):
            used = (sum(smem_layout(spec, op).stage_bytes for op in "AB") * spec.stages
                    + 2 * 8 * (spec.stages + spec.pingpong) + self.staged_vector_bytes(spec, vector_buffers) + 1024)
            room = spec.target_info.smem_per_block - used
            for parts in self.STAGING_PARTS:
                if not self._slice_fits(spec, parts):
                    continue
                layout = SmemLayout(t.m, t.n // parts, osize, "128B")
                if self.STAGING_BUFFERS * spec.consumers * layout.stage_bytes <= room:
                    return parts, layout, vector_buffers
        return None

    @staticmethod
    def double_buffers_vectors(spec) -> bool:
        """Whether the epilogue's staged vectors are 16-bit only (a bias of a 16-bit output, no
        scales): those run() double-buffers, publishing a block's a block ahead so store_stage
        reads them before its barrier (bias + GELU at K = 1024: 5-7% -> 0.5-4% over the plain
        kernel, run 165). With f32 vectors (the fp8 scales, fetched by cp.async) the same cost
        3-5% (runs 159, 165), so they stay single-buffered."""
        epi = spec.epilogue
        return bool(epi.bias) and arch_dtype(spec.out_dtype).bytes == 2 and not (epi.scale_rows or epi.scale_cols)

    @staticmethod
    def staged_vector_bytes(spec, buffers: int) -> int:
        """Shared memory of the TMA-store epilogue's staged vectors (bias, row and column
        scales: `buffers` blocks' worth each, per consumer; run() stages them)."""
        epi, t = spec.epilogue, spec.tile
        esize = arch_dtype(spec.out_dtype).bytes
        lengths = [(t.m if epi.bias == "row" else t.n, esize)] if epi.bias else []
        lengths += [(t.m, 4)] * epi.scale_rows + [(t.n, 4)] * epi.scale_cols
        return buffers * spec.consumers * sum(-(-n * size // 16) * 16 for n, size in lengths)

    def default_copy(self, spec) -> str:
        """TMA for 16-bit operands (measured 0.89-0.92x cuBLAS against cp.async's 0.66-0.80x,
        docs/perf_notes.md section 17; persistent, it is the warp-specialized kernel); tf32
        (whose MN-major operands are transposed or go through registers) copies with cp.async,
        but for both operands K-major, and with an operand through registers when asked
        (copy="tma")."""
        return "tma" if self.tma_copies(spec) and not self._register_on_tma(spec) else "cp.async"

    def default_target(self, dtype: str) -> str:
        return "sm_90a"

    def default_tile_warps(self, dtype: str, b_layout: str, swap_ab: bool = False) -> tuple:
        if swap_ab:   # decoding's few rows of A as wgmma's n (what matmul runs them with)
            return SWAPPED_TILE_WARPS
        if dtype == "tf32" and b_layout == "row":
            return TF32_ROW_B
        return DEFAULT_WGMMA_TILE.get(dtype) or DEFAULT_TILE[dtype], (8, 1)

    def default_frag_buffers(self, dtype: str) -> int:
        return 1  # wgmma reads its operands from shared memory: no operand fragments

    def swaps_operands(self, spec) -> bool:
        """tf32 with a row-major B: the kernel computes C^T = B^T A^T, so that the N-major B
        (which wgmma cannot read from shared memory as tf32) is the A operand, fed from
        registers, and A^T, K-major, is read from shared memory. 16-bit with swap_ab: the same
        product with both operands from shared memory, so that a few rows of A (decoding) are
        wgmma's n instead of 64 rows of which most are padding."""
        return spec.swap_ab or (spec.dtype == "tf32" and spec.b_layout == "row")

    def register_operand(self, spec):
        """The MN-major tf32 operand that becomes wgmma's A, loaded into registers."""
        if spec.dtype != "tf32":
            return None
        if self.swaps_operands(spec):
            return "B"
        return "A" if spec.a_layout == "col" else None

    def stage_layout(self, spec, operand: str) -> str:
        """A column-major A in a swapped tf32 kernel is copied transposed: wgmma reads A^T
        K-major from shared memory."""
        if operand == "A" and self.swaps_operands(spec) and spec.dtype == "tf32":
            return "row"
        return super().stage_layout(spec, operand)

    def tf32_truncates(self, spec) -> bool:
        """wgmma reads tf32 operands as the f32 values the copies left in shared memory and
        truncates them (unit roundoff 2^-10); operands it takes from registers are rounded
        (cvt.rna) while loaded."""
        return spec.dtype == "tf32"

    def shape(self, spec) -> W.WgmmaShape:
        """The wgmma each warpgroup issues (fp8: A's and B's types as the spec's atom names them)."""
        a, b = spec.mma.a_type.name, spec.mma.b_type.name
        return W.WgmmaShape(a, spec.warp_tile[0] if self.swaps_operands(spec) else spec.warp_tile[1],
                            b if b != a else "")

    def validate(self, spec) -> None:
        t, w = spec.tile, spec.warps
        if not spec.target_info.arch_specific or spec.target_info.sm < 90:
            raise SpecError("target", spec.target, "sm_90a", "wgmma exists only on the arch-specific Hopper target")
        if spec.dtype not in W.K_BY_DTYPE or spec.acc_dtype != "f32":
            raise SpecError("dtype", spec.dtype, ", ".join(W.K_BY_DTYPE),
                            "wgmma kernels take f16, bf16, tf32, e4m3 or e5m2 operands (and f32 as tf32 parts, "
                            "GemmSpec(dtype='f32')) and accumulate in f32")
        if spec.frag_buffers == 2 and spec.promote == 1 and spec.warp_specialized:
            if not _three_accumulators_fit(spec, self.shape(spec)):
                raise SpecError("frag_buffers", 2, "1 for this tile",
                                f"two accumulators and the f32 total take 3 x {self.shape(spec).acc_regs} registers "
                                f"a math thread, more than the math warpgroups have")
        elif spec.frag_buffers != 1:
            raise SpecError("frag_buffers", spec.frag_buffers, "1, or 2 with promote=1 on the warp-specialized kernel",
                            "wgmma reads its operands from shared memory: the one fragment it double-buffers is the "
                            "accumulator of a product promoted every k-tile")
        swapped = self.swaps_operands(spec)
        if swapped:
            if w.m != 1 or w.n % W.WARPGROUP or t.n != 16 * w.n:
                raise SpecError("warps", (w.m, w.n), f"(1, a multiple of 4) with tile.n = 16 * warps.n (tile.n is {t.n})",
                                "tf32 with a row-major B computes C^T = B^T A^T: each warpgroup of 4 warps "
                                "side by side along N computes 64 columns")
            if t.m not in W.N_RANGE:
                raise SpecError("tile", (t.m, t.n, t.k), "tile.m a multiple of 8 up to 256",
                                f"each warpgroup issues m64n{t.m} over the tile's rows (C^T = B^T A^T)")
        elif w.m % W.WARPGROUP or t.m != 16 * w.m:
            raise SpecError("warps", (w.m, w.n), f"warps.m a multiple of 4 with tile.m = 16 * warps.m (tile.m is {t.m})",
                            "each warpgroup of 4 warps stacked along M computes 64 rows")
        wn = spec.warp_tile[1]
        if not swapped and wn not in W.N_RANGE:
            raise SpecError("tile", (t.m, t.n, t.k), "tile.n / warps.n a multiple of 8 up to 256",
                            f"each warpgroup issues m64n{wn}")
        if spec.swizzle not in W.SWIZZLE_CODE:
            raise SpecError("swizzle", spec.swizzle, ", ".join(W.SWIZZLE_CODE),
                            "wgmma reads shared memory through descriptors of swizzled layouts")
        span = SWIZZLE_MODES[spec.swizzle].span
        esize = spec.operand_dtype.bytes
        if spec.is_k_major("A") or spec.is_k_major("B"):
            if W.K_BY_DTYPE[spec.dtype] * esize > span:
                raise SpecError("swizzle", spec.swizzle, "128B, 64B",
                                f"one k-step of {W.K_BY_DTYPE[spec.dtype] * esize} bytes must fit in a swizzle span")
        if not swapped and not spec.is_k_major("B") and self.register_operand(spec) != "B" and (wn * esize) % span:
            raise SpecError("tile", (t.m, t.n, t.k), f"tile.n / warps.n a multiple of {span // esize}",
                            "an N-major B splits between warpgroups on whole swizzle panels")
        if swapped and spec.stream_k:
            raise SpecError("stream_k", spec.stream_k, "False", "a kernel of C^T = B^T A^T (swap_ab, or tf32 with a "
                            "row-major B) accumulates blocks of C^T, which stream-K's pieces do not store transposed")
        if swapped and spec.cluster != (1, 1):
            raise SpecError("cluster", spec.cluster, "(1, 1)", "swap_ab's kernel multicasts no operand" if spec.swap_ab
                            else "tf32 with a row-major B reads B's stage into every math thread's registers, and a "
                                 "cluster releases a stage by one arrival per warpgroup")
        if spec.swap_ab and (spec.pingpong or (spec.split_k > 1 and not spec.batched)):
            raise SpecError("swap_ab", True, "False with pingpong or a 2-D split_k",
                            "C^T = B^T A^T is built for one warpgroup's blocks stored directly (and stacks' split-K)")
        if spec.stages < 3:
            raise SpecError("stages", spec.stages, "3..32", "wgmma kernels keep one stage for the tensor cores "
                            "still reading the previous tile")
        if spec.store == "tma":
            why = self._tma_store_problem(spec)
            if why is not None:
                raise SpecError("store", spec.store, "direct", why)
        if spec.copy == "tma":
            if not self.tma_copies(spec):
                raise SpecError("copy", spec.copy, "cp.async", f"{spec.dtype} wgmma kernels copy with cp.async here (TMA "
                                f"copies {', '.join(self.TMA_DTYPES)} in any layout, tf32 only with a row-major A and a "
                                f"column-major B, or both row-major or both column-major in the persistent kernel: TMA "
                                f"does not transpose)")
            for op in "AB":
                rows = spec.operand_tile(op)[0]
                if rows > 256:
                    raise SpecError("tile", (t.m, t.n, t.k), "operand tiles of at most 256 stored rows",
                                    f"a TMA box has at most 256 rows; operand {op}'s stage has {rows}")
        shared = multicast_operand(spec)
        if shared is not None:   # each CTA of the pair loads half of the shared operand's stage
            lay = smem_layout(spec, shared)
            panels = lay.row_bytes // lay.panel_bytes
            if panels % 2 and (lay.rows % 2 or (lay.rows // 2) % 8):
                raise SpecError("tile", (t.m, t.n, t.k), "a shared operand whose stage splits in two halves",
                                f"with cluster={spec.cluster} each CTA loads half of {shared}'s {lay.rows} x "
                                f"{lay.cols} stage: an even number of 128-byte panels, or of 8-row groups")

    def pipeline(self, spec, A, B, sA, sB, warp, wm, wn):
        if spec.warp_specialized:
            return WarpSpecializedPipeline(spec, A, B, sA, sB, warp, wm, wn)
        if spec.copy == "tma":
            return TmaPipeline(spec, A, B, sA, sB, warp, wm, wn)
        return WgmmaPipeline(spec, A, B, sA, sB, warp, wm, wn)

    def producer_warps(self, spec) -> int:
        """Persistent TMA kernels are warp-specialized: a producer warpgroup before the math warps."""
        return W.WARPGROUP if spec.copy == "tma" and spec.persistent else 0


class WgmmaPipeline:
    """The stages of A and B and the wgmmas that read them, for one warpgroup's rows.

    prologue(m0, n0) starts the copies of a block's first stages - 2 k-tiles; k_loop(m0, n0)
    runs the block's K loop and returns each warp's accumulator (its 16 rows of the
    warpgroup's 64), with every copy and wgmma finished."""

    def __init__(self, spec, A, B, sA, sB, warp, wm, wn):
        self.spec, self.A, self.B, self.sA, self.sB = spec, A, B, sA, sB
        self.wm = wm
        self.warpgroup = warp >> 2   # among the math warps
        self.S = spec.stages
        self.ahead = self.S - 2
        self.shape = spec.mainloop.shape(spec)
        steps = spec.tile.k // self.shape.k
        # wgmma's operands and origins: (stage tile, first row) of A, (stage tile, first column) of B.
        if spec.swaps_operands and spec.register_operand == "B":   # C^T = B^T A^T: the warp's 16 columns of B
            self.a_src, self.a_origin, self.b_src, self.b_origin = sB.T, wn, sA.T, wm
        elif spec.swaps_operands:   # (16-bit) C^T = B^T A^T from shared memory: the warpgroup's 64 columns of B
            self.a_src, self.a_origin, self.b_src, self.b_origin = sB.T, (warp >> 2) * WG_ROWS, sA.T, wm
        elif spec.register_operand == "A":   # the warp's 16 rows
            self.a_src, self.a_origin, self.b_src, self.b_origin = sA, wm, sB, wn
        else:  # the warpgroup's first row in the tile: warps 4g .. 4g+3 are consecutive along M
            self.a_src, self.a_origin, self.b_src, self.b_origin = sA, ((warp % spec.warps.m) >> 2) * WG_ROWS, sB, wn
        self.frags = ([tg.fragment(spec.mma, "A", (1, 1), name=f"a{kk}") for kk in range(steps)]
                      if spec.register_operand else None)

    def copy(self, m0, n0, tile_index, inside_k):
        BK, S = self.spec.tile.k, self.S
        inside = ("K",) if inside_k else ()
        stage = tg.divmod_by(tile_index, S)[1]
        tg.copy_async(self.sA[stage], self.A.block(m0, tile_index * BK), inbounds=inside,
                      comment=f"k-tile +{self.ahead} of A")
        tg.copy_async(self.sB[stage], self.B.block(tile_index * BK, n0), inbounds=inside,
                      comment=f"k-tile +{self.ahead} of B")
        tg.commit()

    def prologue(self, m0, n0):
        # k-tiles 0 .. S-3; blocks past K arrive as zeros and add nothing.
        for s in range(self.ahead):
            self.copy(m0, n0, s, inside_k=False)

    def k_loop(self, m0, n0):
        spec, shape, S, ahead = self.spec, self.shape, self.S, self.ahead
        sA, sB = self.sA, self.sB
        BK = spec.tile.k
        K = self.A.shape[1]
        acc = tg.fragment(spec.mma, "C", (1, shape.n // spec.mma.n), name="acc")

        steps = BK // shape.k
        a_src, b_src, frags = self.a_src, self.b_src, self.frags

        def step(kt, inside_k):
            stage = tg.divmod_by(kt, S)[1]
            tg.wait(ahead - 1)        # k-tile kt has landed for this thread
            tg.fence_proxy_async()    # ... and is visible to the tensor cores' reads
            tg.barrier()              # ... for every thread; k-tile kt - 2's wgmmas are retired everywhere
            if frags is None:
                tg.wgmma_fence()
                for kk in range(steps):
                    tg.wgmma(acc, a_src[stage], b_src[stage], self.a_origin, kk * shape.k, self.b_origin)
                tg.wgmma_commit()
            else:
                tg.wgmma_wait(0)      # k-tile kt - 1 retired: its registers are free
                for kk in range(steps):
                    tg.load(frags[kk], a_src[stage], self.a_origin, kk * shape.k, comment=f"k-step {kk} of A")
                tg.wgmma_fence()
                for kk in range(steps):
                    tg.wgmma(acc, frags[kk], b_src[stage], None, kk * shape.k, self.b_origin)
                tg.wgmma_commit()
            self.copy(m0, n0, kt + ahead, inside_k)
            if frags is None:
                tg.wgmma_wait(1)      # k-tile kt - 1 retired for this warpgroup

        k_tiles = tg.cdiv(K, BK)
        full_tiles = K // BK
        steady = full_tiles - tg.minimum(full_tiles, ahead)
        for kt in tg.range(0, steady):
            step(kt, inside_k=True)
        for kt in tg.range(steady, k_tiles):
            step(kt, inside_k=False)
        tg.wgmma_wait(0)
        tg.wait(0)
        return acc


class TmaPipeline(WgmmaPipeline):
    """The stages filled by TMA (one thread) and released through mbarriers (module docstring)."""

    def __init__(self, spec, A, B, sA, sB, warp, wm, wn):
        super().__init__(spec, A, B, sA, sB, warp, wm, wn)
        self.full = tg.mbarrier("full", stages=self.S)                               # the k-tile landed
        self.empty = tg.mbarrier("empty", stages=self.S, arrivals=self.releases())
        self.k_tiles = tg.cdiv(A.shape[1], spec.tile.k)

    def releases(self) -> int:
        """Arrivals that free a stage: every math thread's."""
        return self.spec.math_threads

    def request(self, operands, t, stage):
        """k-tile t into `stage`: announce its bytes, start its copies (one thread).
        `operands`: operand_blocks' pair for the block."""
        BK, sA, sB, full = self.spec.tile.k, self.sA, self.sB, self.full
        a_block, b_block = operands
        tg.arrive(full[stage], expect_bytes=sA.stage_bytes + sB.stage_bytes, single=True)
        tg.tma_load(sA[stage], a_block(t * BK), full[stage])
        tg.tma_load(sB[stage], b_block(t * BK), full[stage])

    # The blocks of the operands and of C for the block of C at (m0, n0); a stack of products
    # (template.TmaStack) replaces these with its own, m0 then naming a row of the stack.
    def operand_blocks(self, m0, n0):
        """(A's block, B's block) of the block of C at (m0, n0), each a function of a k-tile's
        first column. Whatever locates the block is emitted here, once per block: a stack
        divides by its M to find the block's matrix, which on every k-tile would cost a
        runtime division (a float reciprocal in ptxas's code)."""
        return (lambda k0: self.A.block(m0, k0)), (lambda k0: self.B.block(k0, n0))

    @staticmethod
    def place(tensor, m0):
        """(the matrix of `tensor` the block is in, the block's first row in it)."""
        return tensor, m0

    def prologue(self, m0, n0):
        operands = self.operand_blocks(m0, n0)
        for t in range(self.S - 1):   # k-tiles 0 .. S-2 (those that exist)
            with tg.if_(tg.lt(t, self.k_tiles)):
                self.request(operands, t, t)

    def k_loop(self, m0, n0):
        spec, shape, S = self.spec, self.shape, self.S
        sA, sB, full, empty, k_tiles = self.sA, self.sB, self.full, self.empty, self.k_tiles
        acc = tg.fragment(spec.mma, "C", (1, shape.n // spec.mma.n), name="acc")
        steps = spec.tile.k // shape.k
        operands = self.operand_blocks(m0, n0)
        for kt in tg.range(k_tiles):
            lap, stage = tg.divmod_by(kt, S)
            tg.mbarrier_wait(full[stage], lap & 1)
            tg.wgmma_fence()
            for kk in range(steps):
                tg.wgmma(acc, self.a_src[stage], self.b_src[stage], self.a_origin, kk * shape.k, self.b_origin)
            tg.wgmma_commit()
            tg.wgmma_wait(1)                     # k-tile kt - 1 retired for this warpgroup
            with tg.if_(tg.ge(kt, 1)):
                prev_lap, prev = tg.divmod_by(kt - 1, S)
                tg.arrive(empty[prev])           # this thread is done with kt - 1's stage
                with tg.if_(tg.lt(kt + S - 1, k_tiles)):
                    tg.mbarrier_wait(empty[prev], prev_lap & 1)
                    self.request(operands, kt + S - 1, prev)
            with tg.if_(tg.lt(kt, 1)):           # the first k-tile: stage S - 1 has not been used yet
                with tg.if_(tg.lt(S - 1, k_tiles)):
                    self.request(operands, S - 1, S - 1)
        tg.wgmma_wait(0)
        return acc


def multicast_operand(spec):
    """The operand the two CTAs of a cluster share (and multicast): B for a pair along M,
    A for a pair along N, None without a cluster."""
    return {(2, 1): "B", (1, 2): "A"}.get(spec.cluster)


class WarpSpecializedPipeline(TmaPipeline):
    """Persistent and warp-specialized (module docstring): warpgroup 0 is the producer, whose
    first warp requests every k-tile of every block this CTA walks; the math warpgroups wait
    for each stage, multiply it and release it. Stage and phase counters run on across blocks,
    so the producer fills the stages with the next block's k-tiles while the math warps store
    this block's accumulator."""

    PRODUCER_REGISTERS = 40

    def __init__(self, spec, A, B, sA, sB, warp, wm, wn):
        super().__init__(spec, A, B, sA, sB, warp, wm, wn)
        self.shared = multicast_operand(spec)
        if self.shared is not None:
            self.rank = tg.cluster_rank()
            self.peer = self.rank ^ 1

    def releases(self) -> int:
        """In a cluster a stage is refilled once the math warpgroups of both CTAs are done with
        it: one thread of each arrives on its own CTA's `empty` and on the peer's."""
        if multicast_operand(self.spec) is None:
            return super().releases()
        return 2 * (self.spec.math_threads // (32 * W.WARPGROUP))

    def request(self, operands, t, stage):
        """k-tile t into `stage`; in a cluster, the shared operand's half of this CTA, multicast
        into the stage of both."""
        if self.shared is None:
            return super().request(operands, t, stage)
        BK, sA, sB, full = self.spec.tile.k, self.sA, self.sB, self.full
        a_block, b_block = operands
        tg.arrive(full[stage], expect_bytes=sA.stage_bytes + sB.stage_bytes, single=True)
        both = dict(multicast=0b11, part=self.rank, parts=2)
        tg.tma_load(sA[stage], a_block(t * BK), full[stage], **(both if self.shared == "A" else {}))
        tg.tma_load(sB[stage], b_block(t * BK), full[stage], **(both if self.shared == "B" else {}))

    def release(self, stage):
        """This thread is done with `stage` (in a cluster: one thread per warpgroup tells both CTAs)."""
        if self.shared is None:
            tg.arrive(self.empty[stage])
            return
        tg.arrive(self.empty[stage], one_per="warpgroup")
        tg.arrive(self.empty[stage], cta=self.peer, one_per="warpgroup")

    def run(self, blocks, origin, store, C, alpha, beta, bias=None, R=None, scales=(None, None), pieces=()):
        """Walk `blocks` blocks of C (block i at origin(i) -> (m0, n0)), storing each
        accumulator with store(acc, m0, n0), or with store="tma" and beta == 0 through shared
        memory and TMA stores (store_through_shared). Then stream-K's `pieces` (template.StreamK):
        (origin() -> (m0, n0), block, first k-tile, k-tiles, k-tiles before it, store(acc, block)),
        each skipped when it has no k-tiles."""
        spec, S, k_tiles = self.spec, self.S, self.k_tiles
        staged = spec.store == "tma"
        if staged:
            parts, layout, vector_buffers = spec.mainloop.store_staging(spec)
            sC = tg.shared("sC", spec.out_dtype, layout.rows, layout.cols, stages=spec.mainloop.STAGING_BUFFERS)
        first_math = W.WARPGROUP
        producer_regs, math_regs = _register_split(spec)
        after_blocks = blocks * k_tiles if pieces else None   # k-tiles this CTA requested before its pieces
        with tg.role("producer", warps=(0, first_math), registers=producer_regs):
            with tg.if_(tg.lt(tg.warp_id(), 1)):     # one warp requests; the other three are done
                for i in tg.range(blocks):
                    m0, n0 = origin(i)
                    self.produce(m0, n0, i * k_tiles, 0, k_tiles)
                for piece_origin, _, kt0, count, before, _ in pieces:
                    with tg.if_(tg.lt(0, count)):
                        self.produce(*piece_origin(), after_blocks + before, kt0, count)
        # Ping-pong: consumer g takes blocks g, g + 2, ... and starts waiting on a block's stages
        # only once the other consumer has waited on all of the block before (its `turn`), so no
        # wait runs more than one phase ahead of a stage (a parity names only the last two).
        turn = tg.mbarrier("turn", stages=2) if spec.pingpong else None
        # each consumer stores through buffers of its own (declared before the small staged
        # vectors, so that no stage's 1024-byte alignment leaves a gap after one)
        staging = [sC] + [tg.shared(f"sC{g}", spec.out_dtype, layout.rows, layout.cols,
                                    stages=spec.mainloop.STAGING_BUFFERS) for g in range(1, spec.consumers)] \
            if staged else [None] * spec.consumers
        for g in range(spec.consumers):
            name, step = ("math", 1) if spec.consumers == 1 else (f"math{g}", spec.consumers)
            warps = (first_math + g * spec.warps.count, first_math + (g + 1) * spec.warps.count)
            buffers = staging[g]
            with tg.role(name, warps=warps, registers=math_regs):
                vectors = self.staged_vectors(C, bias, scales, vector_buffers) if staged else ()
                double = bool(vectors) and vector_buffers == 2
                mine = tg.cdiv(blocks - g, step) if step > 1 else blocks    # this consumer's blocks

                def fetch(j, at=None):   # the vectors of this consumer's block j (at: its origin)
                    m0, n0 = at or origin(g + j * step if step > 1 else j)
                    for sv, along_rows in vectors:
                        tg.fetch_vector(sv, m0 if along_rows else n0, buffer=j & 1 if double else 0)

                # Double-buffered vectors: block j + 1's are fetched when block j starts (the main
                # loop hides the loads) and parked after its main loop, so the epilogue's barriers
                # publish them before block j + 1's epilogue, which can read them (and apply them)
                # before its first barrier (store_stage's sync). The first block's: before the walk.
                # Single-buffered (f32 vectors, or where two do not fit): block j's fetched when it
                # starts, parked after its main loop and published by the epilogue's first barrier.
                if double:
                    with tg.if_(tg.lt(0, mine)):
                        fetch(0)
                        for sv, _ in vectors:
                            tg.park_vector(sv, buffer=0)
                    tg.barrier()
                for j in tg.range(mine):
                    i = g + j * step if step > 1 else j
                    m0, n0 = origin(i)
                    if double:
                        with tg.if_(tg.lt(j + 1, mine)):
                            fetch(j + 1)
                    elif vectors:
                        fetch(j, (m0, n0))
                    if turn is not None:   # block i - 1 (the other consumer's) fully waited on
                        with tg.if_(tg.lt(0, i)):
                            tg.mbarrier_wait(turn[g], ((i - 1) // 2) & 1)
                    acc = self.consume(i * k_tiles, k_tiles)
                    if turn is not None:
                        tg.arrive(turn[1 - g], one_per="warpgroup")
                    if not staged:
                        store(acc, m0, n0)
                        continue
                    if double:   # (block j - 1's epilogue, which read that buffer, ended with a barrier)
                        with tg.if_(tg.lt(j + 1, mine)):
                            for sv, _ in vectors:
                                tg.park_vector(sv, buffer=(j + 1) & 1)
                    else:        # (the previous block's epilogue read them before its last barrier)
                        for sv, _ in vectors:
                            tg.park_vector(sv)
                    with tg.if_(tg.is_zero(beta)):   # C is not read: out through shared memory
                        sbias, sscales = self.staged_epilogue(vectors, bias, scales)
                        (c, m), r = self.place(C, m0), self.place(R, m0)[0] if R is not None else None
                        self.store_through_shared(acc, c, buffers, parts, m, n0, alpha, sbias, r, sscales,
                                                  vector_buffer=j & 1 if double else 0, published=not vectors or double)
                    with tg.else_():
                        store(acc, m0, n0)
                for _, block, _, count, before, store_piece in pieces:
                    with tg.if_(tg.lt(0, count)):
                        store_piece(self.consume(after_blocks + before, count), block)
                if staged:
                    tg.tma_store_wait(0)                 # the last stores have read sC

    def staged_vectors(self, C, bias, scales, buffers: int) -> tuple:
        """(staged vector, along rows) for each vector the TMA-store epilogue reads (the bias,
        the row and column scales), in the current role, `buffers` blocks' worth (with two,
        run() fetches the next block's while this one's main loop runs)."""
        out = []
        rows_name = C.ir.shape_names[0]
        for vec in (bias, *scales):
            if vec is not None:
                along_rows = vec.size == rows_name
                out.append((tg.staged_vector(vec, self.spec.tile.m if along_rows else self.spec.tile.n,
                                             buffers=buffers), along_rows))
        return tuple(out)

    @staticmethod
    def staged_epilogue(vectors, bias, scales):
        """bias and scales with each replaced by its staged vector (staged_vectors' order)."""
        staged = iter(sv for sv, _ in vectors)
        pick = lambda vec: None if vec is None else next(staged)   # noqa: E731
        return pick(bias), (pick(scales[0]), pick(scales[1]))

    def produce(self, m0, n0, first, kt0, count):
        """Request k-tiles kt0 .. kt0 + count - 1 of the block at (m0, n0); `first` k-tiles
        were requested before, so k-tile kt0 + j goes into stage (first + j) % S once the
        math warps released that stage's previous k-tile."""
        S = self.S
        operands = self.operand_blocks(m0, n0)
        for j in tg.range(count):
            t = first + j
            lap, stage = tg.divmod_by(t, S)
            with tg.if_(tg.ge(t, S)):
                tg.mbarrier_wait(self.empty[stage], (lap + 1) & 1)
            self.request(operands, kt0 + j, stage)

    def store_through_shared(self, acc, C, sC, parts, m0, n0, alpha, bias=None, R=None, scales=(None, None),
                             vector_buffer=0, published=True):
        """The block of C in `parts` column slices, alternating between the two buffers of sC:
        each slice written by every math thread (through the spec's fused epilogue, its staged
        vectors in `vector_buffer`), then stored by one thread with TMA while the next slice
        fills the other buffer, and the next block's main loop runs. `published`: the staged
        vectors were published by an earlier barrier (double-buffered; else each slice's own
        barrier comes before store_stage, as it publishes them for the first)."""
        cols = self.spec.tile.n // parts
        for p in range(parts):
            buf = p % 2
            # the storing thread: the store two slices back read buf. With an odd number of
            # slices the previous block's last slice also went out of buffer 0: wait for every
            # store there (long done: a main loop ran since) ...
            tg.tma_store_wait(0 if p == 0 and parts % 2 else 1)
            # ... as every math thread knows after the barrier: store_stage's own (sync), after
            # it read the staged vectors so that their loads overlap the wait, where they were
            # published before
            if not published:
                tg.barrier()
            tg.store_stage(sC[buf], acc, self.wm, part=p, parts=parts, alpha=alpha, out=C.block(m0, n0 + p * cols),
                           bias=bias, activation=self.spec.epilogue.activation, residual=R,
                           row_scale=scales[0], col_scale=scales[1], vector_buffer=vector_buffer, sync=published)
            tg.fence_proxy_async()                   # visible to TMA's reads (the async proxy)
            tg.barrier()                             # ... from every math thread
            tg.tma_store(C.block(m0, n0 + p * cols), sC[buf])
            tg.tma_store_commit()

    def consume(self, first, k_tiles):
        """The accumulator of the `k_tiles` (at least one) k-tiles that follow the first `first`
        this CTA's producer requested: wait for, multiply and release each."""
        if self.spec.promote:
            return self.consume_promoted(first, k_tiles)
        if self.frags is not None:
            return self.consume_registers(first, k_tiles)
        spec, shape, S, full = self.spec, self.shape, self.S, self.full
        acc = tg.fragment(spec.mma, "C", (1, shape.n // spec.mma.n), name="acc")
        for kt in tg.range(k_tiles):
            t = first + kt
            lap, stage = tg.divmod_by(t, S)
            tg.mbarrier_wait(full[stage], lap & 1)
            tg.wgmma_fence()
            for kk in range(spec.tile.k // shape.k):
                tg.wgmma(acc, self.a_src[stage], self.b_src[stage], self.a_origin, kk * shape.k, self.b_origin)
            tg.wgmma_commit()
            tg.wgmma_wait(1)                          # k-tile t - 1 retired: release its stage
            with tg.if_(tg.ge(kt, 1)):
                self.release(tg.divmod_by(t - 1, S)[1])
        tg.wgmma_wait(0)
        self.release(tg.divmod_by(first + k_tiles - 1, S)[1])       # the block's last k-tile
        return acc

    def consume_registers(self, first, k_tiles):
        """consume() with wgmma's A operand from registers (tf32 with a row-major B: C^T = B^T
        A^T, the warp's columns of B loaded from the stage and rounded to tf32). A k-tile's
        fragments are loaded only once every earlier wgmma of this warpgroup retired: ptxas
        serialises every wgmma of a kernel in which a register operand is written while a wgmma
        is in flight (its C7513), and the register loads are short next to a k-tile's wgmmas,
        while the other consumer warpgroup's keep the tensor cores busy (docs/perf_notes.md
        section 47). The stage's barrier is waited on first, under the previous k-tile's wgmmas."""
        spec, shape, S, full = self.spec, self.shape, self.S, self.full
        acc = tg.fragment(spec.mma, "C", (1, shape.n // spec.mma.n), name="acc")
        frags = self.frags
        for kt in tg.range(k_tiles):
            t = first + kt
            lap, stage = tg.divmod_by(t, S)
            tg.mbarrier_wait(full[stage], lap & 1)
            tg.wgmma_wait(0)                          # k-tile t - 1 retired: its stage, the registers
            with tg.if_(tg.ge(kt, 1)):
                self.release(tg.divmod_by(t - 1, S)[1])
            for kk in range(len(frags)):
                tg.load(frags[kk], self.a_src[stage], self.a_origin, kk * shape.k, comment=f"k-step {kk} of A")
            tg.wgmma_fence()
            for kk in range(len(frags)):
                tg.wgmma(acc, frags[kk], self.b_src[stage], None, kk * shape.k, self.b_origin)
            tg.wgmma_commit()
        tg.wgmma_wait(0)
        self.release(tg.divmod_by(first + k_tiles - 1, S)[1])       # the block's last k-tile
        return acc

    def consume_promoted(self, first, k_tiles):
        """consume() for fp8 with promotion (as DeepGEMM does): the tensor cores accumulate fp8
        products in fewer bits than f32, so every `spec.promote` k-tiles the accumulator's sum
        goes into the f32 `total` and the next k-tile's wgmmas start it from zero. Every k-tile
        with two accumulators (frag_buffers=2): consume_promoted_turns. Otherwise only after
        wgmma_wait(0) (ptxas serialises every wgmma of a kernel where it sees an accumulator read
        with its wgmma in flight: measured 0.2x, docs/perf_notes.md section 25); inside a group
        of k-tiles one stays in flight as in consume().

        The math warpgroups' groups are staggered: warpgroup g's first group is (g * promote) //
        warpgroups k-tiles long, so while one warpgroup drains its wgmmas and adds, the others
        still have wgmmas in flight and the tensor cores stay busy. No group is longer than
        `promote` k-tiles, so the error bound is the same. Promoting every k-tile, the
        staggering falls inside the k-tiles (consume_promoted_staggered)."""
        spec, shape, every = self.spec, self.shape, self.spec.promote
        steps = spec.tile.k // shape.k
        if every == 1 and spec.frag_buffers == 2:
            return self.consume_promoted_turns(first, k_tiles)
        if every == 1 and 2 <= spec.warps.count // W.WARPGROUP <= steps:
            return self.consume_promoted_staggered(first, k_tiles)
        tiles = (1, shape.n // spec.mma.n)
        total = tg.fragment(spec.mma, "C", tiles, name="total")
        acc = tg.fragment(spec.mma, "C", tiles, name="acc")

        def k_tile(t, restart):
            lap, stage = tg.divmod_by(t, self.S)
            tg.mbarrier_wait(self.full[stage], lap & 1)
            tg.wgmma_fence()
            for kk in range(spec.tile.k // shape.k):
                tg.wgmma(acc, self.a_src[stage], self.b_src[stage], self.a_origin, kk * shape.k, self.b_origin,
                         accumulate=kk > 0 or not restart)
            tg.wgmma_commit()

        def group(t0, length, most):
            """k-tiles t0 .. t0 + length - 1 (those below k_tiles; length <= most) into acc,
            then acc into total."""
            k_tile(first + t0, True)
            for u in range(1, most):
                inside = tg.lt(t0 + u, k_tiles)
                with tg.if_(inside if isinstance(length, int) else inside & tg.lt(u, length)):
                    k_tile(first + t0 + u, False)
                    tg.wgmma_wait(1)                 # k-tile t0 + u - 1 retired: release its stage
                    self.release(tg.divmod_by(first + t0 + u - 1, self.S)[1])
            tg.wgmma_wait(0)
            self.release(tg.divmod_by(first + tg.minimum(t0 + length, k_tiles) - 1, self.S)[1])
            tg.add(total, acc, out=total)

        groups = spec.warps.count // W.WARPGROUP
        lead = 0
        if groups > 1 and every > 1:   # this warpgroup's first group, within the block's k-tiles
            lead = tg.minimum((self.warpgroup * every) // groups, k_tiles)
            with tg.if_(tg.lt(0, lead)):
                group(0, lead, (groups - 1) * every // groups)
        for j in tg.range(tg.cdiv(k_tiles - lead, every)):
            group(lead + j * every, every, every)
        return total

    def consume_promoted_turns(self, first, k_tiles):
        """consume_promoted() promoting every k-tile (GemmSpec(promote=1, frag_buffers=2)) with two
        accumulators that take turns: k-tile t's wgmmas run into acc[t % 2] while k-tile t - 1's,
        retired by wgmma_wait(1), are added into the total, so no warpgroup ever drains its
        wgmmas inside the block (the halves' stagger only hid part of that drain: docs/perf_notes.md section 52). The k loop is
        unrolled by two so that each accumulator is a fixed set of registers, and no wgmma sits
        under a branch inside the loop: ptxas then sees every read of an accumulator outside
        its wgmmas' pipeline stage and keeps them asynchronous (a version with its k-tiles
        under branches was serialised, section 25; tests/test_wgmma.py assembles this one).
        Same sums in the same order as consume_promoted_staggered's warpgroup 0: cuBLASLt's."""
        spec, shape, S, full = self.spec, self.shape, self.S, self.full
        tiles = (1, shape.n // spec.mma.n)
        total = tg.fragment(spec.mma, "C", tiles, name="total")
        acc = [tg.fragment(spec.mma, "C", tiles, name=f"acc{b}") for b in (0, 1)]

        def k_tile(t, a):
            """k-tile t's wgmmas into `a`, from zero."""
            lap, stage = tg.divmod_by(t, S)
            tg.mbarrier_wait(full[stage], lap & 1)
            tg.wgmma_fence()
            for kk in range(spec.tile.k // shape.k):
                tg.wgmma(a, self.a_src[stage], self.b_src[stage], self.a_origin, kk * shape.k, self.b_origin,
                         accumulate=kk > 0)
            tg.wgmma_commit()

        def retire(t, a, in_flight):
            """Once only `in_flight` k-tiles' wgmmas are left, k-tile t's are done: its stage
            released, its accumulator `a` added into the total."""
            tg.wgmma_wait(in_flight)
            self.release(tg.divmod_by(t, S)[1])
            tg.add(total, a, out=total)

        k_tile(first, acc[0])
        for j in tg.range((k_tiles - 1) // 2):      # k-tiles 1 + 2j (into acc[1]) and 2 + 2j (acc[0])
            t = first + 1 + 2 * j
            k_tile(t, acc[1])
            retire(t - 1, acc[0], 1)
            k_tile(t + 1, acc[0])
            retire(t, acc[1], 1)
        last = first + k_tiles - 1
        with tg.if_(tg.lt(0, (k_tiles - 1) % 2)):  # an even count: the last k-tile goes into acc[1]
            k_tile(last, acc[1])
            retire(last - 1, acc[0], 1)
            retire(last, acc[1], 0)
        with tg.else_():
            retire(last, acc[0], 0)
        return total

    def consume_promoted_staggered(self, first, k_tiles):
        """consume_promoted() promoting every k-tile, with several math warpgroups: warpgroup 0's
        groups are its k-tiles; warpgroup w's run from step (w * steps) // warpgroups of one k-tile
        to the same step of the next (its first and last partial k-tiles groups of their own), so
        that while one warpgroup drains its wgmmas (wgmma_wait(0)) and adds, the others' keep the
        tensor cores busy; with whole k-tiles all would drain at once (docs/perf_notes.md section
        51). Two warpgroups: halves. No group holds more than a k-tile's products: the error bound
        is promotion every k-tile's."""
        spec, shape, S, full = self.spec, self.shape, self.S, self.full
        tiles = (1, shape.n // spec.mma.n)
        total = tg.fragment(spec.mma, "C", tiles, name="total")
        acc = tg.fragment(spec.mma, "C", tiles, name="acc")   # (zeros: a staggered first group adds to them)
        steps = spec.tile.k // shape.k
        groups = spec.warps.count // W.WARPGROUP

        def issue(stage, kks, restart=None):
            tg.wgmma_fence()
            for kk in kks:
                tg.wgmma(acc, self.a_src[stage], self.b_src[stage], self.a_origin, kk * shape.k, self.b_origin,
                         accumulate=kk != restart)
            tg.wgmma_commit()

        def staggered(offset):
            for kt in tg.range(k_tiles):
                lap, stage = tg.divmod_by(first + kt, S)
                tg.mbarrier_wait(full[stage], lap & 1)
                issue(stage, range(offset))                   # ends the group begun inside k-tile kt - 1
                tg.wgmma_wait(0)
                with tg.if_(tg.ge(kt, 1)):
                    self.release(tg.divmod_by(first + kt - 1, S)[1])
                tg.add(total, acc, out=total)
                issue(stage, range(offset, steps), restart=offset)   # begins the next
            tg.wgmma_wait(0)
            self.release(tg.divmod_by(first + k_tiles - 1, S)[1])
            tg.add(total, acc, out=total)

        def warpgroups_from(w):
            if w == groups - 1:
                staggered(w * steps // groups)
                return
            with tg.if_(tg.lt(self.warpgroup, w + 1)):
                staggered(w * steps // groups)
            with tg.else_():
                warpgroups_from(w + 1)

        with tg.if_(tg.lt(self.warpgroup, 1)):
            for kt in tg.range(k_tiles):
                lap, stage = tg.divmod_by(first + kt, S)
                tg.mbarrier_wait(full[stage], lap & 1)
                issue(stage, range(steps), restart=0)
                tg.wgmma_wait(0)
                self.release(stage)
                tg.add(total, acc, out=total)
        with tg.else_():
            warpgroups_from(1)
        return total


def _three_accumulators_fit(spec, shape) -> bool:
    """Whether a math thread holds the total and two accumulators (consume_promoted_turns) with
    room for the rest, in the registers setmaxnreg gives it: 64x128 slices do (3 x 64), 64x192
    ones (3 x 96) do not. (The driver's JIT gives only the launch's share, 168: it spills the
    64x128 kernel too, which ptxas then assembles; docs/perf_notes.md section 52.)"""
    math = _register_split(spec)[1] or default_registers(spec.threads, spec.target_info)
    return 3 * shape.acc_regs + 40 <= math


def _register_split(spec) -> tuple:
    """(producer, math) registers per thread under setmaxnreg: the producer keeps few, the math
    warps take what is left of the SM's 64K (at most 240), or None where the launch's share
    is already enough."""
    tgt = spec.target_info
    at_launch = default_registers(spec.threads, tgt)
    producer = WarpSpecializedPipeline.PRODUCER_REGISTERS
    math = min(240, (tgt.regs_per_sm - producer * W.WARPGROUP * 32) // (spec.math_threads * spec.consumers) // 8 * 8)
    if math <= at_launch:
        return None, None
    return producer, math


__all__ = ["WgmmaLoop", "WgmmaPipeline", "TmaPipeline", "WarpSpecializedPipeline", "multicast_operand"]
