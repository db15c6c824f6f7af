"""Fused epilogues and 3xTF32 against torch, on the GPU: `python3 -m tilegen.bench.fused`.

Rows:
- GEMM + bias + GELU(tanh), bf16/f16 in and out: tilegen's one fused kernel (the one
  tilegen.matmul picks for the shape: on Hopper the warp-specialized wgmma kernel, its epilogue
  applied on the way to the TMA stores), launched alone and called as users call it
  (tilegen.matmul(A, B, bias=, activation=, out=)), against torch's best unfused path
  (torch.addmm, which folds the bias into cuBLAS, then F.gelu) and against three ops
  (matmul, + bias, gelu).
- f32 GEMM: tilegen's 3xTF32 against cuBLAS f32 with TF32 off, throughput and error.
Each time is the median of CUDA-event-timed calls after warm-up, with the operands rotated
over enough buffer sets to exceed L2 (tilegen/bench/timing.py); results are checked first.
"""
from __future__ import annotations

import argparse
import json
import sys

from ..frontend import compile as tg_compile
from ..gemm import GemmSpec, matmul
from .backends import TorchBackend
from .env import device_target, environment, l2_bytes
from .gemm import rotation_sets
from .timing import EventPool, TimingOptions, make_delay, time_calls

SIZES = [(4096, 4096, 4096), (8192, 11008, 4096), (4096, 16384, 4096)]
SETS = 8   # buffer sets at most (rotation_sets: together four times the L2)


def fused_rows(torch, dtype: str, sizes, opts, log) -> list:
    F = torch.nn.functional
    tdt = {"f16": torch.float16, "bf16": torch.bfloat16}[dtype]
    backend = TorchBackend()
    events = EventPool(backend.stream)
    delay = make_delay(backend, device_target(torch.cuda.get_device_capability()), events, log)
    rows = []
    for M, N, K in sizes:
        n_sets = rotation_sets((M * K + K * N + M * N) * 2, l2_bytes(0), max_sets=SETS)
        sets = [(torch.randn(M, K, device="cuda").to(tdt), torch.randn(K, N, device="cuda").to(tdt),
                 torch.randn(N, device="cuda").to(tdt), torch.empty(M, N, device="cuda", dtype=tdt))
                for _ in range(n_sets)]
        stream = torch.cuda.current_stream().cuda_stream
        spec = matmul.explain(sets[0][0], sets[0][1], bias=sets[0][2], activation="gelu_tanh", out=sets[0][3]).spec
        kernel = tg_compile(spec)

        def ours(i):
            A, B, b, C = sets[i]
            kernel.launch({"M": M, "N": N, "K": K, "A_ptr": A.data_ptr(), "A_ld": K, "B_ptr": B.data_ptr(),
                           "B_ld": N, "C_ptr": C.data_ptr(), "C_ld": N, "alpha": 1.0, "beta": 0.0,
                           "bias_ptr": b.data_ptr()}, {"M": M, "N": N, "K": K}, stream=stream)

        def as_called(i):
            A, B, b, C = sets[i]
            matmul(A, B, bias=b, activation="gelu_tanh", out=C)

        def addmm_gelu(i):
            A, B, b, C = sets[i]
            F.gelu(torch.addmm(b, A, B), approximate="tanh")

        def three_ops(i):
            A, B, b, C = sets[i]
            F.gelu(torch.matmul(A, B) + b, approximate="tanh")

        ours(0)
        torch.cuda.synchronize()
        A, B, b, C = sets[0]
        ref = F.gelu(A.double() @ B.double() + b.double(), approximate="tanh")
        err = float((C.double() - ref).norm() / ref.norm())
        times = {}
        for name, fn in (("tilegen_fused", ours), ("tilegen_matmul", as_called), ("torch_addmm_gelu", addmm_gelu),
                         ("torch_three_ops", three_ops)):
            fn(0)
            torch.cuda.synchronize()
            times[name] = time_calls(fn, n_sets, events, opts, delay).ms
        flop = 2.0 * M * N * K
        row = {"kind": "gemm_bias_gelu", "dtype": dtype, "m": M, "n": N, "k": K, "rel_err": err, "kernel": kernel.name,
               **{f"{k}_ms": v for k, v in times.items()},
               **{f"{k}_tflops": flop / v / 1e9 for k, v in times.items()},
               "speedup_vs_addmm_gelu": times["torch_addmm_gelu"] / times["tilegen_fused"],
               "speedup_vs_three_ops": times["torch_three_ops"] / times["tilegen_fused"],
               "matmul_vs_addmm_gelu": times["torch_addmm_gelu"] / times["tilegen_matmul"]}
        rows.append(row)
        log(f"{dtype} {M}x{N}x{K}: fused {row['tilegen_fused_tflops']:.0f} TFLOP/s, addmm+gelu "
            f"{row['torch_addmm_gelu_tflops']:.0f}, three ops {row['torch_three_ops_tflops']:.0f}: "
            f"{row['speedup_vs_addmm_gelu']:.2f}x / {row['speedup_vs_three_ops']:.2f}x; tilegen.matmul as called "
            f"{row['matmul_vs_addmm_gelu']:.2f}x addmm+gelu (error {err:.1e})")
        sets = []  # free the buffers before the next size
        torch.cuda.empty_cache()
    return rows


def f32_rows(torch, sizes, opts, log) -> list:
    target = device_target(torch.cuda.get_device_capability())
    backend = TorchBackend()
    events = EventPool(backend.stream)
    delay = make_delay(backend, target, events, log)
    kernel = tg_compile(GemmSpec(dtype="f32", target=target))
    rows = []
    for M, N, K in sizes:
        n_sets = rotation_sets((M * K + K * N + M * N) * 4, l2_bytes(0), max_sets=SETS)
        sets = [(torch.randn(M, K, device="cuda"), torch.randn(K, N, device="cuda"), torch.empty(M, N, device="cuda"))
                for _ in range(n_sets)]
        stream = torch.cuda.current_stream().cuda_stream

        def ours(i):
            A, B, C = sets[i]
            kernel.launch({"M": M, "N": N, "K": K, "A_ptr": A.data_ptr(), "A_ld": K, "B_ptr": B.data_ptr(),
                           "B_ld": N, "C_ptr": C.data_ptr(), "C_ld": N, "alpha": 1.0, "beta": 0.0},
                          {"M": M, "N": N, "K": K}, stream=stream)

        def cublas_f32(i):
            A, B, C = sets[i]
            torch.mm(A, B, out=C)

        torch.backends.cuda.matmul.allow_tf32 = False
        A, B, C = sets[0]
        ref = A.double() @ B.double()
        ours(0)
        torch.cuda.synchronize()
        err_ours = float((C.double() - ref).norm() / ref.norm())
        cublas_f32(0)
        torch.cuda.synchronize()
        err_cublas = float((C.double() - ref).norm() / ref.norm())
        t_ours = time_calls(ours, n_sets, events, opts, delay).ms
        t_cublas = time_calls(cublas_f32, n_sets, events, opts, delay).ms
        flop = 2.0 * M * N * K
        row = {"kind": "f32_3xtf32", "m": M, "n": N, "k": K, "tilegen_ms": t_ours, "cublas_f32_ms": t_cublas,
               "tilegen_tflops": flop / t_ours / 1e9, "cublas_f32_tflops": flop / t_cublas / 1e9,
               "speedup": t_cublas / t_ours, "rel_err_tilegen": err_ours, "rel_err_cublas_f32": err_cublas}
        rows.append(row)
        log(f"f32 {M}x{N}x{K}: 3xTF32 {row['tilegen_tflops']:.1f} TFLOP/s (error {err_ours:.1e}), cuBLAS f32 "
            f"{row['cublas_f32_tflops']:.1f} (error {err_cublas:.1e}): {row['speedup']:.2f}x")
        sets = []  # free the buffers before the next size
        torch.cuda.empty_cache()
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m tilegen.bench.fused", description=__doc__.splitlines()[0])
    p.add_argument("--dtype", nargs="+", default=["bf16", "f16"], choices=["bf16", "f16"])
    p.add_argument("--f32-sizes", nargs="+", default=["4096"], help="cube sizes for the 3xTF32 rows")
    p.add_argument("--save", metavar="FILE.json")
    p.add_argument("--rep-ms", type=float, default=200.0)
    args = p.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("tilegen.bench.fused needs torch (the baselines are torch's)", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("tilegen.bench.fused: no GPU found", file=sys.stderr)
        return 2

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    opts = TimingOptions(rep_ms=args.rep_ms)
    rows = []
    for dt in args.dtype:
        rows += fused_rows(torch, dt, SIZES, opts, log)
    rows += f32_rows(torch, [(int(s),) * 3 for s in args.f32_sizes], opts, log)

    record = {"env": environment(0), "rows": rows}
    if args.save:
        with open(args.save, "w") as f:
            json.dump(record, f, indent=1)
    print("| dtype | M x N x K | fused TFLOP/s | addmm+gelu | 3 ops | vs addmm+gelu | vs 3 ops | rel err |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        if r["kind"] == "gemm_bias_gelu":
            print(f"| {r['dtype']} | {r['m']}x{r['n']}x{r['k']} | {r['tilegen_fused_tflops']:.0f} | "
                  f"{r['torch_addmm_gelu_tflops']:.0f} | {r['torch_three_ops_tflops']:.0f} | "
                  f"{r['speedup_vs_addmm_gelu']:.2f}x | {r['speedup_vs_three_ops']:.2f}x | {r['rel_err']:.1e} |")
    print("\n| f32 M x N x K | 3xTF32 TFLOP/s | cuBLAS f32 TFLOP/s | speed-up | error 3xTF32 | error cuBLAS f32 |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        if r["kind"] == "f32_3xtf32":
            print(f"| {r['m']}x{r['n']}x{r['k']} | {r['tilegen_tflops']:.1f} | {r['cublas_f32_tflops']:.1f} | "
                  f"{r['speedup']:.2f}x | {r['rel_err_tilegen']:.1e} | {r['rel_err_cublas_f32']:.1e} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
