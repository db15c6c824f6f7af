"""Loading generated PTX and running it on the GPU through cuda-python.

Importing this package needs neither cuda-python nor a GPU: the driver is imported when a
function first needs it, and its absence is reported as a DeviceError naming the CPU
emulator (device="sim").
"""
from .driver import DeviceInfo, check, device_info, ensure_context, gpu_available
from .params import ARG_KINDS, check_launch_dims, pack_arg, pack_args
from .module import Function, clear_module_cache, jit_error_line, load_module
from .memory import DeviceBuffer, Event, Stream, elapsed_ms, synchronize
from .arrays import OperandView, describe_array, detect_layout

__all__ = [
    "DeviceInfo", "check", "device_info", "ensure_context", "gpu_available",
    "ARG_KINDS", "check_launch_dims", "pack_arg", "pack_args",
    "Function", "clear_module_cache", "jit_error_line", "load_module",
    "DeviceBuffer", "Event", "Stream", "elapsed_ms", "synchronize",
    "OperandView", "describe_array", "detect_layout",
]
