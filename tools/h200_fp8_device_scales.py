"""fp8 per-tensor at 4096^3 (3 operand sets rotated): the float-scale kernel against the device-scale kernel, launched as prepared
launches (kernel.launch) and as called (tilegen.matmul), GPU time per call, interleaved rounds.

    python3 tools/h200_fp8_device_scales.py
"""
import json, statistics
import torch, tilegen
from tilegen.gemm import GemmSpec, Epilogue
M = N = K = 4096
SETS = [((torch.randn(M, K, device="cuda") * 0.5).to(torch.float8_e4m3fn),
         (torch.randn(N, K, device="cuda") * 0.5).to(torch.float8_e4m3fn).t(),
         torch.empty(M, N, device="cuda", dtype=torch.bfloat16)) for _ in range(3)]
A, B, C = SETS[0]
sa, sb = torch.tensor(0.5, device="cuda"), torch.tensor(2.0, device="cuda")
base = tilegen.matmul.explain(A, B, scale_a=0.5, scale_b=2.0, out=C).spec
dev = tilegen.matmul.explain(A, B, scale_a=sa, scale_b=sb, out=C).spec
kf, kd = tilegen.compile(base), tilegen.compile(dev)
ARGS = [{"M": M, "N": N, "K": K, "A_ptr": a.data_ptr(), "A_ld": K, "B_ptr": b.data_ptr(), "B_ld": K,
         "C_ptr": c.data_ptr(), "C_ld": N, "alpha": 1.0, "beta": 0.0} for a, b, c in SETS]
sizes = {"M": M, "N": N, "K": K}
ARGD = [dict(x, scale_a_ptr=sa.data_ptr(), scale_b_ptr=sb.data_ptr()) for x in ARGS]
stream = torch.cuda.current_stream().cuda_stream
fns = {"launch float": lambda i: kf.launch(ARGS[i], sizes, stream=stream),
       "launch device": lambda i: kd.launch(ARGD[i], sizes, stream=stream),
       "matmul float": lambda i: tilegen.matmul(SETS[i][0], SETS[i][1], scale_a=0.5, scale_b=2.0, out=SETS[i][2]),
       "matmul device": lambda i: tilegen.matmul(SETS[i][0], SETS[i][1], scale_a=sa, scale_b=sb, out=SETS[i][2]),
       "torch": lambda i: torch._scaled_mm(SETS[i][0], SETS[i][1], scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16,
                                           out=SETS[i][2])}
t = {k: [] for k in fns}
for f in fns.values():
    for i in range(3): f(i)
torch.cuda.synchronize()
for _ in range(9):
    for k, f in fns.items():
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for i in range(60): f(i % 3)
        e1.record(); e1.synchronize()
        t[k].append(e0.elapsed_time(e1) * 1000 / 60)
print(json.dumps({k: round(statistics.median(v), 2) for k, v in t.items()}))
print(kf.name, kd.name, kf.function().local_bytes, kd.function().local_bytes)
import warnings
