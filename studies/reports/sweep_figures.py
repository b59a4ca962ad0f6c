"""The sweep's figures: the stability heat map (stable fraction per method x learning rate) and the pi-vs-beta
scatter, drawn as ``ictrl.experiments.reports.figures`` draws the curves (plain axes, a style per method, the
caption in the PNG's metadata). Heat-map text is coloured by the cell's luminance and its codes are explained on the
figure."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from ictrl.experiments.reports.figures import Runs, method_styles, number, save_figure
from studies.reports.outcomes import stable_fraction

LABEL_CODES = {"collapsed": "C", "exploded": "E", "degraded": "D", "unrewarded": "U"}


# ---------------------------------------------------------------------------------------------------- heat map


def _heat_cells(labels: Mapping[str, Mapping[float, Sequence[str]]], lrs: list[float]
                ) -> tuple[list[list[float]], list[list[str]]]:
    grid = [[math.nan] * len(lrs) for _ in labels]
    text = [[""] * len(lrs) for _ in labels]
    for i, m in enumerate(labels):
        for lr, seq in labels[m].items():
            j, seq = lrs.index(float(lr)), list(seq)
            grid[i][j] = stable_fraction(seq)
            others = " ".join(f"{seq.count(x)}{code}" for x, code in LABEL_CODES.items() if x in seq)
            text[i][j] = f"{seq.count('stable')}/{len(seq)}" + (f"\n{others}" if others else "")
    return grid, text


def _text_colour(rgba: Sequence[float]) -> str:
    """Black on light cells, white on dark ones (WCAG relative luminance of the sRGB colour)."""
    lin = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in rgba[:3]]
    return "black" if 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2] > 0.179 else "white"


HEATMAP_LEGEND = ("cell: stable seeds / seeds at that learning rate; below it the other outcomes: "
                  "C = collapsed, E = exploded, D = degraded, U = unrewarded; grey = not run")


def plot_stability_heatmap(labels: Mapping[str, Mapping[float, Sequence[str]]], out_path: str | os.PathLike[str],
                           title: str = "Stable fraction per method and learning rate") -> Path:
    """Heat map of the stable fraction per method (rows) x learning rate (columns), cells annotated "k/n" (stable
    seeds / seeds) over the counts of the other labels ("1E 1D": one exploded, one degraded; C = collapsed), the
    codes explained under the axes.

    labels: method -> lr -> outcome labels of its seeds (``outcomes.label_run``). A missing cell is grey.
    """
    import numpy as np
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    if not labels:
        raise ValueError("labels must name at least one method")
    methods = list(labels)
    lrs = sorted({float(lr) for cells in labels.values() for lr in cells})
    if not lrs:
        raise ValueError("labels: no learning rate has any label")
    grid, text = _heat_cells(labels, lrs)
    cmap = colormaps["RdYlGn"].with_extremes(bad="#cccccc")
    fig = Figure(figsize=(max(5.0, 1.6 + 1.1 * len(lrs)), 1.6 + 0.55 * len(methods)))
    ax = fig.add_subplot()
    im = ax.imshow(np.ma.masked_invalid(np.array(grid, dtype=float)), cmap=cmap, vmin=0, vmax=1, aspect="auto")
    for i in range(len(methods)):
        for j in range(len(lrs)):
            if text[i][j]:
                ax.text(j, i, text[i][j], ha="center", va="center", fontsize=9,
                        color=_text_colour(cmap(grid[i][j])), fontweight="bold")
    ax.set_xticks(range(len(lrs)), [f"{lr:g}" for lr in lrs])
    ax.set_yticks(range(len(methods)), methods)
    ax.set_xlabel("learning rate")
    ax.set_title(title, fontsize=10)
    fig.colorbar(im, ax=ax, label="fraction of seeds stable")
    fig.text(0.01, -0.02, HEATMAP_LEGEND.replace("; below", ";\nbelow"), fontsize=8, va="top", color="#333333")
    return save_figure(fig, Path(out_path), f"{title}. {HEATMAP_LEGEND[0].upper()}{HEATMAP_LEGEND[1:]}.")


# ---------------------------------------------------------------------------------------------------- pi vs beta


def _points(runs: Runs, x_key: str, y_key: str) -> dict[str, tuple[list[float], list[float]]]:
    points: dict[str, tuple[list[float], list[float]]] = {}
    for method, seeds in runs.items():
        xs, ys = [], []
        for s, records in enumerate(seeds):
            for i, rec in enumerate(records):
                where = f"runs[{method!r}][{s}][{i}]"
                x = number(rec.get(x_key), f"{where}[{x_key!r}]")
                y = number(rec.get(y_key), f"{where}[{y_key!r}]")
                if x is not None and y is not None:
                    xs.append(x)
                    ys.append(y)
        if xs:
            points[method] = (xs, ys)
    return points


def _fitted(values: list[float], pad: float = 0.05, least: float = 0.02) -> tuple[float, float]:
    """An axis range around ``values`` in [0, 1]: their span plus ``pad`` of it on each side, at least ``least``
    wide."""
    lo, hi = min(values), max(values)
    margin = max((hi - lo) * pad, (least - (hi - lo)) / 2, 0.0)
    return max(0.0, lo - margin), min(1.0, hi + margin)


def plot_prob_vs_purity(runs: Runs, out_path: str | os.PathLike[str], prob_key: str = "ictrl/prob/selected",
                        purity_key: str = "ictrl/purity/selected") -> Path | None:
    """Scatter of the selected tokens' mean probability pi against purity beta, one colour and marker per method.

    Each point is one logged step of one seed. The dashed diagonal is pi = beta: by the paper's H2 argument
    (docs/method.md §3) updates on tokens above it push toward entropy collapse, below it toward explosion. The default
    ``purity_key`` is the purity at the selected positions, the beta the theory compares pi with; pass
    ``"ictrl/purity/all"`` for the batch mean. Returns None when no record carries both keys.
    """
    from matplotlib.figure import Figure

    points = _points(runs, purity_key, prob_key)
    if not points:
        return None
    styles = method_styles(list(runs))
    where = "selected tokens" if purity_key.endswith("/selected") else "all tokens"
    fig = Figure(figsize=(5.2, 4.6))
    ax = fig.add_subplot()
    # Axes fitted to the points (both quantities live in [0, 1], but a run's steps cluster in a small corner of it).
    xlo, xhi = _fitted([x for xs, _ in points.values() for x in xs])
    ylo, yhi = _fitted([y for _, ys in points.values() for y in ys])
    lo, hi = min(xlo, ylo), max(xhi, yhi)
    ax.plot([lo, hi], [lo, hi], ls="--", color="grey", lw=1, label="π = β")
    for method, (xs, ys) in points.items():
        st = styles[method]
        ax.scatter(xs, ys, s=14, alpha=0.45, color=st["color"], marker=st["marker"], label=method)
        mx, my = math.fsum(xs) / len(xs), math.fsum(ys) / len(ys)
        ax.scatter([mx], [my], s=110, marker=st["marker"], color=st["color"], edgecolors="black", linewidths=1.2)
    ax.set_xlim(xlo, xhi)
    ax.set_ylim(ylo, yhi)
    ax.set_xlabel(f"purity β = Σ p² of the next-token distribution ({where})")
    ax.set_ylabel("mean probability π of the selected tokens")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    caption = ("Selected-token probability π against purity β: one small point per logged step and run, one large "
               "outlined point per method (its mean); above the dashed line π > β, below it π < β")
    return save_figure(fig, Path(out_path), caption)
