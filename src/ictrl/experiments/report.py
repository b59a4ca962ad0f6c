"""Plots, results tables and a self-contained report.html for compare / sweep (issues #5, #7).

Inputs are plain Python data so that compare.py and sweep.py can call these functions directly:

- a *run* is the list of records of one ``metrics.jsonl`` (``load_metrics``): dicts with ``"step"`` and any of the
  keys named in a curve mapping (display name -> metrics key, ``DEFAULT_CURVE_KEYS``). Missing keys are tolerated:
  a curve no run logged is not drawn.
- ``runs``: method -> list of runs (one per seed).
- per-seed results for the table: method -> list of ``{"p1": float, "p4": float}`` with values in [0, 1].

Figures use matplotlib's object API on the Agg canvas (no pyplot, no global backend state). Every file is written
atomically (temp file in the same directory, then ``os.replace``).
"""

from __future__ import annotations

import base64
import html
import io
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ictrl.files import atomic_write_bytes, atomic_write_text, read_jsonl  # noqa: F401  (re-exported)

DEFAULT_CURVE_KEYS: dict[str, str] = {
    "reward": "reward",
    "H1 entropy, all tokens (nats)": "ictrl/h1/all",
    "H1 entropy, selected tokens (nats)": "ictrl/h1/selected",
    "H2 Renyi entropy, all tokens (nats)": "ictrl/h2/all",
    "purity beta, all tokens": "ictrl/purity/all",
    "selected fraction": "ictrl/selected_frac",
}

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TABLE_COLUMNS = ("P@1", "P@4", "Total")


# ---------------------------------------------------------------------------------------------------- files


def load_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read a ``metrics.jsonl``: one JSON object per line (blank lines skipped)."""
    return [obj for _, obj in read_jsonl(path)]


def _save_figure(fig: Any, path: Path) -> Path:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return atomic_write_bytes(path, buf.getvalue())


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") or "curve"


def _method_colors(methods: Sequence[str]) -> dict[str, Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    return {m: cmap(i % 10) for i, m in enumerate(methods)}


def _number(value: Any, where: str) -> float | None:
    """A finite float, None for a missing value; anything else is a ValueError naming ``where``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where} must be a number, got {value!r}")
    return float(value) if math.isfinite(value) else None


# ---------------------------------------------------------------------------------------------------- curves


def _collect(runs: Mapping[str, Sequence[Sequence[Mapping[str, Any]]]], key: str) -> dict[str, dict[float, list[float]]]:
    """method -> step -> one value per seed that logged ``key`` at that step (a re-logged step keeps the last)."""
    out: dict[str, dict[float, list[float]]] = {}
    for method, seeds in runs.items():
        per_step: dict[float, list[float]] = {}
        for s, records in enumerate(seeds):
            seen: dict[float, float] = {}
            for i, rec in enumerate(records):
                where = f"runs[{method!r}][{s}][{i}]"
                value = _number(rec.get(key), f"{where}[{key!r}]")
                if value is None:
                    continue
                step = _number(rec.get("step", i), f"{where}['step']")
                seen[float(i if step is None else step)] = value
            for step, value in seen.items():
                per_step.setdefault(step, []).append(value)
        if per_step:
            out[method] = per_step
    return out


@dataclass(frozen=True)
class CurveBand:
    """One method's curve for one key: per logged step the mean over seeds and the band edges."""

    steps: list[float]
    mean: list[float]
    lo: list[float]
    hi: list[float]
    n: list[int]  # seeds that logged each step


def aggregate_curves(
    runs: Mapping[str, Sequence[Sequence[Mapping[str, Any]]]], key: str, band: str = "minmax"
) -> dict[str, CurveBand]:
    """method -> CurveBand of ``key`` across seeds; methods that never logged ``key`` are absent.

    band: "minmax" (min and max over seeds) or "std" (mean -+ sample std; zero width where one seed logged the
    step). A record without "step" uses its index in the run.
    """
    if band not in ("minmax", "std"):
        raise ValueError(f"band must be 'minmax' or 'std', got {band!r}")
    out = {}
    for method, per_step in _collect(runs, key).items():
        steps = sorted(per_step)
        vals = [per_step[s] for s in steps]
        mean = [math.fsum(v) / len(v) for v in vals]
        if band == "minmax":
            lo, hi = [min(v) for v in vals], [max(v) for v in vals]
        else:
            sd = [_sample_std(v) or 0.0 for v in vals]
            lo, hi = [m - d for m, d in zip(mean, sd)], [m + d for m, d in zip(mean, sd)]
        out[method] = CurveBand(steps, mean, lo, hi, [len(v) for v in vals])
    return out


def plot_curves(
    runs: Mapping[str, Sequence[Sequence[Mapping[str, Any]]]],
    keys: Mapping[str, str] | None = None,
    out_dir: str | os.PathLike[str] = ".",
    band: str = "minmax",
) -> list[Path]:
    """One PNG per curve (display name -> metrics key; default ``DEFAULT_CURVE_KEYS``) with a line per method.

    runs: method -> list of runs (one per seed), each a list of metrics records. Each line is the mean over the
    seeds that logged that step, the shaded band min-max over seeds or mean +- std (``aggregate_curves``). Curves
    no run logged are skipped. Returns the written paths ``out_dir/curve_<slug>.png`` in the order of ``keys``.
    """
    if not runs:
        raise ValueError("runs must name at least one method")
    from matplotlib.figure import Figure

    keys = DEFAULT_CURVE_KEYS if keys is None else keys
    colors = _method_colors(list(runs))
    paths = []
    for name, key in keys.items():
        data = aggregate_curves(runs, key, band)
        if not data:
            continue
        fig = Figure(figsize=(6.4, 3.8))
        ax = fig.add_subplot()
        for method, c in data.items():
            ax.plot(c.steps, c.mean, color=colors[method], label=f"{method} (n={len(runs[method])})", lw=1.6)
            ax.fill_between(c.steps, c.lo, c.hi, color=colors[method], alpha=0.2, lw=0)
        ax.set_xlabel("step")
        ax.set_ylabel(name)
        ax.set_title(f"{name} (mean, band {'min-max' if band == 'minmax' else '+-1 std'} over seeds)", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        paths.append(_save_figure(fig, Path(out_dir) / f"curve_{_slug(name)}.png"))
    return paths


def plot_stability_heatmap(
    labels: Mapping[str, Mapping[float, Sequence[str]]],
    out_path: str | os.PathLike[str],
    title: str = "stable fraction (method x learning rate)",
) -> Path:
    """Heat map of the stable fraction per method (rows) x learning rate (columns), cells annotated "k/n" (stable
    seeds / seeds) over the counts of the other labels ("1E 1D": one exploded, one degraded; C = collapsed).

    labels: method -> lr -> outcome labels of its seeds (``outcomes.label_run``). A missing cell is grey.
    """
    from matplotlib.figure import Figure

    from ictrl.experiments.outcomes import stable_fraction

    if not labels:
        raise ValueError("labels must name at least one method")
    methods = list(labels)
    lrs = sorted({float(lr) for cells in labels.values() for lr in cells})
    if not lrs:
        raise ValueError("labels: no learning rate has any label")
    grid = [[math.nan] * len(lrs) for _ in methods]
    text = [[""] * len(lrs) for _ in methods]
    for i, m in enumerate(methods):
        for lr, seq in labels[m].items():
            j = lrs.index(float(lr))
            grid[i][j] = stable_fraction(list(seq))
            others = " ".join(f"{list(seq).count(x)}{x[0].upper()}" for x in ("collapsed", "exploded", "degraded")
                              if x in seq)
            text[i][j] = f"{sum(x == 'stable' for x in seq)}/{len(seq)}" + (f"\n{others}" if others else "")
    import numpy as np
    from matplotlib import colormaps

    cmap = colormaps["RdYlGn"].with_extremes(bad="#cccccc")
    fig = Figure(figsize=(1.2 + 1.0 * len(lrs), 1.0 + 0.5 * len(methods)))
    ax = fig.add_subplot()
    im = ax.imshow(np.ma.masked_invalid(np.array(grid, dtype=float)), cmap=cmap, vmin=0, vmax=1, aspect="auto")
    for i in range(len(methods)):
        for j in range(len(lrs)):
            if text[i][j]:
                ax.text(j, i, text[i][j], ha="center", va="center", fontsize=9)
    ax.set_xticks(range(len(lrs)), [f"{lr:g}" for lr in lrs])
    ax.set_yticks(range(len(methods)), methods)
    ax.set_xlabel("learning rate")
    ax.set_title(title, fontsize=9)
    fig.colorbar(im, ax=ax, label="stable fraction")
    return _save_figure(fig, Path(out_path))


def plot_prob_vs_purity(
    runs: Mapping[str, Sequence[Sequence[Mapping[str, Any]]]],
    out_path: str | os.PathLike[str],
    prob_key: str = "ictrl/prob/selected",
    purity_key: str = "ictrl/purity/selected",
) -> Path | None:
    """Scatter of the selected tokens' mean probability pi against purity beta, one colour per method.

    Each point is one logged step of one seed. The dashed diagonal is pi = beta: by the paper's H2 argument
    (method.md §3) updates on tokens above it push toward entropy collapse, below it toward explosion. The default
    ``purity_key`` is the purity at the selected positions, the beta the theory compares pi with; pass
    ``"ictrl/purity/all"`` for the batch mean. Returns None when no record carries both keys.
    """
    from matplotlib.figure import Figure

    colors = _method_colors(list(runs))
    points: dict[str, tuple[list[float], list[float]]] = {}
    for method, seeds in runs.items():
        xs, ys = [], []
        for s, records in enumerate(seeds):
            for i, rec in enumerate(records):
                where = f"runs[{method!r}][{s}][{i}]"
                x = _number(rec.get(purity_key), f"{where}[{purity_key!r}]")
                y = _number(rec.get(prob_key), f"{where}[{prob_key!r}]")
                if x is not None and y is not None:
                    xs.append(x)
                    ys.append(y)
        if xs:
            points[method] = (xs, ys)
    if not points:
        return None
    fig = Figure(figsize=(5.2, 4.6))
    ax = fig.add_subplot()
    ax.plot([0, 1], [0, 1], ls="--", color="grey", lw=1, label="pi = beta")
    for method, (xs, ys) in points.items():
        ax.scatter(xs, ys, s=12, alpha=0.5, color=colors[method], label=method)
        mx, my = math.fsum(xs) / len(xs), math.fsum(ys) / len(ys)
        ax.scatter([mx], [my], s=90, marker="X", color=colors[method], edgecolors="black", linewidths=0.8)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel(f"purity beta ({purity_key})")
    ax.set_ylabel(f"mean prob. of selected tokens ({prob_key})")
    ax.set_title("selected-token probability vs purity (X = mean per method)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save_figure(fig, Path(out_path))


# ---------------------------------------------------------------------------------------------------- tables


def _sample_std(values: Sequence[float]) -> float | None:
    """Sample standard deviation (ddof=1); None for fewer than two values."""
    if len(values) < 2:
        return None
    m = math.fsum(values) / len(values)
    return math.sqrt(math.fsum((v - m) ** 2 for v in values) / (len(values) - 1))


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularised incomplete beta function (modified Lentz, Numerical Recipes 6.4)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)), -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta I_x(a, b) for x in [0, 1]."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """CDF of Student's t with ``df`` > 0 degrees of freedom (non-integer df allowed, as Welch needs)."""
    if df <= 0:
        raise ValueError(f"df must be > 0, got {df!r}")
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """Inverse of ``t_cdf`` for p in (0, 1), by bisection to ~1e-12 relative precision."""
    if not 0 < p < 1:
        raise ValueError(f"p must be in (0, 1), got {p!r}")
    if p < 0.5:
        return -t_quantile(1 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


@dataclass(frozen=True)
class Cell:
    """mean and sample std (None for one seed) over seeds, in percent."""

    mean: float
    std: float | None
    n: int

    def __str__(self) -> str:
        return f"{self.mean:.2f} ± {'n/a' if self.std is None else f'{self.std:.2f}'}"


@dataclass(frozen=True)
class DiffCI:
    """Difference of means (treatment - baseline) in percent with a Welch t confidence interval.

    lo / hi / df are None when either side has fewer than two seeds (no variance estimate).
    """

    mean: float
    lo: float | None
    hi: float | None
    df: float | None
    confidence: float

    def __str__(self) -> str:
        if self.lo is None or self.hi is None:
            return f"{self.mean:+.2f} (CI n/a)"
        return f"{self.mean:+.2f} [{self.lo:+.2f}, {self.hi:+.2f}]"


def welch_diff(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> DiffCI:
    """mean(a) - mean(b) with a two-sided Welch t-interval (unequal variances, Welch–Satterthwaite df).

    Why Welch t and not a bootstrap: with the 3-5 seeds these studies afford, a percentile bootstrap over seeds
    under-covers badly; the t-interval is exact for normal seed noise and honest about small n. Seeds of two
    methods are treated as independent samples (not paired), which is conservative when they share data order.
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    if not a or not b:
        raise ValueError("welch_diff needs at least one value on each side")
    diff = math.fsum(a) / len(a) - math.fsum(b) / len(b)
    sa, sb = _sample_std(a), _sample_std(b)
    if sa is None or sb is None:
        return DiffCI(diff, None, None, None, confidence)
    va, vb = sa * sa / len(a), sb * sb / len(b)
    se = math.sqrt(va + vb)
    if se == 0.0:
        return DiffCI(diff, diff, diff, math.inf, confidence)
    df = (va + vb) ** 2 / (va * va / (len(a) - 1) + vb * vb / (len(b) - 1))
    half = t_quantile(0.5 + confidence / 2.0, df) * se
    return DiffCI(diff, diff - half, diff + half, df, confidence)


@dataclass(frozen=True)
class ResultsTable:
    """Rows = methods, columns P@1 / P@4 / Total (percent, mean ± std over seeds), plus an optional difference row."""

    rows: dict[str, dict[str, Cell]]
    diff_name: str | None = None
    diff: dict[str, DiffCI] | None = None

    def _lines(self) -> list[list[str]]:
        lines = [["method", *TABLE_COLUMNS]]
        for method, cells in self.rows.items():
            lines.append([f"{method} (n={cells['P@1'].n})", *(str(cells[c]) for c in TABLE_COLUMNS)])
        if self.diff is not None and self.diff_name is not None:
            conf = next(iter(self.diff.values())).confidence
            lines.append([f"{self.diff_name} ({conf:.0%} Welch CI)", *(str(self.diff[c]) for c in TABLE_COLUMNS)])
        return lines

    def to_markdown(self) -> str:
        lines = self._lines()
        out = ["| " + " | ".join(lines[0]) + " |", "|" + "---|" * len(lines[0])]
        out += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in lines[1:]]
        return "\n".join(out)

    def to_html(self) -> str:
        return markdown_table_to_html(self.to_markdown())


def results_table(
    per_seed: Mapping[str, Sequence[Mapping[str, float]]],
    diff: tuple[str, str] | None = ("ict", "random10"),
    confidence: float = 0.95,
) -> ResultsTable:
    """Aggregate per-seed pass@k into a results table.

    per_seed: method -> one ``{"p1": x, "p4": y}`` per seed, x and y in [0, 1]. Total = (P@1 + P@4) / 2 per seed
    (method.md §6), then averaged. Cells are percent, "mean ± sample std". ``diff=(treatment, baseline)`` adds a
    row "treatment − baseline" with a Welch t-interval per column (``welch_diff``); both must be in ``per_seed``.
    None leaves the row out.
    """
    if not per_seed:
        raise ValueError("per_seed must name at least one method")
    columns: dict[str, dict[str, list[float]]] = {}
    for method, seeds in per_seed.items():
        if not seeds:
            raise ValueError(f"per_seed[{method!r}] has no seeds")
        cols: dict[str, list[float]] = {c: [] for c in TABLE_COLUMNS}
        for s, res in enumerate(seeds):
            vals = []
            for key in ("p1", "p4"):
                if key not in res:
                    raise ValueError(f"per_seed[{method!r}][{s}] has no {key!r}")
                v = _number(res[key], f"per_seed[{method!r}][{s}][{key!r}]")
                if v is None or not 0 <= v <= 1:
                    raise ValueError(f"per_seed[{method!r}][{s}][{key!r}] must be a finite fraction in [0, 1], got {res[key]!r}")
                vals.append(100.0 * v)
            cols["P@1"].append(vals[0])
            cols["P@4"].append(vals[1])
            cols["Total"].append((vals[0] + vals[1]) / 2.0)
        columns[method] = cols
    rows = {
        m: {c: Cell(math.fsum(v) / len(v), _sample_std(v), len(v)) for c, v in cols.items()} for m, cols in columns.items()
    }
    if diff is None:
        return ResultsTable(rows)
    treat, base = diff
    for name in diff:
        if name not in columns:
            raise ValueError(f"diff names method {name!r}, which is not in per_seed ({', '.join(per_seed)})")
    cis = {c: welch_diff(columns[treat][c], columns[base][c], confidence) for c in TABLE_COLUMNS}
    return ResultsTable(rows, f"{treat} − {base}", cis)


# ---------------------------------------------------------------------------------------------------- HTML


def markdown_table_to_html(text: str) -> str:
    """A markdown pipe table (header row, separator row, body rows) as an escaped HTML <table>."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    if len(lines) < 2 or not all(ln.startswith("|") for ln in lines) or not re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", lines[1]):
        raise ValueError("table is neither HTML (starting with '<') nor a markdown pipe table")

    def cells(line: str) -> list[str]:
        parts = re.split(r"(?<!\\)\|", line.strip().strip("|"))
        return [html.escape(p.strip().replace("\\|", "|")) for p in parts]

    head = "".join(f"<th>{c}</th>" for c in cells(lines[0]))
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in cells(ln)) + "</tr>" for ln in lines[2:])
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


_REPORT_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;max-width:1100px;
color:#222;padding:0 1em}
h1{font-size:1.6em;border-bottom:2px solid #ddd;padding-bottom:.3em}
table{border-collapse:collapse;margin:1em 0;font-variant-numeric:tabular-nums}
th,td{border:1px solid #ccc;padding:.35em .8em;text-align:right}
th:first-child,td:first-child{text-align:left}
thead th{background:#f2f2f2}
figure{display:inline-block;margin:.5em;vertical-align:top}
figure img{max-width:520px;border:1px solid #eee}
figcaption{font-size:.85em;color:#555;text-align:center}
.notes p{line-height:1.45}
"""


def render_report(
    title: str,
    tables: Sequence[str],
    images: Sequence[str | os.PathLike[str]],
    notes: str,
    out_path: str | os.PathLike[str],
) -> Path:
    """Write a self-contained report.html: inline CSS, PNGs embedded as base64 data URIs, no external assets.

    tables: HTML strings (starting with "<", inserted verbatim: callers pass trusted output such as
    ``ResultsTable.to_html()``) or markdown pipe tables (converted, cells escaped). images: PNG files, captioned
    with the file stem. notes: plain text; blank lines separate paragraphs; escaped.
    """
    parts = [f"<h1>{html.escape(title)}</h1>"]
    for i, table in enumerate(tables):
        stripped = table.strip()
        try:
            parts.append(stripped if stripped.startswith("<") else markdown_table_to_html(stripped))
        except ValueError as e:
            raise ValueError(f"tables[{i}]: {e}") from None
    for img in images:
        data = Path(img).read_bytes()
        if not data.startswith(PNG_MAGIC):
            raise ValueError(f"images: {img} is not a PNG file")
        uri = "data:image/png;base64," + base64.b64encode(data).decode("ascii")
        name = html.escape(Path(img).stem)
        parts.append(f'<figure><img src="{uri}" alt="{name}"><figcaption>{name}</figcaption></figure>')
    if notes.strip():
        paras = [p.strip() for p in re.split(r"\n\s*\n", notes) if p.strip()]
        parts.append('<div class="notes">' + "".join(f"<p>{html.escape(p)}</p>" for p in paras) + "</div>")
    page = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{_REPORT_CSS}</style></head>\n<body>\n"
        + "\n".join(parts)
        + "\n</body></html>\n"
    )
    return atomic_write_text(out_path, page)
