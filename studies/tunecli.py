"""``python -m studies compare --tune``'s options and driver: the protocol of ``protocols.tune`` run through
ictrl's grid, reported by ``reports.tune_report`` (kept apart from both so that neither imports the other back)."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
import time
from pathlib import Path

from ictrl.core.selection import get_selector
from ictrl.errors import UserError
from ictrl.experiments.grid import runner as grid
from ictrl.experiments.grid import cli as gridcli
from ictrl.experiments.grid import tinyrun
from ictrl.files import atomic_write_text
from studies.reports import tune_report
from studies.protocols.tune import (ABLATION, CHOICE_RULE, DEFAULT_FINAL_SEEDS, DEFAULT_LRS, DEFAULT_NORMS,
                                    DEFAULT_TUNE_SEEDS, VARIANTS, Protocol, choose, final_rows, matched_lrs,
                                    tuning_specs)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The --tune options, added to ``ictrl compare``'s (whose --task names the tuned protocol's task)."""
    parser.add_argument("--tune", action="store_true",
                        help="the tuned protocol: pick each method's lr (and normaliser) on tuning seeds and the "
                             "dev split, then fresh seeds at the chosen settings on the test split, with matched-"
                             "update-size rows (see studies.protocols.tune)")
    parser.add_argument("--setting", default=None, metavar="SETTING",
                        help="--tune: the task and base-model recipe of a long-horizon setting (a file, or a name in "
                             "studies/horizon/; its tuned lrs may be absent) instead of --task's default base")
    parser.add_argument("--variants", default=",".join(ABLATION),
                        help=f"--tune: methods, from {', '.join(VARIANTS)} (default: all)")
    parser.add_argument("--lrs", default=",".join(f"{x:g}" for x in DEFAULT_LRS),
                        help="--tune: learning-rate grid (default: %(default)s)")
    parser.add_argument("--norms", default=",".join(DEFAULT_NORMS),
                        help="--tune: normalisers tried for sparse methods (default: %(default)s)")
    parser.add_argument("--tune-seeds", type=int, default=DEFAULT_TUNE_SEEDS,
                        help="--tune: seeds per tuning cell (from 1000; default: %(default)s)")
    parser.add_argument("--final-seeds", type=int, default=DEFAULT_FINAL_SEEDS,
                        help="--tune: fresh seeds per final row (0..S-1; default: %(default)s)")


def protocol_from_args(args: argparse.Namespace) -> Protocol:
    def floats(text: str, name: str) -> tuple[float, ...]:
        try:
            return tuple(float(x) for x in text.split(",") if x.strip())
        except ValueError:
            raise UserError(f"{name}: expected comma-separated numbers, got {text!r}") from None

    names = tuple(dict.fromkeys(v.strip() for v in args.variants.split(",") if v.strip()))
    return Protocol(variants=names, lrs=floats(args.lrs, "--lrs"),
                    norms=tuple(n.strip() for n in args.norms.split(",") if n.strip()),
                    tune_seeds=args.tune_seeds, final_seeds=args.final_seeds)


def run(args: argparse.Namespace) -> int:
    if args.config is not None:
        raise UserError("--tune runs on the embedded tasks (--task); --config is not supported with it")
    protocol = protocol_from_args(args)
    if args.setting is not None:
        from studies.protocols import horizon as hz

        setting = hz.load_setting(args.setting, need_tuned=False)
        args.task, args.recipe = setting.task, setting.recipe
        args.note = args.note or f"Base: the long-horizon setting {setting.name}'s (task {setting.task}, recipe " \
                                 f"overrides {json.dumps(setting.recipe)})."
    start = time.perf_counter()
    experiment = gridcli.make_experiment(args)
    out: Path = args.output_dir
    settings = tinyrun.TinyRL(**experiment.settings["rl"])
    base = Path(experiment.settings["base"])
    dev = dataclasses.replace(settings, eval_split="dev")
    # the sparse methods' default Θ, as registered (ict, random and frequent share it)
    theta = get_selector("ict").warmup_steps if settings.selection_warmup is None else settings.selection_warmup

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
    print(paths["table"].read_text())
    print(f"wrote {paths['report']}", file=sys.stderr)
    return 0
