"""The runtime on a real GPU: load, launch, memory, events, JIT errors, fragment probes.
Skipped without a GPU (marker `gpu`)."""
import os

import numpy as np
import pytest

from tilegen.errors import DeviceError
from tilegen.runtime import (DeviceBuffer, Event, Stream, describe_array, device_info,
                             elapsed_ms, gpu_available, load_module, synchronize)

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="no GPU / CUDA driver")]

ADD = """.version 7.0
.target sm_80
.address_size 64

// x[i] += v for i < n
.visible .entry add_scalar(
    .param .u64 p_x,
    .param .u32 p_n,
    .param .f32 p_v
)
{
    .reg .pred %p;
    .reg .b32 %r<5>;
    .reg .f32 %f<2>;
    .reg .b64 %rd<3>;
    mov.u32 %r0, %ctaid.x;
    mov.u32 %r1, %ntid.x;
    mov.u32 %r2, %tid.x;
    mad.lo.u32 %r3, %r0, %r1, %r2;
    ld.param.u32 %r4, [p_n];
    setp.ge.u32 %p, %r3, %r4;
    @%p bra DONE;
    ld.param.u64 %rd0, [p_x];
    cvta.to.global.u64 %rd0, %rd0;
    mul.wide.u32 %rd1, %r3, 4;
    add.u64 %rd2, %rd0, %rd1;
    ld.global.f32 %f0, [%rd2];
    ld.param.f32 %f1, [p_v];
    add.f32 %f0, %f0, %f1;
    st.global.f32 [%rd2], %f0;
DONE:
    ret;
}
"""


def test_device_info():
    info = device_info()
    assert info.name and info.cc >= (8, 0) and info.sm_count > 0
    assert info.smem_optin >= 48 * 1024 and info.driver_version.count(".") == 1


def test_add_one_kernel():
    x = np.arange(1024, dtype=np.float32)
    n = 1000  # the last 24 elements must stay untouched
    with DeviceBuffer.from_host(x) as buf:
        fn = load_module(ADD, "add_scalar")
        assert "registers" in fn.info_log  # the JIT's verbose report (CU_JIT_LOG_VERBOSE)
        fn.launch(((n + 127) // 128,), (128,), [(buf, "ptr"), (n, "u32"), (1.0, "f32")])
        synchronize()
        out = buf.copy_to_host(np.empty_like(x))
    want = x.copy()
    want[:n] += 1
    np.testing.assert_array_equal(out, want)
    assert load_module(ADD, "add_scalar") is fn  # cached


def test_launch_on_a_stream_with_events():
    x = np.zeros(4096, dtype=np.float32)
    buf = DeviceBuffer.from_host(x)
    synchronize()  # the copy ran on the legacy stream; the non-blocking stream does not wait
    fn = load_module(ADD, "add_scalar")
    stream, start, end = Stream(), Event(), Event()
    start.record(stream)
    for _ in range(3):
        fn.launch((32,), (128,), [(buf, "ptr"), (x.size, "u32"), (0.5, "f32")], stream=stream)
    end.record(stream)
    stream.synchronize()
    assert elapsed_ms(start, end) >= 0.0
    np.testing.assert_array_equal(buf.copy_to_host(np.empty_like(x)), np.full_like(x, 1.5))
    buf.close()
    buf.close()  # twice is fine


def test_fill_bytes_poisons():
    buf = DeviceBuffer(256)
    buf.fill_bytes(0xAB)
    got = buf.copy_to_host(np.empty(256, np.uint8))
    assert (got == 0xAB).all()


def test_broken_ptx_names_line_and_saved_file():
    bad = ADD.replace("add.f32 %f0, %f0, %f1;", "add.f32 %f0, %f0, %nosuch;")
    line = bad.splitlines().index("    add.f32 %f0, %f0, %nosuch;") + 1
    with pytest.raises(DeviceError) as e:
        load_module(bad, "add_scalar")
    msg = str(e.value)
    assert f"PTX line {line}: add.f32 %f0, %f0, %nosuch;" in msg
    assert "nosuch" in e.value.jit_log
    assert e.value.ptx_path in msg and os.path.basename(e.value.ptx_path).startswith("tilegen-")
    with open(e.value.ptx_path) as f:
        assert f.read() == bad
    os.unlink(e.value.ptx_path)


def test_device_pointer_knows_its_gpu():
    buf = DeviceBuffer(64 * 32 * 2)

    class Wrapped:  # a CuPy-like view of the buffer, with no device attribute
        __cuda_array_interface__ = {"shape": (64, 32), "typestr": "<f2", "data": (buf.ptr, False),
                                    "strides": None, "version": 3}

    v = describe_array(Wrapped(), name="A", dtype="f16", layout="row", align=16)
    assert v.device == 0 and v.ptr == buf.ptr and not v.needs_copy


def test_fragment_maps_on_this_gpu(tmp_path):
    from tilegen.verify.fragments import WGMMA_CASES, compare_with_record, verify_fragments

    path = tmp_path / "fragments.json"
    report = verify_fragments(record_path=str(path))
    assert report.passed, report.table()
    sm = device_info().sm
    ran = {r.name for r in report.results if r.status == "pass"}
    assert len(ran) == sum(1 for r in report.results if r.status != "skip")
    assert (sm < 90) or len(ran) == 23 + len(WGMMA_CASES)
    assert compare_with_record(str(path)) == []
