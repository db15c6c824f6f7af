"""One GPU run for the Hopper ladder: every step's kernel timed kernel-only (CUDA events around
back-to-back launches) at several sizes beside cuBLAS (torch.matmul) and the cp.async wgmma
GEMM (GemmSpec(instruction="wgmma")) in the same process, f16, A and B row-major; plus
tilegen.matmul as called at the shape whose kernel choice changed. Writes JSON to DIR.

    python3 tools/h200_ladder.py DIR [--sizes 2048 4096 8192]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "examples", "hopper_ladder"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_timing import events_ms  # noqa: E402


def host_us(rounds: int = 21, calls: int = 200) -> dict:
    """Host microseconds per call of kernel(A, B, out=C) and kernel.launch for the TMA and the
    cp.async wgmma kernels (bf16 256^3, torch tensors), interleaved round by round; the TMA
    kernel's call also builds (looks up) two tensor maps."""
    import torch

    import tilegen

    A = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
    B = torch.randn_like(A)
    C = torch.empty_like(A)
    ks = {c: tilegen.compile(tilegen.GemmSpec(dtype="bf16", out_dtype="bf16", instruction="wgmma", copy=c))
          for c in ("tma", "cp.async")}
    args = {"M": 256, "N": 256, "K": 256, "A_ptr": A.data_ptr(), "A_ld": 256, "B_ptr": B.data_ptr(), "B_ld": 256,
            "C_ptr": C.data_ptr(), "C_ld": 256, "alpha": 1.0, "beta": 0.0}
    sizes = {"M": 256, "N": 256, "K": 256}
    lines = {f"{c} kernel(A, B, out=C)": (lambda k=k: k(A, B, out=C)) for c, k in ks.items()}
    lines.update({f"{c} kernel.launch": (lambda k=k: k.launch(args, sizes)) for c, k in ks.items()})
    lines["torch.matmul"] = lambda: torch.matmul(A, B, out=C)
    got = {name: [] for name in lines}
    for fn in lines.values():
        fn()
    torch.cuda.synchronize()
    for _ in range(rounds):
        for name, fn in lines.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            got[name].append((time.perf_counter() - t0) * 1e6 / calls)
            torch.cuda.synchronize()
    return {name: statistics.median(v) for name, v in got.items()}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--sizes", nargs="+", type=int, default=[2048, 4096, 8192])
    ap.add_argument("--steps", nargs="+", default=None, help="only the steps whose names start with these")
    ap.add_argument("--no-host", action="store_true", help="skip the host-cost section")
    a = ap.parse_args()
    import torch

    import common
    import step1_one_tile
    import step2_k_loop
    import tilegen
    import step3_grid
    import step4_tma
    import step5_pipeline
    import step6_warp_specialized
    import step7_persistent
    import step8_tma_store
    import step9_cluster
    import step10_pingpong

    kernels = {"step3 grid (cp.async, synchronous)": tilegen.compile(step3_grid.step3, target="sm_90a"),
               "step4 TMA + mbarrier": tilegen.compile(step4_tma.step4, target="sm_90a"),
               "step5 pipeline (4 stages)": tilegen.compile(step5_pipeline.step5, target="sm_90a"),
               "step5 pipeline (3 stages)": tilegen.compile(step5_pipeline.step5, stages=3, target="sm_90a"),
               "step6 warp specialized (4 stages)": tilegen.compile(step6_warp_specialized.step6, target="sm_90a"),
               "step6 warp specialized (3 stages)": tilegen.compile(step6_warp_specialized.step6, stages=3,
                                                                    target="sm_90a"),
               "step7 persistent, warp specialized (4 stages)": tilegen.compile(step7_persistent.step7,
                                                                                target="sm_90a"),
               "step8 TMA-store epilogue (f16 C)": tilegen.compile(step8_tma_store.step8, target="sm_90a"),
               "step9 2-CTA cluster, B multicast": tilegen.compile(step9_cluster.step9, target="sm_90a"),
               "step10 ping-pong consumers (f16 C)": tilegen.compile(step10_pingpong.step10, target="sm_90a")}
    if a.steps:
        kernels = {n: k for n, k in kernels.items() if any(n.startswith(s) for s in a.steps)}
    f16_out = {"step8 TMA-store epilogue (f16 C)", "step10 ping-pong consumers (f16 C)"}
    wg = tilegen.compile(tilegen.GemmSpec(dtype="f16", instruction="wgmma", b_layout="row", out_dtype="f32"))
    # steps 1 and 2 compute one 64 x 128 block: checked and timed at their own sizes
    one_tile = {}
    for name, fn, shape in [("step1 one tile (one k-tile)", step1_one_tile.step1, (64, 128, 64)),
                            ("step2 K loop (one tile)", step2_k_loop.step2, (64, 128, 4096))]:
        if a.steps and not any(name.startswith(s) for s in a.steps):
            continue
        k = tilegen.compile(fn, target="sm_90a")
        err, bound, ms = common.check(k, *shape, device="gpu", seed=1, time=True)
        one_tile[name] = {"size": list(shape), "ms": ms, "tflops": 2.0 * shape[0] * shape[1] * shape[2] / ms / 1e9,
                          "rel_err": err, "bound": bound}
        print(json.dumps({name: one_tile[name]}), flush=True)
    rows = []
    for n in a.sizes:
        M = N = K = n
        A = torch.randn(M, K, device="cuda", dtype=torch.float16)
        B = torch.randn(K, N, device="cuda", dtype=torch.float16)
        C = torch.empty(M, N, device="cuda", dtype=torch.float32)
        C16 = torch.empty(M, N, device="cuda", dtype=torch.float16)
        ref = (A.double() @ B.double())
        reps = max(3, int(2e12 / (2.0 * M * N * K)))
        flop = 2.0 * M * N * K
        cub = events_ms(lambda: torch.matmul(A, B), reps)
        row = {"size": [M, N, K], "cublas_tflops": flop / cub["ms"] / 1e9, "steps": {}}
        args = {"M": M, "N": N, "K": K, "A_ptr": A.data_ptr(), "A_ld": K, "B_ptr": B.data_ptr(), "B_ld": N,
                "C_ptr": C.data_ptr(), "C_ld": N}
        sizes = {"M": M, "N": N, "K": K}
        for name, k in kernels.items():
            out = C16 if name in f16_out else C
            kargs = dict(args, C_ptr=out.data_ptr())
            out.fill_(float("nan"))
            k.launch(kargs, sizes)
            torch.cuda.synchronize()
            err = float(((out.double() - ref).abs().max() / ref.abs().max()).item())
            t = events_ms(lambda k=k, kargs=kargs: k.launch(kargs, sizes), reps)
            row["steps"][name] = {"tflops": flop / t["ms"] / 1e9, "ms": t["ms"], "rel_err": err,
                                  "vs_cublas": cub["ms"] / t["ms"]}
        C.fill_(float("nan"))
        wg(A, B, out=C)
        torch.cuda.synchronize()
        err = float(((C.double() - ref).abs().max() / ref.abs().max()).item())
        t = events_ms(lambda: wg(A, B, out=C), reps)
        row["steps"]["the wgmma GEMM (GemmSpec instruction=wgmma, TMA)"] = {
            "tflops": flop / t["ms"] / 1e9, "ms": t["ms"], "rel_err": err, "vs_cublas": cub["ms"] / t["ms"]}
        rows.append(row)
        print(json.dumps(row), flush=True)
    # tilegen.matmul at 1024x4096x4096: its choice moved to the wgmma preset
    M, N, K = 1024, 4096, 4096
    A = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    B = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    C = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    reps = 50
    mm = events_ms(lambda: tilegen.matmul(A, B, out=C), reps)
    th = events_ms(lambda: torch.matmul(A, B, out=C), reps)
    choice = str(tilegen.matmul.explain(A, B, out=C).spec) if hasattr(tilegen.matmul, "explain") else ""
    short = {"size": [M, N, K], "dtype": "bf16", "tilegen_matmul_tflops": 2.0 * M * N * K / mm["ms"] / 1e9,
             "torch_matmul_tflops": 2.0 * M * N * K / th["ms"] / 1e9, "choice": choice}
    print(json.dumps(short), flush=True)
    host = {} if a.no_host else host_us()
    print(json.dumps(host), flush=True)
    info = {"host_us": host, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "when": time.strftime("%Y-%m-%d %H:%M:%S"),
            "one_tile": one_tile, "sizes": rows, "matmul_short_m": short}
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "ladder.json"), "w") as f:
        json.dump(info, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
