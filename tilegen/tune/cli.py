"""`python3 -m tilegen.tune` / `tilegen tune`: tune GEMM specs on this GPU and cache the best.

Exit status: 0 done; 1 a problem where no candidate ran correctly; 2 bad usage or no GPU.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time

from .. import runtime
from .. import store as _disk_store
from ..bench import env
from ..bench.options import OptionError, parse_layout, parse_size
from ..gemm import tuned as store
from . import search
from .space import TUNE_DTYPES, SearchSpace

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
_clock = time.monotonic  # the run's wall clock (--total-budget-s); tests replace it


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tilegen tune",
        description="Search tile, warps, stages, swizzle, group_m and fragment buffering for tilegen's "
                    "GEMM on this GPU; print the best spec of each problem against the default spec, "
                    "and cache it for tilegen.tune.lookup.",
        epilog="Sizes: N means N x N x N; MxNxK otherwise. Problems run sizes first, then dtypes, then "
               "layouts, in the order given. Example: tilegen tune --dtype f16 --layout rr "
               "--sizes 4096 4096x4096x1024 --budget-s 60 --save tune.json. See docs/tuning.md.")
    p.add_argument("--dtype", nargs="+", default=["f16"], choices=TUNE_DTYPES, help="operand dtypes (default f16)")
    p.add_argument("--layout", nargs="+", default=["rr"], metavar="{rr,rc,cr,cc}",
                   help="A/B layouts, r = row-major, c = column-major (default rr)")
    p.add_argument("--sizes", nargs="+", default=["4096"], metavar="SIZE", help="N (cube) or MxNxK (default 4096)")
    p.add_argument("--out-dtype", default="f32", choices=["f32", "f16", "bf16"], help="C's dtype (default f32)")
    p.add_argument("--instruction", default="mma.sync", choices=["mma.sync", "wgmma"],
                   help="the kernel family searched: mma.sync (any sm_80+ GPU, default) or wgmma (the Hopper "
                        "kernel: tiles, stages, persistent / warp-specialized, group_m)")
    p.add_argument("--budget-s", type=float, default=60.0, help="seconds per problem (default 60)")
    p.add_argument("--total-budget-s", type=float, default=None,
                   help="seconds for the whole run: each problem gets --budget-s while the ones after it can "
                        "still get --min-budget-s; the last problems are skipped when even that no longer fits")
    p.add_argument("--min-budget-s", type=float, default=15.0, help="smallest budget a problem is run with "
                                                                    "under --total-budget-s (default 15)")
    p.add_argument("--device", type=int, default=0, help="GPU ordinal (default 0)")
    p.add_argument("--workers", type=int, default=None, help="compile threads (default: CPUs, at most 16)")
    p.add_argument("--top", type=int, default=5, help="print the N fastest candidates of each problem (default 5)")
    p.add_argument("--save", metavar="FILE.json", help="write every problem's result and trials as JSON")
    p.add_argument("--no-store", action="store_true", help="do not write the tuned-config cache")
    p.add_argument("--list", action="store_true", help="list the cached tuned configs and exit (no GPU needed)")
    p.add_argument("--clear-cache", action="store_true", help="delete the cached tuned configs and exit")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    return p


class UsageError(Exception):
    pass


def parse_args(argv):
    args = build_parser().parse_args(argv)
    args.argv = list(argv) if argv is not None else sys.argv[1:]
    try:
        args.size_list = list(dict.fromkeys(parse_size(s) for s in args.sizes))
        for x in args.layout:
            parse_layout(x)  # the bench's check and message
    except OptionError as e:
        raise UsageError(str(e)) from None
    args.layouts = list(dict.fromkeys(x.lower() for x in args.layout))
    args.dtype = list(dict.fromkeys(args.dtype))
    if not args.budget_s > 0 or not math.isfinite(args.budget_s):
        raise UsageError("--budget-s must be a positive number of seconds")
    if args.total_budget_s is not None and not args.total_budget_s > 0:
        raise UsageError("--total-budget-s must be a positive number of seconds")
    if not args.min_budget_s > 0:
        raise UsageError("--min-budget-s must be positive")
    if args.workers is not None and args.workers < 1:
        raise UsageError("--workers must be >= 1")
    if args.top < 0:
        raise UsageError("--top must be >= 0")
    return args


def size_text(m: int, n: int, k: int) -> str:
    return f"{m}^3" if m == n == k else f"{m}x{n}x{k}"


def share(budget_s: float, remaining: float, left: int, min_each: float) -> float:
    """This problem's budget under a total: of the `left` problems, as many as `remaining` holds at
    `min_each` are planned (the later ones are skipped); this one gets its own budget while the
    planned ones after it keep `min_each`; 0 when not even `min_each` is left."""
    floor = min(min_each, budget_s)
    planned = min(left, int(remaining // floor)) if remaining > 0 else 0
    if planned < 1:
        return 0.0
    return min(budget_s, remaining - floor * (planned - 1))


def summary_table(rows: list) -> str:
    head = (f"{'dtype':5s} {'AB':2s} {'size':15s} {'best spec':34s} {'TFLOP/s':>8s} {'default':>8s} "
            f"{'speed-up':>8s} {'tried':>5s}  check")
    lines = [head, "-" * len(head)]
    for r in rows:
        def f(v):
            return f"{v:8.1f}" if v else f"{'--':>8s}"
        sp = f"{r['speedup']:7.2f}x" if r.get("speedup") else f"{'--':>8s}"
        check = r.get("check") or ""
        lines.append(f"{r['dtype']:5s} {r['layouts']:2s} {r['size']:15s} {(r.get('spec_text') or '--'):34s} "
                     f"{f(r.get('tflops'))} {f(r.get('default_tflops'))} {sp} {r.get('tried', 0):>5d}  {check}")
    return "\n".join(lines)


def _row(dt: str, lay: str, m: int, n: int, k: int, res=None, error: str = "") -> dict:
    row = {"dtype": dt, "layouts": lay, "size": size_text(m, n, k), "M": m, "N": n, "K": k}
    if res is None:
        row.update(check=error, tried=0)
        return row
    row.update(res.as_dict())
    row["layouts"] = lay
    if res.spec is not None:
        row["check"] = f"ok ({res.rel_err:.1e})" if res.rel_err is not None else "ok"
    else:
        row["check"] = f"FAILED: {res.error}"
    return row


def _save(path: str, doc: dict) -> None:
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tune-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=1, default=str)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _list_cache() -> int:
    if not _disk_store.enabled():   # (entries() reads nothing then: say so, not "0 entries")
        print(f"tuned-config cache: off (TILEGEN_CACHE={os.environ.get('TILEGEN_CACHE')}): tilegen neither reads nor "
              f"writes {store.tune_dir()}; unset TILEGEN_CACHE to list it")
        return EXIT_OK
    items = store.entries()
    print(f"tuned-config cache: {store.tune_dir()} ({len(items)} entries)")
    for e in items:
        key = e["key"]
        b = "x".join(map(str, key.get("bucket", [])))
        print(f"  {key.get('gpu')} driver {key.get('driver')} {key.get('dtype')} {key.get('layouts')} "
              f"out={key.get('out_dtype')} bucket {b} tilegen {key.get('tilegen')}: "
              f"{e.get('spec_text', '?')} ({e.get('tflops', '?')} TFLOP/s at {e.get('tuned_shape')}, "
              f"default {e.get('default_tflops', '?')})")
    return EXIT_OK


def main(argv=None) -> int:
    t_start = _clock()
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = parse_args(argv)
    except SystemExit as e:  # argparse: --help (0) or a usage error (2)
        return int(e.code or 0) if isinstance(e.code, int) or e.code is None else EXIT_USAGE
    except UsageError as e:
        print(f"tilegen tune: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    if args.list:
        return _list_cache()
    if args.clear_cache:
        print(f"deleted {store.clear()} tuned configs from {store.tune_dir()}")
        return EXIT_OK
    if args.save:
        d = os.path.dirname(os.path.abspath(args.save))
        if not os.path.isdir(d):
            print(f"tilegen tune: error: --save {args.save}: no directory {d}", file=sys.stderr)
            return EXIT_USAGE


    if not runtime.gpu_available():
        print("tilegen tune: no GPU found (no CUDA driver or no NVIDIA device): tuning times kernels on an "
              "NVIDIA GPU. Cached tuned configs can be listed without one: tilegen tune --list",
              file=sys.stderr)
        return EXIT_USAGE
    try:
        runtime.ensure_context(args.device)
    except Exception as e:  # noqa: BLE001  (e.g. --device 3 on a one-GPU machine)
        print(f"tilegen tune: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    return run(args, t_start)


def run(args, t_start: float) -> int:
    log = (lambda msg: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    problems = [(dt, lay, size) for size in args.size_list for dt in args.dtype for lay in args.layouts]
    try:
        where = env.environment(args.device)
    except Exception as e:  # noqa: BLE001
        where = {"error": f"{type(e).__name__}: {e}"}
    log(f"tilegen tune on {where.get('gpu')} (driver {where.get('driver')}): {len(problems)} problems, "
        f"{args.budget_s:.0f}s each" + (f", {args.total_budget_s:.0f}s in all" if args.total_budget_s else ""))
    doc = {"format": 1, "environment": where, "argv": args.argv,
           "settings": {"dtypes": args.dtype, "layouts": args.layouts, "sizes": [list(s) for s in args.size_list],
                        "out_dtype": args.out_dtype, "budget_s": args.budget_s,
                        "total_budget_s": args.total_budget_s}, "results": []}
    rows = []
    status = EXIT_OK
    for i, (dt, lay, (m, n, k)) in enumerate(problems):
        budget = args.budget_s
        if args.total_budget_s is not None:
            remaining = args.total_budget_s - (_clock() - t_start)
            budget = share(args.budget_s, remaining, len(problems) - i, args.min_budget_s)
            if budget <= 0:
                row = _row(dt, lay, m, n, k, error="skipped: --total-budget-s spent")
                rows.append(row)
                doc["results"].append(row)
                log(f"skipping {dt} {lay} {size_text(m, n, k)}: the total budget is spent")
                continue
        log(f"=== [{i + 1}/{len(problems)}] {dt} {lay} {size_text(m, n, k)}, budget {budget:.0f}s")
        try:
            res = search.tune(dt, lay[0], lay[1], m, n, k, out_dtype=args.out_dtype, budget_s=budget, device=args.device,
                              space=SearchSpace(instruction=args.instruction), progress=not args.quiet,
                              store=not args.no_store, workers=args.workers)
        except Exception as e:  # noqa: BLE001  (e.g. out of memory for the operands)
            row = _row(dt, lay, m, n, k, error=f"FAILED: {type(e).__name__}: {str(e)[:300]}")
            status = EXIT_FAIL
        else:
            row = _row(dt, lay, m, n, k, res)
            if res.spec is None:
                status = EXIT_FAIL
            if args.top:
                print(f"\n{dt} {lay} {size_text(m, n, k)}: {res.tried} candidates tried in {res.elapsed_s:.0f}s "
                      f"({res.space_size} in the space after pruning)")
                print(search.format_table(res.candidates, m, n, k, limit=args.top))
                if res.stored:
                    print(f"cached: {res.stored}")
                sys.stdout.flush()
        rows.append(row)
        doc["results"].append(row)
        if args.save:
            _save(args.save, doc)
    print()
    print(summary_table(rows))
    doc["elapsed_s"] = round(_clock() - t_start, 1)
    if args.save:
        _save(args.save, doc)
        log(f"saved {args.save}")
    return status


__all__ = ["main", "build_parser", "share", "summary_table"]
