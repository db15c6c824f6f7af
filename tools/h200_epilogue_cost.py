"""What the epilogue costs the Hopper GEMM: ladder step 7 (each math thread stores its f32
accumulator to global memory), the same kernel with the store kept but never taken (a run-time
guard no problem meets, so the wgmmas stay), step 8 (f16 through shared memory and TMA stores:
half blocks, whole blocks with 3 stages, quarter blocks, quarter blocks in two alternating
buffers), and the GEMM's warp-specialized
kernel with direct stores and with TMA stores, kernel-only beside cuBLAS, f16, A and B
row-major. Writes JSON lines to DIR/epilogue.jsonl.

    python3 tools/h200_epilogue_cost.py DIR [--sizes 4096 8192 2048 4096x4096x1024]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import types

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LADDER = os.path.join(REPO, "examples", "hopper_ladder")
sys.path.insert(0, REPO)
sys.path.insert(0, LADDER)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_timing import events_ms  # noqa: E402

STORE = "            tg.store(C.block(m0 + (tg.warp_id() - 4) * 16, n0), acc)\n"
GUARDED = ("            with tg.if_(tg.gt(M, 1 << 30)):   # never: the wgmmas stay, the store is skipped\n"
           "                tg.store(C.block(m0 + (tg.warp_id() - 4) * 16, n0), acc)\n")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--sizes", nargs="+", default=["4096", "8192", "2048", "4096x4096x1024"])
    a = ap.parse_args()
    import torch

    import step7_persistent
    import step8_tma_store
    import tilegen

    source = open(os.path.join(LADDER, "step7_persistent.py")).read()
    assert STORE in source
    module = types.ModuleType("step7_no_store")
    exec(compile(source.replace(STORE, GUARDED).replace('if __name__ == "__main__":', "if False:"),
                 "step7_no_store.py", "exec"), module.__dict__)
    ladder = {"step 7 (f32 C, direct stores)": (tilegen.compile(step7_persistent.step7, target="sm_90a"), 32),
              "step 7 without its store": (tilegen.compile(module.step7, target="sm_90a"), 32),
              "step 8 (f16 C, TMA stores, half blocks)": (tilegen.compile(step8_tma_store.step8, target="sm_90a"), 16),
              "step 8, 3 stages, whole blocks": (tilegen.compile(step8_tma_store.step8, target="sm_90a", stages=3,
                                                                 parts=1), 16),
              "step 8, quarter blocks": (tilegen.compile(step8_tma_store.step8, target="sm_90a", parts=4), 16),
              "step 8, quarter blocks, two buffers": (tilegen.compile(step8_tma_store.step8, target="sm_90a", parts=4,
                                                                      buffers=2), 16)}
    gemm = {f"GEMM, warp-specialized, {s} stores": tilegen.compile(
        tilegen.GemmSpec(dtype="f16", out_dtype="f16", instruction="wgmma", store=s)) for s in ("direct", "tma")}
    with open(os.path.join(a.out, "epilogue.jsonl"), "a") as f:
        for size in a.sizes:
            M, N, K = (int(x) for x in size.split("x")) if "x" in size else (int(size),) * 3
            A = torch.randn(M, K, device="cuda", dtype=torch.float16)
            B = torch.randn(K, N, device="cuda", dtype=torch.float16)
            C = {32: torch.empty(M, N, device="cuda", dtype=torch.float32),
                 16: torch.empty(M, N, device="cuda", dtype=torch.float16)}
            flop = 2.0 * M * N * K
            cublas = events_ms(lambda: torch.matmul(A, B, out=C[16]), 20)["ms"]
            row = {"size": [M, N, K], "cublas_tflops": flop / cublas / 1e9, "tflops": {}}
            for name, k in gemm.items():
                row["tflops"][name] = flop / events_ms(lambda k=k: k(A, B, out=C[16]), 20)["ms"] / 1e9
            sizes = {"M": M, "N": N, "K": K}
            for name, (k, bits) in ladder.items():
                args = {"M": M, "N": N, "K": K, "A_ptr": A.data_ptr(), "A_ld": K, "B_ptr": B.data_ptr(), "B_ld": N,
                        "C_ptr": C[bits].data_ptr(), "C_ld": N}
                row["tflops"][name] = flop / events_ms(lambda k=k, args=args: k.launch(args, sizes), 20)["ms"] / 1e9
            f.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
