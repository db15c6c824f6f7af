"""tf32 with A and B row-major: the kernel that feeds B to wgmma from registers (C^T = B^T A^T,
GemmSpec(copy="tma"): consume_registers), a first kernel copying B K-major before the K-major
kernel (GemmSpec(pretranspose=True)), what tilegen.matmul runs (one of the two by its rule), and
torch.matmul (cuBLAS tf32): GPU time per call in interleaved rounds over 3 operand sets; error of
each against a float64 product. Also the register kernel's ptxas report (serialized wgmmas or not).

    python3 tools/h200_tf32_registers.py TAG [--cc | --cr] [MxNxK ...]

--cc: A and B column-major instead (A's k-steps through registers, B K-major by descriptor).
--cr: A column-major, B row-major: A copied K-major first, then the register kernel
(GemmSpec(pretranspose="A")), against copying both first (pretranspose=True).
"""
import json, os, sys
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tilegen  # noqa: E402
from gpu_timing import interleaved_us, max_relative_error  # noqa: E402
from tilegen.codegen import ptxas  # noqa: E402
from tilegen.gemm.spec import GemmSpec  # noqa: E402

torch.backends.cuda.matmul.allow_tf32 = True
tag = sys.argv[1]
cc, cr = "--cc" in sys.argv, "--cr" in sys.argv
lay = "col" if cc else "row"
shapes = [a for a in sys.argv[2:] if a not in ("--cc", "--cr")] or [
    "1024x4096x4096", "2048x2048x2048", "2048x8192x8192", "4096x4096x1024", "4096x4096x4096", "4096x8192x8192",
    "6144x6144x6144", "6144x8192x2048", "8192x8192x1024", "8192x8192x8192"]
regs = GemmSpec(dtype="tf32", out_dtype="f32", a_layout="col" if cr else lay, b_layout=lay, instruction="wgmma",
                target="sm_90a", **({"pretranspose": "A"} if cr else {"copy": "tma"}))
kr = tilegen.compile(regs)
kc = tilegen.compile(GemmSpec(dtype="tf32", out_dtype="f32", a_layout="col" if cr else lay, b_layout=lay,
                              instruction="wgmma", target="sm_90a", pretranspose=True))
out = {"tag": tag, "spec": str(regs)}
try:
    out["ptxas"] = str(ptxas.resources(kr.ptx, "sm_90a"))
except ptxas.PtxasError as e:
    out["ptxas"] = f"not run: {e}"
print(out, flush=True)
for sh in shapes:
    M, N, K = map(int, sh.split("x"))
    if cc or cr:   # column-major views
        sets = [(torch.randn(K, M, device="cuda").t(),
                 torch.randn(K, N, device="cuda") if cr else torch.randn(N, K, device="cuda").t(),
                 torch.empty(M, N, device="cuda")) for _ in range(3)]
    else:
        sets = [(torch.randn(M, K, device="cuda"), torch.randn(K, N, device="cuda"), torch.empty(M, N, device="cuda"))
                for _ in range(3)]
    fns = {
        "torch": lambda s: torch.matmul(s[0], s[1], out=s[2]),
        "matmul": lambda s: tilegen.matmul(s[0], s[1], out=s[2], allow_tf32=True),
        "registers": lambda s: kr(s[0], s[1], out=s[2]),
        "copy first": lambda s: kc(s[0], s[1], out=s[2]),
    }
    A, B, C = sets[0]
    ref = A.double() @ B.double()
    scale = A.double().abs() @ B.double().abs()
    err = {name: max_relative_error(lambda f=f: f(sets[0]), C, ref, scale) for name, f in fns.items()}
    med = interleaved_us(fns, sets, max(10, int(1e11 / (M * N * K))))
    why = tilegen.matmul.explain(A, B, out=C, allow_tf32=True).reason
    out[sh] = dict(matmul_takes="registers" if "into registers" in why else "copy first" if "copies it K-major" in why
                   else why, layout="cc" if cc else "cr" if cr else "rr", us=med,
                   x_torch={k: round(med["torch"] / v, 4) for k, v in med.items()}, err=err)
    print(sh, out[sh], flush=True)
print(json.dumps(out))
