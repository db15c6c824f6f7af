"""PTX loading and launching, through a stand-in for cuda.bindings.driver (no GPU here):
the JIT error report, the module cache, and what reaches cuLaunchKernel."""
import ctypes
import os
import shutil
import subprocess
import types

import pytest

from tilegen.errors import DeviceError, LaunchError
from tilegen.runtime import driver as drv
from tilegen.runtime import module as mod
from tilegen.runtime.driver import DeviceInfo

GOOD = """.version 7.0
.target sm_80
.address_size 64
.visible .entry add_one(.param .u64 p, .param .u32 n, .param .f32 v)
{
    ret;
}
"""
BAD = GOOD.replace("    ret;", "    add.u32 %r1, %r0, %nosuch;\n    ret;")  # line 6
JIT_LOG = ("ptxas application ptx input, line 6; error   : Unknown symbol '%nosuch'\n"
           "ptxas fatal   : Ptx assembly aborted due to errors")


class R(int):
    name = property(lambda self: {0: "CUDA_SUCCESS", 218: "CUDA_ERROR_INVALID_PTX"}[int(self)])


class FakeDriver:
    CUresult = R
    CUjit_option = types.SimpleNamespace(
        CU_JIT_INFO_LOG_BUFFER=3, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES=4, CU_JIT_ERROR_LOG_BUFFER=5,
        CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES=6, CU_JIT_LOG_VERBOSE=12)
    CUfunction_attribute = types.SimpleNamespace(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES=8)

    def __init__(self):
        self.loads, self.launches, self.attrs = [], [], []

    def cuModuleLoadDataEx(self, image, n, options, values):
        self.loads.append(image)
        assert image.endswith(b"\0") and n == len(options) == len(values) == 5
        info, err = values[0], values[2]
        if b"%nosuch" in image:
            err[:len(JIT_LOG)] = JIT_LOG.encode()
            return (R(218), None)
        report = b"ptxas info    : Used 4 registers"
        info[:len(report)] = report
        return (R(0), "module")

    def cuModuleGetFunction(self, module, name):
        return (R(0), ("function", name))

    def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        self.launches.append(((gx, gy, gz), (bx, by, bz), smem, stream, params, extra))
        return (R(0),)

    def cuFuncSetAttribute(self, f, attr, value):
        self.attrs.append((attr, value))
        return (R(0),)

    def cuGetErrorName(self, e):
        return (R(0), e.name.encode())

    def cuGetErrorString(self, e):
        return (R(0), b"a PTX JIT compilation failed")


@pytest.fixture
def fake(monkeypatch):
    d = FakeDriver()
    monkeypatch.setattr(drv, "bindings", lambda: d)
    monkeypatch.setattr(drv, "ensure_context", lambda device=0: 0xC0)
    monkeypatch.setattr(drv, "device_info",
                        lambda device=0: DeviceInfo("Fake H200", (9, 0), 132, 232448, "13.0"))
    monkeypatch.setattr(mod, "_modules", {})
    monkeypatch.setattr(mod, "_functions", {})
    return d


# ---- pure helpers --------------------------------------------------------------------

def test_jit_error_line_from_driver_and_ptxas_logs():
    assert mod.jit_error_line(JIT_LOG) == 6
    assert mod.jit_error_line("ptxas k.ptx, line 12; warning : x\nptxas k.ptx, line 40; error : y") == 40
    assert mod.jit_error_line("nothing useful") is None


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas not installed")
def test_jit_error_line_reads_real_ptxas_output(tmp_path):
    f = tmp_path / "bad.ptx"
    f.write_text(BAD)
    r = subprocess.run(["ptxas", "-arch=sm_80", "-o", "/dev/null", str(f)], capture_output=True, text=True)
    assert r.returncode != 0
    assert mod.jit_error_line(r.stderr) == 6


def test_save_ptx(tmp_path):
    path = mod.save_ptx(GOOD)
    try:
        assert os.path.basename(path).startswith("tilegen-") and path.endswith(".ptx")
        assert open(path).read() == GOOD
    finally:
        os.unlink(path)


def test_jit_error_message_parts():
    msg = mod.jit_error_message(BAD, JIT_LOG, "/tmp/tilegen-x.ptx", "CUDA_ERROR_INVALID_PTX", "sm_90")
    assert "CUDA_ERROR_INVALID_PTX" in msg
    assert "  ptxas application ptx input, line 6; error   : Unknown symbol '%nosuch'" in msg
    assert "PTX line 6: add.u32 %r1, %r0, %nosuch;" in msg
    assert "full PTX written to /tmp/tilegen-x.ptx" in msg
    assert "ptxas -arch=sm_90 -o /dev/null /tmp/tilegen-x.ptx" in msg


def test_entries_and_param_sizes():
    assert mod.ptx_entries(GOOD + ".visible .entry second() { ret; }") == ["add_one", "second"]
    assert mod.entry_param_bytes(GOOD, "add_one") == [8, 4, 4]
    tma = ".entry k(.param .u64 a, .param .align 64 .b8 tm[128])"
    assert mod.entry_param_bytes(tma, "k") == [8, None]


def test_unknown_entry_is_refused_before_the_driver():
    with pytest.raises(LaunchError, match="kernel 'nope' is not defined in the PTX; entries: add_one"):
        mod.load_module(GOOD, "nope")


# ---- load and launch through the stand-in driver -------------------------------------

def test_jit_failure_reports_log_line_and_saved_file(fake):
    with pytest.raises(DeviceError) as e:
        mod.load_module(BAD, "add_one")
    err = e.value
    msg = str(err)
    assert "CUDA_ERROR_INVALID_PTX" in msg and "Unknown symbol '%nosuch'" in msg
    assert "PTX line 6: add.u32 %r1, %r0, %nosuch;" in msg
    assert err.line == 6 and err.ptx_path in msg and "-arch=sm_90" in msg
    try:
        assert open(err.ptx_path).read() == BAD
    finally:
        os.unlink(err.ptx_path)


def test_module_cache_and_info_log(fake):
    f1 = mod.load_module(GOOD, "add_one")
    f2 = mod.load_module(GOOD, "add_one")
    assert f1 is f2 and len(fake.loads) == 1
    assert f1.info_log == "ptxas info    : Used 4 registers"
    mod.load_module(GOOD + "\n", "add_one")  # different text, new module
    assert len(fake.loads) == 2


def test_launch_passes_packed_arguments(fake):
    f = mod.load_module(GOOD, "add_one")
    f.launch((3,), (128, 1, 1), [(0x1000, "ptr"), (1000, "u32"), (1.0, "f32")])
    grid, block, smem, stream, params, extra = fake.launches[-1]
    assert (grid, block, smem, stream, extra) == ((3, 1, 1), (128, 1, 1), 0, 0, 0)
    values, kinds = params
    assert kinds == (ctypes.c_void_p, ctypes.c_uint32, ctypes.c_float)
    assert values[0] == 0x1000 and values[1].value == 1000 and values[2].value == 1.0
    assert fake.attrs == []


def test_launch_checks_arguments_against_the_params(fake):
    f = mod.load_module(GOOD, "add_one")
    with pytest.raises(LaunchError, match="takes 3 arguments; got 2"):
        f.launch(1, 32, [(0x1000, "ptr"), (1, "u32")])
    with pytest.raises(LaunchError, match="argument 1 is a 4-byte .param; kind 'u64' passes 8 bytes"):
        f.launch(1, 32, [(0x1000, "ptr"), (1, "u64"), (1.0, "f32")])
    with pytest.raises(LaunchError, match="block"):
        f.launch(1, 2048, [(0x1000, "ptr"), (1, "u32"), (1.0, "f32")])
    assert fake.launches == []


def test_large_dynamic_smem_sets_the_attribute_once(fake):
    f = mod.load_module(GOOD, "add_one")
    args = [(0x1000, "ptr"), (1, "u32"), (1.0, "f32")]
    f.launch(1, 32, args, smem=32 * 1024)
    assert fake.attrs == []                      # 48 KB and below need no opt-in
    f.launch(1, 32, args, smem=100 * 1024, stream=types.SimpleNamespace(handle="s1"))
    f.launch(1, 32, args, smem=100 * 1024)
    assert fake.attrs == [(8, 100 * 1024)]
    assert fake.launches[1][3] == "s1"
    with pytest.raises(LaunchError, match="at most 232448 bytes"):
        f.set_max_dynamic_smem(300 * 1024)
