"""The split shared-memory address (thread part ^ X) + D equals the layout's offset for every
lane, whatever the layout, swizzle and split (ir/lower/smem.py against tilegen.layout)."""
import random

import pytest

from tilegen.arch.dtypes import dtype
from tilegen.ir.builder import Builder
from tilegen.ir.lower.smem import shared_address
from tilegen.ir.tile import SharedTile
from tilegen.ir.layout import SmemLayout
from seeds import seed


class _Ctx:
    smem = 0

    def __init__(self):
        self.addresses = {}


LAYOUTS = [(rows, cols, esize, mode)
           for mode in ("128B", "64B", "32B", "pad", "none")
           for (rows, cols, esize) in ((64, 64, 2), (32, 128, 2), (16, 32, 4), (32, 64, 4), (64, 128, 1))
           if SmemLayout.__init__ and (mode not in ("128B", "64B", "32B")
                                       or cols * esize % {"128B": 128, "64B": 64, "32B": 32}[mode] == 0)]


@pytest.mark.parametrize("lane_step", [16, 4])   # (4: a lane per 4-byte column, as tf32's register loads)
@pytest.mark.parametrize("rows,cols,esize,mode", LAYOUTS)
def test_split_address_matches_layout(rows, cols, esize, mode, lane_step):
    layout = SmemLayout(rows, cols, esize, mode)
    tile = SharedTile("t", dtype({1: "e4m3", 2: "f16", 4: "f32"}[esize]), layout, stages=2, offset=2048)
    rng = random.Random(seed(rows, cols, esize, mode, lane_step))
    split_used = 0
    for _ in range(300):
        # runtime parts: a warp offset with some alignment plus one of a few lane values
        row_warp = rng.choice([0, 8, 16, 4, 3]) * rng.randrange(0, 2)
        col_warp = rng.choice([0, 16, 32, 64, 128, 48]) * rng.randrange(0, 2)
        row_vals = sorted({rng.randrange(0, 8) for _ in range(3)})
        col_vals = sorted({rng.randrange(0, 8) * lane_step for _ in range(3)})
        row_ct = rng.choice([0, 4, 8, 16, 1, 2])
        col_ct = rng.choice([0, 16, 32, 64, 128, 8])
        if row_warp + max(row_vals) + row_ct >= rows or col_warp + max(col_vals) + col_ct + 16 > cols * esize \
                or (col_warp + max(col_vals) + col_ct) % esize:
            continue
        stage = rng.randrange(0, 2)
        for rv in row_vals:
            for cv in col_vals:
                ctx = _Ctx()
                b = Builder([])
                reg, disp = shared_address(b, ctx, tile, stage, (row_warp, rv, row_vals, row_ct),
                                           (col_warp, cv, col_vals, col_ct))
                split_used += disp != 0
                want = 2048 + stage * layout.stage_bytes + layout.offset(row_warp + rv + row_ct,
                                                                         col_warp + cv + col_ct)
                assert reg + disp == want, (row_warp, rv, row_ct, col_warp, cv, col_ct)
    assert split_used, "the split form was never exercised"
