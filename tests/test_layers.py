"""The layers of tilegen point one way (docs/architecture.md): which package may import which
is written down here as data, and every import in the source, at module level or inside a
function, is held to it. Also: no import cycles among modules, and imports inside functions
only where docs/architecture.md lists a reason (optional or heavy packages)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "tilegen"

# Each part of tilegen (a subpackage, or a module at the top) and the parts it may import.
_BASE = {"errors", "version"}
_CORE = _BASE | {"arch", "store", "ir", "codegen", "dsl", "runtime", "sim", "compiler", "gemm", "frontend"}
ALLOWED = {
    "errors": set(),
    "version": set(),
    "arch": {"errors"},
    "store": {"errors"},
    "ir": {"arch", "errors"},
    "codegen": {"ir", "arch", "errors"},
    "dsl": {"ir", "arch", "errors"},
    "runtime": {"arch", "store", "errors"},
    "sim": {"arch", "errors"},
    "compiler": {"ir", "codegen", "runtime", "sim", "store", "arch", "errors"},
    "gemm": {"dsl", "compiler", "ir", "codegen", "runtime", "sim", "store", "arch"} | _BASE,
    "frontend": {"gemm", "compiler", "dsl", "errors"},
    # tools on top: anything below, and the tools they build on
    "show": _CORE,
    "verify": _CORE,
    "bench": _CORE,
    "tune": _CORE | {"bench"},
    "cli": _CORE | {"bench", "tune", "verify", "show"},
    "__main__": {"cli"},
    "__init__": {"compiler", "dsl", "errors", "frontend", "gemm", "version"},  # the public names
}

# Imports of tilegen modules inside functions: where they are allowed and why (the same
# list is in docs/architecture.md). Everything else is imported at the top of its module.
LAZY = {
    # the emulator loads its PTX grammar (lark) on import: only when something runs on it
    ("gemm.call", "sim"): "the emulator", ("compiler.call", "sim"): "the emulator",
    ("cli", "sim"): "the emulator",
    # the command line starts fast: each verb imports what it runs
    ("cli", "bench"): "a verb", ("cli", "tune"): "a verb", ("cli", "verify"): "a verb",
    # Triton, an optional package, is imported by bench/triton_mm.py at its top
    ("bench.cli", "bench.triton_mm"): "Triton",
}


def _modules():
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _part(module: str) -> str:
    return module.split(".")[0] if module else "__init__"


def _imports(module: str, path: Path):
    """(imported tilegen module, line, inside a function?) for every import of tilegen."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    top = set()
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            top.update(id(n) for n in ast.walk(node))
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".") if package else []
                base = base[:len(base) - node.level + 1]
                stem = ".".join(base + ([node.module] if node.module else []))
            elif (node.module or "").startswith("tilegen"):
                stem = node.module[len("tilegen."):] if node.module != "tilegen" else ""
            else:
                continue
            for alias in node.names:
                full = f"{stem}.{alias.name}" if stem else alias.name
                targets.append(full if full in MODULES else stem)
        elif isinstance(node, ast.Import):
            targets = [a.name[len("tilegen."):] for a in node.names if a.name.startswith("tilegen.")]
            targets += ["" for a in node.names if a.name == "tilegen"]
        for t in targets:
            while t and t not in MODULES:
                t = t.rpartition(".")[0]
            yield t, node.lineno, id(node) not in top


def test_every_part_has_a_rule():
    parts = {_part(m) for m in MODULES}
    assert parts <= set(ALLOWED), f"no layer rule for {sorted(parts - set(ALLOWED))}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_follow_the_layers(module):
    me = _part(module)
    for target, line, _ in _imports(module, MODULES[module]):
        them = _part(target)
        if them == me:
            continue
        assert them in ALLOWED[me], (f"tilegen/{MODULES[module].relative_to(PACKAGE)}:{line} imports "
                                     f"tilegen.{target or '__init__'}: {me} may import only "
                                     f"{', '.join(sorted(ALLOWED[me])) or 'nothing of tilegen'}")


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_inside_functions_are_the_listed_lazy_ones(module):
    for target, line, inside in _imports(module, MODULES[module]):
        if inside:
            assert ((module, target) in LAZY or (module, _part(target)) in LAZY
                    or (_part(module), _part(target)) in LAZY), (
                f"tilegen/{MODULES[module].relative_to(PACKAGE)}:{line} imports tilegen.{target} inside a "
                f"function: import it at the top, or add the case (and its reason) to LAZY and "
                f"docs/architecture.md")


def test_no_import_cycles():
    graph = {m: {t for t, _, _ in _imports(m, p) if t != m} for m, p in MODULES.items()}
    # a module's package __init__ runs first: importing a.b imports a
    state, stack, cycles = {}, [], []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for t in sorted(graph.get(m, ())):
            if t.startswith(m + ".") if m else False:
                continue  # a package importing its own submodule
            if state.get(t) == "open":
                if not m.startswith(t + ".") and t != "":
                    cycles.append(" -> ".join(stack[stack.index(t):] + [t]))
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)
