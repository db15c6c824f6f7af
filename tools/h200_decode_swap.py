"""GPU time per call (CUDA graph of 24 calls rotating 4 operand sets, > L2) of decode-like stacks:
torch.matmul, tilegen.matmul's choice, and the swapped kernel (C^T = B^T A^T, tile (tm, 64, 64),
warps (1, 4)) with several stage counts.

    python3 tools/h200_decode_swap.py [BxMxNxK ...]   (JSON lines; also $OUT/r/decode-swap.json where OUT is set)
"""
import json, os, sys
import torch, tilegen
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_timing import checked_spec_us, graph_us  # noqa: E402
dt = torch.bfloat16
SETS = 4
rows = []
SHAPES = [tuple(map(int, a.split("x"))) for a in sys.argv[1:]] or [(32, 16, 128, 4096), (32, 1, 128, 4096),
          (64, 1, 64, 2048), (8, 16, 128, 16384), (32, 16, 128, 16384), (32, 8, 128, 8192), (8, 128, 128, 4096)]
for (b, m, n, k) in SHAPES:
    sets = [(torch.randn(b, m, k, device="cuda", dtype=dt), torch.randn(b, k, n, device="cuda", dtype=dt),
             torch.empty(b, m, n, device="cuda", dtype=dt)) for _ in range(SETS)]
    ref = sets[0][0].double() @ sets[0][1].double()
    row = {"stack": [b, m, n, k]}
    row["torch"] = graph_us([lambda A=A, B=B, C=C: torch.matmul(A, B, out=C) for A, B, C in sets])
    choice = tilegen.matmul.explain(*sets[0][:2], out=sets[0][2]).spec
    row["matmul"] = graph_us([lambda A=A, B=B, C=C: tilegen.matmul(A, B, out=C) for A, B, C in sets])
    row["matmul_spec"] = f"{choice.tile.m}x{choice.tile.n} s{choice.stages} split{choice.split_k}"
    tm = max(16, -(-m // 16) * 16)
    for stages in (12, 14, 16, 18):
        for split in (1, 2, 4, 8):
            key = f"swap{tm}_s{stages}_k{split}"
            try:
                spec = choice.replace(tile=(tm, 64, 64), warps=(1, 4), stages=stages, split_k=split, swap_ab=True,
                                      store="direct")
            except tilegen.TilegenError as e:
                row[key] = f"{type(e).__name__}: {e}"[:120]
                continue
            row[key] = checked_spec_us(spec, sets, ref)
    good = [(v, kk) for kk, v in row.items() if kk.startswith("swap") and isinstance(v, float)]
    row["best"] = min(good) if good else None
    rows.append(row); print(json.dumps(row), flush=True)
if os.environ.get("OUT"):   # (a device run's output folder)
    with open(os.path.join(os.environ["OUT"], "r", "decode-swap.json"), "w") as f:
        json.dump(rows, f, indent=1)
