"""cvt.rn.tf32.f32 and redux.sync, the two instructions sm_90 kernels use to save work, run
on the GPU and on the emulator over the same words: the emulator must give the hardware's
bits. The emulator half also runs without a GPU, against numpy."""
import numpy as np
import pytest

from tilegen.runtime import DeviceBuffer, gpu_available, load_module, synchronize
from tilegen.sim import GlobalMemory, launch
from tilegen.sim.numerics import tf32_rn, tf32_rna

THREADS = 256

# x -> (cvt.rn.tf32(x), cvt.rna.tf32(x)), then redux.sync of x over each warp for every op
OPS = [("min", "u32"), ("max", "u32"), ("min", "s32"), ("max", "s32"), ("add", "u32"), ("and", "b32"),
       ("or", "b32"), ("xor", "b32")]
OUT_WORDS = 2 + len(OPS)
PTX = """.version 7.8
.target sm_90
.address_size 64

.visible .entry conversions(.param .u64 p_x, .param .u64 p_out)
{
    .reg .b32 %r<24>;
    .reg .b64 %rd<6>;
    ld.param.u64 %rd0, [p_x];
    cvta.to.global.u64 %rd0, %rd0;
    ld.param.u64 %rd1, [p_out];
    cvta.to.global.u64 %rd1, %rd1;
    mov.u32 %r0, %tid.x;
    mul.wide.u32 %rd2, %r0, 4;
    add.u64 %rd3, %rd0, %rd2;
    ld.global.b32 %r1, [%rd3];
    mul.wide.u32 %rd4, %r0, """ + str(4 * OUT_WORDS) + """;
    add.u64 %rd5, %rd1, %rd4;
    cvt.rn.tf32.f32 %r2, %r1;
    cvt.rna.tf32.f32 %r3, %r1;
    st.global.b32 [%rd5], %r2;
    st.global.b32 [%rd5+4], %r3;
""" + "".join(f"    redux.sync.{op}.{t} %r{10 + i}, %r1, 0xffffffff;\n    st.global.b32 [%rd5+{8 + 4 * i}], %r{10 + i};\n"
              for i, (op, t) in enumerate(OPS)) + """    ret;
}
"""


def _words() -> np.ndarray:
    """IEEE specials, rounding ties both ways, overflow to inf, and random words."""
    f = np.float32
    special = [0x7F800000, 0xFF800000, 0x7FC00000, 0x7FFFFFFF, 0xFFC00001, 0x7F800001, 0x7FBFFFFF, 0,
               0x80000000, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F7FEFFF, 0x00000001, 0x00001000, 0x00003000, 0x80001000]
    ties = [np.array(v, f).view(np.uint32) for v in (1 + 2 ** -11, 1 + 3 * 2 ** -11, -(1 + 2 ** -11), 1 + 2 ** -12)]
    rng = np.random.default_rng(7)
    rest = rng.integers(0, 2 ** 32, THREADS - len(special) - len(ties), dtype=np.uint64).astype(np.uint32)
    return np.concatenate([np.array(special, np.uint32), np.array(ties, np.uint32), rest])


def _expected(x: np.ndarray) -> np.ndarray:
    """What the PTX ISA says, in numpy: the two roundings (tf32_rn's ties to even written out
    again here as arithmetic on floats), and each warp's reduction."""
    out = np.zeros((THREADS, OUT_WORDS), np.uint32)
    out[:, 0], out[:, 1] = tf32_rn(x), tf32_rna(x)
    warps = x.reshape(-1, 32)
    signed = warps.view(np.int32)
    red = {("min", "u32"): warps.min(1), ("max", "u32"): warps.max(1), ("min", "s32"): signed.min(1).view(np.uint32),
           ("max", "s32"): signed.max(1).view(np.uint32),
           ("add", "u32"): (warps.astype(np.uint64).sum(1) & 0xFFFFFFFF).astype(np.uint32),
           ("and", "b32"): np.bitwise_and.reduce(warps, 1), ("or", "b32"): np.bitwise_or.reduce(warps, 1),
           ("xor", "b32"): np.bitwise_xor.reduce(warps, 1)}
    for i, op in enumerate(OPS):
        out[:, 2 + i] = np.repeat(red[op], 32)
    return out


def _emulated(x: np.ndarray) -> np.ndarray:
    mem = GlobalMemory()
    px, po = mem.alloc(x.nbytes), mem.alloc(THREADS * OUT_WORDS * 4)
    mem.write(px, x)
    mem.write(po, np.full(THREADS * OUT_WORDS, 0xABABABAB, np.uint32))
    launch(PTX, (1, 1, 1), THREADS, {"p_x": px, "p_out": po}, memory=mem)
    return mem.read(po, THREADS * OUT_WORDS * 4, np.uint32).reshape(THREADS, OUT_WORDS)


def test_tf32_round_to_nearest_even():
    x = np.array([1 + 2 ** -11, 1 + 3 * 2 ** -11, -(1 + 3 * 2 ** -11), 1.5, 1 + 2 ** -11 + 2 ** -20], np.float32)
    got = tf32_rn(x.view(np.uint32)).view(np.float32)
    # ties go to the even neighbour (1 and 1 + 2^-9), where .rna goes away from zero
    assert list(got) == [1.0, 1 + 2 ** -9, -(1 + 2 ** -9), 1.5, 1 + 2 ** -10]
    assert tf32_rna(x[:1].view(np.uint32)).view(np.float32)[0] == 1 + 2 ** -10
    words = np.array([0x7F7FEFFF, 0x7F7FF000, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000, 0x7FC00000, 0xFFC00001],
                     np.uint32)
    assert [hex(v) for v in tf32_rn(words)] == ["0x7f7fe000", "0x7f800000", "0x7f800000", "0xff800000",
                                                "0x7f800000", "0x7fffe000", "0x7fffe000"]
    # .rna truncates what it does not round: a NaN with only low payload bits becomes inf
    nans = np.array([0x7FC00000, 0xFFC00001, 0x7F800001, 0x7FBFFFFF], np.uint32)
    assert [hex(v) for v in tf32_rna(nans)] == ["0x7fc00000", "0xffc00000", "0x7f800000", "0x7fbfe000"]
    assert (tf32_rn(_words()) & 0x1FFF == 0).all()


def test_emulator_follows_the_isa():
    x = _words()
    got, want = _emulated(x), _expected(x)
    assert (got == want).all(), f"first difference at {np.argwhere(got != want)[0]}"


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="no GPU / CUDA driver")
def test_emulator_gives_the_gpus_bits():
    x = _words()
    fn = load_module(PTX, "conversions")
    with DeviceBuffer.from_host(x) as bx, DeviceBuffer.from_host(np.full(THREADS * OUT_WORDS, 0xABABABAB,
                                                                           np.uint32)) as bo:
        fn.launch((1,), (THREADS,), [(bx, "ptr"), (bo, "ptr")])
        synchronize()
        gpu = bo.copy_to_host(np.empty(THREADS * OUT_WORDS, np.uint32)).reshape(THREADS, OUT_WORDS)
    emu = _emulated(x)
    bad = [f"input 0x{x[i]:08x} column {j}: GPU 0x{gpu[i, j]:08x}, emulator 0x{emu[i, j]:08x}"
           for i, j in np.argwhere(gpu != emu)]
    assert not bad, f"{len(bad)} words differ: " + "; ".join(bad[:12])
