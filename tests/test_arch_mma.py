"""mma.sync atoms of tilegen.arch against the PTX ISA (ptx.md sections 1.3 and 2).

Three independent checks of every fragment map:
  1. it is a bijection onto its tile (numpy/sets, not FragmentMap.is_bijection);
  2. it equals the ISA tables, written out below on their own by ISA *element* number and
     converted to registers with the ISA packing rule (lower element in the low bits);
  3. a numpy warp executing the mma: the "hardware" reads its operands from the registers
     where the ISA says they are, while the data was distributed (and D is collected) with
     tilegen's maps. Any lane/register/element mistake in a tilegen map changes the result.
"""
from __future__ import annotations

import dataclasses
import functools

import ml_dtypes
import numpy as np
import pytest

from tilegen.arch import MMA_ATOMS, atoms_for, mma_atom
from tilegen.arch.fragments import FragmentMap

WARP = 32

# ---------------------------------------------------------------------------------------------
# What each atom must be (ptx.md 1.3 and 2): operand types, spelling, min target / PTX.
# ---------------------------------------------------------------------------------------------

EXPECTED = {
    # name: (k, a, b, acc, instruction, min_sm, min_ptx)
    "m16n8k8.tf32.f32": (8, "tf32", "tf32", "f32",
                         "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32", 80, (7, 0)),
    "m16n8k4.tf32.f32": (4, "tf32", "tf32", "f32",
                         "mma.sync.aligned.m16n8k4.row.col.f32.tf32.tf32.f32", 80, (7, 0)),
    "m16n8k16.f16.f32": (16, "f16", "f16", "f32",
                         "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", 80, (7, 0)),
    "m16n8k16.bf16.f32": (16, "bf16", "bf16", "f32",
                          "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", 80, (7, 0)),
    "m16n8k8.f16.f32": (8, "f16", "f16", "f32",
                        "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32", 80, (7, 0)),
    "m16n8k8.bf16.f32": (8, "bf16", "bf16", "f32",
                         "mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32", 80, (7, 0)),
    "m16n8k16.f16.f16": (16, "f16", "f16", "f16",
                         "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16", 80, (7, 0)),
    "m16n8k32.e4m3.f32": (32, "e4m3", "e4m3", "f32",
                          "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32", 89, (8, 4)),
    "m16n8k32.e5m2.f32": (32, "e5m2", "e5m2", "f32",
                          "mma.sync.aligned.m16n8k32.row.col.f32.e5m2.e5m2.f32", 89, (8, 4)),
    "m16n8k32.e4m3.e5m2.f32": (32, "e4m3", "e5m2", "f32",
                               "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e5m2.f32", 89, (8, 4)),
    "m16n8k32.e5m2.e4m3.f32": (32, "e5m2", "e4m3", "f32",
                               "mma.sync.aligned.m16n8k32.row.col.f32.e5m2.e4m3.f32", 89, (8, 4)),
}

BITS = {"tf32": 32, "f32": 32, "f16": 16, "bf16": 16, "e4m3": 8, "e5m2": 8}

ALL_ATOMS = sorted(MMA_ATOMS)


# ---------------------------------------------------------------------------------------------
# The ISA tables, by element number (ptx.md 2.1-2.5). g = lane >> 2, t = lane & 3.
# Each entry: element i -> (row, col). B tiles are K x N, so (row, col) = (k, n).
# ---------------------------------------------------------------------------------------------

def _isa_a(kind: str, g: int, t: int) -> list[tuple[int, int]]:
    if kind == "tf32.k8":   # 2.2: a0 (g,t)  a1 (g+8,t)  a2 (g,t+4)  a3 (g+8,t+4)
        return [(g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4)]
    if kind == "tf32.k4":   # 2.3: a0 (g,t)  a1 (g+8,t)
        return [(g, t), (g + 8, t)]
    if kind == "b16.k16":   # 2.4 table: a0,a1 g / a2,a3 g+8 at 2t..; a4..a7 the same at 2t+8..
        return [(g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1),
                (g, 2 * t + 8), (g, 2 * t + 9), (g + 8, 2 * t + 8), (g + 8, 2 * t + 9)]
    if kind == "b16.k8":    # 2.2 note: a0,a1 = (g, 2t+{0,1}); a2,a3 = (g+8, 2t+{0,1})
        return [(g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1)]
    if kind == "b8.k32":    # 2.5 table, four elements per row segment
        out = []
        for rows, k0 in ((g, 0), (g + 8, 0), (g, 16), (g + 8, 16)):
            out += [(rows, 4 * t + k0 + j) for j in range(4)]
        return out
    raise KeyError(kind)


def _isa_b(kind: str, g: int, t: int) -> list[tuple[int, int]]:
    if kind == "tf32.k8":   # b0 = B[t][g], b1 = B[t+4][g]
        return [(t, g), (t + 4, g)]
    if kind == "tf32.k4":   # b0 = B[t][g]
        return [(t, g)]
    if kind == "b16.k16":   # b0,b1 = B[2t,2t+1][g]; b2,b3 = B[2t+8,2t+9][g]
        return [(2 * t, g), (2 * t + 1, g), (2 * t + 8, g), (2 * t + 9, g)]
    if kind == "b16.k8":    # b0,b1 = B[2t+{0,1}][g]
        return [(2 * t, g), (2 * t + 1, g)]
    if kind == "b8.k32":    # b0..b3 = B[4t..4t+3][g]; b4..b7 = B[4t+16..4t+19][g]
        return [(4 * t + j, g) for j in range(4)] + [(4 * t + 16 + j, g) for j in range(4)]
    raise KeyError(kind)


def _isa_c(g: int, t: int) -> list[tuple[int, int]]:
    # 2.1: c0 (g,2t)  c1 (g,2t+1)  c2 (g+8,2t)  c3 (g+8,2t+1)
    return [(g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1)]


def _kind(k: int, type_name: str) -> str:
    bits = BITS[type_name]
    return {32: "tf32", 16: "b16", 8: "b8"}[bits] + f".k{k}"


@dataclasses.dataclass(frozen=True)
class IsaMap:
    """(lane, register, position-in-register) -> (row, col), from the ISA element tables."""
    rows: int
    cols: int
    regs: int
    per_reg: int
    coords: dict

    def inverse(self) -> dict:
        return {rc: key for key, rc in self.coords.items()}


def _to_registers(rows, cols, bits, elements_of_lane) -> IsaMap:
    """ISA packing: element i of a lane sits in register i // (32/bits), position i % (32/bits)."""
    per = 32 // bits
    coords = {}
    n = None
    for lane in range(WARP):
        elems = elements_of_lane(lane >> 2, lane & 3)
        n = len(elems)
        for i, rc in enumerate(elems):
            coords[(lane, i // per, i % per)] = rc
    return IsaMap(rows, cols, n // per, per, coords)


@functools.lru_cache(maxsize=None)
def isa_maps(name: str) -> tuple[IsaMap, IsaMap, IsaMap]:
    k, a, b, acc = EXPECTED[name][:4]
    A = _to_registers(16, k, BITS[a], lambda g, t: _isa_a(_kind(k, a), g, t))
    B = _to_registers(k, 8, BITS[b], lambda g, t: _isa_b(_kind(k, b), g, t))
    C = _to_registers(16, 8, BITS[acc], _isa_c)
    return A, B, C


# ---------------------------------------------------------------------------------------------
# Element encodings (the bits a register holds) and a numpy warp executing one mma.
# ---------------------------------------------------------------------------------------------

_NP = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "e4m3": ml_dtypes.float8_e4m3fn,
       "e5m2": ml_dtypes.float8_e5m2, "f32": np.float32, "tf32": np.float32}
_UINT = {8: np.uint8, 16: np.uint16, 32: np.uint32}


def encode(type_name: str, values: np.ndarray) -> np.ndarray:
    """Bit patterns (as uint64) of `values` in `type_name`; asserts the values are exact."""
    bits = BITS[type_name]
    x = np.asarray(values, np.float64).astype(_NP[type_name])
    assert np.array_equal(x.astype(np.float64), values), f"{values} not exact in {type_name}"
    u = x.view(_UINT[bits]).astype(np.uint64)
    if type_name == "tf32":
        assert not np.any(u & 0x1FFF), "tf32 values must have the low 13 mantissa bits clear"
    return u


def decode(type_name: str, u: np.ndarray) -> np.ndarray:
    bits = BITS[type_name]
    return np.asarray(u).astype(_UINT[bits]).view(_NP[type_name]).astype(np.float64)


def _field(regs: np.ndarray, pos, bits: int) -> np.ndarray:
    return (regs.astype(np.uint64) >> (np.asarray(pos, np.uint64) * np.uint64(bits))) & np.uint64((1 << bits) - 1)


def distribute(fmap: FragmentMap, tile: np.ndarray, type_name: str) -> np.ndarray:
    """What a generator does with tilegen's map: fill each lane's 32-bit registers."""
    bits = BITS[type_name]
    tab = np.array(fmap.coords, np.int64)          # (32, regs, elems, 2)
    assert tab.shape == (WARP, fmap.regs, fmap.elems, 2)
    enc = encode(type_name, tile[tab[..., 0], tab[..., 1]])
    regs = np.zeros((WARP, fmap.regs), np.uint64)
    for e in range(fmap.elems):
        regs |= enc[:, :, e] << np.uint64(e * bits)
    assert np.all(regs < (1 << 32))
    return regs


def collect(fmap: FragmentMap, regs: np.ndarray, type_name: str) -> np.ndarray:
    """Read a tile back out of registers with tilegen's map."""
    bits = BITS[type_name]
    out = np.full((fmap.rows, fmap.cols), np.nan)
    for lane in range(WARP):
        for r in range(fmap.regs):
            for e in range(fmap.elems):
                row, col = fmap.coords[lane][r][e]
                assert np.isnan(out[row, col]), f"({row},{col}) written twice"
                out[row, col] = decode(type_name, _field(regs[lane, r], e, bits))
    return out


def _gather(m: IsaMap, regs: np.ndarray, type_name: str) -> np.ndarray:
    """The tile as the hardware sees it: element (row, col) is read from the lane, register
    and position that the ISA table `m` names for it."""
    inv = m.inverse()
    keys = np.array([[inv[(r, c)] for c in range(m.cols)] for r in range(m.rows)], np.int64)
    lanes, reg, pos = keys[..., 0], keys[..., 1], keys[..., 2]
    return decode(type_name, _field(regs[lanes, reg], pos, BITS[type_name]))


def warp_mma(name: str, ra: np.ndarray, rb: np.ndarray, rc: np.ndarray) -> np.ndarray:
    """The hardware: D = A B + C, operands read from the registers the ISA names.

    For each D register (lane, reg, pos) the ISA C table gives (row, col); the values
    A[row][k] and B[k][col] are fetched, for every k, from the lane/register/position that
    holds them according to the ISA A/B tables; D is written where the ISA C table says.
    """
    k, a, b, acc = EXPECTED[name][:4]
    A, B, C = isa_maps(name)
    a_seen, b_seen, c_seen = _gather(A, ra, a), _gather(B, rb, b), _gather(C, rc, acc)
    rd = np.zeros((WARP, C.regs), np.uint64)
    for (lane, reg, pos), (row, col) in C.coords.items():
        total = c_seen[row, col] + np.dot(a_seen[row, :], b_seen[:, col])
        rd[lane, reg] |= encode(acc, np.array(total)) << np.uint64(pos * BITS[acc])
    return rd


def _random_problem(name: str, seed: int):
    k = EXPECTED[name][0]
    rng = np.random.default_rng(seed)
    A = rng.integers(-4, 5, size=(16, k)).astype(np.float64)
    B = rng.integers(-4, 5, size=(k, 8)).astype(np.float64)
    C = rng.integers(-8, 9, size=(16, 8)).astype(np.float64)
    return A, B, C


def run_with_maps(name: str, amap, bmap, cmap, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Distribute with the given maps, run the ISA warp, collect D with cmap: (got, want)."""
    k, a, b, acc = EXPECTED[name][:4]
    A, B, C = _random_problem(name, seed)
    rd = warp_mma(name, distribute(amap, A, a), distribute(bmap, B, b), distribute(cmap, C, acc))
    got = collect(cmap, rd, acc)
    want = A.astype(np.int64) @ B.astype(np.int64) + C.astype(np.int64)
    return got, want


# ---------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------

def test_every_expected_atom_exists():
    missing = set(EXPECTED) - set(MMA_ATOMS)
    assert not missing, f"atoms missing from MMA_ATOMS: {missing}"


@pytest.mark.parametrize("name", ALL_ATOMS)
def test_every_atom_has_an_isa_table(name):
    # A new atom must come with its ISA table here, or none of the checks below cover it.
    assert name in EXPECTED, f"no ISA table written for atom {name}"


@pytest.mark.parametrize("name", ALL_ATOMS)
def test_atom_shape_types_and_spelling(name):
    atom = MMA_ATOMS[name]
    k, a, b, acc, instr, min_sm, min_ptx = EXPECTED[name]
    assert atom.name == name
    assert (atom.m, atom.n, atom.k) == (16, 8, k)
    assert (atom.a_type.name, atom.b_type.name, atom.acc_type.name) == (a, b, acc)
    assert (atom.a_type.bits, atom.b_type.bits, atom.acc_type.bits) == (BITS[a], BITS[b], BITS[acc])
    assert atom.instruction == instr
    assert atom.min_sm == min_sm
    assert tuple(atom.min_ptx) == min_ptx
    assert atom.flops == 2 * 16 * 8 * k


@pytest.mark.parametrize("name", ALL_ATOMS)
@pytest.mark.parametrize("operand", ["a", "b", "c"])
def test_fragment_map_is_bijection_onto_tile(name, operand):
    atom = MMA_ATOMS[name]
    k = EXPECTED[name][0]
    fmap = getattr(atom, operand)
    rows, cols = {"a": (16, k), "b": (k, 8), "c": (16, 8)}[operand]
    assert (fmap.rows, fmap.cols) == (rows, cols)
    tab = np.array(fmap.coords, np.int64)
    assert tab.shape == (WARP, fmap.regs, fmap.elems, 2)
    # registers are 32 bits: elements per register x element bits == 32
    bits = BITS[{"a": atom.a_type, "b": atom.b_type, "c": atom.acc_type}[operand].name]
    assert fmap.elems * bits == 32
    flat = tab.reshape(-1, 2)
    assert flat[:, 0].min() >= 0 and flat[:, 0].max() < rows
    assert flat[:, 1].min() >= 0 and flat[:, 1].max() < cols
    assert len(flat) == rows * cols                       # as many slots as elements
    assert len({tuple(x) for x in flat}) == rows * cols  # and each element exactly once
    counts = np.zeros((rows, cols), np.int64)
    np.add.at(counts, (flat[:, 0], flat[:, 1]), 1)
    assert np.all(counts == 1)
    assert fmap.is_bijection()


@pytest.mark.parametrize("name", ALL_ATOMS)
@pytest.mark.parametrize("operand", ["a", "b", "c"])
def test_fragment_map_equals_isa_table(name, operand):
    fmap = getattr(MMA_ATOMS[name], operand)
    isa = dict(zip("abc", isa_maps(name)))[operand]
    assert (fmap.rows, fmap.cols, fmap.regs, fmap.elems) == (isa.rows, isa.cols, isa.regs, isa.per_reg)
    wrong = [(key, fmap.coord(*key), want) for key, want in sorted(isa.coords.items())
             if fmap.coord(*key) != want]
    assert not wrong, f"{name}.{operand}: (lane, reg, elem) -> tilegen vs ISA: {wrong[:8]}"


def test_isa_tables_are_bijections():
    # Guards the hand-written tables above (a typo there would weaken every other test).
    for name in EXPECTED:
        for m in isa_maps(name):
            vals = list(m.coords.values())
            assert len(vals) == len(set(vals)) == m.rows * m.cols, name
            assert len(m.coords) == WARP * m.regs * m.per_reg


def test_isa_model_reproduces_matmul_with_isa_maps():
    # The warp model alone (data placed by the ISA tables themselves) computes A B + C.
    for name in EXPECTED:
        A, B, C = isa_maps(name)
        as_frag = [FragmentMap("x", m.rows, m.cols, m.regs, m.per_reg,
                               tuple(tuple(tuple(m.coords[(lane, r, e)] for e in range(m.per_reg))
                                           for r in range(m.regs)) for lane in range(WARP)))
                   for m in (A, B, C)]
        got, want = run_with_maps(name, *as_frag, seed=1)
        assert np.array_equal(got, want), name


@pytest.mark.parametrize("name", ALL_ATOMS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_warp_model_with_tilegen_maps_gives_exact_product(name, seed):
    atom = MMA_ATOMS[name]
    got, want = run_with_maps(name, atom.a, atom.b, atom.c, seed)
    assert np.array_equal(got, want), f"{name}: D differs at {np.argwhere(got != want)[:8].tolist()}"


def _swap_lanes(fmap: FragmentMap, l0: int, l1: int) -> FragmentMap:
    coords = list(fmap.coords)
    coords[l0], coords[l1] = coords[l1], coords[l0]
    return dataclasses.replace(fmap, coords=tuple(coords))


def _swap_regs(fmap: FragmentMap, lane: int) -> FragmentMap:
    coords = list(fmap.coords)
    regs = list(coords[lane])
    regs[0], regs[-1] = regs[-1], regs[0]
    coords[lane] = tuple(regs)
    return dataclasses.replace(fmap, coords=tuple(coords))


def _swap_elems(fmap: FragmentMap, lane: int) -> FragmentMap:
    coords = list(fmap.coords)
    regs = list(coords[lane])
    regs[0] = tuple(reversed(regs[0]))
    coords[lane] = tuple(regs)
    return dataclasses.replace(fmap, coords=tuple(coords))


def _mistakes():
    out = []
    for name in ALL_ATOMS:
        for operand in "abc":
            fmap = getattr(MMA_ATOMS[name], operand)
            out.append((name, operand, "lanes"))
            if fmap.regs > 1:
                out.append((name, operand, "regs"))
            if fmap.elems > 1:
                out.append((name, operand, "elems"))
    return out


@pytest.mark.parametrize("name, operand, mistake", _mistakes())
def test_warp_model_detects_a_wrong_map(name, operand, mistake):
    # The harness itself: a swapped map is still a bijection, yet the product must come out wrong.
    atom = MMA_ATOMS[name]
    fmap = getattr(atom, operand)
    bad = {"lanes": lambda: _swap_lanes(fmap, 0, 1), "regs": lambda: _swap_regs(fmap, 5),
           "elems": lambda: _swap_elems(fmap, 5)}[mistake]()
    assert bad.is_bijection() and bad.coords != fmap.coords
    maps = {"a": atom.a, "b": atom.b, "c": atom.c, operand: bad}
    detected = any(not np.array_equal(*run_with_maps(name, maps["a"], maps["b"], maps["c"], seed))
                   for seed in range(4))
    assert detected


def test_atoms_for_and_lookup():
    for a, b in {(v[1], v[2]) for v in EXPECTED.values()}:
        want = {n for n, v in EXPECTED.items() if (v[1], v[2]) == (a, b)}
        assert {x.name for x in atoms_for(a, b)} == want
        for acc in ("f32", "f16"):
            want_acc = {n for n in want if EXPECTED[n][3] == acc}
            assert {x.name for x in atoms_for(a, b, acc)} == want_acc
    assert {x.name for x in atoms_for("f16")} == {"m16n8k16.f16.f32", "m16n8k8.f16.f32", "m16n8k16.f16.f16"}
    for name in EXPECTED:
        assert mma_atom(name) is MMA_ATOMS[name]


@pytest.mark.parametrize("bad", ["m16n8k8", "m16n8k16.f16", "", None, 3, ["m16n8k8.tf32.f32"]])
def test_unknown_atom_is_value_error_listing_atoms(bad):
    with pytest.raises(ValueError) as e:
        mma_atom(bad)
    for name in EXPECTED:
        assert name in str(e.value)


def test_fragment_map_helpers():
    fmap = MMA_ATOMS["m16n8k16.f16.f32"].a
    owners = fmap.owners()
    assert len(owners) == 16 * 16
    for (row, col), (lane, r, e) in owners.items():
        assert fmap.coord(lane, r, e) == (row, col)
    assert _swap_lanes(fmap, 0, 1).is_bijection()  # a relabelling is still a bijection
    dup = list(fmap.coords)
    dup[1] = dup[0]
    assert not dataclasses.replace(fmap, coords=tuple(dup)).is_bijection()
    grid = fmap.lane_grid()
    # row 0, col 0 of A is held by lane 0 register 0 low half (ISA a0 of lane 0)
    assert grid.splitlines()[2].split()[1] == "T0:0.0"
    assert all(f"T{lane}:" in grid for lane in range(WARP))
