"""``python -m studies compare --horizon SETTING``: the long-horizon protocol of ``protocols.horizon`` run
through ictrl's grid and reported by ``reports.horizon_report``.

Layout under ``--output-dir``: ``probe/`` (phase 1: GRPO's seeds with the stop rule), ``horizon.json`` (N and each
GRPO seed's stop step), ``runs/`` (phase 2: every method for N steps), ``base/`` (the base model's held-out
evaluation), then ``results.md``, ``results.json`` and ``report.html``. Both phases are ``grid.run_grid`` trees
(``done.json`` per run): a rerun of the same command skips what finished and redoes what did not.
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from ictrl.errors import UserError
from studies.protocols import horizon as hz
from ictrl.experiments.grid import runner as grid
from ictrl.experiments.grid import tinyrun
from ictrl.files import atomic_write_text

# --quick: the quick base model and a plan small enough for tests (the rules need more steps than this to fire,
# so the stop rule runs every GRPO seed to the cap).
QUICK = dict(min_steps=4, cap=6, seeds=(0, 1), eval_every=2, curve_problems=8, eval_problems=8,
             rl=dict(prompts_per_step=4, num_generations=4, num_iterations=1, selection_warmup=0))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--horizon", default=None, metavar="SETTING",
                        help="the long-horizon protocol (studies.protocols.horizon) on SETTING: a setting file "
                             "(JSON: task, tuned lrs, seeds) or the name of one in studies/horizon/ (the project's: "
                             "tinyarith, countdown, countdown-lesstrained, paths); steps and rules are the "
                             "protocol's (with --quick: a tiny plan for tests)")


def plan(quick: bool, setting: hz.Setting) -> dict[str, Any]:
    if quick:
        return dict(QUICK)
    return dict(min_steps=hz.MIN_STEPS, cap=hz.CAP_STEPS, seeds=setting.seeds, eval_every=hz.EVAL_EVERY,
                curve_problems=hz.CURVE_PROBLEMS, eval_problems=hz.EVAL_PROBLEMS,
                rl=dict(prompts_per_step=hz.PROMPTS_PER_STEP, num_generations=8,
                        selection_warmup=hz.SELECTION_WARMUP))


def rl_settings(p: dict[str, Any], steps: int) -> tinyrun.TinyRL:
    """The RL and evaluation settings of a ``steps``-step run under plan ``p`` (:func:`plan`)."""
    return tinyrun.TinyRL(steps=steps, eval_problems=p["eval_problems"], eval_n=hz.EVAL_N, eval_ks=hz.EVAL_KS,
                          eval_every=p["eval_every"], curve_problems=p["curve_problems"], **p["rl"])


def base_recipe(setting: hz.Setting, quick: bool) -> dict[str, Any]:
    """TinyRecipe kwargs: the task's grid recipe (``registry.task_recipe``: the task, its default difficulty, its
    module's ``RECIPE``) plus the setting's overrides; with ``quick`` the quick recipe's own budget wins."""
    from ictrl.experiments import demo
    from ictrl.experiments.tasks.registry import task_recipe

    kw: dict[str, Any] = dict(demo.QUICK_RECIPE) if quick else {}
    own = task_recipe(setting.task)
    kw.update({k: v for k, v in own.items() if k in ("task", "difficulty")})
    extra = {**{k: v for k, v in own.items() if k not in ("task", "difficulty")}, **setting.recipe}
    kw.update({k: v for k, v in extra.items() if not (quick and k in kw)})
    return kw


def run(args: argparse.Namespace) -> int:
    from studies.reports import horizon_report
    from ictrl.experiments.tasks.tinymodel import TinyRecipe, build_tiny_base

    if args.config is not None:
        raise UserError("--horizon runs on the embedded tasks; --config is not supported with it")
    setting = hz.load_setting(args.horizon)
    p = plan(bool(args.quick), setting)
    start = time.perf_counter()
    out: Path = args.output_dir
    recipe = TinyRecipe(**base_recipe(setting, bool(args.quick)))
    base = build_tiny_base(recipe)
    tuned = setting.tuned

    settings = functools.partial(rl_settings, p)

    def spec(method: str, seed: int) -> grid.RunSpec:
        lr, norm = tuned[method]
        return grid.RunSpec(method, seed, lr, norm=norm)

    stop = functools.partial(hz.stop_callback, p["min_steps"])
    probe_specs = [spec(hz.PROBE_METHOD, s) for s in p["seeds"]]
    probe = grid.run_grid(probe_specs, out / "probe",
                          functools.partial(tinyrun.train_tiny, settings(p["cap"]), base, callbacks=(stop,)),
                          jobs=args.jobs)
    stops = {s.seed: int(probe[s]["steps"]) for s in probe_specs}
    n = hz.horizon(list(stops.values()))
    atomic_write_text(out / "horizon.json", json.dumps(
        {"steps": n, "grpo_stop_steps": stops, "min_steps": p["min_steps"], "cap": p["cap"]}, indent=1) + "\n")
    specs = [spec(m, s) for s in p["seeds"] for m in hz.METHODS]
    for s in probe_specs:  # a GRPO seed that stopped at N is already phase 2's run
        src, dst = out / "probe" / s.relpath, out / "runs" / s.relpath
        if stops[s.seed] == n and not (dst / grid.DONE_FILE).exists():
            shutil.rmtree(dst, ignore_errors=True)
            shutil.copytree(src, dst)
    results = grid.run_grid(specs, out / "runs", functools.partial(tinyrun.train_tiny, settings(n), base),
                            jobs=args.jobs)
    base_result = grid.cached_result(out / "base" / "result.json",
                                     lambda: tinyrun.eval_tiny_base(settings(n), base, out / "base"))
    info = json.loads((base / "warm_start.json").read_text())
    paths = horizon_report.write(out, setting.name, setting, specs, results, base_result, info, stops, n,
                                 settings(n), p, time.perf_counter() - start, quick=bool(args.quick))
    print(paths["table"].read_text())
    print(f"wrote {paths['report']}", file=sys.stderr)
    return 0
