"""Small and medium GEMMs kernel-only, timed through CUDA graphs so that no host cost hides the
kernel (50 launches captured once, replayed; median of 7 replays): tilegen.matmul's choice and
spec variants beside cuBLAS (torch.matmul) captured the same way, bf16 and f16, with each
result's error against a float64 product. Writes DIR/graph_variants.json.

    python3 tools/h200_graph_variants.py DIR
"""
import json
import os
import statistics
import sys

import torch

import tilegen
from tilegen.gemm import GemmSpec, compile_gemm

out_dir = sys.argv[1]
V = {
 "mma 128x128x64 s3 (the choice before 1dbf97c)": dict(instruction="mma.sync", target="sm_90", tile=(128,128,64), warps=(2,2), stages=3),
 "mma 64x64x64": dict(instruction="mma.sync", target="sm_90", tile=(64,64,64), warps=(2,2)),
 "wg ws 128x128x64 s4": dict(tile=(128,128,64)),
 "wg ws 128x128x64 s6": dict(tile=(128,128,64), stages=6),
 "wg ws 128x64x64 s6": dict(tile=(128,64,64), stages=6),
 "wg ws 64x128x64 s6": dict(tile=(64,128,64), warps=(4,1), stages=6),
 "wg ws 128x256x64 (default)": dict(),
 "wg np 128x128x64 s4": dict(tile=(128,128,64), persistent=False),
 "wg np 64x128x64 s6": dict(tile=(64,128,64), warps=(4,1), persistent=False, stages=6),
 "wg np 128x64x64 s6": dict(tile=(128,64,64), persistent=False, stages=6),
}
shapes = [(512,512,512),(768,768,768),(1024,1024,1024),(1024,1024,4096),(2048,2048,512),(1536,1536,1536),(2048,1024,2048),(1024,2048,1024)]

def graph_us(fn, n=50, rounds=7):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn(); fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n):
            fn()
    g.replay(); torch.cuda.synchronize()
    ts = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); g.replay(); b.record(); b.synchronize()
        ts.append(a.elapsed_time(b) * 1000 / n)
    return statistics.median(ts)

res = []
for dt, name in ((torch.bfloat16, "bf16"), (torch.float16, "f16")):
    ks = {}
    for vn, kw in V.items():
        try:
            ks[vn] = compile_gemm(GemmSpec(**{"dtype": name, "out_dtype": name, "instruction": "wgmma", "target": "sm_90a", **kw}))
        except Exception as e:
            print(vn, "ERR", e)
    for M, N, K in shapes:
        A = torch.randn(M, K, device="cuda", dtype=dt); B = torch.randn(K, N, device="cuda", dtype=dt)
        C = torch.empty(M, N, device="cuda", dtype=dt)
        ref = A.double() @ B.double()
        row = {"shape": [M, N, K], "cublas_us": graph_us(lambda: torch.matmul(A, B, out=C)), "v": {}}
        row["choice"] = str(tilegen.matmul.explain(A, B, out=C).spec)
        C.fill_(float("nan")); tilegen.matmul(A, B, out=C); torch.cuda.synchronize()
        err = float(((C.double() - ref).abs().max() / ref.abs().max()).item())
        us = graph_us(lambda: tilegen.matmul(A, B, out=C))
        row["v"]["tilegen.matmul (graph)"] = {"us": us, "x": row["cublas_us"] / us, "err": err}
        for vn, k in ks.items():
            C.fill_(float("nan")); k(A, B, out=C); torch.cuda.synchronize()
            err = float(((C.double() - ref).abs().max() / ref.abs().max()).item())
            us = graph_us(lambda: k(A, B, out=C))
            row["v"][vn] = {"us": us, "x": row["cublas_us"] / us, "err": err}
        print(json.dumps(row), flush=True)
        res.append(row)
json.dump(res, open(os.path.join(out_dir, "graph_variants.json"), "w"), indent=1)
