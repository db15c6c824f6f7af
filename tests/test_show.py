"""Fragment maps as text grids and PNG pictures (tilegen.show)."""
import struct

import pytest

from tilegen import SpecError
from tilegen.arch import LDMATRIX, MMA_ATOMS
from tilegen.show import (PlotUnavailable, fragment_maps, fragment_png, fragment_text, lane_color, png_size,
                          resolve)

WARP = 32


def parse_text_grids(text: str) -> dict:
    """{operand: {(row, col): (lane, reg, elem)}} read back from fragment_text's output."""
    import re

    grids, lines, i = {}, text.splitlines(), 0
    while i < len(lines):
        m = re.match(r"^\S+, operand ([ABC]): (\d+) x (\d+) ", lines[i]) or re.match(r"^(\S+): (\d+) x (\d+),", lines[i])
        if not m:
            i += 1
            continue
        op, rows, cols = m.group(1), int(m.group(2)), int(m.group(3))
        assert lines[i + 1].startswith("cell: T<lane>:r<register>")
        head = lines[i + 2].split()
        assert head[1:] == [str(c) for c in range(cols)]
        cells = {}
        for r in range(rows):
            parts = lines[i + 3 + r].split()
            assert parts[0] == str(r) and len(parts) == cols + 1
            for c, cell in enumerate(parts[1:]):
                m2 = re.fullmatch(r"T(\d+):r(\d+)(?:\.(\d+))?", cell)
                assert m2, cell
                cells[(r, c)] = (int(m2.group(1)), int(m2.group(2)), int(m2.group(3) or 0))
        grids[op] = cells
        i += 3 + rows
    return grids


def _isa_m16n8k16_f16():
    """The PTX ISA's m16n8k16 .f16 layouts (ptx.md 2.2), written out here on their own."""
    a, b, c = {}, {}, {}
    for lane in range(WARP):
        g, t = lane >> 2, lane & 3
        for i in range(8):   # a_i: row g + 8 * ((i >> 1) & 1), col 2t + (i & 1) + 8 * (i >> 2)
            a[(g + 8 * ((i >> 1) & 1), 2 * t + (i & 1) + 8 * (i >> 2))] = (lane, i // 2, i % 2)
        for i in range(4):   # b_i: row 2t + (i & 1) + 8 * (i >> 1), col g
            b[(2 * t + (i & 1) + 8 * (i >> 1), g)] = (lane, i // 2, i % 2)
        for i in range(4):   # c_i: row g + 8 * (i >> 1), col 2t + (i & 1)
            c[(g + 8 * (i >> 1), 2 * t + (i & 1))] = (lane, i, 0)
    return {"A": a, "B": b, "C": c}


def test_text_grid_matches_the_isa_for_f16():
    text = fragment_text("m16n8k16.f16.f32")
    assert text.splitlines()[0] == "m16n8k16.f16.f32: mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
    assert parse_text_grids(text) == _isa_m16n8k16_f16()


def test_text_grid_of_one_operand():
    text = fragment_text("f16", "B")
    grids = parse_text_grids(text)
    assert set(grids) == {"B"} and grids["B"] == _isa_m16n8k16_f16()["B"]
    assert "operand B: 16 x 8 (K x N), 2 registers per lane (2 f16 each)" in text


@pytest.mark.parametrize("name", sorted(MMA_ATOMS))
def test_text_grid_of_every_atom_is_its_table(name):
    atom = MMA_ATOMS[name]
    grids = parse_text_grids(fragment_text(name))
    for op in "ABC":
        fmap = getattr(atom, op.lower())
        assert grids[op] == fmap.owners()
        assert len(grids[op]) == fmap.rows * fmap.cols


def test_text_grid_of_an_ldmatrix_variant():
    op = LDMATRIX[(4, True)]
    grids = parse_text_grids(fragment_text("ldmatrix.x4.trans"))
    assert grids == {"ldmatrix.x4.trans": op.fragment.owners()}


def test_unpacked_registers_have_no_element():
    text = fragment_text("tf32", "A")
    assert " T0:r0 " in text and "T0:r0." not in text


@pytest.mark.parametrize("atom,operand,match", [
    ("m16n8k99.f16.f32", None, "atom='m16n8k99.f16.f32' is invalid; allowed: m16n8k8.tf32.f32"),
    ("f16", "D", "operand='D' is invalid; allowed: A, B, C"),
    ("ldmatrix.x1", "A", "operand='A' is invalid: ldmatrix.x1 has one map"),
])
def test_bad_names_are_spec_errors(atom, operand, match):
    with pytest.raises(SpecError, match=match):
        fragment_text(atom, operand)


def test_dtype_names_pick_the_specs_atom():
    assert resolve("bf16") is MMA_ATOMS["m16n8k16.bf16.f32"]
    assert resolve("tf32") is MMA_ATOMS["m16n8k8.tf32.f32"]


def test_lane_colours_are_distinct():
    colours = {tuple(round(x, 4) for x in lane_color(lane)) for lane in range(WARP)}
    assert len(colours) == WARP


def test_missing_matplotlib_names_the_extra(monkeypatch, tmp_path):
    import sys

    for mod in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg", "matplotlib.patches"):
        monkeypatch.setitem(sys.modules, mod, None)  # import fails as if not installed
    with pytest.raises(PlotUnavailable, match=r"pip install 'tilegen\[plot\]'"):
        fragment_png("f16", None, tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


def _png_header(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


@pytest.mark.parametrize("atom,operand", [("m16n8k16.f16.f32", None), ("m16n8k8.tf32.f32", "A"),
                                          ("m16n8k32.e4m3.f32", "B"), ("ldmatrix.x2", None)])
def test_png_has_the_promised_size_and_colours_cells_by_lane(tmp_path, atom, operand):
    pytest.importorskip("matplotlib")
    import matplotlib.image as mpimg
    import numpy as np

    from tilegen import show

    path = tmp_path / "frag.png"
    size = fragment_png(atom, operand, path)
    assert path.exists() and _png_header(path) == size == png_size(atom, operand)
    maps = fragment_maps(atom, operand)
    width_in = sum(f.cols for _, f in maps) * show.CELL_W
    assert size[0] >= width_in * show.DPI and size[1] >= max(f.rows for _, f in maps) * show.CELL_H * show.DPI
    # Sample each cell near its top-left corner (clear of the text): the lane's colour.
    img = mpimg.imread(str(path))[..., :3]
    w_in, h_in, boxes = show._layout(maps)
    for (_, fmap), (left, bottom, w, h) in zip(maps, boxes):
        top = h_in - bottom - h
        for (row, col), (lane, _, _) in fmap.owners().items():
            x = (left + (col + 0.12) * show.CELL_W) * show.DPI
            y = (top + (row + 0.12) * show.CELL_H) * show.DPI
            got = img[int(y), int(x)]
            assert np.allclose(got, lane_color(lane), atol=0.02), (fmap.name, row, col, lane, got)
