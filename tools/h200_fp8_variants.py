"""fp8 (e4m3) variants of the promoted wgmma kernel against torch._scaled_mm, interleaved 3 rounds at 4096^3 and
8192^3 (median ratio; each result's max error against a float64 product). Prints one line per size.

    python3 tools/h200_fp8_variants.py
"""
import os
import statistics
import sys

import torch

import tilegen

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_timing import events_ms  # noqa: E402

V = {"p2 s4 (default)": {}, "p3": {"promote": 3}, "p2 g4": {"group_m": 4}, "p2 g2": {"group_m": 2},
     "p2 cluster2x1": {"cluster": (2, 1)}, "p2 stream-K": {"stream_k": True}, "p1": {"promote": 1}}
ks = {}
for n, kw in V.items():
    try:
        ks[n] = tilegen.compile(tilegen.GemmSpec(**{"dtype": "e4m3", "out_dtype": "bf16", "instruction": "wgmma", **kw}))
    except Exception as e:
        print(n, "ERR", str(e)[:200])
for M in (4096, 8192):
    A = (torch.randn(M, M, device="cuda") * 2).to(torch.float8_e4m3fn)
    W = (torch.randn(M, M, device="cuda") * 2).to(torch.float8_e4m3fn)
    B = W.t(); C = torch.empty(M, M, device="cuda", dtype=torch.bfloat16)
    one = torch.ones((), device="cuda")
    lt = lambda: torch._scaled_mm(A, B, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    ref = A.double() @ B.double()
    flop = 2.0 * M ** 3; reps = max(5, int(4e12 / flop))
    res = {n: [] for n in ["scaled_mm", *ks]}
    errs = {}
    for n, k in ks.items():
        C.fill_(float("nan")); k(A, B, out=C); torch.cuda.synchronize()
        errs[n] = float(((C.double() - ref).abs().max() / ref.abs().max()).item())
    for _ in range(3):
        res["scaled_mm"].append(events_ms(lt, reps, rounds=1)["ms"])
        for n, k in ks.items():
            res[n].append(events_ms(lambda k=k: k(A, B, out=C), reps, rounds=1)["ms"])
    base = statistics.median(res["scaled_mm"])
    print(M, "scaled_mm %.0f" % (flop / base / 1e9), " | ".join("%s %.2f (%.1e)" % (n, base / statistics.median(v), errs[n]) for n, v in res.items() if n != "scaled_mm"), flush=True)
