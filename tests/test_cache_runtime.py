"""The cubin cache behind runtime.load_module, through a stand-in for cuda.bindings.driver
that has the driver linker (no GPU here): link on a miss, cuModuleLoadData on a hit, JIT
errors on the linker path, damaged or refused cubins, TILEGEN_CACHE=0."""
import ctypes
import hashlib
import os
import types

import pytest

from tilegen import compiler, store
from tilegen.runtime import cubins
from tilegen.errors import DeviceError
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
REPORT = "ptxas info    : Used 4 registers, 384 bytes cmem[0]"
# what the driver's JIT printed for a kernel it spilled (run 145 of 2026-11-24, the fp8 128x192 kernel)
SPILLED = ("ptxas info    : Function properties for k\n"
           "ptxas         .     216 bytes stack frame, 548 bytes spill stores, 568 bytes spill loads\n"
           "ptxas info    : Used 168 registers, used 3 barriers\n"
           "info    : used 168 registers, used 3 barriers, 216 stack, 1024 bytes smem, 1024 bytes cmem[0], 0 bytes lmem")
SPILLS = GOOD.replace("    ret;", "    // the driver spills this one\n    ret;")


class R(int):
    name = property(lambda self: {0: "CUDA_SUCCESS", 218: "CUDA_ERROR_INVALID_PTX",
                                  200: "CUDA_ERROR_INVALID_IMAGE"}[int(self)])


def cubin_of(ptx_image: bytes) -> bytes:
    return b"\x7fELF" + hashlib.sha256(ptx_image).digest() * 4


class LinkState:
    def __init__(self, values):
        self.info, self.err = values[0], values[2]
        self.inputs, self.image, self.destroyed = [], None, False


class FakeLinkDriver:
    """cuda.bindings.driver as far as load_module uses it, with the cuLink* functions."""
    CUresult = R
    CUjit_option = types.SimpleNamespace(
        CU_JIT_INFO_LOG_BUFFER=3, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES=4, CU_JIT_ERROR_LOG_BUFFER=5,
        CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES=6, CU_JIT_LOG_VERBOSE=12, CU_JIT_TARGET=9)
    CUjitInputType = types.SimpleNamespace(CU_JIT_INPUT_PTX=1)
    CUjit_target = types.SimpleNamespace(CU_TARGET_COMPUTE_90A="compute_90a")
    CUfunction_attribute = types.SimpleNamespace(CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES=9)

    def __init__(self, version=13000):
        self.version = version
        self.links, self.loads, self.jits, self.states, self.options, self.unloaded = [], [], [], [], [], []
        self.refuse = False  # cuModuleLoadData fails (a cubin this driver will not take)
        self.quiet = False   # compile logs without ptxas's lines (the driver reused its own JIT cache)
        self.assembled_local = 0   # local bytes per thread of the assembler's cubin

    # -- the linker --
    def cuLinkCreate(self, n, options, values):
        assert n == len(options) == len(values) in (5, 6)
        self.options.append(dict(zip(options, values)))
        assert options[0] == 3 and options[2] == 5 and 12 in options
        assert isinstance(values[0], bytearray) and values[1] == len(values[0])
        assert isinstance(values[2], bytearray) and values[3] == len(values[2])
        state = LinkState(values)
        self.states.append(state)
        return (R(0), state)

    def cuLinkAddData(self, state, kind, data, size, name, n, options, values):
        assert not state.destroyed and kind == 1 and isinstance(name, bytes)
        assert data.endswith(b"\0") and size == len(data)  # NUL-terminated PTX, size counts it
        state.inputs.append(bytes(data))
        if b"%nosuch" in data:
            state.err[:len(JIT_LOG)] = JIT_LOG.encode()
            return (R(218),)
        return (R(0),)

    def cuLinkComplete(self, state):
        assert not state.destroyed and len(state.inputs) == 1
        self.links.append(state.inputs[0])
        report = self.report_of(state.inputs[0]).encode()
        state.info[:len(report)] = report
        state.image = ctypes.create_string_buffer(cubin_of(state.inputs[0]))
        return (R(0), ctypes.addressof(state.image), len(state.image.raw) - 1)

    def cuLinkDestroy(self, state):
        assert not state.destroyed
        if state.image is not None:  # the image belongs to the state: gone after destroy
            ctypes.memset(state.image, 0, len(state.image.raw))
        state.destroyed = True
        return (R(0),)

    # -- modules --
    def cuModuleLoadData(self, image):
        assert isinstance(image, bytes)
        self.loads.append(image)
        if self.refuse or not image.startswith(b"\x7fELF"):
            return (R(200), None)
        return (R(0), ("module", image))

    def cuModuleLoadDataEx(self, image, n, options, values):
        self.jits.append(image)
        report = self.report_of(image).encode()
        values[0][:len(report)] = report
        return (R(0), ("jit-module", image))

    def report_of(self, image: bytes) -> str:
        if self.quiet:
            return "info    : 16 bytes gmem"
        return SPILLED if b"spills" in image else REPORT

    def cuModuleGetFunction(self, module, name):
        return (R(0), ("function", module, name))

    def cuFuncGetAttribute(self, attribute, function):
        assert attribute == 9
        image = function[1][1]
        if image == ASSEMBLED:
            return (R(0), self.assembled_local)
        spills = b"spills" in image or image in {cubin_of(i) for i in self.links if b"spills" in i}
        return (R(0), 216 if spills else 0)

    def cuModuleUnload(self, module):
        self.unloaded.append(module)
        return (R(0),)

    def cuDriverGetVersion(self):
        return (R(0), self.version)

    def cuGetErrorName(self, e):
        return (R(0), e.name.encode())

    def cuGetErrorString(self, e):
        return (R(0), b"a PTX JIT compilation failed")


@pytest.fixture
def fake(monkeypatch, cdir):
    d = FakeLinkDriver()
    monkeypatch.setattr(drv, "bindings", lambda: d)
    monkeypatch.setattr(drv, "ensure_context", lambda device=0: 0xC0)
    d.cc = (9, 0)
    monkeypatch.setattr(drv, "device_info",
                        lambda device=0: DeviceInfo("Fake H200", d.cc, 132, 232448, "13.0"))
    forget(monkeypatch)
    return d


def forget(monkeypatch):
    """What clear_module_cache does, for the stand-in: the process forgets its modules."""
    monkeypatch.setattr(mod, "_modules", {})
    monkeypatch.setattr(mod, "_functions", {})


def test_miss_links_stores_and_loads_the_cubin(fake, cdir):
    f = mod.load_module(GOOD, "add_one")
    image = GOOD.encode() + b"\0"
    assert fake.links == [image] and fake.jits == []
    assert fake.loads == [cubin_of(image)]                  # copied out before cuLinkDestroy
    assert all(s.destroyed for s in fake.states)
    assert f.info_log == REPORT
    assert cubins.get_cubin(GOOD, (9, 0), 13000) == cubin_of(image)
    assert store.info()["cubin"] == 1
    assert mod.load_module(GOOD, "add_one") is f           # in-process cache, no new load
    assert len(fake.loads) == 1


def test_hit_loads_the_stored_cubin_without_linking(fake, monkeypatch):
    mod.load_module(GOOD, "add_one")
    forget(monkeypatch)  # a new process, or clear_module_cache()

    def no_link(*a, **k):
        raise AssertionError("a cached cubin must not be linked again")

    monkeypatch.setattr(mod, "_link", no_link)
    f = mod.load_module(GOOD, "add_one")
    assert fake.loads == [cubin_of(GOOD.encode() + b"\0")] * 2
    assert f.info_log == REPORT                             # the JIT's report comes back too
    assert len(fake.links) == 1


def test_other_device_or_driver_is_a_miss(fake, monkeypatch):
    mod.load_module(GOOD, "add_one")
    forget(monkeypatch)
    fake.cc = (8, 0)
    mod.load_module(GOOD, "add_one")
    forget(monkeypatch)
    fake.version = 13010
    mod.load_module(GOOD, "add_one")
    assert len(fake.links) == 3 and store.info()["cubin"] == 3


def test_jit_error_on_the_linker_path(fake):
    with pytest.raises(DeviceError) as e:
        mod.load_module(BAD, "add_one")
    err = e.value
    msg = str(err)
    assert "CUDA_ERROR_INVALID_PTX" in msg and "Unknown symbol '%nosuch'" in msg
    assert "PTX line 6: add.u32 %r1, %r0, %nosuch;" in msg
    assert err.line == 6 and "nosuch" in err.jit_log
    assert err.ptx_path in msg and "-arch=sm_90" in msg
    try:
        assert open(err.ptx_path).read() == BAD
    finally:
        os.unlink(err.ptx_path)
    assert all(s.destroyed for s in fake.states)
    assert store.info()["cubin"] == 0 and fake.loads == []


@pytest.mark.parametrize("how", ["flip", "truncate", "empty"])
def test_a_damaged_cubin_is_relinked(fake, monkeypatch, cdir, how):
    mod.load_module(GOOD, "add_one")
    (path,) = (cdir / "cubin").iterdir()
    good = path.read_bytes()
    data = {"flip": good[:-5] + bytes([good[-5] ^ 0xFF]) + good[-4:], "truncate": good[:-10], "empty": b""}[how]
    path.write_bytes(data)
    forget(monkeypatch)
    f = mod.load_module(GOOD, "add_one")
    assert len(fake.links) == 2                             # never loaded: relinked
    assert fake.loads == [cubin_of(GOOD.encode() + b"\0")] * 2
    assert path.read_bytes() == good and f.info_log == REPORT


def test_a_cubin_the_driver_refuses_is_discarded_and_relinked(fake, monkeypatch, cdir):
    mod.load_module(GOOD, "add_one")
    forget(monkeypatch)
    real = fake.cuModuleLoadData
    calls = []

    def refuse_first(image):
        calls.append(image)
        if len(calls) == 1:
            return (R(200), None)
        return real(image)

    monkeypatch.setattr(fake, "cuModuleLoadData", refuse_first)
    mod.load_module(GOOD, "add_one")
    assert len(calls) == 2 and len(fake.links) == 2
    assert store.info()["cubin"] == 1


def test_tilegen_cache_0_uses_the_jit(fake, monkeypatch, cdir):
    monkeypatch.setenv("TILEGEN_CACHE", "0")
    f = mod.load_module(GOOD, "add_one")
    assert fake.jits == [GOOD.encode() + b"\0"] and fake.links == [] and fake.loads == []
    assert f.info_log == REPORT and not cdir.exists()


def test_bindings_without_the_linker_use_the_jit(fake, monkeypatch, cdir):
    monkeypatch.delattr(FakeLinkDriver, "cuLinkCreate")
    mod.load_module(GOOD, "add_one")
    assert fake.jits and not fake.links and not cdir.exists()


def test_arch_specific_ptx_is_linked_for_that_target(fake):
    mod.load_module(GOOD.replace(".target sm_80", ".target sm_90a"), "add_one")
    mod.load_module(GOOD, "add_one")
    assert fake.options[0][9] == "compute_90a"  # CU_JIT_TARGET = CU_TARGET_COMPUTE_90A
    assert 9 not in fake.options[1]             # a portable target: the context's device


def test_precompile_links_and_stores_without_loading(fake, monkeypatch):
    assert mod.precompile(GOOD) is True
    image = GOOD.encode() + b"\0"
    assert fake.links == [image] and fake.loads == []        # stored, not loaded
    assert cubins.get_cubin(GOOD, (9, 0), 13000) == cubin_of(image)
    assert mod.precompile(GOOD) is True and len(fake.links) == 1  # already there: no new link
    mod.load_module(GOOD, "add_one")                          # the load then hits the cache
    assert len(fake.links) == 1 and fake.loads == [cubin_of(image)]


def test_precompile_without_a_cache_does_nothing(fake, monkeypatch):
    monkeypatch.setenv("TILEGEN_CACHE", "0")
    assert mod.precompile(GOOD) is False and fake.links == []


# ---- where the driver's compile spills: an assembler (ptxas) gets a chance ---------------------

ASSEMBLED = b"\x7fELF assembled by ptxas"
CLEAN = "ptxas info    : Used 223 registers, used 3 barriers\n    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads"


class Assembler:
    def __init__(self, fails=False):
        self.fails, self.calls = fails, []

    def __call__(self, ptx, arch):
        self.calls.append((ptx, arch))
        if self.fails:
            return None, "ptxas -arch=sm_90 failed:\nptxas fatal   : something"
        return ASSEMBLED, CLEAN


def test_spill_stores_reads_ptxas_reports():
    from tilegen.codegen.ptxas import spill_stores

    assert spill_stores(SPILLED) == 548 and spill_stores(CLEAN) == 0 and spill_stores(REPORT) == 0
    assert spill_stores(CLEAN + "\n" + SPILLED.replace("548", "12")) == 12


def test_a_spilled_kernel_is_assembled_stored_and_loaded_from_the_store(fake, monkeypatch):
    asm = Assembler()
    f = mod.load_module(SPILLS, "add_one", assemble=asm)
    image = SPILLS.encode() + b"\0"
    assert asm.calls == [(SPILLS, "sm_90")] and len(fake.links) == 1   # (an sm_80 kernel on this sm_90 device)
    assert fake.loads == [cubin_of(image), ASSEMBLED] and fake.unloaded == [("module", cubin_of(image))]
    assert f.module == ("module", ASSEMBLED) and f.local_bytes == 0 and f.spill_note == ""
    assert f.info_log.startswith("assembled by ptxas for sm_90 (the driver's compile spilled 216 bytes per thread)")
    assert CLEAN in f.info_log
    assert cubins.get_cubin(SPILLS, (9, 0), 13000, maker="ptxas") == ASSEMBLED
    assert cubins.get_cubin(SPILLS, (9, 0), 13000) == cubin_of(image)   # the driver's stays under its own key
    forget(monkeypatch)                                     # a later process: the stored cubin
    again = Assembler()
    g = mod.load_module(SPILLS, "add_one", assemble=again)
    assert again.calls == [] and len(fake.links) == 1 and fake.loads[2:] == [ASSEMBLED]
    assert g.info_log == f.info_log
    forget(monkeypatch)                                     # one with no ptxas (TILEGEN_PTXAS=off): the driver's
    h = mod.load_module(SPILLS, "add_one")
    assert h.module == ("module", cubin_of(image)) and h.local_bytes == 216
    assert h.spill_note == "no ptxas was at hand to assemble it"


def test_arch_specific_ptx_is_assembled_for_its_own_target(fake):
    asm = Assembler()
    mod.load_module(SPILLS.replace(".target sm_80", ".target sm_90a"), "add_one", assemble=asm)
    assert [arch for _, arch in asm.calls] == ["sm_90a"]


def test_a_spill_the_log_does_not_show_is_still_found(fake):
    """The driver reuses compiles from its own JIT cache without running ptxas, so its log may
    say nothing of spills: the loaded kernel's local memory size says it."""
    fake.quiet = True
    f = mod.load_module(SPILLS, "add_one", assemble=Assembler())
    assert f.module == ("module", ASSEMBLED) and f.local_bytes == 0


@pytest.mark.parametrize("local, fails, note", [
    (216, False, "ptxas's cubin spills too (216 bytes per thread)"),
    (0, True, "ptxas could not assemble it: ptxas fatal   : something"),
    (None, False, "no ptxas was at hand to assemble it")])
def test_the_drivers_cubin_stays_where_the_assembler_cannot_do_better(fake, local, fails, note):
    fake.assembled_local = local or 0
    f = mod.load_module(SPILLS, "add_one", assemble=None if local is None else Assembler(fails=fails))
    image = SPILLS.encode() + b"\0"
    assert f.module == ("module", cubin_of(image)) and f.info_log == SPILLED and f.local_bytes == 216
    assert f.spill_note == note
    assert cubins.get_cubin(SPILLS, (9, 0), 13000) == cubin_of(image)
    # a cubin that spills too is a lasting verdict, stored (empty, with the reason); a failure is not
    assert cubins.get_cubin(SPILLS, (9, 0), 13000, maker="ptxas") == (b"" if local == 216 else None)
    assert fake.unloaded == ([("module", ASSEMBLED)] if local == 216 else [])


def test_an_assembler_that_raises_leaves_the_drivers_module_loaded(fake):
    def broken(ptx, arch):
        raise OSError("No space left on device")

    f = mod.load_module(SPILLS, "add_one", assemble=broken)
    assert f.module == ("module", cubin_of(SPILLS.encode() + b"\0")) and fake.unloaded == []
    assert f.spill_note == "the assembler failed: OSError: No space left on device"


def test_a_stored_ptxas_cubin_the_driver_refuses_is_discarded(fake, monkeypatch):
    mod.load_module(SPILLS, "add_one", assemble=Assembler())
    forget(monkeypatch)                                   # a later process whose driver refuses it
    real = fake.cuModuleLoadData
    monkeypatch.setattr(fake, "cuModuleLoadData", lambda image: (R(200), None) if image == ASSEMBLED else real(image))
    again = Assembler()
    f = mod.load_module(SPILLS, "add_one", assemble=again)
    assert len(again.calls) == 1 and f.module == ("module", cubin_of(SPILLS.encode() + b"\0"))
    assert f.spill_note == "this driver refused ptxas's sm_90 cubin"
    assert cubins.get_cubin(SPILLS, (9, 0), 13000, maker="ptxas") == b""   # the verdict replaces the cubin


def test_without_the_devices_arch_the_ptxs_own_target_is_assembled(fake, monkeypatch):
    def no_info(device=0):
        raise DeviceError("no attributes")

    monkeypatch.setattr(drv, "device_info", no_info)
    asm = Assembler()
    mod.load_module(SPILLS, "add_one", assemble=asm)
    assert [arch for _, arch in asm.calls] == ["sm_80"]


def test_assembly_arch():
    target = lambda t: GOOD.replace(".target sm_80", f".target {t}")   # noqa: E731
    assert mod._assembly_arch(target("sm_90a"), "sm_90") == "sm_90a"
    assert mod._assembly_arch(target("sm_100f"), "sm_103") == "sm_100f"
    assert mod._assembly_arch(target("sm_80"), "sm_86") == "sm_86"
    assert mod._assembly_arch(target("sm_80"), None) == "sm_80"


def test_a_ptxas_cubin_under_the_drivers_key_is_relinked(fake):
    """A first version of this code stored ptxas's cubins under the driver's key: such an entry
    is a miss (a process told to use no ptxas must not load one)."""
    cubins.put_cubin(SPILLS, (9, 0), 13000, ASSEMBLED, "assembled by ptxas (the driver's JIT spilled 548 bytes)")
    f = mod.load_module(SPILLS, "add_one")
    assert len(fake.links) == 1 and f.module == ("module", cubin_of(SPILLS.encode() + b"\0"))
    assert cubins.get_cubin(SPILLS, (9, 0), 13000) == cubin_of(SPILLS.encode() + b"\0")


def test_a_lasting_verdict_spares_later_processes_the_assembly_but_not_another_ptxas(fake, monkeypatch):
    fake.assembled_local = 216                            # ptxas's cubin spills as much
    mod.load_module(SPILLS, "add_one", assemble=Assembler())
    forget(monkeypatch)
    again = Assembler()
    f = mod.load_module(SPILLS, "add_one", assemble=again)
    assert again.calls == [] and f.spill_note == "ptxas's cubin spills too (216 bytes per thread)"
    forget(monkeypatch)
    other = Assembler()
    other.identity = "another ptxas"                     # a new ptxas: its own entries, a fresh try
    fake.assembled_local = 0
    g = mod.load_module(SPILLS, "add_one", assemble=other)
    assert len(other.calls) == 1 and g.module == ("module", ASSEMBLED)
    assert cubins.get_cubin(SPILLS, (9, 0), 13000, maker="ptxas another ptxas") == ASSEMBLED


def test_a_kernel_the_driver_compiles_without_spills_is_never_assembled(fake):
    asm = Assembler()
    f = mod.load_module(GOOD, "add_one", assemble=asm)
    assert asm.calls == [] and fake.loads == [cubin_of(GOOD.encode() + b"\0")] and f.local_bytes == 0


def test_an_assembled_cubin_the_driver_refuses_leaves_the_drivers(fake, monkeypatch):
    real = fake.cuModuleLoadData
    monkeypatch.setattr(fake, "cuModuleLoadData", lambda image: (R(200), None) if image == ASSEMBLED else real(image))
    f = mod.load_module(SPILLS, "add_one", assemble=Assembler())
    assert f.info_log == SPILLED and f.local_bytes == 216 and f.spill_note == "this driver refused ptxas's sm_90 cubin"
    assert cubins.get_cubin(SPILLS, (9, 0), 13000, maker="ptxas") == b""


def test_without_the_store_the_jits_module_is_replaced(fake, monkeypatch):
    monkeypatch.setenv("TILEGEN_CACHE", "0")
    f = mod.load_module(SPILLS, "add_one", assemble=Assembler())
    assert fake.jits == [SPILLS.encode() + b"\0"] and fake.loads == [ASSEMBLED]
    assert fake.unloaded == [("jit-module", SPILLS.encode() + b"\0")] and f.module == ("module", ASSEMBLED)


def test_a_stored_spilled_cubin_is_assembled_when_an_assembler_comes(fake, monkeypatch):
    """precompile (the tuner's worker threads) stores the driver's cubin; the load that follows
    finds it spills and replaces the stored entry."""
    assert mod.precompile(SPILLS) is True and fake.loads == []
    f = mod.load_module(SPILLS, "add_one", assemble=Assembler())
    assert f.module == ("module", ASSEMBLED) and cubins.get_cubin(SPILLS, (9, 0), 13000, maker="ptxas") == ASSEMBLED
    assert len(fake.links) == 1


@pytest.mark.parametrize("ptxas_here", [False, True])
def test_a_kernel_that_still_spills_warns_once_with_what_to_do(fake, monkeypatch, ptxas_here):
    """compiler.Kernel.function: the user hears of spilled registers (PerformanceWarning): the
    kernel, the bytes, why ptxas did not take over, what would help; setmaxnreg named only where
    the kernel uses it (this one does not)."""
    import warnings

    import tilegen
    import tilegen.dsl as tg
    from tilegen.compiler import kernel as compiled

    @tg.kernel
    def spills():
        tg.launch(threads=32, grid=(1, 1, 1))

    k = tilegen.compile(spills, target="sm_80")
    monkeypatch.setattr(k, "ptx", k.ptx.replace("ret;", "// the driver spills this one\n    ret;"))
    monkeypatch.setattr(fake, "cuFuncGetAttribute", lambda attribute, function: (R(0), 216))   # ptxas's too
    if ptxas_here:
        monkeypatch.setattr(compiled, "find_ptxas", lambda: "ptxas")
        monkeypatch.setattr(compiled, "assemble_cubin", lambda ptx, arch, exe=None: (ASSEMBLED, CLEAN))
    else:
        monkeypatch.setenv("TILEGEN_PTXAS", "off")
    with pytest.warns(tilegen.PerformanceWarning) as w:
        k.function()
    (msg,) = [str(x.message) for x in w]
    assert k.name in msg and "(216 bytes per thread)" in msg and "setmaxnreg" not in msg
    if ptxas_here:
        assert "ptxas's cubin spills too (216 bytes per thread); choose smaller tiles" in msg
    else:
        assert "no ptxas was at hand to assemble it. With ptxas installed" in msg
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        k.function()                                  # loaded already: no second warning
