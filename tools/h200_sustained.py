"""Sustained back-to-back calls (about 2.5 s each) of torch.matmul and tilegen.matmul at 4096^3, alternating
twice: GPU time per call over the second half of each stretch, and the SM clock and board power NVML reports
over that half (where a long run settles at the power cap), after a check of both results against float64.
argv: case, {tf32,bf16,f16}{rr,rc} (A row-major; B row- or column-major; default tf32rr), a tag for the rows
and the size n (default 4096).
Run it once per tree in alternating processes to compare two trees (run 273; runs 266-267 timed the whole
stretch with an earlier version).

    python3 tools/h200_sustained.py tf32rr head
"""
import json, sys, threading, time
import torch, tilegen
torch.backends.cuda.matmul.allow_tf32 = True
try:
    import pynvml
    pynvml.nvmlInit(); h = pynvml.nvmlDeviceGetHandleByIndex(0)
except Exception:
    pynvml = None
which = sys.argv[1] if len(sys.argv) > 1 else "tf32rr"
tag = sys.argv[2] if len(sys.argv) > 2 else ""
n = int(sys.argv[3]) if len(sys.argv) > 3 else 4096
dt = {"bf16": torch.bfloat16, "f16": torch.float16, "tf32": torch.float32}[which[:-2]]
def mk():
    B = torch.randn(n, n, device="cuda", dtype=dt)
    return torch.randn(n, n, device="cuda", dtype=dt), (B.t() if which.endswith("rc") else B), torch.empty(n, n, device="cuda", dtype=dt)
sets = [mk() for _ in range(3)]
fns = {"torch": lambda s: torch.matmul(s[0], s[1], out=s[2]), "tilegen": lambda s: tilegen.matmul(s[0], s[1], out=s[2], allow_tf32=True)}
A, B, C = sets[0]
ref = A.double() @ B.double()
for name, f in fns.items():
    C.fill_(float("nan")); f(sets[0]); torch.cuda.synchronize()
    print(tag, which, name, "max rel err", ((C.double() - ref).abs().max() / ref.abs().max()).item(), flush=True)
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
        calls = int(2.5 / ((400e-6 if dt == torch.float32 else 190e-6) * (n / 4096) ** 3))
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
        ev[0].record()
        for i in range(calls):
            if i == calls // 2:
                ev[1].record()
            f(sets[i % 3])
        ev[2].record(); ev[2].synchronize()
        stop[0] = True; t.join()
        us = ev[1].elapsed_time(ev[2]) * 1000 / (calls - calls // 2)
        tail = samples[len(samples) // 2:]
        mhz = sum(s[0] for s in tail) / max(len(tail), 1)
        row = dict(tree=tag, case=which, n=n, round=rnd, fn=name, us_2nd_half=round(us, 2), sm_mhz_2nd_half=round(mhz),
                   watts_2nd_half=round(sum(s[1] for s in tail) / max(len(tail), 1), 1), mcycles=round(us * mhz / 1e6, 4))
        out.append(row); print(row, flush=True)
        time.sleep(0.7)
print(json.dumps(out))
