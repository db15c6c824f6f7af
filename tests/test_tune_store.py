"""The tuned-config cache (tilegen.tune.store) on the CPU: buckets, keys, the round trip,
damaged entries, TILEGEN_CACHE=0 and lookup without a GPU."""
import os
import stat

import pytest

import tilegen
from tilegen import GemmSpec, version
from tilegen import store as disk
from tilegen.compiler import cache
from tilegen.gemm import tuned as store
from tilegen.tune import lookup, shape_bucket

GPU, DRIVER = "NVIDIA H200", "13.0"
SPEC = GemmSpec(dtype="f16", tile=(128, 256, 64), warps=(2, 4), stages=4, swizzle="128B", group_m=16,
                frag_buffers=2, target="sm_90")


def _entry_path(fields):
    return disk.cache_dir() / store.KIND / (store.cache_key(fields) + store.SUFFIX)


def _fields(**over):
    kw = dict(dtype="f16", a_layout="row", b_layout="row", m=4096, n=4096, k=4096, out_dtype="f32",
              gpu_name=GPU, driver=DRIVER)
    kw.update(over)
    return store.key_fields(**kw)


def test_shape_bucket_rounds_up_to_powers_of_two():
    assert shape_bucket(4096, 4096, 4096) == (4096, 4096, 4096)
    assert shape_bucket(4097, 3000, 1) == (8192, 4096, 1)
    assert shape_bucket(1, 2, 3) == (1, 2, 4)
    assert shape_bucket(1000, 1024, 1025) == (1024, 1024, 2048)
    for bad in [(0, 1, 1), (1, -5, 1), (1, 1, 2.0), (True, 1, 1)]:
        with pytest.raises(ValueError):
            shape_bucket(*bad)


def test_keys_differ_by_every_field_and_agree_within_a_bucket():
    base = store.cache_key(_fields())
    assert store.cache_key(_fields(m=3000, n=2049, k=4096)) == base          # same bucket
    assert store.cache_key(_fields(driver=13000)) == base                     # cuDriverGetVersion's int
    assert store.cache_key(_fields(a_layout="r", b_layout="r")) == base
    others = [_fields(m=4097), _fields(k=2048), _fields(dtype="bf16"), _fields(dtype="tf32"),
              _fields(gpu_name="NVIDIA A100-SXM4-80GB"), _fields(driver="12.8"), _fields(b_layout="col"),
              _fields(a_layout="col"), _fields(out_dtype="f16")]
    keys = {store.cache_key(f) for f in others}
    assert base not in keys and len(keys) == len(others)
    assert _fields()["tilegen"] == tilegen.__version__


def test_tilegen_version_is_part_of_the_key(monkeypatch):
    base = store.cache_key(_fields())
    monkeypatch.setattr(version, "__version__", "99.0.0")
    assert store.cache_key(_fields()) != base


def test_round_trip(cdir):
    path = store.store(SPEC, 4096, 4096, 4096, GPU, DRIVER, source=cache.source_hash(), tflops=512.5,
                       default_tflops=420.0)
    assert path is not None and path.parent == cdir / "tune"
    assert lookup("f16", "row", "row", 4096, 4096, 4096, "f32", GPU, DRIVER) == SPEC
    assert lookup("f16", "row", "row", 2500, 4000, 3333, "f32", GPU, 13000) == SPEC
    entry = store.load("f16", "row", "row", 4096, 4096, 4096, "f32", GPU, DRIVER)
    assert entry["tflops"] == 512.5 and entry["tuned_shape"] == [4096, 4096, 4096]
    assert entry["tilegen_source"] == cache.source_hash()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".tmp-")]  # no temp files left
    # overwrite: the newest wins
    other = SPEC.replace(stages=3)
    store.store(other, 4096, 4096, 4096, GPU, DRIVER)
    assert lookup("f16", "row", "row", 4096, 4096, 4096, "f32", GPU, DRIVER) == other


def test_spec_dict_round_trip_for_every_dtype_and_layout():
    for spec in [SPEC, GemmSpec(dtype="tf32", a_layout="col", b_layout="col", out_dtype="bf16", stages=2),
                 GemmSpec(dtype="bf16", b_layout="col", swizzle="pad", group_m=1, frag_buffers=1)]:
        d = store.spec_to_dict(spec)
        assert store.spec_from_dict(d) == spec
    with pytest.raises(ValueError):
        store.spec_from_dict({"dtype": "f16"})


def test_lookup_returns_none_when_missing(cdir):
    assert lookup("f16", "row", "row", 4096, 4096, 4096, "f32", GPU, DRIVER) is None
    store.store(SPEC, 4096, 4096, 4096, GPU, DRIVER)
    assert lookup("f16", "row", "row", 4096, 4096, 8192, "f32", GPU, DRIVER) is None
    assert lookup("f16", "row", "col", 4096, 4096, 4096, "f32", GPU, DRIVER) is None
    assert lookup("f16", "row", "row", 4096, 4096, 4096, "f16", GPU, DRIVER) is None
    assert lookup("f16", "row", "row", 4096, 4096, 4096, "f32", "NVIDIA H100", DRIVER) is None
    assert lookup("f16", "row", "row", 4096, 4096, 4096, "f32", GPU, "12.4") is None
    assert lookup("f16", "diag", "row", 4096, 4096, 4096, "f32", GPU, DRIVER) is None   # bad input: None
    assert lookup("f16", "row", "row", 0, 4096, 4096, "f32", GPU, DRIVER) is None


def _damage(path, how):
    data = path.read_bytes()
    if how == "garbage":
        path.write_bytes(b"not an entry at all")
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "flipped":
        i = len(data) - 20
        path.write_bytes(data[:i] + bytes([data[i] ^ 0x01]) + data[i + 1:])


@pytest.mark.parametrize("how", ["garbage", "empty", "truncated", "flipped"])
def test_corrupt_entries_are_ignored_deleted_and_rewritten(cdir, how):
    path = store.store(SPEC, 4096, 4096, 4096, GPU, DRIVER)
    _damage(path, how)
    assert lookup("f16", "row", "row", 4096, 4096, 4096, "f32", GPU, DRIVER) is None
    assert not path.exists()
    assert store.store(SPEC, 4096, 4096, 4096, GPU, DRIVER) == path
    assert lookup("f16", "row", "row", 4096, 4096, 4096, "f32", GPU, DRIVER) == SPEC


def test_intact_entry_with_a_bad_spec_is_dropped(cdir):
    fields = _fields()
    bad = store.spec_to_dict(SPEC)
    bad["stages"] = 99  # checksum fine, GemmSpec refuses it
    store.write_entry(fields, {"spec": bad})
    assert _entry_path(fields).exists()
    assert lookup("f16", "row", "row", 4096, 4096, 4096, "f32", GPU, DRIVER) is None
    assert not _entry_path(fields).exists()


def test_entry_for_another_problem_under_this_key_is_dropped(cdir):
    fields = _fields()
    store.write_entry(fields, {"spec": store.spec_to_dict(SPEC.replace(dtype="bf16", atom=None))})
    assert lookup("f16", "row", "row", 4096, 4096, 4096, "f32", GPU, DRIVER) is None
    assert not _entry_path(fields).exists()


def test_entry_moved_to_another_key_is_dropped(cdir):
    path = store.store(SPEC, 4096, 4096, 4096, GPU, DRIVER)
    other = _entry_path(_fields(k=8192))
    other.write_bytes(path.read_bytes())  # its header names the 4096 key
    assert lookup("f16", "row", "row", 4096, 4096, 8192, "f32", GPU, DRIVER) is None
    assert not other.exists()
    assert lookup("f16", "row", "row", 4096, 4096, 4096, "f32", GPU, DRIVER) == SPEC


def test_cache_off_means_no_reads_and_no_writes(cdir, monkeypatch):
    store.store(SPEC, 4096, 4096, 4096, GPU, DRIVER)
    monkeypatch.setenv("TILEGEN_CACHE", "0")
    assert lookup("f16", "row", "row", 4096, 4096, 4096, "f32", GPU, DRIVER) is None
    assert store.store(SPEC, 64, 64, 64, GPU, DRIVER) is None
    monkeypatch.delenv("TILEGEN_CACHE")
    assert lookup("f16", "row", "row", 64, 64, 64, "f32", GPU, DRIVER) is None
    assert lookup("f16", "row", "row", 4096, 4096, 4096, "f32", GPU, DRIVER) == SPEC


def test_entries_list_and_clear(cdir):
    store.store(SPEC, 4096, 4096, 4096, GPU, DRIVER, tflops=1.0)
    store.store(SPEC.replace(out_dtype="f16"), 2048, 2048, 2048, GPU, DRIVER, tflops=2.0)
    (cdir / "tune" / ("0" * 64 + store.SUFFIX)).write_bytes(b"junk")
    items = store.entries()
    assert sorted(e["tflops"] for e in items) == [1.0, 2.0]
    assert {e["key"]["out_dtype"] for e in items} == {"f32", "f16"}
    # the kernel cache's clearing leaves tuned configs alone
    assert cache.clear() == 0 and disk.info()["tune"] == 3  # two entries and the junk file
    assert store.clear() == 3
    assert store.entries() == []


def test_normalize_driver():
    assert store.normalize_driver(13000) == "13.0"
    assert store.normalize_driver(12080) == "12.8"
    assert store.normalize_driver("13000") == "13.0"
    assert store.normalize_driver(" 13.0 ") == "13.0"
    assert store.normalize_driver("580.159.04") == "580.159.04"
    with pytest.raises(ValueError):
        store.normalize_driver("")
