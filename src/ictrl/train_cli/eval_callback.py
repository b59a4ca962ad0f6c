"""Evaluation during training: pass@k of the current policy every ``eval_steps`` optimizer steps.

:class:`PassAtKCallback` runs ``ictrl.eval.evaluate`` on fixed problems (the first ``eval_limit`` of each
benchmark) with a fixed sampling seed (``eval_seed``), so two evaluations differ only by the weights. Its numbers
join the training metrics of that step (``eval/<benchmark>/pass@k``, ``eval/avg/pass@k``, ``eval/total`` =
mean over k of the averages, ``eval/time``): through the trainer's log they reach ``metrics.jsonl`` and every
``report_to`` tracker.

Best checkpoint: with ``metric_for_best_model`` naming one of these keys (``eval/total``), an improvement (by
``greater_is_better``) records ``state.best_metric`` / ``state.best_global_step`` and makes the trainer save a
checkpoint at that step; transformers' own ``_save_checkpoint`` then sets ``state.best_model_checkpoint``, which
checkpoint rotation (``save_total_limit``) never deletes and which ``trainer_state.json`` records. This is
transformers' ``metric_for_best_model`` bookkeeping fed by this callback instead of ``Trainer.evaluate`` (GRPO has
no evaluation loss to compare).

With several processes, process 0 generates with the unwrapped model while the others wait; the metrics are
broadcast so every process takes the same save decision.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

from transformers import TrainerCallback

from ictrl.eval.harness import EvalConfig, EvalTask, benchmark_tasks, evaluate

PREFIX = "eval/"


def eval_metrics(summary: dict[str, Any]) -> dict[str, float]:
    """Flat ``eval/...`` metrics from an ``ictrl.eval`` summary (means over its one seed)."""
    out: dict[str, float] = {}
    for name, bench in summary["benchmarks"].items():
        for k, stat in bench["pass_at_k"].items():
            out[f"{PREFIX}{name}/pass@{k}"] = float(stat["mean"])
    for k, stat in summary["average"]["pass_at_k"].items():
        out[f"{PREFIX}avg/pass@{k}"] = float(stat["mean"])
    out[f"{PREFIX}total"] = float(summary["total"]["mean"])
    return out


class PassAtKCallback(TrainerCallback):
    """Every ``every`` optimizer steps: pass@k on ``tasks`` with ``config``; call :meth:`bind` with the trainer.

    ``metric_for_best`` (a key of :func:`eval_metrics`, or None) and ``greater_is_better`` pick the best step.
    ``every`` is checked where it is set: ``ICTGRPOConfig.eval_steps`` (an int >= 1 with ``eval_benchmarks``).
    """

    def __init__(self, tasks: Sequence[EvalTask], config: EvalConfig, every: int, batch_size: int = 16,
                 metric_for_best: str | None = None, greater_is_better: bool = True) -> None:
        if len(config.seeds) != 1:
            raise ValueError(f"evaluation during training uses one fixed sampling seed, got seeds={config.seeds}")
        self.tasks, self.config, self.every, self.batch_size = list(tasks), config, every, batch_size
        self.metric_for_best, self.greater_is_better = metric_for_best, greater_is_better
        self.trainer: Any = None

    @classmethod
    def from_args(cls, args: Any, tokenizer: Any, data_root: str | None = None) -> PassAtKCallback:
        """Built from ``ICTGRPOConfig``'s ``eval_*`` fields: benchmark specs, problems, samples, ks, seed."""
        tasks = benchmark_tasks(args.eval_benchmarks, tokenizer=tokenizer, limit=args.eval_limit, data_root=data_root)
        config = EvalConfig(model="(training policy)", n=args.eval_num_samples, ks=tuple(args.eval_ks),
                            max_new_tokens=args.eval_max_new_tokens, temperature=args.eval_temperature,
                            seeds=(args.eval_seed,), n_bootstrap=1)
        metric = args.metric_for_best_model
        best = metric if metric and metric.startswith(PREFIX) else None
        return cls(tasks, config, int(args.eval_steps), batch_size=args.per_device_eval_batch_size,
                   metric_for_best=best, greater_is_better=args.greater_is_better is not False)

    def bind(self, trainer: Any) -> PassAtKCallback:
        """The trainer whose log carries the metrics (TRL merges ``trainer._metrics`` into the step's log)."""
        plugin = getattr(trainer.accelerator.state, "deepspeed_plugin", None)
        if getattr(trainer, "is_fsdp_enabled", False) or (plugin is not None and plugin.zero_stage == 3):
            raise ValueError("evaluation during training generates on process 0 with the whole model: it does not "
                             "support FSDP or DeepSpeed ZeRO-3 (sharded parameters); evaluate checkpoints with "
                             "`ictrl eval` instead")
        self.trainer = trainer
        return self

    def evaluate_now(self) -> dict[str, float]:
        """Run the evaluation on process 0 and broadcast its metrics to every process."""
        from accelerate.utils import broadcast_object_list

        from ictrl.eval.generate import HFBackend

        trainer = self.trainer
        acc = trainer.accelerator
        payload: list[Any] = [None]
        if acc.is_main_process:
            start = time.perf_counter()
            model = acc.unwrap_model(trainer.model)
            backend = HFBackend(model, trainer.processing_class, batch_size=self.batch_size)
            result = evaluate(self.tasks, backend, self.config, output_dir=None, progress=False)
            payload[0] = {**eval_metrics(result.summary), f"{PREFIX}time": time.perf_counter() - start}
        if acc.num_processes > 1:
            broadcast_object_list(payload, from_process=0)
        return payload[0]

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step % self.every:
            return
        if self.trainer is None:
            raise RuntimeError("PassAtKCallback needs the trainer: call callback.bind(trainer) after add_callback")
        metrics = self.evaluate_now()
        logged = self.trainer._metrics["train"]
        for key, value in metrics.items():
            logged[key].append(value)
        control.should_log = True  # the numbers join this step's row, not a later one
        if self.metric_for_best is None:
            return
        if self.metric_for_best not in metrics:
            raise KeyError(f"metric_for_best_model={self.metric_for_best!r} is not an evaluation metric; "
                           f"choose one of {sorted(metrics)}")
        value = metrics[self.metric_for_best]
        best = state.best_metric
        better = best is None or not math.isfinite(best) or (value > best if self.greater_is_better else value < best)
        if better:
            state.best_metric = value
            state.best_global_step = state.global_step
            control.should_save = True  # the best step must have a checkpoint for rotation to keep
