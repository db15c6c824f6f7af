"""Host time of fp8 calls as users write them: microseconds of CPU per call (the GPU kept ahead: a
small product, many calls, then one synchronize; tilegen bench --host's per_call_us, the ways taking
turns; runs 306-307 timed each way alone, 2000 calls x 5) of tilegen.matmul with per-tensor scales as
one-element GPU tensors, as Python floats, and with none, beside torch._scaled_mm and a bf16
tilegen.matmul / torch.matmul of the same shape; then a cProfile of the GPU-tensor-scale call.
Writes DIR/fp8_host.json and DIR/fp8_host_profile.txt.

    python3 tools/h200_fp8_host.py DIR [MxNxK]
"""
import cProfile
import io
import json
import os
import pstats
import sys

import torch

import tilegen
from tilegen.bench.host import per_call_us


def main():
    d = sys.argv[1]
    M, N, K = (int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "16x1024x1024").split("x"))
    A = torch.randn(M, K, device="cuda").to(torch.float8_e4m3fn)
    W = torch.randn(N, K, device="cuda").to(torch.float8_e4m3fn)
    B = W.t()
    C = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    sa, sb = torch.tensor(0.5, device="cuda"), torch.tensor([2.0], device="cuda")
    A16, B16 = A.to(torch.bfloat16), B.to(torch.bfloat16)
    calls = {
        "torch._scaled_mm": lambda: torch._scaled_mm(A, B, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16),
        "tilegen.matmul GPU scales, out=C": lambda: tilegen.matmul(A, B, scale_a=sa, scale_b=sb, out=C),
        "tilegen.matmul float scales, out=C": lambda: tilegen.matmul(A, B, scale_a=0.5, scale_b=2.0, out=C),
        "tilegen.matmul no scales, out=C": lambda: tilegen.matmul(A, B, out=C),
        "tilegen.matmul GPU scales, out_dtype": lambda: tilegen.matmul(A, B, scale_a=sa, scale_b=sb,
                                                                       out_dtype=torch.bfloat16),
        "torch.matmul bf16, out=C": lambda: torch.matmul(A16, B16, out=C),
        "tilegen.matmul bf16, out=C": lambda: tilegen.matmul(A16, B16, out=C),
    }
    # (tilegen bench --host's method: the calls take turns, 2000 at a time, the median of 5 turns)
    timed = per_call_us(calls, torch.cuda.synchronize, 2000, 5)
    res = {"shape": [M, N, K], "host_us": {k: round(v["us"], 2) for k, v in timed.items()}}
    print(json.dumps(res), flush=True)
    prof = cProfile.Profile()
    f = calls["tilegen.matmul GPU scales, out=C"]
    prof.enable()
    for _ in range(3000):
        f()
    prof.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(30)
    with open(os.path.join(d, "fp8_host_profile.txt"), "w") as fh:
        fh.write(s.getvalue())
    with open(os.path.join(d, "fp8_host.json"), "w") as fh:
        json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
