"""tilegen: a Python kernel DSL that generates PTX for tensor-core GEMMs."""
from .compiler import Kernel
from .dsl import kernel
from .errors import (DeviceError, DSLError, EmulatorWarning, HazardError, IRError, LaunchError, PerformanceWarning,
                     PrecisionWarning, SpecError, TilegenError)
from .frontend import compile
from .gemm import (Epilogue, GemmKernel, GemmSpec, SpecSyntaxError, TileShape, WarpLayout, free_scratch, matmul,
                   matmul_fused)
from .version import __version__

__all__ = [
    "compile", "kernel", "Kernel", "GemmKernel", "matmul", "matmul_fused", "SpecSyntaxError", "GemmSpec",
    "TileShape", "WarpLayout", "Epilogue", "SpecError", "TilegenError", "LaunchError", "DeviceError", "DSLError",
    "IRError", "HazardError", "EmulatorWarning", "PerformanceWarning", "PrecisionWarning", "free_scratch", "__version__",
]
