"""Launch geometry as data: a kernel's grid as small expressions over its size symbols.

    LaunchGrid((Min(Mul(CeilDiv(Size("M"), 128), CeilDiv(Size("N"), 256)), SM_COUNT), 1, 1))

is one CTA per 128 x 256 block of an M x N output, at most one per multiprocessor. Nothing
here runs user code: the disk cache stores a grid as plain JSON lists (`to_data`,
`from_data`) and the runtime evaluates it at launch (`evaluator`) with the sizes and the
GPU's multiprocessor count.

| node        | value                                  | data                    |
| ----------- | -------------------------------------- | ----------------------- |
| Size(n)     | the size symbol n (a kernel argument)  | ["size", "M"]           |
| Const(v)    | the int v                              | ["const", 1]            |
| CeilDiv(a,d)| ceil(a / d), d a positive int          | ["cdiv", a, 128]        |
| Mul(a, b)   | a * b                                  | ["mul", a, b]           |
| Add(a, b)   | a + b                                  | ["add", a, b]           |
| Min(a, b)   | min(a, b)                              | ["min", a, b]           |
| Mod(a, b)   | a % b (0 where b is 0)                 | ["mod", a, b]           |
| SM_COUNT    | multiprocessors of the launching GPU   | ["sm_count"]            |
"""
from __future__ import annotations

import re
from dataclasses import dataclass

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class GridExpr:
    """An expression over size symbols; `*`, `+` combine two (ints become Const)."""

    def __mul__(self, other):
        return Mul(self, as_expr(other))

    __rmul__ = __mul__

    def __add__(self, other):
        return Add(self, as_expr(other))

    __radd__ = __add__

    def __mod__(self, other):
        return Mod(self, as_expr(other))


@dataclass(frozen=True)
class Size(GridExpr):
    name: str

    def __post_init__(self):
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ValueError(f"size symbol {self.name!r}: a name such as 'M'")

    def source(self) -> str:
        return f"s[{self.name!r}]"

    def data(self):
        return ["size", self.name]

    def text(self) -> str:
        return self.name


@dataclass(frozen=True)
class Const(GridExpr):
    value: int

    def __post_init__(self):
        if isinstance(self.value, bool) or not isinstance(self.value, int) or self.value < 0:
            raise ValueError(f"grid constant {self.value!r}: an int >= 0")

    def source(self) -> str:
        return str(self.value)

    def data(self):
        return ["const", self.value]

    def text(self) -> str:
        return str(self.value)


@dataclass(frozen=True)
class CeilDiv(GridExpr):
    num: GridExpr
    den: int

    def __post_init__(self):
        if isinstance(self.den, bool) or not isinstance(self.den, int) or self.den < 1:
            raise ValueError(f"grid division by {self.den!r}: a positive int")

    def source(self) -> str:
        return f"(-(-{self.num.source()} // {self.den}))"

    def data(self):
        return ["cdiv", self.num.data(), self.den]

    def text(self) -> str:
        return f"cdiv({self.num.text()}, {self.den})"


@dataclass(frozen=True)
class Share(GridExpr):
    """num // den, at least 1: each of `den` rows' share of a count (tilegen.dsl.share), so that
    den rows of it never exceed the count, and a row is never empty."""
    num: GridExpr
    den: int

    def __post_init__(self):
        if isinstance(self.den, bool) or not isinstance(self.den, int) or self.den < 1:
            raise ValueError(f"grid share among {self.den!r}: a positive int")

    def source(self) -> str:
        return f"max(1, {self.num.source()} // {self.den})"

    def data(self):
        return ["share", self.num.data(), self.den]

    def text(self) -> str:
        return f"share({self.num.text()}, {self.den})"


@dataclass(frozen=True)
class Mul(GridExpr):
    a: GridExpr
    b: GridExpr

    def source(self) -> str:
        return f"({self.a.source()} * {self.b.source()})"

    def data(self):
        return ["mul", self.a.data(), self.b.data()]

    def text(self) -> str:
        return f"{self.a.text()} * {self.b.text()}"


@dataclass(frozen=True)
class Add(GridExpr):
    a: GridExpr
    b: GridExpr

    def source(self) -> str:
        return f"({self.a.source()} + {self.b.source()})"

    def data(self):
        return ["add", self.a.data(), self.b.data()]

    def text(self) -> str:
        return f"({self.a.text()} + {self.b.text()})"


@dataclass(frozen=True)
class Min(GridExpr):
    a: GridExpr
    b: GridExpr

    def source(self) -> str:
        return f"min({self.a.source()}, {self.b.source()})"

    def data(self):
        return ["min", self.a.data(), self.b.data()]

    def text(self) -> str:
        return f"min({self.a.text()}, {self.b.text()})"


@dataclass(frozen=True)
class Mod(GridExpr):
    a: GridExpr
    b: GridExpr

    def source(self) -> str:
        return f"({self.a.source()} % max({self.b.source()}, 1))"

    def data(self):
        return ["mod", self.a.data(), self.b.data()]

    def text(self) -> str:
        return f"({self.a.text()} % {self.b.text()})"


@dataclass(frozen=True)
class SmCount(GridExpr):
    def source(self) -> str:
        return "sms"

    def data(self):
        return ["sm_count"]

    def text(self) -> str:
        return "sm_count"


SM_COUNT = SmCount()


def as_expr(x) -> GridExpr:
    """An int, a size symbol's name or an expression, as an expression."""
    if isinstance(x, GridExpr):
        return x
    if isinstance(x, str):
        return Size(x)
    if isinstance(x, int) and not isinstance(x, bool):
        return Const(x)
    raise ValueError(f"{x!r} is not a grid expression: use ints, size names ('M') or "
                     f"tilegen.dsl.cdiv / tilegen.dsl.minimum of them")


def nodes(e: GridExpr):
    """Every node of an expression, e first."""
    yield e
    for v in vars(e).values():
        if isinstance(v, GridExpr):
            yield from nodes(v)


def symbols(e: GridExpr) -> set:
    """The size symbols an expression reads."""
    return {n.name for n in nodes(e) if isinstance(n, Size)}


_DECODE = {
    "size": lambda a: Size(a[0]),
    "const": lambda a: Const(a[0]),
    "cdiv": lambda a: CeilDiv(expr_from_data(a[0]), a[1]),
    "share": lambda a: Share(expr_from_data(a[0]), a[1]),
    "mul": lambda a: Mul(expr_from_data(a[0]), expr_from_data(a[1])),
    "add": lambda a: Add(expr_from_data(a[0]), expr_from_data(a[1])),
    "min": lambda a: Min(expr_from_data(a[0]), expr_from_data(a[1])),
    "mod": lambda a: Mod(expr_from_data(a[0]), expr_from_data(a[1])),
    "sm_count": lambda a: SM_COUNT,
}
_ARITY = {"size": 1, "const": 1, "cdiv": 2, "share": 2, "mul": 2, "add": 2, "min": 2, "mod": 2, "sm_count": 0}


def expr_from_data(d) -> GridExpr:
    """The expression a `data()` list describes; ValueError for anything else."""
    if not (isinstance(d, list) and d and d[0] in _DECODE and len(d) == 1 + _ARITY[d[0]]):
        raise ValueError(f"not a grid expression: {d!r}")
    return _DECODE[d[0]](d[1:])


@dataclass(frozen=True)
class LaunchGrid:
    """(x, y, z) of a launch, each an expression; with a cluster shape (sm_90), each rounded
    up to a whole number of clusters when evaluated."""
    dims: tuple
    cluster: tuple = (1, 1, 1)

    def __post_init__(self):
        dims = tuple(self.dims) + (1,) * (3 - len(self.dims)) if isinstance(self.dims, (tuple, list)) else ()
        if len(dims) != 3:
            raise ValueError(f"grid {self.dims!r}: (x,), (x, y) or (x, y, z)")
        object.__setattr__(self, "dims", tuple(as_expr(d) for d in dims))
        cluster = tuple(self.cluster)
        if len(cluster) != 3 or not all(isinstance(c, int) and c >= 1 for c in cluster):
            raise ValueError(f"cluster {self.cluster!r}: (x, y, z) of ints >= 1")
        object.__setattr__(self, "cluster", cluster)

    @property
    def symbols(self) -> set:
        return set().union(*(symbols(d) for d in self.dims))

    @property
    def reads_sm_count(self) -> bool:
        """Whether the grid depends on the GPU (persistent kernels)."""
        return any(isinstance(n, SmCount) for d in self.dims for n in nodes(d))

    def to_data(self) -> list:
        dims = [d.data() for d in self.dims]
        return dims if self.cluster == (1, 1, 1) else dims + [["cluster", *self.cluster]]

    @classmethod
    def from_data(cls, data) -> "LaunchGrid":
        if not (isinstance(data, list) and len(data) in (3, 4)):
            raise ValueError(f"not a grid: {data!r}")
        cluster = (1, 1, 1)
        if len(data) == 4:
            c = data[3]
            if not (isinstance(c, list) and len(c) == 4 and c[0] == "cluster"):
                raise ValueError(f"not a grid's cluster: {c!r}")
            cluster = tuple(c[1:])
        return cls(tuple(expr_from_data(d) for d in data[:3]), cluster)

    def evaluator(self, positional=None):
        """A function (sizes: dict, sm_count: int) -> (x, y, z), compiled once; with
        `positional` (size names), a function (*sizes in that order, sm_count) instead, for
        callers that have the sizes at hand. The source is built from the validated nodes
        above (size names are identifiers), never from user text."""
        body = ", ".join(d.source() if c == 1 else f"-(-({d.source()}) // {c}) * {c}"
                         for d, c in zip(self.dims, self.cluster))
        if positional is None:
            return eval(f"lambda s, sms: ({body})", {"__builtins__": {}, "min": min, "max": max})  # noqa: S307
        names = [Size(n).name for n in positional]
        missing = self.symbols - set(names)
        if missing:
            raise ValueError(f"the grid reads {', '.join(sorted(missing))}, not among {', '.join(names)}")
        for n in names:
            body = body.replace(f"s[{n!r}]", f"_{n}")
        args = ", ".join(f"_{n}" for n in names)
        return eval(f"lambda {args}, sms: ({body})", {"__builtins__": {}, "min": min, "max": max})  # noqa: S307

    def __str__(self) -> str:
        text = "(" + ", ".join(d.text() for d in self.dims) + ")"
        return text if self.cluster == (1, 1, 1) else f"{text} in clusters of {self.cluster}"


__all__ = ["LaunchGrid", "GridExpr", "Size", "Const", "CeilDiv", "Mul", "Add", "Min", "Mod", "SM_COUNT", "as_expr",
           "symbols", "expr_from_data"]
