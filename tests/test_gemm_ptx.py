"""The generated GEMM's PTX: assembles everywhere, deterministic, golden copies."""
import os
import pathlib
import re

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import tilegen
from ptxas_util import assert_assembles, needs_ptxas

GOLDEN = pathlib.Path(__file__).parent / "data" / "golden"
GOLDEN_SPECS = {
    "gemm_tf32_default.ptx": tilegen.GemmSpec(dtype="tf32"),
    "gemm_f16_default.ptx": tilegen.GemmSpec(dtype="f16"),
    "gemm_bf16_64x64x32_s2.ptx": tilegen.GemmSpec(dtype="bf16", tile=(64, 64, 32), warps=(2, 2), stages=2),
}


@needs_ptxas
@pytest.mark.parametrize("dtype", ["tf32", "f16", "bf16"])
@pytest.mark.parametrize("arch", ["sm_80", "sm_86", "sm_89", "sm_90"])
def test_default_gemm_assembles(dtype, arch):
    k = tilegen.compile(tilegen.GemmSpec(dtype=dtype))
    assert_assembles(k.ptx, arch)


@st.composite
def gemm_specs(draw):
    dtype = draw(st.sampled_from(["tf32", "f16", "bf16"]))
    warps = draw(st.sampled_from([(1, 1), (2, 1), (1, 2), (2, 2), (4, 2), (2, 4)]))
    tm = draw(st.sampled_from([16, 32, 64]))
    tn = draw(st.sampled_from([16, 32, 64]))
    tk = draw(st.sampled_from([16, 32, 64] if dtype != "tf32" else [8, 16, 32]))
    stages = draw(st.integers(2, 5))
    target = draw(st.sampled_from(["sm_80", "sm_86", "sm_89", "sm_90"]))
    layouts = draw(st.sampled_from([("row", "row"), ("row", "col"), ("col", "row"), ("col", "col")]))
    swizzle = draw(st.sampled_from(["auto", "128B", "64B", "32B", "pad", "none"]))
    out = draw(st.sampled_from(["f32", "f16", "bf16"]))
    try:
        return tilegen.GemmSpec(dtype=dtype, tile=(tm * warps[0], tn * warps[1], tk), warps=warps,
                                stages=stages, target=target, a_layout=layouts[0], b_layout=layouts[1],
                                swizzle=swizzle, out_dtype=out)
    except tilegen.SpecError:
        assume(False)


@needs_ptxas
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(gemm_specs())
def test_drawn_specs_assemble(spec):
    k = tilegen.compile(spec)
    assert_assembles(k.ptx, spec.target)


def test_ptx_is_deterministic():
    spec = tilegen.GemmSpec(dtype="bf16", stages=4)
    assert tilegen.compile(spec).ptx == tilegen.compile(tilegen.GemmSpec(dtype="bf16", stages=4)).ptx


def test_header_and_annotations():
    ptx = tilegen.compile(tilegen.GemmSpec(dtype="tf32")).ptx
    assert re.search(r"^\.version 7\.0$", ptx, re.M)
    assert re.search(r"^\.target sm_80$", ptx, re.M)
    assert ".address_size 64" in ptx
    assert "cvt.rna.tf32.f32" in ptx
    assert "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in ptx
    # comments name the k-step, fragment and the kernel source line they come from
    assert re.search(r"// k-step 0: fragment a0 \(mma_sync\.py:\d+\)", ptx)
    assert "prologue: stage 0 of A" in ptx


def _without_source_lines(ptx: str) -> str:
    """Golden copies guard the code, not where the template's lines happen to sit."""
    return re.sub(r"\((\w+\.py):\d+\)", r"(\1:N)", ptx)


@pytest.mark.parametrize("name", sorted(GOLDEN_SPECS))
def test_golden_ptx(name):
    ptx = _without_source_lines(tilegen.compile(GOLDEN_SPECS[name]).ptx)
    path = GOLDEN / name
    if os.environ.get("TILEGEN_UPDATE_GOLDEN"):
        path.write_text(ptx)
    assert path.exists(), f"missing golden file {path}; run with TILEGEN_UPDATE_GOLDEN=1"
    assert ptx == path.read_text(), f"PTX of {name} changed; if intended, rerun with TILEGEN_UPDATE_GOLDEN=1"


@needs_ptxas
@pytest.mark.parametrize("kw", [dict(dtype="f16", tile=(64, 64, 32), a_layout="col", epilogue=tilegen.Epilogue(residual=True)),
                                dict(dtype="bf16", instruction="wgmma", tile=(128, 256, 64), b_layout="col"),
                                dict(dtype="tf32", instruction="wgmma", tile=(128, 128, 32), b_layout="col")])
def test_batched_specs_assemble(kw):
    """A stack's kernel (GemmSpec.batched): each tensor's base moves by its batch stride times the
    grid row (one mad.wide per tensor)."""
    k = tilegen.compile(tilegen.GemmSpec(batched=True, **kw))
    assert_assembles(k.ptx, k.spec.target)
    assert {"A_batch_stride", "B_batch_stride", "C_batch_stride"} <= {n for n, _ in k.params}
    assert "%ctaid.y" in k.ptx and k.ptx.count("mad.wide.u32") >= 3


@needs_ptxas
@pytest.mark.parametrize("a_layout, b_layout", [("row", "row"), ("row", "col"), ("col", "row")])
def test_tma_stack_specs_assemble(a_layout, b_layout):
    """A batched spec on the warp-specialized TMA kernel (template.TmaStack): a 3-D tensor map of
    each stack (cp.async.bulk.tensor.3d, the stack's count and stride in each map), one
    persistent walk over every block of every matrix."""
    k = tilegen.compile(tilegen.GemmSpec(dtype="bf16", instruction="wgmma", batched=True, copy="tma",
                                         a_layout=a_layout, b_layout=b_layout))
    assert_assembles(k.ptx, k.spec.target)
    assert {m.tensor: (m.rank, m.batch_stride, m.batches) for m in k.tensor_maps} == {
        t: (3, f"{t}_batch_stride", "BATCH") for t in "ABC"}
    assert "cp.async.bulk.tensor.3d" in k.ptx and "cp.async.bulk.tensor.2d" not in k.ptx and "%ctaid.y" not in k.ptx


@needs_ptxas
def test_split_k_tma_stack_specs_assemble():
    """split_k on the TMA stack kernel: 3-D maps of A and B only (C is stored directly, by the
    last slice to finish each block), the slice from %ctaid.y, f32 partial sums stored directly
    into the workspace stack, each block's arrival counted at F (one thread's acq_rel atomic
    between the role's barrier and its reduction), in one kernel."""
    k = tilegen.compile(tilegen.GemmSpec(dtype="bf16", instruction="wgmma", batched=True, copy="tma", split_k=4,
                                         tile=(64, 128, 64), warps=(4, 1), epilogue=tilegen.Epilogue("col", "gelu")))
    assert_assembles(k.ptx, k.spec.target)
    assert k.spec.persistent and k.spec.store == "direct" and "_splitk4_batched" in k.name
    assert {m.tensor for m in k.tensor_maps} == {"A", "B"} and "%ctaid.y" in k.ptx
    assert {"W_ptr", "W_batch_stride", "F_ptr", "C_ptr", "C_batch_stride", "bias_ptr", "K", "BATCH"} <= \
        {n for n, _ in k.params}
    math = k.ptx[k.ptx.index("// role math"):]
    counted = math.index("atom.acq_rel.gpu.global.add.u32")
    assert math.rindex("bar.sync 2, 128;", 0, counted) < counted < math.index("bar.red.or.pred %p", counted)


def test_kernels_of_different_ptx_have_different_names():
    """acc_dtype and group_m change the PTX, so they are in the name where not the default (an f16
    accumulator's kernel had the f32 one's name: two different kernels of one name in profiles)."""
    from tilegen.gemm.template import gemm_kernel_name

    base = tilegen.GemmSpec(dtype="f16", tile=(64, 64, 32), warps=(2, 2))
    names = {gemm_kernel_name(s) for s in (base, base.replace(acc_dtype="f16"), base.replace(group_m=16))}
    assert len(names) == 3 and gemm_kernel_name(base) == "tilegen_gemm_f16_rr_f32_64x64x32_w2x2_s3_64B_fb2"
