"""A K-major copy of a 32-bit MN-major operand, made before the GEMM.

wgmma reads tf32 operands from shared memory only K-major (ptx.md 6.3), so a row-major B
(or a column-major A) cannot go through TMA into the stages the tensor cores read. Moving
it through the GEMM's own copies (4-byte transposing cp.async, or registers as C^T's A
operand) keeps the kernel 20% behind the K-major one (docs/perf_notes.md sections 14, 15,
31). For large products it is cheaper to transpose the operand once, at memory speed, into a
stream-ordered workspace and run the K-major kernel on it: the copy costs 2 x 4 bytes per
element of the operand against 2 M flops per element of the product.

The kernel: each CTA copies one block of the source into a 128B-swizzled shared tile laid
out as the destination's rows (the copy transposes, one 4-byte cp.async per element; zeros
past the edges), then one thread writes the tile with a TMA store (which clips at the
edges). The bits are moved, not converted: NaN payloads and signed zeros survive.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import compiler
from .. import dsl as tg

# the destination's block per CTA: BLOCK_ROWS x 32 columns (one 128-byte swizzle span). 32 rows ran
# 3.2-3.5 TB/s on the H200 at 4096^2 and 8192^2 (memcpy 3.6-4.1), 64: 3.0-3.3, 128: 2.6-2.7
BLOCK_ROWS = 32
BLOCK_COLS = 32
THREADS = 128


@dataclass(frozen=True)
class Transpose32:
    """What names the transposing copy in the compiled-kernel memo and the disk cache."""
    target: str
    block_rows: int = BLOCK_ROWS


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


def transpose32_kernel(target: str, block_rows: int = BLOCK_ROWS):
    """The compiled transposing copy for `target` (sm_90a: it stores through TMA)."""
    return compiler.compile_spec(Transpose32(target, block_rows), lambda key: transpose32.trace(
        BR=key.block_rows, target=key.target, name=f"tilegen_transpose32_{key.block_rows}"))


def kmajor_copies(spec, args: dict) -> list:
    """What a pretranspose spec's first kernels do, from the GEMM's arguments by name: for each
    MN-major operand, (its name "A" / "B", the transposing copy's arguments but D_ptr, the
    copy's bytes). Both operands are stored K rows deep (B row-major: K x N; A column-major:
    its transpose, K x M); each copy is cols x K, rows padded to 16 bytes for TMA."""
    K = int(args["K"])
    ld = max(4, -(-K // 4) * 4)
    copies = []
    for op in spec.transposed_operands:
        cols = int(args["M"] if op == "A" else args["N"])
        copies.append((op, {"ROWS": K, "COLS": cols, "S_ptr": args[f"{op}_ptr"], "S_ld": args[f"{op}_ld"], "D_ld": ld},
                       cols * ld * 4))
    return copies


__all__ = ["kmajor_copies", "BLOCK_ROWS", "BLOCK_COLS", "Transpose32", "transpose32", "transpose32_kernel"]
