"""Sustained back-to-back calls (about 2.5 s each) of tilegen and the library it is compared with,
alternating twice: GPU time per call over the second half of each stretch, and the SM clock and board
power NVML reports over that half (where a long run settles at the power cap), after a check of the
results against float64.
argv: case, a tag for the rows, the shape (n for n^3, or MxNxK; default 4096). Cases:
  {tf32,bf16,f16}{rr,rc}  torch.matmul against tilegen.matmul (A row-major; B row- or column-major)
  e4m3                    per-tensor and row-wise scales: torch._scaled_mm against tilegen.matmul (bf16 out)
  fused-{bf16,f16}        bias + GELU(tanh): F.gelu(torch.addmm(b, A, B)) against tilegen.matmul(bias, activation)
Run it once per tree in alternating processes to compare two trees (run 273; runs 266-267 timed the whole
stretch with an earlier version; runs 273-280 had only the matmul cases).

    python3 tools/h200_sustained.py tf32rr head
    python3 tools/h200_sustained.py e4m3 head 8192x8192x1024
"""
import json, sys, threading, time
import torch, torch.nn.functional as F, tilegen
torch.backends.cuda.matmul.allow_tf32 = True
try:
    import pynvml
    pynvml.nvmlInit(); h = pynvml.nvmlDeviceGetHandleByIndex(0)
except Exception:
    pynvml = None
which = sys.argv[1] if len(sys.argv) > 1 else "tf32rr"
tag = sys.argv[2] if len(sys.argv) > 2 else ""
shape = sys.argv[3] if len(sys.argv) > 3 else "4096"
M, N, K = map(int, shape.split("x")) if "x" in shape else (int(shape),) * 3
cuda = dict(device="cuda")


def matmul_case(dt, b_col):
    def mk():
        B = torch.randn(N, K, **cuda, dtype=dt).t() if b_col else torch.randn(K, N, **cuda, dtype=dt)
        return torch.randn(M, K, **cuda, dtype=dt), B, torch.empty(M, N, **cuda, dtype=dt)
    fns = {"torch": lambda s: torch.matmul(s[0], s[1], out=s[2]),
           "tilegen": lambda s: tilegen.matmul(s[0], s[1], out=s[2], allow_tf32=True)}
    ref = lambda s, name: s[0].double() @ s[1].double()   # noqa: E731
    return mk, fns, ref, lambda s: s[2]


def fp8_case():
    one = torch.ones((), **cuda)
    def mk():
        A = (torch.randn(M, K, **cuda) * 0.5).to(torch.float8_e4m3fn)
        B = (torch.randn(N, K, **cuda) * 0.5).to(torch.float8_e4m3fn).t()
        return A, B, torch.rand(M, 1, **cuda) + 0.5, torch.rand(1, N, **cuda) + 0.5, \
            torch.empty(M, N, **cuda, dtype=torch.bfloat16)
    fns = {"torch pt": lambda s: torch._scaled_mm(s[0], s[1], scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
           "tilegen pt": lambda s: tilegen.matmul(s[0], s[1], scale_a=one, scale_b=one, out=s[4]),
           "torch rw": lambda s: torch._scaled_mm(s[0], s[1], scale_a=s[2], scale_b=s[3], out_dtype=torch.bfloat16),
           "tilegen rw": lambda s: tilegen.matmul(s[0], s[1], scale_a=s[2].reshape(-1), scale_b=s[3].reshape(-1),
                                                  out=s[4])}
    def ref(s, name):
        product = s[0].double() @ s[1].double()
        return product * s[2].double() * s[3].double() if name.endswith("rw") else product
    return mk, fns, ref, lambda s: s[4]


def fused_case(dt):
    def mk():
        return torch.randn(M, K, **cuda, dtype=dt), torch.randn(K, N, **cuda, dtype=dt), \
            torch.randn(N, **cuda, dtype=dt), torch.empty(M, N, **cuda, dtype=dt)
    fns = {"addmm+gelu": lambda s: F.gelu(torch.addmm(s[2], s[0], s[1]), approximate="tanh"),
           "tilegen": lambda s: tilegen.matmul(s[0], s[1], bias=s[2], activation="gelu_tanh", out=s[3])}
    ref = lambda s, name: F.gelu(s[0].double() @ s[1].double() + s[2].double(), approximate="tanh")   # noqa: E731
    return mk, fns, ref, lambda s: s[3]


dtypes = {"bf16": torch.bfloat16, "f16": torch.float16, "tf32": torch.float32}
if which == "e4m3":
    mk, fns, ref, result = fp8_case()
elif which.startswith("fused-"):
    mk, fns, ref, result = fused_case(dtypes[which[6:]])
else:
    mk, fns, ref, result = matmul_case(dtypes[which[:-2]], which.endswith("rc"))
sets = [mk() for _ in range(3)]
for name, f in fns.items():
    want = ref(sets[0], name)
    if "tilegen" in name:
        result(sets[0]).fill_(float("nan"))
    got = f(sets[0])
    got = result(sets[0]) if "tilegen" in name else got
    torch.cuda.synchronize()
    err = float((got.double() - want).norm() / want.norm())
    print(tag, which, shape, name, "relative error (Frobenius)", err, flush=True)
# the time of one call, for the stretch's length
f0 = next(iter(fns.values()))
for _ in range(3):
    f0(sets[0])
torch.cuda.synchronize()
t0 = time.perf_counter()
for i in range(10):
    f0(sets[i % 3])
torch.cuda.synchronize()
per_call = (time.perf_counter() - t0) / 10
out = []
for rnd in range(2):
    for name, f in fns.items():
        samples, stop = [], [False]
        def sample():
            while not stop[0]:
                if pynvml:
                    samples.append((pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
                                    pynvml.nvmlDeviceGetPowerUsage(h) / 1000))
                time.sleep(0.05)
        t = threading.Thread(target=sample); t.start()
        calls = max(20, int(2.5 / per_call))
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
        row = dict(tree=tag, case=which, shape=shape, round=rnd, fn=name, us_2nd_half=round(us, 2),
                   sm_mhz_2nd_half=round(mhz), watts_2nd_half=round(sum(s[1] for s in tail) / max(len(tail), 1), 1),
                   mcycles=round(us * mhz / 1e6, 4))
        out.append(row); print(row, flush=True)
        time.sleep(0.7)
print(json.dumps(out))
