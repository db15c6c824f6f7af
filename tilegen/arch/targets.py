"""Per-target limits and the PTX ISA versions features need.

| target | shared memory per block (opt-in) | notes                                 |
| ------ | -------------------------------- | ------------------------------------- |
| sm_80  | 163 KB (166912 B)                | A100                                  |
| sm_86  | 99 KB (101376 B)                 | GA10x                                 |
| sm_89  | 99 KB (101376 B)                 | Ada; fp8 mma                          |
| sm_90  | 227 KB (232448 B)                | Hopper; stmatrix, TMA                 |
| sm_90a | 227 KB (232448 B)                | Hopper arch-specific: wgmma, setmaxnreg |

Static shared memory is capped at 48 KB; more needs dynamic shared memory and the
MAX_DYNAMIC_SHARED_SIZE attribute. Every target: 255 registers per thread, 64K per SM,
1024 threads per block.
"""
from __future__ import annotations

from dataclasses import dataclass

MAX_PTX = (9, 0)  # the newest ISA CUDA 13.0's ptxas and driver 580's JIT accept
STATIC_SMEM_MAX = 48 * 1024  # above this, dynamic shared memory needs the opt-in attribute
SETMAXNREG_RANGE = (24, 256)  # setmaxnreg's register counts, in steps of 8 (ptx.md 6.8)


@dataclass(frozen=True)
class Target:
    name: str
    sm: int
    arch_specific: bool
    smem_per_block: int          # opt-in maximum, bytes
    min_ptx: tuple[int, int]     # the floor the target itself imposes
    smem_static_max: int = STATIC_SMEM_MAX
    regs_per_thread: int = 255
    regs_per_sm: int = 65536
    max_threads: int = 1024

    def __str__(self) -> str:
        return self.name


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target("sm_80", 80, False, 166912, (7, 0)),
        Target("sm_86", 86, False, 101376, (7, 1)),
        Target("sm_89", 89, False, 101376, (7, 8)),
        Target("sm_90", 90, False, 232448, (7, 8)),
        Target("sm_90a", 90, True, 232448, (8, 0)),
    )
}


NEWER_GPUS = "sm_89"   # the target of GPUs newer than Hopper (target_for)


def target_for(cc) -> str:
    """The target of a GPU of compute capability cc = (major, minor): sm_XY where tilegen has it,
    else the newest plain (not arch-specific) target below it, e.g. (8, 7) -> sm_86; a GPU newer
    than Hopper (sm_100, sm_120) takes NEWER_GPUS, sm_89's kernels (mma.sync, fp8 included), whose
    PTX its driver compiles for it: no choice then treats it as Hopper, whose wgmma kernels are
    sm_90a's and do not load beyond it."""
    want = 10 * int(cc[0]) + int(cc[1])
    exact = f"sm_{want}"
    if exact in TARGETS:
        return exact
    if want > 90:
        return NEWER_GPUS
    plain = [t for t in TARGETS.values() if not t.arch_specific and t.sm <= want]
    if not plain:
        raise ValueError(f"compute capability {cc[0]}.{cc[1]} is older than every tilegen target "
                         f"({', '.join(TARGETS)})")
    return max(plain, key=lambda t: t.sm).name


def target(name: str) -> Target:
    try:
        return TARGETS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown target {name!r}; allowed: {', '.join(TARGETS)}") from None


# Lowest PTX ISA version of each feature tilegen emits (ptx.md section 1.3).
FEATURE_PTX = {
    "mma": (7, 0),
    "mma.fp8": (8, 4),
    "ldmatrix": (7, 0),
    "stmatrix": (7, 8),
    "cp.async": (7, 0),
    "cvt.rna.tf32": (7, 0),
    "cvt.rn.tf32": (7, 8),   # one instruction on sm_90 where .rna takes three (ptx.md 3.3)
    "wgmma": (8, 0),
    "fence.proxy.async": (8, 0),
    "mbarrier": (8, 0),   # arrive.expect_tx, try_wait.parity (ptx.md 6.6)
    "tma": (8, 0),        # cp.async.bulk.tensor with mbarrier::complete_tx (ptx.md 6.4)
    "setmaxnreg": (8, 0),  # ptx.md 6.8
    "cluster": (8, 0),     # mapa, barrier.cluster, .multicast::cluster, remote arrive (7.8; multicast 8.0; 6.9)
}


# Lowest target of the features that are not on every sm_80+ target.
FEATURE_SM = {"mma.fp8": 89, "cvt.rn.tf32": 90, "stmatrix": 90, "wgmma": 90, "fence.proxy.async": 90,
              "mbarrier": 90, "tma": 90, "setmaxnreg": 90, "cluster": 90}
# Features of the arch-specific targets only (sm_90a).
FEATURE_ARCH_SPECIFIC = {"wgmma", "setmaxnreg"}


def ptx_version_for(tgt: Target | str, features=()) -> tuple[int, int]:
    """The lowest `.version` that covers the target and every feature used."""
    tgt = target(tgt) if isinstance(tgt, str) else tgt
    v = tgt.min_ptx
    for f in features:
        if f not in FEATURE_PTX:
            raise ValueError(f"unknown PTX feature {f!r}; known: {', '.join(FEATURE_PTX)}")
        if FEATURE_SM.get(f, 0) > tgt.sm:
            raise ValueError(f"{f} needs sm_{FEATURE_SM[f]} or newer, not {tgt.name}")
        if f in FEATURE_ARCH_SPECIFIC and not tgt.arch_specific:
            raise ValueError(f"{f} needs an arch-specific target (sm_90a), not {tgt.name}")
        v = max(v, FEATURE_PTX[f])
    if v > MAX_PTX:
        raise ValueError(f"PTX {v[0]}.{v[1]} needed, above the supported maximum {MAX_PTX[0]}.{MAX_PTX[1]}")
    return v
