"""tilegen.cache on the CPU: keys, the PTX entries behind tilegen.compile(GemmSpec), damaged
entries, concurrent writers, TILEGEN_CACHE=0, permissions and the speed of a cached compile."""
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
from tilegen import cache
from tilegen import compiler
from tilegen.errors import SpecError, TilegenError

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
        return tilegen.compile(spec)


def entry_path(spec, root) -> Path:
    return root / "ptx" / (cache.spec_key(spec) + ".ptx.entry")


def count_traces(monkeypatch):
    calls = []
    real = compiler.trace

    def spy(*a, **k):
        calls.append(a[0])
        return real(*a, **k)

    monkeypatch.setattr(compiler, "trace", spy)
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
    assert cache.cache_dir() == tmp_path / "home" / ".cache" / "tilegen"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_dir() == tmp_path / "xdg" / "tilegen"
    monkeypatch.setenv("TILEGEN_CACHE_DIR", str(tmp_path / "mine"))
    assert cache.cache_dir() == tmp_path / "mine"


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
    (copy / "spec.py").write_text((copy / "spec.py").read_text() + "\n# edit\n")
    after_py = cache.source_hash(copy)
    assert after_py not in (base, after_lark)
    (copy / "spec.py").rename(copy / "spec2.py")  # same bytes, other name
    assert cache.source_hash(copy) != after_py


def test_source_hash_is_computed_once_per_process(monkeypatch):
    first = cache.source_hash()

    def no_walk(*a, **k):
        raise AssertionError("source tree walked again")

    monkeypatch.setattr(Path, "rglob", no_walk)
    assert cache.source_hash() == first


def test_cubin_key_changes_with_ptx_device_and_driver():
    ptx = fresh(SPEC).ptx
    k = cache.cubin_key(ptx, (9, 0), 13000)
    assert k == cache.cubin_key(ptx, [9, 0], 13000)
    others = [cache.cubin_key(ptx + "\n", (9, 0), 13000), cache.cubin_key(ptx, (8, 0), 13000),
              cache.cubin_key(ptx, (9, 0), 13010), cache.cubin_key(ptx, (10, 0), 13000)]
    assert len({k, *others}) == 5


# ---- PTX entries behind tilegen.compile ----------------------------------------------

@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.dtype}_{s.tile.m}x{s.tile.n}x{s.tile.k}_{s.target}")
def test_round_trip_rebuilds_an_identical_kernel(cdir, monkeypatch, spec):
    want = fresh(spec)
    traces = count_traces(monkeypatch)
    stored = tilegen.compile(spec)            # miss: traced and stored
    assert traces == [spec] and entry_path(spec, cdir).is_file()
    same_kernel(stored, want)
    hit = tilegen.compile(spec)               # hit: read back
    assert traces == [spec]
    assert isinstance(hit._ir, cache.CachedKernelIR)
    same_kernel(hit, want)
    payload = cache.get_ptx(spec)
    assert payload["name"] == want.name and payload["ptx"] == want.ptx


def test_a_hit_skips_tracing_passes_and_codegen(cdir, monkeypatch):
    want = tilegen.compile(SPEC)

    def boom(*a, **k):
        raise AssertionError("a cache hit must not trace, run passes or emit PTX")

    for name in ("trace", "run_passes", "emit_ptx", "print_ir", "bank_report"):
        monkeypatch.setattr(compiler, name, boom)
    same_kernel(tilegen.compile(SPEC), want)


def test_errors_are_not_masked_by_the_cache(cdir):
    tilegen.compile(SPEC)
    with pytest.raises(TilegenError, match="takes no other arguments"):
        tilegen.compile(SPEC, extra=1)
    with pytest.raises(SpecError):  # invalid specs fail before any lookup
        tilegen.compile(tilegen.GemmSpec(dtype="bf16", stages=1))
    assert cache.info()["ptx"] == 1


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
    corrupt = cache.stats["corrupt"]
    assert cache.get_ptx(SPEC) is None          # detected, never trusted
    assert cache.stats["corrupt"] == corrupt + 1
    assert not path.exists()                    # and deleted
    path.write_bytes(good[:100])                # damaged again: compile must rebuild it
    traces = count_traces(monkeypatch)
    again = tilegen.compile(SPEC)
    assert traces == [SPEC]
    same_kernel(again, want)
    assert path.read_bytes() == good            # a valid entry, the same bytes
    same_kernel(tilegen.compile(SPEC), want)
    assert traces == [SPEC]


def test_an_intact_entry_with_bad_content_is_dropped(cdir, monkeypatch):
    key = cache.spec_key(SPEC)
    # a checksummed payload that is not a kernel of this spec
    assert cache._write("ptx", key, b'{"spec": "GemmSpec(other)"}', {})
    assert cache.get_ptx(SPEC) is None and not entry_path(SPEC, cdir).exists()
    assert cache._write("ptx", key, json.dumps({"spec": repr(SPEC)}).encode(), {})
    assert cache.load_kernel(SPEC) is None and not entry_path(SPEC, cdir).exists()  # fields missing
    traces = count_traces(monkeypatch)
    tilegen.compile(SPEC)
    assert traces == [SPEC] and cache.load_kernel(SPEC) is not None


def test_grid_disagreement_is_not_stored(cdir, monkeypatch):
    monkeypatch.setattr(cache, "gemm_grid", lambda spec: (lambda sizes: (1, 1, 1)))
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        k = tilegen.compile(SPEC)
    assert not entry_path(SPEC, cdir).exists()
    assert not cache.store_kernel(SPEC, k)
    monkeypatch.undo()
    assert cache.grid_matches(SPEC, k)


# ---- concurrency -----------------------------------------------------------------------

def _writer(args):
    spec, payload, n = args
    before = cache.stats["stores"]  # a forked worker starts with the parent's counts
    for _ in range(n):
        assert cache.put_ptx(spec, payload)
    return cache.stats["stores"] - before


def _reader(args):
    spec, payload, seconds = args
    hits, corrupt = 0, cache.stats["corrupt"]
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        got = cache.get_ptx(spec)
        if got is not None:
            assert got == dict(payload, spec=repr(spec))
            hits += 1
    return hits, cache.stats["corrupt"] - corrupt


def _compile(spec):
    return tilegen.compile(spec).ptx


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
    assert cache.get_ptx(SPEC) == dict(payload, spec=repr(SPEC))
    info = cache.info()
    assert info["ptx"] == 1 and info["temp_files"] == 0


def test_concurrent_compiles_agree(cdir):
    want = fresh(SPEC).ptx
    with _pool(4) as pool:
        results = pool.map(_compile, [SPEC] * 4)
    assert results == [want] * 4
    assert cache.load_kernel(SPEC).ptx == want
    assert cache.info()["temp_files"] == 0


# ---- switches, permissions, housekeeping ---------------------------------------------

def test_tilegen_cache_0_bypasses_the_cache(cdir, monkeypatch):
    monkeypatch.setenv("TILEGEN_CACHE", "0")
    traces = count_traces(monkeypatch)
    tilegen.compile(SPEC)
    tilegen.compile(SPEC)
    assert traces == [SPEC, SPEC] and not cdir.exists()
    assert not cache.put_ptx(SPEC, {"name": "x"}) and not cdir.exists()
    # an entry written while the cache was on is not read while it is off
    monkeypatch.setenv("TILEGEN_CACHE", "1")
    tilegen.compile(SPEC)
    assert entry_path(SPEC, cdir).is_file() and traces == [SPEC] * 3
    for off in ("0", "false", "off", "no"):
        monkeypatch.setenv("TILEGEN_CACHE", off)
        assert not cache.enabled() and cache.get_ptx(SPEC) is None and cache.load_kernel(SPEC) is None
    tilegen.compile(SPEC)
    assert traces == [SPEC] * 4


def test_cache_dir_is_user_only(tmp_path, monkeypatch):
    root = tmp_path / "a" / "b" / "cache"
    monkeypatch.setenv("TILEGEN_CACHE_DIR", str(root))
    monkeypatch.delenv("TILEGEN_CACHE", raising=False)
    old = os.umask(0)  # the widest umask: the modes come from tilegen, not from the umask
    try:
        tilegen.compile(SPEC)
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
    monkeypatch.setattr(cache, "_warned", set())
    with pytest.warns(RuntimeWarning, match="writable by group or others"):
        k = tilegen.compile(SPEC)
    assert k.ptx and list(root.iterdir()) == []
    os.chmod(root, 0o700)
    tilegen.compile(SPEC)
    assert entry_path(SPEC, root).is_file()


def test_an_unusable_cache_dir_only_costs_speed(tmp_path, monkeypatch):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    monkeypatch.setenv("TILEGEN_CACHE_DIR", str(not_a_dir))
    monkeypatch.delenv("TILEGEN_CACHE", raising=False)
    monkeypatch.setattr(cache, "_warned", set())
    with pytest.warns(RuntimeWarning, match="not a directory"):
        k = tilegen.compile(SPEC)
    same_kernel(k, fresh(SPEC))
    monkeypatch.setenv("TILEGEN_CACHE_DIR", str(not_a_dir / "below"))  # a parent is a file
    with pytest.warns(RuntimeWarning, match="cannot be used"):
        same_kernel(tilegen.compile(SPEC), k)


def test_info_and_clear(cdir):
    assert cache.info()["entries"] == 0 and cache.clear() == 0
    tilegen.compile(SPEC)
    tilegen.compile(tilegen.GemmSpec(dtype="f16"))
    assert cache.put_cubin("// ptx", (9, 0), 13000, b"\x7fELF" + b"\0" * 60, "ptxas info : Used 4 registers")
    (cdir / "ptx" / ".tmp-leftover.part").write_bytes(b"half")  # a crashed writer's temp file
    (cdir / "ptx" / "README").write_text("not ours")
    info = cache.info()
    assert (info["entries"], info["ptx"], info["cubin"], info["temp_files"]) == (3, 2, 1, 1)
    assert info["bytes"] == sum(p.stat().st_size for p in cdir.rglob("*.entry"))
    assert info["dir"] == str(cdir) and info["enabled"]
    assert cache.get_cubin("// ptx", (9, 0), 13000) == b"\x7fELF" + b"\0" * 60
    assert cache.clear() == 4
    assert cache.info()["entries"] == 0 and (cdir / "ptx" / "README").exists()


def test_cached_compile_is_fast(cdir):
    spec = tilegen.GemmSpec(dtype="f16")  # the default kernel: ~150 KB of PTX
    t0 = time.perf_counter()
    tilegen.compile(spec)
    cold = (time.perf_counter() - t0) * 1e3
    times = []
    for _ in range(20):
        t0 = time.perf_counter()
        k = tilegen.compile(spec)
        times.append((time.perf_counter() - t0) * 1e3)
    assert isinstance(k._ir, cache.CachedKernelIR)
    med = statistics.median(times)
    print(f"\ncompile {spec.dtype} default: traced {cold:.1f} ms, cached median {med:.2f} ms "
          f"(min {min(times):.2f}, max {max(times):.2f})")
    assert med < 50, f"a cached compile took {med:.1f} ms"
