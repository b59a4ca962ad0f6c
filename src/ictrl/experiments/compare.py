"""``ictrl compare``: methods x seeds on the embedded task (or a run config), then a comparison report.

Writes into ``--output-dir``:

- ``<method>/seed<k>/``: ``metrics.jsonl``, ``eval/`` (held-out samples and results), ``done.json`` (last);
- ``base/``: the base model's held-out evaluation (``result.json``);
- ``results.md`` / ``results.json``: P@1, P@4, Total per method (mean ± std over seeds, the base model's row
  first) and ICT − random10 with a 95% Welch interval (``report.results_table``);
- ``curve_*.png``: reward, H1, H2, purity and the selected fraction per method over steps (mean, min-max band);
- ``report.html``: all of it, self-contained.

A rerun skips finished runs (see ``ictrl.experiments.grid.runner``), so an interrupted compare continues where it
stopped and a finished one only rebuilds the report; a run whose rule changed since (its source file's sha256, its
options: ``done.json``'s ``selector``) runs again. ``--methods`` takes options per method, ``NAME(key=value, ...)``
(``ictrl.experiments.grid.methods``), each option set its own row. One compare writes a folder at a time (its
``.ictrl.lock``, as ``ictrl train`` and ``ictrl eval``).

``--task`` runs on another task module (``ictrl.experiments.tasks.registry``: ``module`` or ``module:attribute``,
importable from the working directory): from a clone's root, the studies' ``--task studies.tasks.countdown`` and
``--task studies.tasks.paths``. The project's study protocols on top of this command (the tuned comparison, the long
horizon) live in the repository's ``studies/`` (``python -m studies compare --tune`` / ``--horizon SETTING``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from ictrl.errors import UserError
from ictrl.experiments.grid import configrun
from ictrl.experiments.grid import runner as grid
from ictrl.experiments.grid import cli as gridcli
from ictrl.experiments.reports import report
from ictrl.experiments.reports import figures
from ictrl.experiments.tasks.registry import CHOICES
from ictrl.files import atomic_write_text, reported_write

CURVE_KEYS = figures.DEFAULT_CURVE_KEYS  # reward, H1 (all, selected), H2, purity, selected fraction


def add_arguments(parser: argparse.ArgumentParser) -> None:
    gridcli.add_common_arguments(parser, default_output="runs/compare")
    parser.add_argument("--learning-rate", "--lr", dest="lr", type=float, default=None,
                        help="learning rate (default: the recipe's / config's)")
    parser.add_argument("--note", default="", help="a line put at the top of the report and stored in results.json")
    parser.add_argument("--task", default="tinyarith",
                        help=f"the task of the grid's runs (default: %(default)s, operator precedence): {CHOICES}")


def output_names(specs: list[grid.RunSpec]) -> list[str]:
    """The entries at the top of ``--output-dir`` that the command writes: the report's files, ``base/``, each
    run's folder (its method, or its learning rate's) and ``_probe/`` (``--config``'s check)."""
    curves = [figures.curve_filename(name) for name in CURVE_KEYS]
    runs = [spec.relpath.split("/")[0] for spec in specs]
    return ["results.md", "results.json", "report.html", *curves, "base", "_probe", *runs]


def earlier_compare(out: Path) -> bool:
    """Whether ``out`` holds the results.json of an ``ictrl compare`` written before ictrl listed its files."""
    from ictrl.files import holds_record

    return holds_record(out / "results.json", ("settings", "methods", "base", "runs"))


def run(args: argparse.Namespace) -> int:
    from ictrl.dirlock import OutputLock
    from ictrl.files import check_output_dir, check_own_files, claim_files

    check_output_dir(args.output_dir)  # before any run or model load
    methods = grid.parse_methods(args.methods)
    if args.lr is not None and not (math.isfinite(args.lr) and args.lr > 0):
        raise UserError(f"--learning-rate must be finite and > 0, got {args.lr}")
    specs = grid.grid_specs(methods, args.seeds, None if args.lr is None else [args.lr])
    out: Path = args.output_dir
    check_own_files(out, output_names(specs), legacy=earlier_compare)
    start = time.perf_counter()
    # one writer at a time: two grids in one folder would train every run twice and append to the same logs
    with OutputLock(out, label="--output-dir", user="another command", stopped="the comparison did not start",
                    logger="ictrl.compare"):
        check_own_files(out, output_names(specs), legacy=earlier_compare)  # as it is now the lock is held
        experiment = gridcli.make_experiment(args)
        claim_files(out, output_names(specs))
        results = grid.run_grid(specs, out, experiment.runner, jobs=args.jobs)
        base = grid.cached_result(out / "base" / "result.json", lambda: experiment.eval_base(out / "base"))
        with reported_write(out, "the finished runs are kept; free space and rerun the same command to write the "
                                 "report"):
            paths = write_report(out, methods, specs, results, base, experiment.settings,
                                 time.perf_counter() - start, note=args.note)
    if experiment.settings.get("quick"):
        print(gridcli.PIPELINE_CHECK)
    print(paths["table"].read_text())
    print(f"wrote {paths['report']}", file=sys.stderr)
    return 0


def write_report(out: Path, methods: list[str], specs: list[grid.RunSpec], results: dict[grid.RunSpec, dict[str, Any]],
                 base: dict[str, Any], settings: dict[str, Any], seconds: float, note: str = "") -> dict[str, Path]:
    """Table, curves and report.html from finished runs; returns the written paths by role."""
    per_seed: dict[str, list[dict[str, float]]] = {"base": [{"p1": base["p1"], "p4": base["p4"]}]}
    for m in methods:
        per_seed[m] = [{"p1": results[s]["p1"], "p4": results[s]["p4"]} for s in specs if s.label == m]
    diff = ("ict", "random10") if {"ict", "random10"} <= set(methods) else None
    table = report.results_table(per_seed, diff=diff)
    metrics = grid.load_grid_metrics(out, specs)
    runs = {m: [metrics[s] for s in specs if s.label == m] for m in methods}
    images = figures.plot_curves(runs, CURVE_KEYS, out_dir=out)
    table_path = atomic_write_text(out / "results.md", table.to_markdown() + "\n")
    # each method's rule as its runs ran it (the source's hash, the resolved options): the rows never mix versions
    selectors = {m: next((results[s].get("selector") for s in specs if s.label == m), None) for m in methods}
    summary = {"settings": settings, "methods": methods, "selectors": selectors, "note": note, "base": base,
               "wall_seconds_this_invocation": seconds,
               "runs": [results[s] for s in specs]}
    atomic_write_text(out / "results.json", json.dumps(summary, indent=1) + "\n")
    notes = _notes(settings, specs, results, diff) + _rule_sources(selectors)
    answer, caveats = _answer(table, methods, settings, specs)
    page = report.render_report("ictrl compare: held-out pass@k per method", [table.to_html()], images, notes,
                                out / "report.html", note=note, answer=answer, caveats=caveats)
    return {"table": table_path, "report": page}


def _answer(table: report.ResultsTable, methods: list[str], settings: dict[str, Any], specs: list[grid.RunSpec]
            ) -> tuple[str, list[str]]:
    """The study's answer in two sentences, and what limits it."""
    totals = {m: table.rows[m]["Total"].mean for m in methods}
    top = max(totals.values())
    best = [m for m in methods if round(totals[m], 1) == round(top, 1)]  # equal as the table shows them
    base = f"base model {table.rows['base']['Total'].mean:.1f}%"
    if len(best) > 1:
        lines = [f"No highest mean Total (mean of P@1 and P@4): {', '.join(best)} tie at {top:.1f}%"
                 + (f", the others {min(totals.values()):.1f}–"
                    f"{max(v for v in totals.values() if round(v, 1) < round(top, 1)):.1f}%"
                    if len(best) < len(methods) else "") + f" ({base})."]
    else:
        spread = f"; all methods {min(totals.values()):.1f}–{top:.1f}%" if len(totals) > 1 else ""
        lines = [f"Highest mean Total (mean of P@1 and P@4): {best[0]}, {top:.1f}%{spread} ({base})."]
    if settings.get("quick"):
        lines.insert(0, gridcli.PIPELINE_CHECK)
    if table.diff is not None and table.diff_name is not None:
        d = table.diff["Total"]
        if d.lo is None:
            verdict = "no interval: each method needs at least two seeds"
        elif d.excludes_zero:
            verdict = f"{'better' if d.mean > 0 else 'worse'} at 95% confidence (p = {d.p:.3f})"
        else:
            verdict = f"no evidence of a difference: the 95% interval contains 0 (p = {d.p:.2f})"
        lines.append(f"{table.diff_name} on Total: {d.mean:+.1f} points, 95% Welch CI "
                     f"{'n/a' if d.lo is None else f'[{d.lo:+.1f}, {d.hi:+.1f}]'}; {verdict}.")
    seeds = len({s.seed for s in specs})
    caveats = [f"{seeds} seed{'s' if seeds != 1 else ''} per method"
               + (": one run per method, no spread or interval" if seeds < 2 else
                  "; seeds are treated as independent samples")]
    if settings.get("source") == "embedded":
        rl = settings["rl"]
        caveats.append(f"the tiny embedded arithmetic task and model, {rl['steps']} optimizer steps per run: not "
                       "the paper's setting")
    caveats.append("the base row is a single evaluation of the starting model")
    return " ".join(lines), caveats


def _rule_sources(selectors: dict[str, Any]) -> str:
    """A note naming each rule of the user's own by its file and the sha256 its runs recorded (empty when every
    method is ictrl's): which version of a rule the rows are."""
    own = [f"{label} = {ident['spec']} ({Path(ident['file']).name}, sha256 {ident['sha256'][:16]})"
           for label, ident in selectors.items()
           if isinstance(ident, dict) and ident.get("sha256") and ident.get("file")]
    return "\n\nRules of your own, as their runs ran them: " + "; ".join(own) + "." if own else ""


def _public(name: str) -> str:
    """A hub id as it is; a local path by its last component (a page carries no local paths)."""
    return Path(name).name if name.startswith(("/", ".", "~")) or Path(name).exists() else name


def _notes(settings: dict[str, Any], specs: list[grid.RunSpec], results: dict[grid.RunSpec, dict[str, Any]],
           diff: tuple[str, str] | None) -> str:
    seeds = sorted({s.seed for s in specs})
    run_seconds = sum(results[s]["seconds"] for s in specs)
    lines = [
        f"Rows: held-out pass@k in percent, mean ± sample std over seeds {seeds}; the base row is one evaluation "
        "of the starting model. Total = (P@1 + P@4) / 2 per seed.",
        "Evaluation: completions sampled at the training temperature, unbiased pass@k estimator (samples per "
        "problem below).",
    ]
    if diff:
        lines.append(f"{diff[0]} − {diff[1]}: difference of means with a 95% Welch t-interval over seeds "
                     "(seeds treated as independent). An interval that contains 0 is no evidence of a difference.")
    if settings.get("source") == "embedded":
        lines.append(gridcli.embedded_task_note(settings))
    elif settings.get("source") == "config":
        lines.append(f"Run config {Path(settings['config']).name} (model {_public(settings['model'])}), "
                     f"eval on {settings['eval']} with "
                     f"{configrun.CONFIG_EVAL_N} samples per problem.")
    curves = "mean over seeds with the min-max band" if len(seeds) >= 2 else "one run per method"
    lines.append(f"Curves: {curves}. Training time summed over runs: {run_seconds:.0f} s.")
    return "\n\n".join(lines)
