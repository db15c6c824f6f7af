#!/usr/bin/env bash
# The Hopper issues' closing measurements, in two calls of under 10 minutes (each step under a
# time limit of its own, so one slow step cannot take the rest; at most 8 files come back):
#
#     bash tools/h200_final.sh check [OUT_DIR]   # correctness on the GPU, sanitizers, 500 launches, the ladder
#     bash tools/h200_final.sh perf [OUT_DIR]    # the target rows beside cuBLAS / cuBLASLt, ncu of tf32
#
# check: the Hopper GPU tests (every epilogue x dtype x layout through tilegen.matmul, fp8 pairs x
#   scale kinds, the ladder's steps 1-10, TMA stores, the wgmma kernels), the ladder's table (every
#   step in one process beside cuBLAS), tools/h200_repeat.py (500 launches), compute-sanitizer
#   memcheck and racecheck over tools/sanitize_gemm.py --hopper.
# perf: `tilegen bench` over the four layouts x f16 / bf16 / tf32 at 2048^3-8192^3 and issue 18's
#   short-K and skinny rows (bf16), fused bias + GELU held at the power cap against addmm + gelu
#   (tools/h200_sustained.py), fp8 against torch._scaled_mm with the long-K errors (tools/h200_fp8.py),
#   ncu of the tf32 row-major kernel and cuBLAS's (tensor pipe, stall reasons).
# Run from the repository root on the GPU machine, lark installed or carried as a wheel in .whl/.
what="${1:?check or perf}"; shift
. "$(dirname "$0")/h200_common.sh" "$@"   # $out, lark, PYTHONPATH, gpu.txt, step
limited() { local secs="$1"; shift; timeout -k 5 "$secs" "$@"; }
if [ "$what" = check ]; then
  export TILEGEN_RECORD="$out/record.jsonl"
  step pytest limited 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_hopper_epilogues_gpu.py \
    tests/test_hopper_ladder.py tests/test_tma_store.py tests/test_wgmma_gpu.py
  step ladder limited 100 python3 tools/h200_ladder.py "$out" --no-host
  step repeat limited 60 python3 tools/h200_repeat.py "$out"
  step sanitize limited 70 compute-sanitizer --tool memcheck python3 tools/sanitize_gemm.py --hopper
  step sanitize limited 100 compute-sanitizer --tool racecheck python3 tools/sanitize_gemm.py --hopper
elif [ "$what" = perf ]; then
  step bench limited 260 python3 -m tilegen bench --no-triton --dtype f16 bf16 tf32 --layout rr rc cr cc \
    --sizes 2048 4096 8192 --save "$out/bench.json"
  step models limited 80 python3 -m tilegen bench --no-triton --dtype bf16 --sizes 4096x4096x1024 1024x4096x4096 \
    8192x8192x1024 1x8192x8192 16x8192x8192 64x8192x8192 128x8192x8192 1x28672x8192 16x28672x8192 \
    64x28672x8192 128x28672x8192
  for shape in 4096 8192x11008x4096 4096x16384x4096; do
    step sustained limited 25 python3 tools/h200_sustained.py fused-bf16 final "$shape"
  done
  step fp8 limited 60 python3 tools/h200_fp8.py "$out" --shapes 4096x4096x4096 8192x8192x8192 8192x8192x1024 \
    4096x4096x16384
  for which in rs_tf32 cublas_tf32_rr; do
    step ncu limited 45 ncu --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
      --launch-skip 3 --launch-count 1 python3 tools/ncu_tf32_4096.py "$which"
  done
else
  echo "check or perf, not $what"; exit 2
fi
exit $status
