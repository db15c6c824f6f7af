"""Whether a CUDA graph's launch is a cheaper floor than a kernel's: CPU microseconds per call of
cuGraphLaunch (through ctypes) of a graph holding one empty kernel, beside cuLaunchKernelEx of the
same kernel (tilegen's route, tools/h200_launch_floor.py) and torch's CUDAGraph.replay(). If the graph
launch were well under the kernel launch, a remembered launch (the same arguments again) could replay
a graph instead. Writes DIR/graph_floor.json.

    python3 tools/h200_graph_floor.py DIR [calls] [reps]
"""
import ctypes
import json
import os
import sys

import torch

from tilegen import runtime
from tilegen.bench.host import per_call_us


def main():
    out_dir = sys.argv[1]
    calls = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    reps = int(sys.argv[3]) if len(sys.argv) > 3 else 15
    torch.cuda.init()
    torch.empty(1, device="cuda")
    runtime.ensure_context(0)
    ptx = "\n".join([".version 8.0", ".target sm_90", ".address_size 64", "",
                     ".visible .entry k0()", "{", "    ret;", "}", ""])
    launcher = runtime.Launcher(runtime.load_module(ptx, "k0"), (), 32, 0)
    side = torch.cuda.Stream()
    stream = side.cuda_stream
    grid = (1, 1, 1)
    with torch.cuda.stream(side):
        launcher(grid, (), stream)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):
            launcher(grid, (), stream)
    torch.cuda.synchronize()
    lib = ctypes.CDLL("libcuda.so.1")
    glaunch = lib.cuGraphLaunch
    glaunch.argtypes, glaunch.restype = [ctypes.c_void_p, ctypes.c_void_p], ctypes.c_int
    exec_handle = ctypes.c_void_p(int(graph.raw_cuda_graph_exec()))
    s = ctypes.c_void_p(stream)
    err = glaunch(exec_handle, s)
    if err:
        raise SystemExit(f"cuGraphLaunch: CUDA error {err}")
    fns = {"cuLaunchKernelEx (Launcher)": lambda: launcher(grid, (), stream),
           "driver call alone": launcher.relaunch,
           "cuGraphLaunch (ctypes)": lambda: glaunch(exec_handle, s),
           "torch CUDAGraph.replay": graph.replay}
    timed = per_call_us(fns, torch.cuda.synchronize, calls, reps)
    res = {"gpu": torch.cuda.get_device_name(), "calls": calls, "reps": reps,
           "host_us": {k: {m: round(v, 3) for m, v in t.items()} for k, t in timed.items()}}
    with open(os.path.join(out_dir, "graph_floor.json"), "w") as fh:
        json.dump(res, fh, indent=1)
    print(f"{'way':<30} {'us/call':>8} {'min':>8} {'max':>8}")
    for k, t in timed.items():
        print(f"{k:<30} {t['us']:8.2f} {t['us_min']:8.2f} {t['us_max']:8.2f}")


if __name__ == "__main__":
    main()
