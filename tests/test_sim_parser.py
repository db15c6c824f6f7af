"""The emulator's PTX grammar and parser: every form tilegen emits, and clear errors."""
from pathlib import Path

import pytest

import tilegen
from tilegen.sim import PtxSyntaxError, parse_ptx
from tilegen.sim.program import Imm, Mem, Reg, Special, Sym, Vec

GOLDEN = sorted((Path(__file__).parent / "data" / "golden").glob("*.ptx"))


def _statements(text):
    """Instruction lines of a tilegen module: what the parser must turn into Instrs."""
    body = text.split("{", 1)[1].rsplit("}", 1)[0]
    out = []
    for line in body.splitlines():
        s = line.split("//")[0].strip()
        if s and not s.startswith(".reg") and not s.endswith(":"):
            out.append(s)
    return out


@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: p.stem)
def test_golden_modules_parse(path):
    text = path.read_text()
    prog = parse_ptx(text)
    assert prog.version and prog.target.startswith("sm_") and prog.address_size == 64
    entry = prog.entry()
    assert [s for s in _statements(text)] == [i.text for i in entry.instrs]
    assert entry.reqntid[0] in (32, 64, 128, 256)
    assert [p[0] for p in entry.params][:3] == ["M", "K", "A_ptr"]
    for name, target in entry.labels.items():
        assert 0 <= target <= len(entry.instrs)
    lines = text.splitlines()
    for ins in entry.instrs[::97]:
        assert lines[ins.line - 1].split("//")[0].strip() == ins.text


@pytest.mark.parametrize("kw", [dict(dtype="tf32", a_layout="col", b_layout="col", out_dtype="bf16"),
                                dict(dtype="f16", acc_dtype="f16", swizzle="pad"),
                                dict(dtype="e4m3", b_layout="col", target="sm_89")])
def test_generated_modules_parse(kw):
    k = tilegen.compile(tilegen.GemmSpec(**kw))
    entry = parse_ptx(k.ptx).entry(k.name)
    assert len(entry.instrs) == len(_statements(k.ptx))
    assert entry.reqntid == (k.threads, 1, 1)


SYNTAX = """
.version 7.8
.target sm_90
.address_size 64

/* a block
   comment */
.extern .shared .align 1024 .b8 smem[];
.shared .align 16 .b8 tile[256];

.visible .entry first(
    .param .u64 p_a,
    .param .f32 alpha,
    .param .align 8 .b8 blob[16]
)
.maxntid 64, 1, 1
.minnctapersm 2
{
    .reg .b32 %lane, %w<4>;
    .reg .b64 %rd<2>;
    .reg .pred %p;
    .reg .f32 %f<2>;
    mov.u32 %lane, %tid.x;                 // special register
    mov.u32 %w0, smem;
    ld.param.u64 %rd0, [p_a];
    ld.global.v4.b32 {%w0, %w1, %w2, %w3}, [%rd0+16];
    st.shared.b32 [%w0+-4], %w1;
    ld.shared.b32 %w2, [tile];
    mov.f32 %f0, 0f3F800000;
    mov.b32 %w3, 0xFFFFFFFF;
    add.u32 %w3, %w3, -1;
    and.b32 %w3, %w3, 4294966272;
    setp.ne.u32 %p, %w3, 0;
$L1:
    @!%p bra.uni $L1;
    @%p ld.global.f32 %f1, [%rd0];
    ret;
}

.entry second()
{
    exit;
}
"""


def test_every_syntax_form():
    prog = parse_ptx(SYNTAX)
    assert (prog.version, prog.target, prog.address_size) == ("7.8", "sm_90", 64)
    assert [(d.name, d.align, d.size) for d in prog.shared] == [("smem", 1024, None), ("tile", 16, 256)]
    assert set(prog.entries) == {"first", "second"}
    e = prog.entry("first")
    assert e.params == [("p_a", "u64", 8), ("alpha", "f32", 4), ("blob", "b8", 16)]
    assert e.reqntid is None
    assert [r.name for r in e.regs] == ["%lane", "%w0", "%w1", "%w2", "%w3", "%rd0", "%rd1", "%p", "%f0", "%f1"]
    by_text = {i.text: i for i in e.instrs}
    assert by_text["mov.u32 %lane, %tid.x;"].operands == (Reg(0, "%lane", "b32"), Special("%tid.x"))
    assert by_text["mov.u32 %w0, smem;"].operands[1] == Sym("smem")
    v = by_text["ld.global.v4.b32 {%w0, %w1, %w2, %w3}, [%rd0+16];"].operands
    assert isinstance(v[0], Vec) and [r.name for r in v[0].items] == ["%w0", "%w1", "%w2", "%w3"]
    assert v[1] == Mem(Reg(5, "%rd0", "b64"), 16)
    assert by_text["st.shared.b32 [%w0+-4], %w1;"].operands[0].offset == -4
    assert by_text["ld.shared.b32 %w2, [tile];"].operands[1] == Mem(Sym("tile"), 0)
    f = by_text["mov.f32 %f0, 0f3F800000;"].operands[1]
    assert f == Imm(1.0, True, 0x3F800000)
    assert by_text["mov.b32 %w3, 0xFFFFFFFF;"].operands[1] == Imm(0xFFFFFFFF, False)
    assert by_text["add.u32 %w3, %w3, -1;"].operands[2] == Imm(-1, False)
    assert by_text["and.b32 %w3, %w3, 4294966272;"].operands[2] == Imm(4294966272, False)
    bra = by_text["@!%p bra.uni $L1;"]
    assert (bra.guard.name, bra.guard_neg, bra.opcode) == ("%p", True, "bra.uni")
    assert e.labels == {"$L1": bra.index}
    g = by_text["@%p ld.global.f32 %f1, [%rd0];"]
    assert (g.guard.name, g.guard_neg) == ("%p", False)
    assert bra.line == SYNTAX.splitlines().index("    @!%p bra.uni $L1;") + 1
    assert len(e.instrs) == 14
    assert prog.entry("second").instrs[0].opcode == "exit"


def test_parse_is_cached_per_text():
    assert parse_ptx(SYNTAX) is parse_ptx(SYNTAX)


@pytest.mark.parametrize("bad,what", [
    ("    add.u32 %w3, %nope, 1;", "register %nope is not declared"),
    ("    bra $nowhere;", "branch target $nowhere is not a label"),
    ("    @%w0 bra $L1;", "guard %w0 is not a .pred register"),
    ("    add.u32 %w3 %w3, 1;", "cannot parse"),
    ("    { add.u32 %w3, %w3, 1; }", "cannot parse"),       # nested scopes: documented limit
    ("$L1:", "label $L1 is defined twice"),
])
def test_errors_name_the_line(bad, what):
    lines = SYNTAX.splitlines()
    at = lines.index("    ret;")
    text = "\n".join(lines[:at] + [bad] + lines[at:])
    with pytest.raises(PtxSyntaxError) as e:
        parse_ptx(text)
    assert what in str(e.value)
    assert e.value.line == at + 1
    assert bad.strip() in str(e.value)


def test_entry_lookup():
    prog = parse_ptx(SYNTAX)
    with pytest.raises(Exception, match="name one of first, second"):
        prog.entry()
    with pytest.raises(Exception, match="no entry 'third'"):
        prog.entry("third")
