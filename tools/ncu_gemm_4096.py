"""ncu target: the persistent warp-specialized TMA wgmma GEMM at 4096^3 f16 (its third launch)."""
import torch

import tilegen

M = N = K = 4096
A = torch.randn(M, K, device="cuda", dtype=torch.float16)
B = torch.randn(K, N, device="cuda", dtype=torch.float16)
C = torch.empty(M, N, device="cuda", dtype=torch.float16)
k = tilegen.compile(tilegen.GemmSpec(dtype="f16", out_dtype="f16", instruction="wgmma", persistent=True))
for _ in range(3):
    k(A, B, out=C)
torch.cuda.synchronize()
