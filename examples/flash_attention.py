"""Flash attention (forward) written in the tilegen DSL.

    O = softmax(Q K^T * scale [+ causal mask]) V        per (batch, head)

Q, K, V, O are stacks of BH = batch * heads matrices of S x D (row-major, D = 64 or 128),
f16 or bf16 in, f32 accumulation, f16/bf16 or f32 out. Grid: x walks blocks of BM query
rows, y walks batch * heads.

Each CTA keeps its BM x D block of Q in shared memory and walks the key blocks (BN keys
each) with tilegen.range, double-buffering K and V with cp.async. Every warp owns WM whole
query rows, so its row max and row sum are complete without talking to other warps. Per
key block, per warp:

    S = Q K^T                      mma; K (S x D row-major) is the K-major B operand
    S = S * scale * log2(e)        softmax in base 2: exp2 instead of exp
    [mask]                         keys >= seq, and (causal) keys after the query: -inf
    m_new = max(m, row_max(S))     running row max
    P = exp2(S - m_new)
    l = l * exp2(m - m_new) + row_sum(P)
    O = O * exp2(m - m_new)        rescale what was summed against the old max
    O += P V                       P goes from accumulator to A registers in place
                                   (to_operand); V (S x D) is the N-major B operand
    m = m_new

and at the end O / l. Key blocks split into two loops: blocks every row of the CTA sees in
full (no mask), then the rest (the ragged end, and the diagonal when causal); causal
attention stops at the diagonal, skipping the blocks above it.

    python examples/flash_attention.py                      # GPU if present, else the emulator
    python examples/flash_attention.py --device sim --seq 96 --head-dim 128 --causal
"""
from __future__ import annotations

import argparse
import math
import sys
import weakref

import numpy as np
from example_util import Runner, device_arguments, device_for, numpy_dtype, pick_device, report, size  # first: sys.path

import tilegen
import tilegen.dsl as tg

NEG_INF = float("-inf")
LOG2E = 1.4426950408889634
HEAD_DIMS = (64, 128)
UNIT = {"f16": 2.0 ** -11, "bf16": 2.0 ** -8, "f32": 2.0 ** -24}


@tg.kernel
def flash_attention(head_dim=64, dtype="f16", out_dtype="f16", causal=False, block_m=64, block_n=64, warps=4):
    D, BM, BN = head_dim, block_m, block_n
    WM = BM // warps                      # query rows per warp: warps are stacked along M only
    atom = f"m16n8k16.{dtype}.f32"
    tg.launch(threads=32 * warps, grid=(tg.cdiv("S", BM), "BH", 1))

    Q = tg.batched_tensor("Q", dtype, ("S", "D"), count="BH")
    K = tg.batched_tensor("K", dtype, ("D", "S"), layout="col", count="BH")  # K^T (D x S), stored S x D
    V = tg.batched_tensor("V", dtype, ("S", "D"), count="BH")
    O = tg.batched_tensor("O", out_dtype, ("S", "D"), count="BH")
    scale = tg.scalar("scale")
    S = Q.shape[0]

    bh = tg.program_id("y")
    Q, K, V, O = Q.batch(bh), K.batch(bh), V.batch(bh), O.batch(bh)
    q0 = tg.program_id("x") * BM
    wm = tg.warp_id() * WM

    sQ = tg.shared("sQ", dtype, BM, D)
    sK = tg.shared("sK", dtype, BN, D, stages=2, logical="col")  # B of Q K^T, K-major
    sV = tg.shared("sV", dtype, BN, D, stages=2)                 # B of P V, N-major (ldmatrix.trans)

    tm = WM // 16
    o = tg.fragment(atom, "C", (tm, D // 8), name="o")
    m = tg.row_vector(o, NEG_INF, name="m")
    l = tg.row_vector(o, 0.0, name="l")
    q = tg.fragment(atom, "A", (tm, 1), name="q")
    k = tg.fragment(atom, "B", (1, BN // 8), name="k")
    v = tg.fragment(atom, "B", (1, D // 8), name="v")
    scale2 = tg.mul(scale, LOG2E)

    n_blocks = tg.cdiv(S, BN)             # key blocks this CTA visits ...
    n_full = S // BN                      # ... and the first ones it sees unmasked
    if causal:
        n_blocks = tg.minimum(n_blocks, tg.cdiv(q0 + BM, BN))
        n_full = tg.minimum(n_full, (q0 + 1) // BN)

    def copy_kv(block, stage):
        tg.copy_async(sK[stage], K.block(0, block * BN), inbounds=("D",), comment="K block")
        tg.copy_async(sV[stage], V.block(block * BN, 0), inbounds=("D",), comment="V block")

    tg.copy_async(sQ[0], Q.block(q0, 0), inbounds=("D",), comment="Q block")
    copy_kv(0, 0)
    tg.commit()

    def key_block(kb, masked):
        stage = kb % 2
        tg.wait(0)       # block kb has landed ...
        tg.barrier()     # ... for every thread, and every warp is done with block kb - 1
        copy_kv(kb + 1, (kb + 1) % 2)
        tg.commit()

        s = tg.fragment(atom, "C", (tm, BN // 8), name="s")
        for kk in range(D // 16):
            tg.load(q, sQ[0], wm, kk * 16)
            tg.load(k, sK[stage], kk * 16, 0)
            tg.mma(s, q, k)
        s = tg.scale(s, scale2)
        if masked:
            if causal:
                s = tg.mask(s, q0 + wm, kb * BN, lambda r, c: (c > r) | (c >= S), NEG_INF)
            else:
                s = tg.mask(s, q0 + wm, kb * BN, lambda r, c: c >= S, NEG_INF)

        m_new = tg.maximum(m, tg.row_max(s))
        correction = tg.exp2(tg.sub(m, m_new))
        p = tg.exp2(tg.sub(s, m_new))
        tg.assign(l, tg.add(tg.mul(l, correction), tg.row_sum(p)))
        tg.mul(o, correction, out=o)
        tg.assign(m, m_new)

        for kk, p_k in enumerate(tg.to_operand(p, "A")):
            tg.load(v, sV[stage], kk * 16, 0)
            tg.mma(o, p_k, v)

    for kb in tg.range(0, n_full):
        key_block(kb, masked=False)
    for kb in tg.range(n_full, n_blocks):
        key_block(kb, masked=True)
    tg.wait(0)   # the last, unused prefetch drains

    tg.store(O.block(q0 + wm, 0), tg.div(o, l))


# -- host side --------------------------------------------------------------------------------
def compile_attention(head_dim: int, dtype: str = "f16", out_dtype: str = "f16", causal: bool = False,
                      target: str = "sm_80", **blocks):
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head_dim={head_dim}; allowed: {', '.join(map(str, HEAD_DIMS))}")
    _check_types(dtype, out_dtype)
    kernel = tilegen.compile(flash_attention, head_dim=head_dim, dtype=dtype, out_dtype=out_dtype,
                             causal=causal, target=target, **blocks)
    _MADE_FOR[kernel] = dict(head_dim=head_dim, dtype=dtype, out_dtype=out_dtype, causal=bool(causal))
    return kernel


_MADE_FOR = weakref.WeakKeyDictionary()   # kernel -> what compile_attention made it for


def _check_types(dtype, out_dtype):
    if dtype not in ("f16", "bf16") or out_dtype not in ("f16", "bf16", "f32"):
        raise ValueError(f"dtype={dtype!r}, out_dtype={out_dtype!r}; allowed: dtype 'f16' or 'bf16', out_dtype "
                         f"'f16', 'bf16' or 'f32'")


def _check_kernel(kernel, **want):
    """kernel= must be one compile_attention made for these arguments: a kernel of another head
    dimension reads past the rows, one of other masking computes other attention."""
    made = _MADE_FOR.get(kernel)
    if made is None:
        raise ValueError("kernel= takes a kernel compile_attention returned (it records the head dimension, dtypes "
                         "and masking the kernel was made for)")
    wrong = [f"{k}={made[k]!r} where these arguments need {want[k]!r}" for k in want if made[k] != want[k]]
    if wrong:
        raise ValueError("kernel= was compiled for " + ", ".join(wrong))


def attention(q, k, v, *, causal=False, scale=None, out_dtype=None, device="auto", kernel=None, time=False):
    """O for q, k, v of shape (BH, S, D) (f16 or bfloat16 numpy arrays), in out_dtype ('f16',
    'bf16' or 'f32'; default the inputs' type). Returns O, or (O, milliseconds per launch) with
    time=True (GPU only). device: "auto" (the GPU when present, else the CPU emulator), "gpu" or
    "sim"; kernel: one compile_attention made for these arguments (its block options)."""
    q, k, v = np.asarray(q), np.asarray(k), np.asarray(v)
    where = device_for(device)
    if time and where != "gpu":
        raise ValueError("time=True times launches on the GPU; this call runs on the CPU emulator")
    if q.shape != k.shape or q.shape != v.shape or q.ndim != 3:
        raise ValueError(f"q, k, v must be (BH, S, D) of one shape; got {q.shape}, {k.shape}, {v.shape}")
    dtype = {np.dtype(numpy_dtype("f16")): "f16", np.dtype(numpy_dtype("bf16")): "bf16"}.get(q.dtype)
    if dtype is None or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k, v must all be float16 or bfloat16, got {q.dtype}, {k.dtype}, {v.dtype}")
    BH, S, D = q.shape
    out_dtype = dtype if out_dtype is None else out_dtype
    _check_types(dtype, out_dtype)
    if D not in HEAD_DIMS:
        raise ValueError(f"head dimension {D}; this kernel takes {' or '.join(map(str, HEAD_DIMS))}")
    if S * D * 4 >= 2 ** 32:
        raise ValueError(f"one head of {S} x {D} is too large for a 32-bit batch stride in bytes")
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    if kernel is not None:
        _check_kernel(kernel, head_dim=D, dtype=dtype, out_dtype=out_dtype, causal=bool(causal))
    if BH == 0 or S == 0:   # (no heads or no positions: an empty O)
        out = np.zeros((BH, S, D), numpy_dtype(out_dtype))
        return (out, 0.0) if time else out
    kernel = kernel or compile_attention(D, dtype, out_dtype, causal)
    out = np.full((BH, S, D), np.nan, numpy_dtype(out_dtype))   # poisoned: what is never written stays NaN
    # the stacks by the names the kernel declared (BH heads of S x D each), the scalar by its name;
    # numpy is copied to the GPU and O copied back, or run on the CPU emulator
    kernel(q, k.transpose(0, 2, 1), v, out, scale=scale, device="sim" if where == "sim" else None)   # K as K^T
    if time:
        return out, time_launch(kernel, q, k, v, out_dtype, scale, where)
    return out


def time_launch(kernel, q, k, v, out_dtype: str, scale: float, where: str) -> float:
    """Milliseconds per launch on the GPU with q, k, v already there (kernel.launch from device
    pointers: no copies in the timed loop)."""
    runner = Runner(where)
    BH, S, D = q.shape
    ptrs = {n: runner.put(x) for n, x in (("Q", q), ("K", k), ("V", v))}
    ptrs["O"] = runner.poisoned((BH, S, D), numpy_dtype(out_dtype))
    args = {"S": S, "D": D, "scale": scale}
    for n, p in ptrs.items():
        args.update({f"{n}_ptr": p, f"{n}_ld": D, f"{n}_batch_stride": S * D})
    return runner.time_ms(kernel, args, {"S": S, "BH": BH})


def reference(q, k, v, *, causal=False, scale=None):
    """float64 attention and the matrix P |V| its sums run through: (O, scale of the error)."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    S, D = q.shape[1], q.shape[2]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    s = (q @ k.transpose(0, 2, 1)) * scale
    if causal:
        s[:, np.triu(np.ones((S, S), dtype=bool), 1)] = -np.inf
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return p @ v, p @ np.abs(v)


def error_limit(dtype: str, out_dtype: str) -> float:
    """||O - ref|| / || P |V| || stays under this: P is rounded to the input type before P V
    (one rounding, 2^-11 for f16, 2^-8 for bf16), O to the output type; exp2.approx and
    the f32 sums add about 2^-21. Twice the sum, for safety."""
    return 2 * (UNIT[dtype] + UNIT[out_dtype] + 2.0 ** -21)


def relative_error(out, ref, magnitude) -> float:
    return float(np.linalg.norm(out.astype(np.float64) - ref) / np.linalg.norm(magnitude))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    device_arguments(ap)
    ap.add_argument("--batch-heads", type=size, default=None, help="batch * heads (default 16 on the GPU, 2 emulated)")
    ap.add_argument("--seq", type=size, default=None, help="sequence length (default 2048 on the GPU, 80 emulated)")
    ap.add_argument("--head-dim", type=int, default=64, choices=HEAD_DIMS)
    ap.add_argument("--dtype", choices=("f16", "bf16"), default="f16")
    ap.add_argument("--out-dtype", choices=("f16", "bf16", "f32"), default=None, help="default: the input type")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--block-m", type=size, default=64, help="query rows per CTA (a multiple of 16 * warps)")
    ap.add_argument("--block-n", type=size, default=64, help="keys per step (a multiple of 16)")
    ap.add_argument("--warps", type=size, default=4, help="warps per CTA, stacked along the query rows")
    args = ap.parse_args(argv)
    if args.block_m % (16 * args.warps) or args.block_n % 16:
        ap.error(f"--block-m {args.block_m} must be a multiple of 16 * --warps = {16 * args.warps}, and --block-n "
                 f"{args.block_n} a multiple of 16")
    # (two products of seq x seq x head_dim per batch-head, at the emulated defaults where not given)
    device = pick_device(args.device, 2 * (args.batch_heads or 2) * (args.seq or 80) ** 2 * args.head_dim)
    bh = args.batch_heads or (16 if device == "gpu" else 2)
    seq = args.seq or (2048 if device == "gpu" else 80)
    out_dtype = args.out_dtype or args.dtype
    rng = np.random.default_rng(args.seed)
    nd = numpy_dtype(args.dtype)
    q, k, v = (rng.standard_normal((bh, seq, args.head_dim)).astype(nd) for _ in range(3))
    try:
        kernel = compile_attention(args.head_dim, args.dtype, out_dtype, args.causal, block_m=args.block_m,
                                   block_n=args.block_n, warps=args.warps)
    except tilegen.DSLError as e:   # block options the kernel cannot take together
        ap.error(f"--block-m {args.block_m} --block-n {args.block_n} --warps {args.warps}: {e}")
    result = attention(q, k, v, causal=args.causal, out_dtype=out_dtype, device=device, kernel=kernel,
                       time=device == "gpu")
    out, ms = result if device == "gpu" else (result, None)
    ref, magnitude = reference(q, k, v, causal=args.causal)
    err = relative_error(out, ref, magnitude)
    extra = ""
    if ms is not None:
        flops = 4 * bh * seq * seq * args.head_dim * (0.5 if args.causal else 1.0)
        extra = f", {ms:.3f} ms, {flops / ms / 1e9:.1f} TFLOP/s"
    what = (f"flash attention {args.dtype}->{out_dtype} BH={bh} S={seq} D={args.head_dim}"
            f"{' causal' if args.causal else ''} on {device}")
    return report(what, err, error_limit(args.dtype, out_dtype), extra)


if __name__ == "__main__":
    sys.exit(main())
