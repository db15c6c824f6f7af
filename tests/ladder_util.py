"""The Hopper ladder (examples/hopper_ladder) for the tests: its common.py (run a step on the
GPU or the emulator against numpy) and a step's kernel with edits planted into its source."""
import importlib.util
import sys
import types
from pathlib import Path

import tilegen

LADDER = Path(__file__).resolve().parent.parent / "examples" / "hopper_ladder"
if str(LADDER) not in sys.path:   # the steps import common and each other
    sys.path.insert(0, str(LADDER))


def load(name: str):
    """The ladder's module `name` (a step, or "common"), loaded from its file."""
    spec = importlib.util.spec_from_file_location(f"tilegen_ladder_{name}", LADDER / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


common = load("common")


def planted(step: str, kernel: str, *edits, **constants):
    """Step `step`'s kernel function `kernel`, compiled for sm_90a after each (old, new) of
    `edits` replaced in its source (each `old` must be there)."""
    text = (LADDER / f"{step}.py").read_text()
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new)
    module = types.ModuleType(f"{step}_planted")
    module.__file__ = f"{step}_planted.py"
    exec(compile(text.replace('if __name__ == "__main__":', "if False:"), module.__file__, "exec"), module.__dict__)
    return tilegen.compile(getattr(module, kernel), target="sm_90a", **constants)
