"""Report pieces: curve aggregation and PNGs, results table vs hand computation, report.html."""

from __future__ import annotations

import base64
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import scipy.stats

from ictrl.experiments.reports.figures import (
    DEFAULT_CURVE_KEYS,
    aggregate_curves,
    plot_curves,
)
from ictrl.experiments.reports.report import PNG_MAGIC, markdown_table_to_html, render_report, results_table
from ictrl.experiments.reports.stats_tests import welch_diff
from ictrl.files import load_metrics


def synthetic_runs(seeds: int = 3, steps: int = 30) -> dict[str, list[list[dict]]]:
    rng = np.random.default_rng(0)
    runs: dict[str, list[list[dict]]] = {}
    for m, (slope, h_end) in {"grpo": (0.002, 0.9), "ict": (0.006, 0.2)}.items():
        runs[m] = []
        for _ in range(seeds):
            recs = []
            for t in range(steps):
                h = 0.3 + (h_end - 0.3) * t / steps + rng.normal(0, 0.02)
                recs.append({
                    "step": t, "reward": 0.15 + slope * t + rng.normal(0, 0.02), "ictrl/h1/all": h,
                    "ictrl/h2/all": 0.8 * h, "ictrl/purity/all": math.exp(-0.8 * h), "ictrl/selected_frac": 0.1,
                    "ictrl/prob/selected": 0.2 + rng.normal(0, 0.03), "ictrl/purity/selected": 0.3 + rng.normal(0, 0.03),
                })
            runs[m].append(recs)
    return runs


def assert_png(path: Path, min_bytes: int = 5000) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert len(data) > min_bytes


def test_aggregate_curves_matches_numpy() -> None:
    runs = synthetic_runs()
    runs["ict"][1] = [r for r in runs["ict"][1] if r["step"] != 7]  # one seed skipped step 7
    vals = {s: [] for s in range(30)}
    for seed in runs["ict"]:
        for r in seed:
            vals[r["step"]].append(r["reward"])
    for band in ("minmax", "std"):
        c = aggregate_curves(runs, "reward", band)["ict"]
        assert c.steps == [float(s) for s in range(30)]
        assert c.n[7] == 2 and c.n[0] == 3
        ref = [np.array(vals[s], dtype=np.float64) for s in range(30)]
        np.testing.assert_allclose(c.mean, [v.mean() for v in ref], rtol=0, atol=1e-15)
        if band == "minmax":
            np.testing.assert_array_equal(c.lo, [v.min() for v in ref])
            np.testing.assert_array_equal(c.hi, [v.max() for v in ref])
        else:
            np.testing.assert_allclose(c.hi, [v.mean() + v.std(ddof=1) for v in ref], rtol=0, atol=1e-14)
    assert aggregate_curves(runs, "no/such/key") == {}
    with pytest.raises(ValueError, match="band"):
        aggregate_curves(runs, "reward", "iqr")
    runs["grpo"][0][3]["reward"] = "0.2"
    with pytest.raises(ValueError, match=r"runs\['grpo'\]\[0\]\[3\]\['reward'\]"):
        aggregate_curves(runs, "reward")


@pytest.fixture(scope="module")
def curve_pngs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    # DEFAULT_CURVE_KEYS includes ictrl/h1/selected, which no synthetic run logs
    return plot_curves(synthetic_runs(), DEFAULT_CURVE_KEYS, tmp_path_factory.mktemp("plots"))


def test_plot_curves_writes_pngs_and_skips_missing_keys(curve_pngs: list[Path], tmp_path: Path) -> None:
    assert len(curve_pngs) == len(DEFAULT_CURVE_KEYS) - 2  # no synthetic run logs h1/selected or eval/*
    assert [p.name for p in curve_pngs] == [
        "curve_reward.png", "curve_h1_entropy_all_tokens_nats.png", "curve_h2_renyi_entropy_all_tokens_nats.png",
        "curve_purity_beta_all_tokens.png", "curve_selected_fraction.png",
    ]
    for p in curve_pngs:
        assert_png(p)
    assert not list(curve_pngs[0].parent.glob(".*tmp"))  # atomic writes leave no temp files
    assert plot_curves(synthetic_runs(), {"x": "missing"}, tmp_path) == []


def test_results_table_matches_hand_computation() -> None:
    per_seed = {
        "grpo": [{"p1": 0.10, "p4": 0.20}, {"p1": 0.12, "p4": 0.22}, {"p1": 0.08, "p4": 0.21}],
        "ict": [{"p1": 0.14, "p4": 0.25}, {"p1": 0.15, "p4": 0.27}, {"p1": 0.13, "p4": 0.24}, {"p1": 0.16, "p4": 0.26}],
        "random10": [{"p1": 0.11, "p4": 0.22}, {"p1": 0.12, "p4": 0.20}, {"p1": 0.10, "p4": 0.23}],
    }
    table = results_table(per_seed)
    for method, seeds in per_seed.items():
        p1 = 100 * np.array([s["p1"] for s in seeds], dtype=np.float64)
        p4 = 100 * np.array([s["p4"] for s in seeds], dtype=np.float64)
        for col, ref in (("P@1", p1), ("P@4", p4), ("Total", (p1 + p4) / 2)):
            cell = table.rows[method][col]
            assert cell.n == len(seeds)
            assert cell.mean == pytest.approx(ref.mean(), abs=1e-12)
            assert cell.std == pytest.approx(ref.std(ddof=1), abs=1e-12)
    # Welch interval, recomputed naively for Total
    a = np.array([50 * (s["p1"] + s["p4"]) for s in per_seed["ict"]])
    b = np.array([50 * (s["p1"] + s["p4"]) for s in per_seed["random10"]])
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    d = table.diff["Total"]
    assert d.mean == pytest.approx(a.mean() - b.mean(), abs=1e-12)
    assert d.df == pytest.approx(df, rel=1e-12)
    half = (d.hi - d.lo) / 2
    assert half / math.sqrt(va + vb) == pytest.approx(float(scipy.stats.t.ppf(0.975, df)), rel=1e-9)
    md = table.to_markdown()
    assert md.splitlines()[0] == "| method | P@1 | P@4 | Total |"
    assert f"| grpo (n=3) | {100 * 0.10:.2f} ± {2.00:.2f} |" in md  # P@1 = 10, 12, 8 -> 10.00 ± 2.00
    assert "ict − random10 (95% Welch CI)" in md
    assert f"[{d.lo:+.2f}, {d.hi:+.2f}]" in md


def test_results_table_edge_cases() -> None:
    one = results_table({"ict": [{"p1": 0.5, "p4": 0.7}], "random10": [{"p1": 0.4, "p4": 0.6}]})
    assert str(one.rows["ict"]["Total"]) == "60.00 ± n/a"
    assert one.diff["P@1"].lo is None and str(one.diff["P@1"]) == "+10.00 (CI n/a)"
    assert results_table({"grpo": [{"p1": 0.1, "p4": 0.2}]}, diff=None).diff is None
    with pytest.raises(ValueError, match="random10"):
        results_table({"ict": [{"p1": 0.1, "p4": 0.2}]})
    with pytest.raises(ValueError, match=r"per_seed\['ict'\]\[0\]\['p4'\]"):
        results_table({"ict": [{"p1": 0.1, "p4": 14.0}]}, diff=None)
    with pytest.raises(ValueError, match="'p4'"):
        results_table({"ict": [{"p1": 0.1}]}, diff=None)
    same = welch_diff([1.0, 1.0], [0.5, 0.5])
    assert (same.lo, same.hi) == (0.5, 0.5)


def test_render_report_is_self_contained(curve_pngs: list[Path], tmp_path: Path) -> None:
    images = curve_pngs
    table = results_table({"ict": [{"p1": 0.2, "p4": 0.4}, {"p1": 0.3, "p4": 0.5}],
                           "random10": [{"p1": 0.1, "p4": 0.3}, {"p1": 0.2, "p4": 0.3}]})
    md = "| a | b |\n|---|---|\n| <x> & y | 1 |"
    out = render_report("ICT vs <baselines>", [table.to_html(), md], images, "first <script>alert(1)</script>\n\nsecond",
                        tmp_path / "r" / "report.html")
    text = out.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>")
    srcs = re.findall(r'<img src="([^"]*)"', text)
    assert len(srcs) == len(images)
    for src, path in zip(srcs, images):
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1]) == path.read_bytes()
    assert not re.search(r'(src|href)="(?!data:)', text)  # no external assets
    assert "<title>ICT vs &lt;baselines&gt;</title>" in text
    assert "<script>" not in text and "&lt;script&gt;" in text
    assert "<td>&lt;x&gt; &amp; y</td>" in text
    assert text.count("<table>") == 2 and text.count("<p>") == 2
    with pytest.raises(ValueError, match="not a PNG"):
        (tmp_path / "x.png").write_text("nope")
        render_report("t", [], [tmp_path / "x.png"], "", tmp_path / "bad.html")
    with pytest.raises(ValueError, match=r"tables\[0\]"):
        render_report("t", ["just words"], [], "", tmp_path / "bad.html")


def test_markdown_table_escapes_pipes() -> None:
    out = markdown_table_to_html("| m | v |\n|:--|--:|\n| a\\|b | 1 |")
    assert "<td>a|b</td><td>1</td>" in out


def test_load_metrics(tmp_path: Path) -> None:
    p = tmp_path / "metrics.jsonl"
    p.write_text(json.dumps({"step": 0, "reward": 0.1}) + "\n\n" + json.dumps({"step": 1}) + "\n")
    assert load_metrics(p) == [{"step": 0, "reward": 0.1}, {"step": 1}]
    p.write_text('{"step": 0}\n{oops\n')
    with pytest.raises(ValueError, match="metrics.jsonl:2"):
        load_metrics(p)


def test_axes_have_no_offset_and_tiny_differences_stay_small(tmp_path: Path) -> None:
    from matplotlib.figure import Figure

    from ictrl.experiments.reports.figures import MIN_RELATIVE_SPAN, _plain_axes

    fig = Figure()
    ax = fig.add_subplot()
    ax.plot([1, 2, 3], [5.549401, 5.549405, 5.549402])
    _plain_axes(ax, integer_x=True)
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig).draw()
    assert ax.yaxis.get_major_formatter().get_offset() == ""  # no "1e-5+5.549" above the axis
    lo, hi = ax.get_ylim()
    assert hi - lo >= MIN_RELATIVE_SPAN * 5.5 * 0.999
    assert all(float(t.get_text().replace("−", "-")) == round(float(t.get_text().replace("−", "-")))
               for t in ax.get_xticklabels() if t.get_text())  # whole training steps


def test_curve_captions_and_bands_follow_the_seed_count(tmp_path: Path) -> None:
    from ictrl.experiments.reports.figures import png_caption

    runs = synthetic_runs(seeds=3)
    (many,) = plot_curves(runs, {"reward": "reward"}, tmp_path / "many")
    assert png_caption(many) == "reward per training step: mean over 3 seeds, shaded band min–max over seeds"
    single = {m: seeds[:1] for m, seeds in runs.items()}
    (one,) = plot_curves(single, {"reward": "reward"}, tmp_path / "one")
    assert png_caption(one) == "reward per training step, one run per line"
    page = render_report("t", [], [one, (many, "my own caption")], "", tmp_path / "r.html").read_text()
    assert "<figcaption>reward per training step, one run per line</figcaption>" in page
    assert "<figcaption>my own caption</figcaption>" in page
    assert "curve_reward</figcaption>" not in page  # no file slugs as captions


def test_note_answer_and_caveats_come_before_the_tables(tmp_path: Path) -> None:
    table = "| a | b |\n|---|---|\n| 1 | 2 |"
    page = render_report("t", [("Heading", table)], [], "how it was made", tmp_path / "r.html",
                         note="my note", answer="the answer", caveats=["one seed"]).read_text()
    order = [page.index(x) for x in ("my note", "the answer", "one seed", "<h2>Heading</h2>", "<table>",
                                     "how it was made")]
    assert order == sorted(order)


def test_committed_report_pages_carry_no_local_paths() -> None:
    pages = sorted((Path(__file__).resolve().parents[3] / "docs" / "results").glob("*.html"))
    assert pages
    for page in pages:
        text = page.read_text(encoding="utf-8")
        found = re.findall(r"(?:/root|/home|/tmp|/Users)/[^\s<\"']+", text)
        assert not found, f"{page.name}: local paths {found[:3]}"
