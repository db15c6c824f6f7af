"""ptxas as the assembler of kernels the driver's JIT spills (codegen/ptxas.py): where it is
found, the cubin it makes, and why it helps: ptxas gives the math warpgroups the registers
setmaxnreg moves to them, while the driver's JIT (driver 580, run 145 of 2026-11-24) allots each
thread what the launch allows (168 with 384 threads) and spilled the fp8 128x192 kernel."""
import os
import sys

import pytest

import tilegen
from ptxas_util import needs_ptxas
from tilegen.codegen import ptxas

WIDE_FP8 = dict(dtype="e4m3", out_dtype="bf16", instruction="wgmma", b_layout="col", tile=(128, 192, 128))


def test_tilegen_ptxas_off_finds_none(monkeypatch):
    monkeypatch.setenv("TILEGEN_PTXAS", "off")
    assert ptxas.find_ptxas() is None
    with pytest.raises(ptxas.PtxasError, match="ptxas not found"):
        ptxas.assemble_cubin(".version 8.0\n.target sm_90a\n", "sm_90a")


def test_tritons_copy_is_found_without_importing_triton(monkeypatch, tmp_path):
    """With nothing on PATH and no NVIDIA wheels, the ptxas Triton ships is found (located, not
    imported)."""
    pkg = tmp_path / "triton"
    (pkg / "backends" / "nvidia" / "bin").mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise RuntimeError('located, never imported')\n")
    exe = pkg / "backends" / "nvidia" / "bin" / "ptxas"
    exe.write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "triton", raising=False)
    monkeypatch.setitem(sys.modules, "nvidia", None)   # no NVIDIA wheels: the import fails
    monkeypatch.delenv("TILEGEN_PTXAS", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert ptxas.find_ptxas() == str(exe)
    exe.unlink()
    assert ptxas.find_ptxas() is None


def test_a_ptxas_that_cannot_run_is_a_ptxas_error(monkeypatch, tmp_path):
    broken = tmp_path / "ptxas"
    broken.write_text("not a program")   # not executable
    monkeypatch.setenv("TILEGEN_PTXAS", str(broken))
    with pytest.raises(ptxas.PtxasError, match="did not run"):
        ptxas.assemble_cubin(".version 8.0\n.target sm_90a\n", "sm_90a")


@needs_ptxas
@pytest.mark.parametrize("spec", [WIDE_FP8, dict(WIDE_FP8, tile=(128, 128, 128), promote=1, frag_buffers=2)],
                         ids=["128x192", "two accumulators"])
def test_the_wide_fp8_kernel_assembles_without_spills_because_of_setmaxnreg(spec):
    """The cubin is an ELF image with no spills; the same PTX without its setmaxnreg spills as
    the driver's JIT did (548 bytes of spill stores): the registers come from setmaxnreg. The
    same holds for fp8 promoted every k-tile by two accumulators (3 x 64 registers): so matmul
    takes both only where ptxas assembled them (loads_without_spills)."""
    ptx = tilegen.compile(tilegen.GemmSpec(**spec)).ptx
    cubin, report = ptxas.assemble_cubin(ptx, "sm_90a")
    assert cubin.startswith(b"\x7fELF") and ptxas.spill_stores(report) == 0, report
    assert "setmaxnreg.inc.sync.aligned.u32 232" in ptx
    capped = "\n".join(line for line in ptx.split("\n") if "setmaxnreg" not in line)
    assert ptxas.spill_stores(ptxas.assemble_cubin(capped, "sm_90a")[1]) > 0


# the Hopper kernels matmul chooses by default (and the fused and fp8 variants): each must fit the
# registers the driver's JIT gives (what ptxas gives the PTX without its setmaxnreg)
_E = tilegen.Epilogue
DEFAULTS = {
    "bf16": dict(dtype="bf16", out_dtype="bf16"),
    "f16 bias gelu_erf": dict(dtype="f16", out_dtype="f16", epilogue=_E(bias="col", activation="gelu_erf")),
    "bf16 bias gelu_tanh residual": dict(dtype="bf16", out_dtype="bf16",
                                         epilogue=_E(bias="col", activation="gelu_tanh", residual=True)),
    "bf16 ping-pong bias gelu": dict(dtype="bf16", out_dtype="bf16", pingpong=True, tile=(64, 256, 64), warps=(4, 1),
                                     epilogue=_E(bias="col", activation="gelu_tanh")),
    "e4m3": dict(dtype="e4m3", out_dtype="bf16", b_layout="col"),
    "e4m3 row and column scales": dict(dtype="e4m3", out_dtype="bf16", b_layout="col",
                                       epilogue=_E(scale_rows=True, scale_cols=True)),
    "tf32 x @ W.T": dict(dtype="tf32", out_dtype="f32", b_layout="col"),
    "f32 as tf32 parts": dict(dtype="f32", out_dtype="f32"),
    "bf16 2x1 cluster": dict(dtype="bf16", out_dtype="bf16", cluster=(2, 1)),
    "bf16 stream-K": dict(dtype="bf16", out_dtype="bf16", stream_k=True),
    "bf16 medium 128x128": dict(dtype="bf16", out_dtype="bf16", tile=(128, 128, 64)),
    "bf16 medium 64x128": dict(dtype="bf16", out_dtype="bf16", tile=(64, 128, 64), warps=(4, 1), stages=6),
}


@needs_ptxas
@pytest.mark.parametrize("name", list(DEFAULTS))
def test_default_hopper_kernels_fit_the_registers_the_jit_gives(name):
    """The driver's JIT gives every thread the launch's share of registers (168 of a 384-thread
    CTA) whatever setmaxnreg says, so a default that needs more would spill there and run at
    half speed (the wide fp8 kernel, above, is the planted case)."""
    ptx = tilegen.compile(tilegen.GemmSpec(instruction="wgmma", target="sm_90a", **DEFAULTS[name])).ptx
    found = ptxas.resources(ptx, "sm_90a")
    assert found.jit_spill_stores in (0, None), found   # (None: no setmaxnreg, so the JIT gives what ptxas does)
    assert found.spill_stores == 0, found
    assert found.wgmma_serialized is None, found      # (ptxas would run each wgmma alone: section 47)


@needs_ptxas
def test_the_tf32_register_kernel_keeps_its_wgmmas_in_flight():
    """tf32 with A and B row-major on TMA (B's k-steps into registers): no wgmma serialized by ptxas
    (its fragments are loaded only once every wgmma retired) and no spills with setmaxnreg's
    registers; the driver's JIT alone spills it, so matmul takes it only where it loads without
    spills (loads_without_spills: a ptxas assembles it)."""
    ptx = tilegen.compile(tilegen.GemmSpec(instruction="wgmma", target="sm_90a", dtype="tf32", out_dtype="f32",
                                           copy="tma")).ptx
    found = ptxas.resources(ptx, "sm_90a")
    assert found.spill_stores == 0 and found.wgmma_serialized is None, found
    assert found.jit_spill_stores > 0, found   # (if the JIT stops spilling it, matmul's guard can go)


def test_serialized_wgmmas_are_reported():
    """ptxas's note that it serialized a kernel's wgmmas is read into Resources and printed."""
    report = ("ptxas info    : (C7513) Potential Performance Loss: wgmma.mma_async instructions are serialized due to "
              "non wgmma instructions defining input registers of a wgmma between start and end of the pipeline stage "
              "in the function 'k'\nptxas info    : Used 168 registers, used 1 barriers\n")
    why = ptxas.wgmma_serialized(report)
    assert why == ("due to non wgmma instructions defining input registers of a wgmma between start and end of the "
                   "pipeline stage (C7513)")
    assert ptxas.wgmma_serialized(report.replace("(C7513) Potential", "(C7000) Other")) is None
    assert "wgmmas serialized: due to non wgmma" in str(ptxas.Resources("sm_90a", 168, 0, 0, 0, 0, 0, None, why))


@needs_ptxas
def test_resources_say_what_the_jit_would_spill():
    """Kernel.resources (and `tilegen compile --emit resources`) report the spills of a
    setmaxnreg kernel under the launch's share of registers beside ptxas's own."""
    wide = tilegen.compile(tilegen.GemmSpec(**WIDE_FP8)).resources
    assert wide.spill_stores == 0 and wide.jit_spill_stores > 0
    assert "the driver's JIT ignores setmaxnreg" in str(wide)
    assert tilegen.compile(tilegen.GemmSpec(dtype="bf16", instruction="wgmma")).resources.jit_spill_stores == 0
    plain = tilegen.compile(tilegen.GemmSpec(dtype="f16", target="sm_80")).resources
    assert plain.jit_spill_stores is None and "setmaxnreg" not in str(plain)


@needs_ptxas
@pytest.mark.parametrize("dtype", ["f16", "bf16", "tf32", "f32", "e4m3", "e5m2"])
def test_default_mma_sync_specs_keep_their_registers(dtype):
    """GemmSpec(dtype=...)'s mma.sync defaults assemble without spills (fp8's 64 x 64 warp tiles
    with 128-deep k-tiles spilled 144 bytes per thread; run 149 ran them 12-14% slower)."""
    spec = tilegen.GemmSpec(dtype=dtype, **({"b_layout": "col"} if dtype.startswith("e") else {}))
    report = ptxas.assemble_cubin(tilegen.compile(spec).ptx, spec.target)[1]
    assert ptxas.spill_stores(report) == 0, report
