"""Open report.html and the inspect page in headless Chromium and check the screenshots are real renderings.

Needs the Debian package ``chromium`` (``apt-get install -y chromium``); skipped when it is absent. Set
ICTRL_SCREENSHOT_DIR to keep the screenshots for a human look.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from ictrl.experiments.inspect import H_RGB, U_RGB, Rollout, render_inspect_html
from ictrl.experiments.reports.figures import plot_curves
from ictrl.experiments.reports.report import render_report, results_table
from studies.reports.sweep_figures import plot_prob_vs_purity, plot_stability_heatmap

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [pytest.mark.integration, pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")]


def screenshot(page: Path, tmp_path: Path, name: str) -> np.ndarray:
    """Render ``page`` at 1200x900 and return the screenshot as a float [H, W, C] array in [0, 1]."""
    import matplotlib.image

    png = tmp_path / f"{name}.png"
    cmd = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
        f"--user-data-dir={tmp_path / ('profile-' + name)}", f"--screenshot={png}", "--window-size=1200,900",
        page.resolve().as_uri(),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert png.exists(), f"chromium wrote no screenshot (rc {proc.returncode}): {proc.stderr[-2000:]}"
    keep = os.environ.get("ICTRL_SCREENSHOT_DIR")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(png, Path(keep) / png.name)
    img = matplotlib.image.imread(png)
    assert img.shape[:2] == (900, 1200)
    return img[..., :3].astype(np.float64)


def assert_not_blank(img: np.ndarray) -> None:
    assert img.std() > 0.05
    non_white = (img < 0.9).any(-1).mean()
    assert non_white > 0.02, f"only {non_white:.1%} of the pixels are not white"


def near(img: np.ndarray, rgb: tuple[int, int, int], tol: float = 0.08) -> float:
    """Fraction of pixels within ``tol`` (per channel) of ``rgb``."""
    return float((np.abs(img - np.array(rgb) / 255.0) < tol).all(-1).mean())


def synthetic_runs(seeds: int = 3, steps: int = 30) -> dict[str, list[list[dict]]]:
    rng = np.random.default_rng(0)
    runs: dict[str, list[list[dict]]] = {}
    for m, (slope, h_end) in {"grpo": (0.002, 0.9), "ict": (0.006, 0.2)}.items():
        runs[m] = [
            [{"step": t, "reward": 0.15 + slope * t + rng.normal(0, 0.02),
              "ictrl/h1/all": 0.3 + (h_end - 0.3) * t / steps + rng.normal(0, 0.02),
              "ictrl/prob/selected": 0.2 + rng.normal(0, 0.03), "ictrl/purity/selected": 0.3 + rng.normal(0, 0.03)}
             for t in range(steps)]
            for _ in range(seeds)
        ]
    return runs


def demo_rollouts() -> list[Rollout]:
    rng = np.random.default_rng(0)
    out = []
    for i in range(6):
        text = f"4*5=20;23+20=4{i};#4{i}\n" if i % 2 else f"23 + 20 = 4{i} & <done>"
        n = len(text)
        u = rng.uniform(0, 0.3, n)
        u[rng.integers(0, n)] = 0.6  # one clearly unique token per row gets the full colour
        h = rng.uniform(0, 1.5, n)
        sel = np.zeros(n, dtype=bool)
        sel[np.argsort(-u, kind="stable")[: max(1, n // 10)]] = True
        out.append(Rollout("Q:23+4*5=A:", list(text), u.tolist(), h.tolist(), rng.uniform(0, 1, n).tolist(),
                           sel.tolist(), reward=float(i % 2)))
    return out


def test_inspect_page_renders_both_views(tmp_path: Path) -> None:
    rollouts = demo_rollouts()
    u_page = render_inspect_html(rollouts, tmp_path / "inspect_u.html", meta={"model": "demo"}, view="u")
    h_page = render_inspect_html(rollouts, tmp_path / "inspect_h.html", meta={"model": "demo"}, view="h")
    img_u = screenshot(u_page, tmp_path, "inspect_u")
    img_h = screenshot(h_page, tmp_path, "inspect_h")
    for img in (img_u, img_h):
        assert_not_blank(img)
    # the CSS-variable colouring took effect: full-strength u colour in the u view, H1 colour in the entropy view
    assert near(img_u, U_RGB) > 1e-4 and near(img_u, H_RGB) < 1e-5
    assert near(img_h, H_RGB) > 1e-4 and near(img_h, U_RGB) < 1e-5


def test_report_renders_with_embedded_images(tmp_path: Path) -> None:
    runs = synthetic_runs()
    images = plot_curves(runs, {"reward": "reward", "H1 entropy (nats)": "ictrl/h1/all"}, tmp_path)
    labels = {"grpo": {1e-4: ["stable"] * 2, 1e-3: ["exploded"] * 2}, "ict": {1e-4: ["stable"] * 2, 1e-3: ["stable"] * 2}}
    images.append(plot_stability_heatmap(labels, tmp_path / "heat.png"))
    images.append(plot_prob_vs_purity(runs, tmp_path / "pb.png"))
    table = results_table({"ict": [{"p1": 0.2, "p4": 0.4}, {"p1": 0.3, "p4": 0.5}],
                           "random10": [{"p1": 0.1, "p4": 0.3}, {"p1": 0.2, "p4": 0.3}]})
    page = render_report("ictrl compare: demo", [table.to_html()], images, "Synthetic curves.", tmp_path / "report.html",
                         note="A note from the person who ran it.", answer="ict beats random10.", caveats=["2 seeds"])
    img = screenshot(page, tmp_path, "report")
    assert_not_blank(img)
    # the note's amber box and the answer's green box are drawn in the first screenful, above the table
    top = img[:300]
    assert near(top, (0xFF, 0xF8, 0xE1), tol=0.02) > 0.01 and near(top, (0xEE, 0xF6, 0xEE), tol=0.02) > 0.01
    # plot lines are drawn in matplotlib's tab10 colours: the embedded PNGs were decoded and shown
    assert near(img, (31, 119, 180), tol=0.06) > 1e-4
    assert near(img, (255, 127, 14), tol=0.06) > 1e-4
