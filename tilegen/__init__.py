"""tilegen: a Python kernel DSL that generates PTX for tensor-core GEMMs."""
from .compiler import compile
from .dsl import kernel
from .errors import DeviceError, DSLError, IRError, LaunchError, SpecError, TilegenError
from .kernel import Kernel
from .matmul import matmul, matmul_fused
from .spec import Epilogue, GemmSpec, TileShape, WarpLayout
from .textspec import SpecSyntaxError

__version__ = "0.1.0"

__all__ = [
    "compile", "kernel", "Kernel", "matmul", "matmul_fused", "SpecSyntaxError", "GemmSpec", "TileShape", "WarpLayout", "Epilogue", "SpecError",
    "TilegenError", "LaunchError", "DeviceError", "DSLError", "IRError", "__version__",
]
