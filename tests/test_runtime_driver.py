"""The driver layer without a GPU: imports, plain 'no GPU' errors, result checking."""
import os
import subprocess
import sys

import pytest

import tilegen.runtime as rt
from tilegen.errors import DeviceError
from tilegen.runtime import driver as drv

NVIDIA_DEVICE = os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/nvidia0")


class FakeResult(int):
    @property
    def name(self):
        return {0: "CUDA_SUCCESS", 100: "CUDA_ERROR_NO_DEVICE", 3: "CUDA_ERROR_NOT_INITIALIZED",
                218: "CUDA_ERROR_INVALID_PTX"}.get(int(self), f"E{int(self)}")


class FakeDriver:
    """Just enough of cuda.bindings.driver to drive cuInit / device queries."""
    CUresult = FakeResult

    def __init__(self, init=0, count=1):
        self.init, self.count, self.calls = init, count, []

    def cuInit(self, flags):
        return (FakeResult(self.init),)

    def cuDeviceGetCount(self):
        return (FakeResult(0), self.count)

    def cuGetErrorName(self, err):
        return (FakeResult(0), err.name.encode())

    def cuGetErrorString(self, err):
        return (FakeResult(0), b"described")


@pytest.fixture
def fake(monkeypatch):
    def install(**kw):
        d = FakeDriver(**kw)
        monkeypatch.setattr(drv, "bindings", lambda: d)
        monkeypatch.setattr(drv, "_contexts", {})
        monkeypatch.setattr(drv, "_available", {})   # probed once per process: probe the fake
        monkeypatch.setattr(drv, "_infos", {})
        drv.forget_current()
        return d
    return install


def test_import_without_cuda_python():
    code = ("import sys; sys.modules['cuda'] = None\n"
            "import tilegen.runtime as rt\n"
            "assert rt.gpu_available() is False\n"
            "try:\n    rt.ensure_context()\nexcept rt.driver.DeviceError as e:\n    print(e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=os.path.dirname(os.path.dirname(__file__)))
    assert r.returncode == 0, r.stderr
    assert "CUDA driver not detected" in r.stdout and "cuda-python is not installed" in r.stdout
    assert "device='sim'" in r.stdout


@pytest.mark.skipif(NVIDIA_DEVICE, reason="this machine has an NVIDIA device")
def test_no_gpu_here_is_said_plainly():
    assert rt.gpu_available() is False
    for call in (rt.ensure_context, rt.device_info, lambda: rt.DeviceBuffer(16), rt.Stream,
                 rt.Event, rt.synchronize, lambda: rt.load_module(
                     ".version 7.0\n.target sm_80\n.address_size 64\n.visible .entry k() { ret; }", "k")):
        with pytest.raises(DeviceError) as e:
            call()
        msg = str(e.value)
        assert msg.startswith(("CUDA driver not detected", "no GPU found")), msg
        assert "device='sim'" in msg and "emulator" in msg


def test_no_device_reported_as_no_gpu(fake):
    fake(init=100)
    assert rt.gpu_available() is False
    with pytest.raises(DeviceError, match=r"^no GPU found: .*CUDA_ERROR_NO_DEVICE.*device='sim'"):
        rt.ensure_context()


def test_zero_devices_reported_as_no_gpu(fake):
    fake(count=0)
    assert rt.gpu_available() is False
    with pytest.raises(DeviceError, match="^no GPU found"):
        rt.ensure_context()


def test_driver_library_missing(fake, monkeypatch):
    d = fake()

    def boom(flags):
        raise OSError("libcuda.so.1: cannot open shared object file")
    monkeypatch.setattr(d, "cuInit", boom)
    assert rt.gpu_available() is False
    with pytest.raises(DeviceError, match="^CUDA driver not detected: .*libcuda"):
        rt.ensure_context()


def test_other_init_failure_names_the_error(fake):
    fake(init=3)
    with pytest.raises(DeviceError, match="CUDA_ERROR_NOT_INITIALIZED.*described"):
        rt.ensure_context()


def test_device_ordinal_out_of_range(fake):
    fake(count=1)
    assert rt.gpu_available() is True
    with pytest.raises(DeviceError, match=r"device 3 requested, but 1 GPU\(s\) found"):
        rt.ensure_context(3)


def test_check_unpacks_outputs(fake):
    fake()
    ok = FakeResult(0)
    assert rt.check((ok,)) is None
    assert rt.check((ok, 7)) == 7
    assert rt.check((ok, 1, 2)) == (1, 2)


def test_check_raises_with_name_and_description(fake):
    fake()
    with pytest.raises(DeviceError) as e:
        rt.check((FakeResult(218),), "cuModuleLoadDataEx")
    assert str(e.value) == "cuModuleLoadDataEx failed: CUDA_ERROR_INVALID_PTX (described)"
    assert e.value.code == 218 and e.value.error_name == "CUDA_ERROR_INVALID_PTX"


def test_check_with_real_bindings_names_the_error_without_a_driver():
    d = pytest.importorskip("cuda.bindings.driver")
    with pytest.raises(DeviceError, match="CUDA_ERROR_INVALID_PTX"):
        rt.check((d.CUresult.CUDA_ERROR_INVALID_PTX,), "load")


def test_device_info_fields():
    info = rt.DeviceInfo("NVIDIA H200", (9, 0), 132, 232448, "13.0")
    assert info.sm == 90
