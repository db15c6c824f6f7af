"""PTX text of the fragment probes: one warp, one instruction, every register dumped.

Each probe reads its inputs as 32-bit words in[lane][reg] (the host packed them from the
tables in tilegen.arch), runs one mma / ldmatrix / stmatrix, and writes what it got back
as 32-bit words. A wgmma probe is one warpgroup: it copies a shared-memory image the host
laid out, runs wgmmas through descriptors the host encoded, and dumps the accumulator.
Nothing here knows a fragment map or a descriptor: they live in the host's inputs.
"""
from __future__ import annotations

import re

from ..arch import TARGETS, ptx_version_for


def probe_target(min_sm: int) -> str:
    """The oldest target an instruction assembles for: sm_80, sm_89 (fp8) or sm_90."""
    name = f"sm_{max(80, min_sm)}"
    if name not in TARGETS:
        raise ValueError(f"no target for min_sm {min_sm}; known: {', '.join(TARGETS)}")
    return name


def entry_name(probe: str) -> str:
    return "probe_" + re.sub(r"\W", "_", probe)


def header(target: str, features) -> str:
    major, minor = ptx_version_for(target, features)
    return f".version {major}.{minor}\n.target {target}\n.address_size 64\n"


def _entry(comment: str, target: str, features, entry: str, params, body, shared=None,
           threads: int = 32, align: int = 16) -> str:
    """A one-block kernel whose .u64 params are global pointers."""
    plist = ",\n".join(f"    .param .u64 {p}" for p in params)
    lines = [header(target, features), f"// {comment}", f".visible .entry {entry}(",
             plist, ")", f".reqntid {threads}, 1, 1", "{"]
    if shared:
        lines.append(f"    .shared .align {align} .b8 tile[{shared}];")
    lines += ["    " + x if x and not x.endswith(":") else x for x in body]
    lines += ["    ret;", "}", ""]
    return "\n".join(lines)


def _row_pointer(reg: str, param: str, row_bytes: int) -> list[str]:
    """reg = global address of this lane's row: param + lane * row_bytes."""
    return [f"ld.param.u64 {reg}, [{param}];",
            f"cvta.to.global.u64 {reg}, {reg};",
            f"mul.wide.u32 %off, %lane, {row_bytes};",
            f"add.u64 {reg}, {reg}, %off;"]


def _regs(prefix: str, n: int) -> str:
    return "{" + ", ".join(f"%{prefix}{i}" for i in range(n)) + "}"


def _loads(prefix: str, ptr: str, n: int) -> list[str]:
    return [f"ld.global.b32 %{prefix}{i}, [{ptr}+{4 * i}];" for i in range(n)]


def _stores(prefix: str, ptr: str, n: int) -> list[str]:
    return [f"st.global.b32 [{ptr}+{4 * i}], %{prefix}{i};" for i in range(n)]


def mma_ptx(atom, name: str) -> str:
    """in a/b/c[lane][reg] -> mma -> out[lane][reg] (the D registers)."""
    ra, rb, rc = atom.a.regs, atom.b.regs, atom.c.regs
    target = probe_target(atom.min_sm)
    features = ["mma.fp8" if atom.a_type.bits == 8 else "mma"]
    body = [".reg .b32 %lane;",
            ".reg .b64 %off, %pa, %pb, %pc, %pd;",
            f".reg .b32 %a<{ra}>, %b<{rb}>, %c<{rc}>, %d<{rc}>;",
            "mov.u32 %lane, %tid.x;"]
    for reg, param, n, prefix in (("%pa", "p_a", ra, "a"), ("%pb", "p_b", rb, "b"),
                                  ("%pc", "p_c", rc, "c")):
        body += _row_pointer(reg, param, 4 * n) + _loads(prefix, reg, n)
    body.append(f"{atom.instruction} {_regs('d', rc)}, {_regs('a', ra)}, {_regs('b', rb)}, "
                f"{_regs('c', rc)};")
    body += _row_pointer("%pd", "p_out", 4 * rc) + _stores("d", "%pd", rc)
    return _entry(f"fragment probe: {atom.instruction}", target, features, entry_name(name),
                  ["p_a", "p_b", "p_c", "p_out"], body)


_COPY_REGS = [".reg .pred %row;", ".reg .b32 %lane, %base, %slot, %addr, %w<4>;",
              ".reg .b64 %off, %pg, %po, %pout;", "mov.u32 %lane, %tid.x;",
              "mov.u32 %base, tile;", "mad.lo.u32 %slot, %lane, 16, %base;"]


def _row_address() -> list[str]:
    """%addr = tile + offsets[lane]: the row address this lane gives the instruction."""
    return _row_pointer("%po", "p_offsets", 4) + ["ld.global.u32 %addr, [%po];",
                                                  "add.u32 %addr, %addr, %base;"]


def ldmatrix_ptx(op, name: str) -> str:
    """shared[slot] rows -> tile; lane gives tile + offsets[lane]; ldmatrix -> out[lane][reg]."""
    rows, n = 8 * op.num, op.num
    body = _COPY_REGS + [f".reg .b32 %r<{n}>;", f"setp.lt.u32 %row, %lane, {rows};"]
    body += _row_pointer("%pg", "p_shared", 16)
    body += ["@%row ld.global.v4.b32 {%w0, %w1, %w2, %w3}, [%pg];",
             "@%row st.shared.v4.b32 [%slot], {%w0, %w1, %w2, %w3};",
             "bar.sync 0;"]
    body += _row_address()
    body.append(f"{op.instruction} {_regs('r', n)}, [%addr];")
    body += _row_pointer("%pout", "p_out", 4 * n) + _stores("r", "%pout", n)
    return _entry(f"fragment probe: {op.instruction}", probe_target(op.min_sm), ["ldmatrix"],
                  entry_name(name), ["p_shared", "p_offsets", "p_out"], body, shared=16 * rows)


def stmatrix_ptx(op, name: str) -> str:
    """regs[lane][reg] -> stmatrix at tile + offsets[lane] -> tile rows -> out[slot]."""
    rows, n = 8 * op.num, op.num
    body = _COPY_REGS + [f".reg .b32 %r<{n}>;", f"setp.lt.u32 %row, %lane, {rows};"]
    body += _row_pointer("%pg", "p_regs", 4 * n) + _loads("r", "%pg", n)
    # poison the tile first, so a row the instruction misses shows up as 0xffff
    body += ["mov.b32 %w0, -1;",
             "@%row st.shared.v4.b32 [%slot], {%w0, %w0, %w0, %w0};",
             "bar.sync 0;"]
    body += _row_address()
    body += [f"{op.instruction} [%addr], {_regs('r', n)};", "bar.sync 0;"]
    body += _row_pointer("%pout", "p_out", 16)
    body += ["@%row ld.shared.v4.b32 {%w0, %w1, %w2, %w3}, [%slot];",
             "@%row st.global.v4.b32 [%pout], {%w0, %w1, %w2, %w3};"]
    return _entry(f"fragment probe: {op.instruction}", probe_target(op.min_sm), ["stmatrix"],
                  entry_name(name), ["p_regs", "p_offsets", "p_out"], body, shared=16 * rows)


def wgmma_ptx(case, name: str) -> str:
    """image -> tile (1024-aligned, so the swizzle pattern starts at its base); per step one
    wgmma on descriptors desc[step] = (A lo, A hi, B lo, B hi) + tile / 16; thread t of the
    warpgroup writes its accumulator registers to out[t][reg]."""
    words, steps, regs = case.image_bytes // 4, case.steps, case.shape.acc_regs
    body = [".reg .b32 %lane, %base, %slot, %w;",
            ".reg .b64 %off, %pg, %pd, %pout, %tile16;",
            f".reg .b64 %da<{steps}>, %db<{steps}>;",
            f".reg .b32 %d<{regs}>;",
            "mov.u32 %lane, %tid.x;",
            "mov.u32 %base, tile;",
            "mad.lo.u32 %slot, %lane, 4, %base;"]
    body += _row_pointer("%pg", "p_shared", 4)
    for j in range(words // 128):  # thread t copies words t, t + 128, ...
        body += [f"ld.global.b32 %w, [%pg+{512 * j}];", f"st.shared.b32 [%slot+{512 * j}], %w;"]
    body += ["fence.proxy.async.shared::cta;",  # generic writes, read by wgmma's async proxy
             "bar.sync 0;",
             "cvt.u64.u32 %tile16, %base;",
             "shr.u64 %tile16, %tile16, 4;",
             "ld.param.u64 %pd, [p_desc];",
             "cvta.to.global.u64 %pd, %pd;"]
    for s in range(steps):
        body += [f"ld.global.b64 %da{s}, [%pd+{16 * s}];", f"ld.global.b64 %db{s}, [%pd+{16 * s + 8}];",
                 f"add.u64 %da{s}, %da{s}, %tile16;", f"add.u64 %db{s}, %db{s}, %tile16;"]
    trans = ""
    if case.shape.transposable:
        trans = f", {0 if case.a_k_major else 1}, {0 if case.b_k_major else 1}"
    body.append("wgmma.fence.sync.aligned;")
    for s in range(steps):
        body.append(f"{case.instruction} {_regs('d', regs)}, %da{s}, %db{s}, {min(s, 1)}, 1, 1{trans};")
    body += ["wgmma.commit_group.sync.aligned;", "wgmma.wait_group.sync.aligned 0;"]
    body += _row_pointer("%pout", "p_out", 4 * regs) + _stores("d", "%pout", regs)
    return _entry(f"fragment probe: {case.instruction}, {case.mode} tiles, {steps} k-steps", "sm_90a",
                  ["wgmma", "fence.proxy.async"], entry_name(name), ["p_shared", "p_desc", "p_out"], body,
                  shared=case.image_bytes, threads=128, align=1024)
