#!/usr/bin/env bash
# One GPU run that settles the "graph" launch route as the default (docs/perf_notes.md section 59):
# the GPU suite on the default route, then `tilegen bench --host` under TILEGEN_LAUNCH=ex and the
# default in alternating processes (2 rounds), tools/h200_graph_probe.py, and `tilegen bench`'s
# kernel-only and as-called columns. Run from the repository root on the GPU machine, lark
# installed or carried as a wheel in .whl/:
#
#     bash tools/h200_default_graph.sh [OUT_DIR] [--no-suite]
#
# Every step runs even when an earlier one fails; the exit status is the first failure's.
. "$(dirname "$0")/h200_common.sh" "$1"   # $out, lark, PYTHONPATH, gpu.txt, step
[ "${2:-}" = "--no-suite" ] || step pytest-gpu python3 -m pytest -q -m gpu tests -p no:cacheprovider
for r in 1 2; do for route in ex graph; do
  echo "== $route round $r" >> "$out/bench-host.txt"
  step bench-host env TILEGEN_LAUNCH=$route python3 -m tilegen bench --host --no-gemm --sizes 2048 --dtype f16 bf16
done; done
step probe python3 tools/h200_graph_probe.py "$out"
step bench python3 -m tilegen bench --sizes 2048 4096 8192 --dtype bf16
exit $status
