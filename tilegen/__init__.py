"""tilegen: a Python kernel DSL that generates PTX for tensor-core GEMMs."""
from .errors import DeviceError, DSLError, IRError, LaunchError, SpecError, TilegenError
from .spec import Epilogue, GemmSpec, TileShape, WarpLayout

__version__ = "0.1.0"

__all__ = [
    "GemmSpec", "TileShape", "WarpLayout", "Epilogue", "SpecError", "TilegenError",
    "LaunchError", "DeviceError", "DSLError", "IRError", "__version__",
]
