"""Bugs planted in small PTX kernels (hand-written, and generated GEMMs with one line
changed) are caught by the emulator, with the PTX line, thread and address; the correct
version of each kernel runs clean."""
import re

import numpy as np
import pytest

import tilegen
from tilegen.sim import GlobalMemory, SimError, launch, run_kernel
from tilegen.sim.runner import SHARED_BASE

T = 64  # two warps
REGS = """    .reg .b32 %r<32>;
    .reg .b64 %rd<16>;
    .reg .pred %p<8>;
    .reg .f32 %f<4>;"""


def module(body: str, threads: int = T, params=(("inp", "u64"), ("out", "u64"), ("n", "u32"))) -> str:
    plist = ",\n".join(f"    .param .{t} {n}" for n, t in params)
    return (f".version 7.8\n.target sm_90\n.address_size 64\n.extern .shared .align 16 .b8 smem[];\n"
            f".visible .entry k(\n{plist}\n)\n.reqntid {threads}, 1, 1\n{{\n{REGS}\n{body}\n    ret;\n}}\n")


def line_of(ptx: str, text: str) -> int:
    hits = [i + 1 for i, l in enumerate(ptx.splitlines()) if l.strip() == text.strip()]
    assert len(hits) == 1, f"{text!r} occurs {len(hits)} times"
    return hits[0]


class Buffers:
    def __init__(self, n_in=T, width=4, grid=(1, 1, 1)):
        self.mem = GlobalMemory()
        self.inp_data = np.arange(n_in * width // 4, dtype=np.uint32) * 3 + 1
        self.inp = self.mem.alloc(self.inp_data.nbytes)
        self.mem.write(self.inp, self.inp_data)
        self.out_n = T * grid[0] * width // 4
        self.out = self.mem.alloc(4 * self.out_n)
        self.grid = grid

    def run(self, ptx, smem=T * 16, n=T, threads=T):
        launch(ptx, self.grid, threads, {"inp": self.inp, "out": self.out, "n": n}, memory=self.mem,
               shared_bytes=smem)
        return self.mem.read(self.out, 4 * self.out_n, np.uint32)


def ptr(reg, param, stride, index="%r1"):
    return (f"    ld.param.u64 {reg}, [{param}];\n    cvta.to.global.u64 {reg}, {reg};\n"
            f"    mul.wide.u32 %rd15, {index}, {stride};\n    add.s64 {reg}, {reg}, %rd15;")


PROLOGUE = "    mov.u32 %r1, %tid.x;\n    mov.u32 %r2, smem;"
# The partner of each thread sits in the other warp, so races cross warps.
PARTNER = "    add.u32 %r5, %r1, 32;\n    and.b32 %r5, %r5, 63;"


def exchange(barrier=True, partner=True):
    """Each thread stores its word to shared slot tid, then reads the partner's slot."""
    return module("\n".join([
        PROLOGUE, ptr("%rd0", "inp", 4), ptr("%rd2", "out", 4),
        "    ld.global.b32 %r3, [%rd0];",
        "    mad.lo.u32 %r4, %r1, 4, %r2;",
        "    st.shared.b32 [%r4], %r3;",
        "    bar.sync 0;" if barrier else "",
        PARTNER if partner else "    mov.u32 %r5, %r1;",
        "    mad.lo.u32 %r6, %r5, 4, %r2;",
        "    ld.shared.b32 %r7, [%r6];",
        "    st.global.b32 [%rd2], %r7;"]))


# ---- races ------------------------------------------------------------------------------------

def test_exchange_with_barrier_is_clean():
    b = Buffers()
    got = b.run(exchange())
    np.testing.assert_array_equal(got, np.roll(b.inp_data, -32))


def test_missing_barrier_is_a_race():
    ptx = exchange(barrier=False)
    with pytest.raises(SimError) as e:
        Buffers().run(ptx)
    err = e.value
    assert err.kind == "race"
    assert err.line == line_of(ptx, "ld.shared.b32 %r7, [%r6];")
    assert (err.tid, err.cta, err.address) == (0, (0, 0, 0), SHARED_BASE + 4 * 32)
    msg = str(err)
    assert "thread 32 wrote" in msg and "no bar.sync" in msg
    assert f"PTX line {err.line}: ld.shared.b32 %r7, [%r6];" in msg
    assert "cta (0, 0, 0) tid 0" in msg and f"address: 0x{SHARED_BASE + 128:x}" in msg


def _barrier_in_a_branch(guard: str, other_side: str = ""):
    """The exchange, its bar.sync inside a branch taken by the threads where `guard` holds (the
    others jump over it, and run `other_side` there instead)."""
    return exchange().replace("    bar.sync 0;", "\n".join([
        f"    {guard}", "    @!%p1 bra SKIP;", "    bar.sync 0;", "    bra JOIN;", "SKIP:", other_side, "JOIN:"]))


@pytest.mark.parametrize("other_side, says", [
    ("    ret;", "is reached by part of warp 0 (threads 0..4, 5 of them) while thread 5 left the kernel"),
    ("    bar.sync 0;", "is reached by warp 0's threads at different barrier instructions"),
])
def test_a_barrier_that_splits_a_warp_is_refused(other_side, says):
    """bar.sync is .aligned: part of a warp at it while the rest left, or wait at another bar.sync,
    is undefined on the GPU (the emulator had released it)."""
    ptx = _barrier_in_a_branch("setp.lt.u32 %p1, %r1, 5;", other_side)   # threads 0..4 of warp 0 take it
    with pytest.raises(SimError) as e:
        Buffers().run(ptx)
    assert e.value.kind == "divergence" and says in str(e.value) and ".aligned" in str(e.value), str(e.value)
    assert e.value.line == line_of(ptx, "    @!%p1 bra SKIP;") + 1


def test_a_barrier_in_a_branch_whole_warps_take_is_clean():
    """The same branch by whole warps: warp 0 meets warp 1 at the other bar.sync."""
    b = Buffers()
    got = b.run(_barrier_in_a_branch("setp.lt.u32 %p1, %r1, 32;", "    bar.sync 0;"))
    np.testing.assert_array_equal(got, np.roll(b.inp_data, -32))


def test_reading_own_write_needs_no_barrier():
    b = Buffers()
    np.testing.assert_array_equal(b.run(exchange(barrier=False, partner=False)), b.inp_data)


def test_write_after_read_without_barrier():
    """Read the partner's slot, then overwrite the own slot with no bar.sync between."""
    def kernel(barrier):
        return module("\n".join([
            PROLOGUE, ptr("%rd0", "inp", 4), ptr("%rd2", "out", 4),
            "    ld.global.b32 %r3, [%rd0];", "    mad.lo.u32 %r4, %r1, 4, %r2;",
            "    st.shared.b32 [%r4], %r3;", "    bar.sync 0;", PARTNER,
            "    mad.lo.u32 %r6, %r5, 4, %r2;", "    ld.shared.b32 %r7, [%r6];",
            "    bar.sync 0;" if barrier else "",
            "    add.u32 %r8, %r7, 1;", "    st.shared.b32 [%r4], %r8;",
            "    st.global.b32 [%rd2], %r7;"]))
    b = Buffers()
    np.testing.assert_array_equal(b.run(kernel(True)), np.roll(b.inp_data, -32))
    ptx = kernel(False)
    with pytest.raises(SimError) as e:
        b.run(ptx)
    assert e.value.kind == "war"
    assert "overwrites a stage another warp may still be reading" in str(e.value)
    assert "thread 32 read" in str(e.value)
    assert e.value.line == line_of(ptx, "st.shared.b32 [%r4], %r8;")
    assert (e.value.tid, e.value.address) == (0, SHARED_BASE)


# ---- cp.async ---------------------------------------------------------------------------------

def async_kernel(wait="    cp.async.wait_group 0;", barrier=True, src_size="", dst_extra=0, src_extra=0, tail=()):
    """Each thread copies 16 bytes with cp.async into slot tid, then reads the partner's slot."""
    return module("\n".join([
        PROLOGUE, ptr("%rd0", "inp", 16), ptr("%rd2", "out", 16),
        f"    add.s64 %rd0, %rd0, {src_extra};",
        "    mad.lo.u32 %r4, %r1, 16, %r2;", f"    add.u32 %r4, %r4, {dst_extra};",
        "    and.b32 %r9, %r1, 15;",
        f"    cp.async.cg.shared.global [%r4], [%rd0], 16{src_size};",
        "    cp.async.commit_group;",
        "    cp.async.commit_group;",   # an empty group: legal, retires like any other
        wait, "    bar.sync 0;" if barrier else "", PARTNER,
        "    mad.lo.u32 %r6, %r5, 16, %r2;",
        "    ld.shared.v4.b32 {%r10, %r11, %r12, %r13}, [%r6];",
        "    st.global.v4.b32 [%rd2], {%r10, %r11, %r12, %r13};", *tail]))


def test_cp_async_correct_pipeline():
    b = Buffers(width=16)
    got = b.run(async_kernel(), smem=T * 16)
    np.testing.assert_array_equal(got.reshape(T, 4), np.roll(b.inp_data.reshape(T, 4), -32, axis=0))


def test_cp_async_zero_fill_past_src_size():
    b = Buffers(width=16)
    got = b.run(async_kernel(src_size=", %r9"), smem=T * 16).reshape(T, 4).view(np.uint8)
    want = np.roll(b.inp_data.reshape(T, 4), -32, axis=0).view(np.uint8).copy()
    for t in range(T):
        want[t, (t + 32) % 64 % 16:] = 0           # partner p copied p % 16 bytes
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("wait", ["", "    cp.async.wait_group 2;"], ids=["no-wait", "wait_group-2"])
def test_read_of_pending_cp_async(wait):
    ptx = async_kernel(wait=wait)
    with pytest.raises(SimError) as e:
        Buffers(width=16).run(ptx)
    assert e.value.kind == "pending"
    assert "still pending" in str(e.value)
    assert e.value.line == line_of(ptx, "ld.shared.v4.b32 {%r10, %r11, %r12, %r13}, [%r6];")
    assert e.value.address == SHARED_BASE + 16 * 32 and e.value.tid == 0


def test_wait_without_barrier_is_a_race():
    """wait_group makes a copy visible to the issuing thread only."""
    with pytest.raises(SimError) as e:
        Buffers(width=16).run(async_kernel(barrier=False))
    assert e.value.kind == "race" and "thread 32 wrote" in str(e.value)


def test_cp_async_over_a_stage_still_read():
    """After reading the partner's slot, refill the own slot by cp.async: the partner (in
    the other warp) read it in this barrier interval unless a bar.sync comes first."""
    def kernel(barrier):
        return async_kernel(tail=["    bar.sync 0;" if barrier else "",
                                  "    cp.async.cg.shared.global [%r4], [%rd0+0], 16;", "    cp.async.wait_all;"])
    b = Buffers(width=16)
    b.run(kernel(True))
    ptx = kernel(False)
    with pytest.raises(SimError) as e:
        b.run(ptx)
    assert e.value.kind == "war"
    assert "cp.async overwrites a stage another warp may still be reading" in str(e.value)
    assert e.value.line == line_of(ptx, "cp.async.cg.shared.global [%r4], [%rd0+0], 16;")


def _copy_then_read_partner(waits):
    """Each thread copies 16 bytes with cp.async into slot tid; `waits` (lines) commit and wait;
    then a barrier and each reads its partner's slot."""
    return module("\n".join([
        PROLOGUE, ptr("%rd0", "inp", 16), ptr("%rd2", "out", 16),
        "    mad.lo.u32 %r4, %r1, 16, %r2;",
        "    cp.async.cg.shared.global [%r4], [%rd0], 16;",
        "    setp.lt.u32 %p1, %r1, 32;", *waits,
        "    bar.sync 0;", PARTNER,
        "    mad.lo.u32 %r6, %r5, 16, %r2;",
        "    ld.shared.v4.b32 {%r10, %r11, %r12, %r13}, [%r6];",
        "    st.global.v4.b32 [%rd2], {%r10, %r11, %r12, %r13};"]))


def parted_async_kernel(second_waits: bool):
    """The warps part after each issued its copy: warp 0 commits and waits in its branch, warp
    1 in its own only if second_waits."""
    return _copy_then_read_partner(["    @!%p1 bra SECOND;", "    cp.async.commit_group;", "    cp.async.wait_group 0;",
                                    "    bra.uni JOIN;", "SECOND:",
                                    "    cp.async.wait_all;" if second_waits else "    add.u32 %r20, %r1, 1;",
                                    "JOIN:"])


def guarded_async_kernel(second_waits: bool):
    """As parted_async_kernel, with predicated commits and waits instead of branches."""
    return _copy_then_read_partner(["    @%p1 cp.async.commit_group;", "    @%p1 cp.async.wait_group 0;",
                                    "    @!%p1 cp.async.wait_all;" if second_waits else ""])


@pytest.mark.parametrize("kernel", [parted_async_kernel, guarded_async_kernel], ids=["branches", "guards"])
def test_cp_async_groups_are_per_thread(kernel):
    """Warps that parted (or whose commits and waits are guarded) commit and wait on their own
    (warp roles: a consumer's wait for its fetched vectors is its own): warp 0's wait does not
    land warp 1's copy."""
    b = Buffers(width=16)
    got = b.run(kernel(second_waits=True), smem=T * 16)
    np.testing.assert_array_equal(got.reshape(T, 4), np.roll(b.inp_data.reshape(T, 4), -32, axis=0))
    ptx = kernel(second_waits=False)
    with pytest.raises(SimError) as e:
        b.run(ptx, smem=T * 16)
    assert e.value.kind == "pending" and e.value.tid == 0 and e.value.address == SHARED_BASE + 16 * 32
    assert e.value.line == line_of(ptx, "ld.shared.v4.b32 {%r10, %r11, %r12, %r13}, [%r6];")


# ---- bounds -----------------------------------------------------------------------------------

def oob_read(guard):
    return module("\n".join([
        PROLOGUE, "    add.u32 %r3, %r1, 1;", "    ld.param.u32 %r8, [n];",
        ptr("%rd0", "inp", 4, index="%r3"), ptr("%rd2", "out", 4),
        "    mov.b32 %r7, 0;", "    setp.lt.u32 %p1, %r3, %r8;",
        ("    @%p1 " if guard else "    ") + "ld.global.b32 %r7, [%rd0];",
        "    st.global.b32 [%rd2], %r7;"]))


def test_guarded_read_at_the_edge_is_clean():
    b = Buffers()
    np.testing.assert_array_equal(b.run(oob_read(True)), np.append(b.inp_data[1:], 0))


def test_out_of_bounds_global_read():
    b = Buffers()
    ptx = oob_read(False)
    with pytest.raises(SimError) as e:
        b.run(ptx)
    err = e.value
    assert err.kind == "bounds" and err.tid == 63 and err.address == b.inp + 4 * T
    assert err.line == line_of(ptx, "ld.global.b32 %r7, [%rd0];")
    assert "out-of-bounds global access" in str(err) and "0 bytes past the end of allocation" in str(err)


def test_out_of_bounds_global_write_names_the_cta():
    ptx = module("\n".join([
        PROLOGUE, "    mov.u32 %r3, %ctaid.x;", "    mad.lo.u32 %r4, %r3, 64, %r1;", "    add.u32 %r4, %r4, %r3;",
        ptr("%rd2", "out", 4, index="%r4"), "    st.global.b32 [%rd2], %r1;"]))
    b = Buffers(grid=(2, 1, 1))
    with pytest.raises(SimError) as e:
        b.run(ptx)
    assert (e.value.kind, e.value.cta, e.value.tid) == ("bounds", (1, 0, 0), 63)
    assert e.value.address == b.out + 4 * 2 * T


def test_out_of_bounds_shared():
    b = Buffers()
    b.run(exchange(), smem=T * 4)
    with pytest.raises(SimError) as e:
        b.run(exchange(), smem=T * 4 - 4)
    assert e.value.kind == "bounds" and e.value.tid == 63 and e.value.address == SHARED_BASE + 4 * 63
    assert "out-of-bounds shared access" in str(e.value)


def test_cp_async_source_out_of_bounds_even_with_zero_size():
    b = Buffers(width=16)
    # src-size 0 reads nothing inside an allocation ...
    b.run(async_kernel(src_size=", 0"))
    for size in (", 0", ", 1"):  # ... but outside every allocation the address itself is wrong
        with pytest.raises(SimError) as e:
            b.run(async_kernel(src_size=size, src_extra=1 << 20))
        assert e.value.kind == "bounds" and e.value.tid == 0


# ---- alignment --------------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["ld.global.v4", "ld.global.f32", "ld.shared", "cp.async.dst", "cp.async.src"])
def test_misaligned_addresses(case):
    b = Buffers(width=16)
    if case == "ld.global.v4":
        ptx = module("\n".join([PROLOGUE, ptr("%rd0", "inp", 16),
                                "    ld.global.v4.b32 {%r3, %r4, %r5, %r6}, [%rd0+8];"]))
        want = b.inp + 8
    elif case == "ld.global.f32":
        ptx = module("\n".join([PROLOGUE, ptr("%rd0", "inp", 16), "    ld.global.f32 %f1, [%rd0+2];"]))
        want = b.inp + 2
    elif case == "ld.shared":
        ptx = module("\n".join([PROLOGUE, "    mad.lo.u32 %r4, %r1, 4, %r2;", "    ld.shared.b32 %r3, [%r4+2];"]))
        want = SHARED_BASE + 2
    elif case == "cp.async.dst":
        ptx = async_kernel(dst_extra=8)
        want = SHARED_BASE + 8
    else:
        ptx = async_kernel(src_extra=4)
        want = b.inp + 4
    with pytest.raises(SimError) as e:
        b.run(ptx)
    assert e.value.kind == "misaligned" and e.value.tid == 0 and e.value.address == want
    assert "misaligned" in str(e.value)


def ldmatrix_kernel(offset):
    return module("\n".join([
        PROLOGUE, "    mad.lo.u32 %r4, %r1, 16, %r2;", "    mov.b32 %r3, 0;",
        "    st.shared.v4.b32 [%r4], {%r3, %r3, %r3, %r3};", "    bar.sync 0;",
        f"    add.u32 %r5, %r4, {offset};",
        "    ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%r6, %r7, %r8, %r9}, [%r5];"]), threads=32)


def test_ldmatrix_rows_must_be_16_byte_aligned():
    b = Buffers()
    b.run(ldmatrix_kernel(0), threads=32)
    with pytest.raises(SimError) as e:
        b.run(ldmatrix_kernel(2), threads=32)
    assert e.value.kind == "misaligned" and e.value.address == SHARED_BASE + 2 and e.value.tid == 0


def test_ldmatrix_race_names_the_receiving_lane():
    ptx = ldmatrix_kernel(0).replace("    bar.sync 0;\n", "")
    with pytest.raises(SimError) as e:
        Buffers().run(ptx, threads=32)
    # lane 0 receives row 0 (its own) cols 0-1, and row 0 of matrices 1..3: written by lane 8
    assert e.value.kind == "race" and e.value.tid == 0 and "thread 8 wrote" in str(e.value)


# ---- control flow -----------------------------------------------------------------------------

STORE_R3 = ptr("%rd2", "out", 4) + "\n    st.global.u32 [%rd2], %r3;"


def test_divergent_branches_run_each_side_and_meet_again():
    """Warp 0 and warp 1 take different sides of an if/else, then meet at a bar.sync and
    exchange through shared memory: each thread's value and its partner's are right."""
    ptx = module("\n".join([
        PROLOGUE, PARTNER, "    setp.lt.u32 %p1, %r1, 32;", "    @%p1 bra $low;",
        "    add.u32 %r3, %r1, 1000;", "    bra.uni $join;",
        "$low:", "    mul.lo.u32 %r3, %r1, 3;",
        "$join:", "    shl.b32 %r4, %r1, 2;", "    add.u32 %r4, %r4, %r2;", "    st.shared.u32 [%r4], %r3;",
        "    bar.sync 0;", "    shl.b32 %r6, %r5, 2;", "    add.u32 %r6, %r6, %r2;", "    ld.shared.u32 %r7, [%r6];",
        "    add.u32 %r3, %r3, %r7;", STORE_R3]))
    got = Buffers().run(ptx)
    tid = np.arange(T)
    own = np.where(tid < 32, 3 * tid, tid + 1000)
    assert (got == own + own[(tid + 32) % 64]).all()


def test_exited_warp_does_not_hold_a_barrier():
    ptx = module("\n".join([
        PROLOGUE, "    setp.ge.u32 %p1, %r1, 32;", "    @%p1 exit;", "    bar.sync 0;",
        "    add.u32 %r3, %r1, 7;", STORE_R3]))
    b = Buffers()
    b.mem.write(b.out, np.full(b.out_n, 0xDEAD, dtype=np.uint32))
    got = b.run(ptx)
    assert (got[:32] == np.arange(32) + 7).all() and (got[32:] == 0xDEAD).all()


MBAR = ".shared .align 8 .b8 bar[8];\n"


def handoff(wait=True, parity=0, arrivals=32):
    """Warp 1 writes shared memory and arrives on an mbarrier; warp 0 waits on it and reads."""
    body = "\n".join([
        PROLOGUE, "    mov.u32 %r10, bar;", "    setp.eq.u32 %p3, %r1, 0;",
        f"    @%p3 mbarrier.init.shared::cta.b64 [%r10], {arrivals};", "    bar.sync 0;",
        "    setp.lt.u32 %p1, %r1, 32;", "    @%p1 bra $consumer;",
        "    and.b32 %r5, %r1, 31;", "    shl.b32 %r4, %r5, 2;", "    add.u32 %r4, %r4, %r2;",
        "    mul.lo.u32 %r3, %r1, 5;", "    st.shared.u32 [%r4], %r3;",
        "    mbarrier.arrive.shared::cta.b64 _, [%r10];", "    bra.uni $end;",
        "$consumer:",
        *(["$wait:", f"    mbarrier.try_wait.parity.shared::cta.b64 %p2, [%r10], {parity};", "    @!%p2 bra $wait;"]
          if wait else []),
        "    shl.b32 %r4, %r1, 2;", "    add.u32 %r4, %r4, %r2;", "    ld.shared.u32 %r3, [%r4];", STORE_R3,
        "$end:"])
    return module(body).replace(".extern .shared", MBAR + ".extern .shared")


def test_mbarrier_hands_data_between_warps():
    got = Buffers().run(handoff())
    assert (got[:32] == (np.arange(32) + 32) * 5).all()


def test_reading_without_the_wait_is_a_race():
    with pytest.raises(SimError) as e:
        Buffers().run(handoff(wait=False))
    assert e.value.kind == "race" and "wrote" in str(e.value)


def test_wait_that_no_warp_can_complete_is_a_deadlock():
    ptx = handoff(arrivals=33)   # warp 1 brings 32 arrivals: one is missing
    with pytest.raises(SimError) as e:
        Buffers().run(ptx)
    assert e.value.kind == "deadlock" and "warp 0 waits" in str(e.value)
    assert "1 of its 33 arrivals have not come" in str(e.value)
    assert e.value.line == line_of(ptx, "mbarrier.try_wait.parity.shared::cta.b64 %p2, [%r10], 0;")


def test_wrong_parity_across_warps_is_caught():
    """Waiting for parity 1 where phase 0 is meant: the producer warp runs first and
    completes phase 0, so the consumer waits for phase 1, which nobody brings."""
    with pytest.raises(SimError) as e:
        Buffers().run(handoff(parity=1))
    assert e.value.kind == "deadlock" and "waits for phase 1 (parity 1)" in str(e.value)


def test_setmaxnreg_checks_its_count():
    ptx = module("\n".join([PROLOGUE, "    setmaxnreg.inc.sync.aligned.u32 41;"]), threads=128)
    with pytest.raises(SimError) as e:
        Buffers().run(ptx, threads=128)
    assert "multiple of 8 in 24..256" in str(e.value)


# ---- bugs planted in generated GEMMs -------------------------------------------------------------

SPEC = tilegen.GemmSpec(dtype="f16", tile=(32, 32, 32), warps=(2, 1), stages=3)


@pytest.fixture(scope="module")
def gemm():
    return tilegen.compile(SPEC)


class PtxKernel:
    """A compiled kernel with its PTX text replaced."""

    def __init__(self, kernel, ptx):
        self._k, self.ptx = kernel, ptx
        self.name, self.threads, self.params = kernel.name, kernel.threads, kernel.params
        self.smem_bytes = kernel.smem_bytes
        self.tensor_maps, self.barriers = kernel.tensor_maps, kernel.barriers

    def grid(self, sizes, sm_count=None):
        return self._k.grid(sizes, sm_count)


def run_gemm_ptx(kernel, ptx, M=40, N=40, K=70, smem=None):
    from tilegen.gemm.call import _pitched

    rng = np.random.default_rng(0)
    A = rng.standard_normal((M, K)).astype(np.float16)
    B = rng.standard_normal((K, N)).astype(np.float16)
    mem = GlobalMemory()
    a, lda = _pitched(A)
    b, ldb = _pitched(B)
    ptrs = []
    for x in (a, b, np.zeros((M, N), np.float32)):
        ptrs.append(mem.alloc(x.nbytes))
        mem.write(ptrs[-1], x)
    k = PtxKernel(kernel, ptx)
    if smem is not None:
        k.smem_bytes = smem
    run_kernel(k, {"M": M, "N": N, "K": K, "A_ptr": ptrs[0], "A_ld": lda, "B_ptr": ptrs[1], "B_ld": ldb,
                   "C_ptr": ptrs[2], "C_ld": N, "alpha": 1.0, "beta": 0.0}, {"M": M, "N": N, "K": K}, mem)
    C = mem.read(ptrs[2], M * N * 4, np.float32).reshape(M, N)
    return C, A.astype(np.float64) @ B.astype(np.float64)


def test_generated_gemm_runs_clean(gemm):
    C, ref = run_gemm_ptx(gemm, gemm.ptx)
    assert np.abs(C - ref).max() < 1e-3


def _replace_once(ptx, old, new):
    assert ptx.count(old) >= 1, old
    return ptx.replace(old, new)


def test_gemm_without_barrier(gemm):
    ptx = _replace_once(gemm.ptx, "bar.sync 0;", "// bar.sync removed")
    with pytest.raises(SimError) as e:
        run_gemm_ptx(gemm, ptx)
    assert e.value.kind == "race" and "ldmatrix" in e.value.text


def test_gemm_waiting_for_too_few_groups(gemm):
    ptx = _replace_once(gemm.ptx, "cp.async.wait_group 1;", "cp.async.wait_group 2;")
    with pytest.raises(SimError) as e:
        run_gemm_ptx(gemm, ptx)
    assert e.value.kind == "pending" and "still pending" in str(e.value)


def test_gemm_without_edge_predication(gemm):
    """Drop the edge predicate of the copies (every selp takes its in-range operand): the
    copies of tiles past M/K keep their pointer and a non-zero src-size and read past the
    end of A or B."""
    ptx = re.sub(r"selp\.b(32|64) (%\w+), (%\w+), [^,;]+, %p\d+;", r"mov.b\1 \2, \3;", gemm.ptx)
    assert ptx != gemm.ptx
    with pytest.raises(SimError) as e:
        run_gemm_ptx(gemm, ptx)
    assert e.value.kind == "bounds" and e.value.text.startswith("cp.async")
    assert "past the end of allocation" in str(e.value)
    # named in the kernel's terms too: the argument the address lies past, the op's source line
    assert re.fullmatch(r"[AB]_ptr \+ \d+ bytes", e.value.within), e.value.within
    assert re.match(r"\w+\.py:\d+ \(", e.value.source) and f"source: {e.value.source}" in str(e.value)


def test_sizes_that_disagree_with_the_arguments_are_refused(gemm):
    """The grid comes from `sizes`, the kernel reads `args`: run_kernel refuses a mismatch
    instead of leaving rows unwritten."""
    mem = GlobalMemory()
    with pytest.raises(SimError, match=r"M = 20 in sizes but 50 in args"):
        run_kernel(PtxKernel(gemm, gemm.ptx), {"M": 50, "N": 8, "K": 16, "A_ptr": 0, "A_ld": 16, "B_ptr": 0,
                                               "B_ld": 8, "C_ptr": 0, "C_ld": 8, "alpha": 1.0, "beta": 0.0},
                   {"M": 20, "N": 8, "K": 16}, mem)


def test_gemm_unguarded_store(gemm):
    ptx = re.sub(r"@%p\d+ (st\.global)", r"\1", gemm.ptx)
    with pytest.raises(SimError) as e:
        run_gemm_ptx(gemm, ptx)
    assert e.value.kind == "bounds" and e.value.text.startswith("st.global")


def test_gemm_given_too_little_shared_memory(gemm):
    """Without the 1 KB of slack the kernel's round-up to 1024 needs, the last stage
    overruns: visible because the emulator's shared base (16) is not 1024-aligned."""
    with pytest.raises(SimError) as e:
        run_gemm_ptx(gemm, gemm.ptx, smem=gemm.smem_bytes - 1024)
    assert e.value.kind == "bounds" and "shared" in str(e.value)


def test_pointers_of_a_memory_not_passed_are_named():
    """run_kernel without memory= uses the emulator's shared memory: pointers allocated in a
    GlobalMemory of one's own are in none of its allocations (it had read "below every allocation")."""
    import tilegen
    from tilegen.sim import GlobalMemory, SimError, run_kernel

    kernel = tilegen.compile(tilegen.GemmSpec(dtype="f16", tile=(64, 64, 32), warps=(2, 2)))
    mine = GlobalMemory()
    args = {n: mine.alloc(64 * 64 * 4) if n.endswith("_ptr") else 64 for n, _ in kernel.params}
    args.update(alpha=1.0, beta=0.0, bias_ptr=0, R_ptr=0, R_ld=64)
    with pytest.raises(SimError, match=r"A_ptr = 0x[0-9a-f]+ is in no allocation of the emulator's shared "
                                       r"tilegen.sim.global_memory\(\): pass memory= the GlobalMemory"):
        run_kernel(kernel, {n: args[n] for n, _ in kernel.params}, {"M": 64, "N": 64, "K": 64})


def test_a_missing_argument_names_a_misspelled_one_given():
    import tilegen
    from tilegen.sim import GlobalMemory, SimError, run_kernel

    kernel = tilegen.compile(tilegen.GemmSpec(dtype="f16", tile=(64, 64, 32), warps=(2, 2)))
    args = {n: 64 for n, _ in kernel.params if n != "alpha"}
    args["alpah"] = 2.0
    with pytest.raises(SimError, match=r"missing arguments alpha \(given: 'alpah' for 'alpha'\?\)"):
        run_kernel(kernel, args, {"M": 64, "N": 64, "K": 64}, GlobalMemory())
    with pytest.raises(tilegen.LaunchError, match=r"missing arguments alpha \(given: 'alpah' for 'alpha'\?\)"):
        kernel.launch(args, {"M": 64, "N": 64, "K": 64})


ATOM_F16 = "m16n8k16.f16.f32"


def _axpy():
    import tilegen.dsl as tg

    @tg.kernel
    def axpy(y_layout="row", BN=32):
        """Y = alpha * X + Y over 16 x BN blocks (ragged edges), Y stored in `y_layout` order."""
        tg.launch(threads=32, grid=(tg.cdiv("M", 16), tg.cdiv("N", BN), 1))
        X = tg.tensor("X", "f32", ("M", "N"))
        Y = tg.tensor("Y", "f32", ("M", "N"), layout=y_layout)
        alpha = tg.scalar("alpha")
        r0, c0 = tg.program_id("x") * 16, tg.program_id("y") * BN
        x, y = tg.fragment(ATOM_F16, "C", (1, BN // 8)), tg.fragment(ATOM_F16, "C", (1, BN // 8))
        tg.accumulate(x, X.block(r0, c0))
        tg.accumulate(y, Y.block(r0, c0))
        tg.store(Y.block(r0, c0), x * alpha + y)
    return axpy


@pytest.mark.parametrize("layout", ["row", "col"])
def test_a_dsl_kernel_runs_on_numpy_arrays_by_tensor_name(layout):
    """run_arrays: the arrays laid out as the kernel declares them (a column-major Y stored
    transposed), their shapes the sizes, alpha by name; Y holds the result afterwards."""
    import tilegen
    from tilegen.sim import run_arrays

    kernel = tilegen.compile(_axpy(), y_layout=layout)
    rng = np.random.default_rng(11)
    X, Y = (rng.standard_normal((37, 50)).astype(np.float32) for _ in range(2))
    want = -1.5 * X.astype(np.float64) + Y
    run_arrays(kernel, X=X, Y=Y, alpha=-1.5)
    assert np.abs(Y - want).max() <= 4 * 2.0 ** -24 * np.abs(want).max()


@pytest.mark.parametrize("call, says", [
    (lambda k, X, Y: run_arrays_(k, X=X.astype(np.float64), Y=Y, alpha=1.0),
     r"X has dtype float64; this kernel takes float32 \(f32\): pass X.astype\(np.float32\)"),
    (lambda k, X, Y: run_arrays_(k, X=X, Y=Y[:, :49], alpha=1.0), r"Y gives N = 49, but X gives N = 50"),
    (lambda k, X, Y: run_arrays_(k, X=X, alpha=1.0), r"no array for Y, a 2-D array .* \(its arrays, in order: X, Y\)"),
    (lambda k, X, Y: run_arrays_(k, X=X, Y=Y, alpah=1.0), r"alpah is neither an array nor a parameter of this "
                                                          r"kernel \(alpha\?\)"),
])
def test_run_arrays_says_what_does_not_fit(call, says):
    import tilegen

    kernel = tilegen.compile(_axpy())
    X = np.zeros((20, 50), np.float32)
    with pytest.raises(tilegen.LaunchError, match=says):
        call(kernel, X, X.copy())


def run_arrays_(*args, **kw):
    from tilegen.sim import run_arrays

    return run_arrays(*args, **kw)
