"""CPU emulator of the PTX tilegen emits (device="sim").

It runs the PTX text, not the IR, so it checks what really ships: a lark grammar parses
the module (ptx.lark, parser.py), each instruction is decoded once into a closure
(decode.py), and a grid runs CTA by CTA with all threads of a CTA vectorised in numpy
(runner.py). mma/ldmatrix semantics come from the emulator's own PTX ISA tables
(tables.py), not from tilegen.arch; tests hold the two together.

It finds bugs and raises SimError naming the PTX line, the thread and the address:
out-of-bounds global or shared accesses, shared-memory races across a missing bar.sync,
reads of a cp.async still pending, writes over a stage another thread may still be
reading (or a wgmma still in flight), wgmma reads of generic-proxy writes without
fence.proxy.async, accumulator registers read or written (and register A operands written)
while their wgmma is in flight (before the wait_group that retires it), global memory one CTA reads or writes after another CTA of the launch wrote it,
or writes after another CTA read it, with no release-acquire chain between them (ordering.py),
TMA stores published before a wait_group (without .read) completed them, writes of global
memory a TMA load may still be reading (before a wait on its barrier saw the copy land), a CTA
that ends with a TMA copy into its shared memory not landed, misaligned addresses, and control flow
it cannot run (divergent branches).

    mem = tilegen.sim.GlobalMemory()
    a = mem.alloc(A.nbytes); mem.write(a, A)
    tilegen.sim.run_kernel(kernel, {"A_ptr": a, ...}, {"M": M, "N": N, "K": K}, mem)
    C = tilegen.compile(spec)(A, B, device="sim")          # numpy in, numpy out

A run still going after a few seconds says how far it got, every few seconds (sim/progress.py:
the "tilegen" logger, or stderr where logging is not set up).

Limits:
- the PTX subset of parser.py; opcodes outside it fail at decode time, naming the line;
- control flow: lockstep while every thread of the CTA takes the same path; a branch or exit
  whose guard differs between threads parts them into groups, each with its own program
  counter, run in turn and merged where they meet again (sim/runner.py). Instructions that
  whole warps must run together (ldmatrix, mma, setmaxnreg) refuse part of a warp; an aligned
  barrier (bar.sync, bar.red) reached by part of a warp while the rest left or waits at another
  barrier instruction is an error; a wgmma reached by part of a warpgroup waits for the rest of
  it (an error if they left). Guarded ordinary instructions are fine. 1-D thread blocks;
- state spaces .param, .global, .shared only (no generic, .local, .const, textures);
  persistent kernels see EMULATOR_SM_COUNT multiprocessors (a few CTAs, each walking
  several tiles);
  Hopper's wgmma (run at issue; wgmma.py), TMA (tma.py), mbarriers (mbarrier.py) and clusters
  (cluster.py); no warp-level sync (bar.warp.sync), so any exchange through shared memory
  needs a bar.sync or an mbarrier;
- cp.async groups are modelled per thread (each thread's commits and waits count its own
  copies, guarded or in warps that parted); the source is read when the copy is issued, the
  destination written when its group retires;
- races are tracked in shared memory per byte (last writer, last reader or "several",
  pending copies); in global memory between CTAs (ordering.py: CTAs run one after another, so
  what the GPU would not order is found from the record of who wrote each byte, not from the
  values read), and between the threads of one CTA by the rules of shared memory; registers
  and shared memory start as zeros
  (no uninitialised-read check);
- mma products are exact and summed in float64 with one rounding to the accumulator
  type; the hardware's f32 accumulation differs in the last bits for general data (it is
  bit-exact for the integer-valued probes of tests/test_sim_h200.py); fma.rn.f32 rounds
  through float64 (a double rounding is possible in rare ties); .approx functions are
  computed to numpy accuracy;
- speed: about 10^5 CTA-wide instructions per second (a 128x128x64 GEMM in well under a
  second), meant for tests and small problems.
"""
from .errors import PtxSyntaxError, SimError
from .memory import GlobalMemory
from .parser import parse_ptx
from .runner import EMULATOR_SM_COUNT, LaunchStats, global_memory, launch, run_kernel
from .arrays import run_arrays

__all__ = ["SimError", "PtxSyntaxError", "GlobalMemory", "parse_ptx", "launch", "run_kernel", "run_arrays",
           "global_memory", "LaunchStats", "EMULATOR_SM_COUNT"]
