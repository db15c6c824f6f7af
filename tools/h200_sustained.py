"""Sustained back-to-back calls (about 3 s each) of torch.matmul and tilegen.matmul at 4096^3, alternating twice:
GPU time per call over the whole stretch, and the SM clock and board power NVML reports over its second half (where
a long run settles at the power cap). argv: tf32rr (default), tf32rc or bf16rc (A row-major; B row- or
column-major).

    python3 tools/h200_sustained.py tf32rr
"""
import json, sys, threading, time
import torch, tilegen
torch.backends.cuda.matmul.allow_tf32 = True
try:
    import pynvml
    pynvml.nvmlInit(); h = pynvml.nvmlDeviceGetHandleByIndex(0)
except Exception:
    pynvml = None
n = 4096
which = sys.argv[1] if len(sys.argv) > 1 else "tf32rr"
dt = torch.bfloat16 if which.startswith("bf16") else torch.float32
def mk():
    B = torch.randn(n, n, device="cuda", dtype=dt)
    return torch.randn(n, n, device="cuda", dtype=dt), (B.t() if which.endswith("rc") else B), torch.empty(n, n, device="cuda", dtype=dt)
sets = [mk() for _ in range(3)]
fns = {"torch": lambda s: torch.matmul(s[0], s[1], out=s[2]), "tilegen": lambda s: tilegen.matmul(s[0], s[1], out=s[2], allow_tf32=True)}
for f in fns.values():
    f(sets[0])
torch.cuda.synchronize()
out = []
for rnd in range(2):
    for name, f in fns.items():
        samples, stop = [], [False]
        def sample():
            while not stop[0]:
                if pynvml:
                    samples.append((pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM), pynvml.nvmlDeviceGetPowerUsage(h) / 1000))
                time.sleep(0.05)
        t = threading.Thread(target=sample); t.start()
        calls = int(3.0 / (400e-6 if dt == torch.float32 else 190e-6))
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for i in range(calls):
            f(sets[i % 3])
        e1.record(); e1.synchronize()
        stop[0] = True; t.join()
        us = e0.elapsed_time(e1) * 1000 / calls
        tail = samples[len(samples) // 2:]
        row = dict(case=which, round=rnd, fn=name, us=round(us, 2), calls=calls,
                   sm_mhz_2nd_half=round(sum(s[0] for s in tail) / max(len(tail), 1)), watts_2nd_half=round(sum(s[1] for s in tail) / max(len(tail), 1), 1))
        out.append(row); print(row, flush=True)
        time.sleep(1.0)
print(json.dumps(out))
