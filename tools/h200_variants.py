"""One GPU run comparing GEMM kernel variants: each GemmSpec variant timed kernel-only (CUDA
events around back-to-back kernel(A, B, out=C) calls) at several shapes beside cuBLAS
(torch.matmul) in the same process, with its error against a float64 product. Writes JSON
lines to DIR/variants.jsonl.

    python3 tools/h200_variants.py DIR [--dtype f16] [--shapes 4096x4096x4096 ...]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_timing import events_ms  # noqa: E402

VARIANTS = {
    "default: warp-specialized, TMA store": dict(),
    "warp-specialized, direct store": dict(store="direct"),
    "one CTA per block (TMA loads, direct store)": dict(persistent=False),
    "warp-specialized, TMA store, f32 out": dict(out_dtype="f32"),
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--dtype", default="f16")
    ap.add_argument("--variants", metavar="JSON", help='replace the variants: {"name": {GemmSpec fields}, ...} '
                    '(tuples as lists)')
    ap.add_argument("--rounds", type=int, default=1, help="also time cuBLAS and every variant once per round, "
                    "interleaved, this many rounds (ratios per round: median, min, max)")
    ap.add_argument("--shapes", nargs="+", default=["2048x2048x2048", "4096x4096x4096", "8192x8192x8192",
                                                     "4096x4096x1024", "1024x4096x4096"])
    a = ap.parse_args()
    import torch

    import tilegen

    tdt = {"f16": torch.float16, "bf16": torch.bfloat16}[a.dtype]
    variants = VARIANTS
    if a.variants:
        variants = {name: {k: tuple(v) if isinstance(v, list) else v for k, v in kw.items()}
                    for name, kw in json.loads(a.variants).items()}
    kernels = {name: tilegen.compile(tilegen.GemmSpec(**{"dtype": a.dtype, "out_dtype": a.dtype,
                                                         "instruction": "wgmma", **kw}))
               for name, kw in variants.items()}
    sys.path.insert(0, os.path.join(REPO, "examples", "hopper_ladder"))
    import step7_persistent
    ladder = tilegen.compile(step7_persistent.step7, target="sm_90a") if a.dtype == "f16" else None
    with open(os.path.join(a.out, "variants.jsonl"), "a") as f:
        for shape in a.shapes:
            M, N, K = (int(x) for x in shape.split("x"))
            A = torch.randn(M, K, device="cuda", dtype=tdt)
            B = torch.randn(K, N, device="cuda", dtype=tdt)
            C = torch.empty(M, N, device="cuda", dtype=tdt)
            C32 = torch.empty(M, N, device="cuda", dtype=torch.float32)
            ref = A.double() @ B.double()
            flop = 2.0 * M * N * K
            reps = max(5, int(3e12 / flop))
            row = {"shape": [M, N, K], "dtype": a.dtype,
                   "cublas_tflops": flop / events_ms(lambda: torch.matmul(A, B, out=C), reps)["ms"] / 1e9, "variants": {}}
            stream = torch.cuda.current_stream().cuda_stream
            if a.rounds > 1:   # interleaved: each round times cuBLAS and every variant once
                rounds = {name: [] for name in ["cublas", *kernels]}
                for _ in range(a.rounds):
                    rounds["cublas"].append(events_ms(lambda: torch.matmul(A, B, out=C), reps, rounds=1)["ms"])
                    for name, k in kernels.items():
                        out = C32 if k.spec.out_dtype == "f32" else C
                        rounds[name].append(events_ms(lambda k=k, out=out: k(A, B, out=out), reps, rounds=1)["ms"])
                ratios = {name: sorted(c / v for c, v in zip(rounds["cublas"], ms)) for name, ms in rounds.items()}
                row["interleaved"] = {name: {"vs_cublas_median": r[len(r) // 2], "vs_cublas_min": r[0],
                                             "vs_cublas_max": r[-1], "rounds": len(r)} for name, r in ratios.items()}
            for name, k in kernels.items():
                out = C32 if k.spec.out_dtype == "f32" else C
                out.fill_(float("nan"))
                k(A, B, out=out)
                torch.cuda.synchronize()
                err = float(((out.double() - ref).abs().max() / ref.abs().max()).item())
                ms = events_ms(lambda k=k: k(A, B, out=out), reps)["ms"]
                fc = k.fast_call
                launcher = k.launcher(0)
                args = fc.arguments((M, N, K, A.data_ptr(), K, B.data_ptr(), N, out.data_ptr(), N, 1.0, 0.0, 0, 0, 0, 0, 0))
                grid = fc.grid(M, N, K, launcher.sm_count)
                launch_ms = events_ms(lambda: launcher(grid, args, stream), reps)["ms"]
                row["variants"][name] = {"kernel": k.name, "tflops": flop / ms / 1e9, "launch_tflops": flop / launch_ms / 1e9,
                                         "vs_cublas": flop / ms / 1e9 / row["cublas_tflops"], "rel_err": err}
            if ladder is not None:
                args = {"M": M, "N": N, "K": K, "A_ptr": A.data_ptr(), "A_ld": K, "B_ptr": B.data_ptr(), "B_ld": N,
                        "C_ptr": C32.data_ptr(), "C_ld": N}
                ms = events_ms(lambda: ladder.launch(args, {"M": M, "N": N, "K": K}), reps)["ms"]
                row["variants"]["ladder step 7 (f32 out)"] = {"kernel": ladder.name, "tflops": flop / ms / 1e9,
                                                              "vs_cublas": flop / ms / 1e9 / row["cublas_tflops"]}
            f.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
