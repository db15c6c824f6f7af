"""One 4096^3 GEMM for ncu to profile (argv[1]): km_tf32 (the K-major tf32 kernel, A row, B col),
rs_tf32 (A and B row-major, B's k-steps through registers on TMA: copy='tma'), km_bf16 (the bf16
K-major kernel), cublas_tf32_rr / cublas_tf32_rc / cublas_bf16_rc (torch.matmul). Called 4 times;
profile the last, e.g.

    ncu --section SpeedOfLight --metrics l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum \
        --launch-skip 3 --launch-count 1 python3 tools/ncu_tf32_4096.py rs_tf32
"""
import sys
import torch, tilegen
which = sys.argv[1]
n = 4096
torch.backends.cuda.matmul.allow_tf32 = True
dt = torch.bfloat16 if "bf16" in which else torch.float32
A = torch.randn(n, n, device="cuda", dtype=dt)
B = torch.randn(n, n, device="cuda", dtype=dt)
Bc = B.t().contiguous().t()   # column-major view
C = torch.empty(n, n, device="cuda", dtype=dt)
if which == "km_tf32":
    k = tilegen.compile(tilegen.GemmSpec(dtype="tf32", a_layout="row", b_layout="col", instruction="wgmma",
                                         tile=(128, 256, 32), warps=(8, 1), stages=4))
    f = lambda: k(A, Bc, out=C)
elif which == "rs_tf32":
    k = tilegen.compile(tilegen.GemmSpec(dtype="tf32", a_layout="row", b_layout="row", instruction="wgmma", copy="tma"))
    f = lambda: k(A, B, out=C)
elif which == "km_bf16":
    k = tilegen.compile(tilegen.GemmSpec(dtype="bf16", out_dtype="bf16", a_layout="row", b_layout="col",
                                         instruction="wgmma", tile=(128, 256, 64), warps=(8, 1), stages=4))
    f = lambda: k(A, Bc, out=C)
elif which == "cublas_tf32_rr":
    f = lambda: torch.matmul(A, B, out=C)
elif which == "cublas_tf32_rc":
    f = lambda: torch.matmul(A, Bc, out=C)
elif which == "cublas_bf16_rc":
    f = lambda: torch.matmul(A, Bc, out=C)
for _ in range(4):
    f()
torch.cuda.synchronize()
print("spec", getattr(k, "spec", None) if "cublas" not in which else which)
