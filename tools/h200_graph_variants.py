"""Small and medium GEMMs kernel-only, timed through CUDA graphs so that no host cost hides the
kernel (50 calls captured once, replayed; median of 7 replays): tilegen.matmul's choice and
spec variants beside cuBLAS (torch.matmul) captured the same way, with each result's error
against a float64 product. Writes DIR/graph_variants.json.

    python3 tools/h200_graph_variants.py DIR [--dtypes bf16 f16] [--shapes MxNxK ...] [--variants JSON]

A variant is {"name": {GemmSpec fields}} (tuples as lists); without --variants, the
small/medium set of run 48.
"""
import argparse
import json
import os
import statistics

import torch

import tilegen
from tilegen.gemm import GemmSpec, compile_gemm

VARIANTS = {
    "mma 128x128x64 s3 (the choice before 1dbf97c)": dict(instruction="mma.sync", target="sm_90", tile=(128, 128, 64),
                                                        warps=(2, 2), stages=3),
    "mma 64x64x64": dict(instruction="mma.sync", target="sm_90", tile=(64, 64, 64), warps=(2, 2)),
    "wg ws 128x128x64 s4": dict(tile=(128, 128, 64)),
    "wg ws 128x128x64 s6": dict(tile=(128, 128, 64), stages=6),
    "wg ws 128x64x64 s6": dict(tile=(128, 64, 64), stages=6),
    "wg ws 64x128x64 s6": dict(tile=(64, 128, 64), warps=(4, 1), stages=6),
    "wg ws 128x256x64 (default)": dict(),
    "wg np 128x128x64 s4": dict(tile=(128, 128, 64), persistent=False),
    "wg np 64x128x64 s6": dict(tile=(64, 128, 64), warps=(4, 1), persistent=False, stages=6),
    "wg np 128x64x64 s6": dict(tile=(128, 64, 64), persistent=False, stages=6),
}
SHAPES = ["512x512x512", "768x768x768", "1024x1024x1024", "1024x1024x4096", "2048x2048x512", "1536x1536x1536",
          "2048x1024x2048", "1024x2048x1024"]


def graph_us(fn, n=50, rounds=7):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n):
            fn()
    g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1000 / n)
    return statistics.median(ts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--dtypes", nargs="+", default=["bf16", "f16"])
    ap.add_argument("--shapes", nargs="+", default=SHAPES)
    ap.add_argument("--variants", metavar="JSON")
    a = ap.parse_args()
    variants = VARIANTS
    if a.variants:
        variants = {n: {k: tuple(v) if isinstance(v, list) else v for k, v in kw.items()}
                    for n, kw in json.loads(a.variants).items()}
    res = []
    for name in a.dtypes:
        dt = {"bf16": torch.bfloat16, "f16": torch.float16}[name]
        ks = {}
        for vn, kw in variants.items():
            try:
                ks[vn] = compile_gemm(GemmSpec(**{"dtype": name, "out_dtype": name, "instruction": "wgmma",
                                                  "target": "sm_90a", **kw}))
            except Exception as e:  # noqa: BLE001
                print(vn, "ERR", e)
        for shape in a.shapes:
            M, N, K = (int(x) for x in shape.split("x"))
            A = torch.randn(M, K, device="cuda", dtype=dt)
            B = torch.randn(K, N, device="cuda", dtype=dt)
            C = torch.empty(M, N, device="cuda", dtype=dt)
            ref = A.double() @ B.double()
            row = {"dtype": name, "shape": [M, N, K], "cublas_us": graph_us(lambda: torch.matmul(A, B, out=C)), "v": {}}
            row["choice"] = str(tilegen.matmul.explain(A, B, out=C).spec)
            for vn, call in [("tilegen.matmul (graph)", lambda: tilegen.matmul(A, B, out=C))] + \
                    [(vn, (lambda k: lambda: k(A, B, out=C))(k)) for vn, k in ks.items()]:
                C.fill_(float("nan"))
                call()
                torch.cuda.synchronize()
                err = float(((C.double() - ref).abs().max() / ref.abs().max()).item())
                us = graph_us(call)
                row["v"][vn] = {"us": us, "x": row["cublas_us"] / us, "err": err}
            print(json.dumps(row), flush=True)
            res.append(row)
    with open(os.path.join(a.out, "graph_variants.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
