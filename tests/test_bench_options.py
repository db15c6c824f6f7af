"""tilegen bench: the command line (sizes, layouts, --spec overrides, usage errors)."""
import pytest

from tilegen import GemmSpec
from tilegen.bench import cli
from tilegen.bench import options as O


@pytest.mark.parametrize("text, want", [
    ("4096", (4096, 4096, 4096)),
    ("4096x4096x1024", (4096, 4096, 1024)),
    ("1024X4096x8192", (1024, 4096, 8192)),
    (" 7x1x3 ", (7, 1, 3)),
])
def test_sizes(text, want):
    assert O.parse_size(text) == want


@pytest.mark.parametrize("text", ["", "x", "4096x", "4096x4096", "4096x4096x1024x2", "-5", "4k", "4096.0",
                                  "axbxc"])
def test_bad_sizes_say_what_is_allowed(text):
    with pytest.raises(O.OptionError, match=r"one number for a cube \(4096\) or MxNxK"):
        O.parse_size(text)


@pytest.mark.parametrize("text", ["0", "4096x0x3", "9999999"])
def test_sizes_out_of_range(text):
    with pytest.raises(O.OptionError, match="every dimension must be in 1.."):
        O.parse_size(text)


def test_size_labels():
    assert O.size_label(4096, 4096, 4096) == "4096"
    assert O.size_label(4096, 4096, 1024) == "4096x4096x1024"


@pytest.mark.parametrize("code, want", [("rr", ("row", "row")), ("rc", ("row", "col")),
                                        ("cr", ("col", "row")), ("CC", ("col", "col"))])
def test_layouts(code, want):
    assert O.parse_layout(code) == want
    assert O.layout_code(*want) == code.lower()


def test_bad_layout():
    with pytest.raises(O.OptionError, match="rr, rc, cr, cc"):
        O.parse_layout("rx")


def test_spec_overrides_parse_each_kind():
    got = O.parse_spec_overrides(["tile=128,256,32", "warps=2x4", "stages=4", "swizzle=64B", "group_m=8",
                                  "target=sm_90", "out_dtype=f16"])
    assert got == {"tile": (128, 256, 32), "warps": (2, 4), "stages": 4, "swizzle": "64B", "group_m": 8,
                   "target": "sm_90", "out_dtype": "f16"}
    spec = O.make_spec("f16", "row", "col", "sm_80", got)
    assert spec.tile.n == 256 and spec.warps.n == 4 and spec.target == "sm_90" and spec.b_layout == "col"


def test_device_target_is_the_default_and_overrides_win():
    assert O.make_spec("tf32", "row", "row", "sm_90", {}).target == "sm_90"
    assert O.make_spec("tf32", "row", "row", "sm_90", {"target": "sm_80"}).target == "sm_80"
    assert O.make_spec("bf16", "col", "row", "sm_90", {}) == GemmSpec(dtype="bf16", a_layout="col",
                                                                      b_layout="row", target="sm_90", out_dtype="bf16")
    # C in cuBLAS's dtype unless asked otherwise
    assert O.make_spec("tf32", "row", "row", "sm_90", {}).out_dtype == "f32"
    assert O.make_spec("f16", "row", "row", "sm_90", {"out_dtype": "f32"}).out_dtype == "f32"


@pytest.mark.parametrize("items, match", [
    (["tiles=1,2,3"], r"'tiles' is not a GemmSpec field.*keys: acc_dtype, atom, cluster, copy, frag_buffers, group_m"),
    (["stages"], "write KEY=VALUE"),
    (["stages=four"], "stages takes an integer"),
    (["stages=0"], "stages must be positive"),
    (["tile=128,128"], r"tile takes 3 positive integers, e.g. tile=128,256,32"),
    (["tile=128,128,a"], "tile takes 3 positive integers"),
    (["warps=2,2,2"], "warps takes 2 positive integers"),
    (["dtype=f16"], "use --dtype"),
    (["a_layout=col"], "use --layout"),
    (["epilogue=relu"], "tilegen.bench.fused"),
    (["stages=3", "stages=4"], "given twice"),
    (["swizzle="], "empty value"),
])
def test_bad_spec_overrides(items, match):
    with pytest.raises(O.OptionError, match=match):
        O.parse_spec_overrides(items)


def test_invalid_spec_values_fail_up_front_with_the_spec_error():
    with pytest.raises(O.OptionError, match=r"--spec for f16 rr: swizzle='256B' is invalid; allowed:"):
        O.check_overrides(["f16"], [("row", "row")], "sm_90", O.parse_spec_overrides(["swizzle=256B"]))
    with pytest.raises(O.OptionError, match=r"stages=33 is invalid; allowed: 2..32"):
        O.check_overrides(["tf32"], [("row", "row")], "sm_90", {"stages": 33})
    O.check_overrides(["tf32", "f16", "bf16"], list(O.LAYOUTS.values()), "sm_90", {"stages": 4})


def test_defaults():
    args = cli.parse_args([])
    assert args.dtype == ["tf32", "f16", "bf16"]
    assert args.layouts == [("row", "row")]
    assert args.size_list == [(2048,) * 3, (4096,) * 3, (8192,) * 3, (4096, 4096, 1024), (1024, 4096, 4096)]
    assert args.overrides == {} and args.tolerance == 0.05 and not args.peak and not args.compile_speed


def test_full_command_line():
    args = cli.parse_args(["--dtype", "f16", "bf16", "--layout", "rr", "cc", "--sizes", "4096", "4096x4096x1024",
                           "--spec", "tile=128,256,32", "warps=2,4", "--spec", "stages=4", "--warmup-ms", "10",
                           "--rep-ms", "100", "--save", "a.json", "--compare", "b.json", "--fail-on-regression",
                           "--tolerance", "0.1", "--plot", "p.png", "--markdown", "--peak", "--compile-speed"])
    assert args.dtype == ["f16", "bf16"]
    assert args.layouts == [("row", "row"), ("col", "col")]
    assert args.size_list == [(4096, 4096, 4096), (4096, 4096, 1024)]
    assert args.overrides == {"tile": (128, 256, 32), "warps": (2, 4), "stages": 4}
    assert (args.warmup_ms, args.rep_ms, args.tolerance) == (10.0, 100.0, 0.1)
    assert args.save == "a.json" and args.compare == "b.json" and args.fail_on_regression
    assert args.plot == "p.png" and args.markdown and args.peak and args.compile_speed


def test_repeated_values_are_run_once():
    args = cli.parse_args(["--dtype", "f16", "f16", "--sizes", "4096", "4096x4096x4096"])
    assert args.dtype == ["f16"] and args.size_list == [(4096, 4096, 4096)]


def test_counts_override_times():
    args = cli.parse_args(["--warmup", "3", "--reps", "20"])
    assert args.warmup == 3 and args.reps == 20


@pytest.mark.parametrize("argv, match", [
    (["--sizes", "4096x1"], "MxNxK"),
    (["--layout", "rx"], "rr, rc, cr, cc"),
    (["--spec", "bogus=1"], "is not a GemmSpec field"),
    (["--fail-on-regression"], "needs --compare"),
    (["--compare", "x.json", "--tolerance", "5"], "fraction"),
    (["--reps", "0"], "--reps must be >= 1"),
    (["--rep-ms", "-1"], "--rep-ms must be >= 0"),
    (["--load", "a.json", "--peak"], "--load reads saved results"),
])
def test_usage_errors_exit_2_with_a_message(argv, match, capsys):
    assert cli.main(argv) == 2
    assert match in capsys.readouterr().err


def test_argparse_errors_exit_2(capsys):
    assert cli.main(["--dtype", "f64"]) == 2
    assert "invalid choice" in capsys.readouterr().err


def test_help_exits_0(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for flag in ("--dtype", "--layout", "--sizes", "--spec", "--warmup-ms", "--rep-ms", "--save", "--compare",
                 "--fail-on-regression", "--tolerance", "--plot", "--markdown", "--peak", "--compile-speed"):
        assert flag in out


def test_package_main_is_the_cli():
    import tilegen.bench

    assert tilegen.bench.main(["--help"]) == 0


def test_wgmma_overrides_take_the_arch_specific_target():
    ov = O.parse_spec_overrides(["instruction=wgmma", "persistent=true"])
    assert ov == {"instruction": "wgmma", "persistent": True}
    spec = O.make_spec("bf16", "row", "col", "sm_90", ov)
    assert (spec.instruction, spec.target, spec.persistent) == ("wgmma", "sm_90a", True)
    assert O.make_spec("f16", "row", "row", "sm_90", {"instruction": "wgmma", "persistent": False}).persistent is False
    with pytest.raises(O.OptionError, match="true or false"):
        O.parse_spec_overrides(["persistent=maybe"])
    with pytest.raises(O.OptionError, match="sm_90a"):   # wgmma on an older GPU: the spec's own message
        O.check_overrides(["f16"], [("row", "row")], "sm_80", {"instruction": "wgmma", "target": "sm_80"})


def test_spec_overrides_take_the_hopper_knobs():
    got = O.parse_spec_overrides(["cluster=2,1", "split_k=2", "promote=4"])
    assert got == {"cluster": (2, 1), "split_k": 2, "promote": 4}
    spec = O.make_spec("e4m3", "row", "col", "sm_90", {"instruction": "wgmma", "promote": 4})
    assert (spec.target, spec.promote, spec.out_dtype) == ("sm_90a", 4, "bf16")


# ---- --stacks ------------------------------------------------------------------------------

def test_stacks_parse_and_label():
    from tilegen.bench import stacks

    assert stacks.parse_stack("32x200x200x64") == (32, 200, 200, 64, "")
    assert stacks.parse_stack(" 8X1000x4096x1024/A ") == (8, 1000, 4096, 1024, "a")
    assert stacks.stack_label((8, 1000, 4096, 1024, "a")) == "8x1000x4096x1024/a"
    for text in stacks.DEFAULT_STACKS:
        assert stacks.stack_label(stacks.parse_stack(text)) == text
    for bad in ("3x4x5", "3x4x5x6/c", "0x4x5x6", "3x4x5x6x7", "axbxcxd"):
        with pytest.raises(O.OptionError, match="stack"):
            stacks.parse_stack(bad)


def test_stacks_on_the_command_line():
    args = cli.parse_args(["--stacks"])
    from tilegen.bench import stacks

    assert args.stack_list == [stacks.parse_stack(s) for s in stacks.DEFAULT_STACKS]
    assert cli.parse_args(["--stacks", "4x64x64x64", "4x64x64x64"]).stack_list == [(4, 64, 64, 64, "")]
    assert cli.parse_args([]).stack_list is None
    with pytest.raises(cli.UsageError, match="stack '4x64'"):
        cli.parse_args(["--stacks", "4x64"])
    with pytest.raises(cli.UsageError, match="--stacks"):
        cli.parse_args(["--stacks", "--load", "x.json"])


def test_stacks_table_and_a_failed_row(tmp_path, capsys):
    from tilegen.bench import report, stacks

    row = {"stack": "96x77x77x64", "dtype": "bf16", "tilegen_tflops": 3.7, "torch_tflops": 5.9, "vs_torch": 0.63,
           "rel_err": 1.7e-3, "how": "a stack of 96 products"}
    text = stacks.format_stacks([row, {"dtype": "f16", "error": "RuntimeError: boom"}])
    assert "96x77x77x64" in text and "0.63x" in text and "a stack of 96 products" in text and "boom" in text
    path = tmp_path / "s.json"
    report.save({"format": report.FORMAT, "rows": [], "stacks": [row]}, str(path))
    assert cli.main(["--load", str(path)]) == 0
    assert "96x77x77x64" in capsys.readouterr().out
    report.save({"format": report.FORMAT, "rows": [], "stacks": [row, {"dtype": "f16", "error": "boom"}]}, str(path))
    assert cli.main(["--load", str(path)]) == 1
