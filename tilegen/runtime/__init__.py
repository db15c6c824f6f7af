"""Loading generated PTX and running it on the GPU through cuda-python.

Importing this package needs neither cuda-python nor a GPU: the driver is imported when a
function first needs it, and its absence is reported as a DeviceError naming the CPU
emulator (device="sim").

| module     | what                                                                      |
| ---------- | ------------------------------------------------------------------------- |
| driver     | cuInit, the primary context per device, device attributes (read once);    |
|            | libcuda through ctypes, whether a stream is capturing a graph             |
| module     | PTX -> CUDA module (JIT or linked cubin), Function, stream handles        |
| cubins     | linked cubins in the disk store                                           |
| params     | kernel arguments checked and packed; launch dimensions                    |
| launch     | Launcher: a prepared launch (parameter buffer + one driver call)          |
| replay     | the "graph" route: a launch repeated with the same values as a CUDA graph |
| tensormap  | TMA tensor maps (cuTensorMapEncodeTiled), built per launch and cached     |
| memory     | device buffers, stream-ordered buffers, streams, events, 2-D copies       |
| arrays     | any array (numpy, __cuda_array_interface__, DLPack) described and checked |
| interop    | PyTorch / CuPy arrays on the hot path: probe, current stream, allocator   |
| dlpack     | DLPack capsules read with ctypes                                          |
"""
from .driver import DeviceInfo, capturing, check, device_info, ensure_context, forget_current, gpu_available
from .params import ARG_KINDS, check_launch_dims, pack_arg, pack_args
from .module import Function, clear_module_cache, jit_error_line, load_module, precompile, stream_handle
from .launch import Launcher, ParamBuffer, cluster_capacity, launch_route
from .tensormap import fill_tensor_maps, tensor_map_bytes
from .memory import (DeviceBuffer, Event, HostCallBuffers, Stream, StreamBuffer, StreamScratch, copy_2d, elapsed_ms,
                     free_scratch, stream_key, synchronize, zero_async)
from .arrays import (OperandView, StackView, check_host, check_writable, describe_array, describe_scalar, describe_stack,
                     describe_vector, detect_layout, pitched_copy, refuse_masked)

__all__ = [
    "DeviceInfo", "check", "device_info", "ensure_context", "forget_current", "gpu_available",
    "ARG_KINDS", "check_launch_dims", "pack_arg", "pack_args",
    "Function", "clear_module_cache", "jit_error_line", "load_module", "precompile", "stream_handle",
    "Launcher", "ParamBuffer", "cluster_capacity", "launch_route", "fill_tensor_maps", "tensor_map_bytes",
    "DeviceBuffer", "Event", "HostCallBuffers", "Stream", "StreamBuffer", "StreamScratch", "capturing", "free_scratch", "stream_key", "zero_async", "copy_2d", "elapsed_ms", "synchronize",
    "OperandView", "StackView", "describe_array", "describe_scalar", "describe_stack", "describe_vector", "detect_layout",
    "check_host", "check_writable", "pitched_copy", "refuse_masked",
]
