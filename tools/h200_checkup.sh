#!/usr/bin/env bash
# One GPU run that checks the tree as it stands and records what it needs to: the whole GPU
# test suite, the launch floor (tools/h200_launch_floor.py) and the host costs of
# `tilegen bench --host`, each into OUT_DIR (default $OUT). Run from the repository root on the
# GPU machine, lark (and anything else missing there) installed or carried as wheels in .whl/:
#
#     bash tools/h200_checkup.sh [OUT_DIR]
#
# Every step runs even when an earlier one fails; the exit status is the first failure's.
. "$(dirname "$0")/h200_common.sh" "$@"   # $out, lark, PYTHONPATH, gpu.txt, step
git log -1 --format='%H %s' > "$out/commit.txt" 2>/dev/null || true
step pytest-gpu python3 -m pytest -q -m gpu tests
step launch-floor python3 tools/h200_launch_floor.py "$out"
step bench-host python3 -m tilegen bench --host --no-gemm --sizes 2048
exit $status
