"""tf32 with A and B column-major: A's k-steps through registers (TMA-store epilogue, direct stores, group_m
16) against copying A K-major first and torch.matmul, beside the register kernel of A and B row-major on
row-major operands of the same shape (GPU time per call, interleaved rounds, 3 operand sets).

    python3 tools/h200_tf32_cc_variants.py MxNxK ...
"""
import json, os, sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tilegen  # noqa: E402
from gpu_timing import interleaved_us, max_relative_error  # noqa: E402
from tilegen.gemm.spec import GemmSpec  # noqa: E402
torch.backends.cuda.matmul.allow_tf32 = True
base = dict(dtype="tf32", out_dtype="f32", instruction="wgmma", target="sm_90a")
ks = {"cc regs tma-store": GemmSpec(**base, a_layout="col", b_layout="col", copy="tma"),
      "cc regs direct": GemmSpec(**base, a_layout="col", b_layout="col", copy="tma", store="direct"),
      "cc regs g16": GemmSpec(**base, a_layout="col", b_layout="col", copy="tma", group_m=16),
      "cc copy first": GemmSpec(**base, a_layout="col", b_layout="col", pretranspose=True)}
kk = {n: tilegen.compile(s) for n, s in ks.items()}
rr = tilegen.compile(GemmSpec(**base, a_layout="row", b_layout="row", copy="tma"))
out = {}
for sh in sys.argv[1:]:
    M, N, K = map(int, sh.split("x"))
    sets = [(torch.randn(K, M, device="cuda").t(), torch.randn(N, K, device="cuda").t(), torch.empty(M, N, device="cuda")) for _ in range(3)]
    rsets = [(torch.randn(M, K, device="cuda"), torch.randn(K, N, device="cuda"), torch.empty(M, N, device="cuda")) for _ in range(3)]
    fns = {"torch cc": lambda s: torch.matmul(s[0], s[1], out=s[2])}
    for n, k in kk.items():
        fns[n] = (lambda k: lambda s: k(s[0], s[1], out=s[2]))(k)
    A, B, C = sets[0]
    ref = A.double() @ B.double(); scale = A.double().abs() @ B.double().abs()
    err = {n: max_relative_error(lambda f=f: f(sets[0]), C, ref, scale) for n, f in fns.items()}
    us = interleaved_us(fns, sets, max(10, int(1e11 / (M * N * K))))
    us_rr = interleaved_us({"rr regs": lambda s: rr(s[0], s[1], out=s[2]), "torch rr": lambda s: torch.matmul(s[0], s[1], out=s[2])}, rsets, max(10, int(1e11 / (M * N * K))))
    out[sh] = dict(us={**us, **us_rr}, err=err)
    print(sh, out[sh]["us"], {n: f"{e:.1e}" for n, e in err.items()}, flush=True)
print(json.dumps(out))
