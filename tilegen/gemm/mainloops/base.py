"""The interface of a GEMM main-loop family (see tilegen/gemm/mainloops/__init__.py)."""
from __future__ import annotations

from typing import Optional


class MainLoop:
    """The interface each family implements (the defaults below are mma.sync-like)."""

    instruction: str = ""
    kernel_tag: str = ""          # in kernel names: tilegen_gemm{tag}_...
    default_stages: int = 3
    persistent: bool = False      # whether its kernels may walk several blocks per CTA
    copies: tuple = ("cp.async",)  # how its k-tiles may reach shared memory (GemmSpec.copy)
    stores: tuple = ("direct",)    # how its blocks of C may reach global memory (GemmSpec.store)
    clusters: bool = False         # whether its warp-specialized kernels run in 2-CTA clusters (GemmSpec.cluster)

    def default_target(self, dtype: str) -> str:
        raise NotImplementedError

    def default_tile_warps(self, dtype: str, b_layout: str, swap_ab: bool = False) -> tuple:
        """(tile, warps) of a spec that gives neither."""
        raise NotImplementedError

    def default_stage_count(self, dtype: str) -> int:
        """GemmSpec.stages of a spec that gives none (GemmSpec takes default_stages instead where
        a deeper count's pipeline does not fit the target's shared memory)."""
        return self.default_stages

    def default_frag_buffers(self, dtype: str) -> int:
        return 1

    def default_persistent(self, spec) -> bool:
        """GemmSpec.persistent of a spec that leaves it at None."""
        return False

    def default_store(self, spec) -> str:
        """GemmSpec.store of a spec that leaves it at auto."""
        return self.stores[0]

    def default_copy(self, spec) -> str:
        """GemmSpec.copy of a spec that leaves it at auto."""
        return self.copies[0]

    def validate(self, spec) -> None:
        """Raise SpecError for a spec this family cannot build (the common rules are GemmSpec's)."""

    def swaps_operands(self, spec) -> bool:
        """Whether the kernel computes C^T = B^T A^T."""
        return False

    def register_operand(self, spec) -> Optional[str]:
        """The operand ("A", "B") loaded into registers for the tensor cores, or None."""
        return None

    def stage_layout(self, spec, operand: str) -> str:
        """Memory order ("row", "col") of an operand's shared stages."""
        return spec.a_layout if operand == "A" else spec.b_layout

    def tf32_truncates(self, spec) -> bool:
        """Whether the tensor cores truncate tf32 operands (instead of rounding them)."""
        return False

    def producer_warps(self, spec) -> int:
        """Warps of a producer role ahead of the math warps (warp-specialized kernels), or 0."""
        return 0

    def pipeline(self, spec, A, B, sA, sB, warp, wm, wn):
        """The DSL object with prologue(m0, n0) and k_loop(m0, n0) -> accumulator."""
        raise NotImplementedError


__all__ = ["MainLoop"]
