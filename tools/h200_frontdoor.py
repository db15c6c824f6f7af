"""One GPU run for the front door: host microseconds per call (this tree, both launch routes,
and optionally an older tree for the before/after), a cProfile of tilegen.matmul's hot path,
what users get through tilegen.matmul beside the kernel alone and torch.matmul at several
sizes, and misaligned shapes against the aligned one. Writes JSON (and profile text) to DIR.

    python3 tools/h200_frontdoor.py DIR [--old PATH_TO_OLD_TREE]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROUTES = ("ex", "graph", "bindings", "ctypes")  # tilegen.runtime.launch.ROUTES

_OLD_HOST = r'''
import json, statistics, sys, time, torch, tilegen
size, calls, reps = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
A = torch.randn(size, size, device="cuda", dtype=torch.bfloat16); B = torch.randn_like(A); C = torch.empty_like(A)
k = tilegen.compile(tilegen.GemmSpec(dtype="bf16", out_dtype="bf16"))
args = {"M": size, "N": size, "K": size, "A_ptr": A.data_ptr(), "A_ld": size, "B_ptr": B.data_ptr(), "B_ld": size,
        "C_ptr": C.data_ptr(), "C_ld": size, "alpha": 1.0, "beta": 0.0}
sizes = {"M": size, "N": size, "K": size}
def per(fn):
    for _ in range(3): fn()
    torch.cuda.synchronize(); out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(calls): fn()
        out.append((time.perf_counter() - t0) * 1e6 / calls); torch.cuda.synchronize()
    return {"us": statistics.median(out), "us_min": min(out), "us_max": max(out)}
s = torch.cuda.current_stream().cuda_stream
res = {"torch.matmul": per(lambda: torch.matmul(A, B, out=C)),
       "kernel.launch": per(lambda: k.launch(args, sizes, stream=s)),
       "kernel(A, B, out=C)": per(lambda: k(A, B, out=C)),
       "tilegen.matmul": per(lambda: tilegen.matmul(A, B, out=C))}
print("RESULT " + json.dumps(res))
'''


def host(out: dict, old: str | None) -> None:
    env = dict(os.environ)
    for route in ROUTES:
        code = ("import json, sys; from tilegen.bench.host import host_costs; "
                "print('RESULT ' + json.dumps([host_costs(d, size=s) for d, s in "
                "(('bf16', 1024), ('f16', 1024), ('bf16', 256), ('f32', 1024))]))")
        p = subprocess.run([sys.executable, "-c", code], env=dict(env, TILEGEN_LAUNCH=route), cwd=REPO,
                           capture_output=True, text=True, timeout=300)
        line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
        out[f"host_{route}"] = json.loads(line[0][7:]) if line else {"error": p.stderr[-3000:]}
    if old:
        res = {}
        for size in (1024, 256):
            p = subprocess.run([sys.executable, "-c", _OLD_HOST, str(size), "20", "10"], cwd="/tmp",
                               env=dict(env, PYTHONPATH=os.pathsep.join([old, env.get("PYTHONPATH", "")])), capture_output=True, text=True, timeout=300)
            line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
            res[str(size)] = json.loads(line[0][7:]) if line else {"error": p.stderr[-3000:]}
        out["host_old"] = res


def profile(dirpath: str, old: str | None) -> None:
    code = r'''
import cProfile, io, pstats, sys, torch, tilegen
A = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16); B = torch.randn_like(A); C = torch.empty_like(A)
for _ in range(5): tilegen.matmul(A, B, out=C)
torch.cuda.synchronize()
pr = cProfile.Profile(); pr.enable()
for _ in range(2000 if sys.argv[1] == "new" else 200): tilegen.matmul(A, B, out=C)
pr.disable(); torch.cuda.synchronize()
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25); print(s.getvalue())
'''
    for label, path in (("new", REPO), ("old", old)):
        if path is None:
            continue
        p = subprocess.run([sys.executable, "-c", code, label], cwd="/tmp",
                           env=dict(os.environ, PYTHONPATH=os.pathsep.join([path, os.environ.get("PYTHONPATH", "")])),
                           capture_output=True, text=True, timeout=300)
        with open(os.path.join(dirpath, f"profile_{label}.txt"), "w") as f:
            f.write(p.stdout + p.stderr[-3000:])


_FLOOR = r'''
import json, os, statistics, time, torch, cupy, tilegen
from tilegen.runtime import launch as L
from tilegen.runtime import interop
A = torch.randn(256, 256, device="cuda", dtype=torch.float16); B = torch.randn_like(A); C = torch.empty_like(A)
a, b, c = (cupy.asarray(x) for x in (A, B, C))
k = tilegen.compile(tilegen.GemmSpec(dtype="f16", out_dtype="f16"))
k(A, B, out=C); k(a, b, out=c); tilegen.matmul(A, B, out=C); tilegen.matmul(a, b, out=c); torch.cuda.synchronize()
s = torch.cuda.current_stream().cuda_stream
vals = k.fast_call.arguments((256, 256, 256, A.data_ptr(), 256, B.data_ptr(), 256, C.data_ptr(), 256, 1.0, 1.0, 0, 0, 0, 0, 0))
fn = k.function()
routes = {}
for r in L.ROUTES:
    os.environ["TILEGEN_LAUNCH"] = r
    routes[r] = L.Launcher(fn, k._kinds, k.threads, k.smem_bytes, 0)
    routes[r].buffer.pack(vals)
g = (4, 1, 1)
args = {"M": 256, "N": 256, "K": 256, "A_ptr": A.data_ptr(), "A_ld": 256, "B_ptr": B.data_ptr(), "B_ld": 256,
        "C_ptr": C.data_ptr(), "C_ld": 256, "alpha": 1.0, "beta": 0.0}
sizes = {"M": 256, "N": 256, "K": 256}
tl, cl = interop.library(A), interop.library(a)
routes["ex"].buffer.pack_launch(g, vals, s)
variants = {}
for r in L.ROUTES:
    variants[f"driver call, {r} (ready buffer)"] = (lambda r: lambda: routes[r]._launch(g, s))(r)
    variants[f"Launcher, {r}"] = (lambda r: lambda: routes[r](g, vals, s))(r)
variants.update({
    "kernel.launch(args, sizes)": lambda: k.launch(args, sizes, stream=s),
    "kernel(A, B, out=C) torch": lambda: k(A, B, out=C),
    "kernel(A, B, out=C) cupy": lambda: k(a, b, out=c),
    "tilegen.matmul torch": lambda: tilegen.matmul(A, B, out=C),
    "tilegen.matmul cupy": lambda: tilegen.matmul(a, b, out=c),
    "torch.matmul(out=)": lambda: torch.matmul(A, B, out=C),
    "torch.add(out=)": lambda: torch.add(A, B, out=C),
    "cupy.matmul(out=)": lambda: cupy.matmul(a, b, out=c),
    "probe torch": lambda: tl.probe(A),
    "probe cupy": lambda: cl.probe(a),
    "stream torch": lambda: tl.stream(0),
    "stream cupy": lambda: cl.stream(0),
})
samples = {n: [] for n in variants}
calls = 200
for f in variants.values():
    for _ in range(20): f()
torch.cuda.synchronize()
for rnd in range(21):
    for n, f in variants.items():
        t0 = time.perf_counter()
        for _ in range(calls): f()
        samples[n].append((time.perf_counter() - t0) * 1e6 / calls)
        torch.cuda.synchronize()
print("RESULT " + json.dumps({n: {"us": statistics.median(v), "us_min": min(v), "us_max": max(v)} for n, v in samples.items()}))
'''


def floors(out: dict) -> None:
    """What one launch costs below tilegen, measured interleaved in one process (each round
    times every variant once, so drift hits all alike): the driver call alone with a ready
    buffer on both routes, tilegen's layers, torch's and CuPy's own small ops."""
    for route in ROUTES:  # the route of kernel(...) and matmul in that process
        p = subprocess.run([sys.executable, "-c", _FLOOR], env=dict(os.environ, TILEGEN_LAUNCH=route), cwd=REPO,
                           capture_output=True, text=True, timeout=300)
        line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
        out[f"interleaved_{route}"] = json.loads(line[0][7:]) if line else {"error": p.stderr[-3000:]}


SHAPES = [(512, 512, 512), (1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192),
          (4096, 4096, 1024), (1024, 4096, 4096), (4095, 4095, 4095), (4097, 4096, 4095)]


def sizes(out: dict, shapes=SHAPES) -> None:
    """tilegen.matmul as called (back to back) beside the kernel alone and torch.matmul."""
    import torch
    import tilegen
    from tilegen.bench.timing import EventPool, TimingOptions, time_back_to_back
    from tilegen.bench.backends import TorchBackend
    from tilegen.bench.timing import make_delay, time_calls
    from tilegen.bench.env import device_target

    be = TorchBackend()
    events = EventPool(be.stream)
    delay = make_delay(be, device_target(torch.cuda.get_device_capability()), events, print)
    opts = TimingOptions(warmup_ms=30, rep_ms=200)
    rows = []
    for dt in (torch.bfloat16, torch.float16):
        for M, N, K in shapes:
            sets = max(2, min(16, (4 * 60 << 20) // ((M * K + K * N + M * N) * 2) + 1))
            A = [torch.randn(M, K, device="cuda", dtype=dt) for _ in range(sets)]
            B = [torch.randn(K, N, device="cuda", dtype=dt) for _ in range(sets)]
            C = [torch.empty(M, N, device="cuda", dtype=dt) for _ in range(sets)]
            tilegen.matmul(A[0], B[0], out=C[0])
            torch.cuda.synchronize()
            ref = A[0].float() @ B[0].float()
            rel = float(torch.linalg.norm(C[0].float() - ref) / torch.linalg.norm(ref))
            choice = tilegen.matmul.explain(A[0], B[0], out=C[0])
            kernel = tilegen.compile(choice.spec)
            f = lambda i: tilegen.matmul(A[i], B[i], out=C[i])  # noqa: E731
            t = lambda i: torch.matmul(A[i], B[i], out=C[i])  # noqa: E731
            k = lambda i: kernel(A[i], B[i], out=C[i], repitch=True)  # noqa: E731  (misaligned: with the copies)
            row = {"dtype": str(dt).replace("torch.", ""), "m": M, "n": N, "k": K, "rel_err": rel,
                   "spec": str(choice.spec), "sets": sets}
            row["matmul_as_called_ms"] = time_back_to_back(f, sets, events, opts).ms
            row["torch_as_called_ms"] = time_back_to_back(t, sets, events, opts).ms
            row["kernel_only_ms"] = time_calls(k, sets, events, opts, delay).ms
            row["torch_kernel_only_ms"] = time_calls(t, sets, events, opts, delay).ms
            fl = 2 * M * N * K / 1e9
            for key in ("matmul_as_called_ms", "torch_as_called_ms", "kernel_only_ms", "torch_kernel_only_ms"):
                row[key.replace("_ms", "_tflops")] = fl / row[key]
            row["matmul_vs_kernel"] = row["kernel_only_ms"] / row["matmul_as_called_ms"]
            row["matmul_vs_torch_as_called"] = row["torch_as_called_ms"] / row["matmul_as_called_ms"]
            print(json.dumps(row), flush=True)
            rows.append(row)
            del A, B, C, ref
            torch.cuda.empty_cache()
    out["sizes"] = rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--old")
    ap.add_argument("--skip", nargs="*", default=[])
    ap.add_argument("--shapes", nargs="*", default=None, help="MxNxK for the sizes part")
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    out = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "commit": os.environ.get("TILEGEN_COMMIT", "")}
    for name, fn in (("host", lambda: host(out, args.old)), ("floors", lambda: floors(out)),
                     ("profile", lambda: profile(args.dir, args.old)),
                     ("sizes", lambda: sizes(out, [tuple(map(int, x.split("x"))) for x in args.shapes]
                                             if args.shapes else SHAPES))):
        if name in args.skip:
            continue
        t0 = time.perf_counter()
        try:
            fn()
        except Exception as e:  # noqa: BLE001
            out[f"{name}_error"] = f"{type(e).__name__}: {e}"
        out[f"{name}_s"] = round(time.perf_counter() - t0, 1)
        with open(os.path.join(args.dir, "frontdoor.json"), "w") as f:
            json.dump(out, f, indent=1)
    print(json.dumps({k: v for k, v in out.items() if k != "sizes"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
