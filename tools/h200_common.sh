# What the GPU-run scripts (tools/h200_checkup.sh, tools/h200_graph_route.sh) share, sourced by them
# with their arguments: the output folder (the first argument, default $OUT) in $out, lark from
# the wheels carried in .whl/ when the machine lacks it, the tree on PYTHONPATH, the GPU's name,
# driver and clocks in $out/gpu.txt, and `step NAME COMMAND...`, which runs the command with its
# output appended to $out/NAME.txt and keeps the first failing exit status in $status.
set -u
out="${1:-${OUT:?name an output folder}}"
mkdir -p "$out"
if [ -d .whl ] && ! python3 -c "import lark" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
status=0
step() {
  local name="$1"; shift
  echo "== $name: $*"
  "$@" >> "$out/$name.txt" 2>&1
  local rc=$?
  echo "   exit $rc; last lines:"; tail -n 3 "$out/$name.txt" | sed 's/^/   /'
  [ $rc -ne 0 ] && [ $status -eq 0 ] && status=$rc
  return 0
}
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv > "$out/gpu.txt" 2>&1
