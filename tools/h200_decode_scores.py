"""Decoding's scores (q @ k^T: K = head dim 128, N = context) as stacks, B row-major (K x N) and as k^T
(a transposed (N, K) row-major k: column-major B): torch, tilegen.matmul's choice and swapped tiles;
GPU time of CUDA-graph replays rotating 4 operand sets.

    python3 tools/h200_decode_scores.py [BxMxNxK ...]
"""
import json, os, sys
import torch, tilegen
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_timing import checked_spec_us, graph_us  # noqa: E402
dt = torch.bfloat16
VARIANTS = {"s64x64k64_s16": dict(tile=(16, 64, 64), warps=(1, 4), stages=16),
            "s64x64k128_s8": dict(tile=(16, 64, 128), warps=(1, 4), stages=8),
            "s128x64k64_s12": dict(tile=(16, 128, 64), warps=(1, 8), stages=12),
            "s128x64k128_s6": dict(tile=(16, 128, 128), warps=(1, 8), stages=6),
            "s64x64k64_s4": dict(tile=(16, 64, 64), warps=(1, 4), stages=4)}
SHAPES = [tuple(map(int, a.split("x"))) for a in sys.argv[1:]] or [(32, 1, 4096, 128), (32, 16, 4096, 128),
                                                                   (32, 1, 16384, 128), (8, 16, 8192, 128)]
for (b, m, n, k) in SHAPES:
    for kt in ((False, True) if k <= 128 else (False,)):
        sets = []
        for _ in range(4):
            A = torch.randn(b, m, k, device="cuda", dtype=dt)
            B = torch.randn(b, n, k, device="cuda", dtype=dt).transpose(1, 2) if kt else torch.randn(b, k, n, device="cuda", dtype=dt)
            sets.append((A, B, torch.empty(b, m, n, device="cuda", dtype=dt)))
        ref = sets[0][0].double() @ sets[0][1].double()
        row = {"stack": [b, m, n, k], "B": "k^T" if kt else "row"}
        row["torch"] = graph_us([lambda A=A, B=B, C=C: torch.matmul(A, B, out=C) for A, B, C in sets])
        ch = tilegen.matmul.explain(*sets[0][:2], out=sets[0][2]).spec
        row["matmul"] = graph_us([lambda A=A, B=B, C=C: tilegen.matmul(A, B, out=C) for A, B, C in sets])
        row["matmul_spec"] = f"{ch.tile.m}x{ch.tile.n}x{ch.tile.k} s{ch.stages} swap{int(ch.swap_ab)}"
        for name, kw in VARIANTS.items():
            try:
                spec = ch.replace(swap_ab=True, store="direct", split_k=1, **kw)
            except tilegen.TilegenError as e:
                row[name] = f"{type(e).__name__}: {e}"[:100]
                continue
            row[name] = checked_spec_us(spec, sets, ref)
        print(json.dumps(row), flush=True)
