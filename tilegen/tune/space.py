"""The autotuner's search space, its pruning before compilation, and the order it is tried in.

| knob          | values tried                                             | GemmSpec field |
| ------------- | -------------------------------------------------------- | -------------- |
| tile M, N     | 64, 128, 256                                             | tile           |
| tile K        | tf32 16, 32, 64; f16/bf16 32, 64, 128 (16..256 bytes)    | tile           |
| warps         | 4, 8 or 16 warps whose warp tile is 32 or 64 on each side | warps          |
| stages        | 2, 3, 4, 5                                               | stages         |
| swizzle       | auto, 128B, 64B, pad (deduplicated after auto resolves)  | swizzle        |
| group_m       | 1, 4, 8, 16                                              | group_m        |
| frag_buffers  | 1, 2                                                     | frag_buffers   |

Pruning, in order; each pruned point is kept with its reason (`Pruned`):

1. GemmSpec validation (SpecError): divisibility of the tile by warps and atoms, whole 16-byte
   copy rounds, swizzle fit, at most 128 accumulator registers, shared memory of all stages
   within the target's per-block limit.
2. A register estimate (`register_estimate`): accumulators + operand fragments (times
   frag_buffers) + the address/loop overhead measured with ptxas. A point is pruned when the
   estimate exceeds 255 registers per thread, or 65536 / threads (a CTA must fit on one SM).
   The overheads are chosen low, so the estimate prunes only what ptxas would refuse or spill.
3. After compilation (search.py): ptxas's own count (Kernel.resources) - spills, or more
   registers than 255 or than 65536 / threads, prune the point before it reaches the GPU.

With `SearchSpace(instruction="wgmma")` (sm_90a) the space is the Hopper kernel's instead:

| knob          | values tried                                             | GemmSpec field |
| ------------- | -------------------------------------------------------- | -------------- |
| tile          | 128x256, 128x128, 256x128, 128x192 (K 64; tf32 32)        | tile           |
| warps         | tile M / 16 along M (a warpgroup per 64 rows), 1 along N | warps          |
| stages        | 3, 4, 5                                                  | stages         |
| persistent    | True (warp-specialized for f16/bf16, TMA stores), False  | persistent     |
| group_m       | 4, 8, 16                                                 | group_m        |
| cluster       | 1x1, 2x1 (B multicast), 1x2 (A multicast); persistent    | cluster        |
| consumers     | cooperative (both math warpgroups on each block), or     | pingpong       |
|               | ping-pong: 64x256 blocks, a warpgroup each (warps 4x1)   |                |

Order: `prior_ms` is a rough analytic time (wave quantisation over the SMs, occupancy from
shared memory and registers, warp-tile and CTA-tile reuse, k-tile overhead, pipeline fill).
It only decides what is tried first when the budget cannot try everything; the GPU decides
what wins.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Optional

from ..errors import SpecError
from ..gemm.spec import GemmSpec

TUNE_DTYPES = ("tf32", "f16", "bf16")
K_TILES = {"tf32": (16, 32, 64), "f16": (32, 64, 128), "bf16": (32, 64, 128)}
DEFAULT_SMS = 132          # H200; the tuner passes the device's own count
SMEM_PER_SM = 228 * 1024   # sm_80/sm_90 give a CTA up to 227 KB; an SM holds 228 KB (+1 KB per CTA)
REGS_PER_SM = 65536
MAX_REGS = 255
MAX_THREADS_PER_SM = 2048
MAX_CTAS_PER_SM = 32

# Registers a GEMM thread needs besides accumulators and fragments (addresses, loop counters,
# predicates, epilogue temporaries). ptxas 13.0, over the shapes of the space for f16, bf16 and
# tf32 on sm_80 and sm_90, used at least 10 more than accumulators + fragments (the smallest warp
# tiles on sm_90, where what derives from the warp index sits in uniform registers; 64x64 warp
# tiles use 30-90 more), so the estimate stays at or below ptxas's count and pruning by it only
# drops points ptxas would refuse or spill anyway.
REG_OVERHEAD = 8


@dataclass(frozen=True)
class SearchSpace:
    """The values each knob takes (see the module docstring). Tuples, so it hashes."""
    tile_mn: tuple = (64, 128, 256)
    tile_k: Optional[tuple] = None          # None: K_TILES[dtype]
    warp_counts: tuple = (4, 8, 16)
    warp_tile: tuple = (32, 64)             # each side of a warp's own tile
    stages: tuple = (2, 3, 4, 5)
    swizzles: tuple = ("auto", "128B", "64B", "pad")
    group_m: tuple = (1, 4, 8, 16)
    frag_buffers: tuple = (1, 2)
    instruction: str = "mma.sync"           # or "wgmma": the Hopper kernel's space (WGMMA_* below)
    wgmma_tiles: tuple = ((128, 256), (128, 128), (256, 128), (128, 192))
    wgmma_stages: tuple = (3, 4, 5)
    wgmma_group_m: tuple = (4, 8, 16)
    persistent: tuple = (True, False)
    wgmma_clusters: tuple = ((1, 1), (2, 1), (1, 2))   # pairs of CTAs only for the persistent kernel
    wgmma_pingpong_tiles: tuple = ((64, 256),)          # ping-pong consumers: one warpgroup's block

    def k_tiles(self, dtype: str) -> tuple:
        return tuple(self.tile_k) if self.tile_k is not None else K_TILES[dtype]

    @property
    def target(self) -> str:
        """The target the space's specs are built for."""
        return "sm_90a" if self.instruction == "wgmma" else "sm_90"


@dataclass(frozen=True)
class Pruned:
    """A point of the space that is not compiled, and why."""
    params: dict
    reason: str

    def __str__(self) -> str:
        return f"{params_text(self.params)}: {self.reason}"


@dataclass
class SpaceResult:
    candidates: list                        # GemmSpec, distinct, each valid
    pruned: list = field(default_factory=list)   # Pruned

    def reasons(self) -> dict:
        """How many points each kind of reason pruned (the text before the first ':')."""
        out: dict = {}
        for p in self.pruned:
            kind = p.reason.split(":", 1)[0]
            out[kind] = out.get(kind, 0) + 1
        return out


def params_text(p: dict) -> str:
    t, w = p.get("tile"), p.get("warps")
    parts = []
    if t:
        parts.append("x".join(map(str, t)))
    if w:
        parts.append("w" + "x".join(map(str, w)))
    for key, short in (("stages", "s"), ("swizzle", ""), ("group_m", "g"), ("frag_buffers", "fb")):
        if key in p:
            parts.append(f"{short}{p[key]}")
    if p.get("cluster", (1, 1)) != (1, 1):
        parts.append("cluster" + "x".join(map(str, p["cluster"])))
    if p.get("pingpong"):
        parts.append("pingpong")
    return " ".join(parts)


def spec_text(spec: GemmSpec) -> str:
    """Short form of the knobs the tuner turns: '128x128x64 w2x2 s3 128B g8 fb2' (wgmma kernels
    add 'wgmma', and 'ws'/'persistent' and 'tmastore' where they apply)."""
    t, w = spec.tile, spec.warps
    text = f"{t.m}x{t.n}x{t.k} w{w.m}x{w.n} s{spec.stages} {spec.swizzle} g{spec.group_m} fb{spec.frag_buffers}"
    if spec.instruction != "mma.sync":
        text += f" {spec.instruction}" + (" ws" if spec.warp_specialized else " persistent" if spec.persistent else "")
        text += " tmastore" if spec.store == "tma" else ""
        text += f" cluster{spec.cluster[0]}x{spec.cluster[1]}" if spec.cluster != (1, 1) else ""
        text += " pingpong" if spec.pingpong else ""
    return text


# ---- registers -------------------------------------------------------------------------

def register_estimate(spec: GemmSpec) -> int:
    """Registers per thread before ptxas: accumulators + fragments + overhead (a lower bound)."""
    atom = spec.mma
    wm, wn = spec.warp_tile
    acc = (wm // atom.m) * (wn // atom.n) * atom.c.regs
    if spec.instruction == "wgmma":   # operands from shared memory, but an A held in registers
        frags = 4 * (spec.tile.k // 8) if spec.register_operand else 0
    else:
        frags = spec.frag_buffers * ((wm // atom.m) * atom.a.regs + (wn // atom.n) * atom.b.regs)
    return acc + frags + REG_OVERHEAD


def register_limit(threads: int) -> int:
    """Most registers a thread may use so that one CTA of `threads` fits on an SM."""
    return min(MAX_REGS, REGS_PER_SM // max(1, threads))


def register_problem(spec: GemmSpec, registers: int, how: str) -> Optional[str]:
    limit = register_limit(spec.threads)
    if registers > limit:
        why = "per thread" if limit == MAX_REGS else f"per thread for {spec.threads} threads (65536 per SM)"
        return f"registers ({how}): {registers} > {limit} {why}"
    return None


# ---- enumeration -----------------------------------------------------------------------

def _warp_grids(tm: int, tn: int, space: SearchSpace):
    for count in space.warp_counts:
        for wm_count in (1, 2, 4, 8, 16):
            if count % wm_count:
                continue
            wn_count = count // wm_count
            if tm % wm_count or tn % wn_count:
                continue
            if tm // wm_count in space.warp_tile and tn // wn_count in space.warp_tile:
                yield (wm_count, wn_count)


def points(dtype: str, space: SearchSpace = SearchSpace()) -> Iterable[dict]:
    """Every combination of knob values, as GemmSpec keyword arguments (unvalidated)."""
    if space.instruction == "wgmma":
        yield from _wgmma_points(dtype, space)
        return
    for tm in space.tile_mn:
        for tn in space.tile_mn:
            grids = list(_warp_grids(tm, tn, space))
            for tk in space.k_tiles(dtype):
                for warps in grids:
                    for stages in space.stages:
                        for fb in space.frag_buffers:
                            for swz in space.swizzles:
                                for g in space.group_m:
                                    yield {"tile": (tm, tn, tk), "warps": warps, "stages": stages,
                                           "swizzle": swz, "group_m": g, "frag_buffers": fb}


def _wgmma_points(dtype: str, space: SearchSpace) -> Iterable[dict]:
    tk = 32 if dtype == "tf32" else 64   # one 128-byte swizzled row of K per stage row
    for tm, tn in space.wgmma_tiles:
        # warpgroups stacked along M; a tf32 kernel with a row-major B stacks them along N
        for warps in ((tm // 16, 1),) + (((1, tn // 16),) if dtype == "tf32" else ()):
            for stages in space.wgmma_stages:
                for persistent in space.persistent:
                    for cluster in space.wgmma_clusters if persistent else ((1, 1),):
                        for g in space.wgmma_group_m:
                            p = {"instruction": "wgmma", "tile": (tm, tn, tk), "warps": warps, "stages": stages,
                                 "persistent": persistent, "group_m": g}
                            yield p if cluster == (1, 1) else {**p, "cluster": cluster}
    for tm, tn in space.wgmma_pingpong_tiles:   # two consumer warpgroups, each on blocks of its own
        for stages in space.wgmma_stages:
            for g in space.wgmma_group_m:
                yield {"instruction": "wgmma", "tile": (tm, tn, tk), "warps": (4, 1), "stages": stages,
                       "persistent": True, "group_m": g, "pingpong": True}


def make_spec(dtype: str, a_layout: str, b_layout: str, out_dtype: str, target: str, params: dict) -> GemmSpec:
    if params.get("instruction") == "wgmma":
        target = "sm_90a"
    return GemmSpec(dtype=dtype, a_layout=a_layout, b_layout=b_layout, out_dtype=out_dtype,
                    target=target, **params)


def default_spec(dtype: str, a_layout: str, b_layout: str, out_dtype: str = "f32", target: str = "sm_90",
                 instruction: str = "mma.sync") -> GemmSpec:
    """GemmSpec's own defaults for this problem: the baseline every tuning is compared with."""
    if instruction == "wgmma":
        return GemmSpec(dtype=dtype, a_layout=a_layout, b_layout=b_layout, out_dtype=out_dtype, target="sm_90a",
                        instruction="wgmma")
    return GemmSpec(dtype=dtype, a_layout=a_layout, b_layout=b_layout, out_dtype=out_dtype, target=target)


def enumerate_space(dtype: str, a_layout: str, b_layout: str, out_dtype: str = "f32", target: str = "sm_90",
                    space: SearchSpace = SearchSpace()) -> SpaceResult:
    """Every valid, distinct, not-pruned GemmSpec of the space, and every pruned point with its reason.

    Points that resolve to a spec already seen (swizzle "auto" becomes a concrete mode) are
    pruned as duplicates."""
    if dtype not in TUNE_DTYPES:
        raise ValueError(f"dtype {dtype!r}: the tuner handles {', '.join(TUNE_DTYPES)}")
    out = SpaceResult([])
    seen: dict = {}
    for p in points(dtype, space):
        try:
            spec = make_spec(dtype, a_layout, b_layout, out_dtype, target, p)
        except SpecError as e:
            out.pruned.append(Pruned(p, f"spec: {e}"))
            continue
        if spec in seen:
            out.pruned.append(Pruned(p, f"duplicate: same kernel as {params_text(seen[spec])}"))
            continue
        seen[spec] = p
        problem = register_problem(spec, register_estimate(spec), "estimate")
        if problem is not None:
            out.pruned.append(Pruned(p, problem))
            continue
        out.candidates.append(spec)
    return out


# ---- the prior: what to try first -------------------------------------------------------

def ctas_per_sm(spec: GemmSpec, registers: Optional[int] = None) -> int:
    """CTAs of this spec an SM holds at once (shared memory, registers, threads)."""
    regs = registers if registers else register_estimate(spec)
    regs = -(-regs // 8) * 8  # registers are allocated per warp in units of 256 (8 per thread)
    by_smem = SMEM_PER_SM // (spec.smem_bytes() + 1024)
    by_regs = REGS_PER_SM // (regs * spec.threads)
    by_threads = MAX_THREADS_PER_SM // spec.threads
    return max(0, min(by_smem, by_regs, by_threads, MAX_CTAS_PER_SM))


_STAGE_EFF = {2: 0.8, 3: 1.0, 4: 1.0, 5: 0.98, 6: 0.96}
# docs/perf_notes.md 5: double buffering gained 17% for f16/bf16 and lost for tf32 (255 registers)
_FRAG_EFF = {"f16": {1: 0.88, 2: 1.0}, "bf16": {1: 0.88, 2: 1.0}, "tf32": {1: 1.0, 2: 0.85}}


def prior_ms(spec: GemmSpec, m: int, n: int, k: int, sms: int = DEFAULT_SMS,
             registers: Optional[int] = None) -> float:
    """A rough time in arbitrary units (lower = try first). Not a prediction to trust:
    wave quantisation of ceil(M/tm) * ceil(N/tn) CTAs over sms * ctas_per_sm slots, divided by
    efficiencies for warp-tile reuse (ldmatrix bytes per mma), CTA-tile reuse (global bytes per
    flop), k-tile overhead (one barrier per k-tile), pipeline fill, latency hiding (warps per
    SM), stages and fragment double buffering."""
    t = spec.tile
    cps = ctas_per_sm(spec, registers)
    if cps == 0:
        return math.inf
    ctas = -(-m // t.m) * -(-n // t.n)
    k_tiles = max(1, -(-k // t.k))
    waves = -(-ctas // (sms * cps))
    work = waves * cps * t.m * t.n * t.k * k_tiles     # padded to whole waves and tiles
    wm, wn = spec.warp_tile
    esize = spec.operand_dtype.bytes
    e_warp = 1.0 / (1.0 + 8.0 * (1.0 / wm + 1.0 / wn))
    e_cta = 1.0 / (1.0 + 16.0 * (1.0 / t.m + 1.0 / t.n))
    e_k = 1.0 / (1.0 + 16.0 / (t.k * esize))
    e_fill = k_tiles / (k_tiles + spec.stages - 1)
    warps_per_sm = cps * spec.warps.count
    e_occ = min(1.0, warps_per_sm / 8.0) ** 0.5
    e_stage = _STAGE_EFF.get(spec.stages, 0.9)
    e_fb = _FRAG_EFF.get(spec.dtype, _FRAG_EFF["f16"]).get(spec.frag_buffers, 0.9)
    e_group = {1: 0.97, 4: 0.995, 8: 1.0, 16: 0.995}.get(spec.group_m, 0.99)
    e_swz = 1.0 if spec.swizzle in ("128B", "64B") else 0.93
    eff = e_warp * e_cta * e_k * e_fill * e_occ * e_stage * e_fb * e_group * e_swz
    return work / eff / 1e9


DIVERSITY = 0.04   # each earlier pick from the same (tile M, tile N, warps) group costs 4% of prior


def diverse_order(specs, prior: dict) -> list:
    """`specs` by prior, but each spec's prior grows by DIVERSITY for every spec of its
    (tile M, tile N, warps) group already placed, so that a short budget sees several tile
    shapes instead of every k-tile and stage count of one."""
    groups: dict = {}
    for s in sorted(specs, key=lambda s: (prior[s], spec_text(s))):
        groups.setdefault((s.tile.m, s.tile.n, tuple(s.warps)), []).append(s)
    heads = {g: 0 for g in groups}
    out = []
    while heads:
        g = min(heads, key=lambda g: (prior[groups[g][heads[g]]] * (1 + DIVERSITY * heads[g]), g))
        out.append(groups[g][heads[g]])
        heads[g] += 1
        if heads[g] == len(groups[g]):
            del heads[g]
    return out


def base_variant(spec: GemmSpec) -> bool:
    """The representative of a shape (tile, warps, stages, frag_buffers) tried in phase 1:
    the automatic swizzle and the default group_m."""
    auto = spec.replace(swizzle="auto")
    return spec.swizzle == auto.swizzle and spec.group_m == GemmSpec.group_m


def shape_of(spec: GemmSpec) -> tuple:
    return (tuple(spec.tile), tuple(spec.warps), spec.stages, spec.frag_buffers, spec.instruction, spec.persistent,
            spec.pingpong)


__all__ = ["SearchSpace", "Pruned", "SpaceResult", "TUNE_DTYPES", "enumerate_space", "points", "make_spec",
           "default_spec", "register_estimate", "register_limit", "register_problem", "prior_ms",
           "ctas_per_sm", "spec_text", "params_text", "base_variant", "shape_of", "diverse_order"]
