"""The statistics paths: where a step's statistics come from. Each path is a stateless object, planned once per mode
when the trainer is built (docs/architecture.md, "Which statistics path a run takes, measured"): what it does at
generation, the loss's forward it makes, and the statistics the selection reads. The trainer calls the mode's path
and never asks which it is; the selection itself is the trainer's, made once per generation batch
(``ICTGRPOTrainer._select``).

- :class:`Separate`: a no-grad forward of its own at generation, whose statistics ride the batch to the selection;
  the loss's forward is TRL's (or the sparse head's) alone. The reference the other is tested against.
- :class:`TrainingForward`: the loss's own forward gives the statistics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ictrl.core.selection import FIELD_WORDS
from ictrl.engine.loss_inputs import LossInputsBuilder, carried_stats, carry_stats
from ictrl.engine.stats_source import STATS_PATHS, LossForward, Stats, StepContext, Wants


@dataclass(frozen=True)
class PathFacts:
    """What decides the statistics path of a run in one mode (docs/architecture.md, "Which statistics path a run
    takes, measured")."""

    one_pass: bool                # False forces the separate pass (the reference the others are tested against)
    dynamic_sampling: bool
    stat_free: bool               # the selector reads no statistics (all, random)
    same_temperature: bool        # selection temperature == sampling temperature
    training: bool
    trl_computes_old_logps: bool
    importance_correction: bool   # π_old at generation for the importance weight (vLLM's, a rollout_func's)
    on_policy_single_micro_batch: bool  # num_iterations == 1 and steps_per_generation == 1


def plan_path(f: PathFacts) -> StatsPath:
    """The path of one mode: the loss's forward where it can give the statistics, else the separate pass."""
    if not f.one_pass or f.dynamic_sampling or f.importance_correction:
        return Separate()
    if f.stat_free:
        return TrainingForward() if f.same_temperature else Separate()
    if not f.training or f.trl_computes_old_logps:
        return Separate()
    return TrainingForward() if f.on_policy_single_micro_batch else Separate()


# How a run's first lines name a path, in words (``describe_statistics``).
PATH_WORDS = {
    "Separate": "a no-grad forward of their own at generation",
    "TrainingForward": "the loss's own forward, where the selection is made",
}


def describe_statistics(rule: str, needs: frozenset[str], paths: dict[str, StatsPath], warmup_steps: int,
                        evaluating: bool = False) -> str:
    """The line a run starts with about its statistics: which ``rule`` reads (``needs``, in words) and where the
    training steps take them from (``paths``; the evaluation's too when ``evaluating`` and it differs), with the code
    ``ictrl/stats_path`` logs."""
    if not needs:
        return f"statistics: {rule} reads none, so no statistics pass runs (the metrics come from the loss's forward)"
    read = ", ".join(f"{name} ({FIELD_WORDS.get(name, name)})" for name in sorted(needs))
    where = {mode: f"{PATH_WORDS.get(type(path).__name__, type(path).__name__)} (ictrl/stats_path {path.code:g})"
             for mode, path in paths.items()}
    line = f"statistics: {rule} reads {read}; training computes them from {where['train']}"
    if "ict_score" not in needs:
        line += "; no group JS sweep"
    if evaluating and where.get("eval", where["train"]) != where["train"]:
        line += f"; evaluation from {where['eval']}"
    if warmup_steps:
        line += f"; none during the {warmup_steps} warm-up steps"
    return line


class StatsPath:
    """Where one mode's statistics come from: what the path does at generation (:meth:`at_generation`), the loss's
    forward (:meth:`loss_forward`) and the statistics of a generation batch's micro-batches the selection reads
    (:meth:`statistics`)."""

    code: float  # ictrl/stats_path

    def at_generation(self, builder: LossInputsBuilder, model: Any, batch: dict[str, Any], step: StepContext
                      ) -> float | None:
        """What the path puts in the generation ``batch`` for its selection; returns the ``ictrl/stats_path`` it
        logs now, or None when the loss's forward logs it."""
        raise NotImplementedError

    def loss_forward(self, builder: LossInputsBuilder, model: Any, batch: dict[str, Any], step: StepContext
                     ) -> LossForward:
        """The loss's forward of the micro-batch ``batch``."""
        raise NotImplementedError

    def statistics(self, builder: LossInputsBuilder, batches: list[dict[str, Any]], out: LossForward | None
                   ) -> list[Stats]:
        """The statistics of each micro-batch of one generation batch, for its selection (``out``: the loss's
        forward of the micro-batch the loss holds)."""
        raise NotImplementedError


class Separate(StatsPath):
    """The separate statistics pass at generation; in the loss, TRL's forward (its dense one for its entropy bonus,
    entropy mask or router loss), or the backbone and the sparse head (``sparse_backward``)."""

    code = STATS_PATHS["separate"]

    def at_generation(self, builder: LossInputsBuilder, model: Any, batch: dict[str, Any], step: StepContext
                      ) -> float | None:
        """The statistics of the generation ``batch``, carried in it with each row's place in generation order."""
        carry_stats(batch, builder.statistics(model, batch, step))
        builder.keep_row_order(batch)
        return self.code

    def loss_forward(self, builder: LossInputsBuilder, model: Any, batch: dict[str, Any], step: StepContext
                     ) -> LossForward:
        if step.dense:
            wants: Wants | None = Wants(sum_sq=False, aux=step.router_loss)
        else:
            wants = None if step.sparse else Wants(sum_sq=False)
        return builder.loss_forward(model, batch, step, wants)

    def statistics(self, builder: LossInputsBuilder, batches: list[dict[str, Any]], out: LossForward | None
                   ) -> list[Stats]:
        return [carried_stats(b) for b in batches]


class TrainingForward(StatsPath):
    """On-policy with one micro-batch per generation batch: the loss's forward gives the statistics, on the
    generation batch TRL has shuffled; for a selector that reads no statistics it gives only their metrics, where
    they are logged."""

    code = STATS_PATHS["training_forward"]

    def at_generation(self, builder: LossInputsBuilder, model: Any, batch: dict[str, Any], step: StepContext
                      ) -> float | None:
        builder.keep_row_order(batch)
        return None

    def loss_forward(self, builder: LossInputsBuilder, model: Any, batch: dict[str, Any], step: StepContext
                     ) -> LossForward:
        source = builder.source
        step.metrics["ictrl/stats_path"].append(self.code)
        if source.stat_free:  # TRL's fused head; log Σp² for the metrics where they are logged
            return builder.loss_forward(model, batch, step, Wants(sum_sq=step.logged), stats=step.logged)
        if step.sparse:  # the backbone, the statistics swept from its hidden states, then the sparse head
            wants: Wants | None = None
        elif source.from_trl_head(step.needs):
            wants = Wants(sum_sq=step.sum_sq)
        else:  # TRL's fused head keeping the hidden states the statistics sweep
            wants = Wants(sum_sq=False, hidden=source.backbone(model))
        return builder.loss_forward(model, batch, step, wants, stats=True)

    def statistics(self, builder: LossInputsBuilder, batches: list[dict[str, Any]], out: LossForward | None
                   ) -> list[Stats]:
        """The loss's forward's statistics: the micro-batch is the whole generation batch. A selector that reads
        none selects without them, over any number of micro-batches (their metrics come with each loss's
        forward)."""
        if builder.source.stat_free:
            return [(None, None)] * len(batches)
        if len(batches) != 1 or out is None or out.stats is None:
            raise RuntimeError("the training_forward path selects a generation batch of one micro-batch with the "
                               f"statistics of the loss's forward of it; got {len(batches)} micro-batches")
        return [out.stats]
