"""``ictrl compare --tune``: every method at its own tuned setting, then fresh seeds (issue 14).

The protocol, fixed before any run (``CHOICE_RULE`` is printed into the report):

1. *Tuning*: every variant (``--variants``; default the paper's ablation: GRPO, ICT at 10/20/30%, frequent90,
   random10, entropy20) at every learning rate of ``--lrs`` and, for the sparse variants, every loss normaliser of
   ``--norms`` (``default`` = the method's own; ``per_response_all`` divides by all response tokens as GRPO does),
   on tuning seeds 1000, 1001, ... (``--tune-seeds``), evaluated on the *dev* split.
2. *Choice*: per variant, the (lr, normaliser) with the highest mean dev Total over tuning seeds (a diverged run
   scores what it scored: 0); ties go to the smaller lr, then the default normaliser.
3. *Matched update size*: ``ict`` and ``random10`` again at their chosen normaliser with the learning rate
   ``lr_grpo × u_grpo / u_method``, where u is the mean logged ``ictrl/update_norm`` (``||θ_after − θ_before||``
   per optimizer step, after the selection warm-up Θ) of the tuning runs at GRPO's chosen lr. Rows
   ``ict-matched`` / ``random10-matched``; the final runs' measured norms are reported next to GRPO's.
4. *Final*: each chosen setting (and the matched rows) on fresh seeds 0..S-1 (``--final-seeds``, default 5),
   evaluated on the *test* split. Tuning seeds are disjoint from them by construction.

Layout under ``--output-dir``: ``tune/`` and ``final/`` are two ``grid.run_grid`` trees (``done.json`` per run, so
a rerun skips what finished and redoes what did not), ``base-dev/`` and ``base/`` the base model's evaluations,
``choices.json`` the choices, then ``results.md``, ``results.json`` and ``report.html`` (``tune_report``).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ictrl.experiments import grid, gridcli, tinyrun
from ictrl.experiments.report import atomic_write_text, load_metrics

# label -> (grid method, selected-fraction override)
VARIANTS: dict[str, tuple[str, float | None]] = {
    "grpo": ("grpo", None),
    "ict": ("ict", None),
    "ict20": ("ict", 0.2),
    "ict30": ("ict", 0.3),
    "frequent90": ("frequent90", None),
    "random10": ("random10", None),
    "entropy20": ("entropy20", None),
}
ABLATION = tuple(VARIANTS)
MATCHED = ("ict", "random10")  # rows re-run with GRPO's update size
DEFAULT_LRS = (1e-4, 2e-4, 4e-4, 8e-4)
DEFAULT_NORMS = ("default", "per_response_all")
TUNE_SEED_START = 1000
UPDATE_KEY = "ictrl/update_norm"

CHOICE_RULE = (
    "Choice rule (fixed before the run): for each method, the learning rate and (sparse methods) loss normaliser "
    "with the highest mean dev-split Total = (P@1 + P@4) / 2 over the tuning seeds; a run that diverged counts "
    "with the score it got (0); ties go to the smaller learning rate, then the method's default normaliser. "
    "Matched rows: ict and random10 at their chosen normaliser with lr = lr_grpo × u_grpo / u_method, u the mean "
    "per-step update norm ||θ_after − θ_before|| after Θ in the tuning runs at GRPO's chosen lr. Final numbers "
    "come only from fresh seeds on the test split."
)


@dataclasses.dataclass(frozen=True)
class Protocol:
    variants: tuple[str, ...] = ABLATION
    lrs: tuple[float, ...] = DEFAULT_LRS
    norms: tuple[str, ...] = DEFAULT_NORMS
    tune_seeds: int = 1
    final_seeds: int = 5

    def __post_init__(self) -> None:
        from ictrl.loss import NORM_MODES

        for v in self.variants:
            if v not in VARIANTS:
                raise ValueError(f"--variants: unknown variant {v!r}; choose from {', '.join(VARIANTS)}")
        if not self.variants or not self.lrs or not self.norms:
            raise ValueError("--variants, --lrs and --norms each need at least one value")
        for lr in self.lrs:
            if not (math.isfinite(lr) and lr > 0):
                raise ValueError(f"--lrs: learning rates must be finite and > 0, got {lr!r}")
        for n in self.norms:
            if n != "default" and n not in NORM_MODES:
                raise ValueError(f"--norms: unknown normaliser {n!r}; choose from default, {', '.join(NORM_MODES)}")
        if self.tune_seeds < 1 or self.final_seeds < 2:
            raise ValueError(f"need --tune-seeds >= 1 and --final-seeds >= 2 (a CI needs two), got "
                             f"{self.tune_seeds}, {self.final_seeds}")


def spec_of(label: str, seed: int, lr: float, norm: str | None) -> grid.RunSpec:
    method, ratio = VARIANTS[label]
    return grid.RunSpec(method, seed, lr, ratio=ratio, norm=norm)


def norms_for(label: str, protocol: Protocol) -> list[str | None]:
    """Normalisers tuned for ``label``: GRPO keeps its own (every token is selected, so they coincide)."""
    if label == "grpo":
        return [None]
    return [None if n == "default" else n for n in protocol.norms]


def tuning_specs(protocol: Protocol) -> list[grid.RunSpec]:
    seeds = range(TUNE_SEED_START, TUNE_SEED_START + protocol.tune_seeds)
    return [spec_of(label, s, lr, norm) for lr in protocol.lrs for s in seeds for label in protocol.variants
            for norm in norms_for(label, protocol)]


def total(result: dict[str, Any]) -> float:
    return (float(result["p1"]) + float(result["p4"])) / 2.0


def mean_update_norm(records: Sequence[dict[str, Any]], after_step: int) -> float:
    """Mean logged update norm over steps > ``after_step`` (NaN when none logged)."""
    values = [float(r[UPDATE_KEY]) for r in records
              if isinstance(r.get(UPDATE_KEY), (int, float)) and r.get("step", 0) > after_step]
    return math.fsum(values) / len(values) if values else math.nan


def choose(protocol: Protocol, results: dict[grid.RunSpec, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The choice rule: label -> {lr, norm, score, scores: [[lr, norm, mean dev Total, diverged runs], ...]}."""
    seeds = range(TUNE_SEED_START, TUNE_SEED_START + protocol.tune_seeds)
    chosen = {}
    for label in protocol.variants:
        table = []
        for lr in protocol.lrs:
            for norm in norms_for(label, protocol):
                runs = [results[spec_of(label, s, lr, norm)] for s in seeds]
                score = math.fsum(total(r) for r in runs) / len(runs)
                table.append([lr, norm, score, sum(1 for r in runs if r.get("diverged"))])
        # Highest score; ties: smaller lr, then the default normaliser (None sorts first).
        # Scores are rounded to 1e-9 so that equal means summed in another order still tie.
        best = min(table, key=lambda row: (-round(row[2], 9), row[0], row[1] is not None, str(row[1])))
        chosen[label] = {"lr": best[0], "norm": best[1], "score": best[2], "scores": table}
    return chosen


def matched_lrs(protocol: Protocol, chosen: dict[str, dict[str, Any]], tune_root: Path,
                theta: int) -> dict[str, dict[str, Any]]:
    """``ict-matched`` / ``random10-matched``: lr scaled so the tuning runs' update norm at GRPO's lr matches."""
    if "grpo" not in chosen:
        return {}
    seeds = range(TUNE_SEED_START, TUNE_SEED_START + protocol.tune_seeds)
    lr_g = chosen["grpo"]["lr"]

    def norm_at(label: str, norm: str | None) -> float:
        values = [mean_update_norm(load_metrics(tune_root / spec_of(label, s, lr_g, norm).relpath / "metrics.jsonl"),
                                   theta) for s in seeds]
        return math.fsum(values) / len(values)

    u_g = norm_at("grpo", None)
    out = {}
    for label in MATCHED:
        if label not in chosen:
            continue
        u_m = norm_at(label, chosen[label]["norm"])
        if not (math.isfinite(u_m) and math.isfinite(u_g) and u_m > 0):
            continue  # no measurable update (e.g. a run too short to pass Θ): no matched row
        out[f"{label}-matched"] = {"label": label, "lr": lr_g * u_g / u_m, "norm": chosen[label]["norm"],
                                   "u_grpo_tune": u_g, "u_method_tune": u_m, "lr_grpo": lr_g}
    return out


def final_rows(protocol: Protocol, chosen: dict[str, dict[str, Any]],
               matched: dict[str, dict[str, Any]]) -> dict[str, list[grid.RunSpec]]:
    """Row label -> its final-seed specs (tuned rows, then matched rows)."""
    rows = {label: [spec_of(label, s, c["lr"], c["norm"]) for s in range(protocol.final_seeds)]
            for label, c in chosen.items()}
    for row, m in matched.items():
        rows[row] = [spec_of(m["label"], s, m["lr"], m["norm"]) for s in range(protocol.final_seeds)]
    return rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The --tune options of ``ictrl compare`` (and --task, which plain compare also takes)."""
    parser.add_argument("--task", default="tinyarith", choices=("tinyarith", "countdown"),
                        help="embedded task: tinyarith (operator precedence) or countdown (reach a target from "
                             "given numbers: choices, several valid orders)")
    parser.add_argument("--tune", action="store_true",
                        help="the tuned protocol: pick each method's lr (and normaliser) on tuning seeds and the "
                             "dev split, then fresh seeds at the chosen settings on the test split, with matched-"
                             "update-size rows (see ictrl.experiments.tune)")
    parser.add_argument("--variants", default=",".join(ABLATION),
                        help=f"--tune: methods, from {', '.join(VARIANTS)} (default: all)")
    parser.add_argument("--lrs", default=",".join(f"{x:g}" for x in DEFAULT_LRS),
                        help="--tune: learning-rate grid (default: %(default)s)")
    parser.add_argument("--norms", default=",".join(DEFAULT_NORMS),
                        help="--tune: normalisers tried for sparse methods (default: %(default)s)")
    parser.add_argument("--tune-seeds", type=int, default=1, help="--tune: seeds per tuning cell (from 1000)")
    parser.add_argument("--final-seeds", type=int, default=5, help="--tune: fresh seeds per final row (0..S-1)")


def protocol_from_args(args: argparse.Namespace) -> Protocol:
    def floats(text: str, name: str) -> tuple[float, ...]:
        try:
            return tuple(float(x) for x in text.split(",") if x.strip())
        except ValueError:
            raise ValueError(f"{name}: expected comma-separated numbers, got {text!r}") from None

    names = tuple(dict.fromkeys(v.strip() for v in args.variants.split(",") if v.strip()))
    return Protocol(variants=names, lrs=floats(args.lrs, "--lrs"),
                    norms=tuple(n.strip() for n in args.norms.split(",") if n.strip()),
                    tune_seeds=args.tune_seeds, final_seeds=args.final_seeds)


def run(args: argparse.Namespace) -> int:
    from ictrl.experiments import tune_report

    try:
        if args.config is not None:
            raise ValueError("--tune runs on the embedded tasks (--task); --config is not supported with it")
        protocol = protocol_from_args(args)
        start = time.perf_counter()
        experiment = gridcli.make_experiment(args)
        out: Path = args.output_dir
        settings = tinyrun.TinyRL(**experiment.settings["rl"])
        base = Path(experiment.settings["base"])
        dev = dataclasses.replace(settings, eval_split="dev")
        theta = 10 if settings.selection_warmup is None else settings.selection_warmup  # the selectors' default Θ

        tune_results = grid.run_grid(tuning_specs(protocol), out / "tune",
                                     functools.partial(tinyrun.train_tiny, dev, base), jobs=args.jobs)
        base_dev = grid.cached_result(out / "base-dev" / "result.json",
                                      lambda: tinyrun.eval_tiny_base(dev, base, out / "base-dev"))
        chosen = choose(protocol, tune_results)
        matched = matched_lrs(protocol, chosen, out / "tune", theta)
        atomic_write_text(out / "choices.json", json.dumps({"rule": CHOICE_RULE, "chosen": chosen,
                                                            "matched": matched}, indent=1) + "\n")
        rows = final_rows(protocol, chosen, matched)
        specs = list(dict.fromkeys(s for row in rows.values() for s in row))
        final = grid.run_grid(specs, out / "final", functools.partial(tinyrun.train_tiny, settings, base),
                              jobs=args.jobs)
        base_test = grid.cached_result(out / "base" / "result.json", lambda: experiment.eval_base(out / "base"))
        paths = tune_report.write(out, protocol, experiment.settings, tune_results, base_dev, chosen, matched,
                                  rows, final, base_test, theta, time.perf_counter() - start,
                                  quick=bool(args.quick), task=args.task, note=args.note)
    except ValueError as exc:
        print(f"ictrl compare: error: {exc}", file=sys.stderr)
        return 2
    print(paths["table"].read_text())
    print(f"wrote {paths['report']}", file=sys.stderr)
    return 0
