"""The options of ``ictrl compare`` (and of the studies built on it), and the :class:`Experiment` they build
from them: an embedded task (``tinyrun``) or a run config (``configrun``)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ictrl.errors import UserError
from ictrl.experiments.grid import configrun
from ictrl.experiments.grid import tinyrun
from ictrl.experiments.grid.runner import DEFAULT_METHODS, METHODS, RunSpec

# --quick: ictrl demo's quick base model and an RL budget small enough for tests (seconds per run). Its reports
# say first that they are a pipeline check (PIPELINE_CHECK), not a result.
QUICK_RL = dict(steps=2, prompts_per_step=4, num_generations=4, num_iterations=1, selection_warmup=0,
                eval_problems=8)


PIPELINE_CHECK = ("PIPELINE CHECK (--quick: a tiny base model, a few steps per run): this shows that the commands "
                  "run end to end, not which method is better.")


def add_common_arguments(parser: Any, default_output: str) -> None:
    """The grid options of ``ictrl compare``, which the studies' grids share."""
    parser.add_argument("--methods", default=",".join(DEFAULT_METHODS),
                        help=f"comma-separated methods from: {', '.join(METHODS)}, their selector names, or "
                             "module:function, each with options of its own as NAME(key=value, ...), e.g. "
                             "'ict,h2rule:top_h2(ratio=0.2),h2rule:top_h2(ratio=0.3)' (default: %(default)s)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per method (0..N-1; default: %(default)s)")
    parser.add_argument("--steps", type=int, default=None,
                        help="optimizer steps per run (default: the embedded recipe's, or the config's max_steps)")
    parser.add_argument("--output-dir", "--output_dir", type=Path, default=Path(default_output),
                        help="where run directories, tables, plots and report.html go; a rerun resumes")
    parser.add_argument("--config", type=Path, default=None,
                        help="an `ictrl train` YAML config instead of the embedded task (its token_selector and "
                             "selection keys are replaced per method; held-out eval on its eval_datasets)")
    parser.add_argument("--quick", action="store_true", help="a tiny base model and 2 steps per run (tests)")
    parser.add_argument("--eval-problems", type=int, default=None,
                        help="held-out problems (embedded task; default 200) or per-benchmark limit (--config)")
    parser.add_argument("--prompts-per-step", type=int, default=None, help="embedded task: prompts per step")
    parser.add_argument("--selection-warmup", type=int, default=None,
                        help="embedded task: Θ, steps of full GRPO before ict/random10 select (default: their "
                             f"registered Θ, {METHODS['ict'].warmup_steps}); scale it down with --steps")
    parser.add_argument("--eval-every", type=int, default=None,
                        help="embedded task: held-out pass@k every N optimizer steps during training (the "
                             "eval/avg/pass@1 curve); default: only after training")
    parser.add_argument("--jobs", type=int, default=1, help="runs in parallel, one torch thread each")


@dataclass
class Experiment:
    """What a grid command needs: how to run one cell, how to evaluate the base model, what to record."""

    runner: Callable[[RunSpec, Path], dict[str, Any]]
    eval_base: Callable[[Path], dict[str, Any]]
    settings: dict[str, Any]
    default_lr: float | None


def make_experiment(args: Any, log: Callable[[str], None] = print) -> Experiment:
    """The embedded task (building or reusing the cached base) or ``--config``, from the shared options."""
    if args.steps is not None and args.steps < 1:
        raise UserError(f"--steps must be at least 1, got {args.steps}")
    if args.eval_problems is not None and args.eval_problems < 1:
        raise UserError(f"--eval-problems must be at least 1, got {args.eval_problems}")
    if args.config is not None:
        if not args.config.is_file():
            raise UserError(f"--config: {args.config}: file not found")
        if getattr(args, "task", None) not in (None, "tinyarith"):  # the default cannot be told from a given one
            raise UserError(f"--task {args.task}: the embedded task's option; with --config the runs train on the "
                            "config's dataset_name")
        probe = configrun.load_run_config(args.config, RunSpec("grpo", 0), args.output_dir / "_probe", args.steps)
        runner = functools.partial(configrun.config_run, args.config, args.steps, args.eval_problems)
        return Experiment(
            runner=runner,
            eval_base=lambda out: configrun.eval_config_base(args.config, out, args.eval_problems),
            settings={"source": "config", "config": str(args.config), "steps": probe.trainer.get("max_steps", -1),
                      "model": probe.model.model_name_or_path, "eval": list(probe.script.eval_datasets),
                      "eval_limit": args.eval_problems, "quick": bool(args.quick)},
            default_lr=probe.trainer.get("learning_rate", 1e-6),
        )
    from ictrl.experiments.tasks.registry import task_recipe
    from ictrl.experiments.tasks.tinymodel import TinyRecipe, build_tiny_base

    recipe_kw, rl_kw = default_tiny_settings(args.quick)
    # The task and its difficulty always; with --quick the quick recipe's own budget (steps, problems) wins.
    recipe_kw.update({k: v for k, v in task_recipe(getattr(args, "task", None) or "tinyarith", "--task").items()
                      if k in ("task", "difficulty") or not (args.quick and k in recipe_kw)})
    # Base-recipe overrides a caller puts on ``args.recipe`` (a study's base: its tuning runs start from the same base
    # as its long runs). With --quick the quick recipe's own fields win.
    recipe_kw.update({k: v for k, v in (getattr(args, "recipe", None) or {}).items()
                      if not (args.quick and k in recipe_kw)})
    if args.steps is not None:
        rl_kw["steps"] = args.steps
    if args.eval_problems is not None:
        rl_kw["eval_problems"] = args.eval_problems
    if args.prompts_per_step is not None:
        rl_kw["prompts_per_step"] = args.prompts_per_step
    if getattr(args, "eval_every", None) is not None:
        rl_kw["eval_every"] = args.eval_every
    if args.selection_warmup is not None:
        if args.selection_warmup < 0:
            raise UserError(f"--selection-warmup must be >= 0, got {args.selection_warmup}")
        rl_kw["selection_warmup"] = args.selection_warmup
    recipe = TinyRecipe(**recipe_kw)
    try:  # the flags' values, before the base model is built
        settings = tinyrun.TinyRL(**rl_kw)
    except ValueError as exc:
        raise UserError(_flag_error(str(exc))) from None
    base = build_tiny_base(recipe, log=log)
    return Experiment(
        runner=functools.partial(tinyrun.train_tiny, settings, base),
        eval_base=functools.partial(tinyrun.eval_tiny_base, settings, base),
        settings={"source": "embedded", "base": str(base), "recipe": asdict(recipe), "rl": asdict(settings),
                  "quick": bool(args.quick)},
        default_lr=settings.lr,
    )


def _flag_error(message: str) -> str:
    """A TinyRL field's error worded with the flag that set it (``prompts_per_step`` -> ``--prompts-per-step``)."""
    for flag in ("steps", "prompts_per_step", "eval_problems", "eval_every", "selection_warmup"):
        if message.startswith(flag):
            return "--" + flag.replace("_", "-") + message[len(flag):]
    return message


def default_tiny_settings(quick: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """(TinyRecipe kwargs, TinyRL kwargs): ``ictrl demo``'s base recipe (seed 0, shared by every run) and RL plan."""
    from ictrl.experiments import demo

    if quick:
        return dict(demo.QUICK_RECIPE), dict(QUICK_RL)
    plan = demo.FULL
    # ictrl demo's full run uses TinyRecipe()'s defaults (seed = its --seed); every grid run shares seed 0's base.
    return {}, {"steps": plan["steps"], "lr": plan["lr"], "prompts_per_step": plan["prompts"],
                "num_generations": plan["generations"], "eval_problems": plan["eval_problems"],
                "eval_n": plan["eval_samples"]}


def embedded_task_note(settings: dict[str, Any], lr: bool = True) -> str:
    """The report's note on an embedded-task grid's settings (``lr``: name the learning rate, for a grid that has
    one)."""
    from ictrl.experiments.grid.runner import theta

    rl = settings["rl"]
    return (f"Embedded task: base model {Path(settings['base']).name} (the embedded warm-start recipe); "
            f"{rl['steps']} optimizer steps per run, {rl['prompts_per_step']} prompts x {rl['num_generations']} "
            f"samples, {rl['num_iterations']} optimizer steps per generation batch"
            + (f", lr {rl['lr']:g}" if lr else "")
            + f", selection warm-up Θ = {theta(rl)} steps (ict/random10), {rl['eval_problems']} held-out problems "
            f"x {rl['eval_n']} samples.")
