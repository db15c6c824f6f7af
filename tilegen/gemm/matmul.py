"""tilegen.matmul: the front door. Picks a GEMM spec for the arrays it is given (dtype,
layouts, shape, GPU), compiles it (the disk cache makes that free after the first time) and
runs it with the fused epilogue asked for:

    out = act(alpha * A @ B + beta * out + bias) + residual

f32 inputs run on tf32 tensor cores only when allowed (allow_tf32=True or
TILEGEN_ALLOW_TF32=1); otherwise through 3xTF32, whose error is at f32's level.
Stacks of matrices and vectors follow numpy.matmul's rules (gemm/batch.py): folded into one
product, one launch of a batched kernel, or one product per matrix.
`tilegen.matmul.explain(A, B, ...)` returns the chosen spec and why.

The choice depends on the dtypes, the layouts, the GPU, the epilogue, allow_tf32 and the
shape only through `size_class`; for PyTorch and CuPy arrays it is made once per such key
and remembered (the tuned-config store is looked at again when it changes on disk), so a
call after the first is a dictionary lookup and one prepared launch (gemm/call.py).
"""
from __future__ import annotations

import os
import time
import warnings
from dataclasses import dataclass

import numpy as np

from .. import runtime
from ..arch.dtypes import FP8, numpy_dtype
from ..arch.dtypes import dtype as arch_dtype
from ..arch.targets import target_for
from ..codegen.ptxas import find_ptxas
from ..errors import LaunchError, PerformanceWarning, PrecisionWarning, SpecError, TilegenError, warn
from ..runtime import interop
from ..runtime.arrays import refuse_masked
from ..runtime.interop import DEVICE, DTYPE, PTR, SHAPE, STRIDES
from . import batch, tuned
from .call import (NO_SCALES, bias_axis, bias_vector, check_device, check_real_arrays, real_number, refuse_long_emulation, run_batched,
                   stack_problem)
from .kernel import compile_gemm
from .mainloops.wgmma import SWAPPED_TILE_WARPS
from .spec import Epilogue, GemmSpec

_DTYPES = {"float16": "f16", "bfloat16": "bf16", "float32": "f32", "float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2"}
_OUT_NAMES = {"bf16": "bf16", "bfloat16": "bf16", "f16": "f16", "float16": "f16", "half": "f16", "f32": "f32",
              "float32": "f32", "float": "f32"}
SMALL = 64  # a dimension this small leaves most of a 128-wide tile idle
FP8_OUT = "bf16"   # an fp8 product's output dtype unless out / out_dtype says otherwise
# Skinny products on Hopper (M up to SKINNY rows of tokens against a wide weight), measured on
# the H200 (docs/results/2026-11-24-h200-hopper.md, run 37, bf16, N = K = 8192 and N = 28672):
# streaming B is the work, so what counts is how much of it each SM has in flight. M up to 16:
# 64x64x128 mma.sync tiles, 6 stages (0.92x cuBLAS, from 0.58x with 64x64x64 and 3 stages), but
# where N gives 96 or more 256-wide blocks 64x128x64 tiles with 3 stages, two CTAs per SM (run 90,
# graph replay, 1 and 16 x 28672 x 8192: 0.97 / 0.96x against 0.91 / 0.85x for 64x64x64 and
# 0.78 / 0.76x for 64x64x128 with 6 stages; at N = 8192 they make too few CTAs: 0.51x); up to
# SKINNY: the wgmma kernel, one CTA per block, 64x128x128 tiles with 4 stages (0.95x at N = 8192),
# or 64x256x64 with 5 stages where N gives 96 or more such blocks (1.04-1.41x at N = 28672). Past
# M = SMALL a 128-row tile holds all of M: the warp-specialized kernel's 128x256 tiles where N gives
# 96 or more of them, else its 128x128 ones where those are 96 or more (run 71, graph replay: 80, 96
# and 128 x 28672 x 8192 0.71 / 0.75 / 1.43x -> 0.94 / 0.95 / 1.73x cuBLAS, 128 x 24576 0.74 -> 1.03x,
# 128 x 16384 0.88 -> 1.00x; at M = 64 the 64-row tiles stay ahead, 0.99 against 0.89x).
# Up to SKINNY_SHORT rows where N is not that wide, tiles of 16 rows (M <= 16) or 32 hold all of M,
# 64 columns with four warps side by side along N, 128-deep k-tiles, 6 stages: four warps issue
# twice the copies of two (run 98, graph replay, bf16: 1 / 16 / 32 x 8192 x 8192 1.01 / 0.98 / 0.96x
# cuBLAS, 16 x 4096 x 4096 1.03x, against 0.93 / 0.91 / 0.92 / 0.66x for 64x64x128 tiles and 0.85x
# for the wgmma 64x128x128 at M = 32). f32 and tf32 products up to SKINNY_SHORT rows take the same
# rows with 64-deep k-tiles (128 columns, 4 stages, where N is that wide), from 64x64x32 tiles with
# 3 stages (run 98, tf32 against cuBLAS tf32: 1 / 16 x 8192 x 8192 0.34 / 0.36 -> 0.96 / 1.03x,
# 1 x 28672 x 8192 0.66 -> 0.99x; 3xTF32 f32 against cuBLAS f32: 16 x 8192 x 8192 0.53 -> 1.22x,
# 32 x 8192 x 8192 0.68 -> 1.04x, 16 x 28672 x 8192 0.44 -> 1.15x, 1 x 8192 x 8192 0.24 -> 0.55x).
SKINNY = 128
SKINNY_SHORT = 32
SKINNY_WIDE_BLOCKS = 96
# At most 16 rows against a wide weight given as W.T (B column-major, N // 256 >= SKINNY_WIDE_BLOCKS): the
# swapped persistent TMA kernel (C^T = B^T A^T, the rows as wgmma's n, 16 stages of 10 KB). Measured on the
# H200 (run 228, GPU time of CUDA-graph replays rotating operands, bf16, K = 8192, mma.sync 64x128 s3 ->
# swapped; torch.matmul): 1x28672 125.2 -> 117.4 us, 16x28672 125.2 -> 116.9 (110.0-110.7); with B
# row-major no gain (113.3-113.8 -> 114.0-114.5), and at N = 8192 none either way (34.9-35.6 against 35.3-35.5).
SKINNY_SWAPPED = dict(tile=SWAPPED_TILE_WARPS[0], warps=SWAPPED_TILE_WARPS[1], stages=16, swap_ab=True, copy="tma",
                      persistent=True)
# Up to SKINNY_SHORT rows against a narrower W.T (N // 256 < SKINNY_WIDE_BLOCKS): the same kernel with 128-deep
# k-tiles, 8 stages, 16 or 32 rows of A as wgmma's n (fp8's decoding tiles; docs/perf_notes.md 54). Measured on
# the H200 (run 329, GPU time of CUDA-graph replays, bf16, x torch.matmul, the mma.sync 16/32x64x128 tiles with 6
# stages -> swapped): 1 / 16 / 32 x 4096 x 4096 1.01 / 1.05 / 0.92 -> 1.08 / 1.16 / 1.16, 1 / 16 x 4096 x 14336 0.88 /
# 0.90 -> 1.05 / 1.07, 1 x 11008 x 4096 0.86 -> 0.94, 16 x 14336 x 4096 0.93 -> 0.95, 1 / 32 x 8192 x 8192 1.00 /
# 0.95 -> 1.03 / 1.00, 1 x 5120 x 5120 0.99 -> 0.99, 1 x 6144 x 4096 1.03 -> 1.03.
SKINNY_SWAPPED_NARROW = dict(warps=(1, 4), stages=8, swap_ab=True, copy="tma", persistent=True)
# tf32 from SKINNY_SHORT + 1 to SKINNY rows against wide weights (A row-major), on wgmma; keyed by
# (B's layout, N // 256 >= SKINNY_WIDE_BLOCKS, M <= SMALL). Measured on the H200 (K = 8192, CUDA-graph
# replay, x cuBLAS tf32) against what ran before: 65-128 rows (run 121, the mma.sync default's 0.36-0.62x):
# B row-major 0.62 / 0.67 (128 / 80 rows x 8192) on 64x128x32 tiles, 0.70 / 0.74 (128 / 96 x 28672) on
# 128x128x32; B column-major (x @ W.T) 0.98 / 0.95 on 64x128x64 tiles one CTA per block, 0.89 / 0.90 on
# the warp-specialized 64x256x32. 33-64 rows (run 123): B column-major 0.77-0.79 -> 0.99 (x 8192) and
# 0.64-0.67 -> 1.06-1.07 (x 28672) on the 64x128x64 tiles; B row-major x 28672 0.83-0.84 -> 1.03-1.05 on
# 64x128x32 (x 8192 the mma.sync skinny rule stays: 0.75-0.77 against 0.56-0.58).
# B row-major since run 254 (CUDA-graph replay, x cuBLAS tf32, K = 8192; what ran before -> now): the register
# kernel on TMA stages (section 47) with these tiles: 48 / 64 rows x 8192 0.75 / 0.71 -> 0.96 / 0.98 (32x128,
# the mma.sync rule before), x 28672 1.07 / 0.97 -> 1.27 / 1.20 (64x128); 80 / 96 / 128 rows x 8192 0.64 / 0.63 /
# 0.61 -> 0.89 / 0.92 / 0.86 (64x128, 8 stages), x 28672 0.76 / 0.80 / 0.79 -> 0.82 / 0.89 / 0.95 (128x128).
TF32_MID_ROWS = {("row", False, False): dict(tile=(64, 128, 32), warps=(1, 8), stages=8, copy="tma"),
                 ("row", True, False): dict(tile=(128, 128, 32), warps=(1, 8), stages=4, copy="tma"),
                 ("col", False, False): dict(tile=(64, 128, 64), warps=(4, 1), stages=4, persistent=False),
                 ("col", True, False): dict(tile=(64, 256, 32), warps=(4, 1), stages=4),
                 ("row", False, True): dict(tile=(32, 128, 32), warps=(1, 8), stages=8, copy="tma"),
                 ("row", True, True): dict(tile=(64, 128, 32), warps=(1, 8), stages=8, copy="tma"),
                 ("col", False, True): dict(tile=(64, 128, 64), warps=(4, 1), stages=4, persistent=False),
                 ("col", True, True): dict(tile=(64, 128, 64), warps=(4, 1), stages=4, persistent=False)}

# tf32 below the large preset on Hopper with A row-major and more than SMALL rows and columns (past the
# skinny rules): the warp-specialized wgmma kernels, the largest of these tiles whose blocks keep at least
# half the SMs busy, else the smallest (B row-major: the register kernel, C^T = B^T A^T, whose 256-row tile
# only where it loads without spills; B column-major: the K-major kernel). Measured on the H200 (run 255,
# CUDA-graph replay, x cuBLAS tf32; the mma.sync kernel before ran 0.32-0.53x): B row-major 512^3 0.88,
# 1024^3 0.97, 1024x1024x4096 1.01, 1024x2048x2048 0.98, 1536^3 1.05, 256x4096x4096 1.02, 256x8192x8192 0.97,
# 512x8192x8192 1.04, 768x4096x4096 1.06; B column-major 0.95 / 1.20 / 1.24 / 0.93 / 0.94 / 1.00 / 0.87 /
# 0.99 / 1.01 (1536^3 and 768x4096x4096 within 6% of the best tile measured).
TF32_MEDIUM_TILES = {"row": (dict(tile=(256, 128, 32), warps=(1, 8), stages=4, copy="tma"),   # (the preset's)
                             dict(tile=(128, 128, 32), warps=(1, 8), stages=4, copy="tma"),
                             dict(tile=(64, 128, 32), warps=(1, 8), stages=8, copy="tma")),
                     "col": (dict(tile=(128, 256, 32), warps=(8, 1), stages=4),                # (the preset's)
                             dict(tile=(128, 128, 32), warps=(8, 1), stages=4),
                             dict(tile=(64, 128, 32), warps=(4, 1), stages=6))}
_TF32_MEDIUM_AREAS = tuple(sorted({f["tile"][:2] for tiles in TF32_MEDIUM_TILES.values() for f in tiles}))

# Specs measured best on an H200 for large problems, used when this machine has no tuning cache
# of its own: (target, dtype) -> fields. The wgmma kernel (128x256 tiles, every layout pair)
# against the best mma.sync spec: docs/results/2026-11-21-h200-run9.md.
# The 128x256 presets walk blocks in groups of 16 block rows (GROUP_M): held at the power cap
# (run 279, 2.5 s back to back) 0.6-1.0% faster than groups of 8 at 4096^3 (bf16 rr / rc, tf32 K-major)
# and 8192^3 (bf16 rc), reading 22% fewer DRAM bytes a call (bf16 4096^3: 186 -> 145 MB, run 271); the
# tf32 register kernels (256-row blocks) ran 1.8% slower so, and keep 8.
GROUP_M = 16
PRESETS = {
    ("sm_90", "f16"): dict(instruction="wgmma", target="sm_90a", group_m=GROUP_M),
    ("sm_90", "bf16"): dict(instruction="wgmma", target="sm_90a", group_m=GROUP_M),
    ("sm_90", "tf32"): dict(instruction="wgmma", target="sm_90a", group_m=GROUP_M),
    ("sm_90", "f32"): dict(instruction="wgmma", target="sm_90a"),    # 3xTF32 as one tf32 product of the parts
    ("sm_90", "e4m3"): dict(instruction="wgmma", target="sm_90a"),
    ("sm_90", "e5m2"): dict(instruction="wgmma", target="sm_90a"),
}
# ... and with a fused epilogue (f16/bf16) that reads a residual, or over a K of at most
# PINGPONG_MAX_K, ping-pong consumers: two warpgroups on alternate 64x256 blocks, one's epilogue
# overlapping the other's wgmmas. Measured on the H200 against the cooperative 128x256 kernel, bf16,
# M x N from 4096^2 to 8192 x 16384, 5 interleaved rounds with the operands rotated past L2 (run 84):
# bias + GELU 1.10-1.24x at K = 1024 but 0.96-1.02x at K = 4096; with a residual 1.15-1.22x at
# K = 1024 and 1.06-1.14x at K = 4096; plain products 0.94-1.03x (not taken). Its 64-row blocks load
# B twice as often, which the longer main loops of a large K feel more than they gain.
PINGPONG = dict(pingpong=True, tile=(64, 256, 64), warps=(4, 1), group_m=8)   # (as measured)
PINGPONG_MAX_K = 2048
# The Hopper presets' 128x256 tiles fill the GPU from about 2048 x 2048 outputs on; measured on the
# H200 at 1024x4096x4096 the wgmma preset ran 500-527 TFLOP/s (bf16/f16) against mma.sync's
# 370-385, and tf32 313 against 168: a side of 1024 is enough when the area is there.
LARGE_AREA = 2048 * 2048
LARGE_SIDE = 1024
# Medium f16/bf16 problems on Hopper (below LARGE, no side under SMALL): the same warp-specialized
# wgmma kernel with smaller tiles; 128x128x64 with 4 stages where that gives MEDIUM_BLOCKS or more
# blocks, else 64x128x64 with 6 stages and one math warpgroup (twice the blocks). Measured on the H200
# kernel-only (CUDA-graph replay, bf16; docs/results/2026-11-24-h200-frontdoor2.md): against
# mma.sync's 128x128 tiles 0.29-0.51x cuBLAS -> 0.70-0.80x at 512^3-1024^3, 0.96-0.97x at 2048x1024
# and 2048x2048x512.
MEDIUM_BLOCKS = 96
# ... and below MEDIUM_BLOCKS with K at least LONG_K times the output's longer side (few blocks,
# each a long walk over K), 64x128x128 tiles, 4 stages, one CTA per block: 0.70 -> 0.87x cuBLAS at
# 1024x1024x4096, 0.49 -> 0.67x at 512x512x4096 (run 55, graph replay); split-K (two kernels and an
# f32 round trip through memory) measured no better there (0.57-0.69x).
LONG_K = 2
# tf32 on Hopper with an MN-major operand (B row-major, A column-major): the wgmma kernel cannot read
# it through TMA (tf32 is K-major only), and feeding it through registers or transposing copies kept
# the kernel at 0.77-0.86x cuBLAS tf32; the K-major kernel runs 1.02-1.12x. A first kernel copies the
# operand K-major (3.2-3.5 TB/s on the H200), which pays when the product's other side is long enough:
# B row-major needs M >= PRETRANSPOSE_MIN, A column-major N >= PRETRANSPOSE_MIN. Measured (run 110,
# A and B row-major, against cuBLAS tf32): 0.80 -> 1.02x at 8192^3 and 8192x8192x1024, 0.80 -> 0.94x at
# 4096^3, 0.84 -> 0.99x at 4096x4096x1024, 0.79 -> 0.88x at 2048x8192x8192, 0.86 both ways at 2048^3,
# and 0.91 -> 0.82x at 1024x4096x4096 (where the copy of the 4096^2 B outweighs the product).
PRETRANSPOSE_MIN = 2048
# ... except A and B row-major where the kernel that feeds B to wgmma from registers (C^T = B^T A^T,
# B's stages through TMA: GemmSpec(copy="tma")) loads without spills (a ptxas assembles it; the
# driver's JIT alone spills it): since its k-steps are loaded only once no wgmma is in flight (ptxas
# had serialized every wgmma of it) and addressed as one register and immediates, it runs as fast as
# the K-major kernel, in one launch and with B rounded instead of truncated (docs/perf_notes.md
# section 47). Measured on the H200 (run 252, two passes, x cuBLAS tf32, register kernel / copy
# first): 1024x4096x4096 1.15-1.19 / 0.80-0.83, 2048^3 1.06-1.15 / 0.83-0.88, 2048x8192x8192
# 1.02-1.05 / 0.86-0.87, 4096x4096x1024 1.08-1.12 / 1.04-1.06, 4096^3 1.04 / 0.95-0.96, 4096x8192x8192
# 1.01-1.02 / 0.93-0.94, 6144^3 1.02 / 0.96-0.97, 6144x8192x2048 1.18-1.20 / 1.16-1.17, 8192x8192x1024
# 1.04 / 1.05, 8192^3 0.99-1.02 / 0.96.
TF32_REGISTER_B = dict(copy="tma", group_m=8)   # (GROUP_M: 16 ran slower here)
# A column-major with B row-major: A copied K-major first, then that kernel (GemmSpec(pretranspose="A")).
# Measured (run 259, x cuBLAS tf32, against copying both first): 1024x4096x4096 1.37 / 1.01 (matmul ran
# the cp.async register kernel there, 0.78), 2048^3 1.29 / 1.08, 4096^3 1.45 / 1.36, 4096x4096x1024 1.39 /
# 1.32, 6144^3 1.68 / 1.57, 8192x8192x1024 1.49 / 1.49, 8192^3 1.60 / 1.47 (cuBLAS is slow in this layout).
TF32_COPY_A = dict(pretranspose="A", group_m=8)
# Both column-major the same way round, A's k-steps into registers from TMA stages and B K-major by
# descriptor (no swap: wgmma's A may come from registers in any layout), with direct stores: its TMA-store
# epilogue ran 1-14% slower (run 262, 2048^3 57.1 -> 50.2 us, 4096^3 417 -> 390, 8192^3 3573 -> 3467) and
# then only even with copying A first (run 257). Direct: 1.01-1.10x cuBLAS tf32 in that layout and within
# 5% of the row-major kernel's time (2048^3 50.2 / 49.7 us, 4096^3 390 / 416, 8192^3 3467 / 3305,
# 4096x4096x1024 126.9 / 124.5); copying A first 61.4 / 422 / 3626 / 133.8.
TF32_REGISTER_A = dict(copy="tma", store="direct", group_m=8)
# f32 without TF32 on Hopper below the large preset: the operands' tf32 parts on wgmma (as the preset)
# from F32_PARTS_MIN rows and columns on, with 64x128x32 tiles (one math warpgroup, 6 stages, promoted
# every 4 k-tiles) below MEDIUM_BLOCKS blocks of 128 x 128. Measured on the H200 against cuBLAS f32,
# CUDA-graph replay (run 116): 512^3 0.32 -> 0.65x, 1024^3 0.76 -> 1.44x, 1024x1024x4096 0.65 -> 1.31x,
# 256x4096x4096 0.65 -> 0.94x, 2048x1024x2048 (128 blocks, 128x128 tiles) 0.77 -> 1.64x; at 128 x 8192 x
# 8192 the split ran 0.60x against mma.sync's 0.62x, at 64 rows 0.34x against 0.69x. As called (run 117)
# its three launches and workspace cost 31-36 us of host time per call, so it also needs M N K >=
# F32_PARTS_WORK: 1024^3 1.38x, 256x4096x4096 0.94x, but 512^3 0.39x (mma.sync 0.51x). K too must be
# F32_PARTS_MIN or more: each part is padded to 64 along K.
F32_PARTS_MIN = 256
F32_PARTS_WORK = 2 ** 30
F32_PARTS_SMALL = dict(tile=(64, 128, 32), warps=(4, 1), stages=6, promote=4)
# fp8 on Hopper over at least FP8_WIDE_MIN_AREA outputs and FP8_WIDE_MIN_K: 128x192x128 tiles load
# 17% fewer bytes per product than 128x128 and leave a fuller last wave at 8192^3 (2752 blocks, 20.85
# waves of 132 CTAs, against 4096 blocks, 31.03 waves). Each math thread then holds 2 x 96 accumulator
# registers: it needs the 232 that setmaxnreg gives it, which ptxas honours and the driver's JIT does
# not (it spills them: 0.50x torch._scaled_mm). So only where the loaded kernel does not spill (the
# runtime had ptxas assemble it). H200, the ptxas cubin as kernel(A, B) (run 145, x torch._scaled_mm):
# 8192^3 1.018 against 128x128's 0.982, 6144^3 1.019 against 0.964; behind at 4096^3 (0.925 against
# 1.038: 5.3 waves) and, in that run's short loops, at 8192x8192x1024 (1.072 against 1.087). Held at the
# power cap, as called (runs 290-291, tools/h200_fp8_promote.py): ahead from K = 1024 on, 6144x6144x1024
# 82.0 against 86.0 us, 8192x8192x1024 145.2 against 150.9, 8192x8192x2048 251.6 against 259.8,
# 16384x8192x1024 288.2 against 298.6 (torch._scaled_mm 85.9 / 149.2 / 256.7 / 281.3); 4096^3 still behind.
FP8_WIDE_TILE = (128, 192, 128)
FP8_WIDE_MIN_AREA = 6144 * 6144
FP8_WIDE_MIN_K = 1024
# fp8 decoding's products on Hopper (M up to SKINNY rows against N >= 4 * SKINNY, A row-major and B = W.T, as
# torch._scaled_mm takes them): streaming the weight is the work. Up to SKINNY_SHORT rows the swapped
# warp-specialized kernel (C^T = B^T A^T: 64 rows of W as wgmma's rows, 16 rows of A as its n, one math warpgroup
# fed by TMA; both operands K-major, as fp8 wgmma needs), promoted every 128-deep k-tile with two accumulators
# taking turns (cuBLASLt's error bit for bit; 3 x 8 registers, so the driver's JIT holds them too); 8 stages, 12
# where K >= FP8_FEW_ROWS_DEEP_K and N >= FP8_FEW_ROWS_DEEP_N. cuBLASLt's kernel at these shapes is of the same
# kind (a 64x8 tile, 64 CTAs at 4096 x 4096: ncu, run 315), and the mma.sync kernel's 16-row tiles before were
# issue-bound (two warps a CTA, an instruction every 2 cycles, 1.25 TB/s). Measured on the H200 (GPU time of
# CUDA-graph replays, e4m3, bf16 out, x torch._scaled_mm, M x N x K; runs 317-318, the mma.sync 16-row tiles of
# runs 302-311 -> swapped): 1 / 16 / 32 x 4096 x 4096 0.63 / 0.64 / 0.60 -> 0.85 / 0.96 / 1.06, 1 x 4096 x 14336
# 0.87 -> 1.08, 1 / 16 / 32 x 8192 x 8192 0.92 / 0.94 / 0.67 -> 0.98 / 0.98 / 0.91, 1 x 28672 x 8192 0.87 -> 0.96,
# 16 x 6144 x 4096 0.90 -> 0.98, 1 x 2048 x 8192 0.58 -> 0.91, 1 x 2048 x 2048 0.64 -> 0.93. 256-deep k-tiles
# ran up to 8% faster (run 317) but promote every 256 products (0.4-0.6% more error than cuBLASLt's); taking
# turns by their 128-deep halves made ptxas 13.0 serialise the wgmmas (C7514; 0.55-0.94x, run 318).
# From SKINNY_SHORT + 1 to SMALL rows against at most FP8_SWAP_MAX_N columns, the same kernel with 32 rows of A as
# wgmma's n (run 321, x _scaled_mm, the 64-row tiles below -> swapped): 40 / 64 x 4096 x 4096 0.66 / 0.85 -> 0.76 /
# 1.08, 64 x 4096 x 14336 0.91 -> 0.97, 48 x 4096 x 11008 0.87 -> 0.92, 64 x 2048 x 8192 0.70 -> 0.94; from 5120
# columns on the 64-row tiles stay ahead (64 x 5120 x 5120 0.88 against 0.70, 64 x 8192 x 8192 1.05 against 0.98).
# Past that, and to SKINNY rows, the warp-specialized kernel with 64-row tiles promoted every k-tile with
# two accumulators taking turns: 64x128x128 with 8 stages where it makes SKINNY_WIDE_BLOCKS blocks, 64 / 128 x
# 28672 x 8192 1.03 / 0.91, 128 x 8192 x 8192 0.99, 128 x 14336 x 4096 0.94 (0.66 for 64x64); else 64x64x128 with
# 12 stages, 128 x 4096 x 4096 0.95 (0.87 for 64x128), 64 / 128 x 4096 x 14336 0.90 / 1.04, 64 x 8192 x 8192 1.00.
FP8_FEW_ROWS = dict(tile=(16, 64, 128), warps=(1, 4), swap_ab=True, copy="tma", persistent=True, promote=1,
                    frag_buffers=2)
FP8_SWAP_MAX_N = 4096
FP8_FEW_ROWS_DEEP_K = 8192
FP8_FEW_ROWS_DEEP_N = 4096
FP8_SKINNY_WIDE = dict(tile=(64, 128, 128), stages=8)
FP8_SKINNY_NARROW = dict(tile=(64, 64, 128), stages=12)
# fp8 on Hopper promoted every k-tile (promote=1): cuBLASLt's error bit for bit (it sums 128 products
# per promotion), where GemmSpec's default every 2 k-tiles leaves 0.4-0.5% more (Frobenius). On 128x128
# tiles two accumulators take turns (frag_buffers=2: no drain; 3 x 64 registers a math thread), which needs the
# registers setmaxnreg gives, so only where the loaded kernel does not spill (as the wide tiles). Held at
# the power cap (runs 295-297, x torch._scaled_mm): 4096^3 1.014 (every 2: 1.02), 8192x8192x1024 on
# 128x192 1.00 (1.03), 8192^3 on 128x192 0.99 (1.025): the wide tiles promote every k-tile by halves
# staggered across the warpgroups (3 x 96 registers do not fit).


def _skinny_rows(M: int) -> int:
    """The rows of a skinny product's tiles: 16 (one mma row of atoms) up to 16 rows, else 32."""
    return 16 if M <= 16 else SKINNY_SHORT


def long_k(M: int, N: int, K: int) -> bool:
    return K >= LONG_K * max(M, N)


def is_large(M: int, N: int) -> bool:
    return M * N >= LARGE_AREA and min(M, N) >= LARGE_SIDE


@dataclass(frozen=True)
class Choice:
    spec: GemmSpec
    reason: str

    def __str__(self) -> str:
        return f"{self.spec}\n  because: {self.reason}"


def _dtype_name(x) -> str:
    dt = getattr(x, "dtype", None)
    name = str(dt).replace("torch.", "") if dt is not None else type(x).__name__
    return {"float": "float32", "half": "float16"}.get(name, name)


def _shape(x, name: str) -> tuple:
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise LaunchError(f"{name} is a {type(x).__name__}, not an array: pass a numpy array "
                          f"(np.asarray({name}, dtype=np.float32)) or a GPU array (PyTorch, CuPy)")
    shape = tuple(int(s) for s in x.shape)
    if len(shape) != 2:
        raise LaunchError(f"{name} must be a 2-D array, got shape {shape}")
    refuse_masked(x, name)
    return shape


def _layout(x) -> str:
    """The memory layout a GPU array is used in; host arrays are copied, so always "row"
    unless they are plainly column-major."""
    if isinstance(x, np.ndarray):
        return "col" if (x.flags.f_contiguous and not x.flags.c_contiguous) else "row"
    return runtime.detect_layout(x) or "row"


def _k_major(x: np.ndarray, k_axis: int) -> bool:
    """Whether a host matrix is K-major: its K axis has unit stride (or 0: broadcast), or a
    size-1 axis leaves nothing to order (sliced and reversed views count by their strides,
    not their flags)."""
    return x.shape[k_axis] == 1 or x.shape[1 - k_axis] == 1 or x.strides[k_axis] in (0, x.itemsize)


def _target() -> str:
    """The target the choices are made for: the GPU's (arch.targets.target_for: sm_90 on Hopper,
    whose wgmma kernels are sm_90a's; sm_89's for GPUs newer than Hopper), sm_80 without a GPU."""
    if not runtime.gpu_available():
        return "sm_80"
    return target_for(runtime.device_info().cc)


def _blocks128(M: int, N: int) -> int:
    return -(-M // 128) * -(-N // 128)


def _tf32_medium_spec(base: dict, b_layout: str, M: int, N: int):
    """(spec fields, blocks, SMs) for a medium tf32 product (TF32_MEDIUM_TILES): the largest tile
    whose blocks keep half the SMs busy."""
    sms = _sm_count()
    options = TF32_MEDIUM_TILES[b_layout]
    for i, fields in enumerate(options):
        tm, tn, _ = fields["tile"]
        blocks = -(-M // tm) * -(-N // tn)
        last = i == len(options) - 1
        if blocks >= sms // 2 or last:
            if i == 0 and b_layout == "row" and not loads_without_spills(
                    GemmSpec(**{**base, "target": "sm_90a"}, instruction="wgmma", **fields)):
                continue   # (the 256-row register tile: only where ptxas assembles it)
            return fields, blocks, sms
    raise AssertionError("unreachable")


def _tf32_medium_class(M: int, N: int) -> tuple:
    """What _tf32_medium_spec compares, for the choice memo."""
    h = _sm_count() // 2
    return tuple(-(-M // tm) * -(-N // tn) >= h for tm, tn in _TF32_MEDIUM_AREAS)


def size_class(M: int, N: int, K: int) -> tuple:
    """All that explain's choice reads of the shape: each dimension's power-of-two bucket
    (the tuned store's key) and every threshold a rule below compares it with."""
    return _tf32_medium_class(M, N) + ((M - 1).bit_length(), (N - 1).bit_length(), (K - 1).bit_length(), min(M, N) <= SMALL, is_large(M, N),
            M <= 16, M <= SKINNY_SHORT, M <= SKINNY, N >= 4 * SKINNY, N // 256 >= SKINNY_WIDE_BLOCKS, _blocks128(M, N) >= MEDIUM_BLOCKS,
            long_k(M, N, K), K <= PINGPONG_MAX_K, M >= PRETRANSPOSE_MIN, N >= PRETRANSPOSE_MIN, min(M, N) >= F32_PARTS_MIN,
            M * N * K >= F32_PARTS_WORK, K >= F32_PARTS_MIN, M * N >= FP8_WIDE_MIN_AREA, K >= FP8_WIDE_MIN_K,
            -(-M // 64) * -(-N // 128) >= SKINNY_WIDE_BLOCKS, K >= FP8_FEW_ROWS_DEEP_K, N >= FP8_FEW_ROWS_DEEP_N,
            M <= SMALL, N <= FP8_SWAP_MAX_N)


def _every_k_tile(spec: GemmSpec) -> GemmSpec:
    """`spec` promoted every k-tile: two accumulators taking turns where they fit (frag_buffers=2),
    else the warpgroups' promotions staggered by half a k-tile (the 128x192 tiles)."""
    try:
        return spec.replace(promote=1, frag_buffers=2)
    except SpecError:
        return spec.replace(promote=1)


def _promoted_every_k_tile(specs):
    """The first of these fp8 warp-specialized specs that, promoted every k-tile (_every_k_tile), loads
    without spills; or None."""
    return next((s for s in map(_every_k_tile, specs) if loads_without_spills(s)), None)


def loads_without_spills(spec: GemmSpec) -> bool:
    """Whether `spec`'s kernel, loaded on device 0, keeps its registers (no local memory): the
    runtime hands a kernel the driver's JIT spills to ptxas where one is installed. Loaded once per
    spec and process; False without a GPU or a ptxas (the JIT alone is known to spill the specs asked
    about here, so they are not loaded just to warn)."""
    ok = _NO_SPILLS.get(spec)
    if ok is None:
        ok = False
        if runtime.gpu_available() and find_ptxas() is not None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", PerformanceWarning)   # (a spilling kernel is not chosen)
                try:
                    ok = compile_gemm(spec).function(0).local_bytes == 0
                except TilegenError:   # (any refusal on the way: the 128x128 preset stays)
                    ok = False
        _NO_SPILLS[spec] = ok
    return ok


_NO_SPILLS: dict = {}


def _allow_tf32(allow) -> bool:
    if allow is not None:
        if not isinstance(allow, (bool, np.bool_)):
            raise LaunchError(f"allow_tf32={allow!r}; allowed: True, False or None (TILEGEN_ALLOW_TF32=1 in the "
                              f"environment allows it)")
        return bool(allow)
    raw = os.environ.get("TILEGEN_ALLOW_TF32", "")
    if raw == _ENV_READ[0]:   # (read on every f32 call: parsed once per value)
        return _ENV_READ[1]
    env = raw.strip().lower()
    if env in _ENV_TRUE or env in _ENV_FALSE:
        _ENV_READ[:] = [raw, env in _ENV_TRUE]
        return _ENV_READ[1]
    raise LaunchError(f"TILEGEN_ALLOW_TF32={os.environ['TILEGEN_ALLOW_TF32']!r}; allowed: 1, true, yes, on (tf32 for f32 "
                      f"inputs) or 0, false, no, off, unset")


_ENV_TRUE, _ENV_FALSE = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")
_ENV_READ = [None, False]   # the last TILEGEN_ALLOW_TF32 string read and what it means


def _tf32_key(allow, f32: bool):
    """What a remembered choice reads of allow_tf32: for f32 operands whether tf32 is allowed (the
    argument, else TILEGEN_ALLOW_TF32), else None; a value explain refuses is refused for every dtype."""
    if allow is not None and type(allow) is not bool:
        _allow_tf32(allow)
    return _allow_tf32(allow) if f32 else None


def explain(A, B, *, bias=None, activation=None, residual=None, alpha=1.0, beta=0.0, out=None, allow_tf32=None,
            device=None, scale_a=None, scale_b=None, out_dtype=None) -> Choice:
    """The spec matmul would run for these arguments (matmul's own), and the reason. Runs
    nothing (alpha, beta and device do not change the choice); fp8 over FP8_WIDE_MIN_AREA
    outputs on Hopper loads the wide kernel once per process (loads_without_spills); a device
    matmul would refuse is refused here too."""
    check_device(device)
    _check_out(out)
    out_name = None   # a product's out_dtype alone: only its name counts, no output is made
    if out is None and out_dtype is not None and not batch.is_stack(A, B):
        out_name = _out_dtype_name(out_dtype)
    else:
        out = _out_for(A, B, out, out_dtype)
    if allow_tf32 is not None:
        _allow_tf32(allow_tf32)   # (checked for every dtype: it matters only for f32)
    if batch.is_stack(A, B):
        stack = batch.plan(A, B, out=out, bias=bias)
        if not stack.folded and _host_number(scale_a) and _host_number(scale_b):   # (numbers only scale alpha)
            choice = _batched_choice(stack, batch.flat(stack, A, B, out, residual), bias, activation, allow_tf32)
            if choice is not None:
                return choice
        args = batch.first_product(stack, A, B, out=out, residual=residual, scale_a=scale_a, scale_b=scale_b)
        choice = explain(bias=bias, activation=activation, allow_tf32=allow_tf32, **args)
        return Choice(choice.spec, f"{stack.why}; {choice.reason}")
    check_real_arrays(bias=bias, residual=residual)
    M, K = _shape(A, "A")
    K2, N = _shape(B, "B")
    if K != K2:
        raise LaunchError(f"A is {M} x {K} but B is {K2} x {N}: inner dimensions differ")
    if K == 0:
        choice = explain(*zero_operands(A, B), bias=bias, activation=activation, residual=residual, out=out,
                         allow_tf32=allow_tf32, scale_a=scale_a, scale_b=scale_b, out_dtype=out_name)
        return Choice(choice.spec, f"K = 0: A @ B is all zeros, so matmul multiplies {ZERO_K} columns of zeros "
                                   f"to apply the epilogue; {choice.reason}")
    a_name, b_name = _dtype_name(A), _dtype_name(B)
    mixed_fp8 = a_name != b_name and _DTYPES.get(a_name) in FP8 and _DTYPES.get(b_name) in FP8
    if a_name != b_name and not mixed_fp8:
        raise LaunchError(f"A is {a_name} and B is {b_name}; matmul takes two arrays of one dtype (or two fp8 ones)")
    if a_name not in _DTYPES:
        swapped = isinstance(A, np.ndarray) and not A.dtype.isnative
        raise LaunchError(f"matmul takes float16, bfloat16, float32, float8_e4m3fn or float8_e5m2 arrays, not {a_name}"
                          + (" (byte-swapped: pass A.astype(A.dtype.newbyteorder('=')))" if swapped else ""))
    why = []
    host = isinstance(A, np.ndarray) and isinstance(B, np.ndarray)
    dtype = _DTYPES[a_name]
    if dtype == "f32":
        if _allow_tf32(allow_tf32):
            dtype = "tf32"
            why.append("f32 inputs with tf32 allowed: one tf32 product (10-bit mantissas)")
        else:
            why.append("f32 inputs, tf32 not allowed: 3xTF32 (three tf32 products, f32 accuracy)")
    if out is not None and _dtype_name(out) not in _DTYPES:
        raise LaunchError(f"out has dtype {_dtype_name(out)}; matmul writes float16, bfloat16 or float32 (in the "
                          f"machine's byte order)")
    out_dtype = _DTYPES[_dtype_name(out)] if out is not None else out_name or (
        "f32" if dtype in ("f32", "tf32") else FP8_OUT if dtype in FP8 else dtype)
    if dtype in FP8:
        if out_dtype in FP8:
            raise LaunchError(f"an fp8 product goes out as bfloat16, float16 or float32, not {_dtype_name(out)}: "
                              f"pass out_dtype= or an out of one of those")
        if not (_k_major(A, 1) and _k_major(B, 0)) if host else (_layout(A), _layout(B)) != ("row", "col"):
            raise LaunchError("fp8 operands must both be K-major, as torch._scaled_mm takes them: A row-major "
                              "(M x K, K contiguous) and B the transpose of a row-major N x K matrix (pass W.T); "
                              f"got A {_layout(A)}-major and B {_layout(B)}-major")
        why.append(f"{dtype} operands (f32 accumulation; scales applied in the epilogue)")
    axis = None
    if bias is not None:
        axis = bias_axis(bias, M, N)
        if axis is None:
            rows = f"({M}, 1)" + (f" or ({M},)" if M != N and N != 1 else "")
            one = (f" (with N = 1, numpy would spread a 1-D bias of {M} values over a result of {M} x {M}: pass "
                   f"it as ({M}, 1) for one per row)" if N == 1 and tuple(getattr(bias, "shape", ())) == (M,) else "")
            raise LaunchError(f"bias must be N={N} values, one per column (shape ({N},) or (1, {N})), or M={M}, one "
                              f"per row (shape {rows}), as numpy broadcasts it onto the {M} x {N} product; got shape "
                              f"{tuple(getattr(bias, 'shape', ()))}{one}")
    rows_scaled, cols_scaled = _vector_scale(scale_a, M, "scale_a") is not None, \
        _vector_scale(scale_b, N, "scale_b") is not None
    device_a = not rows_scaled and _device_scale_dtype(scale_a) is not None
    device_b = not cols_scaled and _device_scale_dtype(scale_b) is not None
    if device_a or device_b:
        why.append("per-tensor scales in GPU memory, read by the kernel (no read-back; capturable)")
    epilogue = Epilogue(bias=axis, activation="none" if activation is None else activation,   # ("" is no name)
                        residual=residual is not None,
                        scale_rows=rows_scaled, scale_cols=cols_scaled, device_scale_a=device_a,
                        device_scale_b=device_b)
    # fp8 host arrays (K-major views of any strides) are copied into the layouts the kernel reads
    a_layout, b_layout = ("row", "col") if dtype in FP8 and host else (_layout(A), _layout(B))
    target = _target()
    if dtype in FP8 and int(target[3:5]) < 89:
        if runtime.gpu_available():
            raise LaunchError(f"fp8 products need an sm_89 (Ada) or newer GPU; this one is {target}")
        target = "sm_89"   # the emulator: the fp8 mma.sync kernel
    base = dict(dtype=dtype, out_dtype=out_dtype, a_layout=a_layout, b_layout=b_layout, epilogue=epilogue,
                target=target)
    if mixed_fp8:   # e4m3 x e5m2 or the reverse: the atom names B's type
        base["atom"] = f"m16n8k32.{dtype}.{_DTYPES[b_name]}.f32"
        why.append(f"B is {_DTYPES[b_name]}: a mixed fp8 pair")
    tuned = _tuned(dtype, a_layout, b_layout, M, N, K, out_dtype)
    # fp8 on Hopper: the wgmma kernel at every size past SMALL (mma.sync fp8 ran 0.2-0.4x torch._scaled_mm)
    skinny_fp8 = target == "sm_90" and dtype in FP8 and M <= SKINNY and N >= 4 * SKINNY
    preset = PRESETS.get((target, dtype)) if (is_large(M, N) or (dtype in FP8 and min(M, N) > SMALL)) and \
        not skinny_fp8 else None
    f32_parts = target == "sm_90" and dtype == "f32" and min(M, N, K) >= F32_PARTS_MIN and M * N * K >= F32_PARTS_WORK
    if dtype == "f32" and not f32_parts:
        preset = None   # (the tf32 parts pay for their first kernels only on enough work)
    hopper16 = target == "sm_90" and dtype in ("f16", "bf16")
    skinny = hopper16 and M <= SKINNY and N >= 4 * SKINNY
    skinny32 = target == "sm_90" and dtype in ("tf32", "f32") and M <= SKINNY_SHORT and N >= 4 * SKINNY
    skinny_tf32 = (target == "sm_90" and dtype == "tf32" and SKINNY_SHORT < M <= SMALL and N >= 4 * SKINNY
                   and N // 256 < SKINNY_WIDE_BLOCKS)
    mid_tf32 = (target == "sm_90" and dtype == "tf32" and SKINNY_SHORT < M <= SKINNY and N >= 4 * SKINNY
                and a_layout == "row" and (b_layout, N // 256 >= SKINNY_WIDE_BLOCKS, M <= SMALL) in TF32_MID_ROWS)
    medium = hopper16 and preset is None and not skinny and min(M, N) > SMALL
    medium_tf32 = (target == "sm_90" and dtype == "tf32" and preset is None and a_layout == "row" and min(M, N) > SMALL
                   and not (skinny32 or mid_tf32))
    wgmma = preset["instruction"] if preset is not None else "wgmma" if medium or f32_parts or mid_tf32 or medium_tf32 \
        else None
    transpose = (preset is not None and dtype == "tf32" and target == "sm_90" and (a_layout, b_layout) != ("row", "col")
                 and (b_layout == "col" or M >= PRETRANSPOSE_MIN) and (a_layout == "row" or N >= PRETRANSPOSE_MIN))
    # An MN-major operand through registers where the register kernel loads without spills: a row-major B (A
    # row-major as it is, A column-major copied K-major first), or A beside a column-major B. Per layout: (the
    # spec's fields, the register kernel's; that kernel takes A in B's layout)
    register_path = {("row", "row"): (TF32_REGISTER_B, TF32_REGISTER_B), ("col", "row"): (TF32_COPY_A, TF32_REGISTER_B),
                     ("col", "col"): (TF32_REGISTER_A, TF32_REGISTER_A)}.get((a_layout, b_layout))
    in_registers = (preset is not None and dtype == "tf32" and target == "sm_90" and register_path is not None
                    and loads_without_spills(GemmSpec(**{**base, **preset, "a_layout": b_layout, **register_path[1]})))
    if in_registers:
        transpose = False
    registers_fields = register_path[0] if in_registers else {}
    if tuned is not None and wgmma is not None and tuned.instruction != wgmma:
        # the autotuner searches mma.sync specs unless asked for wgmma: the wgmma kernel measured faster
        why.append(f"the autotuner's {tuned.instruction} spec skipped for the faster {wgmma} kernel")
        tuned = None
    elif tuned is not None and transpose and not tuned.pretranspose:
        why.append("the autotuner's spec skipped: it feeds the MN-major tf32 operand inside the kernel, where a "
                   "K-major copy first measured faster")
        tuned = None
    if tuned is not None:
        spec = tuned.replace(epilogue=epilogue, out_dtype=out_dtype, **({"atom": base["atom"]} if mixed_fp8 else {}))
        why.append("tile from the autotuner's cache for this GPU and shape bucket")
    elif preset is not None:
        fused = dtype in ("f16", "bf16") and not epilogue.is_plain and (epilogue.residual or K <= PINGPONG_MAX_K)
        spec = GemmSpec(**{**base, **preset, **(PINGPONG if fused else {}), **({"pretranspose": True} if transpose else {}),
                           **registers_fields})
        # fp8: promoted every k-tile (cuBLASLt's error) on 128x192 tiles over large areas, else 128x128,
        # where the loaded kernel keeps its registers (the runtime had ptxas assemble it); else the preset
        wide = every_k_tile = False
        if dtype in FP8 and spec.warp_specialized:
            tries = ([spec.replace(tile=FP8_WIDE_TILE)] if M * N >= FP8_WIDE_MIN_AREA and K >= FP8_WIDE_MIN_K else []) \
                + [spec]
            chosen = _promoted_every_k_tile(tries)
            if chosen is not None:
                spec, every_k_tile, wide = chosen, True, tuple(chosen.tile) == FP8_WIDE_TILE
        promoted = "every k-tile" if spec.promote == 1 else f"every {spec.promote} k-tiles"
        why.append(f"large problem on {target}: the fastest {dtype} kernel measured on the H200 "
                   f"({spec.instruction}, {spec.tile.m}x{spec.tile.n} tiles"
                   + (", warp-specialized" if spec.warp_specialized else "")
                   + (f", the fp8 products promoted to an f32 total {promoted}" if spec.promote and dtype in FP8 else "")
                   + (", the epilogue through TMA stores" if spec.store == "tma" else "")
                   + f", target {spec.target})")
        if wide:
            why.append(f"fp8 over {M} x {N} outputs and K = {K}: 128x192 tiles (fewer bytes per product, a fuller last "
                       f"wave), assembled by ptxas, which gives the math warpgroups the registers setmaxnreg moves to "
                       f"them (the driver's JIT spills this kernel)")
        if every_k_tile:
            why.append("fp8 promoted every k-tile (128 products), as cuBLASLt does: its error, "
                       + ("two accumulators taking turns" if spec.frag_buffers == 2 else "the warpgroups staggered by "
                          "half a k-tile") + ", with the registers ptxas's assembly gives the math warpgroups (the "
                       "driver's JIT alone spills this kernel)")
        elif dtype in FP8 and spec.warp_specialized and spec.promote > 1:
            why.append(f"fp8 promoted every {spec.promote} k-tiles, 0.4-0.5% above cuBLASLt's error: every k-tile "
                       f"(its error) needs the registers ptxas's assembly gives the kernel (the driver's JIT spills "
                       f"it), and "
                       + ("no ptxas is installed (the CUDA toolkit, `pip install nvidia-cuda-nvcc`, or Triton's copy)"
                          if find_ptxas() is None else "it did not load here without spilling (no GPU, or it spilled)"))
        if spec.splits_operands:
            why.append(f"f32 on wgmma: first kernels split A and B into tf32 parts side by side along K, multiplied "
                       f"as one tf32 product over three times K and added into an f32 total every {spec.promote} k-tiles "
                       f"(error below cuBLAS f32's, 2.3-2.6x its speed on the H200)")
        if in_registers and a_layout == "row":
            why.append("tf32 A and B row-major: C^T = B^T A^T with B's k-steps loaded from its TMA stages into "
                       "registers and rounded (wgmma reads tf32 only K-major from shared memory); one launch, measured "
                       "on the H200 as fast as the K-major kernel and faster than copying B K-major first")
        elif in_registers and b_layout == "row":
            why.append("tf32 A column-major, B row-major: a first kernel copies A K-major, then the kernel of A and B "
                       "row-major runs (C^T = B^T A^T, B's k-steps into registers, rounded); measured on the H200 "
                       "faster than copying both operands first")
        elif in_registers:
            why.append("tf32 A and B column-major: A's k-steps loaded from its TMA stages into registers and rounded "
                       "(wgmma reads tf32 only K-major from shared memory), B K-major by descriptor, C stored "
                       "directly; one launch, measured on the H200 faster than copying A K-major first")
        if transpose:
            why.append(f"tf32 {' and '.join(o + (' column' if o == 'A' else ' row') + '-major' for o in spec.transposed_operands)}"
                       f" (wgmma reads tf32 only K-major): a first kernel copies it K-major at memory speed, then the "
                       f"K-major kernel runs (measured faster on the H200 from {PRETRANSPOSE_MIN} rows or columns on)")
        if fused:
            why.append(f"a fused epilogue{' with a residual' if epilogue.residual else f' and K <= {PINGPONG_MAX_K}'}: "
                       "ping-pong consumers, each warpgroup on 64x256 blocks of its own, so one warpgroup's epilogue "
                       "runs while the other's wgmmas do (1.06-1.24x the cooperative kernel there, on the H200)")
        if spec.tf32_truncates:
            why.append("wgmma truncates the tf32 operands it reads from shared memory where mma.sync rounds "
                       + ("them: relative error about 2.6x cuBLAS's tf32" if spec.register_operand is None else
                          f"them ({'AB'.replace(spec.register_operand, '')}; {spec.register_operand} is rounded): "
                          f"relative error about 1.6x cuBLAS's tf32"))
    elif mid_tf32:
        wide = N // 256 >= SKINNY_WIDE_BLOCKS
        spec = GemmSpec(**{**base, "target": "sm_90a"}, instruction="wgmma", **TF32_MID_ROWS[(b_layout, wide, M <= SMALL)])
        why.append(f"tf32 with {M} rows against N = {N}: wgmma with {spec.tile.m}x{spec.tile.n}x{spec.tile.k} tiles and "
                   f"{spec.stages} stages (measured faster than the mma.sync kernels on the H200)")
    elif medium_tf32:
        fields, blocks, sms = _tf32_medium_spec(base, b_layout, M, N)
        spec = GemmSpec(**{**base, "target": "sm_90a"}, instruction="wgmma", **fields)
        why.append(f"medium tf32 product on {target}: the warp-specialized wgmma kernel with {spec.tile.m}x{spec.tile.n}"
                   f"x{spec.tile.k} tiles ({blocks} blocks for {sms} SMs: the largest tile that keeps half of them "
                   f"busy, else the smallest)"
                   + (", B's k-steps into registers (C^T = B^T A^T, B rounded)" if spec.register_operand == "B" else "")
                   + "; measured 0.87-1.24x cuBLAS tf32 on the H200 where mma.sync ran 0.32-0.53x")
    elif f32_parts:
        few = _blocks128(M, N) < MEDIUM_BLOCKS
        spec = GemmSpec(**{**base, "target": "sm_90a"}, instruction="wgmma", **(F32_PARTS_SMALL if few else {}))
        why.append(f"f32 on {target}, {_blocks128(M, N)} blocks of 128x128: A and B split into tf32 parts side by side "
                   f"along K, one tf32 wgmma product over three times K with {spec.tile.m}x{spec.tile.n}x{spec.tile.k} "
                   f"tiles, added into an f32 total every {spec.promote} k-tiles (measured faster than mma.sync's 3xTF32 "
                   f"on the H200 from {F32_PARTS_MIN} rows, columns and K and 1024^3 multiply-adds on)")
    elif skinny_fp8:
        if M <= SKINNY_SHORT or (M <= SMALL and N <= FP8_SWAP_MAX_N):
            deep = K >= FP8_FEW_ROWS_DEEP_K and N >= FP8_FEW_ROWS_DEEP_N
            spec = GemmSpec(**{**base, "target": "sm_90a"}, instruction="wgmma", stages=12 if deep else 8,
                            **{**FP8_FEW_ROWS, "tile": (16 if M <= SKINNY_SHORT else 32, 64, 128)})
            how = ("computing C^T = B^T A^T (the rows as wgmma's n), promoted every k-tile, two accumulators taking "
                   "turns (cuBLASLt's error)")
        else:
            wide = -(-M // 64) * -(-N // 128) >= SKINNY_WIDE_BLOCKS
            spec = GemmSpec(**{**base, "target": "sm_90a"}, instruction="wgmma", warps=(4, 1),
                            **(FP8_SKINNY_WIDE if wide else FP8_SKINNY_NARROW))
            chosen = _promoted_every_k_tile([spec])
            spec = chosen or spec
            how = ("promoted every k-tile, two accumulators taking turns (cuBLASLt's error)" if chosen else
                   f"promoted every {spec.promote} k-tiles (every k-tile, cuBLASLt's error, where ptxas assembles the "
                   f"kernel without spills: " + ("no ptxas is installed" if find_ptxas() is None else
                                                 "it did not load so here") + ")")
        why.append(f"fp8 decoding's product on {target} (M = {M} rows against N = {N}): {spec.instruction} with "
                   f"{spec.tile.m}x{spec.tile.n}x{spec.tile.k} tiles and {spec.stages} stages keeps more of the weight "
                   f"in flight, {how} (measured on the H200)")
    elif skinny:
        if M <= 16 and N // 256 >= SKINNY_WIDE_BLOCKS and b_layout == "col" and epilogue.bias != "row":
            spec = GemmSpec(**{**base, "target": "sm_90a"}, instruction="wgmma", **SKINNY_SWAPPED)
        elif M <= 16 and N // 256 >= SKINNY_WIDE_BLOCKS:
            spec = GemmSpec(**base, tile=(64, 128, 64), warps=(2, 2), stages=3)
        elif M <= SKINNY_SHORT and N // 256 < SKINNY_WIDE_BLOCKS and b_layout == "col" and epilogue.bias != "row":
            spec = GemmSpec(**{**base, "target": "sm_90a"}, instruction="wgmma", tile=(_skinny_rows(M), 64, 128),
                            **SKINNY_SWAPPED_NARROW)
        elif M <= SKINNY_SHORT and N // 256 < SKINNY_WIDE_BLOCKS:
            spec = GemmSpec(**base, tile=(_skinny_rows(M), 64, 128), warps=(1, 4), stages=6)
        elif M > SMALL and N // 256 >= SKINNY_WIDE_BLOCKS:   # a 128-row tile holds all of M
            spec = GemmSpec(**{**base, **PRESETS[(target, dtype)]})
        elif M > SMALL and _blocks128(M, N) >= MEDIUM_BLOCKS:
            spec = GemmSpec(**{**base, "target": "sm_90a"}, instruction="wgmma", tile=(128, 128, 64), warps=(8, 1),
                            stages=4)
        elif N // 256 >= SKINNY_WIDE_BLOCKS:
            spec = GemmSpec(**{**base, "target": "sm_90a"}, instruction="wgmma", tile=(64, 256, 64), warps=(4, 1),
                            stages=5, persistent=False)
        else:
            spec = GemmSpec(**{**base, "target": "sm_90a"}, instruction="wgmma", tile=(64, 128, 128), warps=(4, 1),
                            stages=4, persistent=False)
        why.append(f"skinny product on {target} (M = {M} rows against N = {N}): {spec.instruction} with "
                   f"{spec.tile.m}x{spec.tile.n}x{spec.tile.k} tiles and {spec.stages} stages"
                   + (" computing C^T = B^T A^T (the rows as wgmma's n)" if spec.swap_ab else "")
                   + " keeps more of B in flight (measured on the H200)")
    elif skinny32:
        wide = N // 256 >= SKINNY_WIDE_BLOCKS
        tile, stages = ((_skinny_rows(M), 128, 64), 4) if wide else ((_skinny_rows(M), 64, 64), 6)
        spec = GemmSpec(**base, tile=tile, warps=(1, 4), stages=stages)
        why.append(f"skinny {dtype} product on {target} (M = {M} rows against N = {N}): {tile[0]}-row tiles hold M, "
                   f"{tile[0]}x{tile[1]}x{tile[2]} with four warps along N and {stages} stages keep more of B in flight "
                   f"(measured on the H200)")
    elif skinny_tf32:   # (run 100: 48 and 64 x 8192 x 8192 0.40 -> 0.74x cuBLAS tf32, from 64x64x32 with 3 stages)
        spec = GemmSpec(**base, tile=(64, 64, 64), warps=(2, 4), stages=6)
        why.append(f"skinny tf32 product on {target} (M = {M} rows against N = {N}): 64x64x64 tiles, eight warps and "
                   f"6 stages keep more of B in flight (measured on the H200)")
    elif medium and long_k(M, N, K) and _blocks128(M, N) < MEDIUM_BLOCKS:
        spec = GemmSpec(**{**base, "target": "sm_90a"}, instruction="wgmma", tile=(64, 128, 128), warps=(4, 1),
                        stages=4, persistent=False)
        why.append(f"medium problem with a long K on {target} (K = {K} >= {LONG_K} x max(M, N)): one CTA per "
                   f"64x128 block with 128-deep k-tiles, 4 stages, keeps more of K in flight per block (measured on "
                   f"the H200)")
    elif medium:
        blocks = _blocks128(M, N)
        tile, warps, stages = ((128, 128, 64), (8, 1), 4) if blocks >= MEDIUM_BLOCKS else ((64, 128, 64), (4, 1), 6)
        spec = GemmSpec(**{**base, "target": "sm_90a"}, instruction="wgmma", tile=tile, warps=warps, stages=stages)
        why.append(f"medium problem on {target} ({blocks} blocks of 128x128): the warp-specialized wgmma kernel "
                   f"with {tile[0]}x{tile[1]}x{tile[2]} tiles and {stages} stages (measured on the H200)")
    elif min(M, N) <= SMALL:
        try:
            spec = GemmSpec(**base, tile=(64, 64, 32 if dtype in ("tf32", "f32") else 64), warps=(2, 2))
            why.append(f"small {'M' if M <= N else 'N'} ({min(M, N)}): 64x64 tiles waste less of each tile")
        except Exception:
            spec = GemmSpec(**base)
            why.append("default tile")
    else:
        spec = GemmSpec(**base)
        why.append("default tile for this dtype (no tuned entry)")
    unsplit = _unsplit_reason(spec, M, N, K)
    if unsplit:
        why.append(unsplit)
    why.append(f"layouts {a_layout}/{b_layout} as the arrays are stored, target {target}")
    return Choice(spec, "; ".join(why))


def _unsplit_reason(spec, M: int, N: int, K: int) -> str:
    """Why K is not split, for a product on Hopper whose blocks leave SMs idle (under two
    waves) with K long enough to split (4 k-tiles or more): split-K and stream-K were built and
    measured there, and lost to the kernels chosen on the shapes measured."""
    if not spec.target.startswith("sm_90") or spec.split_k > 1 or spec.stream_k or spec.batched:
        return ""
    rows, cols = (N, M) if spec.swap_ab else (M, N)
    blocks, sms = -(-rows // spec.tile.m) * -(-cols // spec.tile.n), _sm_count()
    if blocks >= 2 * sms or K < 4 * spec.tile.k:
        return ""
    idle = sms - blocks if blocks < sms else 2 * sms - blocks
    return (f"K not split although {blocks} blocks leave {idle} of {sms} SMs idle in the last wave: split-K and "
            f"stream-K (GemmSpec(split_k=), stream_k=True) ran slower than the kernels chosen on the shapes measured "
            f"on the H200, their f32 partial sums' trip through memory costing more than the idle SMs "
            f"(docs/perf_notes.md sections 24, 26, 44)")


def _tuned(dtype, a_layout, b_layout, M, N, K, out_dtype):
    if not runtime.gpu_available():
        return None
    info = runtime.device_info()
    try:
        return tuned.lookup(dtype, a_layout, b_layout, M, N, K, out_dtype, info.name, info.driver_version)
    except Exception:  # a damaged or foreign tuning cache must not break a matmul
        return None


_narrowed: set = set()   # (operand, its dtype, the output's) already warned of


def _as_out_dtype(x, spec, name: str):
    """Host epilogue operands are converted to the output dtype (the epilogue adds them in it);
    GPU ones must match. A wider operand that the conversion to a 16-bit output rounds is said
    once (PrecisionWarning): where it cancels the product, its low bits were the answer."""
    if x is None or not isinstance(x, np.ndarray):
        return x
    check_real_arrays(**{name: x})
    want = numpy_dtype(spec.out_dtype)
    if x.dtype == want:
        return x
    y = x.astype(want)
    key = (name, x.dtype.str, want.str)
    if want.itemsize == 2 and x.dtype.itemsize > 2 and key not in _narrowed and \
            not np.array_equal(y.astype(x.dtype), x, equal_nan=True):
        _narrowed.add(key)
        warn(f"{name} is {x.dtype} and is rounded to the {want} output's dtype before it is added (the fused "
             f"epilogue adds it in the output's dtype); pass {name}.astype({want}) to say so, or out_dtype='f32' to "
             f"keep it", PrecisionWarning)
    return y


# ---- the remembered choices (GPU arrays) -------------------------------------------------

_chosen: dict = {}          # choice key (what explain reads) -> GemmKernel
_exact: dict = {}           # the arrays' exact description -> GemmKernel: a dict lookup per call
_checked = [0.0, None]      # when the tuned store was last looked at, and its generation then
RECHECK_S = 1.0             # how often a change of the tuned store on disk is looked for
EXACT_MAX = 4096            # exact descriptions remembered (shapes that vary call to call)
_stacks: dict = {}          # a stack call's description -> its batched GemmKernel, or None (not batched)
_host_specs: dict = {}      # numpy operands' choice key -> explain's spec (matmul's general path)


def _store_unchanged() -> bool:
    """False (and every remembered choice forgotten) when the tuned store changed on disk;
    looked at no more than once per RECHECK_S."""
    now = time.monotonic()
    if now - _checked[0] > RECHECK_S:
        _checked[0] = now
        gen = tuned.generation()
        if gen != _checked[1]:
            _checked[1] = gen
            _chosen.clear()
            _exact.clear()
            _stacks.clear()
            _host_specs.clear()
            return False
    return True


def _host_spec(A, B, out, bias, activation, residual, allow_tf32, scales):
    """explain's spec for numpy operands, remembered per choice key (what explain reads of them),
    or None where explain must look (its first call, or anything it may refuse)."""
    if not (type(A) is np.ndarray and type(B) is np.ndarray and A.ndim == 2 == B.ndim and A.shape[1] == B.shape[0] > 0):
        return None
    if any(x is not None and type(x) is not np.ndarray for x in (out, bias, residual, *scales)):
        return None
    (M, K), N = A.shape, B.shape[1]
    axis = None if bias is None else bias_axis(bias, M, N)
    if bias is not None and axis is None:
        return None   # (explain says what is wrong)
    tf32 = _tf32_key(allow_tf32, A.dtype == np.float32)
    # (the other arrays by what explain checks of them: dtype and whether their lengths fit)
    fits = (None if out is None else (out.dtype, out.shape == (M, N)),
            None if bias is None else (bias.dtype, axis),
            None if residual is None else (residual.dtype, residual.shape == (M, N)),
            *(None if x is None else (x.dtype, x.shape == (n,)) for x, n in zip(scales, (M, N))))
    key = ("host", A.dtype, B.dtype, _layout(A), _layout(B), _k_major(A, 1), _k_major(B, 0), size_class(M, N, K),
           fits, activation, tf32, _target())
    _store_unchanged()
    spec = _host_specs.get(key)
    if spec is None:
        spec = _host_specs[key] = explain(A, B, bias=bias, activation=activation, residual=residual, out=out,
                                          allow_tf32=allow_tf32, scale_a=scales[0], scale_b=scales[1]).spec
    return spec


def _fast_matmul(lib, A, B, out, bias, activation, residual, alpha, beta, allow_tf32, scales=NO_SCALES,
                 out_name=None):
    """matmul for PyTorch / CuPy arrays through the remembered choice; None when the general
    path must run (its first call, or anything unusual). out_name: out_dtype's name where out is
    None (the kernel then makes an output of its spec's out_dtype)."""
    if interop.library(B) is not lib:
        return None
    pa, pb = lib.probe(A), lib.probe(B)
    if not pa or not pb:
        return None
    if len(pb[SHAPE]) != 2:
        return _fast_stack(lib, A, B, out, pa, pb, bias, activation, residual, alpha, beta, allow_tf32, scales)
    stack = None
    if len(pa[SHAPE]) != 2:   # activations (..., M, K) @ W: the probe of the taller matrix their rows make
        stack = pa[SHAPE][:-1]
        if len(stack) < 2 or residual is not None or scales is not NO_SCALES or (
                bias is not None and bias_axis(bias, -1, pb[SHAPE][1]) != "col"):   # (a stack's bias is per column)
            return None
        pa = batch.folded_probe(pa)
        if pa is None:
            return None
    pc = None
    if out is not None:
        pc = interop.library(out) is lib and lib.probe(out)
        if not pc:
            return None
        if stack is not None:
            if pc[SHAPE][:-1] != stack:
                return None
            pc = batch.folded_probe(pc)
            if pc is None:
                return None
    tf32 = _tf32_key(allow_tf32, pa[DTYPE] == "float32")
    exact = (pa[SHAPE], pa[STRIDES], pa[DTYPE], pa[DEVICE], pb[SHAPE], pb[STRIDES], pb[DTYPE],
             pc[DTYPE] if pc else out_name, None if bias is None else bias.shape, activation, residual is not None,
             tf32, *_scale_kinds(scales))
    kernel = _exact.get(exact) if _store_unchanged() else None
    if kernel is None:
        kernel = _choose(lib, A, B, out, pa, pb, pc, bias, activation, residual, tf32, scales, out_name)
        if kernel is None:
            return None
        if len(_exact) >= EXACT_MAX:
            _exact.clear()
        _exact[exact] = kernel
    c = kernel.fast_call.run(lib, pa, pb, out, pc, bias if bias is None else bias_vector(bias), residual, alpha, beta,
                             True, scales)
    return c if stack is None or out is not None or c is None else c.reshape(*stack, c.shape[1])


def _fast_stack(lib, A, B, out, pa, pb, bias, activation, residual, alpha, beta, allow_tf32, scales):
    """matmul for a stack of products on PyTorch / CuPy arrays through its remembered batched
    kernel; None when the general path must run (first call, matrix by matrix, anything unusual)."""
    if residual is not None or scales is not NO_SCALES or len(pa[SHAPE]) < 2 or len(pb[SHAPE]) < 3:
        return None
    found = _stack_key(lib, pa, pb, out, bias, activation, allow_tf32)
    if found is None:
        return None
    exact, shape, count, fa, fb, fc = found
    kernel = _stacks.get(exact) if _store_unchanged() else None
    if kernel is None:   # (the general path chooses, and runs, and remembers for the next call)
        return None
    if not kernel.spec.batched:
        return _fast_loop(lib, kernel, shape, count, fa, fb, out, fc, bias_vector(bias), alpha, beta)
    c = kernel.batched_call.run(lib, fa, fb, out, fc, count, bias_vector(bias), None, alpha, beta)
    return c if c is None or out is not None else c.reshape(*shape, fa[SHAPE][1], fb[SHAPE][2])


def _fast_loop(lib, kernel, shape, count, fa, fb, out, fc, bias, alpha, beta):
    """A stack's products one by one through the 2-D kernel's prepared launch, each matrix's probe
    made from the stack's (no views); None (nothing launched) when it cannot take them."""
    if beta:   # (None after a partial run would let the general path read a C already updated)
        return None
    fast, spec = kernel.fast_call, kernel.spec
    M, N = fa[SHAPE][1], fb[SHAPE][2]
    if out is None:
        out = lib.empty(shape + (M, N), fast.out_dtype, fa[DEVICE])
        fc = batch.flat_probe(lib.probe(out), count)
    sizes = (arch_dtype(spec.dtype).bytes, arch_dtype(spec.b_dtype).bytes, arch_dtype(spec.out_dtype).bytes)
    for b in range(count):
        pa, pb, pc = ((p[PTR] + b * p[STRIDES][0] * e, tuple(p[SHAPE][1:]), tuple(p[STRIDES][1:]), p[DTYPE], p[DEVICE])
                      for p, e in zip((fa, fb, fc), sizes))
        if fast.run(lib, pa, pb, out, pc, bias, None, alpha, beta, True) is None:
            return None
    return out


def _stack_key(lib, pa, pb, out, bias, activation, allow_tf32):
    """(the remembered choice's key, batch shape, count, flat probes of A, B, out) of a stack of
    products on GPU arrays (batch.stack_of_products), or None."""
    found = batch.stack_of_products(pa, pb)
    if found is None:
        return None
    shape, count, fa, fb = found
    fc = None
    if out is not None:
        pc = interop.library(out) is lib and lib.probe(out)
        if not pc or tuple(pc[SHAPE]) != shape + (fa[SHAPE][1], fb[SHAPE][2]):
            return None
        fc = batch.flat_probe(pc, count)
        if fc is None or fc[SHAPE][0] != count:
            return None
    tf32 = _tf32_key(allow_tf32, pa[DTYPE] == "float32")
    exact = ("stack", fa[SHAPE], fa[STRIDES], fa[DTYPE], fa[DEVICE], fb[SHAPE], fb[STRIDES], fb[DTYPE], fb[DEVICE],
             fc[DTYPE] if fc else None, None if bias is None else tuple(bias.shape), activation, tf32)
    return exact, shape, count, fa, fb, fc


def _scale_kinds(scales) -> tuple:
    """What each of matmul's (scale_a, scale_b) is to the kernel: None (none, or folded into
    alpha), "vector" (per row / column), "scalar" (one f32 in device memory)."""
    if scales is NO_SCALES:   # (the common call: no generator on the hot path)
        return NO_SCALES
    return tuple(None if x is None else "vector" if len(x.shape) == 1 and int(x.shape[0]) > 1 else "scalar"
                 for x in scales)


def _choose(lib, A, B, out, pa, pb, pc, bias, activation, residual, tf32, scales=NO_SCALES, out_name=None):
    """The kernel for these probed arrays: remembered per choice key, else explain's."""
    if len(pa[SHAPE]) != 2 or len(pb[SHAPE]) != 2:
        return None
    (M, K), N = pa[SHAPE], pb[SHAPE][1]
    if K == 0:
        return None   # (the general path multiplies columns of zeros instead)
    sa, sb = pa[STRIDES], pb[STRIDES]
    axis = None
    if bias is not None:
        axis = bias_axis(bias, M, N)
        if axis is None:
            return None
    key = (pa[DTYPE], pb[DTYPE], pc[DTYPE] if pc else out_name, sa[1] == 1, sa[0] == 1, sb[1] == 1, sb[0] == 1,
           size_class(M, N, K), axis, activation, residual is not None, pa[DEVICE], tf32, *_scale_kinds(scales))
    kernel = _chosen.get(key)
    if kernel is None:
        choice = explain(A, B, bias=bias, activation=activation, residual=residual, out=out, allow_tf32=tf32,
                         scale_a=scales[0], scale_b=scales[1], out_dtype=out_name)
        kernel = _chosen[key] = compile_gemm(choice.spec)
    return kernel


def matmul(A, B, *, bias=None, activation=None, residual=None, alpha=1.0, beta=0.0, out=None,
           allow_tf32=None, device=None, scale_a=None, scale_b=None, out_dtype=None):
    """out = act(alpha * A @ B + beta * out + bias) + residual, on numpy (through the GPU or the
    emulator), PyTorch or CuPy arrays; see the module docstring. The result has out's dtype,
    or out_dtype (a torch or numpy dtype, or 'bf16', 'f16', 'f32'), or else the inputs' dtype
    (float32 for float32 inputs, bfloat16 for fp8 ones). fp8 operands (float8_e4m3fn,
    float8_e5m2) are taken as torch._scaled_mm takes them, A row-major and B column-major;
    scale_a and scale_b are per-tensor (numbers or one-element tensors, multiplying alpha) or
    per row of A / per column of B (f32 vectors of length M / N, applied in the epilogue)."""
    scales = NO_SCALES
    if out is None and out_dtype is not None and beta != 0:   # (the new C would be uninitialised memory)
        raise LaunchError("beta != 0 reads C from out=; pass out (out_dtype= makes a new C, whose contents are "
                          "undefined)")
    out_name = None   # out_dtype alone on two GPU matrices: the remembered kernel makes the output
    if out_dtype is not None and out is None and device is None and len(getattr(A, "shape", ())) == 2 == len(
            getattr(B, "shape", ())) and interop.library(A) is not None:
        out_name = _out_dtype_name(out_dtype)
    else:
        out = _out_for(A, B, out, out_dtype)
    if scale_a is not None or scale_b is not None:   # per-tensor: into alpha; per row / column: the epilogue's
        if batch.is_stack(A, B):
            if not (_host_number(scale_a) and _host_number(scale_b)):   # (numbers: alpha, then one launch)
                return _stacked(A, B, bias=bias, activation=activation, residual=residual, alpha=alpha, beta=beta,
                                out=out, allow_tf32=allow_tf32, device=device, scale_a=scale_a, scale_b=scale_b)
            alpha = alpha * _scale(scale_a, "scale_a") * _scale(scale_b, "scale_b")
            scale_a = scale_b = None
    if scale_a is not None or scale_b is not None:
        rows = int(A.shape[0]) if hasattr(A, "shape") and len(A.shape) == 2 else 0
        cols = int(B.shape[1]) if hasattr(B, "shape") and len(B.shape) == 2 else 0
        (va, fa), (vb, fb) = _split_scale(scale_a, rows, "scale_a"), _split_scale(scale_b, cols, "scale_b")
        alpha = alpha * fa * fb
        if va is not None or vb is not None:
            scales = (va, vb)
    if device is None:
        lib = interop.library(A)
        if lib is not None:
            done = _fast_matmul(lib, A, B, out, bias, activation, residual, alpha, beta, allow_tf32, scales, out_name)
            if done is not None:
                return done
    _check_out(out)
    if out_name is not None:
        out = _empty_out(A, B, out_name)
    if batch.is_stack(A, B):
        c = _stacked(A, B, bias=bias, activation=activation, residual=residual, alpha=alpha, beta=beta, out=out,
                     allow_tf32=allow_tf32, device=device)
        # (a vector times a vector: numpy.matmul gives a numpy scalar, PyTorch a 0-d tensor)
        return c[()] if out is None and isinstance(c, np.ndarray) and c.ndim == 0 else c
    if len(getattr(A, "shape", ())) == 2 and len(getattr(B, "shape", ())) == 2 and A.shape[1] == 0 == B.shape[0]:
        A, B = zero_operands(A, B)   # numpy's A @ B is zeros: the epilogue of a product of zeros
    spec = _host_spec(A, B, out, bias, activation, residual, allow_tf32, scales)
    if spec is None:
        spec = explain(A, B, bias=bias, activation=activation, residual=residual, out=out, allow_tf32=allow_tf32,
                       scale_a=scales[0], scale_b=scales[1]).spec
    if device is None and isinstance(A, np.ndarray) and not runtime.gpu_available():
        M, K = A.shape
        refuse_long_emulation(M, B.shape[1], K)
    if isinstance(A, np.ndarray) and spec.dtype == "f32":
        A, B = A.astype(np.float32, copy=False), B.astype(np.float32, copy=False)
    kernel = compile_gemm(spec)
    return kernel(A, B, out=out, alpha=alpha, beta=beta, bias=_as_out_dtype(bias_vector(bias), spec, "bias"),
                  residual=_as_out_dtype(residual, spec, "residual"), device=device, repitch=True,
                  scale_a=scales[0], scale_b=scales[1])


# Stacks whose products are not folded into one (gemm/batch.py) run as one launch of a batched
# kernel. On Hopper, 16-bit stacks take the warp-specialized TMA kernel walking every block of
# every matrix (template.TmaStack: 3-D tensor maps, so any M, N, K, broadcast operands and
# strided stacks), with the first of STACK_TILES that gives every SM a CTA (else the last, which
# gives the most): measured on the H200 with stacks of whole tiles (run 140, bf16, x torch.matmul)
# 0.93 / 0.78 / 0.92 / 0.99 / 0.95 / 1.03 / 0.95 / 1.00 at 64 x 128^2 x 64, 64 x 256^2 x 128,
# 32 x 512^2 x 64, 16 x 1024^3, 8 x 2048^3, 4 x 4096^3, 32 x 1024^2 x 128, 96 x 512^3; and on the
# stacks 2-D maps could not take (runs 172-173): 16 x 1000^3 0.81 (0.59 on the cp.async kernel),
# A's matrices apart 0.97 (0.64), a broadcast A 0.92-0.94 (0.58). Other stacks (a bias per row, other
# dtypes or GPUs) take the cp.async batched kernel (one grid row per matrix; 0.4-0.6x
# between 256 and 2048, run 134), unless each product holds at least STACK_LOOP_WORK multiply-adds
# and the 2-D kernel of one is a persistent TMA kernel: then matrix by matrix (run 133: 8 x 2048^3
# 0.78 against 0.72 batched). Stacks whose products alone would take another kernel (few rows, short K) take
# it too: on an H100 (run 191, GPU time x torch.matmul) decode-like 32 x (1 x 128 @ 128 x 4096) 0.54 -> 0.96,
# 32 x (1 x 4096 @ 4096 x 128) 0.58 -> 0.82, 32 x (16 x 128 @ 128 x 4096) 0.55 -> 0.98, 64 x (1 x 64 @ 64 x 2048)
# 0.43 -> 0.91, 8 x (128 x 128 @ 128 x 4096) 0.67 -> 1.00, with the 64-row tile where M is at most 64.
STACK_LOOP_WORK = 2 ** 33
STACK_TILES = (dict(tile=(128, 256, 64), warps=(8, 1), stages=4), dict(tile=(128, 128, 64), warps=(8, 1), stages=4),
               dict(tile=(64, 128, 64), warps=(4, 1), stages=6))
# Stacks of few blocks (decoding's products: a few rows per head, N of 64-128) are bound by each busy SM's
# tensor cores, which multiply whole 64-row tiles however few rows are real: 64x64 tiles put twice the SMs to
# work. Measured on the H200 (runs 201-202, GPU time of CUDA-graph replays, bf16, BxMxNxK, 64x128 s6 -> 64x64
# s8): 32x16x128x4096 19.4 -> 14.5-14.7 us, 32x1x128x4096 19.3 -> 15.8, 64x1x64x2048 13.3-13.6 -> 10.3-10.4,
# 8x128x128x4096 19.1 -> 12.6, 32x64x128x4096 19.9 -> 16.8, 8x1x128x4096 18.9 -> 12.7; but 32x16x256x4096
# (128 such blocks) 21.1 -> 23.2. Eight stages: then the only count whose stage index was not a float reciprocal
# on every k-tile (docs/perf_notes.md 43); with that fixed (run 207) 6 / 8 / 9 / 12 stages ran 16.1 / 14.6 / 14.7 /
# 15.0 us on 32x16x128x4096.
STACK_NARROW = dict(tile=(64, 64, 64), warps=(4, 1), stages=8)
# Stacks of at most 32 rows per product (decoding's scores and scores @ values) swap the operands: the
# kernel computes C^T = B^T A^T, N's 64 columns filling wgmma's 64 rows and the product's few rows its
# n (16 or 32), so a stage holds 16 or 32 rows of A instead of 64 (10 KB instead of 16 with 64-deep
# k-tiles), and twice the stages are in flight: these stacks wait on memory, not on the tensor cores.
# Measured on the H200 (runs 224-225, GPU time of CUDA-graph replays rotating operands past L2, bf16, BxMxNxK,
# the 64x64 tile with 8 stages -> swapped, 16 stages; torch.matmul): 32x16x128x4096 15.0 -> 13.3 us
# (11.8), 32x1x128x4096 15.9 -> 12.3 (11.8), 64x1x64x2048 10.5 -> 8.6 (7.4), 32x8x128x8192 26.9 -> 20.6
# (19.7), 32x16x128x16384 42.5 -> 38.9 (37.6), 8x16x128x16384 19.4 (8 slices) -> 17.2 (4 slices; 24.4);
# 32 rows, 12 stages: 32x32x128x4096 15.3 -> 14.6 (13.5). Sixteen stages beat 12, 14 and 18 on every
# shape (12 / 14 / 16 / 18 on 32x16x128x4096: 13.6 / 13.8 / 13.3 / 14.3). Split K pays only where the
# blocks keep at most a quarter of the SMs busy (32x16x128x16384: 1 / 2 / 4 slices 38.9 / 41.9 / 46.5).
# `tilegen bench --stacks` (run 226, base / head x torch.matmul): 32x1x128x4096 0.77 -> 1.00, 32x16x128x4096
# 0.84 -> 0.93, 64x1x64x2048 0.79 -> 0.90, 32x8x128x8192 0.79 -> 0.96, 4x16x8192x8192 0.88 -> 0.95; but at
# K = 128 (decoding's scores, 4096 keys) 32x1x4096x128 0.81 -> 0.72 and 32x16x4096x128 0.88 -> 0.77: a block of
# two k-tiles has no use for a deep ring. So from STACK_SWAP_MIN_K on (a ring of 16 k-tiles).
STACK_SWAPPED = {16: dict(tile=(16, 64, 64), warps=(1, 4), stages=16, swap_ab=True, store="direct"),
                 32: dict(tile=(32, 64, 64), warps=(1, 4), stages=12, swap_ab=True, store="direct")}
STACK_SWAP_MIN_K = 1024
# Decoding's scores (q @ k^T: K = the head's 64-128 dimensions, N = the context) with at most 16 rows per
# product: the swapped kernel with 128 columns a block (two warpgroups) and one 128-deep k-tile, 6 stages.
# Measured on the H200 (run 237, CUDA-graph replays, bf16, B x M x N x K, B row-major / as k^T; the 64x128 tile
# with 6 stages -> this; torch.matmul): 32x1x4096x128 14.2 -> 13.1 (10.6) / 14.6 -> 13.0 (12.8), 32x1x16384x128
# 43.2 -> 37.5 (36.0) / 43.2 -> 38.0 (36.2), 8x16x8192x128 9.5 -> 8.9 (7.9) / 9.4 -> 8.7 (7.9), 32x16x4096x128
# 14.1 either way (12.0); the 16-stage swapped tile above was slower at this K (16.2-16.5 us on 32x1x4096x128).
STACK_SWAPPED_SHORT_K = dict(tile=(16, 128, 128), warps=(1, 8), stages=6, swap_ab=True, store="direct")
STACK_SHORT_K = 128
# Between those Ks (run 240, same method): where the 16 x 64 blocks number at most the SMs (decoding's scores @
# values over a short context), the swapped 16x64x64 tile with 4 stages: 32x1x128x256 4.03 -> 3.00 us (torch
# 2.75), 32x1x128x512 4.48 -> 3.43 (3.41), 32x16x128x512 4.59 -> 3.40 (3.28), 32x1x128x768 5.33 -> 3.91 (3.88);
# 16 stages there 3.9-4.7. With more blocks, up to K = 256, STACK_SWAPPED_SHORT_K: 32x1x4096x256 22.2 -> 19.9
# (18.7), 32x16x4096x256 21.5 -> 21.2 (20.0).
STACK_SWAPPED_FEW = dict(tile=(16, 64, 64), warps=(1, 4), stages=4, swap_ab=True, store="direct")
STACK_SHORT_K_WIDE = 256


# Split-K on a stack (the TMA stack kernel walking every block once per slice of K, the last slice
# to finish a block adding the slices): it pays where the stack has fewer blocks than SMs and long K.
# Measured on the H200 (run 210, GPU time of CUDA-graph replays, bf16, BxMxNxK, slices 1 / 2 / 4 / 8,
# torch.matmul): 8x128x128x65536 136 / 87 / 72 / 105 us (torch 91), 4x64x128x65536 124 / 69 / 44 / 35
# (16: 38; torch 91), 8x128x128x16384 37 / 27 / 24 / 40 (torch 26), 32x16x128x16384 45 / 40 / 45 / 71
# (torch 37), 8x128x128x4096 10.7 / 9.6 / 9.6 / 23 (torch 8.3), 64x1x64x2048 9.0 / 9.3 / 14.0 (torch
# 5.7). With operands rotated past L2 (run 211, slices 1 / 2): 64 blocks at K = 4096 lose (32x16x128x4096
# 14.8 / 15.1 us, 32x64x128x4096 16.8 / 18.6), 32 gain (8x128x128x4096 12.6 / 11.8), and 16 blocks take
# 8 slices of 32 k-tiles at K = 16384 (8x16x128x16384 17.2 us against 4 slices' 18.0; torch 24.0). So:
# slices of STACK_SLICE_K_TILES k-tiles or more, half that where the stack keeps at most a quarter of
# the SMs busy, at most STACK_MAX_SLICES of them, no more CTAs than SMs. (Until run 210 a second kernel
# added the slices, doubling the host's time per call: then slices of 64 k-tiles or more.)
STACK_SLICE_K_TILES = 64
STACK_MAX_SLICES = 8


def stack_blocks(stack, m: int, n: int) -> int:
    """Blocks of an m x n tile over every matrix of a stack."""
    return stack.matrices * -(-stack.M // m) * -(-stack.N // n)


def slice_k_tiles(blocks: int, sms: int) -> int:
    """The fewest k-tiles a slice of a split stack takes (the rule above)."""
    return STACK_SLICE_K_TILES // 2 if 4 * blocks <= sms else STACK_SLICE_K_TILES


def stack_split(spec, stack, sms: int) -> int:
    """Slices of K for a stack on the TMA stack kernel: 1, or where its blocks leave SMs idle and
    K is long (long-context decoding's P @ V: a few rows of each head's scores times its
    values, 16K x 128 and more), as many as the rule above gives (swapped kernels: only where
    the blocks keep at most a quarter of the SMs busy, slices of STACK_SLICE_K_TILES k-tiles)."""
    blocks = stack_blocks(stack, spec.tile.m, spec.tile.n)
    k_tiles = -(-stack.K // spec.tile.k)
    if spec.swap_ab:
        if 4 * blocks > sms:
            return 1
        return max(1, min(sms // max(blocks, 1), k_tiles // STACK_SLICE_K_TILES, STACK_MAX_SLICES))
    return max(1, min(sms // max(blocks, 1), k_tiles // slice_k_tiles(blocks, sms), STACK_MAX_SLICES))


def _sm_count() -> int:
    """The GPU's multiprocessors (an H200's without one: the count the stack tiles were chosen for)."""
    return runtime.device_info().sm_count if runtime.gpu_available() else 132


def _swapped_tiles(stack, sms: int):
    """The swapped kernel's tiles (C^T = B^T A^T, the few rows as wgmma's n) for a stack of few
    rows per product, or None: STACK_SWAPPED from STACK_SWAP_MIN_K on; below it, up to 16 rows,
    STACK_SWAPPED_FEW over a short context with few blocks, STACK_SWAPPED_SHORT_K for short K."""
    if stack.M <= max(STACK_SWAPPED) and stack.K >= STACK_SWAP_MIN_K:
        return STACK_SWAPPED[min(r for r in STACK_SWAPPED if r >= stack.M)]
    if stack.M > 16:
        return None
    few = stack_blocks(stack, *STACK_SWAPPED_FEW["tile"][:2]) <= sms
    if few and stack.K > STACK_SHORT_K:   # (scores @ values over a short context)
        return STACK_SWAPPED_FEW
    if stack.K <= (STACK_SHORT_K if few else STACK_SHORT_K_WIDE):   # (scores: one deep k-tile a block)
        return STACK_SWAPPED_SHORT_K
    return None


def _batched_spec(spec, stack):
    """The batched twin of the spec matmul picks for one product of a stack, or None where the
    stack should run matrix by matrix (operands prepared by
    first kernels, fp8 promotion, or products that hide their launches behind a faster kernel).
    16-bit stacks on Hopper take the warp-specialized TMA kernel (TmaStack), whatever kernel the
    product alone would take."""
    if spec.prepared_operands:
        return None
    if spec.target_info.sm >= 90 and spec.dtype in ("f16", "bf16") and spec.epilogue.bias != "row":
        sms = _sm_count()
        if stack.M <= STACK_TILES[-1]["tile"][0]:   # (a few rows per product: the 64-row tile wastes least)
            filling = STACK_TILES[-1:]
        else:
            filling = [t for t in STACK_TILES if stack_blocks(stack, *t["tile"][:2]) >= sms]
        if stack_blocks(stack, *STACK_NARROW["tile"][:2]) <= sms // 2:   # (few blocks: twice the SMs at work)
            filling = [STACK_NARROW]
        swapped = _swapped_tiles(stack, sms)
        if swapped is not None:   # (tried first; the others where it cannot take the stack)
            filling = [swapped, *filling]
        for tiles in (filling or STACK_TILES[-1:]):
            try:
                twin = spec.replace(**{**dict(batched=True, copy="tma", persistent=True, cluster=(1, 1), stream_k=False,
                                              pingpong=False, split_k=1, store="auto", instruction="wgmma",
                                              target="sm_90a", atom=None, frag_buffers=None, promote=None,
                                              swizzle="128B", acc_dtype="f32", swap_ab=False), **tiles})
            except SpecError:
                continue
            if stack_problem(twin, stack.M, stack.N, stack.K, stack.matrices) is None:
                split = stack_split(twin, stack, sms)
                return twin.replace(split_k=split) if split > 1 else twin
    reset = dict(batched=True, persistent=None, copy="auto", store="auto", cluster=(1, 1), split_k=1, stream_k=False,
                 pingpong=False, promote=None, swap_ab=False)
    if spec.instruction == "wgmma" and spec.dtype in ("f16", "bf16"):
        sms = _sm_count()
        for tiles in STACK_TILES:
            if stack_blocks(stack, *tiles["tile"][:2]) >= sms:
                break
        reset.update(tiles)
    for extra in ({}, {"stages": None}):   # (cp.async stages may need less shared memory)
        try:
            twin = spec.replace(**{**reset, **extra})
        except SpecError:
            continue
        if (twin.persistent, twin.copy) != (spec.persistent, spec.copy) and stack.M * stack.N * stack.K >= STACK_LOOP_WORK:
            return None
        return twin
    return None


def _first_product(flat, bias, activation, allow_tf32):
    """explain's Choice for the first product of a flat stack (batch.Flat)."""
    return explain(flat.A[0], flat.B[0], bias=bias, activation=activation, allow_tf32=allow_tf32,
                   out=None if flat.out is None else flat.out[0],
                   residual=None if flat.residual is None else flat.residual[0])


def _batched_choice(stack, flat, bias, activation, allow_tf32, first=None):
    """explain's Choice for a stack run by a batched kernel, or None (folded, or matrix by matrix;
    an empty batch: batch.run gives its empty result). `first`: _first_product's, when known."""
    if flat is None or stack.matrices == 0:
        return None
    first = first or _first_product(flat, bias, activation, allow_tf32)
    spec = _batched_spec(first.spec, stack)
    if spec is None:
        return None
    if spec.persistent:   # (whatever kernel one product alone would take: its reasons are not this kernel's)
        how = "the warp-specialized TMA kernel walking every block of every matrix, each stack through a 3-D tensor map"
        sms = _sm_count()
        blocks = stack_blocks(stack, spec.tile.m, spec.tile.n)
        wide = stack_blocks(stack, *STACK_TILES[-1]["tile"][:2])   # (blocks of the 64x128 tile)
        tiles = (f"{stack.M} rows per product: C^T = B^T A^T, {spec.tile.n} columns of N as wgmma's rows and "
                 f"{spec.tile.m} rows of A as its n, {spec.stages} stages of {spec.tile.m} + {spec.tile.n} rows"
                 if spec.swap_ab else
                 f"{blocks} blocks of 64 x 64 for {sms} SMs: the narrow tile"
                 + (f", {blocks} SMs at work rather than {wide}" if blocks > wide else "")
                 if tuple(spec.tile) == STACK_NARROW["tile"] else
                 "few rows per product: 64-row tiles" if stack.M <= STACK_TILES[-1]["tile"][0] else
                 f"the largest tile that gives each of {sms} SMs a block" if blocks >= sms else
                 f"the tile that gives the most blocks ({blocks} for {sms} SMs)")
        if spec.split_k > 1:
            k_tiles = -(-stack.K // spec.tile.k)
            per = -(-k_tiles // spec.split_k)
            last = k_tiles - (spec.split_k - 1) * per
            how += f", K in {spec.split_k} slices, added in slice order by the last to finish each block"
            tiles += (f"; {blocks} blocks for {sms} SMs and {k_tiles} k-tiles: K split in {spec.split_k} slices of "
                      f"{per} k-tiles" + (f" (the last {last})" if last != per else "")
                      + f", a slice per {STACK_SLICE_K_TILES if spec.swap_ab else slice_k_tiles(blocks, sms)} "
                        f"k-tiles at most")
        why = (f"16-bit stacks on Hopper take it{'; ' + tiles if tiles else ''}; layouts {spec.a_layout}/"
               f"{spec.b_layout} as the arrays are stored, target {spec.target}")
    else:
        how, why = "a grid row per matrix, cp.async copies", first.reason
    return Choice(spec, f"a stack of {stack.matrices} products of {stack.M} x {stack.N} x {stack.K}: one launch of a "
                        f"batched kernel ({spec.instruction}, {spec.tile.m}x{spec.tile.n} tiles, {how}); {why}")


def _described(x):
    """What a choice reads of an array: shape, strides, dtype, and for GPU arrays the device."""
    if x is None:
        return None
    p = interop.probe(x)
    if p:
        return tuple(p[SHAPE]), tuple(p[STRIDES]), p[DTYPE], p[DEVICE]
    return tuple(x.shape), getattr(x, "strides", None), str(x.dtype)


def _stacked(A, B, *, out, residual, scale_a=None, scale_b=None, **options):
    """matmul of stacks of matrices or of vectors (gemm/batch.py): one folded product, one
    launch of a batched kernel, or one product per matrix."""
    _check_out(out)
    stack = batch.plan(A, B, out=out, bias=options.get("bias"))
    if options.get("device") is None and isinstance(A, np.ndarray) and not runtime.gpu_available():
        refuse_long_emulation(stack.matrices * stack.M, stack.N, stack.K)
    if not stack.folded and scale_a is None and scale_b is None:
        flat = batch.flat(stack, A, B, out, residual)
        bias, activation, tf32 = options.get("bias"), options.get("activation"), options.get("allow_tf32")
        # (the choice remembered per description, as the 2-D fast path's: explain reads the tuned store)
        key = (stack, *map(_described, (flat and flat.A, flat and flat.B, flat and flat.out, flat and flat.residual,
                                        bias)), activation, _tf32_key(tf32, _dtype_name(A) == "float32"))
        kernel = _stacks.get(key, False) if _store_unchanged() else False
        if kernel is False:
            first = _first_product(flat, bias, activation, tf32) if flat is not None and stack.matrices else None
            choice = _batched_choice(stack, flat, bias, activation, tf32, first)
            kernel = None if choice is None else compile_gemm(choice.spec)
            if len(_stacks) >= EXACT_MAX:
                _stacks.clear()
            _stacks[key] = kernel
            lib = interop.library(A)
            fast = None
            if lib is not None and residual is None and lib.probe(A) and lib.probe(B):
                fast = _stack_key(lib, lib.probe(A), lib.probe(B), out, bias, activation, tf32)
            if fast is not None:   # the next such call: straight from the probes (_fast_stack), batched
                # or matrix by matrix through the 2-D kernel of one product
                _stacks[fast[0]] = kernel if kernel is not None else compile_gemm(first.spec) if first else None
        if kernel is not None:
            spec = kernel.spec
            a3, b3 = flat.A, flat.B
            if isinstance(a3, np.ndarray) and spec.dtype == "f32":
                a3, b3 = a3.astype(np.float32, copy=False), b3.astype(np.float32, copy=False)
            c = run_batched(kernel, a3, b3, flat.out, stack.matrices, alpha=options.get("alpha", 1.0),
                            beta=options.get("beta", 0.0), bias=_as_out_dtype(bias_vector(bias), spec, "bias"),
                            residual=_as_out_dtype(flat.residual, spec, "residual"), device=options.get("device"))
            if c is None and spec.persistent:   # (a stack TMA cannot describe, call.stack_problem: the cp.async
                # kernel, remembered for these arrays from now on)
                try:
                    twin = compile_gemm(spec.replace(persistent=None, copy="auto", store="auto"))
                except SpecError:
                    twin = None
                if twin is not None:
                    c = run_batched(twin, a3, b3, flat.out, stack.matrices, alpha=options.get("alpha", 1.0),
                                    beta=options.get("beta", 0.0), bias=_as_out_dtype(bias_vector(bias), twin.spec, "bias"),
                                    residual=_as_out_dtype(flat.residual, twin.spec, "residual"),
                                    device=options.get("device"))
                    if c is not None:
                        _stacks[key] = twin
                        lib = interop.library(A)
                        fast = lib is not None and residual is None and lib.probe(A) and lib.probe(B) and \
                            _stack_key(lib, lib.probe(A), lib.probe(B), out, bias, activation, tf32)
                        if fast:
                            _stacks[fast[0]] = twin
            if c is not None:
                return c.reshape(stack.result_shape) if out is None else out
    return batch.run(matmul, stack, A, B, out=out, residual=residual, scale_a=scale_a, scale_b=scale_b, **options)


ZERO_K = 16   # columns of zeros standing in for an empty K (16-byte rows for every dtype)


def zero_operands(A, B):
    """M x ZERO_K and ZERO_K x N zeros in A's and B's library, dtypes and layouts (B K-major for
    fp8): an empty K's A and B as kernels can take them (TMA describes no empty matrix)."""
    M, N = int(A.shape[0]), int(B.shape[1])
    if isinstance(A, np.ndarray) != isinstance(B, np.ndarray) or interop.library(A) is not interop.library(B):
        raise LaunchError(f"A is a {type(A).__module__}.{type(A).__name__} and B a {type(B).__module__}."
                          f"{type(B).__name__}: pass two arrays of one library (numpy, PyTorch or CuPy)")
    col_b = _layout(B) == "col" or _DTYPES.get(_dtype_name(B)) in FP8
    if isinstance(A, np.ndarray):
        b = np.zeros((N, ZERO_K), B.dtype).T if col_b else np.zeros((ZERO_K, N), B.dtype)
        return np.zeros((M, ZERO_K), A.dtype), b
    if hasattr(A, "new_zeros"):   # PyTorch
        return A.new_zeros((M, ZERO_K)), B.new_zeros((N, ZERO_K)).t() if col_b else B.new_zeros((ZERO_K, N))
    lib = interop.library(A)
    if lib is None or lib.name != "cupy":
        raise LaunchError(f"A is an empty {type(A).__name__} (K = 0): pass numpy, PyTorch or CuPy arrays")
    xp = lib.cupy
    with xp.cuda.Device(A.device.id):
        b = xp.zeros((N, ZERO_K), B.dtype).T if col_b else xp.zeros((ZERO_K, N), B.dtype)
        return xp.zeros((M, ZERO_K), A.dtype), b


def _vector_scale(x, length: int, name: str):
    """x when it is a per-row / per-column scale (a 1-D array of `length` > 1 elements, or as
    torch._scaled_mm takes them, scale_a M x 1 and scale_b 1 x N: then a 1-D view), else None (a
    per-tensor one, or none); a 1-D array of another length is refused."""
    if x is None or isinstance(x, (int, float, np.number)):
        return None
    shape = tuple(getattr(x, "shape", ()))
    if len(shape) == 2 and shape == ((length, 1) if name == "scale_a" else (1, length)) and length > 1:
        return _f32_vector(x.reshape(length), name)
    if len(shape) == 2 and max(shape) > 1 and min(shape) == 1:
        want = f"{length} x 1 (one per row of A)" if name == "scale_a" else f"1 x {length} (one per column of B)"
        raise LaunchError(f"{name} has shape {shape}; a per-{'row' if name == 'scale_a' else 'column'} scale is "
                          f"1-D with {length} elements or {want}, as torch._scaled_mm takes it (or pass one number)")
    if len(shape) == 1 and shape[0] > 1:
        if shape[0] != length:
            which = "rows of A (M)" if name == "scale_a" else "columns of B (N)"
            raise LaunchError(f"{name} has {shape[0]} elements; a per-{'row' if name == 'scale_a' else 'column'} "
                              f"scale has one for each of the {length} {which} (or pass one number)")
        return _f32_vector(x, name)
    return None


_IS_F32: dict = {}   # an array library's dtype object -> whether it is float32 (named once per dtype)


def _f32_vector(x, name: str):
    """A scale vector as the kernel reads it, float32: a host array of other reals converted, a
    GPU array of another dtype refused (converting it would cost a kernel launch)."""
    f32 = _IS_F32.get(x.dtype)
    if f32 is None:
        f32 = _IS_F32[x.dtype] = _dtype_name(x) == "float32"
    if f32:
        return x
    dtype = _dtype_name(x)
    if isinstance(x, np.ndarray) and x.dtype.kind in "fiu" and x.dtype != np.bool_:
        return x.astype(np.float32)
    raise LaunchError(f"{name} is a {dtype} vector; scales per row / column are float32 (pass {name}.float() "
                      f"or {name}.astype('float32'))")


# one-element GPU scales of these dtypes are converted to float32 on the GPU (exactly, or for
# float64 and integers past 2^24 rounded as the host's alpha would be) instead of read back, which
# waits for the GPU and cannot be captured in a CUDA graph
_CONVERTED_SCALES = ("float16", "bfloat16", "float64", "int8", "uint8", "int16", "int32", "int64")


def _device_scale_dtype(x):
    """The dtype name of a per-tensor scale the kernel reads where it is (a one-element float32
    PyTorch or CuPy array on the GPU, as torch._scaled_mm takes its scales, or one of
    _CONVERTED_SCALES); else None. Looks only."""
    if x is None or isinstance(x, (int, float, np.number, np.ndarray)):
        return None
    lib = interop.library(x)
    if lib is None or getattr(x, "is_cuda", True) is False:
        return None
    name = str(x.dtype).replace("torch.", "")
    if name != "float32" and name not in _CONVERTED_SCALES:
        return None
    n = x.numel() if hasattr(x, "numel") else getattr(x, "size", None)
    return name if n == 1 else None


def _device_scale(x):
    """The float32 GPU array the kernel reads for a per-tensor scale (_device_scale_dtype): the
    scale itself, or its float32 copy made on its stream; else None."""
    name = _device_scale_dtype(x)
    if name is None or name == "float32":
        return None if name is None else x
    return x.float() if hasattr(x, "float") else x.astype("float32")


_ONE_ELEMENT = ((), (1,), (1, 1))


def _split_scale(x, length: int, name: str) -> tuple:
    """(the array the kernel reads, the factor for alpha) of a scale: (None, the number) for a
    per-tensor one the host holds, (the vector, 1.0) for one per row or column, (the array, 1.0)
    for a GPU scalar (_device_scale); a number costs one check."""
    if isinstance(x, (int, float, np.number)) and not isinstance(x, bool):
        return None, real_number(x, name)
    lib = interop.library(x)
    if lib is not None:   # (the common GPU scale in one probe: one float32 element, read where it is)
        p = lib.probe(x)
        if p and p[DTYPE] == "float32" and p[SHAPE] in _ONE_ELEMENT and getattr(x, "is_cuda", True):
            return x, 1.0
    v = _vector_scale(x, length, name)
    if v is None:
        v = _device_scale(x)
    return (v, 1.0) if v is not None else (None, _scale(x, name))


def _host_number(x) -> bool:
    """Whether a scale is absent or a number the host holds (per-tensor, folded into alpha)."""
    return x is None or isinstance(x, (int, float, np.number)) and not isinstance(x, bool)


def _scale(x, name: str) -> float:
    """A per-tensor scale as a float: a number, or a one-element array (a float or integer GPU
    array is read by the kernel instead, _device_scale; another GPU array's value, a bool's, is
    read back, which waits for the GPU)."""
    if x is None:
        return 1.0
    if isinstance(x, (int, float, np.number)) and not isinstance(x, bool):
        return real_number(x, name)
    n = x.numel() if hasattr(x, "numel") else getattr(x, "size", None)
    if n == 1 and not isinstance(x, bool):
        return real_number(x.reshape(-1)[0] if hasattr(x, "reshape") else x, name)
    what = f"an array of {n} elements" if isinstance(n, int) else type(x).__name__
    raise LaunchError(f"{name} must be a number, a one-element array (a per-tensor scale) or a 1-D f32 vector "
                      f"(per row of A / per column of B), not {what}")


def _out_dtype_name(dt) -> str:
    if isinstance(dt, type) and issubclass(dt, np.generic):   # np.float32, ml_dtypes.bfloat16 (scalar types)
        dt = np.dtype(dt)
    name = str(dt).replace("torch.", "")
    name = getattr(dt, "name", name) if isinstance(dt, np.dtype) else name
    if isinstance(dt, str):   # ("BF16" as GemmSpec takes it)
        name = name.lower()
    if name not in _OUT_NAMES:
        raise LaunchError(f"out_dtype={dt!r}; allowed: bf16, f16, f32 (as names, torch or numpy dtypes)")
    return _OUT_NAMES[name]


def _check_out(out) -> None:
    """An out that is no array is refused by name (off the fast path, which declines it)."""
    if out is not None and not (hasattr(out, "shape") and hasattr(out, "dtype")):
        raise LaunchError(f"out must be an array to write the result into (numpy, torch or CuPy), not a "
                          f"{type(out).__name__}")


def _out_for(A, B, out, out_dtype):
    """out, or with out_dtype alone a new output of that dtype (out and an out_dtype it does
    not have are refused)."""
    if out_dtype is None:
        return out
    _check_out(out)
    name = _out_dtype_name(out_dtype)
    if out is None:
        return _empty_out(A, B, name)
    if _DTYPES.get(_dtype_name(out)) != name:
        raise LaunchError(f"out is {_dtype_name(out)} but out_dtype={out_dtype!r}: pass one of them (out's dtype is "
                          f"the result's)")
    return out


def _empty_out(A, B, name: str):
    """An uninitialised output of A @ B's shape and dtype `name` in A's library (numpy, PyTorch, CuPy)."""
    shape = batch.plan(A, B).result_shape if batch.is_stack(A, B) else (int(A.shape[0]), int(B.shape[1]))
    lib = interop.library(A)
    if not isinstance(A, np.ndarray) and not (lib is not None and lib.probe(A)):
        raise LaunchError("out_dtype= needs numpy, PyTorch or CuPy arrays; pass out= instead")
    return batch.new_array(A, shape, name)


matmul.explain = explain
matmul_fused = matmul
