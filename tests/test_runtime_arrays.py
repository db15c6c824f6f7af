"""describe_array / detect_layout: what is accepted, and the message for what is not.
Device arrays are stood in for by objects exposing __cuda_array_interface__ or DLPack."""
import ctypes
import types

import ml_dtypes
import numpy as np
import pytest

from tilegen.errors import LaunchError
from tilegen.runtime import describe_array, detect_layout
from tilegen.runtime import dlpack as dl

BASE = 0x7F0000000000  # a 256-byte aligned "device" address


class FakeCAI:
    def __init__(self, shape, typestr="<f2", strides=None, ptr=BASE, readonly=False,
                 device=None, **extra):
        self.__cuda_array_interface__ = dict(shape=shape, typestr=typestr, data=(ptr, readonly),
                                             strides=strides, version=3, **extra)
        if device is not None:
            self.device = types.SimpleNamespace(id=device)  # like cupy.cuda.Device


_new_capsule = ctypes.pythonapi.PyCapsule_New
_new_capsule.restype = ctypes.py_object
_new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
LEGACY, VERSIONED = b"dltensor", b"dltensor_versioned"


class FakeDLPack:
    """A DLPack producer whose tensor lives wherever `device` says."""

    def __init__(self, shape, strides, code=2, bits=16, ptr=BASE, device=(2, 0),
                 versioned=False, readonly=False):
        self._shape = (ctypes.c_int64 * 2)(*shape)
        self._strides = None if strides is None else (ctypes.c_int64 * 2)(*strides)
        t = dl.DLTensor(data=ptr, device=dl.DLDevice(*device), ndim=2,
                        dtype=dl.DLDataType(code, bits, 1),
                        shape=ctypes.cast(self._shape, ctypes.POINTER(ctypes.c_int64)),
                        strides=(ctypes.cast(self._strides, ctypes.POINTER(ctypes.c_int64))
                                 if strides is not None else None), byte_offset=0)
        if versioned:
            self._m = dl.DLManagedTensorVersioned(version=dl.DLPackVersion(1, 0),
                                                  flags=dl.READ_ONLY_FLAG if readonly else 0,
                                                  dl_tensor=t)
        else:
            self._m = dl.DLManagedTensor(dl_tensor=t)
        self._name, self._device = (VERSIONED if versioned else LEGACY), device

    def __dlpack_device__(self):
        return self._device

    def __dlpack__(self, **kwargs):
        return _new_capsule(ctypes.addressof(self._m), self._name, None)


def reject(x, match, **kw):
    kw.setdefault("name", "A")
    kw.setdefault("dtype", "f16")
    with pytest.raises(LaunchError, match=match) as e:
        describe_array(x, **kw)
    return str(e.value)


# ---- numpy ---------------------------------------------------------------------------

def test_row_major_numpy():
    a = np.zeros((64, 32), np.float16)
    v = describe_array(a, name="A", dtype="f16", shape=(64, 32), layout="row", align=16)
    assert (v.rows, v.cols, v.ld, v.layout, v.ptr) == (64, 32, 32, "row", a.ctypes.data)
    assert v.needs_copy and v.device is None and v.host is a and v.nbytes == a.nbytes
    assert v.dtype == np.float16 and v.itemsize == 2


def test_col_major_numpy_and_strided_view():
    a = np.asfortranarray(np.zeros((64, 32), np.float32))
    v = describe_array(a, name="B", dtype="tf32", layout="col")
    assert (v.rows, v.cols, v.ld, v.layout) == (64, 32, 64, "col")
    w = np.zeros((16, 40), np.float16)[:, 4:36]  # ld 40 > 32 columns, base 8 bytes in
    v = describe_array(w, name="A", dtype="f16", layout="row", align=16)
    assert (v.ld, v.nbytes, v.ptr) == (40, (15 * 40 + 32) * 2, w.ctypes.data)


def test_layout_is_detected_when_not_required():
    a = np.zeros((8, 16), np.float16)
    assert describe_array(a, name="A", dtype="f16").layout == "row"
    assert describe_array(a.T, name="A", dtype="f16").layout == "col"


@pytest.mark.parametrize("x,dtype", [
    (np.zeros((4, 8), ml_dtypes.bfloat16), "bf16"),
    (np.zeros((4, 8), ml_dtypes.float8_e4m3fn), "e4m3"),
    (np.zeros((4, 8), ml_dtypes.float8_e5m2), "e5m2"),
    (np.zeros((4, 8), np.float32), "tf32"),
    (np.zeros((4, 8), np.float32), np.float32),
])
def test_accepted_dtypes(x, dtype):
    assert describe_array(x, name="A", dtype=dtype).dtype == x.dtype


def test_wrong_dtype_message():
    msg = reject(np.zeros((4, 8)), r"^A has dtype float64; this kernel takes float16 \(f16\)")
    assert "A.astype(np.float16)" in msg
    msg = reject(np.zeros((4, 8), np.float16), "takes bfloat16 \\(bf16\\)", dtype="bf16")
    assert "ml_dtypes.bfloat16" in msg
    reject(np.zeros((4, 8), np.float16), "takes float8_e4m3fn \\(e4m3\\)", dtype="e4m3")


def test_wrong_rank_and_shape():
    reject(np.zeros(8, np.float16), r"must be a 2-D matrix; got a 1-D array of shape \(8,\)")
    reject(np.zeros((2, 3, 4), np.float16), "3-D array of shape \\(2, 3, 4\\)")
    reject(np.zeros((64, 32), np.float16), r"A has shape \(64, 32\); this kernel expects "
           r"\(M, K\) = \(64, 128\)", shape=(64, 128), dims=("M", "K"))
    reject(np.zeros((64, 32), np.float16), r"expects \(any, 16\)", shape=(None, 16))
    describe_array(np.zeros((64, 32), np.float16), name="A", dtype="f16", shape=(None, 32))
    reject(np.zeros((0, 32), np.float16), r"A is empty \(shape \(0, 32\)\)")


def test_wrong_layout_messages():
    a = np.zeros((8, 16), np.float16)
    msg = reject(np.asfortranarray(a), "^A is column-major .* this kernel takes A row-major",
                 layout="row")
    assert "np.ascontiguousarray(A)" in msg and "strides (1, 8) elements" in msg
    msg = reject(a, "^A is row-major .* takes A column-major", layout="col")
    assert "np.asfortranarray(A)" in msg and "At.T" in msg
    with pytest.raises(LaunchError, match="layout='diag'; allowed: 'row', 'col'"):
        describe_array(a, name="A", dtype="f16", layout="diag")


def test_bad_strides():
    a = np.zeros((8, 16), np.float16)
    reject(a[:, ::2], r"no dimension with stride 1 element \(strides \(16, 2\) elements\)")
    reject(a[::-1], "negative stride in dim 0")
    reject(np.broadcast_to(np.float16(1), (8, 16)), "stride 0 in dim 0 \\(a broadcast view\\)")
    reject(FakeCAI((4, 4), typestr="<f4", strides=(18, 4)), "stride 18 bytes in dim 0, not a "
           "multiple of its 4-byte elements", dtype="f32")


def test_rows_may_not_overlap():
    reject(FakeCAI((4, 8), strides=(8, 2)), r"rows overlap \(row stride 4 < 8 columns\)")


def test_extent_one_dims_fit_either_layout():
    row = np.zeros((1, 8), np.float16)
    for layout in ("row", "col"):
        v = describe_array(row, name="x", dtype="f16", layout=layout)
        assert v.layout == layout
    assert describe_array(row, name="x", dtype="f16", layout="row").ld == 8
    assert describe_array(row, name="x", dtype="f16", layout="col").ld == 1


def test_alignment():
    a = np.zeros((8, 36), np.float16)[:, :30]  # 72-byte rows
    msg = reject(a, r"leading dimension is 36 elements \(72 bytes\), not a multiple of 16 bytes",
                 align=16)
    assert "multiple of 8 elements" in msg
    describe_array(a, name="A", dtype="f16")  # fine without the requirement
    reject(FakeCAI((8, 64), ptr=BASE + 8), "base address 0x7f0000000008 is not 16-byte aligned",
           align=16)
    describe_array(FakeCAI((8, 64), ptr=BASE + 16), name="A", dtype="f16", align=16)
    host = np.zeros(8 * 64 + 4, np.float16)[4:].reshape(8, 64)  # host base needs no alignment
    describe_array(host, name="A", dtype="f16", align=16)


def test_read_only_output():
    a = np.zeros((4, 8), np.float32)
    a.flags.writeable = False
    describe_array(a, name="C", dtype="f32")
    reject(a, "^C is read-only, but the kernel writes it", name="C", dtype="f32", writable=True)
    reject(FakeCAI((4, 8), "<f4", readonly=True), "C is read-only", name="C", dtype="f32",
           writable=True)


def test_not_an_array():
    reject([[1.0, 2.0]], "A is a list; pass a numpy array, or a GPU array exposing "
           "__cuda_array_interface__ or DLPack")


# ---- __cuda_array_interface__ --------------------------------------------------------

def test_cuda_array_interface_in_place():
    x = FakeCAI((64, 32), device=0, stream=7)
    v = describe_array(x, name="A", dtype="f16", layout="row", align=16)
    assert (v.ptr, v.ld, v.layout, v.device, v.needs_copy, v.stream) == (BASE, 32, "row", 0, False, 7)
    assert v.host is None and v.keepalive is x
    t = FakeCAI((64, 32), strides=(2, 128))  # column-major, ld 64
    v = describe_array(t, name="A", dtype="f16", layout="col")
    assert (v.ld, v.nbytes) == (64, 64 * 32 * 2)


def test_cuda_array_interface_refusals():
    reject(FakeCAI((4, 8), device=1), "^A is on GPU 1; this kernel runs on GPU 0")
    describe_array(FakeCAI((4, 8), device=1), name="A", dtype="f16", device=1)
    reject(FakeCAI((4, 8), "<f4"), "A has dtype float32; this kernel takes float16")
    msg = reject(FakeCAI((4, 8), "<V2"), "this kernel takes bfloat16 \\(bf16\\)", dtype="bf16")
    assert "DLPack" in msg
    reject(FakeCAI((4, 8), mask=object()), "masked array")


# ---- DLPack --------------------------------------------------------------------------

def test_read_numpy_capsule():
    a = np.zeros((6, 10), np.float16)[:, 2:]
    info = dl.read_capsule(dl.export_capsule(a))
    assert (info.ptr, info.shape, info.strides, info.dtype) == (a.ctypes.data, (6, 8), (10, 1), "float16")
    assert (info.device_type, info.readonly) == (dl.KDL_CPU, False)
    b = np.zeros((2, 3), np.float32)
    b.flags.writeable = False
    assert dl.read_capsule(dl.export_capsule(b)).readonly


def test_dlpack_cuda_in_place():
    x = FakeDLPack((16, 32), (32, 1))
    v = describe_array(x, name="A", dtype="f16", layout="row", align=16)
    assert (v.ptr, v.ld, v.device, v.needs_copy) == (BASE, 32, 0, False)
    y = FakeDLPack((16, 32), None, versioned=True)  # no strides: compact row-major
    assert describe_array(y, name="A", dtype="f16").ld == 32
    z = FakeDLPack((16, 32), (1, 16))
    assert describe_array(z, name="A", dtype="f16").layout == "col"


@pytest.mark.parametrize("code,bits,dtype", [(4, 16, "bf16"), (10, 8, "e4m3"), (12, 8, "e5m2"),
                                             (2, 32, "tf32")])
def test_dlpack_dtypes(code, bits, dtype):
    describe_array(FakeDLPack((4, 8), None, code=code, bits=bits), name="A", dtype=dtype)


def test_dlpack_refusals():
    reject(FakeDLPack((4, 8), None, device=(2, 1)), "A is on GPU 1")
    reject(FakeDLPack((4, 8), None, device=(10, 0)), "A lives on ROCm \\(DLPack device type 10\\)")
    reject(FakeDLPack((4, 8), None, versioned=True, readonly=True), "read-only", writable=True)
    reject(FakeDLPack((4, 8), None, code=2, bits=64), "A has dtype float64")
    reject(FakeDLPack((4, 8), None, code=17, bits=4), "A has dtype code17/4bits")


def test_dlpack_cpu_becomes_host_numpy():
    a = np.arange(32, dtype=np.float16).reshape(4, 8)

    class CpuTensor:  # a CPU DLPack producer that is not a numpy array
        def __dlpack__(self, **kw):
            return a.__dlpack__(**kw)

        def __dlpack_device__(self):
            return a.__dlpack_device__()

    v = describe_array(CpuTensor(), name="A", dtype="f16")
    assert v.needs_copy and v.ptr == a.ctypes.data and np.array_equal(v.host, a)


# ---- detect_layout -------------------------------------------------------------------

def test_detect_layout():
    a = np.zeros((4, 8), np.float16)
    assert detect_layout(a) == "row"
    assert detect_layout(a.T) == "col"
    assert detect_layout(np.asfortranarray(a)) == "col"
    assert detect_layout(a[:, ::2]) is None
    assert detect_layout(np.zeros((2, 2, 2))) is None
    assert detect_layout(FakeCAI((4, 8), strides=(2, 8))) == "col"
    assert detect_layout(FakeDLPack((4, 8), (8, 1))) == "row"


def test_dlpack_export_failure_is_a_launch_error():
    class Refuses(FakeDLPack):
        def __dlpack__(self, **kwargs):
            raise RuntimeError("Can't export tensors that require gradient")

    reject(Refuses((4, 8), None), "A: DLPack export failed: Can't export tensors that require")
