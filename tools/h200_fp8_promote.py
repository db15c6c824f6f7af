"""fp8 promotion interval, held at the power cap: every k-tile (promote=1) against every 2 (and matmul's choice),
per-tensor scales, bf16 out, against torch._scaled_mm; error (Frobenius and max) against float64 of the same fp8
inputs. argv: the shape (n or MxNxK), then tiles to try beside the preset's (e.g. 128x192x128, or
128x128x128:stream_k). Also tilegen.matmul as called. Runs 285-286, 290, 294-297 (run 297 by a script this one
now holds: its matmul row and TILE:stream_k).

    python3 tools/h200_fp8_promote.py 8192x8192x1024
"""
import json, sys, threading, time
import torch, tilegen
import pynvml
pynvml.nvmlInit(); h = pynvml.nvmlDeviceGetHandleByIndex(0)
shape = sys.argv[1]
M, N, K = map(int, shape.split("x")) if "x" in shape else (int(shape),) * 3
one = torch.ones((), device="cuda")
def mk():
    A = (torch.randn(M, K, device="cuda") * 0.5).to(torch.float8_e4m3fn)
    B = (torch.randn(N, K, device="cuda") * 0.5).to(torch.float8_e4m3fn).t()
    return A, B, torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
sets = [mk() for _ in range(3)]
A, B, C = sets[0]
base = tilegen.matmul.explain(A, B, scale_a=one, scale_b=one, out=C).spec
print("base", base, flush=True)
fns = {"torch": lambda s: torch._scaled_mm(s[0], s[1], scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
       "matmul": lambda s: tilegen.matmul(s[0], s[1], scale_a=one, scale_b=one, out=s[2])}    # as called
# more tiles to try: MxNxK, or MxNxK:stream_k for that tile with stream-K
tiles = [(tuple(base.tile), False)] + [(tuple(int(x) for x in t.split(":")[0].split("x")), t.endswith(":stream_k"))
                                       for t in sys.argv[2:]]
for tile, stream_k in dict.fromkeys(tiles):
    for p in dict.fromkeys((2, base.promote, 1)):
        try:      # every k-tile: two accumulators taking turns where they fit, as matmul takes it
            spec = base.replace(promote=p, tile=tile, warps=(tile[0] // 16, 1), stream_k=stream_k, frag_buffers=2 if p == 1 else 1)
        except tilegen.SpecError:
            spec = base.replace(promote=p, tile=tile, warps=(tile[0] // 16, 1), stream_k=stream_k, frag_buffers=1)
        k = tilegen.compile(spec)
        name = f"promote{p}" + ("" if tile == tuple(base.tile) else f" {tile[0]}x{tile[1]}") + (" stream-K" if stream_k else "")
        fns[name] = (lambda k: (lambda s: k(s[0], s[1], out=s[2], scale_a=one, scale_b=one)))(k)
ref = A.double() @ B.double()
for name, f in fns.items():
    C.fill_(float("nan")); got = f(sets[0]); got = C if name != "torch" else got; torch.cuda.synchronize()
    d = got.double() - ref
    print(shape, name, "frobenius", float(d.norm() / ref.norm()), "max", float(d.abs().max() / ref.abs().max()), flush=True)
per_call = None
out = []
for rnd in range(2):
    for name, f in fns.items():
        if per_call is None:
            torch.cuda.synchronize(); t0 = time.perf_counter()
            for i in range(10): f(sets[i % 3])
            torch.cuda.synchronize(); per_call = (time.perf_counter() - t0) / 10
        samples, stop = [], [False]
        def sample():
            while not stop[0]:
                samples.append(pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)); time.sleep(0.05)
        t = threading.Thread(target=sample); t.start()
        calls = max(20, int(2.5 / per_call))
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
        ev[0].record()
        for i in range(calls):
            if i == calls // 2: ev[1].record()
            f(sets[i % 3])
        ev[2].record(); ev[2].synchronize(); stop[0] = True; t.join()
        us = ev[1].elapsed_time(ev[2]) * 1000 / (calls - calls // 2)
        tail = samples[len(samples) // 2:]
        row = dict(shape=shape, round=rnd, fn=name, us_2nd_half=round(us, 2), sm_mhz=round(sum(tail) / max(len(tail), 1)))
        out.append(row); print(row, flush=True); time.sleep(0.7)
print(json.dumps(out))
