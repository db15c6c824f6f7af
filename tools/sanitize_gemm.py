"""Run a few ragged GEMMs for compute-sanitizer (memcheck / racecheck); exits non-zero on a
wrong result. Usage: compute-sanitizer --tool memcheck python3 tools/sanitize_gemm.py [--hopper]
(--hopper: the sm_90a wgmma kernels instead: the warp-specialized TMA kernel with its TMA-store
epilogue, its beta and unaligned-output paths, and the one-CTA-per-block TMA kernel; with --dtype D
only those of dtype D; --stacks:
batched kernels on ragged stacks, one A for every B, column-major matrices, bias and residual, and the
warp-specialized TMA kernel on stacks through 3-D tensor maps, K split or not, swapped or not)."""
import sys

import numpy as np

import tilegen
from tilegen.arch.dtypes import numpy_dtype

CASES = [("f16", "row", "col", (133, 70, 45)), ("tf32", "col", "row", (67, 201, 99)),
         ("bf16", "col", "col", (129, 255, 70)), ("f32", "row", "row", (77, 90, 130))]


HOPPER = [(dict(dtype="f16", out_dtype="f16"), (133, 270, 45), 0.0, None),
          (dict(dtype="bf16", out_dtype="bf16", a_layout="col", b_layout="col"), (300, 520, 200), 0.0, None),
          (dict(dtype="f16", out_dtype="f32"), (129, 255, 70), 0.0, None),
          (dict(dtype="bf16", out_dtype="bf16"), (129, 256, 70), 0.5, None),
          (dict(dtype="f16", out_dtype="f16"), (70, 131, 40), 0.0, 133),
          (dict(dtype="f16", out_dtype="f16", persistent=False), (200, 300, 130), 0.0, None),
          (dict(dtype="bf16", out_dtype="bf16", epilogue=tilegen.Epilogue("col", "gelu_tanh", True)), (260, 300, 70),
           0.0, None),
          (dict(dtype="bf16", out_dtype="bf16", cluster=(2, 1)), (300, 520, 200), 0.0, None),      # TMA multicast
          (dict(dtype="f16", out_dtype="f16", cluster=(1, 2), b_layout="col"), (300, 520, 200), 0.0, None),
          (dict(dtype="f16", out_dtype="f16", split_k=3, persistent=False), (200, 130, 400), 0.0, None),
          (dict(dtype="e4m3", out_dtype="bf16"), (260, 300, 300), 0.0, None),                     # fp8, promoted
          (dict(dtype="e4m3", out_dtype="bf16", epilogue=tilegen.Epilogue(bias="row", scale_rows=True,       # staged
                                                                           scale_cols=True)), (260, 300, 300), 0.0, None),
          (dict(dtype="e4m3", out_dtype="bf16", epilogue=tilegen.Epilogue(bias="col", scale_rows=True,       # fp8 walk:
                                                                           scale_cols=True)), (1700, 1800, 300), 0.0,
           None),         # 210 blocks, each CTA's next block started under its epilogue
          (dict(dtype="f32"), (1700, 1300, 101), 0.5, None),                  # f32 parts (promoted), 154 blocks
          (dict(dtype="bf16", out_dtype="bf16", epilogue=tilegen.Epilogue("col", "gelu_tanh")), (2000, 3000, 70), 0.0,
           None),         # 192 blocks: the bias double-buffered, each next block's parked under this one's
          (dict(dtype="bf16", out_dtype="bf16", stream_k=True), (300, 520, 200), 0.0, None),       # stream-K
          (dict(dtype="f16", out_dtype="f16", stream_k=True, tile=(64, 128, 64), warps=(4, 1)), (900, 1000, 130), 0.5,
           None),
          (dict(dtype="e4m3", out_dtype="bf16", stream_k=True), (260, 300, 600), 0.0, None),
          # fp8 promoted every k-tile (matmul's where ptxas assembles it): two accumulators taking turns, odd and
          # even k-tile counts, 210 blocks; stream-K pieces; 128x192 tiles by staggered halves
          (dict(dtype="e4m3", out_dtype="bf16", promote=1, frag_buffers=2), (260, 300, 300), 0.0, None),
          (dict(dtype="e4m3", out_dtype="bf16", promote=1, frag_buffers=2, epilogue=tilegen.Epilogue(bias="col", scale_rows=True,
                                                                                     scale_cols=True)),
           (1700, 1800, 512), 0.0, None),
          (dict(dtype="e4m3", out_dtype="bf16", promote=1, frag_buffers=2, stream_k=True), (260, 300, 600), 0.0, None),
          (dict(dtype="e4m3", out_dtype="bf16", promote=1, tile=(128, 192, 128)), (300, 500, 600), 0.0, None),
          (dict(dtype="bf16", out_dtype="bf16", pingpong=True, tile=(64, 256, 64), warps=(4, 1),               # ping-pong
                epilogue=tilegen.Epilogue("col", "gelu_tanh", True)), (300, 700, 200), 0.0, None),
          (dict(dtype="f16", out_dtype="f16", pingpong=True, tile=(64, 256, 64), warps=(4, 1)), (333, 520, 130), 0.5,
           None),
          (dict(dtype="tf32", copy="tma"), (300, 200, 100), 0.0, None),     # tf32 rr: B through registers
          (dict(dtype="tf32", copy="tma", tile=(32, 128, 32), warps=(1, 8), stages=8), (47, 300, 130), 0.0, None),
          (dict(dtype="tf32", b_layout="col", tile=(64, 128, 32), warps=(4, 1), stages=6), (200, 300, 130), 0.5, None),
          (dict(dtype="tf32", pretranspose=True), (300, 200, 101), 0.0, None),  # tf32: K-major copies first
          (dict(dtype="tf32", pretranspose=True, a_layout="col"), (301, 203, 99), 0.5, None),
          (dict(dtype="tf32", pretranspose="A", a_layout="col"), (301, 203, 99), 0.5, None),   # A copied, B in registers
          (dict(dtype="tf32", a_layout="col", b_layout="col", copy="tma", store="direct"), (301, 203, 99), 0.5, None),
          (dict(dtype="f32"), (300, 200, 101), 0.0, None),                    # f32: tf32 parts, one product
          (dict(dtype="f32", a_layout="col", b_layout="col"), (301, 203, 99), 0.5, None),
          # e5m2, and the mixed fp8 pairs (the atom names B's type) with bias, GELU and a residual
          (dict(dtype="e5m2", out_dtype="f16"), (260, 300, 300), 0.0, None),
          (dict(dtype="e4m3", atom="m16n8k32.e4m3.e5m2.f32", out_dtype="bf16", promote=1, frag_buffers=2,
                epilogue=tilegen.Epilogue("col", "gelu_tanh", True)), (300, 310, 520), 0.0, None),
          (dict(dtype="e5m2", atom="m16n8k32.e5m2.e4m3.f32", out_dtype="f32",
                epilogue=tilegen.Epilogue(scale_rows=True, scale_cols=True)), (300, 310, 520), 0.0, None),
          # fp8 with A's per-tensor scale read from device memory and B's per column
          (dict(dtype="e4m3", out_dtype="bf16", epilogue=tilegen.Epilogue(device_scale_a=True, scale_cols=True)),
           (260, 300, 300), 0.0, None),
          # C^T = B^T A^T (swap_ab) on the persistent TMA kernel, a few rows, C read (beta)
          (dict(dtype="bf16", out_dtype="bf16", swap_ab=True, copy="tma", persistent=True, tile=(16, 64, 64),
                warps=(1, 4), stages=16), (13, 300, 700), 0.5, None),
          (dict(dtype="bf16", out_dtype="bf16", swap_ab=True, copy="tma", persistent=True, tile=(32, 64, 128),
                warps=(1, 4), stages=8, b_layout="col"), (29, 300, 700), 0.0, None),
          # fp8 decoding's swapped kernel promoted every k-tile by turns: two blocks of rows, ragged N and K
          (dict(dtype="e4m3", out_dtype="bf16", swap_ab=True, copy="tma", persistent=True, tile=(16, 64, 128),
                warps=(1, 4), stages=8, promote=1, frag_buffers=2,
                epilogue=tilegen.Epilogue(bias="col", scale_rows=True, scale_cols=True)), (20, 300, 1296), 0.0, None),
          (dict(dtype="e4m3", out_dtype="bf16", swap_ab=True, copy="tma", persistent=True, tile=(32, 64, 128),
                warps=(1, 4), stages=12, promote=1, frag_buffers=2), (50, 200, 1200), 0.0, None)]


def hopper(dtype=None) -> int:
    rng = np.random.default_rng(12)
    bad = 0
    for kw, (M, N, K), beta, out_ld in HOPPER:
        if dtype is not None and kw["dtype"] != dtype:
            continue
        spec = tilegen.GemmSpec(instruction="wgmma", **kw)
        kernel = tilegen.compile(spec)
        A = rng.standard_normal((M, K)).astype(numpy_dtype(spec.dtype))
        B = rng.standard_normal((K, N)).astype(numpy_dtype(spec.b_dtype))
        C0 = rng.standard_normal((M, N)).astype(numpy_dtype(spec.out_dtype))
        out = np.zeros((M, out_ld or N), numpy_dtype(spec.out_dtype))[:, :N]
        out[...] = C0
        epi = spec.epilogue
        if epi.is_plain:
            C = kernel(A, B, out=out, beta=beta)
            ref = A.astype(np.float64) @ B.astype(np.float64) + beta * C0.astype(np.float64)
        else:   # scales, bias, GELU (tanh) or none, residual: as the spec's epilogue says
            x, kw = A.astype(np.float64) @ B.astype(np.float64), {}
            for on, name, n, axis in ((epi.scale_rows, "scale_a", M, 0), (epi.scale_cols, "scale_b", N, 1),
                                      (epi.device_scale_a, "scale_a", 1, None), (epi.device_scale_b, "scale_b", 1, None)):
                if on:
                    kw[name] = rng.uniform(0.5, 2, n).astype(np.float32)
                    x = x * (kw[name] if axis is None else kw[name][:, None] if axis == 0 else kw[name][None, :])
            if epi.bias:
                kw["bias"] = rng.standard_normal(N if epi.bias == "col" else M).astype(numpy_dtype(spec.out_dtype))
                b64 = kw["bias"].astype(np.float64)
                x = x + (b64[None, :] if epi.bias == "col" else b64[:, None])
            if epi.activation == "gelu_tanh":
                x = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
            if epi.residual:
                kw["residual"] = C0
                x = x + C0.astype(np.float64)
            C, ref = kernel(A, B, out=out, **kw), x
        rel = np.linalg.norm(C - ref) / np.linalg.norm(ref)
        ok = np.isfinite(C).all() and rel < 1e-2
        bad += not ok
        print(f"{kernel.name} {M}x{N}x{K} beta={beta} out_ld={out_ld or N}: rel {rel:.2e} {'ok' if ok else 'WRONG'}")
    return 1 if bad else 0


STACKS = [(dict(dtype="f16", out_dtype="f16", tile=(64, 64, 32)), (3, 1), (70, 45, 33), ("row", "row")),
          (dict(dtype="bf16", out_dtype="bf16", instruction="wgmma", tile=(128, 256, 64), warps=(8, 1)), (4, 4),
           (200, 300, 70), ("col", "col")),
          (dict(dtype="f16", out_dtype="f32", instruction="wgmma", tile=(64, 128, 64), warps=(4, 1),
                epilogue=tilegen.Epilogue("row", "gelu_tanh", True)), (1, 5), (130, 90, 130), ("row", "col")),
          # the warp-specialized TMA kernel, each stack through a 3-D tensor map (template.TmaStack):
          # ragged M, N and K, a broadcast B, A column-major
          (dict(dtype="bf16", out_dtype="bf16", instruction="wgmma", copy="tma"), (4, 4), (256, 300, 70), ("row", "col")),
          (dict(dtype="bf16", out_dtype="bf16", instruction="wgmma", copy="tma"), (4, 1), (200, 300, 70), ("row", "col")),
          # one-row products (decode-like), 64-row tiles
          (dict(dtype="bf16", out_dtype="bf16", instruction="wgmma", copy="tma", tile=(64, 128, 64), warps=(4, 1)),
           (8, 8), (1, 300, 64), ("row", "row")),
          # its twin that stores C directly (a C whose rows TMA cannot take)
          (dict(dtype="bf16", out_dtype="bf16", instruction="wgmma", copy="tma", store="direct", tile=(64, 128, 64),
                warps=(4, 1)), (6, 6), (77, 77, 64), ("row", "col")),
          (dict(dtype="f16", out_dtype="f16", instruction="wgmma", copy="tma", tile=(64, 128, 64), warps=(4, 1),
                epilogue=tilegen.Epilogue("col", "gelu_tanh", True)), (3, 3), (100, 200, 72), ("col", "row")),
          # split-K on the TMA stack kernel: partial sums per slice and matrix, added by the last slice
          # to arrive at each block's counter (K of 1100 in slices of 384: the last 332 deep), with bias,
          # GELU and residual
          (dict(dtype="bf16", out_dtype="bf16", instruction="wgmma", copy="tma", tile=(64, 64, 64), warps=(4, 1),
                stages=8, split_k=3, epilogue=tilegen.Epilogue("col", "gelu_tanh", True)), (5, 1), (16, 136, 1100),
           ("row", "row")),
          # decoding's stacks: the narrow tile, eight stages (matmul's STACK_NARROW)
          (dict(dtype="bf16", out_dtype="bf16", instruction="wgmma", copy="tma", tile=(64, 64, 64), warps=(4, 1),
                stages=8), (8, 8), (1, 136, 600), ("row", "row")),
          # and the swapped kernel (C^T = B^T A^T; matmul's STACK_SWAPPED): 16 stages, then split K in 3
          # with bias, GELU and residual, and 32 rows on two warpgroups
          (dict(dtype="bf16", out_dtype="bf16", instruction="wgmma", copy="tma", tile=(16, 64, 64), warps=(1, 4),
                stages=16, swap_ab=True), (8, 8), (13, 136, 1000), ("row", "row")),
          (dict(dtype="bf16", out_dtype="bf16", instruction="wgmma", copy="tma", tile=(16, 64, 64), warps=(1, 4),
                stages=16, swap_ab=True, split_k=3, epilogue=tilegen.Epilogue("col", "gelu_tanh", True)), (5, 1),
           (16, 136, 1100), ("row", "row")),
          (dict(dtype="f16", out_dtype="f16", instruction="wgmma", copy="tma", tile=(32, 128, 64), warps=(1, 8),
                stages=8, swap_ab=True), (4, 4), (30, 200, 300), ("row", "col")),
          # decoding's scores (matmul's STACK_SWAPPED_SHORT_K): one 128-deep k-tile a block, B as k^T
          (dict(dtype="bf16", out_dtype="bf16", instruction="wgmma", copy="tma", tile=(16, 128, 128), warps=(1, 8),
                stages=6, swap_ab=True), (8, 8), (1, 300, 128), ("row", "col"))]


def stacks() -> int:
    rng = np.random.default_rng(13)
    bad = 0
    for kw, (na, nb), (M, N, K), (la, lb) in STACKS:
        kernel = tilegen.compile(tilegen.GemmSpec(batched=True, a_layout=la, b_layout=lb, **kw))
        spec, count = kernel.spec, max(na, nb)
        A = rng.standard_normal((na, M, K) if la == "row" else (na, K, M)).astype(numpy_dtype(spec.dtype))
        B = rng.standard_normal((nb, K, N) if lb == "row" else (nb, N, K)).astype(numpy_dtype(spec.dtype))
        A, B = (A if la == "row" else A.swapaxes(1, 2)), (B if lb == "row" else B.swapaxes(1, 2))
        extra, x = {}, np.matmul(A.astype(np.float64), B.astype(np.float64))
        epi = spec.epilogue
        if epi.bias:
            extra["bias"] = rng.standard_normal(N if epi.bias == "col" else M).astype(numpy_dtype(spec.out_dtype))
            x = x + (extra["bias"][None, None, :] if epi.bias == "col" else extra["bias"][None, :, None])
        if epi.activation == "gelu_tanh":
            x = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
        if epi.residual:
            extra["residual"] = rng.standard_normal((count, M, N)).astype(numpy_dtype(spec.out_dtype))
            x = x + extra["residual"]
        C = kernel(A, B, out=np.full((count, M, N), np.nan, numpy_dtype(spec.out_dtype)), **extra)
        rel = np.linalg.norm(C - x) / np.linalg.norm(x)
        ok = np.isfinite(C).all() and rel < 1e-2
        bad += not ok
        print(f"{kernel.name} {na}/{nb} x {M}x{N}x{K} {la}/{lb}: rel {rel:.2e} {'ok' if ok else 'WRONG'}")
    return 1 if bad else 0


def main() -> int:
    if "--hopper" in sys.argv[1:]:
        args = sys.argv[1:]
        return hopper(args[args.index("--dtype") + 1] if "--dtype" in args else None)
    if "--stacks" in sys.argv[1:]:
        return stacks()
    rng = np.random.default_rng(11)
    bad = 0
    for dtype, la, lb, (M, N, K) in CASES:
        kernel = tilegen.compile(tilegen.GemmSpec(dtype=dtype, a_layout=la, b_layout=lb, tile=(64, 64, 32)))
        A = rng.standard_normal((M, K)).astype(numpy_dtype(dtype))
        B = rng.standard_normal((K, N)).astype(numpy_dtype(dtype))
        C = kernel(A, B, out=np.full((M, N), np.nan, np.float32))
        ref = A.astype(np.float64) @ B.astype(np.float64)
        if dtype == "bf16":  # the fused epilogue too: bias per column, GELU, residual
            fused = tilegen.compile(tilegen.GemmSpec(dtype=dtype, a_layout=la, b_layout=lb, tile=(64, 64, 32),
                                                     epilogue=tilegen.Epilogue("col", "gelu_erf", True)))
            bias, res = rng.standard_normal(N).astype(np.float32), rng.standard_normal((M, N)).astype(np.float32)
            F = fused(A, B, bias=bias, residual=res)
            ok_fused = np.isfinite(F).all()
            bad += not ok_fused
            print(f"{dtype} fused epilogue {M}x{N}x{K}: {'ok' if ok_fused else 'WRONG'}")
        rel = np.linalg.norm(C - ref) / np.linalg.norm(ref)
        ok = np.isfinite(C).all() and rel < 2e-3
        bad += not ok
        print(f"{dtype} {la}/{lb} {M}x{N}x{K}: rel {rel:.2e} {'ok' if ok else 'WRONG'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
