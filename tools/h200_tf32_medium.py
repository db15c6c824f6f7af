"""tf32 products below the large preset (fewer than 2048 x 2048 outputs or a side under 1024) on
Hopper, A row-major with B row-major (x @ W) or column-major (x @ W.T): what tilegen.matmul takes
against warp-specialized wgmma kernels at a few tiles (B row-major: the register kernel, C^T =
B^T A^T; B column-major: the K-major kernel) and torch.matmul (cuBLAS tf32). Microseconds per
call of CUDA-graph replays, operands rotated over 3 sets; results checked against float64.

    python3 tools/h200_tf32_medium.py TAG
"""
import json, os, sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tilegen  # noqa: E402
from gpu_timing import against_torch  # noqa: E402
from tilegen.gemm.spec import GemmSpec  # noqa: E402

torch.backends.cuda.matmul.allow_tf32 = True
TILES = {"row": {"128x128 s4": dict(tile=(128, 128, 32), warps=(1, 8), stages=4, copy="tma"),
                 "64x128 s8": dict(tile=(64, 128, 32), warps=(1, 8), stages=8, copy="tma"),
                 "256x128 s4": dict(copy="tma")},
         "col": {"128x128 s4": dict(tile=(128, 128, 32), warps=(8, 1), stages=4),
                 "64x128 s6": dict(tile=(64, 128, 32), warps=(4, 1), stages=6),
                 "128x256 s4": dict()}}
SHAPES = ["512x512x512", "1024x1024x1024", "1024x1024x4096", "1024x2048x2048", "1536x1536x1536",
          "256x4096x4096", "256x8192x8192", "512x8192x8192", "768x4096x4096"]
out = {"tag": sys.argv[1]}
for lay, tiles in TILES.items():
    kernels = {name: tilegen.compile(GemmSpec(dtype="tf32", out_dtype="f32", a_layout="row", b_layout=lay,
                                              instruction="wgmma", target="sm_90a", **kw)) for name, kw in tiles.items()}
    for sh in SHAPES:
        M, N, K = map(int, sh.split("x"))

        def operands():
            B = torch.randn(K, N, device="cuda") if lay == "row" else torch.randn(N, K, device="cuda").t()
            return torch.randn(M, K, device="cuda"), B, torch.empty(M, N, device="cuda")
        sets = [operands() for _ in range(3)]
        A, B, C = sets[0]
        s = tilegen.matmul.explain(A, B, allow_tf32=True).spec
        row = {"matmul_takes": f"{s.instruction} {s.tile.m}x{s.tile.n}x{s.tile.k} s{s.stages} {s.copy}"}
        row.update(against_torch(kernels, sets, allow_tf32=True))
        out[f"{lay} {sh}"] = row
        print(lay, sh, row["matmul_takes"], row["x_torch"], flush=True)
print(json.dumps(out))
