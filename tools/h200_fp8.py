"""fp8 GEMMs on the H200 against torch._scaled_mm (cuBLASLt) in the same process: A (M x K) row-major,
B the transpose of a row-major N x K matrix (as _scaled_mm takes it), per-tensor scales, bf16 out.
Kernel-only (CUDA events around back-to-back calls) for the wgmma fp8 kernel, the mma.sync fp8 kernel
and _scaled_mm; tilegen.matmul as called; each result's error against a float64 product of the same
fp8 inputs, beside _scaled_mm's. Writes DIR/fp8.json.

    python3 tools/h200_fp8.py DIR [--shapes MxNxK ...]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_timing import events_ms  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--shapes", nargs="+", default=["2048x2048x2048", "4096x4096x4096", "8192x8192x8192",
                                                     "8192x8192x1024"])
    ap.add_argument("--dtypes", nargs="+", default=["e4m3"])
    a = ap.parse_args()
    import torch

    import tilegen

    rows = []
    for name in a.dtypes:
        tdt = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[name]
        kernels = {"wgmma": tilegen.compile(tilegen.GemmSpec(dtype=name, out_dtype="bf16", instruction="wgmma")),
                   "wgmma 128x256 unpromoted": tilegen.compile(tilegen.GemmSpec(
                       dtype=name, out_dtype="bf16", instruction="wgmma", tile=(128, 256, 128), promote=False)),
                   "wgmma 128x128 unpromoted": tilegen.compile(tilegen.GemmSpec(
                       dtype=name, out_dtype="bf16", instruction="wgmma", promote=False)),
                   "wgmma promoted every 2": tilegen.compile(tilegen.GemmSpec(
                       dtype=name, out_dtype="bf16", instruction="wgmma", promote=2)),
                   "wgmma promoted every 4": tilegen.compile(tilegen.GemmSpec(
                       dtype=name, out_dtype="bf16", instruction="wgmma", promote=4)),
                   "wgmma promoted, 6 stages": tilegen.compile(tilegen.GemmSpec(
                       dtype=name, out_dtype="bf16", instruction="wgmma", stages=6)),
                   "mma.sync": tilegen.compile(tilegen.GemmSpec(dtype=name, out_dtype="bf16", target="sm_90"))}
        for shape in a.shapes:
            M, N, K = (int(x) for x in shape.split("x"))
            A = (torch.randn(M, K, device="cuda") * 2).to(tdt)
            W = (torch.randn(N, K, device="cuda") * 2).to(tdt)
            B = W.t()
            sa, sb = 0.5, 0.25
            ta, tb = torch.tensor(sa, device="cuda"), torch.tensor(sb, device="cuda")
            C = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
            ref = (A.double() @ B.double()) * (sa * sb)
            flop = 2.0 * M * N * K
            reps = max(5, int(4e12 / flop))

            def err(x):
                return float(((x.double() - ref).abs().max() / ref.abs().max()).item())
            row = {"dtype": name, "shape": [M, N, K]}
            lt = lambda: torch._scaled_mm(A, B, scale_a=ta, scale_b=tb, out_dtype=torch.bfloat16)  # noqa: E731
            try:
                row["scaled_mm_err"] = err(lt())
                row["scaled_mm_tflops"] = flop / events_ms(lt, reps)["ms"] / 1e9
            except (RuntimeError, ValueError) as e:   # cuBLASLt has no e5m2 x e5m2
                row["scaled_mm_error"] = str(e)
                lt = None
            for label, k in kernels.items():
                C.fill_(float("nan"))
                k(A, B, out=C, alpha=sa * sb)
                torch.cuda.synchronize()
                row[f"{label}_err"] = err(C)
                row[f"{label}_tflops"] = flop / events_ms(lambda k=k: k(A, B, out=C, alpha=sa * sb), reps)["ms"] / 1e9
            C.fill_(float("nan"))
            tilegen.matmul(A, B, scale_a=sa, scale_b=sb, out=C)
            torch.cuda.synchronize()
            row["matmul_err"] = err(C)
            row["matmul_spec"] = str(tilegen.matmul.explain(A, B, out=C).spec)
            row["matmul_as_called_tflops"] = flop / events_ms(
                lambda: tilegen.matmul(A, B, scale_a=sa, scale_b=sb, out=C), reps)["ms"] / 1e9
            # per row of A / per column of B: tilegen's epilogue against _scaled_mm's row-wise scales
            va = torch.rand(M, device="cuda") + 0.5
            vb = torch.rand(N, device="cuda") + 0.5
            vref = (A.double() @ B.double()) * va.double()[:, None] * vb.double()[None, :]
            tilegen.matmul(A, B, scale_a=va, scale_b=vb, out=C)
            torch.cuda.synchronize()
            row["rowwise_err"] = float(((C.double() - vref).abs().max() / vref.abs().max()).item())
            row["rowwise_as_called_tflops"] = flop / events_ms(
                lambda: tilegen.matmul(A, B, scale_a=va, scale_b=vb, out=C), reps)["ms"] / 1e9
            rk = tilegen.compile(tilegen.GemmSpec(dtype=name, out_dtype="bf16", instruction="wgmma",
                                                  epilogue=tilegen.Epilogue(scale_rows=True, scale_cols=True)))
            row["rowwise_kernel_tflops"] = flop / events_ms(lambda: rk(A, B, out=C, scale_a=va, scale_b=vb),
                                                            reps)["ms"] / 1e9
            try:
                lr = lambda: torch._scaled_mm(A, B, scale_a=va[:, None], scale_b=vb[None, :],  # noqa: E731
                                              out_dtype=torch.bfloat16)
                row["scaled_mm_rowwise_err"] = float(((lr().double() - vref).abs().max() / vref.abs().max()).item())
                row["scaled_mm_rowwise_tflops"] = flop / events_ms(lr, reps)["ms"] / 1e9
            except (RuntimeError, ValueError) as e:
                row["scaled_mm_rowwise_error"] = str(e)[:200]
            if lt is not None:
                row["scaled_mm_as_called_tflops"] = flop / events_ms(lt, reps)["ms"] / 1e9
                for key in (*kernels, "matmul_as_called"):
                    row[f"{key}_vs_scaled_mm"] = row[f"{key}_tflops"] / row[
                        "scaled_mm_tflops" if key != "matmul_as_called" else "scaled_mm_as_called_tflops"]
            print(json.dumps(row), flush=True)
            rows.append(row)
            del A, W, B, C, ref
            torch.cuda.empty_cache()
    with open(os.path.join(a.out, "fp8.json"), "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
