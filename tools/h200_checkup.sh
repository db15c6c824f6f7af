#!/usr/bin/env bash
# One GPU run that checks the tree as it stands and records what it needs to: the whole GPU
# test suite, the launch floor (tools/h200_launch_floor.py) and the host costs of
# `tilegen bench --host`, each into OUT_DIR (default $OUT). Run from the repository root on the
# GPU machine, lark (and anything else missing there) installed or carried as wheels in .whl/:
#
#     bash tools/h200_checkup.sh [OUT_DIR]
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
  "$@" > "$out/$name.txt" 2>&1
  local rc=$?
  echo "   exit $rc; last lines:"; tail -n 3 "$out/$name.txt" | sed 's/^/   /'
  [ $rc -ne 0 ] && [ $status -eq 0 ] && status=$rc
  return 0
}
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv > "$out/gpu.txt" 2>&1
git log -1 --format='%H %s' > "$out/commit.txt" 2>/dev/null || true
step pytest-gpu python3 -m pytest -q -m gpu tests
step launch-floor python3 tools/h200_launch_floor.py "$out"
step bench-host python3 -m tilegen bench --host --no-gemm --sizes 2048
exit $status
