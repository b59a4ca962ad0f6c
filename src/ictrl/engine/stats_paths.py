"""The statistics paths: where a step's statistics come from and when its selection is made. Each path is one object
with what it does at generation and what it does in the loss, planned once per mode when the trainer is built
(docs/architecture.md, "The statistics path"); the trainer calls the mode's path and never asks which it is.

- :class:`Separate`: a no-grad forward of its own at generation, which selects the batch; the loss's forward is
  TRL's (or the sparse head's) alone. The reference the others are tested against.
- :class:`TrainingForward`: the loss's own forward gives the statistics, and the selection is made there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ictrl.core.selection import FIELD_WORDS
from ictrl.engine.selection_step import ROW, SELECTED, LossInputs, SelectionStep, response_mask
from ictrl.engine.stats_pass import STATS_PATHS, StepContext, Wants


@dataclass(frozen=True)
class PathFacts:
    """What decides the statistics path of a run in one mode (docs/architecture.md, "The statistics path")."""

    one_pass: bool                # False forces the separate pass (the reference the others are tested against)
    dynamic_sampling: bool
    stat_free: bool               # the selector reads no statistics (all, random)
    same_temperature: bool        # selection temperature == sampling temperature
    training: bool
    trl_computes_old_logps: bool
    on_policy_single_micro_batch: bool  # num_iterations == 1 and steps_per_generation == 1


def plan_path(f: PathFacts) -> Separate:
    """The path of one mode: the loss's forward where it can give the statistics, else the separate pass."""
    if not f.one_pass or f.dynamic_sampling:
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


def describe_statistics(rule: str, needs: frozenset[str], paths: dict[str, Separate], warmup_steps: int,
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


class Separate:
    """The separate statistics pass at generation; in the loss, TRL's forward (its dense one for its entropy bonus,
    entropy mask or router loss), or the backbone and the sparse head (``sparse_backward``)."""

    code = STATS_PATHS["separate"]  # ictrl/stats_path

    def at_generation(self, selection: SelectionStep, model: Any, batch: dict[str, Any], step: StepContext,
                      importance_correction: bool) -> float | None:
        """Select the generation ``batch`` (its ``ictrl_selected``); returns the ``ictrl/stats_path`` it logs, or
        None when its statistics and selection come with the loss's forward."""
        selection.at_generation(model, batch, step)
        return self.code

    def in_loss(self, selection: SelectionStep, model: Any, batch: dict[str, Any], step: StepContext) -> LossInputs:
        """What the loss reads of the micro-batch ``batch``, selected at generation."""
        if step.dense:
            wants: Wants | None = Wants(sum_sq=False, aux=step.router_loss)
        else:
            wants = None if step.sparse else Wants(sum_sq=False)
        return selection.for_loss(model, batch, step, selection.loss_forward(model, batch, step, wants))


class TrainingForward(Separate):
    """On-policy with one micro-batch per generation batch: the loss's forward gives the statistics and the
    selection is made there, on the generation batch TRL has shuffled; a selector that reads no statistics selects
    at generation, and the loss's forward gives only its metrics."""

    code = STATS_PATHS["training_forward"]

    def at_generation(self, selection: SelectionStep, model: Any, batch: dict[str, Any], step: StepContext,
                      importance_correction: bool) -> float | None:
        """A batch whose sampler log-probs get the importance weight needs π_old at generation: the separate
        pass."""
        if importance_correction:
            return super().at_generation(selection, model, batch, step, importance_correction)
        selection.keep_row_order(batch)
        if selection.source.stat_free:  # selected now; the metrics come with the loss's forward
            selection.at_generation(model, batch, step, given=(None, None))
        return None

    def in_loss(self, selection: SelectionStep, model: Any, batch: dict[str, Any], step: StepContext) -> LossInputs:
        if ROW not in batch:  # selected at generation by the separate pass
            return super().in_loss(selection, model, batch, step)
        source = selection.source
        if source.stat_free:  # TRL's fused head; log Σp² for the metrics where they are logged
            out = selection.loss_forward(model, batch, step, Wants(sum_sq=step.logged), stats=step.logged)
            if out.stats is not None:
                assert out.stats[0] is not None
                selection.log(step, response_mask(batch), out.stats[0], batch[SELECTED])
        else:
            if step.sparse:  # the backbone, the statistics swept from its hidden states, then the sparse head
                wants: Wants | None = None
            elif source.from_trl_head(step.needs):
                wants = Wants(sum_sq=step.sum_sq)
            else:  # TRL's fused head keeping the hidden states the statistics sweep
                wants = Wants(sum_sq=False, hidden=source.backbone(model))
            out = selection.loss_forward(model, batch, step, wants, stats=True)
            selection.select_in_loss(batch, step, out)
        step.metrics["ictrl/stats_path"].append(self.code)
        return selection.for_loss(model, batch, step, out)
