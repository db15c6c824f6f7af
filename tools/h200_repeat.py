"""Bit-identical results over repeated launches: the default Hopper GEMM (warp-specialized,
TMA-store epilogue), and its 2-CTA cluster, split-K, stream-K fp8, pretransposed and register-B tf32 forms, and stacks on
the TMA stack kernel through tilegen.matmul, launched N times on the same inputs; every result must equal the first bit for bit. Writes JSON to DIR/repeat.json.

    python3 tools/h200_repeat.py DIR [--launches 500]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--launches", type=int, default=500)
    a = ap.parse_args()
    import torch

    import tilegen

    rows = []
    cases = [("f16", {}, (2048, 2048, 2048)), ("bf16", {}, (1000, 1032, 4104)), ("bf16", {}, (4096, 4096, 1024)),
             ("bf16", {"cluster": (2, 1)}, (1000, 1032, 4104)),                         # TMA multicast
             ("bf16", {"split_k": 4, "persistent": False}, (1000, 1032, 4104)),          # split-K's ordered sum
             ("e4m3", {"out_dtype": "bf16"}, (1000, 1032, 4112)),    # fp8, promoted (rows of 16-byte multiples)
             ("bf16", {"stream_k": True}, (1000, 1032, 4104)),                          # stream-K's ordered fix-up
             ("bf16", {"stream_k": True}, (4096, 4096, 1024)),                          # 3 waves + shared blocks
             ("e4m3", {"out_dtype": "bf16", "stream_k": True}, (4096, 4232, 4112)),
             ("bf16", {"pingpong": True, "tile": (64, 256, 64), "warps": (4, 1)}, (1000, 1032, 4104)),
             ("bf16", {"epilogue": tilegen.Epilogue(bias="col", activation="gelu_tanh")}, (1000, 1032, 4104)),
             ("bf16", {"epilogue": tilegen.Epilogue(bias="col", activation="gelu_tanh")}, (4096, 4232, 1040)),  # walks
             ("e4m3", {"out_dtype": "bf16", "epilogue": tilegen.Epilogue(scale_rows=True, scale_cols=True)},
              (1000, 1032, 4112)),                                    # the staged vectors of the epilogue
             ("e4m3", {"out_dtype": "bf16", "epilogue": tilegen.Epilogue(scale_rows=True, scale_cols=True)},
              (4096, 4232, 1040)),       # 8-9 blocks per CTA: each next block's first k-tile under the epilogue
             ("tf32", {"out_dtype": "f32", "pretranspose": True}, (1000, 1032, 4104)),   # B copied K-major first
             ("tf32", {"out_dtype": "f32", "copy": "tma"}, (1000, 1032, 4104)),          # B through registers
             ("tf32", {"out_dtype": "f32", "copy": "tma"}, (4096, 4232, 1040)),          # ... walking 4-5 blocks a CTA
             ("tf32", {"out_dtype": "f32", "pretranspose": "A", "a_layout": "col"}, (1000, 1032, 4104)),  # A copied
             ("tf32", {"out_dtype": "f32", "a_layout": "col", "b_layout": "col", "copy": "tma", "store": "direct"},
              (1000, 1032, 4104)),                                                       # A through registers
             ("f32", {"out_dtype": "f32"}, (1000, 1032, 4104))]                         # tf32 parts, promoted
    for dtype, extra, (M, N, K) in cases:
        k = tilegen.compile(tilegen.GemmSpec(**{"dtype": dtype, "out_dtype": dtype, "instruction": "wgmma", **extra}))
        if dtype == "e4m3":   # K-major operands: B the transpose of a row-major N x K matrix
            A = torch.randn(M, K, device="cuda").to(torch.float8_e4m3fn)
            B = torch.randn(N, K, device="cuda").to(torch.float8_e4m3fn).t()
        else:
            tdt = {"f16": torch.float16, "bf16": torch.bfloat16, "tf32": torch.float32, "f32": torch.float32}[dtype]
            A = torch.randn(K, M, device="cuda", dtype=tdt).t() if extra.get("a_layout") == "col" else \
                torch.randn(M, K, device="cuda", dtype=tdt)
            B = torch.randn(N, K, device="cuda", dtype=tdt).t() if extra.get("b_layout") == "col" else \
                torch.randn(K, N, device="cuda", dtype=tdt)
        epi = k.spec.epilogue
        kw = {}
        if epi.bias:
            kw["bias"] = torch.randn(N if epi.bias == "col" else M, device="cuda", dtype=torch.bfloat16)
        if epi.scale_rows:
            kw["scale_a"] = torch.rand(M, device="cuda") + 0.5
        if epi.scale_cols:
            kw["scale_b"] = torch.rand(N, device="cuda") + 0.5
        first = k(A, B, **kw).clone()
        C = torch.empty_like(first)
        differ = 0
        for _ in range(a.launches - 1):
            C.fill_(float("nan"))
            k(A, B, out=C, **kw)
            differ += int(not torch.equal(C.view(torch.int16), first.view(torch.int16)))
        row = {"kernel": k.name, "shape": [M, N, K], "launches": a.launches, "launches_differing": differ}
        rows.append(row)
        print(json.dumps(row), flush=True)
    # stacks through tilegen.matmul on the TMA stack kernel (3-D tensor maps): ragged matrices with
    # a broadcast B, rows of 77 elements (aligned copies in, C's copy back), and a decode-like stack
    # whose K is split (its slices' partial sums added in slice order by the last slice to finish a block)
    for count, (M, N, K), nb in ((6, (300, 1000, 1000), 1), (64, (77, 77, 64), 64), (8, (16, 128, 16384), 8)):
        A = torch.randn(count, M, K, device="cuda", dtype=torch.bfloat16)
        B = torch.randn(nb, K, N, device="cuda", dtype=torch.bfloat16).expand(count, K, N)
        first = tilegen.matmul(A, B).clone()
        C = torch.empty_like(first)
        differ = 0
        for _ in range(a.launches - 1):
            C.fill_(float("nan"))
            tilegen.matmul(A, B, out=C)
            differ += int(not torch.equal(C.view(torch.int16), first.view(torch.int16)))
        row = {"kernel": tilegen.compile(tilegen.matmul.explain(A, B).spec).name, "stack": [count, M, N, K, nb],
               "launches": a.launches, "launches_differing": differ}
        rows.append(row)
        print(json.dumps(row), flush=True)
    with open(os.path.join(a.out, "repeat.json"), "w") as f:
        json.dump(rows, f, indent=1)
    return 1 if any(r["launches_differing"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
