"""tf32 products of 33 to 128 rows against wide weights with B row-major (x @ W, K = 8192): what
tilegen.matmul takes against the register kernel (C^T = B^T A^T, B's k-steps into registers from
TMA stages) at a few tiles, and torch.matmul (cuBLAS tf32). Microseconds per call of CUDA-graph
replays, operands rotated over 3 sets; each kernel's result checked against a float64 product.

    python3 tools/h200_tf32_mid_rows.py TAG
"""
import json, os, sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tilegen  # noqa: E402
from gpu_timing import against_torch  # noqa: E402
from tilegen.gemm.spec import GemmSpec  # noqa: E402

torch.backends.cuda.matmul.allow_tf32 = True
TILES = {"64x128 s6": dict(tile=(64, 128, 32), warps=(1, 8), stages=6),
         "64x128 s8": dict(tile=(64, 128, 32), warps=(1, 8), stages=8),
         "128x128 s4": dict(tile=(128, 128, 32), warps=(1, 8), stages=4),
         "128x128 s6": dict(tile=(128, 128, 32), warps=(1, 8), stages=6),
         "32x128 s8": dict(tile=(32, 128, 32), warps=(1, 8), stages=8)}
out = {"tag": sys.argv[1]}
kernels = {}
for name, kw in TILES.items():
    try:
        kernels[name] = tilegen.compile(GemmSpec(dtype="tf32", out_dtype="f32", a_layout="row", b_layout="row",
                                                 instruction="wgmma", target="sm_90a", copy="tma", **kw))
    except tilegen.TilegenError as e:
        out[f"refused {name}"] = str(e)[:200]
for M in (48, 64, 80, 96, 128):
    for N in (8192, 28672):
        K = 8192
        sets = [(torch.randn(M, K, device="cuda"), torch.randn(K, N, device="cuda"), torch.empty(M, N, device="cuda"))
                for _ in range(3)]
        A, B, C = sets[0]
        row = {"matmul_takes": str(tilegen.matmul.explain(A, B, allow_tf32=True).spec)}
        row.update(against_torch(kernels, sets, allow_tf32=True))
        out[f"{M}x{N}x{K}"] = row
        print(f"{M}x{N}x{K}", {k: v for k, v in row.items() if k != "err"}, flush=True)
print(json.dumps(out))
