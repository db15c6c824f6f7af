#!/usr/bin/env bash
# One GPU run that settles the "graph" launch route (runtime/replay.py, docs/perf_notes.md section 58)
# before it can become the default: the whole GPU suite with TILEGEN_LAUNCH=graph, then the host
# costs of both routes side by side (tools/h200_call_parts.py, `tilegen bench --host`), in
# alternating processes. Run from the repository root on the GPU machine, lark installed or
# carried as a wheel in .whl/:
#
#     bash tools/h200_graph_route.sh [OUT_DIR]
#
# Every step runs even when an earlier one fails; the exit status is the first failure's.
. "$(dirname "$0")/h200_common.sh" "$@"   # $out, lark, PYTHONPATH, gpu.txt, step
step pytest-gpu-graph env TILEGEN_LAUNCH=graph python3 -m pytest -q -m gpu tests -p no:cacheprovider
for round in 1 2; do
  for route in ex graph; do
    echo "== $route round $round" >> "$out/call-parts.txt"
    step call-parts env TILEGEN_LAUNCH=$route python3 tools/h200_call_parts.py /tmp
    echo "== $route round $round" >> "$out/bench-host.txt"
    step bench-host env TILEGEN_LAUNCH=$route python3 -m tilegen bench --host --no-gemm --sizes 2048 --dtype f16 bf16
  done
done
exit $status
