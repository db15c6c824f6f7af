"""copy_2d's CUDA_MEMCPY2D through ctypes (runtime/memory.py) has the bytes of cuda-python's own
struct for the same fields: the driver reads the copy's pointers, pitches and extent where it should."""
import ctypes

import pytest

from tilegen.runtime.memory import MEMORYTYPE_DEVICE, _Memcpy2D

driver = pytest.importorskip("cuda.bindings.driver")


def test_the_ctypes_struct_is_the_drivers_layout():
    fields = dict(srcXInBytes=3, srcY=5, srcDevice=0x7F00_1234_5670, srcPitch=160, dstXInBytes=11, dstY=13,
                  dstDevice=0x7F00_8765_4320, dstPitch=176, WidthInBytes=154, Height=4928)
    theirs = driver.CUDA_MEMCPY2D()
    for name, value in fields.items():
        setattr(theirs, name, value)
    theirs.srcMemoryType = theirs.dstMemoryType = driver.CUmemorytype.CU_MEMORYTYPE_DEVICE
    ours = _Memcpy2D(srcMemoryType=MEMORYTYPE_DEVICE, dstMemoryType=MEMORYTYPE_DEVICE, **fields)
    assert ctypes.sizeof(ours) == 128
    assert bytes(ours) == ctypes.string_at(theirs.getPtr(), ctypes.sizeof(ours))
