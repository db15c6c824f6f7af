"""--compile-speed: how long from a spec to PTX, and from PTX to a launched kernel.

Measured in fresh Python processes with the driver's own JIT cache off (CUDA_CACHE_DISABLE=1),
so a first launch really includes the driver's PTX -> SASS compilation. First with tilegen's
disk cache off (TILEGEN_CACHE=0):
- compile_ms: tilegen.compile(spec) wall time, median of several (spec -> PTX), the
  process's memo of compiled kernels emptied before each;
- jit_ms: Kernel.function() of a new Kernel (the driver JIT of the PTX);
- first_launch_ms: compile + load + one launch of a one-tile problem + synchronize;
- second_object_ms: the same again with a second Kernel for the same spec; tilegen's
  in-process module cache (keyed by the PTX) skips the JIT: what a cache gives.
Then twice more with the disk cache on in a new empty directory
(TILEGEN_CACHE_DIR): cache_cold_* (a miss: trace, link, store) and cache_warm_* (a new
process that finds both the PTX and the cubin on disk).
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import fields

from .. import compiler, runtime, store
from ..frontend import compile as tg_compile
from ..gemm.spec import GemmSpec, TileShape, WarpLayout

WORKER_TAG = "TILEGEN_COMPILE_SPEED "


def _spec_key(spec) -> str:
    return f"{spec.dtype} {spec.a_layout[0]}{spec.b_layout[0]}"


# The child process: `import tilegen` timed first, before anything else of tilegen loads.
_CHILD = ("import sys, time; t0 = time.perf_counter(); import tilegen; t1 = time.perf_counter(); "
          "from tilegen.bench.compile_speed import child_main; child_main(sys.argv[1], (t1 - t0) * 1e3)")


def child_main(specs_json: str, import_ms: float) -> None:
    # TILEGEN_BENCH_COMPILE_ONLY=1: compile times only (how the CPU tests drive this process)
    out = worker(specs_json, launch=os.environ.get("TILEGEN_BENCH_COMPILE_ONLY") != "1")
    out["import_ms"] = import_ms
    print(WORKER_TAG + json.dumps(out), flush=True)


def worker(specs_json: str, repeat: int = 5, launch: bool = True) -> dict:
    """Runs in the child process: times each spec, returns a dict (printed as JSON).
    Compiling needs no GPU; with launch=False the GPU half is skipped."""
    out = {"import_ms": None, "specs": [], "cache": store.__file__}
    specs = [GemmSpec(**{k: tuple(v) if isinstance(v, list) else v for k, v in kw.items()})
             for kw in json.loads(specs_json)]

    for spec in specs:  # spec -> PTX: no GPU involved
        row = {"spec": _spec_key(spec), "spec_str": str(spec)}
        t0 = time.perf_counter()
        tg_compile(spec)
        row["compile_first_ms"] = (time.perf_counter() - t0) * 1e3
        times = []
        for _ in range(max(1, repeat)):
            compiler.forget()
            t0 = time.perf_counter()
            tg_compile(spec)
            times.append((time.perf_counter() - t0) * 1e3)
        row["compile_ms"] = statistics.median(times)
        out["specs"].append(row)

    if launch:
        t0 = time.perf_counter()
        runtime.ensure_context(0)
        out["context_ms"] = (time.perf_counter() - t0) * 1e3
        for spec, row in zip(specs, out["specs"]):
            row["first_launch_ms"], row["jit_ms"] = _launch_new(spec)
            row["second_object_ms"], row["second_load_ms"] = _launch_new(spec)
    out["cache_stats"] = dict(store.stats)
    return out


def _launch_new(spec) -> tuple[float, float]:
    """(compile + load + launch + synchronize, load alone) in ms, for a new Kernel of `spec`
    (the memo emptied first) on a one-tile problem (two k-tiles)."""
    t = spec.tile
    m, n, k = t.m, t.n, t.k * 2
    esz = 4 if spec.dtype == "tf32" else 2
    bufs = [runtime.DeviceBuffer(m * k * esz), runtime.DeviceBuffer(k * n * esz), runtime.DeviceBuffer(m * n * 4)]
    try:
        for buf in bufs:
            buf.fill_bytes(0)
        args = {"M": m, "N": n, "K": k, "A_ptr": bufs[0].ptr, "A_ld": k if spec.a_layout == "row" else m,
                "B_ptr": bufs[1].ptr, "B_ld": n if spec.b_layout == "row" else k,
                "C_ptr": bufs[2].ptr, "C_ld": n, "alpha": 1.0, "beta": 0.0}
        runtime.synchronize()
        compiler.forget()
        t0 = time.perf_counter()
        kern = tg_compile(spec)
        t1 = time.perf_counter()
        kern.function()
        t2 = time.perf_counter()
        kern.launch(args, {"M": m, "N": n, "K": k})
        runtime.synchronize()
        t3 = time.perf_counter()
        return (t3 - t0) * 1e3, (t2 - t1) * 1e3
    finally:
        for buf in bufs:
            buf.close()


def _spec_kwargs(spec) -> dict:
    kw = {}
    for f in fields(spec):
        v = getattr(spec, f.name)
        if f.name == "epilogue":
            continue
        if isinstance(v, (TileShape, WarpLayout)):
            v = list(v)
        kw[f.name] = v
    return kw


def _run_worker(specs, env_extra: dict, timeout: float = 240.0) -> dict:
    env = dict(os.environ)
    env.update(env_extra)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    payload = json.dumps([_spec_kwargs(s) for s in specs])
    p = subprocess.run([sys.executable, "-c", _CHILD, payload],
                       capture_output=True, text=True, timeout=timeout, env=env)
    for line in reversed(p.stdout.splitlines()):
        if line.startswith(WORKER_TAG):
            return json.loads(line[len(WORKER_TAG):])
    raise RuntimeError(f"compile-speed worker failed (exit {p.returncode}): "
                       f"{(p.stderr or p.stdout).strip()[-2000:]}")


def measure(specs, log=None) -> dict:
    """The compile-speed record for `specs` (a list of GemmSpec)."""
    base = {"CUDA_CACHE_DISABLE": "1"}
    first = _run_worker(specs, {**base, "TILEGEN_CACHE": "0"})
    result = {"driver_jit_cache": "disabled (CUDA_CACHE_DISABLE=1)", **first}
    if not first.get("cache"):
        return result
    if log:
        log("compile-speed: timing the disk cache (a new empty cache directory: cold, then warm)")
    tmp = tempfile.mkdtemp(prefix="tilegen-bench-cache-")
    try:
        env = {**base, "TILEGEN_CACHE": "1", "TILEGEN_CACHE_DIR": tmp}
        for label in ("cache_cold", "cache_warm"):
            again = _run_worker(specs, env)
            result[f"{label}_stats"] = again.get("cache_stats")
            for row, other in zip(result["specs"], again["specs"]):
                row[f"{label}_compile_first_ms"] = other["compile_first_ms"]
                row[f"{label}_first_launch_ms"] = other["first_launch_ms"]
                row[f"{label}_jit_ms"] = other["jit_ms"]
    except Exception as e:  # noqa: BLE001
        result["cache_error"] = f"{type(e).__name__}: {e}"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return result


def format_compile_speed(result: dict) -> str:
    if result.get("error"):
        return f"compile speed: failed: {result['error']}"
    cols = ["spec", "compile_ms", "compile_first_ms", "jit_ms", "first_launch_ms", "second_object_ms"]
    specs = result.get("specs", [])
    if any("cache_warm_first_launch_ms" in r for r in specs):
        cols += ["cache_cold_first_launch_ms", "cache_warm_compile_first_ms", "cache_warm_first_launch_ms"]
    head = {"spec": "spec", "compile_ms": "spec->PTX", "compile_first_ms": "1st compile",
            "jit_ms": "driver JIT", "first_launch_ms": "compile->launched", "second_object_ms": "2nd Kernel",
            "cache_cold_first_launch_ms": "disk cache cold", "cache_warm_compile_first_ms": "cached compile",
            "cache_warm_first_launch_ms": "disk cache warm"}
    rows = [[head[c] for c in cols]]
    for r in specs:
        rows.append([r.get(c) if c == "spec" else _ms(r.get(c)) for c in cols])
    lines = [f"compile speed, ms (import {_ms(result.get('import_ms'))}, context {_ms(result.get('context_ms'))}; "
             f"driver JIT cache {result.get('driver_jit_cache', '?')}; disk cache "
             f"{'timed' if result.get('cache') else 'not timed'})"]
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(cols))]
    for row in rows:
        lines.append("  ".join(str(v).rjust(w) for v, w in zip(row, widths)))
    if result.get("cache_error"):
        lines.append(f"disk-cache runs failed: {result['cache_error']}")
    return "\n".join(lines)


def _ms(v) -> str:
    return "--" if v is None else f"{v:.1f}"

