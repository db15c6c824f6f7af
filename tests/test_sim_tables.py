"""The emulator's mma / ldmatrix / stmatrix tables (written from the PTX ISA) against
tilegen.arch's (used by the generator): they must agree entry for entry, so a bug in
either shows here instead of hiding behind the other."""
import pytest

from tilegen.arch import LDMATRIX, MMA_ATOMS, STMATRIX
from tilegen.sim import tables


@pytest.mark.parametrize("name", list(MMA_ATOMS))
def test_mma_layout_matches_arch(name):
    atom = MMA_ATOMS[name]
    sim = tables.mma_layout(atom.instruction)
    assert (sim.m, sim.n, sim.k) == (atom.m, atom.n, atom.k)
    assert (sim.a_type, sim.b_type, sim.c_type) == (atom.a_type.name, atom.b_type.name, atom.acc_type.name)
    for operand, frag in (("a", atom.a), ("b", atom.b), ("c", atom.c)):
        got = getattr(sim, operand)
        assert len(got[0]) == frag.regs and len(got[0][0]) == frag.elems, f"{name}.{operand}: register count"
        for lane in range(32):
            assert got[lane] == frag.coords[lane], (
                f"{name} operand {operand.upper()}, lane {lane}: sim (ISA) {got[lane]} != arch {frag.coords[lane]}")


def test_every_sim_mma_form_is_an_arch_atom():
    arch = {a.instruction for a in MMA_ATOMS.values()}
    assert set(tables.mma_opcodes()) == arch


@pytest.mark.parametrize("key", list(LDMATRIX), ids=lambda k: f"x{k[0]}{'.trans' if k[1] else ''}")
def test_ldmatrix_and_stmatrix_match_arch(key):
    num, trans = key
    sim = tables.matrix_move(num, trans)
    for table in (LDMATRIX, STMATRIX):
        op = table[key]
        assert sim.frag == op.fragment.coords, f"{op.instruction}: fragment maps differ"
        for m in range(num):
            for r in range(8):
                assert sim.address_lane(m, r) == op.row_address_lane(m, r)
        assert tables.parse_matrix_opcode(op.instruction) == (op.op, num, trans)


@pytest.mark.parametrize("opcode", tables.mma_opcodes())
def test_sim_layouts_cover_each_tile_once(opcode):
    L = tables.mma_layout(opcode)
    for coords, rows, cols in ((L.a, L.m, L.k), (L.b, L.k, L.n), (L.c, L.m, L.n)):
        seen = [c for lane in coords for reg in lane for c in reg]
        assert sorted(seen) == [(r, c) for r in range(rows) for c in range(cols)]


@pytest.mark.parametrize("bad", [
    "mma.sync.aligned.m16n8k8.col.row.f32.tf32.tf32.f32",      # only .row.col exists
    "mma.sync.aligned.m16n8k16.row.col.f16.bf16.bf16.f16",     # bf16 accumulates in f32 only
    "mma.sync.aligned.m16n8k8.row.col.f32.f16.bf16.f32",       # mixed 16-bit types
    "mma.sync.aligned.m8n8k4.row.col.f32.f16.f16.f32",         # shape the table does not cover
])
def test_unknown_mma_forms_are_rejected(bad):
    with pytest.raises(ValueError):
        tables.mma_layout(bad)
