"""The GEMM main loop on mma.sync (sm_80+): cp.async fills `stages` shared-memory buffers
while the tensor cores work on an earlier one; each warp loads its fragments with ldmatrix
(or 32-bit loads) and multiplies its warp tile of mma atoms.

    prologue:  copy k-tiles 0 .. S-2 (one commit group each); with two fragment sets, wait
               for k-tile 0 and load its first fragments
    k-tile kt: refill the stage read during k-tile kt-1 with k-tile kt+S-1; for each k-step
               load the next fragments, then mma the current ones; before the last k-step's
               mma, wait for k-tile kt+1 and load its first fragments

f32 operands (3xTF32) keep a low part beside each fragment: A@B ~ Ahi@Bhi + Ahi@Blo + Alo@Bhi.
"""
from __future__ import annotations

from ... import dsl as tg
from ...arch.dtypes import FP8
from .base import MainLoop

# Defaults per operand dtype: tiles give 64 x 64 warp tiles with 2 x 2 warps and k-tiles whose
# rows are 128 bytes wide (one 128B swizzle span) for K-major operands. fp8 takes 64 x 32 warp
# tiles (2 x 4 warps) and 64-deep k-tiles in 4 stages: 64 x 64 with 128-deep k-tiles needs more
# than 255 registers (ptxas spilled 144 bytes per thread) and ran 283 / 322 TFLOP/s at 2048^3 /
# 4096^3 on the H200 against 323 / 369 for these (run 149).
DEFAULT_TILE = {"tf32": (128, 128, 32), "f16": (128, 128, 64), "bf16": (128, 128, 64), "f32": (128, 64, 32),
                "e4m3": (128, 128, 64), "e5m2": (128, 128, 64)}
DEFAULT_WARPS = (2, 2)
FP8_WARPS = (2, 4)
FP8_STAGES = 4


class MmaSyncLoop(MainLoop):
    instruction = "mma.sync"
    kernel_tag = ""
    default_stages = 3

    def default_target(self, dtype: str) -> str:
        return "sm_89" if dtype in FP8 else "sm_80"

    def default_tile_warps(self, dtype: str, b_layout: str, swap_ab: bool = False) -> tuple:
        return DEFAULT_TILE[dtype], FP8_WARPS if dtype in FP8 else DEFAULT_WARPS

    def default_stage_count(self, dtype: str) -> int:
        return FP8_STAGES if dtype in FP8 else self.default_stages

    def default_frag_buffers(self, dtype: str) -> int:
        # 3xTF32's split fragments leave no registers for two sets
        return 1 if dtype == "f32" else 2

    def pipeline(self, spec, A, B, sA, sB, warp, wm, wn):
        return MmaSyncPipeline(spec, A, B, sA, sB, wm, wn)


class MmaSyncPipeline:
    """The stages, fragments and mmas of one warp's tile."""

    def __init__(self, spec, A, B, sA, sB, wm, wn):
        self.spec, self.A, self.B, self.sA, self.sB, self.wm, self.wn = spec, A, B, sA, sB, wm, wn
        atom = self.atom = spec.mma
        WM, WN = spec.warp_tile
        self.S = spec.stages
        self.acc = tg.fragment(atom, "C", (WM // atom.m, WN // atom.n), name="acc")
        # With two sets of operand fragments the loads for k-step kk+1 are issued before the
        # mma of k-step kk, so shared-memory latency hides behind tensor-core work.
        self.split = spec.split_tf32
        self.frags = [(tg.fragment(atom, "A", (WM // atom.m, 1), name=f"a{i}"),
                       tg.fragment(atom, "B", (1, WN // atom.n), name=f"b{i}")) for i in range(spec.frag_buffers)]
        self.lows = [(tg.fragment(atom, "A", (WM // atom.m, 1), name=f"a{i}_lo"),
                      tg.fragment(atom, "B", (1, WN // atom.n), name=f"b{i}_lo"))
                     for i in range(spec.frag_buffers)] if self.split else []
        self.steps = spec.tile.k // atom.k
        # The tensor cores add into their accumulator with truncation, a bias that grows with K:
        # f32-accuracy GEMMs sum each k-step's products into fresh partial fragments and add
        # those to the total with correctly rounded f32 adds: the two small products in `part`,
        # the large one in `big`, so that the small ones can be left out where the large one
        # is inf or NaN (an infinite hi part multiplies the other operand's lo part, often 0).
        self.part = tg.fragment(atom, "C", (WM // atom.m, WN // atom.n), name="part") if self.split else None
        self.big = tg.fragment(atom, "C", (WM // atom.m, WN // atom.n), name="big") if self.split else None

    def load(self, buf, stage, kk):
        a, b = self.frags[buf]
        k = kk * self.atom.k
        tg.load(a, self.sA[stage], self.wm, k, comment=f"k-step {kk}: fragment a{buf}", round=not self.split)
        tg.load(b, self.sB[stage], k, self.wn, comment=f"k-step {kk}: fragment b{buf}", round=not self.split)
        if self.split:
            tg.split_tf32(a, self.lows[buf][0])
            tg.split_tf32(b, self.lows[buf][1])

    def mma(self, buf):
        a, b = self.frags[buf]
        if not self.split:
            tg.mma(self.acc, a, b)
            return
        a_lo, b_lo = self.lows[buf]
        tg.mma(self.part, a, b_lo, accumulate=False)
        tg.mma(self.part, a_lo, b)
        tg.mma(self.big, a, b, accumulate=False)
        tg.add_if_finite(self.big, self.part, out=self.big)
        tg.add(self.acc, self.big, out=self.acc)

    def wait_for_tile(self):
        # Group kt has landed once at most S-2 newer ones are pending; the barrier makes
        # every thread's copies visible and ends all reads of the stage refilled next.
        tg.wait(self.S - 2)
        tg.barrier()

    def copy(self, m0, n0, tile_index, inside, comment):
        BK, S = self.spec.tile.k, self.S
        tg.copy_async(self.sA[tile_index % S], self.A.block(m0, tile_index * BK), inbounds=inside,
                      comment=comment.format("A"))
        tg.copy_async(self.sB[tile_index % S], self.B.block(tile_index * BK, n0), inbounds=inside,
                      comment=comment.format("B"))
        tg.commit()

    def prologue(self, m0, n0):
        self.k_tiles = tg.cdiv(self.A.shape[1], self.spec.tile.k)
        # Fill stages 0 .. S-2. Blocks past K arrive as zeros and add nothing.
        for s in range(self.S - 1):
            self.copy(m0, n0, s, (), f"prologue: stage {s} of {{}}")
        if self.spec.frag_buffers == 2:
            self.wait_for_tile()
            self.load(0, 0, 0)

    def step(self, m0, n0, kt, prefetch_inside_k):
        if self.spec.frag_buffers == 1:
            return self.step_single(m0, n0, kt, prefetch_inside_k)
        S, steps = self.S, self.steps
        stage = kt % S
        for kk in range(steps):
            buf = kk % 2
            if kk == 0:
                # Refill the stage read during the previous tile (the barrier that ended
                # that tile ended its reads), S-1 tiles ahead.
                self.copy(m0, n0, kt + (S - 1), ("K",) if prefetch_inside_k else (), "prefetch {}, S-1 tiles ahead")
            if kk + 1 < steps:
                self.load(1 - buf, stage, kk + 1)
                self.mma(buf)
            else:  # last k-step: the next tile's first fragments come from the next stage
                if buf == 0:  # an odd number of k-steps: buffer 0 is still in use
                    self.mma(buf)
                self.wait_for_tile()
                self.load(0, (kt + 1) % S, 0)
                if buf == 1:
                    self.mma(buf)

    def step_single(self, m0, n0, kt, prefetch_inside_k):
        # One set of fragments: fewer registers, no overlap of loads with the mma.
        stage = kt % self.S
        self.wait_for_tile()
        for kk in range(self.steps):
            self.load(0, stage, kk)
            self.mma(0)
        self.copy(m0, n0, kt + (self.S - 1), ("K",) if prefetch_inside_k else (), "prefetch {}, S-1 tiles ahead")

    def k_loop(self, m0, n0):
        K = self.A.shape[1]
        BK, S = self.spec.tile.k, self.S
        # While the tile being prefetched is a whole one, its copies skip the test against K;
        # the tail iterations prefetch the partial tile (if any) and the zeros past the end.
        k_tiles = self.k_tiles
        full_tiles = K // BK
        steady = full_tiles - tg.minimum(full_tiles, S - 1)
        for kt in tg.range(0, steady):
            self.step(m0, n0, kt, prefetch_inside_k=True)
        for kt in tg.range(steady, k_tiles):
            self.step(m0, n0, kt, prefetch_inside_k=False)
        tg.wait(0)
        return self.acc


__all__ = ["MmaSyncLoop", "MmaSyncPipeline", "DEFAULT_TILE"]
