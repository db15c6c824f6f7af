"""Targets and PTX ISA versions (ptx.md sections 1.2 and 1.3)."""
from __future__ import annotations

import itertools

import pytest

from tilegen.arch import TARGETS, ptx_version_for, target
from tilegen.arch import targets as targets_mod

# ptx.md 1.3: the floor each target imposes on .version
# Targets' compute capability and the features that need more than sm_80 (ptx.md 1.3).
SM = {"sm_80": 80, "sm_86": 86, "sm_89": 89, "sm_90": 90, "sm_90a": 90}
FEATURE_SM = {"mma.fp8": 89, "stmatrix": 90}
TARGET_FLOOR = {"sm_80": (7, 0), "sm_86": (7, 1), "sm_89": (7, 8), "sm_90": (7, 8), "sm_90a": (8, 0)}
# ptx.md 1.3: lowest .version per feature
FEATURE_FLOOR = {"mma": (7, 0), "mma.fp8": (8, 4), "ldmatrix": (7, 0), "stmatrix": (7, 8),
                 "cp.async": (7, 0), "cvt.rna.tf32": (7, 0)}
# ptx.md 1.2: CUDA 13.0 ptxas and driver 580 accept at most 9.0
MAX = (9, 0)


def test_targets_are_the_five_supported():
    assert set(TARGETS) == set(TARGET_FLOOR)
    for name, t in TARGETS.items():
        assert t.name == name == str(t)
        assert target(name) is t


@pytest.mark.parametrize("name", sorted(TARGET_FLOOR))
def test_target_floor(name):
    assert ptx_version_for(name) == TARGET_FLOOR[name]
    assert ptx_version_for(target(name)) == TARGET_FLOOR[name]
    assert target(name).min_ptx == TARGET_FLOOR[name]


def test_target_properties():
    assert {n: t.sm for n, t in TARGETS.items()} == {"sm_80": 80, "sm_86": 86, "sm_89": 89, "sm_90": 90, "sm_90a": 90}
    assert [n for n, t in TARGETS.items() if t.arch_specific] == ["sm_90a"]
    # opt-in shared memory per block: H200 232448 B (ptx.md 1.4); A100 163 KB; GA10x and Ada 99 KB
    # (CUDA C++ Programming Guide, compute capability table)
    assert {n: t.smem_per_block for n, t in TARGETS.items()} == {
        "sm_80": 163 * 1024, "sm_86": 99 * 1024, "sm_89": 99 * 1024, "sm_90": 232448, "sm_90a": 232448}
    for t in TARGETS.values():
        assert t.smem_static_max == 48 * 1024 <= t.smem_per_block


@pytest.mark.parametrize("feature", sorted(FEATURE_FLOOR))
@pytest.mark.parametrize("name", sorted(TARGET_FLOOR))
def test_feature_floor(name, feature):
    if SM[name] < FEATURE_SM.get(feature, 80):
        with pytest.raises(ValueError, match=f"sm_{FEATURE_SM[feature]}"):
            ptx_version_for(name, [feature])
        return
    assert ptx_version_for(name, [feature]) == max(TARGET_FLOOR[name], FEATURE_FLOOR[feature])


def test_named_floors():
    assert ptx_version_for("sm_89", ["mma.fp8"]) == (8, 4)
    assert ptx_version_for("sm_90", ["mma", "mma.fp8", "cp.async"]) == (8, 4)
    assert ptx_version_for("sm_90", ["stmatrix"]) == (7, 8)
    assert ptx_version_for("sm_80", ["mma", "ldmatrix", "cp.async", "cvt.rna.tf32"]) == (7, 0)
    assert ptx_version_for("sm_86", ["mma"]) == (7, 1)
    assert ptx_version_for("sm_90a", ["stmatrix"]) == (8, 0)


def test_never_above_9_0():
    feats = sorted(FEATURE_FLOOR)
    for name in TARGET_FLOOR:
        for r in range(len(feats) + 1):
            for combo in itertools.combinations(feats, r):
                if any(SM[name] < FEATURE_SM.get(f, 80) for f in combo):
                    continue
                v = ptx_version_for(name, combo)
                assert v <= MAX
                assert v == max([TARGET_FLOOR[name]] + [FEATURE_FLOOR[f] for f in combo])
    assert targets_mod.MAX_PTX == MAX


def test_feature_above_the_maximum_is_refused(monkeypatch):
    monkeypatch.setitem(targets_mod.FEATURE_PTX, "future", (9, 1))
    with pytest.raises(ValueError, match="9.0"):
        ptx_version_for("sm_90", ["future"])


@pytest.mark.parametrize("bad", ["sm_75", "sm_70", "sm_100a", "SM_80", "80", "", None, 80, ["sm_80"]])
def test_unknown_target_lists_legal_names(bad):
    with pytest.raises(ValueError) as e:
        target(bad)
    for name in TARGET_FLOOR:
        assert name in str(e.value)
    with pytest.raises(ValueError) as e:
        ptx_version_for(bad) if isinstance(bad, str) else target(bad)
    for name in TARGET_FLOOR:
        assert name in str(e.value)


def test_wgmma_needs_the_arch_specific_target():
    """ptx.md 1.3 / 6.1: wgmma from PTX 8.0, on sm_90a only; fence.proxy.async on sm_90."""
    assert ptx_version_for("sm_90a", ["wgmma", "fence.proxy.async", "cp.async"]) == (8, 0)
    assert ptx_version_for("sm_90", ["fence.proxy.async"]) == (8, 0)
    for name in ("sm_90", "sm_89", "sm_80"):
        with pytest.raises(ValueError, match="sm_90"):
            ptx_version_for(name, ["wgmma"])


def test_tma_and_mbarriers_need_hopper():
    """ptx.md 1.3: TMA and mbarrier transaction counts from PTX 8.0 on sm_90 (not only sm_90a)."""
    assert ptx_version_for("sm_90", ["tma", "mbarrier"]) == (8, 0)
    for f in ("tma", "mbarrier"):
        with pytest.raises(ValueError, match="sm_90"):
            ptx_version_for("sm_89", [f])


@pytest.mark.parametrize("bad", ["tcgen05", "mma.sync", "", "tma.multicast"])
def test_unknown_feature_lists_known_features(bad):
    with pytest.raises(ValueError) as e:
        ptx_version_for("sm_90", [bad])
    for f in FEATURE_FLOOR:
        assert f in str(e.value)
