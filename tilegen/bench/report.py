"""Result files and tables: JSON save/load, the comparison with a baseline, the console
and Markdown tables, the plot. No GPU needed: everything here works on saved results.

A result file is one JSON object:
  {"format": "tilegen-bench/1", "gpu", "driver", "versions": {...}, "tilegen_commit", "date",
   "settings": {...}, "peak": {dtype: {...}} | null, "compile_speed": {...} | null,
   "rows": [row, ...]}
and a row is
  {"dtype", "layout", "m", "n", "k", "spec",
   "tilegen_ms", "tilegen_tflops", "cublas_ms", "cublas_tflops", "triton_ms", "triton_tflops",
   "vs_cublas", "vs_triton", "pct_peak", "check", "rel_err", "err_bound", "errors": {...}, ...}
with None for what was not measured.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

FORMAT = "tilegen-bench/1"
IMPLS = (("tilegen", "tilegen"), ("cublas", "cuBLAS"), ("triton", "Triton"), ("front", "tilegen.matmul"),
         ("front_kernel", "its kernel, back to back"), ("cublas_front", "torch.matmul"))


class ResultFileError(ValueError):
    pass


# ---- rows --------------------------------------------------------------------------------

def tflops(m: int, n: int, k: int, ms) -> float | None:
    if ms is None or not ms > 0:
        return None
    return 2.0 * m * n * k / (ms * 1e-3) / 1e12


def row_key(row: dict) -> tuple:
    return (row["dtype"], row["layout"], int(row["m"]), int(row["n"]), int(row["k"]))


def size_text(row: dict) -> str:
    m, n, k = int(row["m"]), int(row["n"]), int(row["k"])
    return str(m) if m == n == k else f"{m}x{n}x{k}"


def finish_row(row: dict, peak: dict | None) -> dict:
    """Fill the derived columns (TFLOP/s, ratios, % of peak) from the measured times."""
    m, n, k = row["m"], row["n"], row["k"]
    for impl, _ in IMPLS:
        row[f"{impl}_tflops"] = tflops(m, n, k, row.get(f"{impl}_ms"))
    t = row.get("tilegen_tflops")
    for impl in ("cublas", "triton"):
        other = row.get(f"{impl}_tflops")
        row[f"vs_{impl}"] = t / other if t and other else None
    p = (peak or {}).get(row["dtype"])
    row["pct_peak"] = 100.0 * t / p if t and p else None
    # what users get: tilegen.matmul as called, against its kernel launched back to back from
    # prepared arguments (the call path's cost; the kernel-only column if that was not timed)
    # and against torch.matmul as called
    f, fc = row.get("front_tflops"), row.get("cublas_front_tflops")
    fk = row.get("front_kernel_tflops") or t
    row["front_vs_kernel"] = f / fk if f and fk else None
    row["front_vs_cublas"] = f / fc if f and fc else None
    return row


def is_wrong(row: dict) -> bool:
    return row.get("check") in ("WRONG", "error")


# ---- files -------------------------------------------------------------------------------

def save(result: dict, path: str) -> None:
    with open(path, "w") as f:
        json.dump(_clean(result), f, indent=1, sort_keys=False)
        f.write("\n")


def _clean(x):
    """JSON without NaN/Infinity (None instead), so any JSON reader takes the file."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def load(path: str) -> dict:
    try:
        with open(path) as f:
            data = json.load(f)
    except OSError as e:
        raise ResultFileError(f"cannot read {path}: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise ResultFileError(f"{path} is not JSON: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise ResultFileError(f"{path} is not a tilegen bench result (no 'rows' list)")
    for i, row in enumerate(data["rows"]):
        if not isinstance(row, dict):
            raise ResultFileError(f"{path}: row {i} is a {type(row).__name__}, not a result row (an object)")
        missing = [key for key in ("dtype", "layout", "m", "n", "k") if key not in row]
        if missing:
            raise ResultFileError(f"{path}: row {i} lacks {', '.join(missing)}")
        for key, value in row.items():   # (measured columns: numbers, or null where not measured)
            if key.endswith(("_tflops", "_ms", "_us")) or key.startswith("vs_") or key in ("pct_peak", "rel_err"):
                if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                    raise ResultFileError(f"{path}: row {i}'s {key} is {value!r}, not a number")
    for key in SECTIONS:
        if data.get(key) is not None and not isinstance(data[key], SECTIONS[key]):
            raise ResultFileError(f"{path}: its {key} is a {type(data[key]).__name__}, not what tilegen bench "
                                  f"writes there")
    if not data["rows"] and not any(data.get(key) for key in ("peak", "compile_speed", "host_costs", "host", "stacks")):
        raise ResultFileError(f"{path} holds no results (no rows, peak, compile speed, host costs or stacks)")
    return data


SECTIONS = {"peak": dict, "compile_speed": dict, "host_costs": list, "stacks": list, "settings": dict,
            "environment": dict}   # (the parts beside the rows load checks the kind of)


# ---- comparison --------------------------------------------------------------------------

@dataclass
class Comparison:
    key: tuple
    base: float | None        # baseline tilegen TFLOP/s
    current: float | None
    change: float | None      # current / base - 1
    status: str               # "ok", "faster", "REGRESSION", "new", "missing", "no baseline"
    cublas_change: float | None = None

    @property
    def regression(self) -> bool:
        return self.status.startswith("REGRESSION")


def compare(current: list, baseline: list, tolerance: float = 0.05) -> list:
    """One Comparison per row of either side. A row regresses when its tilegen TFLOP/s fell
    by more than `tolerance` (a fraction), or when it had a result before and has none now
    (failed, or wrong)."""
    base = {row_key(r): r for r in baseline}
    out, seen = [], set()
    for r in current:
        key = row_key(r)
        seen.add(key)
        b = base.get(key)
        cur = None if is_wrong(r) else r.get("tilegen_tflops")
        if b is None:
            out.append(Comparison(key, None, cur, None, "new"))
            continue
        was = None if is_wrong(b) else b.get("tilegen_tflops")
        cb_now, cb_then = r.get("cublas_tflops"), b.get("cublas_tflops")
        cb_change = cb_now / cb_then - 1 if cb_now and cb_then else None
        if was is None:
            out.append(Comparison(key, None, cur, None, "no baseline", cb_change))
        elif cur is None:
            why = "wrong result" if is_wrong(r) else "no result"
            out.append(Comparison(key, was, None, None, f"REGRESSION ({why})", cb_change))
        else:
            change = cur / was - 1
            status = "REGRESSION" if change < -tolerance else ("faster" if change > tolerance else "ok")
            out.append(Comparison(key, was, cur, change, status, cb_change))
    for key, b in base.items():
        if key not in seen:
            out.append(Comparison(key, b.get("tilegen_tflops"), None, None, "missing"))
    return out


def format_comparison(comps: list, tolerance: float) -> str:
    head = ["dtype", "layout", "size", "baseline TFLOP/s", "now TFLOP/s", "change", "cuBLAS change", "status"]
    rows = [head]
    for c in comps:
        dt, lay, m, n, k = c.key
        rows.append([dt, lay, str(m) if m == n == k else f"{m}x{n}x{k}", _num(c.base), _num(c.current),
                     _pct(c.change), _pct(c.cublas_change), c.status])
    n_reg = sum(c.regression for c in comps)
    text = _grid(rows)
    verdict = (f"{n_reg} regression(s) beyond {tolerance:.0%}" if n_reg
               else f"no regression beyond {tolerance:.0%}")
    return f"comparison with the baseline (tilegen TFLOP/s)\n{text}\n{verdict}"


# ---- tables ------------------------------------------------------------------------------

def _num(v, fmt="{:.1f}") -> str:
    return "--" if v is None else fmt.format(v)


def _pct(v) -> str:
    return "--" if v is None else f"{100 * v:+.1f}%"


def _ratio(v) -> str:
    return "--" if v is None else f"{v:.2f}x"


def check_text(row: dict) -> str:
    c = row.get("check")
    if c == "ok":
        return f"ok ({row['rel_err']:.1e})" if row.get("rel_err") is not None else "ok"
    if c == "WRONG":
        rel = row.get("rel_err")
        rel_s = "nan" if rel is None else f"{rel:.1e}"
        return f"WRONG rel={rel_s} > {row.get('err_bound', float('nan')):.1e}"
    if c == "error":
        return "ERROR"
    return "not checked"


def table_rows(rows: list) -> list:
    """Cells of the results table, one list per row (the header first)."""
    head = ["dtype", "layout", "size", "tilegen ms", "tilegen TFLOP/s", "cuBLAS TFLOP/s", "Triton TFLOP/s",
            "vs cuBLAS", "vs Triton", "% mma peak", "matmul TFLOP/s", "matmul/kernel", "matmul vs torch",
            "check"]
    out = [head]
    for r in rows:
        wrong = is_wrong(r)
        out.append([
            r["dtype"], r["layout"], size_text(r),
            "WRONG" if wrong else _num(r.get("tilegen_ms"), "{:.3f}"),
            "WRONG" if wrong else _num(r.get("tilegen_tflops")),
            _num(r.get("cublas_tflops")), _num(r.get("triton_tflops")),
            "--" if wrong else _ratio(r.get("vs_cublas")), "--" if wrong else _ratio(r.get("vs_triton")),
            "--" if wrong else _num(r.get("pct_peak"), "{:.0f}%"),
            _num(r.get("front_tflops")), _ratio(r.get("front_vs_kernel")), _ratio(r.get("front_vs_cublas")),
            check_text(r),
        ])
    return out


def _grid(rows: list) -> str:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for j, r in enumerate(rows):
        lines.append("  ".join(str(v).rjust(w) if i > 2 else str(v).ljust(w) for i, (v, w) in enumerate(zip(r, widths))))
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_table(result: dict) -> str:
    rows = result.get("rows", [])
    parts = [header_line(result)]
    if rows:
        parts.append(_grid(table_rows(rows)))
    errors = [(r, impl, msg) for r in rows for impl, msg in (r.get("errors") or {}).items()]
    for r, impl, msg in errors:
        parts.append(f"  {r['dtype']} {r['layout']} {size_text(r)} {impl}: {msg}")
    wrong = [r for r in rows if is_wrong(r)]
    if wrong:
        bar = "!" * 78
        names = ", ".join(f"{r['dtype']} {r['layout']} {size_text(r)}" for r in wrong)
        parts += [bar, f"!!! {len(wrong)} row(s) FAILED: tilegen gave a wrong result or an error: {names}",
                  "!!! no tilegen speed is reported for them", bar]
    return "\n".join(parts)


def header_line(result: dict) -> str:
    v = result.get("versions") or {}
    bits = [result.get("gpu") or "unknown GPU"]
    if result.get("driver"):
        bits.append(f"driver {result['driver']}")
    if result.get("tilegen_commit"):
        bits.append(f"tilegen {result['tilegen_commit'][:10]}" + ("+dirty" if result.get("tilegen_dirty") else ""))
    for lib in ("torch", "triton", "cupy"):
        if v.get(lib):
            bits.append(f"{lib} {v[lib]}")
    if result.get("date"):
        bits.append(result["date"])
    peak = result.get("peak_source")
    if peak:
        bits.append(f"% peak of {peak}")
    return ", ".join(bits)


def markdown(result: dict) -> str:
    """Markdown tables (results, and the peak and compile speed when measured) for the README."""
    out = [f"Measured on {header_line(result)}.", ""]
    rows = result.get("rows", [])
    if rows:
        cells = table_rows(rows)
        cells[0] = ["dtype", "A/B", "M x N x K", "tilegen ms", "tilegen TFLOP/s", "cuBLAS TFLOP/s",
                    "Triton TFLOP/s", "tilegen / cuBLAS", "tilegen / Triton", "% of mma.sync peak",
                    "tilegen.matmul TFLOP/s (as called)", "tilegen.matmul / kernel",
                    "tilegen.matmul / torch.matmul (as called)", "check"]
        for r in cells[1:]:
            r[2] = r[2] if "x" in r[2] else f"{r[2]}^3"
        out += _md(cells)
    peak = result.get("peak")
    if peak:
        out += ["", "mma.sync peak (tilegen kernel, register-only loop):", ""]
        cells = [["dtype", "atom", "TFLOP/s", "reference (DESIGN.md)", "best shape"]]
        atoms = {"tf32": "m16n8k8", "f16": "m16n8k16", "bf16": "m16n8k16"}
        for dt, p in peak.items():
            cells.append([dt, atoms.get(dt, "?"), _num(p.get("tflops")), _num(p.get("reference"), "{:.0f}"),
                          p.get("config") or "--"])
        out += _md(cells)
    cs = result.get("compile_speed")
    if cs and cs.get("specs"):
        out += ["", "Compile speed (ms):", ""]
        cached = any(r.get("cache_warm_first_launch_ms") is not None for r in cs["specs"])
        cells = [["spec", "spec -> PTX", "driver JIT", "compile -> launched", "second Kernel object"]
                 + (["disk cache cold", "disk cache warm (new process)"] if cached else [])]
        for r in cs["specs"]:
            cells.append([r["spec"], _num(r.get("compile_ms")), _num(r.get("jit_ms")),
                          _num(r.get("first_launch_ms")), _num(r.get("second_object_ms"))]
                         + ([_num(r.get("cache_cold_first_launch_ms")), _num(r.get("cache_warm_first_launch_ms"))]
                            if cached else []))
        out += _md(cells)
    return "\n".join(out)


def _md(cells: list) -> list:
    lines = ["| " + " | ".join(cells[0]) + " |", "| " + " | ".join("---" for _ in cells[0]) + " |"]
    for r in cells[1:]:
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |")
    return lines


def format_peak(peak: dict) -> str:
    rows = [["dtype", "TFLOP/s", "reference", "of reference", "best shape"]]
    for dt, p in peak.items():
        t, ref = p.get("tflops"), p.get("reference")
        shape = p.get("config") or "; ".join(c.get("error", "") for c in p.get("configs", []))[:160]
        rows.append([dt, _num(t), _num(ref, "{:.0f}"), _num(100 * t / ref if t and ref else None, "{:.0f}%"), shape])
    lines = ["mma.sync peak (tilegen-emitted register-only mma loop)", _grid(rows)]
    for dt, p in peak.items():
        for c in p.get("configs", []):
            if c.get("error"):
                lines.append(f"  !!! {dt} {c.get('config', '?')}: {c['error']}")
    return "\n".join(lines)


# ---- plot --------------------------------------------------------------------------------

class PlotUnavailable(RuntimeError):
    pass


def _plot_value(row, impl: str):
    """TFLOP/s of `impl` in `row`; None for a missing row or a wrong tilegen result."""
    if row is None or (impl == "tilegen" and is_wrong(row)):
        return None
    return row.get(f"{impl}_tflops")


def have_matplotlib() -> bool:
    try:
        import matplotlib
    except ImportError:
        return False
    return bool(matplotlib.__version__)


def plot(result: dict, path: str) -> None:
    """TFLOP/s against size, one panel per dtype, a line per implementation (and layout)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotUnavailable("--plot needs matplotlib: pip install matplotlib (or pip install 'tilegen[plot]')") from None
    rows = result.get("rows", [])
    dtypes = list(dict.fromkeys(r["dtype"] for r in rows))
    if not dtypes:
        raise PlotUnavailable("nothing to plot: the result has no rows")
    fig, axes = plt.subplots(1, len(dtypes), figsize=(5.5 * len(dtypes), 4.2), squeeze=False)
    colors = {"tilegen": "tab:blue", "cublas": "tab:orange", "triton": "tab:green"}
    markers = {"tilegen": "o", "cublas": "s", "triton": "^"}
    dashes = ["-", "--", ":", "-."]  # one per layout
    for ax, dt in zip(axes[0], dtypes):
        mine = [r for r in rows if r["dtype"] == dt]
        order = sorted(dict.fromkeys((int(r["m"]) * int(r["n"]) * int(r["k"]), size_text(r)) for r in mine))
        sizes = [label for _, label in order]  # by amount of work
        layouts = list(dict.fromkeys(r["layout"] for r in mine))
        for li, layout in enumerate(layouts):
            lr = {size_text(r): r for r in mine if r["layout"] == layout}
            for impl, label in IMPLS:
                ys = [_plot_value(lr.get(s), impl) for s in sizes]
                if all(y is None for y in ys):
                    continue
                ax.plot(range(len(sizes)), [float("nan") if y is None else y for y in ys],
                        linestyle=dashes[li % len(dashes)], marker=markers[impl], color=colors[impl],
                        label=f"{label} {layout}" if len(layouts) > 1 else label)
        peak = (result.get("peak") or {}).get(dt, {}) or {}
        if peak.get("tflops"):
            ax.axhline(peak["tflops"], color="grey", linewidth=0.8, linestyle="-.", label="mma.sync peak")
        ax.set_xticks(range(len(sizes)))
        ax.set_xticklabels(sizes, rotation=30, ha="right")
        ax.set_title(dt)
        ax.set_xlabel("size (N for N^3, else MxNxK)")
        ax.set_ylabel("TFLOP/s")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:   # (a dtype whose rows all failed draws no line)
            ax.legend(fontsize=8)
    fig.suptitle(f"GEMM throughput on {result.get('gpu') or 'GPU'}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
