"""The report figures: training curves per method (mean with a min-max or std band over seeds).

Inputs are plain Python data (see ``ictrl.experiments.reports.report``). Every figure is drawn for a reader at a glance:
plain axis labels with no offset notation (``1e-5+5.549`` makes a tiny difference look dramatic), a line style
and marker per method so that coinciding lines stay visible, a band only where there are >= 2 seeds. Each PNG
carries its human caption in its ``Description`` metadata, which ``report.render_report`` shows under it.

Figures use matplotlib's object API on the Agg canvas (no pyplot, no global backend state); files are written
atomically.
"""

from __future__ import annotations

import io
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ictrl.files import atomic_write_bytes

Runs = Mapping[str, Sequence[Sequence[Mapping[str, Any]]]]

DEFAULT_CURVE_KEYS: dict[str, str] = {
    "reward": "reward",
    "H1 entropy, all tokens (nats)": "ictrl/h1/all",
    "H1 entropy, selected tokens (nats)": "ictrl/h1/selected",
    "H2 Renyi entropy, all tokens (nats)": "ictrl/h2/all",
    "purity beta, all tokens": "ictrl/purity/all",
    "selected fraction": "ictrl/selected_frac",
    "held-out pass@1 (evaluated during training)": "eval/avg/pass@1",
}
LINESTYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def save_figure(fig: Any, path: Path, caption: str) -> Path:
    """PNG at 110 dpi with ``caption`` in its Description metadata, written atomically."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight", metadata={"Description": caption})
    return atomic_write_bytes(path, buf.getvalue())


def png_caption(path: str | os.PathLike[str]) -> str | None:
    """The Description text a figure of this module stored in its PNG; None if there is none."""
    from PIL import Image

    with Image.open(path) as img:
        text = getattr(img, "text", {}) or img.info
        value = text.get("Description")
    return str(value) if value else None


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") or "curve"


def curve_filename(name: str) -> str:
    """The file :func:`plot_curves` writes the curve ``name`` to."""
    return f"curve_{_slug(name)}.png"


MIN_RELATIVE_SPAN = 0.02  # a y range narrower than 2% of the values' magnitude is widened to it


def _plain_axes(ax: Any, integer_x: bool = False) -> None:
    """Tick labels read as the values themselves (no offset, no multiplier), and a y range no narrower than
    ``MIN_RELATIVE_SPAN`` of the values' magnitude, so that a difference in the sixth digit looks as small as it
    is instead of filling the axis."""
    from matplotlib.ticker import MaxNLocator, ScalarFormatter

    for axis in (ax.xaxis, ax.yaxis):
        fmt = ScalarFormatter(useOffset=False)
        fmt.set_scientific(False)
        axis.set_major_formatter(fmt)
    if integer_x:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    lo, hi = ax.get_ylim()
    need = MIN_RELATIVE_SPAN * max(abs(lo), abs(hi))
    if hi - lo < need:
        mid = (lo + hi) / 2
        ax.set_ylim(mid - need / 2, mid + need / 2)


def method_styles(methods: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Colour, line style and marker per method: lines that coincide still show each method."""
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    return {m: {"color": cmap(i % 10), "ls": LINESTYLES[i % len(LINESTYLES)], "marker": MARKERS[i % len(MARKERS)]}
            for i, m in enumerate(methods)}


def number(value: Any, where: str) -> float | None:
    """A finite float, None for a missing or non-finite value; anything else is a ValueError naming ``where``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where} must be a number, got {value!r}")
    return float(value) if math.isfinite(value) else None


# ---------------------------------------------------------------------------------------------------- curves


def _collect(runs: Runs, key: str) -> dict[str, dict[float, list[float]]]:
    """method -> step -> one value per seed that logged ``key`` at that step (a re-logged step keeps the last)."""
    out: dict[str, dict[float, list[float]]] = {}
    for method, seeds in runs.items():
        per_step: dict[float, list[float]] = {}
        for s, records in enumerate(seeds):
            seen: dict[float, float] = {}
            for i, rec in enumerate(records):
                where = f"runs[{method!r}][{s}][{i}]"
                value = number(rec.get(key), f"{where}[{key!r}]")
                if value is None:
                    continue
                step = number(rec.get("step", i), f"{where}['step']")
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


def aggregate_curves(runs: Runs, key: str, band: str = "minmax") -> dict[str, CurveBand]:
    """method -> CurveBand of ``key`` across seeds; methods that never logged ``key`` are absent.

    band: "minmax" (min and max over seeds) or "std" (mean -+ sample std; zero width where one seed logged the
    step). A record without "step" uses its index in the run.
    """
    from ictrl.experiments.reports.stats_tests import sample_std

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
            sd = [sample_std(v) or 0.0 for v in vals]
            lo, hi = [m - d for m, d in zip(mean, sd)], [m + d for m, d in zip(mean, sd)]
        out[method] = CurveBand(steps, mean, lo, hi, [len(v) for v in vals])
    return out


def _curve_caption(name: str, data: Mapping[str, CurveBand], runs: Runs, band: str) -> str:
    seeds = {len(runs[m]) for m in data}
    if max(seeds) < 2:
        return f"{name} per training step, one run per line"
    count = f"{seeds.pop()} seeds" if len(seeds) == 1 else "seeds (n per method in the legend)"
    spread = "min–max" if band == "minmax" else "±1 standard deviation"
    return f"{name} per training step: mean over {count}, shaded band {spread} over seeds"


def plot_curves(runs: Runs, keys: Mapping[str, str] | None = None, out_dir: str | os.PathLike[str] = ".",
                band: str = "minmax") -> list[Path]:
    """One PNG per curve (display name -> metrics key; default ``DEFAULT_CURVE_KEYS``) with a line per method.

    runs: method -> list of runs (one per seed), each a list of metrics records. Each line is the mean over the
    seeds that logged that step; a band (min-max over seeds, or mean +- std: ``aggregate_curves``) is drawn only
    for methods with >= 2 seeds. Curves no run logged are skipped. Returns ``out_dir/curve_<slug>.png`` in the
    order of ``keys``.
    """
    if not runs:
        raise ValueError("runs must name at least one method")
    from matplotlib.figure import Figure

    keys = DEFAULT_CURVE_KEYS if keys is None else keys
    styles = method_styles(list(runs))
    alpha = max(0.06, 0.3 / len(runs))  # overlapping bands of many methods stay light, the lines stay visible
    paths = []
    for name, key in keys.items():
        data = aggregate_curves(runs, key, band)
        if not data:
            continue
        fig = Figure(figsize=(6.4, 3.8))
        ax = fig.add_subplot()
        for method, c in data.items():
            st, n = styles[method], len(runs[method])
            label = method if n < 2 else f"{method} (n={n})"
            ax.plot(c.steps, c.mean, color=st["color"], ls=st["ls"], marker=st["marker"], ms=4,
                    markevery=max(1, len(c.steps) // 12), label=label, lw=1.6)
            if n >= 2:
                ax.fill_between(c.steps, c.lo, c.hi, color=st["color"], alpha=alpha, lw=0)
        ax.set_xlabel("training step")
        ax.set_ylabel(name)
        _plain_axes(ax, integer_x=True)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        paths.append(save_figure(fig, Path(out_dir) / curve_filename(name),
                                 _curve_caption(name, data, runs, band)))
    return paths
