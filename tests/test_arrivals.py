"""Arrival counters (tilegen.counters, dsl/arrivals.py): the PTX of the handshake, the
emulator's atom and bar.red, and a kernel whose CTAs each publish a part while the last to
arrive adds them all, run twice on the same counters (the last arrival resets them); a count
too high leaves C unwritten, one too low is caught by the emulator's order check. The parts
also go out through TMA stores, published once complete (tma_store_wait(writes=True)); the
wait for the stores' shared reads alone is caught."""
import numpy as np
import pytest

import tilegen
import tilegen.dsl as tg
from ptxas_util import assert_assembles, needs_ptxas
from tilegen.runtime import DeviceBuffer, gpu_available, synchronize
from tilegen.sim import GlobalMemory, SimError, run_kernel

ATOM = "m16n8k16.f16.f32"


def make_kernel(arrivals_off: int = 0, reset: bool = True, tma: str = ""):
    """CTA c adds its 16 x 8 block of X into slot c of W; the last CTA to arrive sums every
    slot, in slot order, into C. The CTA's first warp is a role that does nothing, so the
    counting runs in a role of its own (its named barrier). tma="complete": the CTA's 32 x 8
    slot goes out through shared memory and one TMA store, waited for until complete before
    the arrival; tma="read": (planted) waited for only until it read shared memory."""
    @tg.kernel
    def publish_and_sum():
        tg.launch(threads=96, grid=("G", 1, 1))
        X = tg.tensor("X", "f32", ("R", "N"))
        W = tg.tensor("W", "f32", ("R", "N"))
        C = tg.tensor("C", "f32", ("M", "N"))
        F = tg.counters("F")
        G = tg.size("G")
        pid = tg.program_id()
        sW = tg.shared("sW", "f32", 32, 8, swizzle="none") if tma else None
        with tg.role("idle", warps=(0, 1)):
            pass
        with tg.role("work", warps=(1, 3)):
            row = pid * 32 + (tg.warp_id() - 1) * 16
            part = tg.fragment(ATOM, "C", (1, 1))
            tg.accumulate(part, X.block(row, 0))
            if tma:
                tg.store_stage(sW[0], part, (tg.warp_id() - 1) * 16)
                tg.fence_proxy_async()
                tg.barrier()
                tg.tma_store(W.block(pid * 32, 0), sW[0])
                tg.tma_store_commit()
                tg.tma_store_wait(0, writes=tma == "complete")
            else:
                tg.store(W.block(row, 0), part)
            with tg.if_(F.last_arrival(0, G - 1 if arrivals_off < 0 else G + arrivals_off)):
                total = tg.fragment(ATOM, "C", (1, 1))
                for c in tg.range(G):
                    tg.accumulate(total, W.block(c * 32 + (tg.warp_id() - 1) * 16, 0))
                tg.store(C.block((tg.warp_id() - 1) * 16, 0), total)
    kernel = tilegen.compile(publish_and_sum, **({"target": "sm_90a"} if tma else {}))
    if not reset:   # (planted: the last arrival leaves its count behind)
        lines = [ln for ln in kernel.ptx.splitlines() if "st.relaxed.gpu.global.u32" not in ln]
        kernel = _with_ptx(kernel, "\n".join(lines) + "\n")
    return kernel


def _with_ptx(kernel, ptx):
    import copy
    k = copy.copy(kernel)
    k.ptx = ptx
    return k


def run(kernel, G: int, mem: GlobalMemory, counters: int, seed: int):
    """One launch over G CTAs; (C, the expected sum)."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((32 * G, 8)).astype(np.float32)
    ptrs = {}
    for name, arr in (("X", X), ("W", np.full_like(X, np.nan)), ("C", np.full((32, 8), np.nan, np.float32))):
        ptrs[name] = mem.alloc(arr.nbytes)
        mem.write(ptrs[name], arr.tobytes())
    args = {"G": G, "R": 32 * G, "N": 8, "M": 32, "X_ptr": ptrs["X"], "W_ptr": ptrs["W"], "C_ptr": ptrs["C"],
            "X_ld": 8, "W_ld": 8, "C_ld": 8, "F_ptr": counters}
    run_kernel(kernel, args, {"G": G}, memory=mem)
    C = np.frombuffer(mem.read(ptrs["C"], 32 * 8 * 4), np.float32).reshape(32, 8)
    want = np.zeros((32, 8), np.float32)   # (in slot order, as the kernel adds)
    for c in range(G):
        want += X[32 * c:32 * c + 32]
    return C, want


def counters_at(mem: GlobalMemory, n: int = 4):
    ptr = mem.alloc(4 * n)
    mem.write(ptr, np.zeros(n, np.uint32).tobytes())
    return ptr


def read_counters(mem, ptr, n: int = 4):
    return np.frombuffer(mem.read(ptr, 4 * n), np.uint32)


def test_the_handshake_in_ptx():
    ptx = make_kernel().ptx
    body = ptx[ptx.index("// role work"):]
    # the role's barrier, then one thread's acq_rel add, the reset, and the or-reduction over the role
    sync = body.index("bar.sync 2, 64;")
    atom = body.index("atom.acq_rel.gpu.global.add.u32")
    reset = body.index("st.relaxed.gpu.global.u32")
    red = body.index("bar.red.or.pred")
    assert sync < atom < reset < red
    assert body[red:].split(";")[0].split(",")[1:3] == [" 2", " 64"]


@needs_ptxas
def test_the_handshake_assembles():
    ptx = make_kernel().ptx
    assert_assembles(ptx, "sm_80")
    assert_assembles(ptx, "sm_90a")


@pytest.mark.parametrize("G", [1, 3, 5])
def test_the_last_cta_sums_every_part_and_the_counter_resets(G):
    kernel, mem = make_kernel(), GlobalMemory()
    F = counters_at(mem)
    for seed in (1, 2):   # the second launch finds the counter its first left at 0
        C, want = run(kernel, G, mem, F, seed)
        np.testing.assert_array_equal(C, want)
        assert read_counters(mem, F).tolist() == [0, 0, 0, 0]


def test_planted_no_reset_fails_the_second_launch():
    kernel, mem = make_kernel(reset=False), GlobalMemory()
    F = counters_at(mem)
    C, want = run(kernel, 3, mem, F, 1)
    np.testing.assert_array_equal(C, want)
    assert read_counters(mem, F)[0] == 3
    C, _ = run(kernel, 3, mem, F, 2)
    assert np.isnan(C).all()          # no CTA of the second launch saw itself last


def test_planted_count_too_high_leaves_c_unwritten():
    mem = GlobalMemory()
    C, want = run(make_kernel(arrivals_off=1), 3, mem, counters_at(mem), 1)
    assert not np.array_equal(C, want)


def test_planted_count_too_low_sums_a_slot_before_its_cta_wrote_it():
    """CTA 1 takes itself for the last and reads slot 2 before CTA 2 stores it: on the GPU
    CTA 2's store may land before or after that read. The emulator's order check names it."""
    mem = GlobalMemory()
    with pytest.raises(SimError) as e:
        run(make_kernel(arrivals_off=-1), 3, mem, counters_at(mem), 1)
    assert e.value.kind == "order" and e.value.cta == (2, 0, 0)
    assert "writes global memory that CTA (1, 0, 0) read" in str(e.value)


def test_tma_stores_complete_before_the_arrival_in_ptx():
    for tma, wait in (("complete", "cp.async.bulk.wait_group 0;"), ("read", "cp.async.bulk.wait_group.read 0;")):
        body = make_kernel(tma=tma).ptx
        body = body[body.index("// role work"):]
        store, waited = body.index("cp.async.bulk.tensor.2d.global.shared::cta"), body.index(wait)
        assert store < waited < body.index("bar.sync 2, 64;", waited) < body.index("atom.acq_rel.gpu.global.add.u32", waited)
    assert "wait_group.read" not in make_kernel(tma="complete").ptx


@needs_ptxas
def test_the_tma_store_wait_for_writes_assembles():
    assert_assembles(make_kernel(tma="complete").ptx, "sm_90a")


@pytest.mark.parametrize("G", [1, 3])
def test_parts_published_through_complete_tma_stores(G):
    kernel, mem = make_kernel(tma="complete"), GlobalMemory()
    F = counters_at(mem)
    for seed in (1, 2):
        C, want = run(kernel, G, mem, F, seed)
        np.testing.assert_array_equal(C, want)
        assert read_counters(mem, F).tolist() == [0, 0, 0, 0]


@pytest.mark.parametrize("G, kind, cta, writer", [(3, "order", (2, 0, 0), "CTA (0, 0, 0)"),
                                                  (1, "race", (0, 0, 0), "this CTA")])
def test_planted_tma_store_published_before_it_completed(G, kind, cta, writer):
    """wait_group.read frees the store's shared source only: its global writes may still be in
    flight when the arrival releases them. The last CTA's first read of a slot is reported,
    naming the TMA store (its thread and PTX line); with one CTA the reader is its own CTA."""
    kernel, mem = make_kernel(tma="read"), GlobalMemory()
    with pytest.raises(SimError) as e:
        run(kernel, G, mem, counters_at(mem), 1)
    err = e.value
    store_line = next(i + 1 for i, ln in enumerate(kernel.ptx.splitlines())
                      if "cp.async.bulk.tensor.2d.global.shared::cta" in ln)
    assert (err.kind, err.cta) == (kind, cta), str(err)
    assert f"a TMA store of {writer} (thread 32, PTX line {store_line}) may still be writing" in str(err)
    assert "ld.global" in kernel.ptx.splitlines()[err.line - 1]
    assert err.source.startswith("test_arrivals.py:") and "+= W" in err.source   # the DSL line of the read


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="no GPU / CUDA driver")
def test_parts_published_through_complete_tma_stores_on_the_gpu():
    """The same kernel on the H200 over 264 CTAs (two per SM), 20 launches on one set of
    counters: the last CTA's sum, in slot order, is numpy's float32 sum in that order, bit for
    bit, every time, and the counter is back at 0."""
    G, launches = 264, 20
    kernel = make_kernel(tma="complete")
    rng = np.random.default_rng(5)
    X = rng.standard_normal((32 * G, 8)).astype(np.float32)
    want = np.zeros((32, 8), np.float32)
    for c in range(G):
        want += X[32 * c:32 * c + 32]
    with DeviceBuffer.from_host(X) as bx, DeviceBuffer.from_host(np.full_like(X, np.nan)) as bw, \
            DeviceBuffer.from_host(np.zeros(4, np.uint32)) as bf, DeviceBuffer(32 * 8 * 4) as bc:
        args = {"G": G, "R": 32 * G, "N": 8, "M": 32, "X_ptr": bx.ptr, "W_ptr": bw.ptr, "C_ptr": bc.ptr,
                "X_ld": 8, "W_ld": 8, "C_ld": 8, "F_ptr": bf.ptr}
        for _ in range(launches):
            bc.copy_from_host(np.full((32, 8), np.nan, np.float32))
            kernel.launch(args, {"G": G})
            synchronize()
            np.testing.assert_array_equal(bc.copy_to_host(np.empty((32, 8), np.float32)), want)
        assert bf.copy_to_host(np.empty(4, np.uint32)).tolist() == [0, 0, 0, 0]


def test_atom_returns_each_threads_old_value_in_thread_order():
    from tilegen.sim import launch
    ptx = """.version 8.0
.target sm_80
.address_size 64
.visible .entry k(.param .u64 p, .param .u64 q)
{
  .reg .b32 %r<6>; .reg .b64 %rd<6>; .reg .pred %p<3>;
  ld.param.u64 %rd1, [p];
  ld.param.u64 %rd2, [q];
  mov.u32 %r1, %tid.x;
  and.b32 %r2, %r1, 1;
  setp.eq.u32 %p1, %r2, 0;
  @%p1 atom.relaxed.gpu.global.add.u32 %r3, [%rd1], 5;
  mul.wide.u32 %rd3, %r1, 4;
  add.s64 %rd4, %rd2, %rd3;
  @%p1 st.global.u32 [%rd4], %r3;
  atom.global.exch.b32 %r4, [%rd1+4], %r1;
  ret;
}
"""
    mem = GlobalMemory()
    p, q = mem.alloc(8), mem.alloc(4 * 64)
    mem.write(p, np.array([7, 0], np.uint32).tobytes())
    mem.write(q, np.full(64, 99, np.uint32).tobytes())
    launch(ptx, (1, 1, 1), 64, {"p": p, "q": q}, memory=mem)
    out = np.frombuffer(mem.read(q, 4 * 64), np.uint32)
    assert out[0::2].tolist() == [7 + 5 * i for i in range(32)]   # even threads, in order
    assert (out[1::2] == 99).all()                                # odd threads did not add
    assert np.frombuffer(mem.read(p, 8), np.uint32).tolist() == [7 + 5 * 32, 63]   # exch: the last thread's


def test_bar_red_outside_a_role_and_unsupported_atoms_are_named():
    from tilegen.sim import launch
    head = """.version 8.0
.target sm_80
.address_size 64
.visible .entry k(.param .u64 p)
{
  .reg .b32 %r<6>; .reg .b64 %rd<6>; .reg .pred %p<4>;
  ld.param.u64 %rd1, [p];
  mov.u32 %r1, %tid.x;
"""
    ptx = head + """  setp.eq.u32 %p1, %r1, 37;
  bar.red.or.pred %p2, 0, %p1;
  bar.red.and.pred %p3, 0, %p1;
  selp.u32 %r2, 1, 0, %p2;
  selp.u32 %r3, 2, 0, %p3;
  add.u32 %r4, %r2, %r3;
  mul.wide.u32 %rd3, %r1, 4;
  add.s64 %rd4, %rd1, %rd3;
  st.global.u32 [%rd4], %r4;
  ret;
}
"""
    mem = GlobalMemory()
    p = mem.alloc(4 * 64)
    launch(ptx, (1, 1, 1), 64, {"p": p}, memory=mem)
    assert (np.frombuffer(mem.read(p, 4 * 64), np.uint32) == 1).all()   # or: true everywhere; and: false
    for wrong in ("atom.global.cas.b32 %r2, [%rd1], 0, 1", "atom.global.exch.u32 %r2, [%rd1], 1",
                  "atom.global.add.b32 %r2, [%rd1], 1"):   # (ptxas refuses the last two: exch is .b32, add .u32/.s32)
        with pytest.raises(SimError, match="atom.global.add.u32 / .s32 and atom.global.exch.b32"):
            launch(head + f"  {wrong};\n  ret;\n}}\n", (1, 1, 1), 32, {"p": p}, memory=mem)


def test_stream_keys_tell_the_threads_of_the_per_thread_default_stream_apart():
    """The per-thread default stream (handle 2) is a different stream in every host thread: its
    scratch (workspace, arrival counters) and the calls remembered with it are per thread."""
    import threading
    from tilegen.runtime import stream_key

    keys = []
    worker = threading.Thread(target=lambda: keys.append((stream_key(2), stream_key(0), stream_key(1234))))
    worker.start()
    worker.join()
    assert keys[0][0] != stream_key(2) and keys[0][1:] == (0, 1234) == (stream_key(0), stream_key(1234))
