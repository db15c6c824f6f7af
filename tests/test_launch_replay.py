"""The "graph" launch route's bookkeeping (runtime/launch.py Launcher, runtime/replay.py Replay),
with the driver replaced by a fake that records what each call would have launched: which
launches go to cuLaunchKernelEx, which are captured into a graph, which replay the graph, on
which stream and with which values. What the driver then does is the GPU tests' business."""
import gc
import struct

import pytest

from tilegen.runtime import launch, replay

USER_STREAM = 0x51
PRIVATE_STREAM = 0x77
CONFIG = struct.Struct("<7I4xQ")   # CUlaunchConfig: grid, block, shared bytes, (pad), stream


class _Function:
    handle = 0x1234
    entry = "k"


class _Driver:
    """cuLaunchKernelEx, cuGraphLaunch and the graph calls a Replay makes, recorded."""

    def __init__(self, launcher_of):
        self.launcher_of = launcher_of   # () -> the Launcher whose buffer a launch reads
        self.log = []                    # ("launch" | "capture" | "graph", grid, stream, first value)
        self.capturing_streams = set()   # streams said to be capturing a graph of their own
        self.instantiate_error = 0
        self.destroyed = []
        self.executables = 0

    # cuLaunchKernelEx(config, function, params, extra): reads the packed buffer as the driver does
    def launch_ex(self, *args):
        L = self.launcher_of()
        grid_stream = CONFIG.unpack_from(L._storage, L.buffer.config_offset)
        value = struct.unpack_from("<Q", L._storage, 0)[0]
        stream = grid_stream[7]
        self.log.append(("capture" if stream == PRIVATE_STREAM else "launch", grid_stream[:3], stream, value))
        return 0

    # cuGraphLaunch and cuStreamIsCapturing as the Replay calls them: ready ctypes values
    def graph_launch(self, executable, stream):
        self.log.append(("graph", executable.value, stream.value, None))
        return 0

    def is_capturing(self, stream, status_ref):
        status_ref._obj.value = int((stream.value or 0) in self.capturing_streams)
        return 0

    # the cuda.bindings calls of Replay._build
    class CUstreamCaptureMode(int):
        pass

    def cuStreamCreate(self, flags):
        return 0, PRIVATE_STREAM

    def cuCtxGetCurrent(self):
        return 0, 0xC0

    def cuStreamBeginCapture(self, stream, mode):
        assert stream == PRIVATE_STREAM and int(mode) == 1   # thread-local: other threads' captures untouched
        return (0,)

    def cuStreamEndCapture(self, stream):
        return 0, "graph"

    def cuGraphInstantiate(self, graph, flags):
        self.executables += 1
        made = _Executable(1000 + self.executables)
        made.driver = self
        return self.instantiate_error, made

    def cuGraphDestroy(self, graph):
        return (0,)

    def cuGraphExecDestroy(self, executable):
        # recorded by the fake that made it (an earlier test's executable may be collected late)
        executable.driver.destroyed.append(int(executable))
        return (0,)


class _Executable(int):
    """A made-up executable handle that knows the fake driver that made it."""


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setenv("TILEGEN_LAUNCH", "graph")
    box = {}
    drv = _Driver(lambda: box["launcher"])
    monkeypatch.setitem(launch._FUNCTIONS, "ex", drv.launch_ex)
    monkeypatch.setattr(replay, "_CALLS", [(drv.graph_launch, drv.is_capturing)])
    monkeypatch.setattr(replay, "_PRIVATE", {})
    monkeypatch.setattr(replay._drv, "bindings", lambda: drv)
    L = launch.Launcher(_Function(), ("u64", "u32"), 128, 0)
    box["launcher"] = L
    yield L, drv
    # the test's executables freed while the fake still stands in for the driver (a later test's
    # fake must not record them, nor the real driver see its made-up handles)
    box.clear()
    del L
    gc.collect()


def _kinds(drv):
    return [entry[0] for entry in drv.log]


def test_a_repeated_launch_is_replayed_as_a_graph(fake):
    L, drv = fake
    assert L.route == "graph"
    values, grid = (7, 3), (4, 2, 1)
    for _ in range(replay.REPEATS):
        L(grid, values, USER_STREAM)
    assert _kinds(drv) == ["launch"] * replay.REPEATS
    L(grid, values, USER_STREAM)        # captured (not run), then the executable launched
    L(grid, values, USER_STREAM)
    assert _kinds(drv)[replay.REPEATS:] == ["capture", "graph", "graph"]
    capture = drv.log[replay.REPEATS]
    assert capture[1] == grid and capture[3] == 7
    assert {entry[2] for entry in drv.log if entry[0] == "graph"} == {USER_STREAM}
    # the buffer holds the caller's stream again after the capture
    assert CONFIG.unpack_from(L._storage, L.buffer.config_offset)[7] == USER_STREAM
    assert all(entry[2] == USER_STREAM for entry in drv.log if entry[0] == "launch")


def test_each_argument_set_replays_its_own_graph(fake):
    """One kernel called for each of a model's layers, each with its own arguments: every set
    replays once seen REPEATS times, each its own executable; another stream is another key."""
    L, drv = fake
    grid, sets = (4, 2, 1), [(7, 3), (8, 3), (9, 1)]
    for _ in range(replay.REPEATS + 1):
        for values in sets:
            L(grid, values, USER_STREAM)
    assert _kinds(drv).count("capture") == 3
    drv.log.clear()
    for values in sets * 2:
        L(grid, values, USER_STREAM)
    assert _kinds(drv) == ["graph"] * 6
    assert [entry[1] for entry in drv.log] == [1001, 1002, 1003] * 2   # each set its own executable
    L(grid, (8, 3), USER_STREAM + 1)    # another stream: a new key, launched plainly there
    assert drv.log[-1][:3] == ("launch", grid, USER_STREAM + 1)
    assert drv.destroyed == []


def test_the_least_recent_argument_set_past_capacity_is_freed(fake, monkeypatch):
    L, drv = fake
    monkeypatch.setattr(replay, "CAPACITY", 2)
    grid = (1, 1, 1)
    for values in [(1, 0)] * (replay.REPEATS + 1) + [(2, 0)] * (replay.REPEATS + 1):
        L(grid, values, USER_STREAM)
    L(grid, (1, 0), USER_STREAM)        # (1, 0) the most recent again: (2, 0) goes first
    assert drv.log[-1][:2] == ("graph", 1001)
    L(grid, (3, 0), USER_STREAM)
    assert drv.destroyed == [1002] and len(L._replay.graphs) == 2
    L(grid, (2, 0), USER_STREAM)        # forgotten: counted from the start again
    assert drv.log[-1][0] == "launch" and drv.destroyed == [1002, 1001]


def test_a_capturing_stream_gets_the_plain_launch(fake):
    L, drv = fake
    values, grid = (7, 3), (4, 2, 1)
    for _ in range(replay.REPEATS + 1):
        L(grid, values, USER_STREAM)
    assert drv.log[-1][0] == "graph"
    drv.capturing_streams.add(USER_STREAM)   # the caller's stream now captures a graph of its own
    L(grid, values, USER_STREAM)
    assert drv.log[-1][:3] == ("launch", grid, USER_STREAM)
    drv.capturing_streams.clear()
    L(grid, values, USER_STREAM)
    assert drv.log[-1][0] == "graph"
    # nor is a graph built while the stream captures
    L(grid, (9, 9), USER_STREAM)
    drv.capturing_streams.add(USER_STREAM)
    for _ in range(replay.REPEATS + 3):
        L(grid, (9, 9), USER_STREAM)
    assert set(_kinds(drv)[-(replay.REPEATS + 3):]) == {"launch"}


def test_a_graph_that_cannot_be_built_leaves_plain_launches(fake):
    """Each failed build leaves its launch plain (the capture was not run: the launch is made
    after it); after MAX_FAILURES no capture is tried again, for any arguments."""
    L, drv = fake
    drv.instantiate_error = 1
    for _ in range(replay.REPEATS + replay.MAX_FAILURES + 3):
        L((1, 1, 1), (5, 5), USER_STREAM)
    kinds = _kinds(drv)
    assert kinds.count("capture") == replay.MAX_FAILURES and "graph" not in kinds
    assert kinds[-1] == "launch" and drv.log[-1][2] == USER_STREAM
    assert kinds.count("launch") == replay.REPEATS + replay.MAX_FAILURES + 3   # every call ran once
    for _ in range(replay.REPEATS + 2):
        L((1, 1, 1), (6, 5), USER_STREAM)
    assert _kinds(drv).count("capture") == replay.MAX_FAILURES


def test_a_build_that_failed_once_is_tried_again(fake):
    L, drv = fake
    drv.instantiate_error = 1
    for _ in range(replay.REPEATS + 1):
        L((1, 1, 1), (5, 5), USER_STREAM)
    drv.instantiate_error = 0
    L((1, 1, 1), (5, 5), USER_STREAM)
    assert _kinds(drv)[-3:] == ["launch", "capture", "graph"] and not L._replay.broken


def test_no_executable_is_freed_while_the_callers_stream_captures(fake, monkeypatch):
    """A full table makes room for new arguments by freeing the least recent executable, but not
    inside the caller's own capture (the new arguments launch plainly there)."""
    L, drv = fake
    monkeypatch.setattr(replay, "CAPACITY", 2)
    for values in [(1, 0)] * (replay.REPEATS + 1) + [(2, 0)] * (replay.REPEATS + 1):
        L((1, 1, 1), values, USER_STREAM)
    drv.capturing_streams.add(USER_STREAM)
    L((1, 1, 1), (3, 0), USER_STREAM)
    assert drv.log[-1][:3] == ("launch", (1, 1, 1), USER_STREAM) and drv.destroyed == []
    assert len(L._replay.graphs) == 2
    drv.capturing_streams.clear()
    L((1, 1, 1), (3, 0), USER_STREAM)
    assert drv.destroyed == [1001]


def test_unloading_modules_frees_every_executable(fake, monkeypatch):
    from tilegen.runtime import module

    L, drv = fake
    for _ in range(replay.REPEATS + 1):
        L((1, 1, 1), (4, 0), USER_STREAM)
    monkeypatch.setattr(module, "_modules", {})
    monkeypatch.setattr(module, "_functions", {})
    monkeypatch.setattr(module, "_generation", [0])
    module.clear_module_cache()
    assert drv.destroyed == [1001] and not L._replay.graphs


def test_the_default_route_replays(monkeypatch):
    monkeypatch.delenv("TILEGEN_LAUNCH", raising=False)
    assert launch.launch_route() == "graph"
    monkeypatch.setenv("TILEGEN_LAUNCH", "no such route")
    assert launch.launch_route() == "graph"


def test_the_ex_route_never_replays(monkeypatch):
    monkeypatch.setenv("TILEGEN_LAUNCH", "ex")
    log = []
    monkeypatch.setitem(launch._FUNCTIONS, "ex", lambda *a: log.append("ex") or 0)
    L = launch.Launcher(_Function(), ("u64",), 32, 0)
    assert L.route == "ex" and L._replay is None
    for _ in range(replay.REPEATS + 5):
        L((1, 1, 1), (1,), USER_STREAM)
    assert log == ["ex"] * (replay.REPEATS + 5)


def test_equal_values_in_new_objects_replay_but_a_float_of_another_sign_does_not(fake, monkeypatch):
    """kernel.launch builds its values anew each call: the same bytes count as the same launch;
    -0.0 is not 0.0 (an alpha of -0.0 signs C's zeros), so it packs other bytes and launches plainly."""
    _, drv = fake
    L = launch.Launcher(_Function(), ("u64", "f32"), 128, 0)
    monkeypatch.setattr(drv, "launcher_of", lambda: L)
    for _ in range(replay.REPEATS + 3):
        L(tuple([(4, 2, 1)][0]), tuple([7, 0.0]), USER_STREAM)   # (new tuples each call)
    assert _kinds(drv)[-2:] == ["graph", "graph"]
    L((4, 2, 1), (7, -0.0), USER_STREAM)
    assert drv.log[-1][0] == "launch"
    L((4, 2, 1), (7, 0.0), USER_STREAM)
    assert drv.log[-1][:2] == ("graph", 1001)


def test_launchers_of_two_threads_capture_one_at_a_time(fake, monkeypatch):
    """Captures share the device's private stream: two threads' Launchers reaching their third
    launch together must not begin two captures on it (the second would fail and leave its
    Launcher on plain launches for good)."""
    import threading
    import time

    _, drv = fake
    launchers = [launch.Launcher(_Function(), ("u64", "u32"), 128, 0) for _ in range(2)]
    by_config = {L.buffer.config_address: L for L in launchers}
    open_captures = []

    def launch_ex(config, *rest):
        L = by_config[config.value]
        if CONFIG.unpack_from(L._storage, L.buffer.config_offset)[7] == PRIVATE_STREAM:
            time.sleep(0.05)   # (a capture held open while the other thread arrives)
        return 0

    def begin(stream, mode):
        assert not open_captures, "a second capture began on the private stream"
        open_captures.append(stream)
        return (0,)

    def end(stream):
        open_captures.clear()
        return 0, "graph"

    monkeypatch.setitem(launch._FUNCTIONS, "ex", launch_ex)
    for L in launchers:
        L._fn = launch_ex
    monkeypatch.setattr(drv, "cuStreamBeginCapture", begin)
    monkeypatch.setattr(drv, "cuStreamEndCapture", end)
    start = threading.Barrier(2)
    errors = []

    def work(L, value):
        try:
            for _ in range(replay.REPEATS):
                L((1, 1, 1), (value, 1), USER_STREAM)
            start.wait()
            L((1, 1, 1), (value, 1), USER_STREAM)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(L, i)) for i, L in enumerate(launchers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert all(not L._replay.broken and L._replay.current.executable is not None for L in launchers)


def test_a_retried_launch_leaves_no_stale_record_of_what_the_buffer_holds(fake, monkeypatch):
    """A launch refused for the thread's context is packed again and retried; meanwhile another
    thread launched its own remembered values. The retry's bytes are what the buffer holds after,
    so the other thread's next launch of its very tuple must pack it again, not launch the
    retried call's arguments on the retried call's stream."""
    L, drv = fake
    fail = [0]

    def launch_ex(*args):
        if fail[0]:
            fail[0] -= 1
            return 201   # CUDA_ERROR_INVALID_CONTEXT
        return drv.launch_ex(*args)

    monkeypatch.setitem(launch._FUNCTIONS, "ex", launch_ex)
    L._fn = launch_ex
    grid, theirs = (1, 1, 1), (0xB, 1)
    L(grid, theirs, USER_STREAM)
    # thread A's first launch fails; before its retry takes the lock, thread B launches again
    monkeypatch.setattr(launch._drv, "forget_current", lambda: None)
    monkeypatch.setattr(launch._drv, "ensure_context", lambda device=0: L(grid, theirs, USER_STREAM))
    fail[0] = 1
    L(grid, (0xA, 1), USER_STREAM + 1)
    assert drv.log[-1][2:] == (USER_STREAM + 1, 0xA)
    L(grid, theirs, USER_STREAM)        # thread B, the same tuple object again
    assert drv.log[-1][2:] == (USER_STREAM, 0xB), drv.log[-1]
