"""tilegen.tune.space on the CPU: the search space, its pruning before compilation, the prior."""
import math

import pytest

import tilegen
from tilegen import GemmSpec
from tilegen.tune import space as S
from tests.ptxas_util import needs_ptxas

LAYOUTS = [("row", "row"), ("row", "col"), ("col", "row"), ("col", "col")]


@pytest.fixture(scope="module")
def f16_rr():
    return S.enumerate_space("f16", "row", "row", "f32", "sm_90")


def _npoints(dtype, space=S.SearchSpace()):
    return sum(1 for _ in S.points(dtype, space))


@pytest.mark.parametrize("dtype", S.TUNE_DTYPES)
@pytest.mark.parametrize("layouts", LAYOUTS)
def test_every_candidate_is_a_valid_distinct_spec(dtype, layouts):
    res = S.enumerate_space(dtype, *layouts, "f32", "sm_90")
    assert res.candidates, "the space must not be empty"
    assert len(set(res.candidates)) == len(res.candidates)
    for spec in res.candidates:
        assert isinstance(spec, GemmSpec)
        # rebuilding from its own fields gives the same spec: it constructs, validation included
        again = GemmSpec(dtype=spec.dtype, a_layout=spec.a_layout, b_layout=spec.b_layout,
                         out_dtype=spec.out_dtype, target=spec.target, tile=tuple(spec.tile),
                         warps=tuple(spec.warps), stages=spec.stages, swizzle=spec.swizzle,
                         group_m=spec.group_m, frag_buffers=spec.frag_buffers)
        assert again == spec
        assert (spec.dtype, spec.a_layout, spec.b_layout, spec.target) == (dtype, *layouts, "sm_90")
        assert spec.smem_bytes() <= spec.target_info.smem_per_block
        assert S.register_estimate(spec) <= S.register_limit(spec.threads)
        assert spec.warps.count in (4, 8, 16)
        assert all(w in (32, 64) for w in spec.warp_tile)
        assert spec.tile.k in S.K_TILES[dtype]
    # every point is either a candidate or pruned with a reason
    assert len(res.candidates) + len(res.pruned) == _npoints(dtype)


def test_pruned_points_carry_their_reason(f16_rr):
    kinds = f16_rr.reasons()
    assert set(kinds) <= {"spec", "duplicate", "registers (estimate)"}
    assert kinds["spec"] > 0 and kinds["duplicate"] > 0 and kinds["registers (estimate)"] > 0
    for p in f16_rr.pruned:
        assert p.reason and p.params
        assert str(p).startswith(S.params_text(p.params))


def test_shared_memory_pruning_names_the_limit(f16_rr):
    big = {"tile": (256, 256, 128), "warps": (4, 4), "stages": 5, "swizzle": "auto", "group_m": 8,
           "frag_buffers": 2}
    hit = [p for p in f16_rr.pruned if p.params == big]
    assert len(hit) == 1
    assert hit[0].reason.startswith("spec:") and "shared memory" in hit[0].reason
    # the same point on a target with less shared memory is pruned as well, and a smaller one is not
    small = S.enumerate_space("f16", "row", "row", "f32", "sm_86",
                              S.SearchSpace(tile_mn=(128,), tile_k=(64,), warp_counts=(4,), stages=(3,),
                                            swizzles=("auto",), group_m=(8,), frag_buffers=(2,)))
    assert [S.spec_text(s) for s in small.candidates] == ["128x128x64 w2x2 s3 128B g8 fb2"]


def test_divisibility_pruning():
    res = S.enumerate_space("tf32", "row", "row", "f32", "sm_90",
                            S.SearchSpace(tile_mn=(64,), tile_k=(16,), warp_counts=(4,), stages=(2,),
                                          swizzles=("128B",), group_m=(8,), frag_buffers=(1,)))
    # 64 x 16 tf32 rows are 64 bytes: no 128-byte swizzle
    assert not res.candidates
    assert all(p.reason.startswith("spec:") and "swizzle" in p.reason for p in res.pruned)


def test_register_estimate_prunes_16_warps_with_big_warp_tiles(f16_rr):
    regs = [p for p in f16_rr.pruned if p.reason.startswith("registers (estimate)")]
    assert regs
    for p in regs:
        assert "65536 per SM" in p.reason or "> 255" in p.reason
        w = p.params["warps"]
        spec = S.make_spec("f16", "row", "row", "f32", "sm_90", p.params)
        assert S.register_estimate(spec) > S.register_limit(32 * w[0] * w[1])
    assert S.register_limit(512) == 128 and S.register_limit(256) == 255 and S.register_limit(128) == 255


def test_duplicates_name_the_first_spelling(f16_rr):
    dups = [p for p in f16_rr.pruned if p.reason.startswith("duplicate")]
    assert dups
    # "auto" resolves to a concrete mode, so auto and that mode are the same kernel
    d = dups[0]
    assert "same kernel as" in d.reason
    assert d.params["swizzle"] != "auto"


def test_the_default_spec_is_in_the_space():
    for dtype in S.TUNE_DTYPES:
        for layouts in LAYOUTS:
            res = S.enumerate_space(dtype, *layouts, "f32", "sm_90")
            assert S.default_spec(dtype, *layouts, "f32", "sm_90") in res.candidates


def test_unknown_dtype_is_refused():
    with pytest.raises(ValueError, match="tf32, f16, bf16"):
        S.enumerate_space("e4m3", "row", "col")


def test_prior_orders_and_is_finite(f16_rr):
    m = n = k = 4096
    prior = {s: S.prior_ms(s, m, n, k) for s in f16_rr.candidates}
    assert all(math.isfinite(v) and v > 0 for v in prior.values())
    base = [s for s in f16_rr.candidates if S.base_variant(s)]
    order = S.diverse_order(base, prior)
    assert sorted(map(S.spec_text, order)) == sorted(map(S.spec_text, base))  # a permutation
    # a short budget sees several tile shapes: the first 12 span at least 4 (tile M, N, warps) groups
    assert len({(s.tile.m, s.tile.n, tuple(s.warps)) for s in order[:12]}) >= 4
    # 64x64 warp tiles rank before 32x32 ones of the same CTA tile
    big = S.make_spec("f16", "row", "row", "f32", "sm_90", {"tile": (128, 128, 64), "warps": (2, 2)})
    small = S.make_spec("f16", "row", "row", "f32", "sm_90", {"tile": (128, 128, 64), "warps": (4, 4)})
    assert S.prior_ms(big, m, n, k) < S.prior_ms(small, m, n, k)


def test_prior_sees_wave_quantisation():
    spec = S.default_spec("f16", "row", "row")
    assert S.ctas_per_sm(spec) == 2
    one_wave = S.prior_ms(spec, 128 * 12, 128 * 22, 1024, sms=132)       # 264 CTAs: 132 SMs x 2
    two_waves = S.prior_ms(spec, 128 * 12, 128 * 22 + 1, 1024, sms=132)  # 276 CTAs: a second wave
    assert two_waves > 1.5 * one_wave


def test_base_variant_and_shape():
    spec = S.default_spec("f16", "row", "row")
    assert S.base_variant(spec)
    assert not S.base_variant(spec.replace(group_m=4))
    assert not S.base_variant(spec.replace(swizzle="pad"))
    assert S.shape_of(spec) == ((128, 128, 64), (2, 2), 3, 2, "mma.sync", False, False)
    assert S.spec_text(spec) == "128x128x64 w2x2 s3 128B g8 fb2"


@needs_ptxas
@pytest.mark.parametrize("dtype", S.TUNE_DTYPES)
def test_register_estimate_is_below_ptxas(dtype):
    """The estimate must only prune what ptxas would refuse: it stays at or under ptxas's count."""
    picks = [((128, 128, 64 if dtype != "tf32" else 32), (2, 2), 2), ((64, 64, 32), (2, 2), 1),
             ((128, 256, 32), (2, 4), 2), ((128, 128, 32), (4, 4), 1)]
    for tile, warps, fb in picks:
        spec = GemmSpec(dtype=dtype, tile=tile, warps=warps, frag_buffers=fb, target="sm_90")
        res = tilegen.compile(spec).resources
        assert res is not None
        assert S.register_estimate(spec) <= res.registers, (S.spec_text(spec), res)


def test_the_hopper_space_is_the_wgmma_kernels():
    res = S.enumerate_space("f16", "row", "row", "f16", "sm_90", S.SearchSpace(instruction="wgmma"))
    specs = res.candidates
    assert specs and all(s.instruction == "wgmma" and s.target == "sm_90a" for s in specs)
    assert {s.persistent for s in specs} == {True, False}
    assert any(s.warp_specialized and s.store == "tma" for s in specs)
    assert {(s.tile.m, s.tile.n) for s in specs} == {(128, 256), (128, 128), (256, 128), (128, 192), (64, 256)}
    pp = [s for s in specs if s.pingpong]
    assert pp and all((s.tile.m, s.tile.n, s.warps.m, s.warps.n) == (64, 256, 4, 1) for s in pp)
    assert S.spec_text(pp[0]).endswith(" pingpong")
    assert {s.cluster for s in specs} == {(1, 1), (2, 1), (1, 2)}
    assert all(s.warp_specialized for s in specs if s.cluster != (1, 1))
    # five stages of 128x256x64 do not fit: pruned with the reason, never compiled
    assert any("246864 bytes of shared memory" in p.reason for p in res.pruned)
    assert S.spec_text(S.default_spec("f16", "row", "row", "f16", instruction="wgmma")).endswith("wgmma ws tmastore")
    # wgmma reads its operands from shared memory: no fragment registers in the estimate
    ws = S.default_spec("f16", "row", "row", "f16", instruction="wgmma")
    assert S.register_estimate(ws) == 128 + S.REG_OVERHEAD
