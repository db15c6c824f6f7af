"""`python3 -m tilegen.bench` / `tilegen bench`: GEMM throughput of tilegen against cuBLAS and
Triton, the mma.sync peak, compile speed; JSON results, baselines, Markdown and plots.

Exit status: 0 done; 1 a regression against --compare with --fail-on-regression, or a
tilegen result that failed its correctness check; 2 bad usage or no GPU.
"""
from __future__ import annotations

import argparse
import sys
import time

from .. import runtime
from ..frontend import compile as tg_compile
from . import backends, compile_speed, env, peak, report, stacks, timing
from . import options as O
from .gemm import GemmBench
from .host import format_host, host_costs

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tilegen bench",
        description="Benchmark tilegen's GEMM kernels against cuBLAS and Triton on this GPU.",
        epilog="Sizes: a number N means N x N x N; MxNxK otherwise. Layouts: A then B, r = row-major, "
               "c = column-major. Example: tilegen bench --dtype f16 --layout rr rc --sizes 4096 "
               "8192x8192x1024 --spec stages=4 --save f16.json")
    g = p.add_argument_group("what to run")
    g.add_argument("--dtype", nargs="+", default=list(O.DEFAULT_DTYPES), choices=O.DTYPES,
                   help="operand dtypes (default: %(default)s)")
    g.add_argument("--layout", nargs="+", default=list(O.DEFAULT_LAYOUTS), metavar="{rr,rc,cr,cc}",
                   help="A/B layouts, r = row-major, c = column-major (default: rr)")
    g.add_argument("--sizes", nargs="+", default=list(O.DEFAULT_SIZES), metavar="SIZE",
                   help="N (cube) or MxNxK (default: %(default)s)")
    g.add_argument("--spec", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                   help=f"time a spec of your own in every row, these GemmSpec fields set: {', '.join(O.spec_keys())} "
                        "(e.g. tile=128,256,32 warps=2,4 stages=4 swizzle=128B group_m=8 target=sm_90); "
                        "without --spec each row times the kernel tilegen.matmul picks for it")
    g.add_argument("--peak", action="store_true", help="measure the mma.sync peak with a tilegen kernel")
    g.add_argument("--compile-speed", action="store_true",
                   help="time spec -> PTX and compile -> launched kernel")
    g.add_argument("--no-gemm", action="store_true",
                   help="skip the GEMM rows (with --peak / --compile-speed / --host / --stacks)")
    g.add_argument("--no-cublas", action="store_true", help="do not run cuBLAS")
    g.add_argument("--no-triton", action="store_true", help="do not run Triton")
    g.add_argument("--no-front-door", action="store_true",
                   help="do not time tilegen.matmul and torch.matmul as users call them (back to back, host "
                        "time included)")
    g.add_argument("--host", action="store_true",
                   help="host microseconds per call of torch.matmul, a prepared launch, kernel(...) and "
                        "tilegen.matmul (torch tensors; the first --sizes entry's M)")
    g.add_argument("--stacks", nargs="*", default=None, metavar="BxMxNxK",
                   help="stacks of products through tilegen.matmul against torch.matmul (the GPU time of each "
                        "call's work), f16/bf16 of --dtype (default bf16): BATCHxMxNxK, /a or /b when A or B is "
                        "one matrix for the stack "
                        f"(no value: {' '.join(stacks.DEFAULT_STACKS)})")
    g.add_argument("--backend", default="auto", choices=["auto", "torch", "cupy", "cuda-python"],
                   help="where GPU arrays come from (default: torch, else cupy, else cuda-python)")
    t = p.add_argument_group("timing")
    t.add_argument("--warmup-ms", type=float, default=50.0, help="warm-up time per implementation (default 50)")
    t.add_argument("--rep-ms", type=float, default=250.0, help="timed runs per implementation, in ms (default 250)")
    t.add_argument("--warmup", type=int, default=None, metavar="N", help="warm-up count (overrides --warmup-ms)")
    t.add_argument("--reps", type=int, default=None, metavar="N", help="timed run count (overrides --rep-ms)")
    o = p.add_argument_group("output")
    o.add_argument("--save", metavar="FILE.json", help="write the results as JSON")
    o.add_argument("--load", metavar="FILE.json",
                   help="do not measure: read results saved by --save (for --markdown, --plot, --compare)")
    o.add_argument("--compare", metavar="FILE.json", help="compare tilegen TFLOP/s with a saved baseline")
    o.add_argument("--fail-on-regression", action="store_true",
                   help="with --compare: exit 1 when a row is slower than the baseline by more than --tolerance")
    o.add_argument("--tolerance", type=float, default=0.05,
                   help="allowed slowdown as a fraction (default 0.05 = 5%%)")
    o.add_argument("--plot", metavar="FILE.png", help="plot TFLOP/s against size (needs matplotlib)")
    o.add_argument("--markdown", action="store_true", help="print the results as Markdown tables")
    o.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    return p


class UsageError(Exception):
    pass


def parse_args(argv):
    """argparse plus the checks of values argparse cannot see; UsageError on a bad value."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(argv) if argv is not None else sys.argv[1:]
    try:
        args.layouts = [O.parse_layout(x) for x in args.layout]
        args.size_list = list(dict.fromkeys(O.parse_size(s) for s in args.sizes))
        args.overrides = O.parse_spec_overrides(args.spec)
        args.stack_list = None if args.stacks is None else list(dict.fromkeys(
            stacks.parse_stack(x) for x in (args.stacks or stacks.DEFAULT_STACKS)))
    except O.OptionError as e:
        raise UsageError(str(e)) from None
    args.dtype = list(dict.fromkeys(args.dtype))
    args.layouts = list(dict.fromkeys(args.layouts))
    if not 0 <= args.tolerance < 1:
        raise UsageError(f"--tolerance {args.tolerance}: give a fraction in [0, 1), e.g. 0.05")
    if args.fail_on_regression and not args.compare:
        raise UsageError("--fail-on-regression needs --compare FILE.json")
    for name in ("warmup_ms", "rep_ms"):
        if getattr(args, name) < 0:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 0")
    if args.reps is not None and args.reps < 1:
        raise UsageError("--reps must be >= 1")
    if args.warmup is not None and args.warmup < 0:
        raise UsageError("--warmup must be >= 0")
    if args.load and (args.peak or args.compile_speed or args.host or args.stacks is not None
                      or args.save and args.save == args.load):
        raise UsageError("--load reads saved results; it cannot be combined with --peak, --compile-speed, --host, "
                         "--stacks or a --save to the same file")
    return args


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = parse_args(argv)
    except SystemExit as e:  # argparse: --help (0) or a usage error (2)
        return int(e.code or 0) if isinstance(e.code, int) or e.code is None else EXIT_USAGE
    except UsageError as e:
        print(f"tilegen bench: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    log = (lambda msg: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))

    # Everything that can fail without a GPU fails here, before any measurement.
    baseline = None
    try:
        if args.compare:
            baseline = report.load(args.compare)
        loaded = report.load(args.load) if args.load else None
    except report.ResultFileError as e:
        print(f"tilegen bench: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    if args.plot and not report.have_matplotlib():
        print("tilegen bench: error: --plot needs matplotlib: pip install matplotlib "
              "(or pip install 'tilegen[plot]'); or leave --plot out", file=sys.stderr)
        return EXIT_USAGE

    if loaded is not None:
        result = loaded
    else:
        if not runtime.gpu_available():
            print("tilegen bench: no GPU found (no CUDA driver or no NVIDIA device): benchmarks need an "
                  "NVIDIA GPU. To look at saved results without one: tilegen bench --load FILE.json "
                  "[--markdown] [--compare BASE.json] [--plot FILE.png]", file=sys.stderr)
            return EXIT_USAGE
        try:
            result = measure(args, log)
        except UsageError as e:
            print(f"tilegen bench: error: {e}", file=sys.stderr)
            return EXIT_USAGE

    return finish(args, result, baseline, log)


def finish(args, result: dict, baseline, log) -> int:
    """Print, save, plot, compare; the exit status."""
    status = EXIT_OK
    if result.get("peak"):
        print(report.format_peak(result["peak"]))
        print()
    if result.get("compile_speed"):
        print(compile_speed.format_compile_speed(result["compile_speed"]))
        print()
    for host in result.get("host_costs") or ():
        print(format_host(host) if "error" not in host else f"host costs {host['dtype']}: {host['error']}")
        print()
    if result.get("stacks"):
        print(stacks.format_stacks(result["stacks"]))
        print()
        if any("error" in r for r in result["stacks"]):
            status = EXIT_FAIL
    if result.get("rows") or not (result.get("peak") or result.get("compile_speed") or result.get("host_costs")
                                  or result.get("stacks")):
        print(report.format_table(result))
    if any(report.is_wrong(r) for r in result.get("rows", [])):
        status = EXIT_FAIL
    if args.markdown:
        print()
        print(report.markdown(result))
    if args.save:
        report.save(result, args.save)
        log(f"saved {args.save}")
    if args.plot:
        try:
            report.plot(result, args.plot)
            log(f"plotted {args.plot}")
        except report.PlotUnavailable as e:
            print(f"tilegen bench: {e}", file=sys.stderr)
            status = max(status, EXIT_FAIL)
    if baseline is not None:
        comps = report.compare(result.get("rows", []), baseline["rows"], args.tolerance)
        print()
        if baseline.get("gpu") and result.get("gpu") and baseline["gpu"] != result["gpu"]:
            print(f"note: the baseline ran on {baseline['gpu']}, this run on {result['gpu']}")
        print(report.format_comparison(comps, args.tolerance))
        if args.fail_on_regression and any(c.regression for c in comps):
            status = EXIT_FAIL
    return status


def measure(args, log) -> dict:
    """Run everything asked for on GPU 0; the result dict (see report.py for its shape)."""
    runtime.ensure_context(0)
    info = runtime.device_info(0)
    target = env.device_target(info.cc)
    try:
        O.check_overrides(args.dtype, args.layouts, target, args.overrides)
    except O.OptionError as e:
        raise UsageError(str(e)) from None
    result = env.environment(0)
    result["format"] = report.FORMAT
    result["settings"] = {
        "dtypes": args.dtype, "layouts": [O.layout_code(a, b) for a, b in args.layouts],
        "sizes": [list(s) for s in args.size_list], "spec_overrides": {k: list(v) if isinstance(v, tuple) else v
                                                                       for k, v in args.overrides.items()},
        "target": args.overrides.get("target", target), "warmup_ms": args.warmup_ms, "rep_ms": args.rep_ms,
        "warmup": args.warmup, "reps": args.reps, "argv": args.argv,
    }
    log(f"tilegen bench on {info.name} (sm_{info.sm}, {info.sm_count} SMs), target {target}")
    t_start = time.perf_counter()
    measured_peak = None
    if args.peak:
        events = timing.EventPool(None)
        measured_peak = peak.run_peak(args.dtype, info.sm_count, args.overrides.get("target", target), events,
                                      log=log)
        result["peak"] = measured_peak
    if args.compile_speed:
        specs = [O.make_spec(dt, "row", "row", target, args.overrides) for dt in args.dtype]
        try:
            result["compile_speed"] = compile_speed.measure(specs, log=log)
        except Exception as e:  # noqa: BLE001
            result["compile_speed"] = {"error": f"{type(e).__name__}: {e}", "specs": []}
            log(f"compile-speed failed: {e}")
    if args.host:
        result["host_costs"] = []
        for dt in args.dtype:
            try:
                result["host_costs"].append(host_costs(dt, size=args.size_list[0][0]))
            except Exception as e:  # noqa: BLE001  (torch missing, ...)
                result["host_costs"].append({"dtype": dt, "error": f"{type(e).__name__}: {e}"})
                log(f"host costs {dt} failed: {e}")
    if args.stack_list is not None:
        result["stacks"] = _stack_rows(args, log)
    peaks, source = _peak_reference(measured_peak, info.name)
    result["peak_source"] = source
    result["rows"] = []
    if not args.no_gemm:
        def checkpoint(rows, meta):  # a run cut short (time limit, crash) keeps its finished rows
            result["rows"], result["gemm"] = rows, meta
            if args.save:
                report.save(result, args.save)

        _gemm_rows(args, log, target, peaks, checkpoint)
    result["elapsed_s"] = round(time.perf_counter() - t_start, 1)
    return result


def _stack_rows(args, log) -> list:
    """tilegen bench --stacks: the stacks' rows for each 16-bit dtype asked for (bf16 when none is)."""
    dtypes = [d for d in args.dtype if d in ("f16", "bf16")] or ["bf16"]
    try:
        import torch
    except ImportError:
        return [{"error": "--stacks needs torch (the baseline is torch.matmul)"}]
    opts = timing.TimingOptions(args.warmup_ms, args.rep_ms, args.warmup, args.reps)
    backend = backends.TorchBackend()
    rows = []
    for dt in dtypes:
        try:
            rows += stacks.stack_rows(torch, backend, dt, args.stack_list, opts, log)
        except Exception as e:  # noqa: BLE001  (a row that fails says why; the others still run)
            rows.append({"dtype": dt, "error": f"{type(e).__name__}: {e}"})
            log(f"stacks {dt} failed: {e}")
    return rows


def _peak_reference(measured, gpu_name: str):
    """TFLOP/s that '% mma peak' divides by: this run's --peak, else DESIGN.md's H200 numbers
    on an H200, else none."""
    if measured and any(p.get("tflops") for p in measured.values()):
        return {dt: p["tflops"] for dt, p in measured.items() if p.get("tflops")}, "the measured mma.sync peak"
    if "H200" in (gpu_name or ""):
        return dict(peak.REFERENCE_PEAK), "the H200 mma.sync peak in DESIGN.md (run --peak to measure)"
    return {}, None


def _gemm_rows(args, log, target, peaks, checkpoint) -> None:
    backend = backends.pick_backend(args.backend)
    fp8 = [d for d in args.dtype if d in backends.FP8]
    if fp8 and backend.name != "torch":
        raise UsageError(f"--dtype {' '.join(fp8)} needs the torch backend (fp8 tensors, torch._scaled_mm); "
                         f"{backend.name} was picked")
    log(f"arrays and cuBLAS through {backend.name}" + ("" if backend.cublas_name else " (no cuBLAS baseline)"))
    triton_mod = None
    if not args.no_triton and backend.name == "torch":
        try:
            from . import triton_mm as triton_mod
        except Exception as e:  # noqa: BLE001  (not installed or broken: no Triton column)
            log(f"Triton not used: {type(e).__name__}: {e}")
    elif not args.no_triton:
        log("Triton not used: it needs torch")
    events = timing.EventPool(backend.stream)
    delay = timing.make_delay(backend, target, events, log)
    opts = timing.TimingOptions(args.warmup_ms, args.rep_ms, args.warmup, args.reps)
    l2 = env.l2_bytes(0)
    chosen: dict = {}

    def kernel_for(spec):   # the kernel tilegen.matmul picks for a row's arrays (compiled once)
        if spec not in chosen:
            chosen[spec] = tg_compile(spec)
        return chosen[spec]

    bench = GemmBench(backend, events, opts, delay, l2, cublas=not args.no_cublas, triton=triton_mod, log=log,
                      front_door=not args.no_front_door, kernel_for=None if args.overrides else kernel_for)
    if not args.overrides:
        log("kernel: the spec tilegen.matmul picks for each row's arrays (--spec KEY=VALUE times a spec of your own)")
    meta = {"backend": backend.name, "cublas": backend.cublas_name if bench.cublas else None,
            "triton": getattr(triton_mod, "VERSION", None) if bench.triton is not None else None,
            "delay": delay.name if delay else None, "l2_bytes": l2,
            "timing": "CUDA events around each call; median; buffer sets rotated past L2"}

    cases = [(dt, lay, size) for dt in args.dtype for lay in args.layouts for size in args.size_list]
    kernels = {}
    rows = []
    for i, (dt, (a, b), (m, n, k)) in enumerate(cases, 1):
        key = (dt, a, b)
        if key not in kernels:
            spec = O.make_spec(dt, a, b, target, args.overrides)
            try:
                kernels[key] = tg_compile(spec)
            except Exception as e:  # noqa: BLE001
                kernels[key] = e
        kern = kernels[key]
        failed = None
        if isinstance(kern, Exception):
            failed = f"compile failed: {type(kern).__name__}: {kern}"
        else:
            try:
                row = bench.run(kern, m, n, k, peaks)
            except Exception as e:  # noqa: BLE001  (e.g. out of memory allocating the buffers)
                failed = f"{type(e).__name__}: {e}"
                backend.release()
        if failed is not None:
            row = report.finish_row({"dtype": dt, "layout": a[0] + b[0], "m": m, "n": n, "k": k, "check": "error",
                                     "errors": {"tilegen": failed[:500]}}, peaks)
        row["backend"] = backend.name
        rows.append(row)
        log(f"[{i}/{len(cases)}] {_progress(row)}")
        checkpoint(rows, meta)
    checkpoint(rows, meta)


def _progress(row: dict) -> str:
    def f(v, fmt="{:.1f}"):
        return "--" if v is None else fmt.format(v)
    parts = [f"{row['dtype']} {row['layout']} {report.size_text(row)}:"]
    if report.is_wrong(row):
        parts.append(f"tilegen {report.check_text(row)}")
    else:
        parts.append(f"tilegen {f(row.get('tilegen_tflops'))} TFLOP/s")
    parts.append(f"cuBLAS {f(row.get('cublas_tflops'))}")
    parts.append(f"Triton {f(row.get('triton_tflops'))}")
    if row.get("vs_cublas"):
        parts.append(f"({row['vs_cublas']:.2f}x cuBLAS)")
    for impl, msg in (row.get("errors") or {}).items():
        parts.append(f"[{impl}: {msg}]")
    return " ".join(parts)
