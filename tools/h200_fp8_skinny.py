"""fp8 decoding's products (a few rows of tokens against a wide weight), kernel-only: e4m3 A (M x K,
row-major) times W.T (W: N x K), per-tensor scales as one-element GPU tensors, bf16 out, against
torch._scaled_mm captured the same way. tilegen.matmul's choice and spec variants (its spec with
other tiles, stages, stream-K or promotion), each checked first (normwise error against a float64
product of the same fp8 inputs, beside _scaled_mm's), then timed by CUDA-graph replay over two
operand sets (gpu_timing.graph_us). Also tilegen.matmul as called (do_bench-like events). Writes
DIR/fp8_skinny.json.

    python3 tools/h200_fp8_skinny.py DIR [--shapes MxNxK ...] [--variants JSON]

A variant is {"name": {GemmSpec fields replacing the choice's}} (tuples as lists). Run 301 timed the
WS variants (those of 128 rows failed on the 128-row choice's frag_buffers=2, since set), run 302 all.
"""
import argparse
import json
import os

import torch

import tilegen
from gpu_timing import events_ms, graph_us

WS = dict(instruction="wgmma", target="sm_90a", persistent=True, copy="tma", store="auto", promote=2, frag_buffers=1)
MMA = dict(instruction="mma.sync", target="sm_90", persistent=False, copy="cp.async", store="direct", promote=0,
           frag_buffers=2, stream_k=False)
VARIANTS = {
    "ws 64x128x128 s8": dict(WS, tile=(64, 128, 128), warps=(4, 1), stages=8),
    "ws 64x128x128 s8 promote1": dict(WS, tile=(64, 128, 128), warps=(4, 1), stages=8, promote=1),
    "ws 64x128x128 s8 stream-K": dict(WS, tile=(64, 128, 128), warps=(4, 1), stages=8, stream_k=True),
    "ws 64x128x128 s8 stream-K promote1": dict(WS, tile=(64, 128, 128), warps=(4, 1), stages=8, stream_k=True,
                                               promote=1),
    "ws 64x64x128 s12": dict(WS, tile=(64, 64, 128), warps=(4, 1), stages=12),
    "ws 64x128x128 s8 promote1 turns": dict(WS, tile=(64, 128, 128), warps=(4, 1), stages=8, promote=1,
                                            frag_buffers=2),
    "ws 64x192x128 s5": dict(WS, tile=(64, 192, 128), warps=(4, 1), stages=5),
    "ws 128x128x128 s4 stream-K": dict(WS, tile=(128, 128, 128), warps=(8, 1), stages=4, stream_k=True),
    "ws 128x64x128 s6": dict(WS, tile=(128, 64, 128), warps=(8, 1), stages=6),
    "ws 64x64x128 s12 promote1": dict(WS, tile=(64, 64, 128), warps=(4, 1), stages=12, promote=1),
    "mma 16x64x128 w1x4 s6": dict(MMA, tile=(16, 64, 128), warps=(1, 4), stages=6),
    "mma 16x64x256 w1x4 s6": dict(MMA, tile=(16, 64, 256), warps=(1, 4), stages=6),
    "mma 32x64x256 w1x4 s6": dict(MMA, tile=(32, 64, 256), warps=(1, 4), stages=6),
    "mma 16x128x128 w1x4 s4": dict(MMA, tile=(16, 128, 128), warps=(1, 4), stages=4),
    "mma 16x128x256 w1x4 s4": dict(MMA, tile=(16, 128, 256), warps=(1, 4), stages=4),
    "mma 64x128x128 w2x2 s3": dict(MMA, tile=(64, 128, 128), warps=(2, 2), stages=3),
    "mma 64x64x128 w2x2 s6": dict(MMA, tile=(64, 64, 128), warps=(2, 2), stages=6),
}
SHAPES = [f"{m}x{n}x8192" for n in (8192, 28672) for m in (1, 16, 32, 64, 128)] + \
         [f"{m}x8192x28672" for m in (1, 16, 64, 128)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--shapes", nargs="+", default=SHAPES)
    ap.add_argument("--variants", metavar="JSON")
    a = ap.parse_args()
    variants = VARIANTS if not a.variants else {
        n: {k: tuple(v) if isinstance(v, list) else v for k, v in kw.items()} for n, kw in json.loads(a.variants).items()}
    one = torch.ones((), device="cuda")
    rows = []
    for shape in a.shapes:
        M, N, K = (int(x) for x in shape.split("x"))

        def operands():
            A = (torch.randn(M, K, device="cuda") * 0.5).to(torch.float8_e4m3fn)
            W = (torch.randn(N, K, device="cuda") * 0.5).to(torch.float8_e4m3fn)
            return A, W.t(), torch.empty(M, N, device="cuda", dtype=torch.bfloat16)

        sets = [operands(), operands()]
        A, B, C = sets[0]
        ref = A.double() @ B.double()
        choice = tilegen.matmul.explain(A, B, scale_a=one, scale_b=one, out=C)
        row = {"shape": [M, N, K], "choice": str(choice.spec), "reason": choice.reason, "us": {}, "err": {}}

        def err_of(got):
            return float(torch.linalg.norm(got.double() - ref) / torch.linalg.norm(ref))

        fns = {"torch._scaled_mm": lambda s: torch._scaled_mm(s[0], s[1], scale_a=one, scale_b=one,
                                                               out_dtype=torch.bfloat16),
               "tilegen.matmul": lambda s: tilegen.matmul(s[0], s[1], scale_a=one, scale_b=one, out=s[2])}
        for name, fields in variants.items():
            try:
                k = tilegen.compile(choice.spec.replace(**fields))
            except Exception as e:  # noqa: BLE001  (a refused variant is a row entry)
                row["us"][name] = f"{type(e).__name__}: {e}"[:160]
                continue
            fns[name] = (lambda k: lambda s: k(s[0], s[1], out=s[2], scale_a=one, scale_b=one))(k)
        for name, f in fns.items():
            try:
                C.fill_(float("nan"))
                got = f(sets[0])
                torch.cuda.synchronize()
                row["err"][name] = err_of(got if name == "torch._scaled_mm" else C)
                row["us"][name] = graph_us([(lambda f, s: lambda: f(s))(f, s) for s in sets])
            except Exception as e:  # noqa: BLE001
                row["us"][name] = f"{type(e).__name__}: {e}"[:160]
        t = row["us"]["torch._scaled_mm"]
        row["x_scaled_mm"] = {k: round(t / v, 3) for k, v in row["us"].items() if isinstance(v, float)}
        row["as_called_us"] = {"torch._scaled_mm": round(1e3 * events_ms(lambda: fns["torch._scaled_mm"](sets[0]), 200)["ms"], 2),
                               "tilegen.matmul": round(1e3 * events_ms(lambda: fns["tilegen.matmul"](sets[0]), 200)["ms"], 2)}
        print(json.dumps(row), flush=True)
        rows.append(row)
    with open(os.path.join(a.out, "fp8_skinny.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
