"""Importing tilegen is cheap and needs no GPU, no CUDA bindings and no lark."""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _run(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               CUDA_VISIBLE_DEVICES="")
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)


def test_import_does_not_load_cuda_or_lark():
    p = _run(
        "import sys, json\n"
        "import tilegen, tilegen.arch, tilegen.gemm.spec, tilegen.gemm.layouts, tilegen.cli\n"
        "tilegen.GemmSpec(dtype='f16').smem_bytes()\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('cuda', 'lark'))\n"
        "print(json.dumps(bad))\n")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout.strip().splitlines()[-1]) == []


def test_import_works_when_cuda_and_lark_are_missing():
    # sys.modules[name] = None makes `import name` raise ImportError, as on a machine without them
    p = _run(
        "import sys\n"
        "for m in ('cuda', 'cuda.bindings', 'cuda.core', 'lark'):\n"
        "    sys.modules[m] = None\n"
        "import tilegen\n"
        "s = tilegen.GemmSpec(dtype='bf16')\n"
        "print(s.atom, s.smem_bytes() > 0)\n")
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["m16n8k16.bf16.f32", "True"]


def test_print_default_spec():
    p = _run("import tilegen; print(tilegen.GemmSpec(dtype='f16'))")
    assert p.returncode == 0, p.stderr
    out = p.stdout.strip()
    assert out.startswith("GemmSpec(") and "dtype=f16" in out and "target=sm_80" in out


def test_public_names():
    import tilegen

    assert {"GemmSpec", "SpecError"} <= set(tilegen.__all__)
    for name in tilegen.__all__:
        assert hasattr(tilegen, name), name
    assert issubclass(tilegen.SpecError, ValueError)
    assert "HazardError" in tilegen.__all__ and issubclass(tilegen.HazardError, tilegen.IRError)


def test_arch_imports_nothing_else_of_tilegen():
    # DESIGN.md: "arch imports nothing of tilegen" (hardware facts sit at the bottom)
    arch = REPO / "tilegen" / "arch"
    for path in sorted(arch.glob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                assert node.level <= 1, f"{path.name}: relative import leaves tilegen.arch"
                assert node.level == 1 or not (node.module or "").startswith("tilegen"), \
                    f"{path.name}: imports {node.module}"
                if node.level == 0 and (node.module or "").startswith("tilegen"):
                    assert node.module.startswith("tilegen.arch"), path.name
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    assert not alias.name.startswith("tilegen") or alias.name.startswith("tilegen.arch"), \
                        f"{path.name}: imports {alias.name}"
