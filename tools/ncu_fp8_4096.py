"""ncu target: the fp8 (e4m3) warp-specialized wgmma GEMM at 4096^3, bf16 out, its third launch; the
promotion interval from argv[1] (default 2; 0 = none).

    ncu --launch-skip 2 --launch-count 1 --section WarpStateStats python3 tools/ncu_fp8_4096.py 2
"""
import sys

import torch

import tilegen

M = N = K = 4096
promote = int(sys.argv[1]) if len(sys.argv) > 1 else 2
A = torch.randn(M, K, device="cuda").to(torch.float8_e4m3fn)
B = torch.randn(N, K, device="cuda").to(torch.float8_e4m3fn).t()
C = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
spec = tilegen.GemmSpec(dtype="e4m3", out_dtype="bf16", instruction="wgmma", promote=promote)
k = tilegen.compile(spec)
for _ in range(3):
    k(A, B, out=C)
torch.cuda.synchronize()
