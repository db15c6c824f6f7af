"""The disk cubin cache on a real GPU (marker `gpu`): the first load links the PTX with the
driver linker and stores the cubin; after clear_module_cache() the next load reads the
stored cubin (no link, no JIT) and the GEMM still computes the right thing. Also: JIT
errors on the linker path, and the linker's resource report against the plain JIT's."""
import os
import re
import time

import numpy as np
import pytest

import tilegen
from gpu_util import record, requires_gpu
from tilegen import compiler, store
from tilegen.runtime import cubins
from tilegen.errors import DeviceError
from tilegen.runtime import clear_module_cache, device_info, load_module
from tilegen.runtime import driver as drv
from tilegen.runtime import module as mod

pytestmark = [pytest.mark.gpu, requires_gpu]

# A spec no other test compiles, so its module is not already loaded in this process.
SPEC = tilegen.GemmSpec(dtype="f16", tile=(64, 64, 32), warps=(2, 2), stages=2, group_m=3)


def driver_version() -> int:
    return int(drv.check(drv.bindings().cuDriverGetVersion(), "cuDriverGetVersion"))


def run_and_check(kernel, M=300, N=200, K=160):
    rng = np.random.default_rng(11)
    A = rng.standard_normal((M, K)).astype(np.float16)
    B = rng.standard_normal((K, N)).astype(np.float16)
    C = kernel(A, B, out=np.full((M, N), np.nan, dtype=np.float32))
    ref = A.astype(np.float64) @ B.astype(np.float64)
    assert not np.isnan(C).any(), "unwritten elements"
    rel = float(np.linalg.norm(C - ref) / np.linalg.norm(ref))
    assert rel < 1e-2, f"relative error {rel:.3g}"
    return C


def test_first_load_links_and_stores_second_load_hits(cdir, monkeypatch):
    cc = tuple(device_info().cc)
    k1 = tilegen.compile(SPEC)
    t0 = time.perf_counter()
    fn1 = k1.function()                    # miss: cuLink* -> cubin -> stored -> cuModuleLoadData
    link_ms = (time.perf_counter() - t0) * 1e3
    cubin = cubins.get_cubin(k1.ptx, cc, driver_version())
    assert cubin is not None and cubin[:4] == b"\x7fELF", "no cubin (an ELF image) was stored"
    assert store.info()["cubin"] == 1
    assert "registers" in fn1.info_log     # the linker's verbose ptxas report
    C1 = run_and_check(k1)

    clear_module_cache()                   # k1's Function is gone with its module; k1 is not used again

    def boom(*a, **k):
        raise AssertionError("the second load must come from the stored cubin")

    monkeypatch.setattr(mod, "_link", boom)
    monkeypatch.setattr(mod, "_jit", boom)
    compiler.forget()
    k2 = tilegen.compile(SPEC)             # PTX cache hit as well
    assert k2 is not k1
    t0 = time.perf_counter()
    fn2 = k2.function()                    # hit: cuModuleLoadData(stored cubin)
    hit_ms = (time.perf_counter() - t0) * 1e3
    assert fn2 is not fn1 and fn2.info_log == fn1.info_log
    C2 = run_and_check(k2)
    np.testing.assert_array_equal(C1, C2)  # the same machine code: the same bits
    print(f"\n{k1.name}: first load (link + store) {link_ms:.1f} ms, "
          f"cached cubin load {hit_ms:.2f} ms, cubin {len(cubin)} bytes")
    record("cache_cubin", kernel=k1.name, link_ms=link_ms, hit_ms=hit_ms, cubin_bytes=len(cubin))


def test_jit_errors_on_the_linker_path(cdir):
    k = tilegen.compile(SPEC)
    lines = k.ptx.splitlines()
    i = next(n for n, line in enumerate(lines) if line.strip().startswith("ld.param"))
    lines.insert(i, "    add.f32 %nosuch, %nosuch, %nosuch;")  # PTX line i + 1
    bad = "\n".join(lines) + "\n"
    with pytest.raises(DeviceError) as e:
        load_module(bad, k.name)
    err = e.value
    msg = str(err)
    assert err.line == i + 1 and f"PTX line {i + 1}: add.f32 %nosuch" in msg, msg
    assert "nosuch" in err.jit_log and err.ptx_path in msg
    with open(err.ptx_path) as f:
        assert f.read() == bad
    assert store.info()["cubin"] == 0


def test_an_sm_90a_gemm_goes_through_the_linker(cdir):
    if tuple(device_info().cc) != (9, 0):
        pytest.skip("sm_90a code runs on compute capability 9.0 only")
    spec = tilegen.GemmSpec(dtype="f16", tile=(64, 64, 32), stages=2, group_m=5, target="sm_90a")
    k = tilegen.compile(spec)
    assert ".target sm_90a" in k.ptx
    run_and_check(k)
    assert store.info()["cubin"] == 1


def _resources(log: str):
    regs = [int(x) for x in re.findall(r"Used (\d+) registers", log)]
    spills = [tuple(map(int, m)) for m in re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)]
    return regs, spills


@pytest.mark.parametrize("dtype", ["f16", "bf16", "tf32"])
def test_linker_and_jit_report_the_same_resources(cdir, dtype):
    """The linker compiles PTX as relocatable code (-rdc); the cubin must not cost registers."""
    k = tilegen.compile(tilegen.GemmSpec(dtype=dtype))
    # A fresh comment makes the text new to the driver's own compute cache, which would
    # otherwise hand back an earlier build with an empty log.
    ptx = k.ptx + f"// {os.getpid()} {time.time_ns()}\n"
    d = drv.bindings()
    drv.ensure_context(0)
    arch = "sm_%d%d" % device_info().cc
    _, link_log = mod._link(d, ptx, arch)
    module, jit_log = mod._jit(d, ptx, arch)
    d.cuModuleUnload(module)
    link, jit = _resources(link_log), _resources(jit_log)
    print(f"\n{k.name}: linker {link}, JIT {jit}")
    record("cache_linker_resources", kernel=k.name, linker=link, jit=jit)
    assert link[0] and jit[0], f"no register report:\nlinker: {link_log}\nJIT: {jit_log}"
    assert link == jit, f"linker {link} vs JIT {jit}\nlinker log:\n{link_log}\nJIT log:\n{jit_log}"
