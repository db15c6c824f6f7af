"""Host microseconds per call of fp8 per-tensor scaled products (1024^3, bf16 out): torch._scaled_mm with
0-d GPU scales, tilegen.matmul with Python floats, with the same 0-d GPU scales (read by the kernel), and
with 0-d bf16 GPU scales (read back); ways taking turns, medians of 15 rounds of 200 calls; and a loop of
calls at 4096^3 timed on the GPU (the read-back waits for the GPU on every call).

    python3 tools/h200_fp8_scale_host.py
"""
import statistics, time, json
import torch, tilegen
M = N = K = 1024
A = torch.randn(M, K, device="cuda").to(torch.float8_e4m3fn)
B = torch.randn(N, K, device="cuda").to(torch.float8_e4m3fn).t()
C = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
sa, sb = torch.tensor(0.5, device="cuda"), torch.tensor(2.0, device="cuda")
ha, hb = sa.to(torch.bfloat16), sb.to(torch.bfloat16)
fns = {"torch._scaled_mm": lambda: torch._scaled_mm(A, B, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16, out=C),
       "matmul float scales": lambda: tilegen.matmul(A, B, scale_a=0.5, scale_b=2.0, out=C),
       "matmul f32 GPU scales": lambda: tilegen.matmul(A, B, scale_a=sa, scale_b=sb, out=C),
       "matmul bf16 GPU scales (read back)": lambda: tilegen.matmul(A, B, scale_a=ha, scale_b=hb, out=C)}
for f in fns.values():
    for _ in range(20): f()
torch.cuda.synchronize()
samples = {k: [] for k in fns}
for _ in range(15):
    for k, f in fns.items():
        t0 = time.perf_counter()
        for _ in range(200): f()
        samples[k].append((time.perf_counter() - t0) * 1e6 / 200)
        torch.cuda.synchronize()
out = {k: round(statistics.median(v), 2) for k, v in samples.items()}
print("host us per call, 1024^3 fp8:", json.dumps(out))
M = N = K = 4096
A = torch.randn(M, K, device="cuda").to(torch.float8_e4m3fn)
B = torch.randn(N, K, device="cuda").to(torch.float8_e4m3fn).t()
C = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
loop = {}
for name, f in (("f32 GPU scales", lambda: tilegen.matmul(A, B, scale_a=sa, scale_b=sb, out=C)),
                ("bf16 GPU scales (read back)", lambda: tilegen.matmul(A, B, scale_a=ha, scale_b=hb, out=C)),
                ("torch._scaled_mm", lambda: torch._scaled_mm(A, B, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16, out=C))):
    for _ in range(5): f()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(50): f()
    e1.record(); e1.synchronize()
    loop[name] = round(e0.elapsed_time(e1) * 1000 / 50, 2)
print("us per call in a loop of 50, 4096^3 fp8:", json.dumps(loop))
