"""Stacks through tilegen.matmul on the H200, as users call them (runs 125-134 of 2026-11-24):
host microseconds per call (3-D activations and 2-D, with and without out=, beside torch.matmul),
activations (batch, tokens, features) @ W.T folded into one product (do_bench of the call, beside
torch.matmul / F.linear), and stacks of products (one batched launch, or matrix by matrix) beside
torch.matmul; --sweep also times each of the batched tiles; --stacks skips the first two parts.
Writes JSON to $OUT/stacks.json.

    python3 tools/h200_stacks.py [--stacks] [--sweep]
"""
import json, os, statistics, sys, time
import torch, triton
import tilegen
out = {}
dev = "cuda"
def host_us(fns, calls=200, rounds=15):
    res = {k: [] for k in fns}
    for k, f in fns.items():
        for _ in range(50): f()
    torch.cuda.synchronize()
    for _ in range(rounds):
        for k, f in fns.items():
            t = time.perf_counter()
            for _ in range(calls): f()
            res[k].append((time.perf_counter() - t) / calls * 1e6)
            torch.cuda.synchronize()
    return {k: round(statistics.median(v), 2) for k, v in res.items()}

g = torch.Generator(device=dev).manual_seed(0)
x3 = torch.randn(4, 64, 256, device=dev, dtype=torch.bfloat16, generator=g)
W = torch.randn(256, 256, device=dev, dtype=torch.bfloat16, generator=g)
o3 = torch.empty(4, 64, 256, device=dev, dtype=torch.bfloat16)
x2, o2 = x3.reshape(256, 256), o3.reshape(256, 256)
out["host_us_bf16_4x64x256_at_256x256"] = {} if "--stacks" in sys.argv else host_us({
    "torch.matmul 3-D": lambda: torch.matmul(x3, W.T, out=o3),
    "tilegen.matmul 3-D": lambda: tilegen.matmul(x3, W.T, out=o3),
    "torch.matmul 2-D": lambda: torch.matmul(x2, W.T, out=o2),
    "tilegen.matmul 2-D": lambda: tilegen.matmul(x2, W.T, out=o2),
    "tilegen.matmul 3-D no out": lambda: tilegen.matmul(x3, W.T),
    "torch.matmul 3-D no out": lambda: torch.matmul(x3, W.T),
})
print(out, flush=True)
if "--host" in sys.argv:
    x2n = lambda: tilegen.matmul(x2, W.T)
    out["host_us_no_out"] = host_us({"torch.matmul 2-D no out": lambda: torch.matmul(x2, W.T), "tilegen.matmul 2-D no out": x2n,
                                     "torch.matmul 3-D no out": lambda: torch.matmul(x3, W.T),
                                     "tilegen.matmul 3-D no out": lambda: tilegen.matmul(x3, W.T)})
    print(out, flush=True)
    json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "stacks-host.json"), "w"), indent=1)
    sys.exit(0)

def tflops(flop, ms): return round(flop / ms / 1e9, 1)
rows = []
for (b, s, h, n, bias) in ([] if "--stacks" in sys.argv else  [(8, 512, 4096, 11008, True), (4, 1024, 4096, 4096, False), (2, 2048, 8192, 8192, False),
                           (1, 64, 8192, 28672, False)]):
    x = torch.randn(b, s, h, device=dev, dtype=torch.bfloat16, generator=g)
    Wt = torch.randn(n, h, device=dev, dtype=torch.bfloat16, generator=g)
    bb = torch.randn(n, device=dev, dtype=torch.bfloat16, generator=g) if bias else None
    C = torch.empty(b, s, n, device=dev, dtype=torch.bfloat16)
    if bias:
        tt = triton.testing.do_bench(lambda: torch.addmm(bb, x.view(-1, h), Wt.T, out=C.view(-1, n)), warmup=50, rep=300)
        tg = triton.testing.do_bench(lambda: tilegen.matmul(x, Wt.T, bias=bb, out=C), warmup=50, rep=300)
        t3 = triton.testing.do_bench(lambda: torch.nn.functional.linear(x, Wt, bb), warmup=50, rep=300)
    else:
        tt = triton.testing.do_bench(lambda: torch.matmul(x, Wt.T, out=C), warmup=50, rep=300)
        tg = triton.testing.do_bench(lambda: tilegen.matmul(x, Wt.T, out=C), warmup=50, rep=300)
        t3 = triton.testing.do_bench(lambda: torch.nn.functional.linear(x, Wt), warmup=50, rep=300)
    ref = (x.double().reshape(-1, h)[:256] @ Wt.double().T) + (bb.double() if bias else 0)
    got = tilegen.matmul(x, Wt.T, bias=bb).reshape(-1, n)[:256].double()
    err = float(torch.linalg.norm(got - ref) / torch.linalg.norm(ref))
    flop = 2 * b * s * h * n
    r = dict(shape=f"({b},{s},{h}) @ W.T ({n}x{h})" + (" + bias" if bias else ""), tilegen_tflops=tflops(flop, tg),
             torch_tflops=tflops(flop, tt), linear_tflops=tflops(flop, t3), x_torch=round(tt / tg, 3), x_linear=round(t3 / tg, 3),
             rel_err=err, why=tilegen.matmul.explain(x, Wt.T, bias=bb).reason.split(";")[0])
    print(r, flush=True); rows.append(r)
out["folded"] = rows
import importlib
mmod = importlib.import_module('tilegen.gemm.matmul')
rows = []
from tilegen import GemmSpec
real = mmod._batched_spec
SPECS = {"t128x256": dict(tile=(128, 256, 64), warps=(8, 1), stages=4), "t128x128": dict(tile=(128, 128, 64), warps=(8, 1), stages=4),
         "t64x128": dict(tile=(64, 128, 64), warps=(4, 1), stages=6), "t64x256": dict(tile=(64, 256, 64), warps=(4, 1), stages=4)}
for (b, m, k, n) in [(64, 128, 64, 128), (64, 256, 128, 256), (32, 512, 64, 512), (16, 1024, 1024, 1024),
                     (8, 2048, 2048, 2048), (4, 4096, 4096, 4096), (32, 1024, 128, 1024), (96, 512, 512, 512)]:
    A = torch.randn(b, m, k, device=dev, dtype=torch.bfloat16, generator=g)
    B = torch.randn(b, k, n, device=dev, dtype=torch.bfloat16, generator=g)
    C = torch.empty(b, m, n, device=dev, dtype=torch.bfloat16)
    flop = 2 * b * m * n * k
    r = dict(shape=f"({b},{m},{k}) @ ({b},{k},{n})", why=tilegen.matmul.explain(A, B).reason[:120])
    tt = triton.testing.do_bench(lambda: torch.matmul(A, B, out=C), warmup=20, rep=200)
    r["torch_tflops"] = tflops(flop, tt)
    modes = [("default", None), ("loop", "loop")] + ([(k2, v) for k2, v in SPECS.items()] if "--sweep" in sys.argv else [])
    for mode, how in modes:
        mmod._stacks.clear()
        if how is None:
            mmod._batched_spec = real
        elif how == "loop":
            mmod._batched_spec = lambda *a: None
        else:
            mmod._batched_spec = lambda *a, how=how: GemmSpec(dtype="bf16", out_dtype="bf16", instruction="wgmma",
                                                                     target="sm_90a", batched=True, **how)
        try:
            tg = triton.testing.do_bench(lambda: tilegen.matmul(A, B, out=C), warmup=20, rep=200)
            got = tilegen.matmul(A, B).double()
        except Exception as e:
            r[mode] = repr(e)[:80]; continue
        ref = A.double() @ B.double()
        r[mode] = (tflops(flop, tg), round(tt / tg, 3), float(torch.linalg.norm(got - ref) / torch.linalg.norm(ref)))
    mmod._batched_spec = real
    mmod._stacks.clear()
    print(r, flush=True); rows.append(r)
out["stacks"] = rows
A = torch.randn(16, 128, 64, device=dev, dtype=torch.bfloat16, generator=g)
B = torch.randn(16, 64, 128, device=dev, dtype=torch.bfloat16, generator=g)
C = torch.empty(16, 128, 128, device=dev, dtype=torch.bfloat16)
out["host_us_stack_16x128x128x64"] = host_us({"torch.matmul": lambda: torch.matmul(A, B, out=C),
                                              "tilegen.matmul": lambda: tilegen.matmul(A, B, out=C)})
print(out["host_us_stack_16x128x128x64"])
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "stacks.json"), "w"), indent=1)
