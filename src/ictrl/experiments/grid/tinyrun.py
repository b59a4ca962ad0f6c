"""Grid runs on an embedded task (``ictrl.experiments.tasks.registry``: tinyarith by default, or a task module such
as the studies' ``studies.tasks.paths``, as the base's recipe names it) on the cached warm-started base model of
``tinymodel.build_tiny_base``, trained with the engine's ``ICTGRPOTrainer`` (the same trainer class, run config and
``metrics.jsonl`` callback as ``ictrl train``) and evaluated on the task's held-out split.

Held-out evaluation samples with the training temperature and top-p, so the base model's P@1 is also its
expected training reward (the reference ``outcomes.label_run`` compares a run's final reward with).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any

from annotated_types import Ge

from ictrl.validation import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, check_fields
from ictrl.experiments.grid.methods import config_keys
from ictrl.experiments.grid.runner import EVAL_DIR, RULE_FILE, RunSpec, final_reward


@dataclass(frozen=True)
class TinyRL:
    """RL and evaluation budget on the embedded task (``default_tiny_settings`` fills it from ``ictrl demo``'s
    recipe, so compare runs are demo runs with another method, seed or lr)."""

    steps: Annotated[int, AT_LEAST_ONE] = field(default=60, metadata={"help": "optimizer steps per run"})
    lr: Annotated[float, POSITIVE] = field(
        default=1e-4, metadata={"help": "Adam learning rate (constant after warm-up)"})
    lr_warmup_steps: int = field(default=0, metadata={"help": "linear learning-rate warm-up steps"})
    prompts_per_step: Annotated[int, AT_LEAST_ONE] = field(
        default=32, metadata={"help": "prompts per generation batch"})
    num_generations: Annotated[int, Ge(2)] = field(default=8, metadata={"help": "G: samples per prompt"})
    num_iterations: Annotated[int, AT_LEAST_ONE] = field(
        default=2, metadata={"help": "optimizer steps per generation batch (mu)"})
    epsilon: float = field(default=0.2, metadata={"help": "lower clip"})
    epsilon_high: float = field(default=0.28, metadata={"help": "upper clip (DAPO clip-higher)"})
    temperature: Annotated[float, POSITIVE] = field(
        default=1.0, metadata={"help": "sampling temperature (training and eval)"})
    selection_warmup: int | None = field(default=None, metadata={"help": "Θ for the methods that warm up (ict, "
                                                                         "random10, frequent90); None: their default"})
    eval_problems: Annotated[int, AT_LEAST_ONE] = field(
        default=200, metadata={"help": "held-out problems (test split)"})
    eval_n: Annotated[int, Ge(4)] = field(
        default=4, metadata={"help": "samples per held-out problem (>= 4 for P@4)"})
    eval_split: str = field(default="test", metadata={"help": "split evaluated after training: test, or dev "
                                                      "for tuning runs", "choices": ("test", "dev")})
    eval_every: Annotated[int, NON_NEGATIVE] = field(
        default=0, metadata={"help": "optimizer steps between held-out pass@k evaluations during training (the eval/* "
                                     "curves); 0: only after training"})
    curve_problems: Annotated[int, AT_LEAST_ONE] = field(
        default=64, metadata={"help": "held-out problems (the first of the test split) evaluated during training"})
    eval_ks: tuple[int, ...] = field(default=(1, 4), metadata={"help": "pass@k reported (each k <= eval_n); "
                                                               "results carry p<k> per k"})

    def __post_init__(self) -> None:
        object.__setattr__(self, "eval_ks", tuple(self.eval_ks))
        check_fields(self)  # each field's type, the range in its annotation and its choices
        if not {1, 4} <= set(self.eval_ks) or max(self.eval_ks) > self.eval_n:
            raise ValueError(f"eval_ks must include 1 and 4 and stay <= eval_n={self.eval_n}, got {self.eval_ks}")


def tiny_run_config(settings: TinyRL, base: Path, spec: RunSpec, run_dir: Path) -> Any:
    """The validated ``RunConfig`` of one embedded-task run (the engine maps it onto ICTGRPOConfig)."""
    from ictrl.train_cli.run_config import config_from_dict, method_config
    from ictrl.experiments.tasks.tinymodel import task_max_new_tokens

    difficulty = _base_difficulty(base)
    batch = settings.prompts_per_step * settings.num_generations
    method = {**method_config(spec.method, settings.selection_warmup), **config_keys(spec.options)}
    if spec.ratio is not None:
        method["selection_ratio"] = spec.ratio
    if spec.norm is not None:
        method["loss_normalization"] = spec.norm
    data = {
        "model_name_or_path": str(base), "dtype": "float32",
        "output_dir": str(run_dir),
        **method,
        "num_generations": settings.num_generations, "temperature": settings.temperature,
        "max_completion_length": task_max_new_tokens(difficulty, base_task(base)),
        "learning_rate": spec.lr if spec.lr is not None else settings.lr, "lr_scheduler_type": "constant",
        "warmup_steps": settings.lr_warmup_steps, "epsilon": settings.epsilon, "epsilon_high": settings.epsilon_high,
        "beta": 0.0, "num_iterations": settings.num_iterations, "per_device_train_batch_size": batch,
        "max_steps": settings.steps, "seed": spec.seed, "weight_decay": 0.0, "max_grad_norm": 1.0,
        "report_to": "none", "logging_steps": 1, "disable_tqdm": True,
        "top_k": 0,  # pure sampling, as ictrl demo
        "save_strategy": "no",  # runs are short: a crashed run restarts rather than resumes
        "no_signal_steps": 0,  # every cell trains its step budget: a method that saturates is a result to compare
    }
    return config_from_dict(data, source=f"{spec.relpath} (embedded task)")


def _base_difficulty(base: Path) -> tuple[int, ...]:
    info = json.loads((base / "warm_start.json").read_text())
    return tuple(info["recipe"]["difficulty"])


def base_task(base: Path) -> str:
    """The task a cached base was warm-started on, as its recipe records it (a registered name or a module path,
    which ``registry.get_task`` resolves; bases from before the task field: tinyarith)."""
    return str(json.loads((base / "warm_start.json").read_text())["recipe"].get("task", "tinyarith"))


def _max_new(base: Path) -> int:
    from ictrl.experiments.tasks.tinymodel import task_max_new_tokens

    return task_max_new_tokens(_base_difficulty(base), base_task(base))


def tiny_eval_tasks(settings: TinyRL, base: Path) -> list[Any]:
    from ictrl.experiments.tasks.registry import get_task

    task = get_task(base_task(base))
    # seed 0 as ictrl demo: the held-out set depends only on the task, never on a run's seed.
    problems = task.generate_problems(settings.eval_problems, settings.eval_split, _base_difficulty(base), seed=0)
    return [task.eval_task(problems)]


def evaluate_model(model: Any, tokenizer: Any, tasks: list[Any], out_dir: Path, label: str, n: int,
                   max_new_tokens: int, temperature: float, top_p: float,
                   ks: tuple[int, ...] = (1, 4)) -> dict[str, float]:
    """Held-out pass@k as ``p<k>`` for each of ``ks`` (fractions, averaged over ``tasks``) with the HF backend,
    one eval seed (0)."""
    from ictrl.eval.generate import HFBackend
    from ictrl.eval.harness import EvalConfig, evaluate

    config = EvalConfig(model=label, n=n, ks=tuple(ks), max_new_tokens=max_new_tokens, temperature=temperature,
                        top_p=top_p, seeds=(0,), chunk_size=64, n_bootstrap=200)
    result = evaluate(tasks, HFBackend(model, tokenizer, batch_size=256), config, output_dir=out_dir,
                      progress=False)
    avg = result.summary["average"]["pass_at_k"]
    return {f"p{k}": float(avg[str(k)]["mean"]) for k in ks}


def train_tiny(settings: TinyRL, base: Path, spec: RunSpec, run_dir: Path,
               callbacks: Sequence[Callable[[Path], Any]] = ()) -> dict[str, Any]:
    """Train one run on the embedded task from scratch and evaluate it; returns p<k> per ``settings.eval_ks``,
    final_reward and steps. ``callbacks``: factories ``f(metrics_path) -> TrainerCallback`` added after the
    metrics log (so they see each step's row once it is written)."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from ictrl.train_cli.callbacks import MetricsJSONL
    from ictrl.train_cli.trainer_inputs import build_trainer_args, trainer_classes
    from ictrl.files import load_metrics
    from ictrl.experiments.tasks.registry import get_task
    from ictrl.experiments.tasks.tinymodel import load_tiny_base
    from ictrl.experiments.reports.update_norm import UpdateNorm

    for stale in list(run_dir.iterdir()):  # an unfinished attempt: start over (the grid's record of the rule stays)
        if stale.name != RULE_FILE:
            shutil.rmtree(stale) if stale.is_dir() else stale.unlink()
    cfg = tiny_run_config(settings, base, spec, run_dir)
    args = build_trainer_args(cfg, cfg.output_dir)
    model, tokenizer = load_tiny_base(base)
    task = get_task(base_task(base))
    dataset = task.train_dataset(settings.prompts_per_step, settings.steps, _base_difficulty(base), spec.seed)
    _, trainer_cls = trainer_classes()
    trainer = trainer_cls(model=model, reward_funcs=[task.reward], args=args, train_dataset=dataset,
                          processing_class=tokenizer)
    for cb in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(cb)
    metrics_path = run_dir / "metrics.jsonl"
    trainer.add_callback(UpdateNorm())  # before MetricsJSONL: it adds ictrl/update_norm to the row that one writes
    trainer.add_callback(MetricsJSONL(metrics_path, accuracy_reward=task.reward.__name__))
    if settings.eval_every:
        trainer.add_callback(curve_callback(settings, base, spec).bind(trainer))
    for make in callbacks:
        trainer.add_callback(make(metrics_path))
    try:
        trainer.train()
    except RuntimeError as exc:
        if not is_divergence(exc):
            raise
        # Weights gone non-finite (sampling from nan/inf probabilities): an outcome of the run, not a bug.
        # The model can no longer sample, so it scores 0 on the held-out set.
        records = load_metrics(metrics_path) if metrics_path.exists() else []
        return {**{f"p{k}": 0.0 for k in settings.eval_ks}, "final_reward": final_reward(records),
                "steps": trainer.state.global_step,
                "diverged": str(exc)[:300]}
    tasks = tiny_eval_tasks(settings, base)
    scores = evaluate_model(trainer.model, tokenizer, tasks, run_dir / EVAL_DIR, f"{spec.relpath}", settings.eval_n,
                            _max_new(base), settings.temperature, 1.0, settings.eval_ks)
    return {**scores, "final_reward": final_reward(load_metrics(metrics_path)), "steps": trainer.state.global_step}


def curve_callback(settings: TinyRL, base: Path, spec: RunSpec) -> Any:
    """Held-out pass@k every ``settings.eval_every`` steps on the first ``curve_problems`` test problems, with the
    end-of-run evaluation's sampling settings and seed: the ``eval/avg/pass@1`` curves of the grid's reports."""
    from ictrl.train_cli.eval_callback import PassAtKCallback
    from ictrl.eval.harness import EvalConfig, EvalTask

    (task,) = tiny_eval_tasks(settings, base)
    subset = EvalTask(task.name, list(task.problems)[:settings.curve_problems], task.prompt_fn, task.reward_fn,
                      task.extract_fn)
    config = EvalConfig(model=spec.relpath, n=settings.eval_n, ks=settings.eval_ks,
                        max_new_tokens=_max_new(base), temperature=settings.temperature,
                        top_p=1.0, seeds=(0,), n_bootstrap=1)
    return PassAtKCallback([subset], config, every=settings.eval_every, batch_size=256)


def is_divergence(exc: BaseException) -> bool:
    """torch's error for sampling from a distribution with nan / inf / negative entries."""
    text = str(exc).lower()
    return "probability tensor contains" in text or ("nan" in text and "inf" in text)


def eval_tiny_base(settings: TinyRL, base: Path, out_dir: Path) -> dict[str, Any]:
    from ictrl.experiments.tasks.tinymodel import load_tiny_base

    model, tokenizer = load_tiny_base(base)
    return evaluate_model(model, tokenizer, tiny_eval_tasks(settings, base), out_dir, str(base), settings.eval_n,
                          _max_new(base), settings.temperature, 1.0, settings.eval_ks)


