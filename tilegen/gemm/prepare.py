"""Operands prepared by first kernels, before the GEMM kernel runs.

Two kinds, each a small DSL kernel that writes prepared copies of the operands into a
workspace, after which the GEMM runs on the copies (spec.kernel_spec):

- Transposing copies (GemmSpec(pretranspose=True)). wgmma reads tf32 operands from shared
  memory only K-major (ptx.md 6.3), so a row-major B (or a column-major A) cannot go through
  TMA into the stages the tensor cores read. Feeding it through the GEMM's own copies (4-byte
  transposing cp.async, or registers as C^T's A operand) keeps the kernel 20% behind the
  K-major one (docs/perf_notes.md sections 14, 15, 31); for large products it is cheaper to
  transpose the operand once, at memory speed. Each CTA copies one block into a 128B-swizzled
  shared tile laid out as the destination's rows (the copy transposes, one 4-byte cp.async per
  element; zeros past the edges), then one thread writes the tile with a TMA store (which clips
  at the edges). The bits are moved, not converted: NaN payloads and signed zeros survive.

- tf32 parts for f32 products on wgmma (GemmSpec(dtype="f32", instruction="wgmma"), 3xTF32).
  x = hi + lo with hi = tf32(x), lo = tf32(x - hi); A @ B ~ Ahi @ Bhi + Ahi @ Blo + Alo @ Bhi is
  one tf32 product over a K three times as long: A' = [Ahi | Ahi' | Alo] and B' = [Bhi ; Blo ;
  Bhi'] side by side along K (Ahi' = Ahi where A is finite, else 0, and lo = 0 where x is not
  finite, so that no correction term is inf * 0). Each part is exact in tf32, so wgmma's
  truncation of its operands changes nothing; its truncating accumulation is what the kernel's
  promotion into an f32 total bounds. Each segment is padded with zeros to a multiple of
  SPLIT_BLOCK[1] along K so that the blocks of one segment never write into the next. One
  launch splits both operands (its first CTAs take A's blocks, the rest B's): a launch is most
  of a small product's host time.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import compiler
from .. import dsl as tg

# the transposing copy's destination block per CTA: BLOCK_ROWS x 32 columns (one 128-byte swizzle
# span). 32 rows ran 3.2-3.5 TB/s on the H200 at 4096^2 and 8192^2 (memcpy 3.6-4.1), 64: 3.0-3.3,
# 128: 2.6-2.7 (docs/results/2026-11-24-h200-runs109-124.md, run 110)
BLOCK_ROWS = 32
BLOCK_COLS = 32
THREADS = 128
SPLIT_BLOCK = (64, 64)   # the split's block of (rows, K) per CTA: four warps of 32 x 32
SPLIT_ATOM = "m16n8k8.tf32.f32"
A_PARTS = ("hi", "finite_hi", "lo")   # A' = [Ahi | Ahi' | Alo] ...
B_PARTS = ("hi", "lo", "finite_hi")   # ... against B' = [Bhi ; Blo ; Bhi']


@dataclass(frozen=True)
class Transpose32:
    """What names the transposing copy in the compiled-kernel memo and the disk cache."""
    target: str
    block_rows: int = BLOCK_ROWS


@dataclass(frozen=True)
class Split3:
    """What names the split of both operands into tf32 parts in the memo and the disk cache."""
    target: str
    a_transposed: bool   # A's source holds it MN-major (its rows run along K)
    b_transposed: bool   # B's likewise (B row-major: K x N)


@tg.kernel
def transpose32(BR=BLOCK_ROWS):
    """D = S^T for 32-bit elements: S is ROWS x COLS row-major, D is COLS x ROWS row-major."""
    BC = BLOCK_COLS
    tg.launch(threads=THREADS, grid=(tg.cdiv("COLS", BR) * tg.cdiv("ROWS", BC), 1, 1))
    S = tg.tensor("S", "f32", ("ROWS", "COLS"))
    D = tg.tensor("D", "f32", ("COLS", "ROWS"))
    tile = tg.shared("T", "f32", BR, BC, swizzle="128B", logical="row")
    rows, cols = D.shape
    blocks_c = tg.cdiv(cols, BC)
    pid = tg.program_id()
    r0, c0 = (pid // blocks_c) * BR, (pid % blocks_c) * BC
    tg.copy_async(tile[0], S.T.block(r0, c0))     # S.T: D's shape, column-major: the copy transposes
    tg.commit()
    tg.wait(0)
    tg.fence_proxy_async()                         # the generic-proxy writes, before TMA reads them
    tg.barrier()
    tg.tma_store(D.block(r0, c0), tile[0])
    tg.tma_store_commit()
    tg.tma_store_wait(0)                           # the tile stays until TMA has read it


def _split_block(S, D, seg, transposed: bool, parts: tuple, block):
    """Block `block` of one operand's split (split3): the parts of its BR x BK elements."""
    BR, BK = SPLIT_BLOCK
    blocks_k = tg.cdiv(S.shape[0] if transposed else S.shape[1], BK)
    r0, k0 = (block // blocks_k) * BR, (block % blocks_k) * BK
    warp = tg.warp_id()
    r0, k0 = r0 + (warp % 2) * (BR // 2), k0 + (warp // 2) * (BK // 2)
    # the warp's 32 x 32 elements, oriented as the source holds them: (r, k), or (k, r) transposed
    tiles = (BR // 2 // 16, BK // 2 // 8)
    x, lo, finite_hi = (tg.fragment(SPLIT_ATOM, "C", tiles, name=n) for n in ("x", "lo", "finite_hi"))
    tg.assign(x, -0.0)                             # -0.0 + v is v for every v (zeros keep their signs)
    tg.accumulate(x, S.block(k0, r0) if transposed else S.block(r0, k0))   # zeros past the edges
    tg.split_tf32(x, lo, finite_hi)                # x is now hi
    values = {"hi": x, "lo": lo, "finite_hi": finite_hi}
    for s, part in enumerate(parts):
        if transposed:
            tg.store(D.T.block(s * seg + k0, r0), values[part])
        else:
            tg.store(D.block(r0, s * seg + k0), values[part])


@tg.kernel
def split3(a_transposed=False, b_transposed=True):
    """Both f32 operands into their tf32 parts, in one launch: DA[r, s * SEG + k] = part s of
    A's element (r, k) (A_PARTS), DB[c, s * SEG + k] = part s of B's element (k, c) (B_PARTS).
    The first CTAs take A's ROWS_A x COLS (K) blocks, the rest B's ROWS_B x COLS. A source is
    ROWS x COLS row-major (K-major), or, transposed, COLS x ROWS row-major; each D is ROWS x
    DCOLS row-major, DCOLS = 3 SEG; SEG (a multiple of SPLIT_BLOCK[1], at least COLS) pads each
    segment with zeros."""
    BR, BK = SPLIT_BLOCK
    tg.launch(threads=THREADS, grid=(tg.cdiv("ROWS_A", BR) * tg.cdiv("COLS", BK) + tg.cdiv("ROWS_B", BR) * tg.cdiv("COLS", BK),
                                     1, 1))
    seg = tg.scalar("SEG", "u32")
    operands = []
    for name, transposed, parts in (("A", a_transposed, A_PARTS), ("B", b_transposed, B_PARTS)):
        rows = f"ROWS_{name}"
        S = tg.tensor(f"S{name}", "f32", ("COLS", rows) if transposed else (rows, "COLS"))
        D = tg.tensor(f"D{name}", "f32", (rows, "DCOLS"))
        operands.append((S, D, transposed, parts))
    pid = tg.program_id()
    a_blocks = tg.cdiv(tg.size("ROWS_A"), BR) * tg.cdiv(tg.size("COLS"), BK)
    with tg.if_(tg.lt(pid, a_blocks)):
        _split_block(*operands[0][:2], seg, *operands[0][2:], pid)
    with tg.else_():
        _split_block(*operands[1][:2], seg, *operands[1][2:], pid - a_blocks)


def transpose32_kernel(target: str, block_rows: int = BLOCK_ROWS):
    """The compiled transposing copy for `target` (sm_90a: it stores through TMA)."""
    return compiler.compile_spec(Transpose32(target, block_rows), lambda key: transpose32.trace(
        BR=key.block_rows, target=key.target, name=f"tilegen_transpose32_{key.block_rows}"))


def split3_kernel(target: str, a_transposed: bool, b_transposed: bool):
    """The compiled split of both f32 operands into their tf32 parts."""
    name = f"tilegen_split3_a{'mn' if a_transposed else 'k'}_b{'mn' if b_transposed else 'k'}"
    return compiler.compile_spec(Split3(target, a_transposed, b_transposed), lambda key: split3.trace(
        a_transposed=key.a_transposed, b_transposed=key.b_transposed, target=key.target, name=name))


@dataclass(frozen=True)
class Preparation:
    """One first kernel of a call: it writes the prepared copy of each of its `operands`
    (`nbytes` each, rows of `ld` elements); `sizes` are its size arguments in the order
    SIZE_NAMES[kind] gives, to which each operand's POINTER_NAMES[kind] follow (source pointer
    and pitch, destination pointer and pitch)."""
    operands: tuple      # ("A",), ("B",) or ("A", "B")
    kind: str            # "transpose" (one operand) or "split" (both)
    kernel: object
    sizes: tuple
    nbytes: tuple
    ld: tuple

    def arguments(self, sources: tuple, dests: tuple) -> dict:
        """The kernel's arguments by name (the general call paths): `sources` (pointer, pitch)
        and `dests` (pointer) of each operand, in `operands`' order."""
        values = [v for (ptr, ld), dst, d_ld in zip(sources, dests, self.ld) for v in (ptr, ld, dst, d_ld)]
        return {**dict(zip(SIZE_NAMES[self.kind], self.sizes)), **dict(zip(POINTER_NAMES[self.kind], values))}


SIZE_NAMES = {"transpose": ("ROWS", "COLS"), "split": ("ROWS_A", "ROWS_B", "COLS", "DCOLS", "SEG")}
POINTER_NAMES = {"transpose": ("S_ptr", "S_ld", "D_ptr", "D_ld"),
                 "split": ("SA_ptr", "SA_ld", "DA_ptr", "DA_ld", "SB_ptr", "SB_ld", "DB_ptr", "DB_ld")}


def _pitch(cols: int) -> int:
    return max(4, -(-cols // 4) * 4)   # rows of 16 bytes' multiples, as TMA reads them


def plan(spec, M: int, N: int, K: int) -> tuple:
    """(the first kernels of a call, the K the GEMM kernel then runs over). Both operands are
    stored K rows deep when MN-major (B row-major: K x N; A column-major: its transpose, K x M)
    and K columns wide when K-major."""
    preps = []
    if K == 0:   # (A @ B reads nothing: the GEMM's epilogue of a zero product, without copies)
        return (), K
    if spec.pretranspose:
        for op in spec.transposed_operands:
            cols = N if op == "B" else M
            preps.append(Preparation((op,), "transpose", transpose32_kernel(spec.target), (K, cols),
                                     (max(cols, 1) * _pitch(K) * 4,), (_pitch(K),)))
        return tuple(preps), K
    if spec.splits_operands:   # (both in one launch: a launch is most of a small product's host time)
        seg = -(-K // SPLIT_BLOCK[1]) * SPLIT_BLOCK[1]
        pitch = _pitch(3 * seg)
        kernel = split3_kernel(spec.target, spec.a_layout != "row", spec.b_layout != "col")
        return (Preparation(("A", "B"), "split", kernel, (M, N, K, 3 * seg, seg),
                            (max(M, 1) * pitch * 4, max(N, 1) * pitch * 4), (pitch, pitch)),), 3 * seg
    return (), K


def preparations(spec, args: dict) -> tuple:
    """plan() from the GEMM's arguments by name."""
    return plan(spec, int(args["M"]), int(args["N"]), int(args["K"]))


__all__ = ["Preparation", "plan", "preparations", "SIZE_NAMES", "POINTER_NAMES", "transpose32", "transpose32_kernel", "split3", "split3_kernel",
           "Transpose32", "Split3", "BLOCK_ROWS", "BLOCK_COLS", "SPLIT_BLOCK", "A_PARTS", "B_PARTS"]
