"""The fragment probes recorded on an H200 (tests/data/fragments_h200.json), rerun on the
emulator: every mma atom, ldmatrix/stmatrix variant and wgmma case must give the words
the hardware gave, bit for bit. This checks the emulator's tensor-core semantics against the machine,
independently of both sets of tables."""
import json
from pathlib import Path

import numpy as np
import pytest

from tilegen.sim import GlobalMemory, launch, parse_ptx
from tilegen.verify.fragments import all_ops, build_probe

RECORD = json.loads((Path(__file__).parent / "data" / "fragments_h200.json").read_text())
POISON = 0xABABABAB


@pytest.mark.parametrize("probe", RECORD["probes"], ids=lambda p: p["name"])
def test_emulator_reproduces_the_h200(probe):
    assert probe["passed"], "the record says the hardware disagreed with the tables"
    kind, op = all_ops()[probe["name"]]
    built = build_probe(probe["name"], kind, op, RECORD["seed"])
    params = [p[0] for p in parse_ptx(built.ptx).entry(built.entry).params]
    mem = GlobalMemory()
    args = {}
    for param, key in zip(params, built.inputs):       # inputs are in kernel-argument order
        words = np.asarray(probe["inputs"][key], dtype=np.uint32)
        args[param] = mem.alloc(words.nbytes)
        mem.write(args[param], words)
    out = np.full(built.out_shape, POISON, dtype=np.uint32)
    args[params[-1]] = mem.alloc(out.nbytes)
    mem.write(args[params[-1]], out)
    launch(built.ptx, (1, 1, 1), built.threads, args, memory=mem, entry=built.entry)
    got = mem.read(args[params[-1]], out.nbytes, np.uint32).reshape(built.out_shape)
    want = np.asarray(probe["out"], dtype=np.uint32)
    bad = np.argwhere(got != want)
    assert bad.size == 0, (f"{probe['name']}: {len(bad)} words differ from the {RECORD['gpu']}, first at "
                           f"{tuple(bad[0])}: emulator 0x{got[tuple(bad[0])]:08x}, GPU 0x{want[tuple(bad[0])]:08x}")
