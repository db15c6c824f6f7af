"""Record, then check, the PTX of every kernel a test run compiles: a restructuring that
must leave the emitted PTX unchanged byte for byte is checked against the record.

    python3 tools/ptx_fingerprints.py record DIR   # run the test suite, keeping each kernel's PTX in DIR
    python3 tools/ptx_fingerprints.py check DIR    # recompile every recorded GemmSpec; compare DSL kernels too

`record` runs pytest with this file as a plugin: every Kernel built during the run is noted in
DIR/index.jsonl (the GemmSpec's repr, or "DSL:<kernel name>") with its PTX's sha256, and the
PTX itself is kept as DIR/<sha256>.ptx. `check` recompiles each recorded GemmSpec in this tree
(the disk cache off) and compares the texts; DSL kernels, whose constants are not recorded, are
compared as sets of texts per kernel name between two records (`compare-dsl`).

The comments of the PTX cite the kernel source line each block comes from, "(template.py:57)";
code that moves changes those and nothing else, so texts are compared with them blanked
("(source)") and the count of byte-identical texts is reported beside.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def pytest_configure(config):  # the plugin side of `record`
    out = os.environ.get("PTXREC_DIR")
    if not out:
        return
    from tilegen.compiler import Kernel

    original = Kernel.__init__

    def init(self, *a, **k):
        original(self, *a, **k)
        key = repr(self.spec) if self.spec is not None else "DSL:" + self.name
        sha = hashlib.sha256(self.ptx.encode()).hexdigest()
        with open(os.path.join(out, "index.jsonl"), "a") as f:
            f.write(json.dumps({"key": key, "sha": sha}) + "\n")
        path = os.path.join(out, sha + ".ptx")
        if not os.path.exists(path):
            with open(path, "w") as f:
                f.write(self.ptx)

    Kernel.__init__ = init


def record(out: str) -> int:
    os.makedirs(out, exist_ok=True)
    env = dict(os.environ, PTXREC_DIR=os.path.abspath(out), PYTHONPATH=HERE + os.pathsep + REPO,
               TILEGEN_CACHE_DIR=tempfile.mkdtemp(prefix="tilegen-ptxrec-"))
    return subprocess.call([sys.executable, "-m", "pytest", "-q", "-p", "ptx_fingerprints", "-p", "no:cacheprovider"],
                           cwd=REPO, env=env)


def without_sources(ptx: str) -> str:
    return re.sub(r"\((\w+)\.py:\d+\)", "(source)", ptx)


def _text(d: str, sha: str) -> str:
    with open(os.path.join(d, sha + ".ptx")) as f:
        return f.read()


def _index(d: str) -> dict:
    keys = defaultdict(set)
    with open(os.path.join(d, "index.jsonl")) as f:
        for line in f:
            row = json.loads(line)
            keys[row["key"]].add(row["sha"])
    return keys


def check(d: str) -> int:
    os.environ["TILEGEN_CACHE"] = "0"
    sys.path.insert(0, REPO)
    import tilegen
    from tilegen.gemm import Epilogue, GemmSpec, TileShape, WarpLayout

    names = {"GemmSpec": GemmSpec, "TileShape": TileShape, "WarpLayout": WarpLayout, "Epilogue": Epilogue}
    recorded = _index(d)
    specs = {k: v for k, v in recorded.items() if not k.startswith("DSL:")}
    bad = exact = 0
    for key, shas in sorted(specs.items()):
        spec = eval(key, {"__builtins__": {}}, names)  # noqa: S307  (reprs this tool wrote)
        ptx = tilegen.compile(spec).ptx
        olds = [_text(d, sha) for sha in shas]
        exact += any(ptx == old for old in olds)
        if not any(without_sources(ptx) == without_sources(old) for old in olds):
            bad += 1
            print(f"DIFFERS: {key}")
    print(f"{len(specs)} GemmSpecs recompiled: {len(specs) - bad} identical apart from source lines "
          f"({exact} byte for byte), {bad} different")
    return 1 if bad else 0


def compare_dsl(old: str, new: str) -> int:
    a, b = _index(old), _index(new)
    dsl = sorted(k for k in set(a) | set(b) if k.startswith("DSL:"))
    texts = lambda d, shas: {without_sources(_text(d, s)) for s in shas}  # noqa: E731
    bad = [k for k in dsl if texts(old, a.get(k, ())) != texts(new, b.get(k, ()))]
    for k in bad:
        print(f"DIFFERS: {k}")
    print(f"{len(dsl)} DSL kernel names: {len(dsl) - len(bad)} with the same PTX texts (apart from source "
          f"lines), {len(bad)} different")
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] in ("record", "check"):
        sys.exit((record if sys.argv[1] == "record" else check)(sys.argv[2]))
    if len(sys.argv) == 4 and sys.argv[1] == "compare-dsl":
        sys.exit(compare_dsl(sys.argv[2], sys.argv[3]))
    print(__doc__.strip() + "\n    python3 tools/ptx_fingerprints.py compare-dsl OLD NEW   # DSL kernels of two records")
    sys.exit(2)
