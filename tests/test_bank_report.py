"""The bank-conflict report of generated GEMMs (tile-level IR, tilegen.arch bank model)."""
import pytest

import tilegen


def _rows(**kw):
    return tilegen.compile(tilegen.GemmSpec(**kw)).bank_conflicts


@pytest.mark.parametrize("kw", [dict(dtype="f16"), dict(dtype="bf16", a_layout="col", b_layout="col"),
                                dict(dtype="tf32", b_layout="col"), dict(dtype="f16", swizzle="pad"),
                                dict(dtype="f16", tile=(128, 128, 32))])
def test_swizzled_or_padded_tiles_are_conflict_free(kw):
    rows = _rows(**kw)
    kinds = {r.what.split()[0] for r in rows}
    assert {"cp.async", "ldmatrix.x4"} <= kinds or {"cp.async", "ldmatrix.x4.trans"} <= kinds
    assert all(r.wavefronts == r.ideal for r in rows), tilegen.compile(tilegen.GemmSpec(**kw)).bank_report()


def test_unswizzled_128_byte_rows_conflict_8_ways():
    rows = _rows(dtype="f16", swizzle="none")
    ld = [r for r in rows if r.what.startswith("ldmatrix")]
    assert ld and all(r.wavefronts == 32 and r.ideal == 4 for r in ld)


def test_tf32_mn_major_scalar_loads_are_reported():
    rows = _rows(dtype="tf32", a_layout="col", swizzle="none")
    scalar = [r for r in rows if r.what.startswith("ld.shared.b32")]
    assert scalar and all(r.wavefronts == 4 for r in scalar)  # 4 k-rows of 128 B: one bank per column pair


def test_report_text_names_source_lines():
    text = tilegen.compile(tilegen.GemmSpec(dtype="f16")).bank_report()
    assert "mma_sync.py:" in text and "wavefronts" in text
