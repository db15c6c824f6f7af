"""The disk cache on the CPU: keys, the PTX entries behind tilegen.compile(GemmSpec) (with this
process's memo forgotten, so each compile goes to disk), damaged entries, concurrent writers,
TILEGEN_CACHE=0, permissions and the speed of a cached compile."""
import json
import multiprocessing
import os
import shutil
import stat
import statistics
import time
import warnings
from pathlib import Path

import pytest

import tilegen
from tilegen import compiler, store
from tilegen.compiler import cache
from tilegen.errors import SpecError, TilegenError
from tilegen.gemm import kernel as gemm_kernel
from tilegen.runtime import cubins

SPEC = tilegen.GemmSpec(dtype="bf16", tile=(64, 64, 32), warps=(2, 2), stages=2)
SPECS = [
    SPEC,
    tilegen.GemmSpec(dtype="f16"),
    tilegen.GemmSpec(dtype="tf32", a_layout="col", b_layout="col", tile=(64, 128, 32), stages=3),
    tilegen.GemmSpec(dtype="f16", out_dtype="f16", warps=(4, 1), tile=(128, 64, 32), target="sm_90"),
]
SIZES = [dict(M=m, N=n, K=k) for m, n, k in
         [(1, 1, 1), (64, 64, 32), (65, 63, 7), (100, 77, 33), (1000, 1000, 1000), (4096, 128, 64),
          (129, 255, 70), (0, 16, 16), (8192, 8191, 1)]]


def fresh(spec):
    """A Kernel compiled from scratch, the cache off."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TILEGEN_CACHE", "0")
        compiler.forget()
        kernel = tilegen.compile(spec)
        compiler.forget()
        return kernel


def recompile(spec):
    """tilegen.compile in a process that has not compiled `spec` yet: the disk cache or a trace."""
    compiler.forget()
    return tilegen.compile(spec)


def entry_path(spec, root) -> Path:
    return root / "ptx" / (cache.spec_key(spec) + ".ptx.entry")


def payload_of(spec):
    """The stored payload of a spec's entry, or None."""
    entry = store.read("ptx", cache.spec_key(spec))
    return None if entry is None else json.loads(entry[0])


def count_traces(monkeypatch):
    calls = []
    real = gemm_kernel.trace_gemm

    def spy(*a, **k):
        calls.append(a[0])
        return real(*a, **k)

    monkeypatch.setattr(gemm_kernel, "trace_gemm", spy)
    return calls


def same_kernel(a, b):
    assert a.ptx == b.ptx
    assert a.ir == b.ir
    assert a.params == b.params
    assert a.bank_report() == b.bank_report()
    assert a.bank_conflicts == b.bank_conflicts
    assert (a.name, a.threads, a.smem_bytes, a.target, a.spec) == (b.name, b.threads, b.smem_bytes, b.target, b.spec)
    assert repr(a) == repr(b)
    for s in SIZES:
        assert a.grid(s) == b.grid(s), s


# ---- where -----------------------------------------------------------------------------

def test_cache_dir_resolution(monkeypatch, tmp_path):
    monkeypatch.delenv("TILEGEN_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert store.cache_dir() == tmp_path / "home" / ".cache" / "tilegen"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert store.cache_dir() == tmp_path / "xdg" / "tilegen"
    monkeypatch.setenv("TILEGEN_CACHE_DIR", str(tmp_path / "mine"))
    assert store.cache_dir() == tmp_path / "mine"


# ---- keys ------------------------------------------------------------------------------

def test_spec_key_changes_with_the_spec():
    variants = [SPEC, tilegen.GemmSpec(dtype="f16", tile=(64, 64, 32), stages=2),
                tilegen.GemmSpec(dtype="bf16", tile=(64, 64, 32), stages=3),
                tilegen.GemmSpec(dtype="bf16", tile=(64, 64, 64), stages=2),
                tilegen.GemmSpec(dtype="bf16", tile=(64, 64, 32), stages=2, group_m=4),
                tilegen.GemmSpec(dtype="bf16", tile=(64, 64, 32), stages=2, b_layout="col"),
                tilegen.GemmSpec(dtype="bf16", tile=(64, 64, 32), stages=2, out_dtype="bf16"),
                tilegen.GemmSpec(dtype="bf16", tile=(64, 64, 32), stages=2, swizzle="pad"),
                tilegen.GemmSpec(dtype="bf16", tile=(64, 64, 32), stages=2, warps=(4, 1))]
    keys = [cache.spec_key(s) for s in variants]
    assert len(set(keys)) == len(keys)
    # Equal specs (defaults spelled out or not) share a key.
    assert cache.spec_key(SPEC) == cache.spec_key(
        tilegen.GemmSpec(dtype="bf16", tile=(64, 64, 32), warps=(2, 2), stages=2, b_layout="row", target="sm_80"))
    assert len(cache.spec_key(SPEC)) == 64


def test_spec_key_changes_with_the_target():
    keys = {cache.spec_key(tilegen.GemmSpec(dtype="f16", target=t)) for t in ("sm_80", "sm_86", "sm_89", "sm_90", "sm_90a")}
    assert len(keys) == 5


def test_spec_key_changes_with_the_source_hash(monkeypatch):
    before = cache.spec_key(SPEC)
    monkeypatch.setattr(cache, "_source_hash", "0" * 64)
    a = cache.spec_key(SPEC)
    monkeypatch.setattr(cache, "_source_hash", "1" * 64)
    b = cache.spec_key(SPEC)
    assert len({before, a, b}) == 3


def test_source_hash_covers_py_and_lark_files(tmp_path):
    pkg = Path(tilegen.__file__).parent
    copy = tmp_path / "tilegen"
    shutil.copytree(pkg, copy, ignore=shutil.ignore_patterns("__pycache__"))
    base = cache.source_hash(copy)
    assert base == cache.source_hash(pkg)  # the copy hashes like the package itself
    (copy / "notes.txt").write_text("not source")
    assert cache.source_hash(copy) == base
    lark = next(copy.rglob("*.lark"))
    lark.write_text(lark.read_text() + "\n// edit\n")
    after_lark = cache.source_hash(copy)
    assert after_lark != base
    spec_py = copy / "gemm" / "spec.py"
    spec_py.write_text(spec_py.read_text() + "\n# edit\n")
    after_py = cache.source_hash(copy)
    assert after_py not in (base, after_lark)
    spec_py.rename(copy / "gemm" / "spec2.py")  # same bytes, other name
    assert cache.source_hash(copy) != after_py


def test_source_hash_is_computed_once_per_process(monkeypatch):
    first = cache.source_hash()

    def no_walk(*a, **k):
        raise AssertionError("source tree walked again")

    monkeypatch.setattr(Path, "rglob", no_walk)
    assert cache.source_hash() == first


def test_cubin_key_changes_with_ptx_device_and_driver():
    ptx = fresh(SPEC).ptx
    k = cubins.cubin_key(ptx, (9, 0), 13000)
    assert k == cubins.cubin_key(ptx, [9, 0], 13000)
    others = [cubins.cubin_key(ptx + "\n", (9, 0), 13000), cubins.cubin_key(ptx, (8, 0), 13000),
              cubins.cubin_key(ptx, (9, 0), 13010), cubins.cubin_key(ptx, (10, 0), 13000)]
    assert len({k, *others}) == 5


# ---- PTX entries behind tilegen.compile ----------------------------------------------

@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.dtype}_{s.tile.m}x{s.tile.n}x{s.tile.k}_{s.target}")
def test_round_trip_rebuilds_an_identical_kernel(cdir, monkeypatch, spec):
    want = fresh(spec)
    traces = count_traces(monkeypatch)
    stored = recompile(spec)                  # miss: traced and stored
    assert traces == [spec] and entry_path(spec, cdir).is_file()
    same_kernel(stored, want)
    assert tilegen.compile(spec) is stored    # this process remembers it
    hit = recompile(spec)                     # a new process: read back
    assert traces == [spec] and hit is not stored
    same_kernel(hit, want)
    assert hit.instructions == want.instructions
    payload = payload_of(spec)
    assert payload["name"] == want.name and payload["ptx"] == want.ptx


def test_a_hit_skips_tracing_passes_and_codegen(cdir, monkeypatch):
    want = tilegen.compile(SPEC)

    def boom(*a, **k):
        raise AssertionError("a cache hit must not trace, run passes or emit PTX")

    for name in ("build", "run_passes", "emit_ptx", "print_ir", "bank_report"):
        monkeypatch.setattr(compiler, name, boom)
    monkeypatch.setattr(gemm_kernel, "trace_gemm", boom)
    same_kernel(recompile(SPEC), want)


def test_errors_are_not_masked_by_the_cache(cdir):
    tilegen.compile(SPEC)
    with pytest.raises(TilegenError, match="takes no other arguments"):
        tilegen.compile(SPEC, extra=1)
    with pytest.raises(SpecError):  # invalid specs fail before any lookup
        tilegen.compile(tilegen.GemmSpec(dtype="bf16", stages=1))
    assert store.info()["ptx"] == 1


def _damage(path: Path, how: str):
    data = path.read_bytes()
    nl = data.index(b"\n")
    if how == "flip_payload":
        i = nl + 1 + (len(data) - nl - 1) // 2
        data = data[:i] + bytes([data[i] ^ 0x01]) + data[i + 1:]
    elif how == "flip_header":
        i = data.index(b'"sha256":"') + 12
        data = data[:i] + bytes([data[i] ^ 0x01]) + data[i + 1:]
    elif how == "truncate":
        data = data[:len(data) * 2 // 3]
    elif how == "truncate_header":
        data = data[:nl // 2]
    elif how == "append":
        data = data + b"x"
    elif how == "empty":
        data = b""
    elif how == "garbage":
        data = os.urandom(4096)
    path.write_bytes(data)


@pytest.mark.parametrize("how", ["flip_payload", "flip_header", "truncate", "truncate_header", "append",
                                 "empty", "garbage"])
def test_a_damaged_entry_is_deleted_and_rebuilt(cdir, monkeypatch, how):
    want = tilegen.compile(SPEC)
    path = entry_path(SPEC, cdir)
    good = path.read_bytes()
    _damage(path, how)
    assert path.read_bytes() != good
    corrupt = store.stats["corrupt"]
    assert cache.load_kernel(SPEC) is None      # detected, never trusted
    assert store.stats["corrupt"] == corrupt + 1
    assert not path.exists()                    # and deleted
    path.write_bytes(good[:100])                # damaged again: compile must rebuild it
    traces = count_traces(monkeypatch)
    again = recompile(SPEC)
    assert traces == [SPEC]
    same_kernel(again, want)
    assert path.read_bytes() == good            # a valid entry, the same bytes
    same_kernel(recompile(SPEC), want)
    assert traces == [SPEC]


def test_an_intact_entry_with_bad_content_is_dropped(cdir, monkeypatch):
    key = cache.spec_key(SPEC)
    good = cache.kernel_payload(fresh(SPEC))
    bad = [{"spec": "GemmSpec(other)"},                                   # not a kernel of this spec
           {"spec": repr(SPEC)},                                         # fields missing
           dict(good, spec=repr(SPEC), grid=[["size", "M"], ["bogus"], ["const", 1]]),  # not a grid
           dict(good, spec=repr(SPEC), ptx=None)]                        # not text
    for payload in bad:
        assert store.write("ptx", key, json.dumps(payload).encode(), {})  # checksummed, so it reads back
        assert cache.load_kernel(SPEC) is None and not entry_path(SPEC, cdir).exists(), payload
    traces = count_traces(monkeypatch)
    recompile(SPEC)
    assert traces == [SPEC] and cache.load_kernel(SPEC) is not None


def test_the_grid_is_stored_as_data(cdir):
    """No code and no probing: the entry holds the grid's expression, and the kernel read
    back evaluates it like the traced one (persistent kernels read the SM count too)."""
    for spec in (SPEC, tilegen.GemmSpec(dtype="f16", instruction="wgmma", persistent=True)):
        want = fresh(spec)
        recompile(spec)
        grid = payload_of(spec)["grid"]
        assert json.loads(json.dumps(grid)) == grid and grid == want.launch_grid.to_data()
        back = recompile(spec)
        for s in SIZES:
            for sms in (1, 3, 132):
                assert back.grid(s, sms) == want.grid(s, sms)
    assert grid[0][0] == "min" and grid[0][2] == ["sm_count"]


# ---- concurrency -----------------------------------------------------------------------

def _writer(args):
    spec, payload, n = args
    before = store.stats["stores"]  # a forked worker starts with the parent's counts
    data = json.dumps(dict(payload, spec=repr(spec))).encode()
    for _ in range(n):
        assert store.write("ptx", cache.spec_key(spec), data, {})
    return store.stats["stores"] - before


def _reader(args):
    spec, payload, seconds = args
    hits, corrupt = 0, store.stats["corrupt"]
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        got = payload_of(spec)
        if got is not None:
            assert got == dict(payload, spec=repr(spec))
            hits += 1
    return hits, store.stats["corrupt"] - corrupt


def _compile(spec):
    return recompile(spec).ptx


def _pool(n):
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    return multiprocessing.get_context(method).Pool(n)


def test_concurrent_writers_of_one_key_leave_a_valid_entry(cdir):
    payload = cache.kernel_payload(fresh(tilegen.GemmSpec(dtype="f16")))  # ~150 KB of PTX
    with _pool(8) as pool:
        readers = pool.map_async(_reader, [(SPEC, payload, 1.5)] * 2)
        writes = pool.map(_writer, [(SPEC, payload, 25)] * 6)
        seen = readers.get(timeout=120)
    assert writes == [25] * 6
    assert all(corrupt == 0 for _, corrupt in seen), "a reader saw a partial entry"
    assert sum(h for h, _ in seen) > 0
    assert payload_of(SPEC) == dict(payload, spec=repr(SPEC))
    info = store.info()
    assert info["ptx"] == 1 and info["temp_files"] == 0


def test_concurrent_compiles_agree(cdir):
    want = fresh(SPEC).ptx
    with _pool(4) as pool:
        results = pool.map(_compile, [SPEC] * 4)
    assert results == [want] * 4
    assert cache.load_kernel(SPEC).ptx == want
    assert store.info()["temp_files"] == 0


# ---- switches, permissions, housekeeping ---------------------------------------------

def test_tilegen_cache_0_bypasses_the_cache(cdir, monkeypatch):
    monkeypatch.setenv("TILEGEN_CACHE", "0")
    traces = count_traces(monkeypatch)
    k = recompile(SPEC)
    recompile(SPEC)
    assert traces == [SPEC, SPEC] and not cdir.exists()
    assert not cache.store_kernel(SPEC, k) and not cdir.exists()
    # an entry written while the cache was on is not read while it is off
    monkeypatch.setenv("TILEGEN_CACHE", "1")
    recompile(SPEC)
    assert entry_path(SPEC, cdir).is_file() and traces == [SPEC] * 3
    for off in ("0", "false", "off", "no"):
        monkeypatch.setenv("TILEGEN_CACHE", off)
        assert not store.enabled() and payload_of(SPEC) is None and cache.load_kernel(SPEC) is None
    recompile(SPEC)
    assert traces == [SPEC] * 4


def test_cache_dir_is_user_only(tmp_path, monkeypatch):
    root = tmp_path / "a" / "b" / "cache"
    monkeypatch.setenv("TILEGEN_CACHE_DIR", str(root))
    monkeypatch.delenv("TILEGEN_CACHE", raising=False)
    old = os.umask(0)  # the widest umask: the modes come from tilegen, not from the umask
    try:
        recompile(SPEC)
    finally:
        os.umask(old)
    mode = lambda p: stat.S_IMODE(os.stat(p).st_mode)  # noqa: E731
    assert mode(root) == 0o700
    assert mode(root / "ptx") == 0o700
    assert mode(entry_path(SPEC, root)) == 0o600


def test_a_root_others_can_write_is_not_used(tmp_path, monkeypatch):
    root = tmp_path / "shared"
    root.mkdir()
    os.chmod(root, 0o777)
    monkeypatch.setenv("TILEGEN_CACHE_DIR", str(root))
    monkeypatch.delenv("TILEGEN_CACHE", raising=False)
    monkeypatch.setattr(store, "_warned", set())
    with pytest.warns(RuntimeWarning, match="writable by group or others"):
        k = recompile(SPEC)
    assert k.ptx and list(root.iterdir()) == []
    os.chmod(root, 0o700)
    recompile(SPEC)
    assert entry_path(SPEC, root).is_file()


def test_an_unusable_cache_dir_only_costs_speed(tmp_path, monkeypatch):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    monkeypatch.setenv("TILEGEN_CACHE_DIR", str(not_a_dir))
    monkeypatch.delenv("TILEGEN_CACHE", raising=False)
    monkeypatch.setattr(store, "_warned", set())
    with pytest.warns(RuntimeWarning, match="not a directory"):
        k = recompile(SPEC)
    same_kernel(k, fresh(SPEC))
    monkeypatch.setenv("TILEGEN_CACHE_DIR", str(not_a_dir / "below"))  # a parent is a file
    with pytest.warns(RuntimeWarning, match="cannot be used"):
        same_kernel(recompile(SPEC), k)


def test_info_and_clear(cdir):
    assert store.info()["entries"] == 0 and cache.clear() == 0
    recompile(SPEC)
    recompile(tilegen.GemmSpec(dtype="f16"))
    assert cubins.put_cubin("// ptx", (9, 0), 13000, b"\x7fELF" + b"\0" * 60, "ptxas info : Used 4 registers")
    (cdir / "ptx" / ".tmp-leftover.part").write_bytes(b"half")  # a crashed writer's temp file
    (cdir / "ptx" / "README").write_text("not ours")
    info = store.info()
    assert (info["entries"], info["ptx"], info["cubin"], info["temp_files"]) == (3, 2, 1, 1)
    assert info["bytes"] == sum(p.stat().st_size for p in cdir.rglob("*.entry"))
    assert info["dir"] == str(cdir) and info["enabled"]
    assert cubins.get_cubin("// ptx", (9, 0), 13000) == b"\x7fELF" + b"\0" * 60
    assert cache.clear() == 4
    assert store.info()["entries"] == 0 and (cdir / "ptx" / "README").exists()


def test_cached_compile_is_fast(cdir):
    spec = tilegen.GemmSpec(dtype="f16")  # the default kernel: ~150 KB of PTX
    t0 = time.perf_counter()
    first = recompile(spec)
    cold = (time.perf_counter() - t0) * 1e3
    times = []
    for _ in range(20):
        compiler.forget()
        t0 = time.perf_counter()
        k = tilegen.compile(spec)
        times.append((time.perf_counter() - t0) * 1e3)
    assert k is not first and k.ptx == first.ptx
    med = statistics.median(times)
    print(f"\ncompile {spec.dtype} default: traced {cold:.1f} ms, cached median {med:.2f} ms "
          f"(min {min(times):.2f}, max {max(times):.2f})")
    assert med < 50, f"a cached compile took {med:.1f} ms"
