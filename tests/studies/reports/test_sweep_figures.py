"""The sweep's figures: the stability heat map and the pi-vs-beta scatter."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ictrl.experiments.reports.report import PNG_MAGIC
from studies.reports.sweep_figures import plot_prob_vs_purity, plot_stability_heatmap


def synthetic_runs(seeds: int = 3, steps: int = 30) -> dict[str, list[list[dict]]]:
    """Two methods' logged steps with the selected tokens' probability and purity."""
    rng = np.random.default_rng(0)
    return {m: [[{"step": t, "ictrl/prob/selected": centre + rng.normal(0, 0.03),
                  "ictrl/purity/selected": 0.3 + rng.normal(0, 0.03)} for t in range(steps)] for _ in range(seeds)]
            for m, centre in {"grpo": 0.4, "ict": 0.2}.items()}


def assert_png(path: Path, min_bytes: int = 5000) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert len(data) > min_bytes


def test_stability_heatmap_and_prob_vs_purity(tmp_path: Path) -> None:
    labels = {
        "grpo": {1e-4: ["stable", "stable"], 5e-4: ["exploded", "stable"], 1e-3: ["exploded", "exploded"]},
        "ict": {1e-4: ["stable", "stable"], 5e-4: ["stable", "stable"], 1e-3: ["stable", "collapsed"]},
        "random10": {1e-4: ["stable"]},  # missing cells are allowed (grey)
    }
    assert_png(plot_stability_heatmap(labels, tmp_path / "heat.png"))
    with pytest.raises(ValueError, match="unknown label"):
        plot_stability_heatmap({"grpo": {1e-4: ["ok"]}}, tmp_path / "bad.png")
    runs = synthetic_runs()
    assert_png(plot_prob_vs_purity(runs, tmp_path / "pb.png"))
    assert plot_prob_vs_purity(runs, tmp_path / "none.png", purity_key="missing") is None
    assert not (tmp_path / "none.png").exists()


def test_heatmap_text_contrast_and_legend(tmp_path: Path) -> None:
    from matplotlib import colormaps

    from ictrl.experiments.reports.figures import png_caption
    from studies.reports.sweep_figures import HEATMAP_LEGEND, _text_colour

    cmap = colormaps["RdYlGn"]
    assert _text_colour(cmap(1.0)) == "white" and _text_colour(cmap(0.0)) == "white"  # dark green, dark red
    assert _text_colour(cmap(0.5)) == "black"  # pale yellow
    path = plot_stability_heatmap({"ict": {1e-4: ["stable", "exploded"]}}, tmp_path / "h.png")
    assert "C = collapsed, E = exploded, D = degraded" in png_caption(path)
    assert "C = collapsed" in HEATMAP_LEGEND
