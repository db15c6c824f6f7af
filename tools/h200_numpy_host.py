"""matmul on numpy operands through the GPU, as called: milliseconds a call of tilegen.matmul(A, B)
(host arrays in and out: copies, launch, read-back) with explain's spec remembered per choice key,
against the same calls asking explain every time (the code before the memo, run 301), with the
device buffers allocated and freed per call (HostCallBuffers.MAX_BYTES = 0: the code before they
were kept), and against torch's equivalent (torch.from_numpy(A).cuda() @ ... .cpu()). Writes
DIR/numpy_host.json. (Runs 301, 312-313 timed with a loop of the tool's own: 30 calls x 5, no warm-up
period.)

    python3 tools/h200_numpy_host.py DIR
"""
import importlib
import json
import os
import sys

import ml_dtypes
import numpy as np
import torch

import tilegen
from tilegen.bench.host import per_call_us

mm = importlib.import_module("tilegen.gemm.matmul")


def per_call_ms(fn):
    """Milliseconds a call (the calls are synchronous: nothing to drain), tilegen bench --host's way."""
    return round(per_call_us({"call": fn}, lambda: None, 30, 5)["call"]["us"] / 1e3, 4)


def main():
    rows = []
    rng = np.random.default_rng(0)
    for dtype, tdtype in ((np.float16, torch.float16), (ml_dtypes.bfloat16, torch.bfloat16), (np.float32, torch.float32)):
        for n in (64, 256, 1024):
            A = rng.standard_normal((n, n)).astype(dtype)
            B = rng.standard_normal((n, n)).astype(dtype)
            ref = A.astype(np.float64) @ B.astype(np.float64)
            got = tilegen.matmul(A, B)
            err = float(np.abs(got.astype(np.float64) - ref).max() / np.abs(ref).max())
            remembered = per_call_ms(lambda: tilegen.matmul(A, B))
            real = mm._host_spec
            mm._host_spec = lambda *a: None    # (explain on every call, as before)
            try:
                explained = per_call_ms(lambda: tilegen.matmul(A, B))
            finally:
                mm._host_spec = real
            pool = tilegen.runtime.HostCallBuffers
            keep, pool.MAX_BYTES = pool.MAX_BYTES, 0    # (every buffer allocated and freed per call)
            try:
                unpooled = per_call_ms(lambda: tilegen.matmul(A, B))
            finally:
                pool.MAX_BYTES = keep
            if dtype is ml_dtypes.bfloat16:
                ta, tb = (torch.from_numpy(x.view(np.int16)).view(torch.bfloat16) for x in (A, B))
                to_np = lambda t: t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
            else:
                ta, tb = torch.from_numpy(A), torch.from_numpy(B)
                to_np = lambda t: t.numpy()
            torch_ms = per_call_ms(lambda: to_np((ta.cuda() @ tb.cuda()).cpu()))
            row = dict(dtype=np.dtype(dtype).name, n=n, err=err, matmul_ms=remembered, explain_every_call_ms=explained,
                       buffers_per_call_ms=unpooled,
                       torch_ms=torch_ms, spec=str(mm.explain(A, B).spec))
            print(json.dumps(row), flush=True)
            rows.append(row)
    with open(os.path.join(sys.argv[1], "numpy_host.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
