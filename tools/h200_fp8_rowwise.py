"""fp8 row-wise scales' cost over per-tensor, as called (tilegen.matmul and torch._scaled_mm),
interleaved rounds, operands rotated over 3 sets. argv: tag [shapes...]

    python3 tools/h200_fp8_rowwise.py TAG [MxNxK ...]
"""
import json, os, sys
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tilegen  # noqa: E402
from gpu_timing import interleaved_us  # noqa: E402

tag = sys.argv[1]
shapes = sys.argv[2:] or ["8192x8192x1024", "8192x8192x2048", "4096x4096x4096", "8192x8192x8192"]
out = {"tag": tag}
for sh in shapes:
    M, N, K = map(int, sh.split("x"))
    sets = []
    for _ in range(3):
        A = (torch.randn(M, K, device="cuda") * 0.5).to(torch.float8_e4m3fn)
        B = (torch.randn(N, K, device="cuda") * 0.5).to(torch.float8_e4m3fn).t()
        sa = torch.rand(M, 1, device="cuda") + 0.5
        sb = torch.rand(1, N, device="cuda") + 0.5
        C = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        sets.append((A, B, sa, sb, C))
    one = torch.ones((), device="cuda")
    fns = {
        "tg pt": lambda s: tilegen.matmul(s[0], s[1], scale_a=1.5, scale_b=0.75, out=s[4]),
        "tg rw": lambda s: tilegen.matmul(s[0], s[1], scale_a=s[2].reshape(-1), scale_b=s[3].reshape(-1), out=s[4]),
        "torch pt": lambda s: torch._scaled_mm(s[0], s[1], scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
        "torch rw": lambda s: torch._scaled_mm(s[0], s[1], scale_a=s[2], scale_b=s[3], out_dtype=torch.bfloat16),
    }
    # correctness of the row-wise call first
    A, B, sa, sb, C = sets[0]
    C.fill_(float("nan"))
    tilegen.matmul(A, B, scale_a=sa.reshape(-1), scale_b=sb.reshape(-1), out=C)
    ref = (A.double() @ B.double()) * sa.double() * sb.double()
    err = float(torch.linalg.norm(C.double() - ref) / torch.linalg.norm(ref))
    med = interleaved_us(fns, sets, max(20, int(2e11 / (M * N * K))))
    out[sh] = dict(med, rw_cost=round(med["tg rw"] / med["tg pt"] - 1, 4),
                   torch_rw_cost=round(med["torch rw"] / med["torch pt"] - 1, 4),
                   x_pt=round(med["torch pt"] / med["tg pt"], 4), x_rw=round(med["torch rw"] / med["tg rw"], 4),
                   rw_err=err, spec=str(tilegen.matmul.explain(A, B, scale_a=sa.reshape(-1), scale_b=sb.reshape(-1), out=C).spec))
print(json.dumps(out))
