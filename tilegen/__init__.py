"""tilegen: a Python kernel DSL that generates PTX for tensor-core GEMMs."""
from .compiler import compile
from .dsl import kernel
from .errors import DeviceError, DSLError, IRError, LaunchError, SpecError, TilegenError
from .kernel import Kernel
from .spec import Epilogue, GemmSpec, TileShape, WarpLayout

__version__ = "0.1.0"

__all__ = [
    "compile", "kernel", "Kernel", "GemmSpec", "TileShape", "WarpLayout", "Epilogue", "SpecError",
    "TilegenError", "LaunchError", "DeviceError", "DSLError", "IRError", "__version__",
]
