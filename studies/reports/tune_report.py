"""The report of ``python -m studies compare --tune`` (``studies.protocols.tune``): answer first, then the tables.

First lines, per task: does ICT beat random10 beyond seed noise at tuned settings (Welch 95% CI over fresh seeds),
does it widen the stable learning-rate range (tuning grid), and how its H1/H2 curves differ (last-steps means with
a CI). A ``--quick`` run says in its first line that it is not a result.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ictrl.experiments.grid import runner as grid
from ictrl.experiments.reports import report
from ictrl.experiments.reports import figures
from ictrl.files import atomic_write_text
from ictrl.experiments.reports.stats_tests import sample_std, welch_diff
from studies.protocols.tune import CHOICE_RULE, TUNE_SEED_START, UPDATE_KEY, Protocol, mean_update_norm, norms_for, total

CURVE_KEYS = {**figures.DEFAULT_CURVE_KEYS, "update norm ||θ_after − θ_before||": UPDATE_KEY}
# End-of-run diagnostics of what each method trains on: entropies (nats), and the paper's two descriptions of ICT's
# tokens (docs/method.md §3: mean probability 0.18 ± 0.09, about half at high-entropy positions).
ENTROPY_KEYS = {"H1 selected": "ictrl/h1/selected", "H1 all": "ictrl/h1/all", "H2 all": "ictrl/h2/all",
                "π selected": "ictrl/prob/selected", "high-H1 share of selected": "ictrl/selected/high_entropy_frac"}
PAPER_TOKENS = "the paper's ICT tokens: π 0.18 ± 0.09, about half at high-entropy positions"
LAST_STEPS = 5  # steps averaged for the end-of-run entropy comparison


def _mean(values: Sequence[float]) -> float:
    values = [v for v in values if math.isfinite(v)]
    return math.fsum(values) / len(values) if values else math.nan


def _pm(values: Sequence[float], fmt: str = ".3g") -> str:
    values = [v for v in values if math.isfinite(v)]
    if not values:
        return "n/a"
    sd = sample_std(values)
    return f"{_mean(values):{fmt}} ± {'n/a' if sd is None else format(sd, fmt)}"


def last_mean(records: Sequence[dict[str, Any]], key: str, last: int = LAST_STEPS) -> float:
    values = [float(r[key]) for r in records if isinstance(r.get(key), (int, float))]
    return _mean(values[-last:])


def stable_lrs(protocol: Protocol, label: str, norm: str | None, results: dict[grid.RunSpec, dict[str, Any]],
               base_dev_total: float) -> list[float]:
    """Grid lrs at which ``label`` (at ``norm``) is stable: no tuning seed diverged and the mean dev Total is at
    least the base model's (training did not leave it worse than it started)."""
    from studies.protocols.tune import spec_of

    seeds = range(TUNE_SEED_START, TUNE_SEED_START + protocol.tune_seeds)
    out = []
    for lr in protocol.lrs:
        runs = [results[spec_of(label, s, lr, norm)] for s in seeds]
        if not any(r.get("diverged") for r in runs) and _mean([total(r) for r in runs]) >= base_dev_total:
            out.append(lr)
    return out


def tuning_table(protocol: Protocol, chosen: dict[str, dict[str, Any]]) -> str:
    head = "| method | normaliser | " + " | ".join(f"lr {lr:g}" for lr in protocol.lrs) + " |"
    lines = [head, "|---|---|" + "---|" * len(protocol.lrs)]
    for label, c in chosen.items():
        for norm in norms_for(label, protocol):
            cells = []
            for lr in protocol.lrs:
                lr_, _, score, diverged = next(r for r in c["scores"] if r[0] == lr and r[1] == norm)
                mark = "**" if (lr_ == c["lr"] and norm == c["norm"]) else ""
                cells.append(f"{mark}{100 * score:.1f}{mark}" + (f" ({diverged} diverged)" if diverged else ""))
            lines.append(f"| {label} | {norm or 'default'} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _per_seed(rows: dict[str, list[grid.RunSpec]], final: dict[grid.RunSpec, dict[str, Any]]) -> dict[str, list]:
    return {row: [{"p1": final[s]["p1"], "p4": final[s]["p4"]} for s in specs] for row, specs in rows.items()}


def _totals(rows: dict[str, list[grid.RunSpec]], final: dict[grid.RunSpec, dict[str, Any]], row: str) -> list[float]:
    return [100 * total(final[s]) for s in rows[row]]


def diff_lines(rows: dict[str, list[grid.RunSpec]], final: dict[grid.RunSpec, dict[str, Any]]) -> list[str]:
    """Markdown rows 'a − b | Total diff [CI] | p' for the pairs the study asks about (ICT against random10 and GRPO), where both rows exist."""
    pairs = [("ict", "random10"), ("ict-matched", "random10-matched"), ("ict", "grpo"), ("random10", "grpo")]
    out = ["| comparison (Total, points) | difference [95% Welch CI] | p |", "|---|---|---|"]
    for a, b in pairs:
        if a in rows and b in rows:
            d = welch_diff(_totals(rows, final, a), _totals(rows, final, b))
            out.append(f"| {a} − {b} | {d} | {'n/a' if d.p is None else f'{d.p:.3f}'} |")
    return out


def update_table(rows: dict[str, list[grid.RunSpec]], metrics: dict[grid.RunSpec, list[dict[str, Any]]],
                 theta: int) -> tuple[str, dict[str, list[float]]]:
    norms = {row: [mean_update_norm(metrics[s], theta) for s in specs] for row, specs in rows.items()}
    ref = _mean(norms["grpo"]) if "grpo" in norms else math.nan
    lines = [f"| row | lr | mean update norm after Θ = {theta} (mean ± std over seeds) | ÷ GRPO's |", "|---|---|---|---|"]
    for row, specs in rows.items():
        ratio = _mean(norms[row]) / ref if ref and math.isfinite(ref) else math.nan
        lines.append(f"| {row} | {specs[0].lr:.3g} | {_pm(norms[row])} | {ratio:.2f} |")
    return "\n".join(lines), norms


def entropy_table(rows: dict[str, list[grid.RunSpec]], metrics: dict[grid.RunSpec, list[dict[str, Any]]]) -> tuple[str, list[str]]:
    lines = ["| row | " + " | ".join(f"{k} (last {LAST_STEPS} steps)" for k in ENTROPY_KEYS) + " |",
             "|---|" + "---|" * len(ENTROPY_KEYS)]
    for row, specs in rows.items():
        lines.append(f"| {row} | " + " | ".join(_pm([last_mean(metrics[s], key) for s in specs])
                                              for key in ENTROPY_KEYS.values()) + " |")
    sentences = []
    if "ict" in rows and "random10" in rows:
        for name, key in ENTROPY_KEYS.items():
            a = [last_mean(metrics[s], key) for s in rows["ict"]]
            b = [last_mean(metrics[s], key) for s in rows["random10"]]
            if all(map(math.isfinite, a + b)) and a and b:
                d = welch_diff(a, b)
                sentences.append(f"{name} ict − random10 {d}")
    return "\n".join(lines), sentences


def answer(task: str, quick: bool, rows: dict[str, list[grid.RunSpec]], final: dict[grid.RunSpec, dict[str, Any]],
           stable: dict[str, list[float]], entropy: list[str], lrs: Sequence[float],
           base_test: dict[str, Any] | None = None, chosen: dict[str, dict[str, Any]] | None = None) -> str:
    lines = []
    if quick:
        lines.append("QUICK RUN (--quick: a tiny base model, a few steps per run): a plumbing check of the protocol. "
                     "NOT A RESULT; the numbers below say nothing about the methods.")
    elif base_test is not None and (base_test["p4"] == 0 or base_test["p1"] >= 0.95):
        lines.append(f"WARNING: the base model scores P@1 {100 * base_test['p1']:.1f}% / P@4 "
                     f"{100 * base_test['p4']:.1f}% on the test split: RL has "
                     f"{'no reward to learn from' if base_test['p4'] == 0 else 'no room to improve'}, so the "
                     "comparison below cannot separate the methods.")
    if "ict" in rows and "random10" in rows:
        d = welch_diff(_totals(rows, final, "ict"), _totals(rows, final, "random10"))
        verdict = ("no interval" if d.lo is None else
                   f"ICT {'beats' if d.mean > 0 else 'trails'} random10 beyond seed noise" if d.excludes_zero else
                   "no evidence that ICT differs from random10 (the interval contains 0)")
        lines.append(f"Task {task}, tuned settings, {len(rows['ict'])} fresh seeds: ICT − random10 on Total "
                     f"{d} points (95% Welch CI, p = {'n/a' if d.p is None else f'{d.p:.3f}'}): {verdict}.")
        if "ict-matched" in rows and "random10-matched" in rows:
            m = welch_diff(_totals(rows, final, "ict-matched"), _totals(rows, final, "random10-matched"))
            lines.append(f"At GRPO's update size: ict-matched − random10-matched {m} points.")
        si, sr = stable.get("ict", []), stable.get("random10", [])
        widen = ("wider than" if len(si) > len(sr) else "narrower than" if len(si) < len(sr) else "as wide as")
        lines.append(f"Stable range on the lr grid {', '.join(f'{x:g}' for x in lrs)} (tuning runs): ict {_lrs(si)}, "
                     f"random10 {_lrs(sr)}, grpo {_lrs(stable.get('grpo', []))}: ICT's is {widen} random10's.")
    edges = edge_choices(chosen or {}, lrs)
    if edges:
        lines.append("Chosen at the edge of the lr grid, so the best lr may lie outside it (widen --lrs): "
                     + ", ".join(edges) + ".")
    if entropy:
        lines.append(f"End of run, mean over the last {LAST_STEPS} steps (entropies in nats; 95% Welch CI): "
                     + "; ".join(entropy) + f" ({PAPER_TOKENS}).")
    return "\n\n".join(lines)


def edge_choices(chosen: dict[str, dict[str, Any]], lrs: Sequence[float]) -> list[str]:
    """'label lr (smallest|largest)' for every method whose chosen lr is the grid's smallest or largest."""
    if len(lrs) < 2:
        return []
    lo, hi = min(lrs), max(lrs)
    return [f"{label} {c['lr']:g} ({'smallest' if c['lr'] == lo else 'largest'})"
            for label, c in chosen.items() if c["lr"] in (lo, hi)]


def _lrs(values: Sequence[float]) -> str:
    return "{" + ", ".join(f"{x:g}" for x in values) + "}" if values else "none"


def write(out: Path, protocol: Protocol, settings: dict[str, Any], tune_results: dict[grid.RunSpec, dict[str, Any]],
          base_dev: dict[str, Any], chosen: dict[str, dict[str, Any]], matched: dict[str, dict[str, Any]],
          rows: dict[str, list[grid.RunSpec]], final: dict[grid.RunSpec, dict[str, Any]], base_test: dict[str, Any],
          theta: int, seconds: float, quick: bool, task: str, note: str = "") -> dict[str, Path]:
    """results.md / results.json / curves / report.html; returns the written paths by role."""
    all_specs = [s for specs in rows.values() for s in specs]
    metrics = grid.load_grid_metrics(out / "final", list(dict.fromkeys(all_specs)))
    per_seed = {"base": [{"p1": base_test["p1"], "p4": base_test["p4"]}], **_per_seed(rows, final)}
    table = report.results_table(per_seed, diff=("ict", "random10") if {"ict", "random10"} <= set(rows) else None)
    base_dev_total = total(base_dev)
    stable = {label: stable_lrs(protocol, label, c["norm"], tune_results, base_dev_total) for label, c in chosen.items()}
    upd_md, upd = update_table(rows, metrics, theta)
    ent_md, ent_sentences = entropy_table(rows, metrics)
    text = answer(task, quick, rows, final, stable, ent_sentences, protocol.lrs, base_test, chosen)
    chosen_md = "\n".join(["| row | lr | normaliser | dev Total (tuning) | stable lrs |", "|---|---|---|---|---|"]
                          + [f"| {k} | {c['lr']:g} | {c['norm'] or 'default'} | {100 * c['score']:.1f} | "
                             f"{_lrs(stable[k])} |" for k, c in chosen.items()]
                          + [f"| {k} | {m['lr']:.3g} | {m['norm'] or 'default'} | (matched) | |" for k, m in matched.items()])
    results_md = "\n\n".join([text, table.to_markdown(), "\n".join(diff_lines(rows, final)), chosen_md, upd_md,
                              ent_md, tuning_table(protocol, chosen), CHOICE_RULE])
    table_path = atomic_write_text(out / "results.md", results_md + "\n")
    runs = {row: [metrics[s] for s in specs] for row, specs in rows.items()}
    images = figures.plot_curves(runs, CURVE_KEYS, out_dir=out)
    summary = {"task": task, "quick": quick, "note": note, "protocol": protocol.__dict__, "rule": CHOICE_RULE,
               "settings": settings, "base_dev": base_dev, "base_test": base_test, "chosen": chosen,
               "matched": matched, "stable_lrs": stable, "update_norms": upd, "answer": text,
               "wall_seconds_this_invocation": seconds,
               "final": {row: [final[s] for s in specs] for row, specs in rows.items()},
               "run_seconds": {"tune": math.fsum(r["seconds"] for r in tune_results.values()),
                               "final": math.fsum(final[s]["seconds"] for s in dict.fromkeys(all_specs))}}
    atomic_write_text(out / "results.json", json.dumps(summary, indent=1, default=str) + "\n")
    rl = settings["rl"]
    notes = "\n\n".join([
        CHOICE_RULE,
        f"Tuning: seeds {TUNE_SEED_START}..{TUNE_SEED_START + protocol.tune_seeds - 1} on the dev split (base dev "
        f"Total {100 * base_dev_total:.1f}); final: seeds 0..{protocol.final_seeds - 1} on the test split. Stable: "
        "no tuning seed diverged and mean dev Total >= the base model's.",
        f"Task {task}: {rl['steps']} optimizer steps per run, {rl['prompts_per_step']} prompts x "
        f"{rl['num_generations']} samples, Θ = {theta}, {rl['eval_problems']} held-out problems x {rl['eval_n']} "
        f"samples at temperature {rl['temperature']:g}. Training time summed over runs: "
        f"{summary['run_seconds']['tune'] + summary['run_seconds']['final']:.0f} s.",
    ])
    tables = [("Final runs (test split, fresh seeds)", table.to_html()),
              ("Differences", "\n".join(diff_lines(rows, final))), ("Chosen settings", chosen_md),
              ("Update size", upd_md), ("Entropies and selected tokens at the end of training", ent_md),
              ("Tuning grid: mean dev Total (%), chosen in bold", tuning_table(protocol, chosen))]
    caveats = [f"{protocol.final_seeds} fresh seeds per row, treated as independent samples",
               f"the tiny embedded {task} task and model: not the paper's setting"]
    page = report.render_report(f"python -m studies compare --tune ({task})", tables, images, notes, out / "report.html",
                                note=note, answer=text, caveats=caveats)
    return {"table": table_path, "report": page}
