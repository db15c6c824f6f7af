"""Kernels written in the tilegen DSL."""
from .gemm import gemm, gemm_kernel_name

__all__ = ["gemm", "gemm_kernel_name"]
