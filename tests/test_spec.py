"""GemmSpec: completeness, immutability, equality, validation (DESIGN.md "Contract")."""
from __future__ import annotations

import dataclasses
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tilegen
from tilegen import Epilogue, GemmSpec, SpecError, TileShape, WarpLayout
from tilegen.arch import MMA_ATOMS

# Facts written out here on their own (ptx.md 1.3, 1.4; DESIGN.md)
OPERANDS = ("tf32", "f16", "bf16", "e4m3", "e5m2")
BYTES = {"tf32": 4, "f16": 2, "bf16": 2, "e4m3": 1, "e5m2": 1}
TARGETS = ("sm_80", "sm_86", "sm_89", "sm_90", "sm_90a")
TARGET_SM = {"sm_80": 80, "sm_86": 86, "sm_89": 89, "sm_90": 90, "sm_90a": 90}
SMEM_LIMIT = {"sm_80": 166912, "sm_86": 101376, "sm_89": 101376, "sm_90": 232448, "sm_90a": 232448}
SWIZZLE_SPAN = {"128B": 128, "64B": 64, "32B": 32}
RESOLVED_SWIZZLES = ("128B", "64B", "32B", "pad", "none")
FIELDS = ("dtype", "acc_dtype", "out_dtype", "a_layout", "b_layout", "tile", "warps", "atom",
          "stages", "swizzle", "group_m", "epilogue", "target")


def _fields(spec):
    return {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}


def check_invariants(spec: GemmSpec):
    """What every spec the constructor returns must satisfy, checked from first principles."""
    assert set(_fields(spec)) >= set(FIELDS)
    assert spec.dtype in OPERANDS
    assert spec.target in TARGETS
    assert spec.acc_dtype in ("f32", "f16") and spec.out_dtype in ("f32", "f16", "bf16")
    assert spec.a_layout in ("row", "col") and spec.b_layout in ("row", "col")
    t, w = spec.tile, spec.warps
    assert isinstance(t, TileShape) and isinstance(w, WarpLayout)
    for v in (t.m, t.n, t.k, w.m, w.n):
        assert type(v) is int and v > 0
    assert 1 <= w.m * w.n <= 16
    atom = MMA_ATOMS[spec.atom]
    assert atom.a_type.name == spec.dtype and atom.acc_type.name == spec.acc_dtype
    # the tile divides into warps, and each warp tile into atoms
    assert t.m % (w.m * atom.m) == 0
    assert t.n % (w.n * atom.n) == 0
    assert t.k % atom.k == 0
    # the hardware must have the instructions
    assert TARGET_SM[spec.target] >= atom.min_sm
    if spec.dtype in ("e4m3", "e5m2"):
        assert TARGET_SM[spec.target] >= 89
        assert (spec.a_layout, spec.b_layout) == ("row", "col")   # K-major only (ptx.md 2.6)
    assert type(spec.stages) is int and spec.stages >= 2
    assert type(spec.group_m) is int and spec.group_m >= 1
    assert isinstance(spec.epilogue, Epilogue)
    # swizzle resolved, and it fits both operands' shared rows
    assert spec.swizzle in RESOLVED_SWIZZLES
    esize = BYTES[spec.dtype]
    a_row = (t.k if spec.a_layout == "row" else t.m) * esize
    b_row = (t.n if spec.b_layout == "row" else t.k) * esize
    if spec.swizzle in SWIZZLE_SPAN:
        assert a_row % SWIZZLE_SPAN[spec.swizzle] == 0 and b_row % SWIZZLE_SPAN[spec.swizzle] == 0
    # shared memory: at least the operand bytes of every stage, at most what the target has
    need = spec.stages * (t.m * t.k + t.k * t.n) * esize
    assert need <= spec.smem_bytes() <= SMEM_LIMIT[spec.target]
    # hashable; resolving twice changes nothing
    again = GemmSpec(**_fields(spec))
    assert again == spec and hash(again) == hash(spec)
    assert isinstance(str(spec), str) and spec.dtype in str(spec)


# ---------------------------------------------------------------------------------------------
# Defaults, immutability, equality
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dt", ["tf32", "f16", "bf16"])
def test_default_spec_is_complete(dt):
    spec = GemmSpec(dtype=dt)
    for name, value in _fields(spec).items():
        assert value is not None or name == "epilogue", name
    assert spec.swizzle != "auto"
    assert spec.atom in MMA_ATOMS
    check_invariants(spec)


@pytest.mark.parametrize("name, value", [("dtype", "bf16"), ("stages", 4), ("tile", (64, 64, 32)),
                                         ("swizzle", "none"), ("target", "sm_90")])
def test_spec_is_frozen(name, value):
    spec = GemmSpec(dtype="f16")
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(spec, name, value)
    assert getattr(spec, name) != value


def test_spec_is_hashable_and_usable_as_key():
    a, b = GemmSpec(dtype="f16"), GemmSpec(dtype="f16")
    assert a == b and hash(a) == hash(b)
    cache = {a: 1}
    assert cache[b] == 1
    assert len({GemmSpec(dtype=d) for d in ("tf32", "f16", "bf16", "f16")}) == 3


@pytest.mark.parametrize("explicit", [
    dict(tile=(128, 128, 64), swizzle="128B"),
    dict(tile=[128, 128, 64]),
    dict(tile=TileShape(128, 128, 64)),
    dict(warps=WarpLayout(2, 2)),
    dict(warps=[2, 2]),
    dict(atom="m16n8k16.f16.f32"),
    dict(acc_dtype="f32", out_dtype="f32", a_layout="row", b_layout="row", stages=3, target="sm_80"),
    dict(epilogue=Epilogue()),
])
def test_equal_after_defaults_resolve(explicit):
    base = GemmSpec(dtype="f16")
    other = GemmSpec(dtype="f16", **explicit)
    assert base == other
    assert hash(base) == hash(other)


@pytest.mark.parametrize("change", [dict(dtype="bf16"), dict(stages=4), dict(swizzle="pad"),
                                    dict(tile=(128, 64, 64)), dict(target="sm_90"),
                                    dict(epilogue=Epilogue(activation="relu")), dict(group_m=4)])
def test_different_specs_differ(change):
    assert GemmSpec(dtype="f16") != GemmSpec(**{"dtype": "f16", **change})


def test_replace_revalidates():
    spec = GemmSpec(dtype="f16")
    assert spec.replace(stages=4).stages == 4
    with pytest.raises(SpecError):
        spec.replace(stages=1)


# ---------------------------------------------------------------------------------------------
# Explicit errors: each names the field, the bad value and the legal set
# ---------------------------------------------------------------------------------------------

def _error(**kw) -> SpecError:
    with pytest.raises(SpecError) as e:
        GemmSpec(**kw)
    return e.value


def _names(err: SpecError, field: str, value, legal=()):
    msg = str(err)
    assert field in msg, msg
    assert (repr(value) in msg) or (str(value) in msg), msg
    for x in legal:
        assert str(x) in msg, f"{x!r} missing from: {msg}"
    return msg


def test_spec_error_is_a_value_error_and_tilegen_error():
    err = _error(dtype="f64")
    assert isinstance(err, ValueError) and isinstance(err, tilegen.TilegenError)
    _names(err, "dtype", "f64", OPERANDS)


@pytest.mark.parametrize("tile, warps, dim, legal", [
    ((80, 128, 64), (2, 2), "m", "32"),     # tile.m: a multiple of warps.m * atom.m = 2 * 16
    ((96, 128, 64), (4, 2), "m", "64"),
    ((128, 80, 64), (2, 2), "n", ""),       # warps.n * atom.n = 16 divides 80, but B fragments
    ((128, 100, 64), (2, 2), "n", ""),      # are loaded two n8 atoms at a time (ldmatrix.x4)
    ((128, 96, 64), (2, 4), "n", ""),
])
def test_tile_not_divisible_by_warp_tile(tile, warps, dim, legal):
    err = _error(dtype="f16", tile=tile, warps=warps)
    msg = _names(err, "tile", tile)
    assert f"tile.{dim}" in msg and "multiple" in msg
    assert legal in msg


@pytest.mark.parametrize("dt, k, atom_k", [("f16", 24, 16), ("tf32", 12, 8), ("bf16", 40, 16)])
def test_tile_k_not_divisible_by_atom(dt, k, atom_k):
    err = _error(dtype=dt, tile=(128, 128, k))
    msg = _names(err, "tile", (128, 128, k))
    assert str(atom_k) in msg


@pytest.mark.parametrize("dt, atom, legal", [
    ("f16", "m16n8k8.tf32.f32", ["m16n8k16.f16.f32", "m16n8k8.f16.f32"]),
    ("tf32", "m16n8k16.f16.f32", ["m16n8k8.tf32.f32", "m16n8k4.tf32.f32"]),
    ("bf16", "m16n8k16.f16.f32", ["m16n8k16.bf16.f32", "m16n8k8.bf16.f32"]),
])
def test_atom_incompatible_with_dtype(dt, atom, legal):
    _names(_error(dtype=dt, atom=atom), "atom", atom, legal)


def test_acc_dtype_without_atom():
    _names(_error(dtype="bf16", acc_dtype="f16"), "acc_dtype", "f16", ["f32"])
    _names(_error(dtype="tf32", acc_dtype="f16"), "acc_dtype", "f16", ["f32"])


def test_shared_memory_over_target_limit():
    big = dict(dtype="f16", tile=(128, 256, 64), warps=(2, 4))
    err = _error(stages=6, target="sm_86", **big)
    msg = _names(err, "stages", 6, [SMEM_LIMIT["sm_86"], "sm_86"])
    need = 6 * (128 * 64 + 64 * 256) * 2
    assert any(int(w) >= need for w in msg.replace(",", " ").split() if w.isdigit())
    # the same tile fits with fewer stages, or on a target with more shared memory
    check_invariants(GemmSpec(stages=2, target="sm_86", **big))
    check_invariants(GemmSpec(stages=3, target="sm_80", **big))
    # the default f16 tile: 3 stages fit in 99 KB, 4 do not
    check_invariants(GemmSpec(dtype="f16", stages=3, target="sm_86"))
    _names(_error(dtype="f16", stages=4, target="sm_86"), "stages", 4, [SMEM_LIMIT["sm_86"]])


@pytest.mark.parametrize("stages", [1, 0, -1])
def test_stages_below_two(stages):
    _names(_error(stages=stages), "stages", stages, ["2"])


@pytest.mark.parametrize("tgt", ["sm_75", "sm_70"])
def test_old_targets(tgt):
    _names(_error(target=tgt), "target", tgt, TARGETS)


@pytest.mark.parametrize("fp8", ["e4m3", "e5m2"])
def test_fp8_on_sm_80(fp8):
    for tgt in ("sm_80", "sm_86"):
        msg = _names(_error(dtype=fp8, b_layout="col", target=tgt), "target", tgt, ["sm_89", "sm_90"])
        assert "sm_80" not in msg.split("allowed")[-1]
    check_invariants(GemmSpec(dtype=fp8, b_layout="col", target="sm_89"))


@pytest.mark.parametrize("a_layout, b_layout", [("row", "row"), ("col", "col"), ("col", "row")])
def test_fp8_must_be_k_major(a_layout, b_layout):
    err = _error(dtype="e4m3", a_layout=a_layout, b_layout=b_layout, target="sm_90")
    bad = "a_layout" if a_layout != "row" else "b_layout"
    _names(err, bad, a_layout if bad == "a_layout" else b_layout, ["col"])


@pytest.mark.parametrize("swz", ["256B", "16B", "xor", "", "AUTO"])
def test_unknown_swizzle(swz):
    _names(_error(swizzle=swz), "swizzle", swz, ["128B", "64B", "32B", "pad", "none"])


def test_128B_swizzle_with_64_byte_rows():
    # f16 with tile.k = 32: A rows are 64 bytes
    msg = _names(_error(dtype="f16", tile=(128, 128, 32), swizzle="128B"), "swizzle", "128B", ["64B", "32B", "pad"])
    assert "128B" not in msg.split("allowed")[-1]
    spec = GemmSpec(dtype="f16", tile=(128, 128, 32))
    assert spec.swizzle == "64B"                      # auto: the widest that fits
    check_invariants(spec)


@pytest.mark.parametrize("field, value", [
    ("dtype", "f64"), ("dtype", None), ("acc_dtype", "f64"), ("out_dtype", "e4m3"),
    ("a_layout", "ROW"), ("b_layout", "ROW"), ("tile", (128, 128)), ("tile", (0, 128, 64)),
    ("tile", (128.0, 128, 64)), ("tile", (True, 128, 64)), ("tile", "128x128x64"),
    ("warps", (2,)), ("warps", (0, 2)), ("warps", (8, 4)), ("warps", "2x2"),
    ("stages", "3"), ("stages", 3.0), ("stages", True), ("group_m", 0), ("group_m", True),
    ("epilogue", "relu"), ("epilogue", 0), ("target", "sm_75"), ("target", 80),
])
def test_bad_field_names_itself(field, value):
    err = _error(**{field: value})
    assert err.field == field and field in str(err)


@pytest.mark.parametrize("kw, field", [
    (dict(bias="both"), "bias"), (dict(activation="tanh"), "activation"), (dict(residual=1), "residual"),
])
def test_bad_epilogue(kw, field):
    with pytest.raises(SpecError) as e:
        Epilogue(**kw)
    assert field in str(e.value)


# ---------------------------------------------------------------------------------------------
# Found while writing these tests: inputs that escape as other exceptions or pass unchecked
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("atom", ["bogus", "m16n8k8", 3])
def test_unknown_atom_is_spec_error(atom):
    _names(_error(dtype="f16", atom=atom), "atom", atom, ["m16n8k16.f16.f32"])


@pytest.mark.parametrize("kw", [dict(target=["sm_80"]), dict(atom=["m16n8k16.f16.f32"]),
                                dict(swizzle=["128B"]), dict(dtype=["f16"])])
def test_unhashable_values_are_spec_errors(kw):
    _error(**kw)


@pytest.mark.parametrize("kw", [dict(tile=TileShape(0, 128, 64)), dict(tile=TileShape(-128, 128, 64)),
                                dict(tile=TileShape("a", 128, 64)), dict(warps=WarpLayout(-2, -2)),
                                dict(warps=WarpLayout(2.0, 2))])
def test_tile_and_warp_objects_are_validated(kw):
    field = next(iter(kw))
    err = _error(dtype="f16", **kw)
    assert field in str(err)


def test_rows_that_do_not_fill_a_swizzle_period():
    # tf32 m16n8k4 with tile.k = 4 and A stored K x M (a_layout="col"): 4 rows of 512 bytes,
    # fewer than the 8 rows of one 1024-byte 128B period. Auto must pick a layout that works
    # (or raise SpecError); an explicit "128B" must be a SpecError, not a bare ValueError.
    kw = dict(dtype="tf32", atom="m16n8k4.tf32.f32", tile=(128, 128, 4), a_layout="col")
    try:
        spec = GemmSpec(**kw)
    except SpecError:
        pass
    else:
        check_invariants(spec)
    _error(swizzle="128B", **kw)


# ---------------------------------------------------------------------------------------------
# Property tests over the spec space
# ---------------------------------------------------------------------------------------------

SIZES_MN = (16, 32, 48, 64, 96, 128, 192, 256)
SIZES_K = (4, 8, 16, 24, 32, 64, 128, 256)
ATOM_NAMES = tuple(sorted(MMA_ATOMS))


def _tile():
    return st.tuples(st.sampled_from(SIZES_MN), st.sampled_from(SIZES_MN), st.sampled_from(SIZES_K))


def _warps():
    return st.tuples(st.sampled_from((1, 2, 4, 8)), st.sampled_from((1, 2, 4, 8)))


def _epilogue_kw():
    return st.fixed_dictionaries({}, optional={
        "bias": st.sampled_from([None, "row", "col"]),
        "activation": st.sampled_from(["none", "relu", "gelu_tanh", "gelu_erf", "silu"]),
        "residual": st.booleans()})


def plausible():
    """Values of the right kinds; combinations may still be invalid."""
    return st.fixed_dictionaries({"dtype": st.sampled_from(OPERANDS)}, optional={
        "acc_dtype": st.sampled_from(["f32", "f16"]),
        "out_dtype": st.sampled_from(["f32", "f16", "bf16"]),
        "a_layout": st.sampled_from(["row", "col"]),
        "b_layout": st.sampled_from(["row", "col"]),
        "tile": _tile(),
        "warps": _warps(),
        "atom": st.sampled_from(ATOM_NAMES),
        "stages": st.integers(0, 8),
        "swizzle": st.sampled_from(["auto", "128B", "64B", "32B", "pad", "none"]),
        "target": st.sampled_from(TARGETS),
        "group_m": st.integers(0, 70),
        "epilogue": _epilogue_kw(),
    })


GARBAGE = st.one_of(st.none(), st.booleans(), st.integers(-300, 300), st.floats(allow_nan=False),
                    st.text(max_size=6), st.just(["f16"]), st.just((1, 2, 3)), st.just({}))


def _maybe_garbage(legal):
    return st.one_of(legal, legal, legal, GARBAGE)


def with_garbage():
    return st.fixed_dictionaries({}, optional={
        "dtype": _maybe_garbage(st.sampled_from(OPERANDS)),
        "acc_dtype": _maybe_garbage(st.sampled_from(["f32", "f16"])),
        "out_dtype": _maybe_garbage(st.sampled_from(["f32", "f16", "bf16"])),
        "a_layout": _maybe_garbage(st.sampled_from(["row", "col"])),
        "b_layout": _maybe_garbage(st.sampled_from(["row", "col"])),
        "tile": _maybe_garbage(st.one_of(
            _tile(), st.builds(TileShape, st.integers(-64, 256), st.integers(-64, 256), st.integers(-64, 256)),
            st.lists(st.sampled_from(SIZES_MN), min_size=2, max_size=4),
            st.tuples(st.sampled_from(SIZES_MN), st.floats(1, 256), st.sampled_from(SIZES_K)))),
        "warps": _maybe_garbage(st.one_of(
            _warps(), st.builds(WarpLayout, st.integers(-4, 8), st.integers(-4, 8)),
            st.tuples(st.integers(-2, 20), st.integers(-2, 20)))),
        "atom": _maybe_garbage(st.sampled_from(ATOM_NAMES)),
        "stages": _maybe_garbage(st.integers(-2, 9)),
        "swizzle": _maybe_garbage(st.sampled_from(["auto", "128B", "64B", "32B", "pad", "none", "256B"])),
        "target": _maybe_garbage(st.sampled_from(TARGETS + ("sm_75", "sm_70", "sm_100"))),
        "group_m": _maybe_garbage(st.integers(-2, 70)),
        "epilogue": _maybe_garbage(_epilogue_kw().map(lambda kw: ("kw", kw))),
    })


def _construct(kw: dict):
    kw = dict(kw)
    ep = kw.get("epilogue")
    if isinstance(ep, dict):
        kw["epilogue"] = Epilogue(**ep)
    elif isinstance(ep, tuple) and len(ep) == 2 and ep[0] == "kw":
        kw["epilogue"] = Epilogue(**ep[1])
    return GemmSpec(**kw)


def _spec_or_spec_error(kw):
    try:
        spec = _construct(kw)
    except SpecError as e:
        assert e.field and str(e.field) in str(e) and "allowed" in str(e)
        return None
    check_invariants(spec)
    return spec


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plausible())
def test_plausible_specs_are_valid_or_spec_errors(kw):
    _spec_or_spec_error(kw)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(with_garbage())
def test_any_input_gives_a_spec_or_a_spec_error(kw):
    _spec_or_spec_error(kw)


VALID = [
    dict(dtype="f16"), dict(dtype="bf16", target="sm_90"), dict(dtype="tf32", stages=4),
    dict(dtype="f16", acc_dtype="f16", out_dtype="f16"), dict(dtype="f16", a_layout="col"),
    dict(dtype="bf16", b_layout="col", tile=(256, 128, 32), warps=(4, 2)),
    dict(dtype="tf32", atom="m16n8k4.tf32.f32", tile=(64, 64, 16), warps=(2, 2), stages=2),
    dict(dtype="f16", atom="m16n8k8.f16.f32", tile=(64, 128, 64), warps=(2, 2), swizzle="pad"),
    dict(dtype="e5m2", b_layout="col", target="sm_90a", tile=(128, 128, 128), stages=4),
    dict(dtype="f16", tile=(32, 32, 32), warps=(1, 1), stages=2, swizzle="none", group_m=1,
         epilogue=Epilogue(bias="row", activation="gelu_tanh", residual=True)),
]


@pytest.mark.parametrize("kw", VALID)
def test_valid_specs_satisfy_invariants(kw):
    assert _spec_or_spec_error(kw) is not None


def test_replace_resolves_again_what_the_spec_was_not_given():
    """spec.replace(dtype=...) or replace(pretranspose=False) gives the new spec's own defaults
    (the atom, tile, ... it resolved), and keeps what the caller chose."""
    assert GemmSpec(dtype="f16").replace(dtype="bf16") == GemmSpec(dtype="bf16")
    assert tuple(GemmSpec(dtype="f16", tile=(64, 64, 32)).replace(dtype="bf16").tile) == (64, 64, 32)
    pre = GemmSpec(dtype="tf32", instruction="wgmma", target="sm_90a", pretranspose=True)
    assert pre.replace(pretranspose=False) == GemmSpec(dtype="tf32", instruction="wgmma", target="sm_90a")
    f32 = GemmSpec(dtype="f32", instruction="wgmma", target="sm_90a")
    assert f32.replace(dtype="bf16") == GemmSpec(dtype="bf16", instruction="wgmma", target="sm_90a")
    wg = GemmSpec(dtype="bf16", instruction="wgmma")
    assert wg.replace(instruction="mma.sync") == GemmSpec(dtype="bf16")
    assert wg.replace(stages=3).stages == 3 and wg.replace(stages=3).tile == wg.tile


def test_replace_reads_the_values_alone():
    """Equal specs replace alike however they were made (here: one read back from its text)."""
    a = GemmSpec(dtype="f16")
    b = GemmSpec.from_text(a.to_text())
    assert a == b and a.replace(dtype="bf16") == b.replace(dtype="bf16") == GemmSpec(dtype="bf16")


def test_fp8_mma_sync_takes_four_stages_only_where_they_fit():
    """fp8 on mma.sync defaults to 128x128x64 tiles in 4 stages; a tile of one's own without
    stages keeps 4 where they fit the target's shared memory and 3 where only those do (the
    128x128x128 tile an older default wrote out), and an explicit 4 that does not fit is refused."""
    default = GemmSpec(dtype="e4m3", out_dtype="bf16", b_layout="col")
    assert (tuple(default.tile), tuple(default.warps), default.stages) == ((128, 128, 64), (2, 4), 4)
    deep = GemmSpec(dtype="e4m3", out_dtype="bf16", b_layout="col", tile=(128, 128, 128))
    assert deep.stages == 3 and deep.smem_bytes() <= deep.target_info.smem_per_block
    assert default.replace(tile=(128, 128, 128)) == deep and deep.replace(tile=(128, 128, 64)) == default
    assert GemmSpec.from_text(deep.to_text(minimal=True)) == deep
    assert GemmSpec(dtype="e5m2", b_layout="col", tile=(128, 256, 64)).stages == 4
    with pytest.raises(SpecError, match="4 stages needs 132096 bytes"):
        GemmSpec(dtype="e4m3", b_layout="col", tile=(128, 128, 128), stages=4)


def test_a_misspelled_field_names_the_nearest_one():
    with pytest.raises(TypeError, match=r"GemmSpec has no field 'stagez' \(did you mean 'stages'\?\); its fields: dtype,"):
        tilegen.GemmSpec(stagez=3)
    with pytest.raises(TypeError, match=r"Epilogue has no field 'activaton' \(did you mean 'activation'\?\)"):
        tilegen.Epilogue(activaton="relu")
    assert tilegen.GemmSpec(stages=3).replace(stages=4).stages == 4   # (replace builds through the same check)


def test_no_epilogue_is_the_plain_one():
    """epilogue=None (`epilogue = none` in a .tg file) means no epilogue: the plain one."""
    assert GemmSpec(epilogue=None) == GemmSpec()
    from tilegen.gemm import parse_spec_text
    assert parse_spec_text("gemm { dtype = bf16 epilogue = none }") == GemmSpec(dtype="bf16")


def test_numpy_integers_are_taken_as_ints():
    """Sizes computed with numpy (np.int64 stages, a tile from an array) are plain ints in the spec:
    equal to the spec of Python ints, with the same repr (which names its kernels' cache entries)."""
    import numpy as np

    got = GemmSpec(stages=np.int64(4), tile=tuple(np.array([128, 128, 64])), warps=np.array([2, 2]),
                   group_m=np.int32(4), split_k=np.int64(2), cluster=(np.int64(1), np.int64(1)))
    want = GemmSpec(stages=4, tile=(128, 128, 64), warps=(2, 2), group_m=4, split_k=2)
    assert got == want and repr(got) == repr(want) and hash(got) == hash(want)
    assert all(type(v) is int for v in (got.stages, got.group_m, got.split_k, got.tile.m, got.warps.n, *got.cluster))
    for bad in (dict(stages=np.float64(4)), dict(stages=True), dict(tile=(128.0, 128, 64))):
        with pytest.raises(SpecError):
            GemmSpec(**bad)


@pytest.mark.parametrize("name, hint", [("sm_100", "pass target='sm_89'"), ("sm_120", "pass target='sm_89'"),
                                        ("sm_90A", "lower case: 'sm_90a'"), ("sm_75", "needs sm_80 or newer")])
def test_an_unknown_target_says_what_to_use(name, hint):
    """A target tilegen has no code for says why and what to use (sm_100 had been told that tilegen
    needs sm_80 or newer)."""
    with pytest.raises(SpecError, match=re.escape(hint)):
        GemmSpec(target=name)


def test_a_tile_and_warps_that_do_not_fit_blame_the_field_given():
    """warps given with the default tile blame warps (and say the tile was the default); a tile
    given with the default warps blames the tile and says so; both given blame the tile."""
    with pytest.raises(SpecError, match=r"^warps=\(3, 2\) is invalid: the default tile 128x128x64 does not fit these "
                                        r"warps: pass a tile too; allowed: tile.m a multiple"):
        GemmSpec(warps=(3, 2))
    with pytest.raises(SpecError, match=r"^tile=\(48, 128, 64\) is invalid: it does not fit the default warps 2x2"):
        GemmSpec(tile=(48, 128, 64))
    with pytest.raises(SpecError, match=r"^tile=\(64, 64, 32\) is invalid; allowed: tile.n a multiple"):
        GemmSpec(tile=(64, 64, 32), warps=(2, 3))


@pytest.mark.parametrize("fields", [dict(cluster=(2, 1)), dict(stream_k=True), dict(persistent=True),
                                    dict(copy="tma"), dict(pingpong=True, tile=(64, 256, 64), warps=(4, 1))])
def test_a_hopper_field_on_mma_sync_says_to_add_instruction_wgmma(fields):
    """(The refusals had listed four conditions, or none, where instruction='wgmma' alone is enough.)"""
    with pytest.raises(tilegen.SpecError, match=r"add instruction='wgmma' \(the target sm_90a, persistent CTAs"):
        tilegen.GemmSpec(**fields)
    assert tilegen.GemmSpec(instruction="wgmma", **fields).target == "sm_90a"


@pytest.mark.parametrize("fields", [dict(copy="bogus"), dict(cluster=(2, 1), target="sm_80")])
def test_no_wgmma_hint_where_wgmma_would_not_take_it(fields):
    """A value no kernel takes, or a target given for another GPU, gets no hint to add instruction='wgmma'."""
    with pytest.raises(tilegen.SpecError) as e:
        tilegen.GemmSpec(**fields)
    assert "add instruction='wgmma'" not in str(e.value) and ": ;" not in str(e.value)
