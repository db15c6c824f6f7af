"""The .tg text format of a kernel spec: `parse_text` and `dataclass_to_text` for any
frozen dataclass of spec fields (GemmSpec's own are gemm.spec.parse_spec_text and
spec_to_text).

    # bf16 GEMM for the H200
    gemm {
      dtype = bf16
      a_layout = row
      b_layout = col
      tile = 128 x 256 x 64
      warps = 2 x 4
      stages = 4
      epilogue { bias = col  activation = gelu_tanh }
      target = sm_90
    }

One block `gemm { ... }` holds `field = value` items, one per GemmSpec field; fields left
out take GemmSpec's defaults. `#` starts a comment. Values:

| value                  | written as                          | for                           |
| ---------------------- | ----------------------------------- | ----------------------------- |
| names                  | bf16, row, sm_90, 128B, m16n8k16.f16.f32 | str fields               |
| numbers                | 4, 8, 1.5                           | int and float fields          |
| none, true, false      | none, true, false                   | optional fields, bools        |
| dimensions             | 128 x 256 x 64 (or 128x256x64)      | tile, warps (int tuples)      |
| a nested block         | epilogue { bias = col }  (or `epilogue = { ... }`) | dataclass fields |
| lists, quoted strings  | [a, b], "any text"                  | other tuples; odd strings     |

Nothing here names a GemmSpec field: the format follows `dataclasses.fields` and the type
hints, so a field added to GemmSpec (or Epilogue) is read and written without a change here.
Syntax errors are SpecSyntaxError (line, column, what was found, what was expected); a bad
field or value is a SpecError whose message starts with the line ("line 5: stages=9 ...").
The grammar (textspec.lark) is loaded by lark on first use.
"""
from __future__ import annotations

import difflib
import json
import math
import os
import re
import typing
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Optional

from ..errors import SpecError, TilegenError

GRAMMAR = Path(__file__).with_name("textspec.lark")
MAX_BYTES = 256 * 1024   # a spec is a few hundred bytes; larger text is refused before parsing
MAX_DEPTH = 16           # nested { } and [ ], likewise
WINDOW = 60              # characters of the faulty line an error quotes
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*\Z")
_NUMBER = re.compile(r"[+-]?[0-9](?:[eE][+-][0-9]|[A-Za-z0-9_.])*\Z")
_INT = re.compile(r"[+-]?[0-9]{1,30}\Z")        # (longer digit strings are no size: left to the spec's check)
_DIMS = re.compile(r"[0-9]{1,30}(?:x[0-9]{1,30})+\Z")
_KEYWORDS = ("x",)  # the dimension separator: never a bare value


class SpecSyntaxError(TilegenError, ValueError):
    """A .tg text that does not parse. Attributes: source (file name or "<text>"), line and
    column (1-based), found (what was there), expected (list of what would have fitted)."""

    def __init__(self, source: str, line: int, column: int, found: str, expected: list, text: str = ""):
        self.source, self.line, self.column = source, line, column
        self.found, self.expected = found, list(expected)
        where = f"{source}, column {column}" if source.startswith("--") else f"{source}, line {line}, column {column}"
        msg = f"{where}: syntax error: found {found}"
        if expected:
            msg += ", expected " + _one_of(self.expected)
        lines = text.splitlines()
        here = lines[line - 1] if 1 <= line <= len(lines) else ""
        if here:
            quote, caret = _window(here.expandtabs(1), column)
            msg += f"\n    {quote}\n    {' ' * caret}^"
        # (the spellings of dimensions other languages use: (128, 256), 128,256, 128 X 256, 128*256,
        # where the error is: next to it)
        near = here[max(0, column - 12):column + 12]
        if found in ("'('", "','", "'*'") or re.search(r"[0-9]\s*[X*,]\s*[0-9]", near):
            msg += "\n    (dimensions are written 128 x 256 x 64, lists [a, b])"
        super().__init__(msg)


class SpecFileError(TilegenError):
    """A .tg file that cannot be read."""


def _window(line: str, column: int) -> tuple:
    """At most WINDOW characters of `line` around `column` (1-based), and the caret's offset."""
    if len(line) <= WINDOW:
        return line, column - 1
    start = max(0, min(column - 1 - WINDOW // 2, len(line) - WINDOW))
    quote = line[start:start + WINDOW]
    caret = column - 1 - start
    if start > 0:
        quote, caret = "..." + quote, caret + 3
    if start + WINDOW < len(line):
        quote += "..."
    return quote, caret


def check_limits(text: str, source: str) -> None:
    """Refuse text over MAX_BYTES or nested deeper than MAX_DEPTH, in one pass and before any
    parsing (SpecSyntaxError): large or deep input fails fast and with a short message."""
    if len(text) > MAX_BYTES:
        raise SpecSyntaxError(source, 1, 1, f"{len(text)} characters of text",
                              [f"a spec of at most {MAX_BYTES} characters"])
    depth, line, column, in_string, in_comment = 0, 1, 0, False, False
    escaped = False
    for ch in text:
        column += 1
        if ch == "\n":
            line, column, in_comment, in_string = line + 1, 0, False, False
            continue
        if in_comment:
            continue
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
            continue
        if ch == "#":
            in_comment = True
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            depth += 1
            if depth > MAX_DEPTH:
                raise SpecSyntaxError(source, line, column, f"{repr(ch)} opening level {depth}",
                                      [f"blocks and lists nested at most {MAX_DEPTH} deep"], text)
        elif ch in "}]":
            depth -= 1


def _one_of(items: list) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " or " + items[-1]


# -- parsing: text -> tree of located nodes --------------------------------------------------

@dataclass
class _Node:
    """One value of the text with where it starts. kind: word, number, string, dims, list, block."""
    kind: str
    value: Any
    line: int
    column: int
    text: str = ""


@dataclass
class _Block:
    name: str
    line: int
    column: int
    items: list = field(default_factory=list)  # [(name, line, column, _Node)]


_PARSER = None
_TERMINAL_WORDS = {"NAME": "a name", "NUMBER": "a number", "STRING": "a quoted string",
                   "$END": "the end of the text"}


def _parser():
    global _PARSER
    if _PARSER is None:
        from lark import Lark  # lazy: importing tilegen does not need lark

        _PARSER = Lark(GRAMMAR.read_text(), parser="lalr", maybe_placeholders=False)
    return _PARSER


def _describe_terminal(parser, name: str) -> str:
    if name in _TERMINAL_WORDS:
        return _TERMINAL_WORDS[name]
    try:
        pattern = parser.get_terminal(name).pattern
    except KeyError:
        return name
    if pattern.type == "str":
        return repr(pattern.value)
    return name.lower()


def _end_of(text: str) -> tuple[int, int]:
    """(line, column) just after the last character that is not white space."""
    t = text.rstrip()
    return t.count("\n") + 1, len(t) - (t.rfind("\n") + 1) + 1


def _syntax_error(e, text: str, source: str) -> SpecSyntaxError:
    """lark's UnexpectedInput as a SpecSyntaxError (found / expected in words)."""
    from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedToken

    parser = _parser()
    line, column = getattr(e, "line", -1), getattr(e, "column", -1)
    if isinstance(e, UnexpectedToken):
        tok = e.token
        found = "the end of the text" if tok.type == "$END" else repr(str(tok))
        expected = e.expected
        if tok.type == "$END":
            line, column = _end_of(text)
    elif isinstance(e, UnexpectedCharacters):
        found = repr(text[e.pos_in_stream]) if 0 <= e.pos_in_stream < len(text) else repr(e.char)
        expected = e.allowed or ()
    elif isinstance(e, UnexpectedEOF):
        found = "the end of the text"
        expected = e.expected
        line, column = _end_of(text)
    else:  # pragma: no cover  (lark raises only the three above)
        found, expected = str(e), ()
    try:  # what really fits here (LALR's merged states list a few more)
        expected = e.interactive_parser.accepts() or expected
    except Exception:  # noqa: BLE001  (older lark: the state's list)
        pass
    words = sorted({_describe_terminal(parser, t) for t in expected})
    return SpecSyntaxError(source, max(line, 1), max(column, 1), found, words, text)


def _node(tree) -> _Node:
    """A lark subtree of a value as a _Node."""
    from lark import Token

    kind = tree.data
    if kind == "body":
        return _block_node(tree)
    toks = [c for c in tree.children if isinstance(c, Token)]
    first = toks[0] if toks else None
    if kind in ("word", "number"):
        return _Node(kind, str(first), first.line, first.column, str(first))
    if kind == "string":
        raw = str(first)
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw[1:-1]
        return _Node("string", value, first.line, first.column, raw)
    if kind == "dims":
        parts = []
        for t in toks:  # "128x256 x 64" mixes both spellings: split the compact parts
            parts += str(t).split("x")
        return _Node("dims", tuple(parts), first.line, first.column, " x ".join(parts))
    if kind == "list":
        items = [_node(c) for c in tree.children]
        line, col = (items[0].line, items[0].column) if items else (0, 0)
        return _Node("list", items, line, col, "[...]")
    raise TilegenError(f"internal: unknown node {kind}")  # pragma: no cover


def _block_node(body) -> _Node:
    block = _Block("", 0, 0)
    for item in body.children:
        name, value = item.children
        node = _node(value)
        if node.kind == "block":  # a nested block is located by its name
            node.value.name, node.value.line, node.value.column = str(name), name.line, name.column
            node.line, node.column = name.line, name.column
        block.items.append((str(name), name.line, name.column, node))
    return _Node("block", block, 0, 0, "{...}")


def _read_source(text_or_path) -> tuple[str, str]:
    """(text, source name): a path (str or PathLike) is read; a str holding '{' is the text."""
    if isinstance(text_or_path, os.PathLike) or (isinstance(text_or_path, str) and text_or_path.strip()
                                                 and "{" not in text_or_path and "\n" not in text_or_path):
        path = Path(text_or_path)
        try:
            if path.stat().st_size > MAX_BYTES:
                raise SpecFileError(f"the spec file {str(path)!r} has {path.stat().st_size} bytes; a spec has at "
                                    f"most {MAX_BYTES}")
            return path.read_text(), str(path)
        except OSError as e:
            hint = ""
            if isinstance(text_or_path, str) and not path.suffix and os.sep not in text_or_path:
                field, eq, value = text_or_path.partition("=")
                if eq and field.strip().isidentifier():   # ("dtype = bf16": a field written without its block)
                    name, value = field.strip(), value.strip()
                    hint = (f" (a string is read as a .tg file's path, or as .tg text where it holds braces: "
                            f"gemm {{ {name} = {value} }}; or pass GemmSpec({name}=...))")
                else:
                    hint = (f" (a string is read as a .tg file's path, or as .tg text where it holds braces: "
                            f"gemm {{ dtype = {text_or_path} }}; or pass GemmSpec(dtype={text_or_path!r}))")
            raise SpecFileError(f"cannot read the spec file {str(path)!r}: {e.strerror or e}{hint}") from None
    if not isinstance(text_or_path, str):
        raise TilegenError(f"a .tg spec is text or a path, not {type(text_or_path).__name__}")
    return text_or_path, "<text>"


def parse_tree(text: str, source: str = "<text>") -> _Block:
    """The text's top block, located; syntax errors as SpecSyntaxError."""
    from lark.exceptions import UnexpectedInput

    check_limits(text, source)
    try:
        tree = _parser().parse(text)
    except UnexpectedInput as e:
        raise _syntax_error(e, text, source) from None
    name, body = tree.children
    node = _block_node(body)
    block = node.value
    block.name, block.line, block.column = str(name), name.line, name.column
    return block


# -- building: tree -> dataclass -------------------------------------------------------------

def type_options(hint) -> list:
    """The types a hint allows, Optional/Union flattened; [Any] when it says nothing."""
    if hint is Any or hint is None:
        return [Any]
    origin = typing.get_origin(hint)
    if origin is typing.Union or (origin is not None and getattr(origin, "__name__", "") == "UnionType"):
        out = []
        for a in typing.get_args(hint):
            out += type_options(a)
        return out
    if origin is not None:
        return [origin]  # tuple[int, int] -> tuple
    return [hint]


def int_dataclass(t) -> bool:
    """A dataclass of int fields only (TileShape, WarpLayout): written as dimensions."""
    if not (isinstance(t, type) and is_dataclass(t)):
        return False
    hints = _hints(t)
    fs = [f for f in fields(t) if f.init]
    return bool(fs) and all(hints.get(f.name) is int for f in fs)


def _hints(cls) -> dict:
    try:
        return typing.get_type_hints(cls)
    except Exception:  # noqa: BLE001  (an unresolvable hint: treat every field as Any)
        return {f.name: Any for f in fields(cls)}


def _natural(text: str, kind: str):
    """A bare token's value when the field's type says nothing more."""
    if kind == "word":
        return {"none": None, "true": True, "false": False}.get(text, text)
    if _INT.match(text):
        return int(text)
    try:
        return float(text)
    except ValueError:
        return text


def _convert_scalar(node: _Node, opts: list):
    text, kind = node.value, node.kind
    anything = Any in opts
    if kind == "string":
        if str in opts or anything:
            return text
        for t in (int, float):  # a quoted number ("-inf") for a field that takes no strings
            if t in opts:
                try:
                    return t(text)
                except ValueError:
                    pass
        return text
    if kind == "word":
        word = text.lower()   # (Python's True / False / None spelled as they are in Python, taken too)
        if word == "none" and (type(None) in opts or anything):
            return None
        if word in ("true", "false") and (bool in opts or anything):
            return word == "true"
        if float in opts and text in ("inf", "nan"):
            return float(text)
        if str in opts or anything:
            return text
        return _natural(text, kind)
    # a number token: 4, 128B, 1.5, 128x256x64
    if _DIMS.match(text) and any(t is tuple or int_dataclass(t) for t in opts):
        return _convert_dims(node, text.split("x"), opts)
    if _INT.match(text) and (int in opts or anything or str not in opts):
        return int(text)
    if float in opts or (anything and str not in opts):
        try:
            return float(text)
        except ValueError:
            pass
    if str in opts or anything:
        return text
    return _natural(text, kind)


def _convert_dims(node: _Node, parts, opts: list):
    values = tuple(int(p) if _INT.match(p) else p for p in parts)
    if tuple in opts or Any in opts:
        return values
    for t in opts:
        if int_dataclass(t) and all(isinstance(v, int) for v in values):
            if hasattr(t, "of"):
                return t.of(values)
            if len(values) == len([f for f in fields(t) if f.init]):
                return t(*values)
    return values  # let the spec say what it wanted


def _convert(node: _Node, hint, path: tuple, source: str):
    opts = type_options(hint)
    if node.kind == "block":
        classes = [t for t in opts if isinstance(t, type) and is_dataclass(t)]
        if not classes:
            name = ".".join(path)
            raise _at(SpecError(name, "{ ... }", _allowed_text(hint),
                                f"a {{ ... }} block is for the fields of a nested part (such as epilogue); "
                                f"{name} is not one"), node.value.line or node.line, source)
        return _build(classes[0], node.value, path, source)
    if node.kind == "dims":
        return _convert_dims(node, node.value, opts)
    if node.kind == "list":
        inner = typing.get_args(hint)
        elem = inner[0] if len(inner) >= 1 and (len(inner) == 1 or inner[-1] is Ellipsis) else Any
        return tuple(_convert(n, elem, path, source) for n in node.value)
    if node.kind == "word" and bool in opts and str not in opts and Any not in opts \
            and node.value.lower() not in ("true", "false") + (("none",) if type(None) in opts else ()):
        raise _at(SpecError(".".join(path), _shown(node), "true, false" + (", none" if type(None) in opts else "")),
                  node.line, source)
    return _convert_scalar(node, opts)


def _allowed_text(hint) -> str:
    opts = [t for t in type_options(hint) if t is not type(None)]
    return " or ".join(getattr(t, "__name__", str(t)) for t in opts)


_WRITTEN = {2: "2 x 4", 3: "128 x 256 x 64"}


def _text_dimensions(err: SpecError, value) -> None:
    """A dimension field's refusal in the text's own terms: "3 positive ints written 128 x 256 x
    64", not GemmSpec's "a tuple of 3 positive ints"; 64X128X32 (one word) gets the spelling."""
    m = re.fullmatch(r"a tuple of (\d) positive ints", str(getattr(err, "allowed", "")))
    if m is None or not err.args:
        return
    n = int(m.group(1))
    err.allowed = f"{n} positive ints written {_WRITTEN.get(n, '1 x 2 x 3')}"
    text = err.args[0].replace(m.group(0), err.allowed)
    if isinstance(value, str) and re.fullmatch(r"\d+([xX*]\d+)+", value.strip()):
        text += f" (with spaces: {' x '.join(re.split(r'[xX*]', value.strip()))})"
    err.args = (text,) + tuple(err.args[1:])


def _at(err: SpecError, line: int, source: str) -> SpecError:
    """`err` with its message prefixed by where in the text it comes from."""
    if getattr(err, "line", None) is not None:
        return err
    if isinstance(line, _Where):  # an item given on the command line
        where = line.option
    elif source == "<defaults>":  # no text: the fields come from options and defaults
        where = "with the options given"
    else:
        where = f"line {line}" if source == "<text>" else f"{source}, line {line}"
    err.args = (f"{where}: {err.args[0] if err.args else err}",) + tuple(err.args[1:])
    err.line, err.source = line, source
    return err


def _build(cls, block: _Block, path: tuple, source: str):
    hints = _hints(cls)
    names = [f.name for f in fields(cls) if f.init]
    kwargs, lines = {}, {}
    for name, line, column, node in block.items:
        full = ".".join(path + (name,))
        if name not in names:
            close = difflib.get_close_matches(name, names, n=1)
            why = f"{'/'.join(path) or cls.__name__} has no field {name!r}" + (f" (did you mean {close[0]}?)" if close else "")
            raise _at(SpecError(full, _shown(node), ", ".join(names), why), line, source)
        if name in kwargs:
            raise _at(SpecError(full, _shown(node), "each field once",
                                f"{name} is already set on line {lines[name]}"), line, source)
        kwargs[name] = _convert(node, hints.get(name, Any), path + (name,), source)
        lines[name] = line
    try:
        return cls(**kwargs)
    except SpecError as e:
        last = str(e.field).split("/")[0].split(".")[-1]
        _text_dimensions(e, kwargs.get(last))
        if last not in lines and last in names:  # a default (or derived) value failed: say so
            given = ", ".join(f"{n} ({_place(line, source)})" for n, line in lines.items())
            note = (f" ({last} was not set: it is the default for the fields given"
                    + (f": {given})" if given else ")"))
            e.args = (e.args[0] + note,) + tuple(e.args[1:])
            if source == "<defaults>" and not lines:  # nothing was given at all
                raise e from None
        raise _at(e, _line_of(e.field, lines, block), source) from None


def _place(line, source: str) -> str:
    """Where an item came from, for messages: its line, or the command-line option."""
    return line.option if isinstance(line, _Where) else f"line {line}"


def _shown(node: _Node):
    """A value as an error message shows it, before its field's type is known."""
    if node.kind in ("word", "number"):
        return _natural(node.value, node.kind)
    if node.kind == "string":
        return node.value
    return node.text


def _line_of(field_name: str, lines: dict, block: _Block) -> int:
    """The line of the item an error names (e.g. 'stages', 'epilogue.bias', 'a_layout/b_layout');
    the block's first line when the field was left out (its default, or a value derived from
    other fields, is what failed)."""
    for part in str(field_name).split("/"):
        last = part.strip().split(".")[-1]
        if last in lines:
            return lines[last]
    return block.line


def parse_text(text_or_path, kinds: dict, overrides: Optional[dict] = None, *, source: Optional[str] = None):
    """The object a .tg text (or file) describes: one block of a kind in `kinds` (keyword ->
    dataclass), e.g. {"gemm": GemmSpec}. A str holding '{' is text, any other str or a
    PathLike a path; with `source` (a name for error messages, such as "<stdin>") the
    first argument is always the text.

    `overrides` maps field names to values written as in the text ({"stages": "4",
    "tile": "64x64x32", "epilogue": "bias = col"}); each replaces the file's item and is
    reported as `--<field>` in errors (the CLI's shortcuts)."""
    if source is not None:
        text = text_or_path
    else:
        text, source = _read_source(text_or_path)
    over = [_override_block(k, v) for k, v in (overrides or {}).items()]
    return _parse(text, source, kinds, over)


def _parse(text: str, source: str, kinds: dict, overrides=()):
    block = parse_tree(text, source)
    for over in overrides:  # replace (or add) items, each located in its own source
        names = {name for name, *_ in over.items}
        block.items = [it for it in block.items if it[0] not in names] + list(over.items)
    if block.name not in kinds:
        raise _at(SpecError("kind", block.name, ", ".join(kinds),
                            "a .tg file holds one block such as `gemm { ... }`"), block.line, source)
    return _build(kinds[block.name], block, (), source)


def _override_block(name: str, value: str) -> _Block:
    value = str(value).strip()
    source = f"--{name.replace('_', '-')}"
    if not _NAME.match(name):
        raise SpecError(name, value, "a field name")
    # A bare `bias = col ...` list of items is the body of a nested block.
    if re.match(r"[A-Za-z_][A-Za-z0-9_.]*\s*=", value):
        value = "{ " + value + " }"
    head = f"gemm {{ {name} = "
    try:
        block = parse_tree(f"{head}{value} }}", source)
    except SpecSyntaxError as e:
        column = min(max(e.column - len(head), 1), len(value) + 1)
        raise SpecSyntaxError(source, 1, column, e.found, e.expected, value) from None
    return _relabel(block, _Where(source))


def _relabel(block: _Block, where: "_Where") -> _Block:
    """Every item of `block`, nested ones too, located at `where` (a command-line option)."""
    block.line = where
    items = []
    for item_name, _line, col, node in block.items:
        if node.kind == "block":
            _relabel(node.value, where)
        items.append((item_name, where, col, node))
    block.items = items
    return block


class _Where(int):
    """A 'line' for items given on the command line: prints as the option's name."""

    def __new__(cls, option: str):
        obj = super().__new__(cls, 1)
        obj.option = option
        return obj

    def __str__(self):
        return self.option

    __repr__ = __str__


# -- writing: dataclass -> text --------------------------------------------------------------

def _format_scalar(value, hint) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else '"-inf"'
        return repr(value)
    if isinstance(value, str):
        if (_NAME.match(value) or _NUMBER.match(value)) and value not in _KEYWORDS:
            kind = "word" if _NAME.match(value) else "number"
            back = _convert(_Node(kind, value, 0, 0, value), hint, (), "")
            if back == value and type(back) is str:
                return value
        return json.dumps(value)
    raise TilegenError(f"the .tg format cannot write a {type(value).__name__} ({value!r})")


def _format_value(value, hint, minimal: bool, indent: str) -> str:
    if is_dataclass(value) and not isinstance(value, type):
        if int_dataclass(type(value)):
            return " x ".join(str(getattr(value, f.name)) for f in fields(value) if f.init)
        return _format_block(value, minimal, indent)
    if isinstance(value, (tuple, list)):
        if len(value) >= 2 and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
            return " x ".join(str(v) for v in value)
        inner = typing.get_args(hint)
        elem = inner[0] if inner else Any
        return "[" + ", ".join(_format_value(v, elem, minimal, indent) for v in value) + "]"
    return _format_scalar(value, hint)


def _kept_fields(obj, minimal: bool) -> list:
    """Fields to write: all of them, or (minimal) only those the defaults would not give."""
    names = [f.name for f in fields(obj) if f.init]
    if not minimal:
        return names
    kept = list(names)
    for name in names:
        trial = [n for n in kept if n != name]
        try:
            same = type(obj)(**{n: getattr(obj, n) for n in trial}) == obj
        except (SpecError, TypeError, ValueError):
            same = False
        if same:
            kept = trial
    return kept


def _format_block(obj, minimal: bool, indent: str) -> str:
    hints = _hints(type(obj))
    items = []
    for name in _kept_fields(obj, minimal):
        value = getattr(obj, name)
        items.append((name, _format_value(value, hints.get(name, Any), minimal, indent + "  "), value))
    if not items:
        return "{ }"
    nested = any(text.startswith("{") and "\n" in text for _, text, _ in items)
    parts = [f"{n} {t}" if t.startswith("{") else f"{n} = {t}" for n, t, _ in items]
    one_line = "{ " + "  ".join(parts) + " }"
    if indent and not nested and len(one_line) + len(indent) <= 90:
        return one_line
    return "{\n" + "".join(f"{indent}  {p}\n" for p in parts) + indent + "}"


def dataclass_to_text(obj, keyword: str, minimal: bool = False) -> str:
    """`keyword { field = value ... }` for any dataclass whose fields the format can write."""
    if not (is_dataclass(obj) and not isinstance(obj, type)):
        raise TilegenError(f"dataclass_to_text takes a dataclass instance, not {type(obj).__name__}")
    body = _format_block(obj, minimal, "")
    return f"{keyword} {body}\n"


def dataclass_from_text(text: str, cls, keyword: str):
    """The inverse of dataclass_to_text for one dataclass type (tests, other spec kinds)."""
    return parse_text(text, {keyword: cls})


__all__ = ["SpecSyntaxError", "SpecFileError", "dataclass_to_text", "dataclass_from_text", "parse_text",
           "int_dataclass", "type_options", "GRAMMAR"]
