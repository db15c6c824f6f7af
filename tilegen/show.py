"""Fragment maps as pictures: which lane holds which element of an mma operand, in which
register (`tilegen show`).

    fragment_text("m16n8k16.f16.f32", "A")      # a text grid, one cell per element
    fragment_png("m16n8k16.f16.f32", None, "frag.png")   # A, B and C side by side

Each cell names the lane and the register holding it: T<lane>:r<register>.<element> in the
text (the element within a packed register, 0 = low bits, only for packed types), and
"T<lane>" over "r<register>.<element>" in the picture, whose cells are coloured by lane:
the hue follows the lane's group (lane >> 2, the row group of the ISA's tables) and the
shade its place in the group (lane & 3). The maps are tilegen.arch's tables, the ones the
code generator uses. PNGs need matplotlib (`pip install 'tilegen[plot]'`).
"""
from __future__ import annotations

import colorsys

from .arch.fragments import WARP, FragmentMap
from .arch.ldmatrix import LDMATRIX, STMATRIX
from .arch.mma import DEFAULT_ATOM, MMA_ATOMS, MmaAtom
from .errors import SpecError, TilegenError

OPERANDS = ("A", "B", "C")
# The picture's geometry, in inches (at DPI pixels per inch): fixed, so its size is known.
DPI = 120
CELL_W, CELL_H = 0.52, 0.42
MARGIN_L, MARGIN_R, MARGIN_T, MARGIN_B, GAP = 0.45, 0.2, 0.95, 0.2, 0.55


class PlotUnavailable(TilegenError, ImportError):
    """matplotlib is not installed."""


def _matrix_ops() -> dict:
    return {op.fragment.name: op.fragment for table in (LDMATRIX, STMATRIX) for op in table.values()}


def resolve(atom):
    """An MmaAtom or a FragmentMap from what a user names: an atom ("m16n8k16.f16.f32"), an
    operand dtype ("f16": the atom a GemmSpec of that dtype uses), or an ldmatrix/stmatrix
    variant ("ldmatrix.x4.trans")."""
    if isinstance(atom, (MmaAtom, FragmentMap)):
        return atom
    if isinstance(atom, str):
        if atom in MMA_ATOMS:
            return MMA_ATOMS[atom]
        if (atom, "f32") in DEFAULT_ATOM:
            return MMA_ATOMS[DEFAULT_ATOM[(atom, "f32")]]
        ops = _matrix_ops()
        if atom in ops:
            return ops[atom]
    allowed = list(MMA_ATOMS) + sorted({d for d, _ in DEFAULT_ATOM}) + list(_matrix_ops())
    raise SpecError("atom", atom, ", ".join(allowed))


def fragment_maps(atom, operand=None) -> list[tuple[str, FragmentMap]]:
    """[(operand, map)]: one operand ("A", "B", "C") or, operand None, all three. An
    ldmatrix/stmatrix variant has one map (operand must be None)."""
    x = resolve(atom)
    if isinstance(x, FragmentMap):
        if operand not in (None, "all"):
            raise SpecError("operand", operand, "no operand", f"{x.name} has one map, not one per operand")
        return [("", x)]
    if operand in (None, "all"):
        return [(op, getattr(x, op.lower())) for op in OPERANDS]
    if operand not in OPERANDS:
        raise SpecError("operand", operand, "A, B, C")
    return [(operand, getattr(x, operand.lower()))]


_AXES = {"A": ("m", "k"), "B": ("k", "n"), "C": ("m", "n"), "": ("row", "col")}


def _cell(lane: int, reg: int, elem: int, packed: bool) -> str:
    return f"T{lane}:r{reg}" + (f".{elem}" if packed else "")


def _title(x, op: str, fmap: FragmentMap) -> str:
    rows, cols = _AXES[op]
    if isinstance(x, MmaAtom):
        dt = {"A": x.a_type, "B": x.b_type, "C": x.acc_type}[op].name
        what = f"{x.name}, operand {op}: {fmap.rows} x {fmap.cols} ({rows.upper()} x {cols.upper()})"
    else:
        dt = "b16"
        what = f"{fmap.name}: {fmap.rows} x {fmap.cols}"
    per = f"{fmap.elems} {dt} each" if fmap.elems > 1 else f"one {dt} each"
    return f"{what}, {fmap.regs} register{'s' if fmap.regs > 1 else ''} per lane ({per})"


def fragment_text(atom, operand=None) -> str:
    """The map(s) as text grids: rows and columns of the tile, each cell T<lane>:r<register>
    (.<element> for packed registers: element 0 sits in the low bits)."""
    x = resolve(atom)
    out = []
    if isinstance(x, MmaAtom):
        out.append(f"{x.name}: {x.instruction}")
    for op, fmap in fragment_maps(x, operand):
        owners = fmap.owners()
        packed = fmap.elems > 1
        rows_name, cols_name = _AXES[op]
        cells = [[_cell(*owners[(r, c)], packed) for c in range(fmap.cols)] for r in range(fmap.rows)]
        width = max(len(s) for row in cells for s in row)
        label = max(len(f"{rows_name}={fmap.rows - 1}"), len(f"{rows_name}\\{cols_name}"))
        out.append("")
        out.append(_title(x, op, fmap))
        out.append("cell: T<lane>:r<register>" + (".<element>" if packed else ""))
        out.append(f"{rows_name + chr(92) + cols_name:>{label}} " + " ".join(f"{c:>{width}}" for c in range(fmap.cols)))
        for r, row in enumerate(cells):
            out.append(f"{r:>{label}} " + " ".join(f"{s:>{width}}" for s in row))
    return "\n".join(out) + "\n"


def lane_color(lane: int) -> tuple[float, float, float]:
    """RGB of a lane: hue by group (lane >> 2), shade by thread in group (lane & 3)."""
    g, t = lane >> 2, lane & 3
    hue = (g * 3 % 8) / 8.0  # neighbouring groups get distant hues
    return colorsys.hls_to_rgb(hue, 0.82 - 0.09 * t, 0.75)


def _layout(maps) -> tuple[float, float, list]:
    """(width, height) in inches and each panel's (left, bottom, width, height)."""
    rows = max(f.rows for _, f in maps)
    width = MARGIN_L + MARGIN_R + sum(f.cols * CELL_W for _, f in maps) + GAP * (len(maps) - 1)
    height = MARGIN_T + MARGIN_B + rows * CELL_H
    boxes, x = [], MARGIN_L
    for _, f in maps:
        h = f.rows * CELL_H
        boxes.append((x, height - MARGIN_T - h, f.cols * CELL_W, h))
        x += f.cols * CELL_W + GAP
    return width, height, boxes


def png_size(atom, operand=None, dpi: int = DPI) -> tuple[int, int]:
    """(width, height) in pixels of the picture fragment_png writes."""
    w, h, _ = _layout(fragment_maps(atom, operand))
    return round(w * dpi), round(h * dpi)


def _figsize(width: float, height: float, dpi: int) -> tuple[float, float]:
    # matplotlib truncates figsize * dpi to whole pixels: aim half a pixel above the size
    # png_size promises, so float rounding cannot lose one.
    return (round(width * dpi) + 0.5) / dpi, (round(height * dpi) + 0.5) / dpi


def _matplotlib():
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.patches import Rectangle
    except ImportError:
        raise PlotUnavailable("fragment pictures need matplotlib: pip install 'tilegen[plot]' "
                              "(or pip install matplotlib)") from None
    return Figure, FigureCanvasAgg, Rectangle


def fragment_png(atom, operand, path, dpi: int = DPI) -> tuple[int, int]:
    """Write the map(s) as a PNG: a grid per operand (all three when operand is None),
    each cell coloured by lane and labelled "T<lane>" / "r<register>[.<element>]".
    Returns the picture's (width, height) in pixels (png_size)."""
    Figure, FigureCanvasAgg, Rectangle = _matplotlib()
    x = resolve(atom)
    maps = fragment_maps(x, operand)
    width, height, boxes = _layout(maps)
    fig = Figure(figsize=_figsize(width, height, dpi), dpi=dpi)
    FigureCanvasAgg(fig)
    head = f"{x.name}: {x.instruction}" if isinstance(x, MmaAtom) else maps[0][1].name
    fig.text(0.5, 1 - 0.22 / height, head, ha="center", va="top", fontsize=10, family="monospace")
    fig.text(0.5, 1 - 0.45 / height, "cell: T<lane> over r<register>" + (".<element>" if any(f.elems > 1 for _, f in maps)
                                                                         else "") + "; colour by lane",
             ha="center", va="top", fontsize=8, color="0.3")
    for (op, fmap), (left, bottom, w, h) in zip(maps, boxes):
        ax = fig.add_axes((left / width, bottom / height, w / width, h / height))
        ax.set_xlim(0, fmap.cols)
        ax.set_ylim(fmap.rows, 0)
        packed = fmap.elems > 1
        for lane in range(WARP):
            for r in range(fmap.regs):
                for e in range(fmap.elems):
                    row, col = fmap.coord(lane, r, e)
                    ax.add_patch(Rectangle((col, row), 1, 1, facecolor=lane_color(lane), edgecolor="white", lw=0.8))
                    ax.text(col + 0.5, row + 0.5, f"T{lane}\nr{r}" + (f".{e}" if packed else ""),
                            ha="center", va="center", fontsize=8, linespacing=1.15)
        rows_name, cols_name = _AXES[op]
        ax.set_xticks([c + 0.5 for c in range(fmap.cols)], [str(c) for c in range(fmap.cols)], fontsize=6.5)
        ax.set_yticks([r + 0.5 for r in range(fmap.rows)], [str(r) for r in range(fmap.rows)], fontsize=6.5)
        ax.xaxis.tick_top()
        ax.tick_params(length=0, pad=2)
        for s in ax.spines.values():
            s.set_visible(False)
        name = f"{op} ({rows_name} x {cols_name}, {fmap.rows} x {fmap.cols})" if op else f"{fmap.rows} x {fmap.cols}"
        ax.set_title(name, fontsize=9, pad=14)
    fig.savefig(path, dpi=dpi, format="png")
    return png_size(x, operand, dpi)


__all__ = ["fragment_text", "fragment_png", "fragment_maps", "png_size", "resolve", "lane_color",
           "PlotUnavailable"]
