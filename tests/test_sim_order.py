"""Order between CTAs in global memory (sim/ordering.py): the emulator runs CTAs one after
another, so it checks that an ordinary access of bytes another CTA of the launch wrote follows
a release-acquire chain. A hand-written message pass (CTA 0 publishes, CTA 1 reads) with each
link of the chain taken out in turn; the fence forms of release and acquire; ld.global.nc of
data written during the launch; two CTAs writing one word; a write after another CTA's read;
two threads of one CTA (the shared-memory rules, in global memory, for reads after writes and
writes after reads). Then the generated kernels that
count arrivals (dsl/arrivals.py and the split-K stacks), with their atom weakened."""
import re

import numpy as np
import pytest

import tilegen
from tilegen.sim import GlobalMemory, SimError, launch

T = 64
PARAMS = (("data", "u64"), ("flag", "u64"))


def module(body: str) -> str:
    plist = ",\n".join(f"    .param .{t} {n}" for n, t in PARAMS)
    return (f".version 7.8\n.target sm_90\n.address_size 64\n"
            f".visible .entry k(\n{plist}\n)\n.reqntid {T}, 1, 1\n{{\n"
            f"    .reg .b32 %r<16>;\n    .reg .b64 %rd<16>;\n    .reg .pred %p<8>;\n{body}\n    ret;\n}}\n")


RELEASE = "    @%p1 atom.release.gpu.global.add.u32 %r6, [%rd4], 1;"
ACQUIRE = "    @%p1 ld.acquire.gpu.global.u32 %r6, [%rd4];"


# Every thread's word of `data` (%rd6) and its partner's, thread t + 32's mod 64 (%rd8); %r1 the
# thread, %r3 the CTA, %rd4 the flag, %p1 thread 0.
WORDS = [
    "    mov.u32 %r1, %tid.x;", "    mov.u32 %r3, %ctaid.x;",
    "    ld.param.u64 %rd2, [data];", "    cvta.to.global.u64 %rd2, %rd2;",
    "    ld.param.u64 %rd4, [flag];", "    cvta.to.global.u64 %rd4, %rd4;",
    "    add.u32 %r5, %r1, 32;", "    and.b32 %r5, %r5, 63;",
    "    mul.wide.u32 %rd6, %r1, 4;", "    add.s64 %rd6, %rd2, %rd6;",
    "    mul.wide.u32 %rd8, %r5, 4;", "    add.s64 %rd8, %rd2, %rd8;",
    "    setp.eq.u32 %p1, %r1, 0;"]


def message_pass(release=RELEASE, acquire=ACQUIRE, writer_barrier=True, reader_barrier=True,
                 read="ld.global.b32"):
    """CTA 0: every thread stores a word of `data`, they meet at a barrier, thread 0 releases on
    `flag`. CTA 1: thread 0 acquires on `flag`, a barrier, every thread reads another thread's
    word (so the reads cross warps as well as CTAs)."""
    return module("\n".join(WORDS + [
        "    setp.ne.u32 %p2, %r3, 0;",
        "    @%p2 bra READER;",
        "    st.global.b32 [%rd6], %r1;",
        "    bar.sync 0;" if writer_barrier else "",
        release,
        "    bra DONE;",
        "READER:",
        acquire,
        "    bar.sync 0;" if reader_barrier else "",
        f"    {read} %r7, [%rd8];",
        "DONE:"]))


def run(ptx, ctas: int = 2):
    mem = GlobalMemory()
    data, flag = mem.alloc(4 * T), mem.alloc(4)
    mem.write(data, np.full(T, 7, np.uint32))
    mem.write(flag, np.zeros(1, np.uint32))
    launch(ptx, (ctas, 1, 1), T, {"data": data, "flag": flag}, memory=mem)
    return mem, data


def line_of(ptx: str, text: str) -> int:
    hits = [i + 1 for i, ln in enumerate(ptx.splitlines()) if ln.strip() == text.strip()]
    assert len(hits) == 1, f"{text!r} occurs {len(hits)} times"
    return hits[0]


FENCED_RELEASE = "    @%p1 fence.acq_rel.gpu;\n    @%p1 st.relaxed.gpu.global.u32 [%rd4], 1;"
FENCED_ACQUIRE = "    @%p1 ld.relaxed.gpu.global.u32 %r6, [%rd4];\n    @%p1 fence.acq_rel.gpu;"


@pytest.mark.parametrize("release, acquire", [
    (RELEASE, ACQUIRE),
    ("    @%p1 st.release.gpu.global.u32 [%rd4], 1;", "    @%p1 atom.acquire.gpu.global.add.u32 %r6, [%rd4], 0;"),
    ("    @%p1 atom.acq_rel.gpu.global.add.u32 %r6, [%rd4], 1;", "    @%p1 atom.acq_rel.gpu.global.add.u32 %r6, [%rd4], 1;"),
    (FENCED_RELEASE, FENCED_ACQUIRE),
    (FENCED_RELEASE.replace("fence.acq_rel.gpu", "membar.gl"), FENCED_ACQUIRE.replace("fence.acq_rel.gpu", "fence.sc.gpu")),
    ("    @%p1 fence.sc.sys;\n    @%p1 atom.global.add.u32 %r6, [%rd4], 1;", "    @%p1 ld.volatile.global.u32 %r6, [%rd4];\n"
                                                                             "    @%p1 membar.sys;"),
])
def test_a_release_acquire_chain_orders_the_message(release, acquire):
    mem, data = run(message_pass(release, acquire))
    np.testing.assert_array_equal(mem.read(data, 4 * T, np.uint32), np.arange(T))


@pytest.mark.parametrize("case, kw, reader", [
    ("relaxed release", dict(release="    @%p1 atom.relaxed.gpu.global.add.u32 %r6, [%rd4], 1;"), 0),
    ("plain store of the flag", dict(release="    @%p1 st.relaxed.gpu.global.u32 [%rd4], 1;"), 0),
    ("fence after the store", dict(release="    @%p1 st.relaxed.gpu.global.u32 [%rd4], 1;\n    @%p1 fence.acq_rel.gpu;"), 0),
    ("relaxed acquire", dict(acquire="    @%p1 ld.relaxed.gpu.global.u32 %r6, [%rd4];"), 0),
    ("fence before the load", dict(acquire="    @%p1 fence.acq_rel.gpu;\n    @%p1 ld.relaxed.gpu.global.u32 %r6, [%rd4];"), 0),
    ("cta scope", dict(release=RELEASE.replace(".gpu", ".cta"), acquire=ACQUIRE.replace(".gpu", ".cta")), 0),
    ("no barrier before the release", dict(writer_barrier=False), 0),   # thread 0 reads thread 32's word
    ("no barrier after the acquire", dict(reader_barrier=False), 1),    # thread 1 never acquired
])
def test_a_missing_link_is_reported(case, kw, reader):
    ptx = message_pass(**kw)
    with pytest.raises(SimError) as e:
        run(ptx)
    err = e.value
    assert err.kind == "order" and err.cta == (1, 0, 0) and err.tid == reader, (case, err)
    assert err.line == line_of(ptx, "ld.global.b32 %r7, [%rd8];")
    assert "reads global memory that CTA (0, 0, 0) wrote" in str(err) and "PTX line" in str(err)


def test_the_non_coherent_path_may_not_read_what_the_launch_wrote():
    """Even after a correct chain: ld.global.nc is defined only for data no one writes while the
    kernel runs."""
    ptx = message_pass(read="ld.global.nc.b32")
    with pytest.raises(SimError, match="non-coherent path") as e:
        run(ptx)
    assert e.value.kind == "order" and e.value.cta == (1, 0, 0)


def _same_word(ordered: bool):
    """Thread 0 of each CTA stores its CTA id into data[0]; with `ordered`, CTA 0 releases after
    its store and CTA 1 acquires before its own."""
    return module("\n".join([
        "    mov.u32 %r1, %tid.x;", "    mov.u32 %r3, %ctaid.x;",
        "    ld.param.u64 %rd2, [data];", "    cvta.to.global.u64 %rd2, %rd2;",
        "    ld.param.u64 %rd4, [flag];", "    cvta.to.global.u64 %rd4, %rd4;",
        "    setp.eq.u32 %p1, %r1, 0;", "    setp.ne.u32 %p2, %r3, 0;",
        ACQUIRE.replace("%p1", "%p3") if ordered else "",
        "    and.pred %p3, %p1, %p2;",
        ACQUIRE.replace("%p1", "%p3") if ordered else "",
        "    @%p1 st.global.b32 [%rd2], %r3;",
        RELEASE if ordered else ""]))


def test_two_ctas_writing_one_word_race_unless_ordered():
    ptx = _same_word(False)
    with pytest.raises(SimError, match="writes global memory that CTA \\(0, 0, 0\\) wrote") as e:
        run(ptx)
    assert (e.value.kind, e.value.cta, e.value.tid) == ("order", (1, 0, 0), 0)
    mem, data = run(_same_word(True))
    assert mem.read(data, 4, np.uint32)[0] == 1


def test_writes_of_an_earlier_launch_need_no_chain():
    """A launch boundary orders everything: CTA 1 of a second launch reads what CTA 0 of the
    first wrote, with no flag at all."""
    nothing = "    // (nothing)"
    ptx = message_pass(release=nothing, acquire=nothing)
    mem = GlobalMemory()
    data, flag = mem.alloc(4 * T), mem.alloc(4)
    launch(ptx, (1, 1, 1), T, {"data": data, "flag": flag}, memory=mem)   # CTA 0 only: writes
    reader = ptx.replace("setp.ne.u32 %p2, %r3, 0;", "setp.eq.u32 %p2, %r3, 0;")
    launch(reader, (1, 1, 1), T, {"data": data, "flag": flag}, memory=mem)   # CTA 0 reads


def _exchange_in_global(barrier: bool, same_word: bool = False, rewrite: str = ""):
    """One CTA: each thread stores a word of `data` (with `same_word`, threads 0 and 32 both store
    word 0), then, after a barrier or not, reads its partner's word (thread t + 32's); with
    `rewrite` ("barrier" or "none"), then stores its own word again, after a barrier or not."""
    return module("\n".join([
        "    mov.u32 %r1, %tid.x;",
        "    ld.param.u64 %rd2, [data];", "    cvta.to.global.u64 %rd2, %rd2;",
        "    add.u32 %r5, %r1, 32;", "    and.b32 %r5, %r5, 63;",
        "    and.b32 %r4, %r1, 31;" if same_word else "    mov.u32 %r4, %r1;",
        "    mul.wide.u32 %rd6, %r4, 4;", "    add.s64 %rd6, %rd2, %rd6;",
        "    mul.wide.u32 %rd8, %r5, 4;", "    add.s64 %rd8, %rd2, %rd8;",
        "    st.global.b32 [%rd6], %r1;",
        "    bar.sync 0;" if barrier else "",
        "    ld.global.b32 %r7, [%rd8];",
        "    bar.sync 0;" if rewrite == "barrier" else "",
        "    add.u32 %r9, %r1, 100;\n    st.global.b32 [%rd6], %r9;" if rewrite else ""]))


def _one_cta(ptx):
    mem = GlobalMemory()
    data, flag = mem.alloc(4 * T), mem.alloc(4)
    launch(ptx, (1, 1, 1), T, {"data": data, "flag": flag}, memory=mem)
    return mem.read(data, 4 * T, np.uint32)


READER_RELEASE = "    @%p1 atom.release.gpu.global.add.u32 %r6, [%rd4], 1;"


def read_then_overwrite(reader_release=READER_RELEASE, reader_barrier=True):
    """CTA 0 publishes a word per thread (as message_pass); CTA 1 acquires them and every
    thread reads its partner's word, then (a barrier and) thread 0 releases on the same flag,
    an atom that continues its release sequence; CTA 2 acquires the flag and overwrites every
    word. On the GPU CTA 2 may run first: its stores must wait until CTA 1 released its reads."""
    return module("\n".join(WORDS + [
        "    setp.eq.u32 %p2, %r3, 1;", "    setp.eq.u32 %p3, %r3, 2;",
        "    @%p2 bra READER;", "    @%p3 bra OVERWRITER;",
        "    st.global.b32 [%rd6], %r1;", "    bar.sync 0;", RELEASE, "    bra DONE;",
        "READER:", ACQUIRE, "    bar.sync 0;", "    ld.global.b32 %r7, [%rd8];",
        "    bar.sync 0;" if reader_barrier else "", reader_release, "    bra DONE;",
        "OVERWRITER:", ACQUIRE, "    bar.sync 0;", "    add.u32 %r8, %r1, 100;", "    st.global.b32 [%rd6], %r8;",
        "DONE:"]))


def run3(ptx):
    mem, data = run(ptx, ctas=3)
    return mem.read(data, 4 * T, np.uint32)


def test_a_write_after_another_ctas_read_waits_for_its_release():
    np.testing.assert_array_equal(run3(read_then_overwrite()), np.arange(T) + 100)


@pytest.mark.parametrize("case, kw, writer", [
    ("no release after the reads", dict(reader_release=""), 0),
    ("relaxed release", dict(reader_release=READER_RELEASE.replace("release", "relaxed")), 0),
    ("no barrier before the release", dict(reader_barrier=False), 0),   # thread 32's read of word 0
])
def test_a_write_after_an_unreleased_read_is_reported(case, kw, writer):
    ptx = read_then_overwrite(**kw)
    with pytest.raises(SimError) as e:
        run3(ptx)
    err = e.value
    assert err.kind == "order" and err.cta == (2, 0, 0) and err.tid == writer, (case, err)
    assert err.line == line_of(ptx, "st.global.b32 [%rd6], %r8;")
    assert "writes global memory that CTA (1, 0, 0) read" in str(err), (case, str(err))


def overwrite_an_input(reader_release=READER_RELEASE, acquire=ACQUIRE):
    """In place, as a shift or a transpose into its own input would: every thread of CTA 0
    reads its partner's word of `data`, which nothing in the launch wrote (an input), then
    thread 0 releases on `flag`; CTA 1 acquires it and every thread overwrites its own word."""
    return module("\n".join(WORDS + [
        "    setp.ne.u32 %p2, %r3, 0;", "    @%p2 bra OVERWRITER;",
        "    ld.global.b32 %r7, [%rd8];", "    bar.sync 0;", reader_release, "    bra DONE;",
        "OVERWRITER:", acquire, "    bar.sync 0;", "    add.u32 %r8, %r1, 100;", "    st.global.b32 [%rd6], %r8;",
        "DONE:"]))


def test_overwriting_an_input_another_cta_read_needs_its_release():
    """The reads come before any write to the allocation: they are recorded all the same."""
    mem, data = run(overwrite_an_input())
    np.testing.assert_array_equal(mem.read(data, 4 * T, np.uint32), np.arange(T) + 100)
    for kw in (dict(reader_release=""), dict(acquire="")):
        ptx = overwrite_an_input(**kw)
        with pytest.raises(SimError) as e:
            run(ptx)
        err = e.value
        assert err.kind == "order" and err.cta == (1, 0, 0), (kw, err)
        assert err.line == line_of(ptx, "st.global.b32 [%rd6], %r8;")
        assert "writes global memory that CTA (0, 0, 0) read" in str(err), (kw, str(err))


def test_a_thread_may_not_overwrite_an_input_another_thread_read_without_a_barrier():
    ptx = module("\n".join(WORDS + ["    ld.global.b32 %r7, [%rd8];", "    add.u32 %r8, %r1, 100;",
                                     "    st.global.b32 [%rd6], %r8;"]))
    with pytest.raises(SimError, match="global-memory race: writes bytes that thread 32 of this CTA read") as e:
        _one_cta(ptx)
    assert (e.value.kind, e.value.tid) == ("race", 0)
    fixed = ptx.replace("    add.u32 %r8", "    bar.sync 0;\n    add.u32 %r8")
    np.testing.assert_array_equal(_one_cta(fixed), np.arange(T) + 100)


def test_threads_of_one_cta_race_in_global_memory_without_a_barrier():
    np.testing.assert_array_equal(_one_cta(_exchange_in_global(True)), np.arange(T))
    ptx = _exchange_in_global(False)
    with pytest.raises(SimError, match="global-memory race: reads bytes that thread 32 of this CTA wrote") as e:
        _one_cta(ptx)
    assert (e.value.kind, e.value.tid) == ("race", 0)
    assert e.value.line == line_of(ptx, "ld.global.b32 %r7, [%rd8];")
    with pytest.raises(SimError, match="global-memory race: threads 0 and 32 write the same bytes") as e:
        _one_cta(_exchange_in_global(True, same_word=True))     # threads 0 and 32 store word 0 together
    assert (e.value.kind, e.value.tid) == ("race", 32)


def test_a_thread_may_not_overwrite_what_another_thread_of_its_cta_read_without_a_barrier():
    np.testing.assert_array_equal(_one_cta(_exchange_in_global(True, rewrite="barrier")), np.arange(T) + 100)
    ptx = _exchange_in_global(True, rewrite="none")
    with pytest.raises(SimError, match="global-memory race: writes bytes that thread 32 of this CTA read") as e:
        _one_cta(ptx)
    assert (e.value.kind, e.value.tid) == ("race", 0)
    assert e.value.line == line_of(ptx, "st.global.b32 [%rd6], %r9;")


# ---- generated kernels ---------------------------------------------------------------------------

def _weakened(ptx: str, sem: str) -> str:
    assert "atom.acq_rel.gpu.global.add.u32" in ptx
    return ptx.replace("atom.acq_rel.gpu", f"atom.{sem}.gpu")


@pytest.mark.parametrize("sem", ["relaxed", "release", "acquire"])
def test_arrival_counters_need_both_halves_of_acq_rel(sem):
    """dsl/arrivals.py's handshake (tests/test_arrivals.py's kernel: each CTA publishes a part, the
    last to arrive sums them): clean as generated, reported with either half of acq_rel gone."""
    from test_arrivals import _with_ptx, counters_at, make_kernel
    from test_arrivals import run as run_parts

    kernel = make_kernel()
    mem = GlobalMemory()
    C, want = run_parts(kernel, 4, mem, counters_at(mem), seed=1)
    np.testing.assert_allclose(C, want, rtol=1e-6)
    weak = _with_ptx(kernel, _weakened(kernel.ptx, sem))
    mem = GlobalMemory()
    with pytest.raises(SimError, match="reads global memory that CTA") as e:
        run_parts(weak, 4, mem, counters_at(mem), seed=1)
    assert e.value.kind == "order" and e.value.cta == (3, 0, 0)


def test_arrival_counters_need_the_roles_barrier_before_the_release():
    from test_arrivals import _with_ptx, counters_at, make_kernel
    from test_arrivals import run as run_parts

    kernel = make_kernel()
    barrier = [ln for ln in kernel.ptx.splitlines() if re.fullmatch(r"\s*bar\.sync \d+, \d+;", ln)]
    assert len(barrier) == 1
    weak = _with_ptx(kernel, kernel.ptx.replace(barrier[0] + "\n", ""))
    mem = GlobalMemory()
    with pytest.raises(SimError, match="reads global memory that CTA") as e:
        run_parts(weak, 4, mem, counters_at(mem), seed=1)
    assert e.value.kind == "order" and e.value.tid % 32 != 0   # (the leader's own stores are its own)


def test_split_k_stacks_publish_their_partial_sums_in_order():
    """The warp-specialized split-K stack (template.py: each slice's partial sums to W, the last
    slice to arrive adds them): clean as generated, reported with the arrival's atom relaxed."""
    import copy

    import ml_dtypes

    spec = tilegen.GemmSpec(dtype="bf16", out_dtype="f32", instruction="wgmma", batched=True, copy="tma",
                            tile=(64, 64, 64), warps=(4, 1), stages=4, split_k=3)
    kernel = tilegen.compile(spec)
    rng = np.random.default_rng(3)
    A = rng.standard_normal((2, 40, 200)).astype(ml_dtypes.bfloat16)
    B = rng.standard_normal((2, 200, 72)).astype(ml_dtypes.bfloat16)
    ref = np.matmul(A.astype(np.float64), B.astype(np.float64))
    C = kernel(A, B, device="sim")
    assert np.abs(C - ref).max() < 1e-2 * np.abs(ref).max()
    weak = copy.copy(kernel)
    weak.ptx = _weakened(kernel.ptx, "relaxed")
    with pytest.raises(SimError, match="reads global memory that CTA") as e:
        weak(A, B, device="sim")
    assert e.value.kind == "order"
