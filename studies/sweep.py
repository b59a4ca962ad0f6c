"""``python -m studies sweep``: learning rate x method x seed stability study.

Every run is labelled collapsed / exploded / degraded / stable by ``outcomes.summarize_run`` against the base
model's reward (a run whose weights went non-finite, so that sampling failed, is exploded), with the rule set
``--thresholds`` names: ``v2`` (default) or ``v1``, see ``outcomes`` for when each was set (they are stored in
``sweep.json``). Labelling reads only the finished runs' files, so rerunning a finished sweep with other
``--thresholds`` relabels and re-renders it without training anything. The base reward is the base model's held-out P@1 sampled at the training temperature, i.e. its
expected training reward.

Writes into ``--output-dir``: ``lr<lr>/<method>/seed<k>/`` run directories (resumable, see ``grid``), ``base/``,
``sweep.json`` (settings, thresholds, base, every run's label, window means and P@1/P@4, per-method stable
fractions and widest stable range), ``stability.md``, ``stability_heatmap.png``, ``examples/curve_*.png`` (H1, H2,
purity and reward of one collapsed, one exploded and one stable run, where they exist), ``prob_vs_purity.png``
and ``report.html``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from ictrl.errors import UserError
from ictrl.experiments.grid import runner as grid
from ictrl.experiments.grid import cli as gridcli
from ictrl.experiments.reports import report
from ictrl.experiments.reports import figures
from ictrl.files import atomic_write_text
from studies.reports import sweep_figures
from studies.reports.outcomes import (
    PRESETS,
    OutcomeThresholds,
    describe_thresholds,
    stable_fraction,
    summarize_run,
    widest_stable_range,
)

DEFAULT_LRS = (1e-4, 2e-4, 5e-4, 1e-3, 2e-3)
# The example runs' curves: reward, the all-token entropies (the labels are read from these) and, when
# evaluated during training (--eval-every), held-out pass@1 (last, so a run without it drops only that plot).
EXAMPLE_KEYS = {name: key for name, key in figures.DEFAULT_CURVE_KEYS.items() if key == "reward" or key.endswith("/all")
                or key.startswith("eval/")}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    gridcli.add_common_arguments(parser, default_output="runs/sweep")
    parser.add_argument("--learning-rate", "--lrs", dest="lrs", default=",".join(f"{lr:g}" for lr in DEFAULT_LRS),
                        help="comma-separated learning rates (default: %(default)s)")
    parser.add_argument("--thresholds", choices=PRESETS, default="v2",
                        help="outcome rule set of studies.reports.outcomes (default: %(default)s)")
    parser.add_argument("--note", default="",
                        help="a line put at the top of stability.md and the report, and stored in sweep.json "
                             "(e.g. which data the thresholds were set on)")
    parser.add_argument("--seed-start", type=int, default=0,
                        help="first seed: runs use seeds seed_start .. seed_start + seeds - 1, so a fresh sweep "
                             "can use seeds no earlier sweep saw (default: %(default)s)")


def parse_lrs(text: str) -> list[float]:
    try:
        lrs = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--learning-rate: expected comma-separated numbers, got {text!r}") from None
    if not lrs or any(not (math.isfinite(lr) and lr > 0) for lr in lrs):
        raise UserError(f"--learning-rate: need positive finite learning rates, got {text!r}")
    return sorted(set(lrs))


def run(args: argparse.Namespace) -> int:
    from ictrl.files import check_output_dir

    check_output_dir(args.output_dir)  # before any run or model load
    methods = grid.parse_methods(args.methods)
    lrs = parse_lrs(args.lrs)
    specs = sweep_specs(methods, args.seeds, lrs, args.seed_start)
    thresholds = OutcomeThresholds.preset(args.thresholds)
    start = time.perf_counter()
    experiment = gridcli.make_experiment(args)
    out: Path = args.output_dir
    results = grid.run_grid(specs, out, experiment.runner, jobs=args.jobs)
    base = grid.cached_result(out / "base" / "result.json", lambda: experiment.eval_base(out / "base"))
    page = write_report(out, methods, lrs, specs, results, base, thresholds, experiment.settings,
                        time.perf_counter() - start, note=args.note)
    if experiment.settings.get("quick"):
        print(gridcli.PIPELINE_CHECK)
    print((out / "stability.md").read_text())
    print(f"wrote {page}", file=sys.stderr)
    return 0


def sweep_specs(methods: list[str], seeds: int, lrs: list[float], seed_start: int = 0) -> list[grid.RunSpec]:
    """``grid.grid_specs`` with seeds ``seed_start .. seed_start + seeds - 1`` (same order: seeds innermost)."""
    if seed_start < 0:
        raise UserError(f"--seed-start must be >= 0, got {seed_start}")
    return [s for s in grid.grid_specs(methods, seed_start + seeds, lrs) if s.seed >= seed_start]


def label_runs(out: Path, specs: list[grid.RunSpec], results: dict[grid.RunSpec, dict[str, Any]],
               base_reward: float, thresholds: OutcomeThresholds
               ) -> tuple[list[dict[str, Any]], dict[grid.RunSpec, list[dict[str, Any]]]]:
    """One row per run (spec, label, window means, P@1/P@4) and the runs' metrics records."""
    metrics = grid.load_grid_metrics(out, specs)
    rows = []
    for s in specs:
        diverged = results[s].get("diverged")
        summary = None
        if any(thresholds.entropy_key in r and thresholds.reward_key in r for r in metrics[s]):
            summary = dataclasses.asdict(summarize_run(metrics[s], base_reward, thresholds))
        elif not diverged:
            raise ValueError(f"{s.relpath}: metrics.jsonl has no {thresholds.entropy_key!r} / "
                             f"{thresholds.reward_key!r} record to label")
        # A run whose weights went non-finite is exploded whatever its last logged window says.
        label = "exploded" if diverged else summary["label"]  # type: ignore[index]
        rows.append({"method": s.method, "lr": s.lr, "seed": s.seed, "label": label, "summary": summary,
                     "diverged": bool(diverged), "p1": results[s]["p1"], "p4": results[s]["p4"],
                     "final_reward": results[s].get("final_reward"), "seconds": results[s]["seconds"]})
    return rows, metrics


def stability(rows: list[dict[str, Any]], methods: list[str], lrs: list[float]) -> dict[str, Any]:
    """Per method: labels per lr, stable fraction per lr, widest stable range (all seeds stable)."""
    out: dict[str, Any] = {}
    for m in methods:
        labels = {lr: [r["label"] for r in rows if r["method"] == m and r["lr"] == lr] for lr in lrs}
        labels = {lr: seq for lr, seq in labels.items() if seq}
        widest = widest_stable_range(labels) if labels else None
        out[m] = {"labels": {f"{lr:g}": seq for lr, seq in labels.items()},
                  "stable_fraction": {f"{lr:g}": stable_fraction(seq) for lr, seq in labels.items()},
                  "widest_stable_range": list(widest) if widest else None}
    return out


def _mean(values: list[float]) -> float:
    return math.fsum(values) / len(values)


def stability_markdown(rows: list[dict[str, Any]], stab: dict[str, Any], methods: list[str],
                       lrs: list[float]) -> tuple[str, str]:
    """(stable seeds per method x lr with the widest stable range, mean P@1 / P@4 per method x lr) as markdown."""
    head = "| method | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " | widest stable range |"
    lines = [head, "|" + "---|" * (len(lrs) + 2)]
    for m in methods:
        cells = []
        for lr in lrs:
            seq = stab[m]["labels"].get(f"{lr:g}", [])
            if not seq:
                cells.append("–")
                continue
            counts = ", ".join(f"{seq.count(x)} {x[0].upper()}" for x in ("collapsed", "exploded", "degraded", "unrewarded")
                               if seq.count(x))
            cells.append(f"{sum(x == 'stable' for x in seq)}/{len(seq)} stable" + (f" ({counts})" if counts else ""))
        widest = stab[m]["widest_stable_range"]
        cells.append("none" if widest is None else f"{widest[0]:g} – {widest[1]:g}")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    scores = ["| method | " + " | ".join(f"P@1 / P@4 at lr {lr:g}" for lr in lrs) + " |",
              "|" + "---|" * (len(lrs) + 1)]
    for m in methods:
        cells = []
        for lr in lrs:
            sel = [r for r in rows if r["method"] == m and r["lr"] == lr]
            cells.append(f"{100 * _mean([r['p1'] for r in sel]):.1f} / {100 * _mean([r['p4'] for r in sel]):.1f}"
                         if sel else "–")
        scores.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines), "\n".join(scores)


def pick_examples(rows: list[dict[str, Any]], labels: tuple[str, ...] = OutcomeThresholds().labels
                  ) -> dict[str, dict[str, Any] | None]:
    """One run per label: the lowest final entropy among collapsed, the highest among exploded, the lowest final
    reward among degraded, the highest final reward among stable; None where no run has the label."""
    picks: dict[str, dict[str, Any] | None] = {}
    for label in labels:
        cands = [r for r in rows if r["label"] == label and r["summary"] is not None]
        if not cands:
            picks[label] = None
        elif label == "collapsed":
            picks[label] = min(cands, key=lambda r: r["summary"]["entropy_last"])
        elif label == "exploded":
            picks[label] = max(cands, key=lambda r: r["summary"]["entropy_last"])
        elif label == "degraded":
            picks[label] = min(cands, key=lambda r: r["summary"]["reward_last"])
        else:
            picks[label] = max(cands, key=lambda r: r["summary"]["reward_last"])
    return picks


def after_warmup(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Records logged once token selection was on (during warm-up every token is selected)."""
    return [r for r in records if not r.get("ictrl/warmup")]


def write_report(out: Path, methods: list[str], lrs: list[float], specs: list[grid.RunSpec],
                 results: dict[grid.RunSpec, dict[str, Any]], base: dict[str, Any], thresholds: OutcomeThresholds,
                 settings: dict[str, Any], seconds: float, note: str = "") -> Path:
    rows, metrics = label_runs(out, specs, results, base["p1"], thresholds)
    stab = stability(rows, methods, lrs)
    tables = stability_markdown(rows, stab, methods, lrs)
    head = f"Labels: outcome thresholds {thresholds.version} (studies.reports.outcomes)."
    if note:
        head = f"**{note}**\n\n{head}"
    atomic_write_text(out / "stability.md", "\n\n".join([head, *tables]) + "\n")
    heat_labels = {m: {lr: [r["label"] for r in rows if r["method"] == m and r["lr"] == lr] for lr in lrs}
                   for m in methods}
    heat_labels = {m: {lr: seq for lr, seq in cells.items() if seq} for m, cells in heat_labels.items()}
    images: list[Any] = [sweep_figures.plot_stability_heatmap(
        heat_labels, out / "stability_heatmap.png",
        title=f"Stable fraction per method and learning rate (outcome rules {thresholds.version})")]

    picks = pick_examples(rows, thresholds.labels)
    spec_of = {(s.method, s.lr, s.seed): s for s in specs}
    example_runs = {f"{label}: {r['method']}, lr {r['lr']:g}, seed {r['seed']}":
                    [metrics[spec_of[(r["method"], r["lr"], r["seed"])]]]
                    for label, r in picks.items() if r is not None}
    if example_runs:
        for name, path in zip(EXAMPLE_KEYS, figures.plot_curves(example_runs, EXAMPLE_KEYS, out_dir=out / "examples")):
            images.append((path, f"{name} per training step of one example run per outcome label "
                                 "(the legend names each run)"))
    purity_runs = {m: [after_warmup(metrics[s]) for s in specs if s.method == m] for m in methods}
    scatter = sweep_figures.plot_prob_vs_purity(purity_runs, out / "prob_vs_purity.png")
    if scatter is not None:
        images.append(scatter)

    summary = {"settings": settings, "methods": methods, "lrs": lrs, "thresholds": dataclasses.asdict(thresholds),
               "note": note, "base": base, "base_reward": base["p1"], "stability": stab,
               "examples": {k: (None if v is None else {x: v[x] for x in ("method", "lr", "seed")})
                            for k, v in picks.items()},
               "wall_seconds_this_invocation": seconds, "runs": rows}
    atomic_write_text(out / "sweep.json", json.dumps(summary, indent=1) + "\n")
    answer, caveats = _answer(stab, methods, specs, thresholds, settings)
    return report.render_report(
        "python -m studies sweep: learning-rate stability",
        [("Stable seeds per method and learning rate", tables[0]),
         ("Held-out P@1 / P@4 (%) per method and learning rate", tables[1])],
        images, _notes(rows, picks, base, thresholds, settings), out / "report.html",
        note=note, answer=answer, caveats=caveats)


def _answer(stab: dict[str, Any], methods: list[str], specs: list[grid.RunSpec], thresholds: OutcomeThresholds,
            settings: dict[str, Any]) -> tuple[str, list[str]]:
    """Each method's widest stable learning-rate range in one sentence, and what limits the answer."""
    ranges = []
    for m in methods:
        widest = stab[m]["widest_stable_range"]
        ranges.append(f"{m} {'none' if widest is None else f'{widest[0]:g}–{widest[1]:g}'}")
    answer = ("Widest learning-rate range in which every seed stayed stable: " + "; ".join(ranges) + ".")
    if settings.get("quick"):
        answer = f"{gridcli.PIPELINE_CHECK} {answer}"
    seeds = sorted({s.seed for s in specs})
    caveats = [f"{len(seeds)} seed{'s' if len(seeds) != 1 else ''} per cell (seeds {seeds[0]}–{seeds[-1]})"
               + (": a single run decides each cell" if len(seeds) < 2 else ""),
               f"labels follow the outcome rules {thresholds.version} (below); a rule set tuned on the same runs "
               "it labels is in-sample"]
    if settings.get("source") == "embedded":
        caveats.append(f"the tiny embedded task and model, {settings['rl']['steps']} optimizer steps per run")
    return answer, caveats


def _notes(rows: list[dict[str, Any]], picks: dict[str, dict[str, Any] | None], base: dict[str, Any],
           thresholds: OutcomeThresholds, settings: dict[str, Any]) -> str:
    missing = [label for label, r in picks.items() if r is None]
    notes = [
        f"Each run is labelled from its logged curves against the base model's reward {base['p1']:.3f} (its "
        f"held-out P@1 at the training temperature), by the outcome rules {thresholds.version} "
        "(studies.reports.outcomes says when each rule set was fixed):",
        *describe_thresholds(thresholds),
        "The windows shrink to half the run when it has fewer than twice the window of logged steps. A run whose "
        "weights went non-finite (sampling failed) counts as exploded with P@1 = P@4 = 0: "
        f"{sum(r['diverged'] for r in rows)} such run(s).",
        "Stability table: stable seeds / seeds per cell, the other outcomes in brackets (C = collapsed, "
        "E = exploded, D = degraded, U = unrewarded). Widest stable range: the widest contiguous learning-rate range in which every "
        "seed is stable.",
        "Example curves: " + ", ".join(f"{k}: {v['method']}, lr {v['lr']:g}, seed {v['seed']}"
                                       for k, v in picks.items() if v is not None)
        + (f". No run was labelled {' or '.join(missing)}." if missing else "."),
        "Probability against purity: one point per logged step of one run after the selection warm-up (all "
        "learning rates pooled).",
    ]
    if settings.get("source") == "embedded":
        notes.append(gridcli.embedded_task_note(settings, lr=False))
    return "\n\n".join(notes)
