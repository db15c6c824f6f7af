"""2-D skinny products (decoding's x @ W.T and x @ W) on the swapped persistent TMA kernel against
tilegen.matmul's choice and torch.matmul: GPU time of CUDA-graph replays rotating operands past L2.

    python3 tools/h200_skinny_swap.py
"""
import json, os, sys
import torch, tilegen
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_timing import graph_us  # noqa: E402
dt = torch.bfloat16
for (m, n, k) in [(1, 8192, 8192), (16, 8192, 8192), (1, 28672, 8192), (16, 28672, 8192), (32, 8192, 8192)]:
    for wt in (True, False):
        SETS = 3
        sets = []
        for _ in range(SETS):
            W = torch.randn(n, k, device="cuda", dtype=dt)
            sets.append((torch.randn(m, k, device="cuda", dtype=dt), W.t() if wt else torch.randn(k, n, device="cuda", dtype=dt),
                         torch.empty(m, n, device="cuda", dtype=dt)))
        ref = sets[0][0].double() @ sets[0][1].double()
        row = {"shape": [m, n, k], "B": "W.T" if wt else "row"}
        row["torch"] = graph_us([lambda A=A, B=B, C=C: torch.matmul(A, B, out=C) for A, B, C in sets], n=12, reps=15)
        ch = tilegen.matmul.explain(*sets[0][:2], out=sets[0][2]).spec
        row["matmul"] = graph_us([lambda A=A, B=B, C=C: tilegen.matmul(A, B, out=C) for A, B, C in sets], n=12, reps=15)
        row["matmul_spec"] = f"{ch.instruction} {ch.tile.m}x{ch.tile.n}x{ch.tile.k} s{ch.stages} split{ch.split_k}"
        tm = 16 if m <= 16 else 32
        for stages in (12, 16):
            key = f"swap{tm}_s{stages}"
            try:
                spec = tilegen.GemmSpec(dtype="bf16", out_dtype="bf16", instruction="wgmma", swap_ab=True, copy="tma",
                                        persistent=True, b_layout="col" if wt else "row", tile=(tm, 64, 64),
                                        warps=(1, 4), stages=stages)
                kern = tilegen.compile(spec)
                A, B, C = sets[0]
                C.fill_(float("nan")); kern(A, B, out=C); torch.cuda.synchronize()
                err = float(torch.linalg.norm(C.double() - ref) / torch.linalg.norm(ref))
                assert err < 1e-2, err
                row[key] = graph_us([lambda A=A, B=B, C=C: kern(A, B, out=C) for A, B, C in sets], n=12, reps=15)
            except Exception as e:
                row[key] = f"{type(e).__name__}: {e}"[:120]
        print(json.dumps(row), flush=True)
