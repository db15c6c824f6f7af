"""Stacks of products through tilegen.matmul against torch.matmul (`tilegen bench --stacks`):
C = A @ B on (BATCH, M, K) and (BATCH, K, N) arrays (one operand a single matrix for the whole
stack with a "/a" or "/b" suffix), tilegen.matmul(A, B, out=C) against torch.matmul(A, B, out=C),
each call's GPU time between its own events (all the work the call enqueues: its copies and
launches; the host's time is hidden by the delay kernel, timing.py; `tilegen bench --host` and
tools/h200_stacks.py time the host), the operands rotated over enough sets to exceed L2; each row
says which way tilegen.matmul ran the stack (explain) and its error against float64."""
from __future__ import annotations

from ..gemm import matmul
from .env import device_target, l2_bytes
from .gemm import rotation_sets
from .options import MAX_DIM, OptionError
from .timing import EventPool, time_calls, make_delay

# Attention-like products (scores, probabilities @ values; 77 tokens as in CLIP's text encoder),
# ragged and broadcast stacks, and stacks of whole tiles.
DEFAULT_STACKS = ("32x200x200x64", "32x200x64x200", "96x77x77x64", "16x1000x1000x1000", "8x1000x4096x1024/a",
                  "8x2048x2048x2048", "64x128x128x64")
SETS = 8   # buffer sets at most (rotation_sets: together four times the L2)


def parse_stack(text: str) -> tuple:
    """"16x1000x1000x1000" -> (16, 1000, 1000, 1000, ""); a "/a" or "/b" suffix: that operand is
    one matrix for the whole stack."""
    s = str(text).strip().lower()
    body, _, one = s.partition("/")
    parts = body.split("x")
    if len(parts) != 4 or not all(p.strip().isdigit() for p in parts) or one not in ("", "a", "b"):
        raise OptionError(f"stack {text!r}: give BATCHxMxNxK (e.g. 32x200x200x64), with /a or /b when A or B is "
                          f"one matrix for the whole stack")
    dims = tuple(int(p) for p in parts)
    if any(d <= 0 or d > MAX_DIM for d in dims):
        raise OptionError(f"stack {text!r}: every dimension must be in 1..{MAX_DIM}")
    return (*dims, one)


def stack_label(stack: tuple) -> str:
    b, m, n, k, one = stack
    return f"{b}x{m}x{n}x{k}" + (f"/{one}" if one else "")


def stack_rows(torch, backend, dtype: str, stacks, opts, log) -> list:
    """One row per stack: TFLOP/s of tilegen.matmul and torch.matmul as called, their ratio, the
    way tilegen ran it, and the relative error of its result (matrix 0) against float64."""
    tdt = {"f16": torch.float16, "bf16": torch.bfloat16}[dtype]
    events = EventPool(backend.stream)
    delay = make_delay(backend, device_target(torch.cuda.get_device_capability()), events, log)
    rows = []
    for stack in stacks:
        b, M, N, K, one = stack
        na, nb = (1 if one == "a" else b), (1 if one == "b" else b)
        n_sets = rotation_sets((na * M * K + nb * K * N + b * M * N) * 2, l2_bytes(0), max_sets=SETS)

        def operand(n, rows_, cols):
            x = torch.randn(n, rows_, cols, device="cuda").to(tdt)
            return x.expand(b, rows_, cols) if n == 1 else x

        sets = [(operand(na, M, K), operand(nb, K, N), torch.empty(b, M, N, device="cuda", dtype=tdt))
                for _ in range(n_sets)]

        def ours(i):
            A, B, C = sets[i]
            matmul(A, B, out=C)

        def theirs(i):
            A, B, C = sets[i]
            torch.matmul(A, B, out=C)

        A, B, C = sets[0]
        how = matmul.explain(A, B, out=C).reason.split(";")[0]
        ours(0)
        torch.cuda.synchronize()
        ref = A[0].double() @ B[0].double()
        err = float((C[0].double() - ref).norm() / ref.norm())
        theirs(0)
        torch.cuda.synchronize()
        t_ours = time_calls(ours, n_sets, events, opts, delay).ms
        t_theirs = time_calls(theirs, n_sets, events, opts, delay).ms
        flop = 2.0 * b * M * N * K
        row = {"stack": stack_label(stack), "dtype": dtype, "batch": b, "m": M, "n": N, "k": K, "one_matrix": one,
               "tilegen_ms": t_ours, "torch_ms": t_theirs, "tilegen_tflops": flop / t_ours / 1e9,
               "torch_tflops": flop / t_theirs / 1e9, "vs_torch": t_theirs / t_ours, "rel_err": err, "how": how}
        rows.append(row)
        log(f"{dtype} stack {row['stack']}: tilegen.matmul {row['tilegen_tflops']:.1f} TFLOP/s, torch.matmul "
            f"{row['torch_tflops']:.1f}: {row['vs_torch']:.2f}x (error {err:.1e}; {how})")
        sets = []
        torch.cuda.empty_cache()
    return rows


def format_stacks(rows) -> str:
    lines = ["stacks through tilegen.matmul and torch.matmul: GPU time of each call's work (its copies included)",
             f"{'dtype':5s}  {'stack (BxMxNxK)':22s}  {'tilegen TFLOP/s':>15s}  {'torch TFLOP/s':>13s}  {'vs torch':>8s}  "
             f"{'rel err':>8s}  how"]
    for r in rows:
        if "error" in r:
            lines.append(f"{r.get('dtype', '?'):5s}  {r.get('stack', '?'):22s}  {r['error']}")
            continue
        lines.append(f"{r['dtype']:5s}  {r['stack']:22s}  {r['tilegen_tflops']:15.1f}  {r['torch_tflops']:13.1f}  "
                     f"{r['vs_torch']:7.2f}x  {r['rel_err']:8.1e}  {r['how']}")
    return "\n".join(lines)


__all__ = ["DEFAULT_STACKS", "parse_stack", "stack_label", "stack_rows", "format_stacks"]
