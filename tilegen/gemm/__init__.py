"""The GEMM: its spec, its text form, its template and main loops, calling it on arrays,
and the front door that picks a spec (tilegen.matmul).

| module       | what                                                                   |
| ------------ | ---------------------------------------------------------------------- |
| spec         | GemmSpec, Epilogue: fields, defaults, validation; .tg text of a spec   |
| textspec     | the .tg format (lark grammar textspec.lark) for any spec dataclass     |
| layouts      | which shared-memory layout each operand's stages take                  |
| mainloops/   | one module per main-loop family (mma.sync, wgmma), in one registry     |
| template     | the GEMM kernel in the DSL: operands, block order, main loop, epilogue |
| epilogue     | the fused store: act(alpha * acc + beta * C + bias) + residual         |
| kernel       | GemmKernel (a Kernel callable on arrays) and compile_gemm              |
| call         | operands checked and placed; the fast path for PyTorch / CuPy arrays   |
| tuned        | the tuned-config store (written by tilegen.tune)                       |
| matmul       | tilegen.matmul: the spec for given arrays, and why (explain)           |
| batch        | stacks and vectors as numpy.matmul takes them: fold, batch or loop     |
"""
from ..runtime import free_scratch   # (the memory kept per stream for split-K and prepared operands)
from .kernel import GemmKernel, compile_gemm
from .matmul import explain, matmul, matmul_fused
from .spec import Epilogue, GemmSpec, TileShape, WarpLayout, parse_spec_text, spec_to_text
from .template import gemm_kernel_name, trace_gemm
from .textspec import SpecFileError, SpecSyntaxError

__all__ = ["free_scratch", "GemmSpec", "Epilogue", "TileShape", "WarpLayout", "GemmKernel", "compile_gemm", "matmul",
           "matmul_fused", "explain", "parse_spec_text", "spec_to_text", "gemm_kernel_name", "trace_gemm",
           "SpecSyntaxError", "SpecFileError"]
