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
set -u
out="${1:-${OUT:?name an output folder}}"
mkdir -p "$out"
if [ -d .whl ] && ! python3 -c "import lark" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
status=0
step() {   # name, then the command: its output in OUT_DIR/name.txt, its exit status kept
  local name="$1"; shift
  echo "== $name: $*"
  "$@" >> "$out/$name.txt" 2>&1
  local rc=$?
  echo "   exit $rc; last lines:"; tail -n 3 "$out/$name.txt" | sed 's/^/   /'
  [ $rc -ne 0 ] && [ $status -eq 0 ] && status=$rc
  return 0
}
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv > "$out/gpu.txt" 2>&1
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
