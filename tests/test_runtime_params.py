"""Kernel-argument packing and launch-shape checks: pure functions, no GPU."""
import ctypes
import struct

import numpy as np
import pytest

from tilegen.errors import LaunchError
from tilegen.runtime import check_launch_dims, describe_array, pack_arg, pack_args


class Buf:
    ptr = 0x7F0000001000


def raw(value) -> bytes:
    """The bytes cuda-bindings copies into the parameter slot."""
    return bytes(value) if not isinstance(value, int) else struct.pack("<Q", value)


def test_tuple_of_tuples_shape():
    values, types = pack_args([(Buf(), "ptr"), (5, "u32"), (-2, "s32"), (2**40, "u64"),
                               (1.5, "f32"), (0.1, "f64")])
    assert types == (ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int32, ctypes.c_uint64,
                     ctypes.c_float, ctypes.c_double)
    assert values[0] == 0x7F0000001000 and isinstance(values[0], int)
    assert [raw(v) for v in values[1:]] == [
        struct.pack("<I", 5), struct.pack("<i", -2), struct.pack("<Q", 2**40),
        struct.pack("<f", 1.5), struct.pack("<d", 0.1)]


def test_empty_args():
    assert pack_args([]) == ((), ())


@pytest.mark.parametrize("value", [np.uint64(0x1000), 0x1000, np.int64(0x1000)])
def test_pointer_values(value):
    assert pack_arg(value, "ptr") == (0x1000, ctypes.c_void_p)


def test_numpy_scalars_are_accepted():
    assert raw(pack_arg(np.int32(-7), "s32")[0]) == struct.pack("<i", -7)
    assert raw(pack_arg(np.float32(2.5), "f32")[0]) == struct.pack("<f", 2.5)
    assert raw(pack_arg(3, "f64")[0]) == struct.pack("<d", 3.0)


@pytest.mark.parametrize("value,kind,message", [
    (-1, "u32", r"-1 is out of range 0\.\.4294967295"),
    (2**32, "u32", "out of range"),
    (2**31, "s32", r"out of range -2147483648\.\.2147483647"),
    (-1, "u64", "out of range"),
    (1.0, "u32", "not an integer"),
    (True, "s32", "not an integer"),
    ("3", "f32", "not a real number"),
    (1e39, "f32", "overflows float32"),
    (None, "ptr", "not a device pointer"),
    ("0x10", "ptr", "not a device pointer"),
    (-8, "ptr", "out of range"),
    (1, "int", "kind 'int' is not one of ptr, u32, s32, u64, f32, f64"),
])
def test_bad_arguments(value, kind, message):
    with pytest.raises(LaunchError, match=message):
        pack_arg(value, kind, 3)


def test_bad_argument_names_its_position():
    with pytest.raises(LaunchError, match=r"kernel argument 1 \(u32\)"):
        pack_args([(1, "u32"), (-1, "u32")])
    with pytest.raises(LaunchError, match="kernel argument 0: expected a \\(value, kind\\) pair"):
        pack_args([5])


def test_host_operand_is_not_a_device_pointer():
    view = describe_array(np.zeros((4, 4), np.float32), name="A", dtype="f32")
    with pytest.raises(LaunchError, match="A is a host array; copy it to the GPU first"):
        pack_arg(view, "ptr")


def test_launch_dims_normalised():
    assert check_launch_dims(4, (128,)) == ((4, 1, 1), (128, 1, 1))
    assert check_launch_dims((2**31 - 1, 65535, 65535), (32, 8, 4)) == (
        (2**31 - 1, 65535, 65535), (32, 8, 4))


@pytest.mark.parametrize("grid,block,message", [
    ((0, 1, 1), 32, r"grid\.x = 0 is out of range 1\.\.2147483647"),
    ((1, 65536), 32, r"grid\.y = 65536 is out of range 1\.\.65535"),
    (1, (1025,), r"block\.x = 1025"),
    (1, (1, 1, 65), r"block\.z = 65 is out of range 1\.\.64"),
    (1, (32, 32, 2), "2048 threads; at most 1024"),
    ((1, 2, 3, 4), 32, "tuple of 1 to 3"),
    ((1.5,), 32, r"grid\.x = 1\.5 is not an int"),
])
def test_bad_launch_dims(grid, block, message):
    with pytest.raises(LaunchError, match=message):
        check_launch_dims(grid, block)


@pytest.mark.parametrize("value", ["16", 16.0, b"\x10"])
def test_pointer_must_be_an_address(value):
    with pytest.raises(LaunchError, match="not a device pointer"):
        pack_arg(value, "ptr")


# -- the cuLaunchKernelEx buffer: parameters and CUlaunchConfig packed in one write ----------

def _bindings_config(grid, block, smem, stream, cluster):
    """The bytes of cuda.bindings' own CUlaunchConfig (and cluster attribute) for these values."""
    d = pytest.importorskip("cuda.bindings.driver")
    c = d.CUlaunchConfig()
    c.gridDimX, c.gridDimY, c.gridDimZ = grid
    c.blockDimX, c.blockDimY, c.blockDimZ = block
    c.sharedMemBytes, c.hStream = smem, d.CUstream(stream)
    attr = b""
    if cluster:
        a = d.CUlaunchAttribute()
        a.id = d.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        a.value.clusterDim.x, a.value.clusterDim.y, a.value.clusterDim.z = cluster
        c.attrs, c.numAttrs = [a], 1
        attr = ctypes.string_at(a.getPtr(), 72)
    return ctypes.string_at(c.getPtr(), 56), attr


@pytest.mark.parametrize("cluster", [None, (2, 1, 1)])
def test_launch_config_matches_the_drivers_struct(cluster):
    from tilegen.runtime import ParamBuffer
    kinds = ["u32", "ptr", "f32", "tensormap", "s32"]
    buf = ParamBuffer(kinds, (384, 1, 1), 200_000, cluster, config=True)
    values = [7, 0x7F0000001000, 1.5, bytes(range(128)), -3]
    buf.pack_launch((132, 3, 1), values, 0xABCD)
    raw = ctypes.string_at(ctypes.addressof(buf.storage), len(buf.storage))
    config, attr = _bindings_config((132, 3, 1), (384, 1, 1), 200_000, 0xABCD, cluster)
    mine = raw[buf.config_offset:buf.config_offset + 56]
    assert mine[:40] == config[:40]  # grid, block, shared bytes, stream
    attrs_at, count = struct.unpack_from("<QI", mine, 40)
    assert count == (1 if cluster else 0) and count == struct.unpack_from("<I", config, 48)[0]
    if cluster:
        base = ctypes.addressof(buf.storage)
        assert ctypes.string_at(attrs_at, 72) == attr and base <= attrs_at < base + len(buf.storage)
    # each kernel parameter sits where the pointer array says, with its value's bytes
    ptrs = [buf.pointers[i] for i in range(len(kinds))]
    expect = [struct.pack("<I", 7), struct.pack("<Q", 0x7F0000001000), struct.pack("<f", 1.5), bytes(range(128)),
              struct.pack("<i", -3)]
    assert [ctypes.string_at(p, len(e)) for p, e in zip(ptrs, expect)] == expect
    # (the driver copies each parameter by its offset in the kernel's .param list, so these
    # host copies need no particular alignment)


def test_launch_config_rewrites_only_the_per_call_fields():
    from tilegen.runtime import ParamBuffer
    buf = ParamBuffer(["u32"], (128, 1, 1), 0, (2, 1, 1), config=True)
    before = ctypes.string_at(ctypes.addressof(buf.storage) + buf.config_offset + 40, 12)
    buf.pack_launch((5, 1, 1), [1], 0)
    buf.pack_launch((9, 2, 1), [2], 77)
    raw = ctypes.string_at(ctypes.addressof(buf.storage), len(buf.storage))
    assert struct.unpack_from("<3I", raw, buf.config_offset) == (9, 2, 1)
    assert struct.unpack_from("<Q", raw, buf.config_offset + 32) == (77,)
    assert raw[buf.config_offset + 40:buf.config_offset + 52] == before  # the attribute array stays


def test_launch_config_bad_values_say_what_is_wrong():
    from tilegen.runtime import ParamBuffer
    buf = ParamBuffer(["u32", "ptr"], (128, 1, 1), 0, config=True)
    with pytest.raises(LaunchError, match="argument 0"):
        buf.pack_launch((1, 1, 1), [-1, 0], 0)
    with pytest.raises(LaunchError, match="takes 2 arguments"):
        buf.pack_launch((1, 1, 1), [1], 0)
    with pytest.raises(LaunchError, match="grid"):
        buf.pack_launch((2**32, 1, 1), [1, 0], 0)
