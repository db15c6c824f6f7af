"""ncu target: an fp8 decoding product (e4m3 x of M x K rows against W.T, W: N x K, bf16 out,
per-tensor GPU scales) as tilegen.matmul runs it ("tilegen") or torch._scaled_mm ("cublaslt"), five
calls after a warm-up; profile the last ones with --launch-skip.

    ncu -k regex:'^(tilegen|nvjet|sm90|cutlass|void)' --launch-skip 4 --launch-count 2 \\
        python3 tools/ncu_fp8_decode.py tilegen 1x4096x4096
"""
import sys

import torch

import tilegen

who = sys.argv[1]
M, N, K = (int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "1x4096x4096").split("x"))
gen = torch.Generator(device="cuda").manual_seed(5)
A = torch.randn(M, K, device="cuda", generator=gen).to(torch.float8_e4m3fn)
B = torch.randn(N, K, device="cuda", generator=gen).to(torch.float8_e4m3fn).t()
C = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
sa, sb = torch.tensor(0.5, device="cuda"), torch.tensor(2.0, device="cuda")
torch.cuda.synchronize()
for _ in range(6):
    if who == "tilegen":
        tilegen.matmul(A, B, scale_a=sa, scale_b=sb, out=C)
    else:
        torch._scaled_mm(A, B, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
torch.cuda.synchronize()
print(tilegen.matmul.explain(A, B, scale_a=sa, scale_b=sb).spec if who == "tilegen" else "cublaslt")
