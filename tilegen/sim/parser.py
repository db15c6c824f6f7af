"""PTX text -> Program, through the lark grammar in ptx.lark (LALR, transformed while parsing).

Accepted (what tilegen and its probe kernels emit):
- module directives .version, .target, .address_size; `.extern .shared .align N .b8 name[];`
  and sized `.shared` arrays at module or entry scope;
- `.visible .entry name(.param .u32/.u64/.f32/... name, ...)` with .reqntid/.maxntid/
  .maxnreg/.minnctapersm;
- `.reg .type %r<N>;` ranges and named lists (`.reg .b32 %lane, %base;`);
- labels, `@%p` / `@!%p` guards, operands: registers, special registers (%tid.x, %ctaid.x,
  %laneid ...), symbols, immediates (decimal incl. negative and large unsigned, 0x hex,
  0fXXXXXXXX / 0dXXXXXXXXXXXXXXXX floats), `[reg]`, `[reg+imm]`, `[name]`, `[imm]`, vectors `{...}`;
- `//` and `/* */` comments.

Not accepted: nested `{ }` scopes inside an entry, .func/call, .const/.global/.local
variables, initialisers, the `_` sink operand, texture/surface syntax, .loc/.file debug
directives, several statements on one line sharing a label. The parser checks that every
register is declared and every branch target exists; the interpreter rejects opcodes it
does not implement when it decodes them.
"""
from __future__ import annotations

import struct
import threading
from functools import lru_cache
from pathlib import Path

from lark import Lark, Transformer, Token, v_args
from lark.exceptions import UnexpectedInput

from .errors import PtxSyntaxError
from .program import Entry, Imm, Instr, Mem, Program, Reg, SharedDecl, Special, Sym, TensorRef, Vec

GRAMMAR = Path(__file__).with_name("ptx.lark")

SPECIAL_REGS = {f"%{n}.{a}" for n in ("tid", "ntid", "ctaid", "nctaid", "clusterid", "nclusterid", "cluster_ctaid",
                                      "cluster_nctaid") for a in "xyz"} | {
    "%laneid", "%warpid", "%nwarpid", "%smid", "%nsmid", "%clock", "%clock64", "%gridid", "%cluster_ctarank",
    "%cluster_nctarank"}

_TYPE_BYTES = {"b8": 1, "u8": 1, "s8": 1, "b16": 2, "u16": 2, "s16": 2, "f16": 2, "bf16": 2,
               "b32": 4, "u32": 4, "s32": 4, "f32": 4, "f16x2": 4, "bf16x2": 4,
               "b64": 8, "u64": 8, "s64": 8, "f64": 8, "pred": 1}


def _int(text: str) -> int:
    t = text.rstrip("U")
    return int(t, 16) if t.lstrip("-")[:2] in ("0x", "0X") else int(t)


# Raw pieces the transformer builds before an entry resolves its registers and labels.
class _RawInstr:
    __slots__ = ("line", "opcode", "guard", "neg", "operands")

    def __init__(self, line, opcode, guard, neg, operands):
        self.line, self.opcode, self.guard, self.neg, self.operands = line, opcode, guard, neg, operands


class _RawReg:
    __slots__ = ("name", "line")

    def __init__(self, name, line):
        self.name, self.line = name, line


class _RegDecl:
    def __init__(self, type_, names):
        self.type, self.names = type_, names


class _Label:
    def __init__(self, name, line):
        self.name, self.line = name, line


class _Perf:
    def __init__(self, name, values):
        self.name, self.values = name, values


@v_args(inline=True)
class _Build(Transformer):
    def __init__(self, lines):
        super().__init__()
        self.lines = lines

    # -- operands ---------------------------------------------------------------------------
    def reg(self, tok):
        return _RawReg(str(tok), tok.line)

    def symbol(self, tok):
        return Sym(str(tok))

    def imm(self, tok):
        t = str(tok)
        if tok.type == "FLOAT_HEX":
            bits = int(t[2:], 16)
            return Imm(struct.unpack("<f", struct.pack("<I", bits))[0], True, bits)
        if tok.type == "DOUBLE_HEX":
            bits = int(t[2:], 16)
            return Imm(struct.unpack("<d", struct.pack("<Q", bits))[0], True, bits)
        return Imm(_int(t), False)

    def memory(self, addr):
        return addr

    def base_address(self, base, *rest):
        offset = _int(str(rest[-1])) if rest else 0
        b = _RawReg(str(base), base.line) if base.type == "REG" else Sym(str(base))
        return Mem(b, offset)

    def tensor_memory(self, desc, coords):
        return TensorRef(_RawReg(str(desc), desc.line), coords.items)

    def absolute_address(self, tok):
        return Mem(None, _int(str(tok)))

    def vector(self, *items):
        return Vec(tuple(items))

    # -- statements -------------------------------------------------------------------------
    def guard(self, *toks):
        return (toks[-1], len(toks) == 2)

    def instruction(self, *kids):
        guard, neg = None, False
        if kids and isinstance(kids[0], tuple):
            (guard, neg), kids = kids[0], kids[1:]
        op = kids[0]
        operands = tuple(k for k in kids[1:] if k is not None)
        g = _RawReg(str(guard), guard.line) if guard is not None else None
        return _RawInstr(op.line, str(op), g, neg, operands)

    def label(self, tok):
        return _Label(str(tok), tok.line)

    def reg_item(self, tok, count=None):
        name = str(tok)
        if count is None:
            return [name]
        return [f"{name}{i}" for i in range(int(count))]

    def reg_decl(self, type_, *items):
        return _RegDecl(str(type_)[1:], [n for it in items for n in it])

    def align(self, tok):
        return int(tok)

    def shared_decl(self, *kids):
        kids = list(kids)
        extern = bool(kids) and isinstance(kids[0], Token) and kids[0].type == "EXTERN"
        if extern:
            kids.pop(0)
        align = kids.pop(0) if isinstance(kids[0], int) else 1
        type_, name = str(kids[0])[1:], str(kids[1])
        size = int(kids[2]) if len(kids) > 2 and kids[2] is not None else None
        if size is None and not extern:
            raise PtxSyntaxError(f"shared array {name} has no size and is not .extern", line=kids[1].line,
                                 text=self.lines[kids[1].line - 1].strip())
        return SharedDecl(name, align, size, type_)

    def param(self, *kids):
        kids = [k for k in kids if not isinstance(k, int) or isinstance(k, Token)]
        type_, name = str(kids[0])[1:], str(kids[1])
        count = int(kids[2]) if len(kids) > 2 else 1
        return (name, type_, _TYPE_BYTES[type_] * count)

    def perf(self, tok, *vals):
        return _Perf(str(tok)[1:], tuple(int(v) for v in vals))

    def entry(self, *kids):
        kids = [k for k in kids if not (isinstance(k, Token) and k.type == "VISIBLE")]
        name = str(kids[0])
        params = [k for k in kids[1:] if isinstance(k, tuple)]
        perfs = {k.name: k.values for k in kids if isinstance(k, _Perf)}
        body = [k for k in kids[1:] if isinstance(k, (_RegDecl, SharedDecl, _Label, _RawInstr))]
        return _resolve(name, params, perfs, body, self.lines)

    def version(self, tok):
        return ("version", str(tok))

    def target(self, *toks):
        return ("target", ",".join(str(t) for t in toks))

    def address_size(self, tok):
        return ("address_size", int(tok))

    def start(self, *kids):
        prog = Program()
        for k in kids:
            if isinstance(k, Entry):
                if k.name in prog.entries:
                    raise PtxSyntaxError(f"entry {k.name} is defined twice")
                prog.entries[k.name] = k
            elif isinstance(k, SharedDecl):
                prog.shared.append(k)
            else:
                setattr(prog, k[0], k[1])
        return prog


def _resolve(name, params, perfs, body, lines) -> Entry:
    regs: list[Reg] = []
    slots: dict[str, Reg] = {}
    shared, labels, raw = [], {}, []
    for item in body:
        if isinstance(item, _RegDecl):
            for n in item.names:
                if n in slots or n in SPECIAL_REGS:
                    raise PtxSyntaxError(f"register {n} is declared twice")
                r = Reg(len(regs), n, item.type)
                regs.append(r)
                slots[n] = r
        elif isinstance(item, SharedDecl):
            shared.append(item)
        elif isinstance(item, _Label):
            if item.name in labels:
                raise PtxSyntaxError(f"label {item.name} is defined twice", line=item.line,
                                     text=lines[item.line - 1].strip())
            labels[item.name] = len(raw)
        else:
            raw.append(item)

    def text(line):
        return lines[line - 1].split("//")[0].strip()

    def reg(r: _RawReg):
        if r.name in SPECIAL_REGS:
            return Special(r.name)
        if r.name not in slots:
            raise PtxSyntaxError(f"register {r.name} is not declared", line=r.line, text=text(r.line))
        return slots[r.name]

    def operand(x):
        if isinstance(x, _RawReg):
            return reg(x)
        if isinstance(x, Mem) and isinstance(x.base, _RawReg):
            return Mem(reg(x.base), x.offset)
        if isinstance(x, Vec):
            return Vec(tuple(operand(i) for i in x.items))
        if isinstance(x, TensorRef):
            return TensorRef(reg(x.desc), tuple(operand(i) for i in x.coords))
        return x

    instrs = []
    for i, r in enumerate(raw):
        g = reg(r.guard) if r.guard is not None else None
        if g is not None and (not isinstance(g, Reg) or g.type != "pred"):
            raise PtxSyntaxError(f"guard {r.guard.name} is not a .pred register", line=r.line, text=text(r.line))
        ops = tuple(operand(x) for x in r.operands)
        fam = r.opcode.split(".")[0]
        if fam in ("bra", "brx"):
            target = ops[-1] if ops else None
            if not isinstance(target, Sym) or target.name not in labels:
                raise PtxSyntaxError(f"branch target {getattr(target, 'name', target)} is not a label of "
                                     f"{name}", line=r.line, text=text(r.line))
        instrs.append(Instr(i, r.line, text(r.line), r.opcode, g, r.neg, ops))
    reqntid = perfs.get("reqntid")
    cluster = perfs.get("reqnctapercluster")
    cluster = tuple(cluster) + (1,) * (3 - len(cluster)) if cluster else None
    return Entry(name, params, reqntid, regs, shared, instrs, labels, cluster)


_LOCK = threading.Lock()


@lru_cache(maxsize=1)
def grammar_parser() -> tuple:
    """The parser with the transformer applied while parsing (no parse tree is built)."""
    build = _Build([])
    return Lark(GRAMMAR.read_text(), parser="lalr", lexer="contextual", maybe_placeholders=True,
                transformer=build), build


@lru_cache(maxsize=32)
def parse_ptx(text: str) -> Program:
    """Parse a PTX module (cached per text). Raises PtxSyntaxError with the line."""
    lines = text.splitlines()
    parser, build = grammar_parser()
    try:
        with _LOCK:  # the transformer holds the lines of the text being parsed
            build.lines = lines
            return parser.parse(text)
    except UnexpectedInput as e:
        line = getattr(e, "line", None)
        src = lines[line - 1].strip() if line and 0 < line <= len(lines) else ""
        raise PtxSyntaxError(f"the emulator cannot parse this PTX (column {getattr(e, 'column', '?')}): "
                             f"{str(e).splitlines()[0]}", kind="syntax", line=line, text=src) from None
