"""Grid runs from a run config (``ictrl compare --config``): ``ictrl train``'s own ``train_cli.run.train`` with
the grid's method, seed, learning rate and step budget, resumed from its last complete checkpoint, then evaluated
on the config's ``eval_datasets``."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from ictrl.errors import UserError
from ictrl.experiments.grid.methods import config_keys
from ictrl.experiments.grid.runner import EVAL_DIR, RunSpec, final_reward
from ictrl.experiments.grid.tinyrun import evaluate_model

CONFIG_EVAL_N = 4  # samples per problem when evaluating --config runs (n >= the largest k, 4)


def config_run(config_path: Path, steps: int | None, eval_limit: int | None, spec: RunSpec,
               run_dir: Path) -> dict[str, Any]:
    """One run of ``ictrl train`` from ``config_path`` with the grid's method / seed / lr / steps, resumed from
    its last complete checkpoint when there is one, then evaluated on the config's ``eval_datasets``."""
    from ictrl.checkpoints import complete_checkpoints
    from ictrl.train_cli.run import train
    from ictrl.files import load_metrics
    from ictrl.models import load_model_and_tokenizer

    cfg = load_run_config(config_path, spec, run_dir, steps)
    resume = bool(complete_checkpoints(run_dir))
    shutil.rmtree(run_dir / EVAL_DIR, ignore_errors=True)  # an eval of an unfinished model is stale
    if not resume and (run_dir / "metrics.jsonl").exists():
        (run_dir / "metrics.jsonl").unlink()
    if not resume:  # the grid's own cell, started again: what an earlier try left is replaced by name
        from ictrl.checkpoints import OVERWRITE_FLAG

        cfg.modes = frozenset({OVERWRITE_FLAG})
    result = train(cfg, resume=resume, source=str(config_path))
    model, tokenizer = load_model_and_tokenizer(str(result.final_model), dtype=cfg.model.dtype or "auto")
    scores = config_eval(cfg, model, tokenizer, run_dir / EVAL_DIR, str(result.final_model), eval_limit)
    records = load_metrics(run_dir / "metrics.jsonl")
    return {**scores, "final_reward": final_reward(records), "steps": result.global_step, "resumed": resume}


def load_run_config(config_path: Path, spec: RunSpec, run_dir: Path, steps: int | None) -> Any:
    """The config file with the method section replaced and output_dir / seed / lr / max_steps set."""
    from ictrl.train_cli.run_config import METHOD_FIELDS, config_from_dict, method_config, read_yaml

    data = read_yaml(config_path)
    for key in METHOD_FIELDS:
        data.pop(key, None)  # the grid's method replaces the config's, defaults included
    # logging_steps=1: the grid's curves and final reward read every step's row of metrics.jsonl
    data.update(method_config(spec.method), **config_keys(spec.options), output_dir=str(run_dir), seed=spec.seed,
                disable_tqdm=True, logging_steps=1)
    if spec.lr is not None:
        data["learning_rate"] = spec.lr
    if steps is not None:
        data["max_steps"] = steps
    cfg = config_from_dict(data, source=str(config_path))
    if not cfg.script.eval_datasets:
        raise UserError(f"{config_path}: eval_datasets: --config needs held-out benchmarks to evaluate on")
    return cfg


def config_eval(cfg: Any, model: Any, tokenizer: Any, out_dir: Path, label: str, limit: int | None) -> dict[str, float]:
    from ictrl.eval.harness import benchmark_tasks

    tasks = benchmark_tasks(cfg.script.eval_datasets, tokenizer=tokenizer, limit=limit)
    t = cfg.trainer
    return evaluate_model(model, tokenizer, tasks, out_dir, label, CONFIG_EVAL_N, t.get("max_completion_length", 256),
                          t.get("temperature", 1.0), t.get("top_p", 1.0))


def eval_config_base(config_path: Path, out_dir: Path, eval_limit: int | None) -> dict[str, Any]:
    from ictrl.models import load_model_and_tokenizer

    cfg = load_run_config(config_path, RunSpec("grpo", 0), out_dir, None)
    model, tokenizer = load_model_and_tokenizer(cfg.model.model_name_or_path, dtype=cfg.model.dtype or "auto")
    return config_eval(cfg, model, tokenizer, out_dir / EVAL_DIR, cfg.model.model_name_or_path, eval_limit)


