"""The statistics pass: per-token statistics and the group JS score of the sampling policy, and where they come from.

:class:`StatsSource` is the run's one source of statistics, built once when the trainer is
(:meth:`StatsSource.plan`). It decides the path of each mode once, from :class:`PathFacts`, and is called one way,
``source(model, input_ids, attention_mask, mask, group_ids, ...) -> (TokenStats, js)``, whether the statistics come
from the model's own forward over the batch, from hidden states the loss's forward kept, or from TRL's fused head.
Three paths, logged as ``ictrl/stats_path`` (:data:`STATS_PATHS`):

- ``training_forward`` (2): the statistics come from the loss's own forward. Used for ``all`` (its selection is the
  response mask, so only the metrics need statistics: TRL's fused head returns log-probs, entropy and Σp² in the
  same kernel), and, for every other selector, when the run is on-policy and one micro-batch holds the whole local
  generation batch (``num_iterations`` = 1, ``steps_per_generation`` = 1, TRL computes no old log-probs): the
  backbone runs once with grad, the statistics sweep over its hidden states is no-grad, the selection runs on the
  whole generation batch gathered from all processes, and then the head with grad runs (on the selected positions
  only with ``sparse_backward``; TRL's fused head over every position otherwise).
- ``shared_old_logps`` (1): TRL computes old-policy log-probs (``num_iterations`` > 1, or generation batches split
  over several optimizer steps, or vLLM importance sampling). Its no-grad pass is replaced by the statistics pass,
  whose ``logprob`` (same rows, same temperature) is returned as TRL's old log-probs: one pass instead of two.
- ``separate`` (0): the statistics pass of its own (eval, a micro-batch that cannot hold a scope unit, top-K from
  the sampler, dynamic sampling, tools, a selection temperature other than the sampling one where the path would
  need it, or ``one_pass = False``).

What a batch itself can change is decided by :func:`batch_path`: a batch whose sampler log-probs get the importance
weight needs π_old at generation (``separate`` instead of ``training_forward``), and a batch with tool output, or
whose old log-probs TRL did not ask of the policy, falls back from ``shared_old_logps`` to ``separate``.

Selectors that need no group JS (``all``, ``entropy``, ``stapo``, ``random``, a warm-up step) take their statistics
from TRL's fused head (``log_probs``, ``entropy``, ``log_sum_sq_probs``: Σp²) when the selection temperature is
the sampling temperature, so they pay no sweep at all; every metric (h1, h2, purity, prob) is still there.

Every function takes what it reads as arguments (the model, its head, the engine's ``autocast``), so the selection
step (:class:`ictrl.engine.selection_step.SelectionStep`, the source's one caller in the step) composes them and
nothing here calls back into it or the trainer.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ictrl.core.stats import TokenStats, group_js_divergence_topk, sweep_rows, token_stats, topk_log_softmax
from ictrl.engine.heads import call_head

STATS_PATHS = {"separate": 0.0, "shared_old_logps": 1.0, "training_forward": 2.0}
STAT_FIELDS = ("entropy", "renyi2", "purity", "logprob", "prob")
FUSED_OUTPUTS = ("log_probs", "entropy", "log_sum_sq_probs")
Autocast = Callable[[], contextlib.AbstractContextManager[Any]]


# ---------------------------------------------------------------------------------------------- the path


@dataclass(frozen=True)
class PathFacts:
    """What decides the statistics path of a run in one mode (see the module docstring)."""

    one_pass: bool                # False forces the separate pass (the reference the others are tested against)
    sampler_topk: bool            # the ICT score's top-K log-probs come from the sampler
    dynamic_sampling: bool
    stat_free: bool               # the selector reads no statistics (all, random)
    same_temperature: bool        # selection temperature == sampling temperature
    training: bool
    trl_computes_old_logps: bool
    tools: bool
    on_policy_single_micro_batch: bool  # num_iterations == 1 and steps_per_generation == 1


def plan_stats_path(f: PathFacts) -> str:
    if not f.one_pass or f.sampler_topk or f.dynamic_sampling:
        return "separate"
    if f.stat_free:
        return "training_forward" if f.same_temperature else "separate"
    if not f.training:
        return "separate"
    if f.trl_computes_old_logps:
        return "shared_old_logps" if not f.tools and f.same_temperature else "separate"
    return "training_forward" if f.on_policy_single_micro_batch else "separate"


def batch_path(planned: str, *, importance_correction: bool, tool_output: bool, shared_rows: int | None,
               rows: int) -> str:
    """The path of one generation batch of ``rows`` rows: the planned one, or ``separate`` where the batch needs
    it. ``importance_correction``: its sampler log-probs get the importance weight, which needs π_old at
    generation; ``tool_output``: its response mask leaves tool output out, which TRL's old log-probs do not;
    ``shared_rows``: the rows of the statistics served as TRL's old log-probs (None: TRL asked for none)."""
    if planned == "training_forward":
        return "separate" if importance_correction else planned
    if planned == "shared_old_logps" and (tool_output or shared_rows != rows):
        return "separate"
    return planned


# ------------------------------------------------------------------------------------- the full sweep


def final_hidden(model: Any, input_ids: Tensor, attention_mask: Tensor, T: int, autocast: Autocast) -> Tensor:
    """[B, T, H] final-norm hidden states that predict the last T tokens (the LM head's input), from the
    model's own forward (engine hooks run; ``logits_to_keep=1`` keeps its head to one position)."""
    with autocast():
        out = model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True,
                    logits_to_keep=1, use_cache=False)
    return out.hidden_states[-1][:, -T - 1:-1]  # position P-1+t predicts completion token t


@torch.no_grad()
def hidden_stats(head: nn.Module, hidden: Tensor, mask: Tensor, completion_ids: Tensor, group_ids: Tensor | None,
                 *, temperature: float, topk: int | None, chunk_size: int | None, autocast: Autocast,
                 sampler_topk: tuple[Tensor, Tensor] | None = None, group_size: int | None = None
                 ) -> tuple[TokenStats, Tensor | None]:
    """TokenStats ([B, T] fields) and the [B, T] group JS (None without ``group_ids``) from [B, T, H] hidden states.

    The LM head sweeps blocks of positions with its whole weight, gathered once by the engine (:func:`call_head`),
    so at most ``chunk_size`` rows of [V] logits exist at once, with every group intact (JS at position t needs only
    the group's distributions at t). With ``topk`` = K the group JS comes from each position's top-K log-probs
    (``group_js_divergence_topk``): ``sampler_topk`` ([B, T, K] log-probs and ids recorded at generation) when
    given, else the head's logits. ``group_size``: every group has exactly that many rows (the trainer's layout;
    lets the sweep run without host reads, :func:`token_stats`). ``chunk_size`` None: :func:`sweep_rows` (on a GPU
    the rows of the head's dtype that fit in a fixed budget of bytes, ``ictrl.core.stats.SWEEP_BYTES``).

    On a GPU the head's logits go to the sweep in their own dtype (bf16 under autocast: half the bytes to read);
    on CPU, and for the in-place top-K, they are upcast to fp32 first, as before.
    """
    B, T = mask.shape
    topk = topk if group_ids is not None else None
    head_topk = topk is not None and sampler_topk is None
    V = head.weight.shape[0] if isinstance(getattr(head, "weight", None), Tensor) else 151_936
    itemsize = head.weight.element_size() if isinstance(getattr(head, "weight", None), Tensor) else 2  # >= logits'
    block = max(1, sweep_rows(chunk_size, V, hidden.device, itemsize) // B)

    def sweep(lm: nn.Module | Tensor, hidden_all: Tensor) -> tuple[list[TokenStats], list[tuple[Tensor, Tensor]]]:
        parts: list[TokenStats] = []
        topk_parts: list[tuple[Tensor, Tensor]] = []
        for t0 in range(0, T, block):
            h = hidden_all[:, t0:t0 + block]
            # Under bf16 the head's output is bf16 unless TRL's cast_lm_head_to_fp32=True made the head fp32.
            logits = lm(h) if isinstance(lm, nn.Module) else F.linear(h.to(lm.dtype), lm)
            if logits.device.type == "cpu" or head_topk:
                logits = logits.float()
            m = mask[:, t0:t0 + block]
            parts.append(token_stats(logits, m, tokens=completion_ids[:, t0:t0 + block], temperature=temperature,
                                     group_ids=group_ids if topk is None else None,
                                     group_size=group_size if topk is None and group_ids is not None else None))
            if head_topk:
                topk_parts.append(topk_log_softmax(logits, topk, temperature))
            del logits
        return parts, topk_parts

    with autocast():
        parts, topk_parts = call_head(head, sweep, hidden)
    stats = TokenStats(**{f: torch.cat([getattr(p, f) for p in parts], dim=1) for f in STAT_FIELDS})
    if group_ids is None:
        return stats, None
    if topk is not None:
        if sampler_topk is None:
            sampler_topk = (torch.cat([lp for lp, _ in topk_parts], dim=1),
                            torch.cat([ids for _, ids in topk_parts], dim=1))
        return stats, group_js_divergence_topk(*sampler_topk, mask, group_ids)
    return stats, torch.cat([p.ict_score for p in parts], dim=1)


@torch.no_grad()
def model_stats(model: Any, head: nn.Module, input_ids: Tensor, attention_mask: Tensor, mask: Tensor,
                group_ids: Tensor | None, *, rows: int, temperature: float, topk: int | None, chunk_size: int | None,
                autocast: Autocast, sampler_topk: tuple[Tensor, Tensor] | None = None, group_size: int | None = None
                ) -> tuple[TokenStats, Tensor | None]:
    """:func:`hidden_stats` of [B, P + T] prompts and completions (``mask``: the [B, T] response mask): the model
    runs through its engine (FSDP2 / ZeRO-3 hooks gather each layer) in chunks of ``rows``, keeping the final-norm
    hidden states. ``rows`` must be the same on every process, so every process makes the same number of
    (collective) forwards."""
    T = mask.size(1)
    hidden = [final_hidden(model, input_ids[r0:r0 + rows], attention_mask[r0:r0 + rows], T, autocast)
              for r0 in range(0, input_ids.size(0), rows)]
    return hidden_stats(head, torch.cat(hidden), mask, input_ids[:, -T:], group_ids, temperature=temperature,
                        topk=topk, chunk_size=chunk_size, autocast=autocast, sampler_topk=sampler_topk,
                        group_size=group_size)


# ------------------------------------------------------------------------------------- TRL's fused head


# Whether TRL's fused head computes log Σp² in the current call: only inside fused_forward(..., sum_sq=True)
_SUM_SQ: contextvars.ContextVar[bool] = contextvars.ContextVar("ictrl_fused_sum_sq", default=False)


class FusedOutputs(tuple):  # type: ignore[type-arg]
    """The fields the policy's fused head computes, log Σp² only where ictrl reads it (:func:`fused_forward` with
    ``sum_sq``): TRL's kernel asks ``name in outputs`` on every call, and Σp² costs it one multiply and one sum
    per logit tile, so TRL's own calls and the steps whose metrics are not logged go without it."""

    def __contains__(self, name: object) -> bool:
        return (name != "log_sum_sq_probs" or _SUM_SQ.get()) and tuple.__contains__(self, name)


@contextlib.contextmanager
def fused_head_with_sum_sq() -> Iterator[None]:
    """While TRL's ``GRPOTrainer.__init__`` runs: its fused LM head on the policy can also return log Σp² (the
    kernel computes it from the same tiles, :class:`FusedOutputs`)."""
    import trl.trainer.grpo_trainer as grpo

    original = grpo.add_fused_lm_head

    def patched(model: Any, *args: Any, outputs: tuple[str, ...] = ("log_probs",), **kwargs: Any) -> None:
        if "entropy" in outputs:  # the policy's head (the reference model's asks for log-probs only)
            outputs = FusedOutputs(FUSED_OUTPUTS)
        original(model, *args, outputs=outputs, **kwargs)

    grpo.add_fused_lm_head = patched
    try:
        yield
    finally:
        grpo.add_fused_lm_head = original


class Fused(NamedTuple):
    """What :func:`fused_forward` returns: [B, T] log-probs (with grad when enabled), entropy and log Σp², and the
    [B, T, H] final-norm hidden states (the LM head's input) when they were kept."""

    logps: Tensor
    entropy: Tensor
    log_sum_sq: Tensor | None
    hidden: Tensor | None


def fused_forward(model: Any, backbone: nn.Module, input_ids: Tensor, attention_mask: Tensor, T: int,
                  autocast: Autocast, rows: int | None = None, keep_hidden: bool = False, sum_sq: bool = True
                  ) -> Fused:
    """TRL's fused forward (its ``_get_per_token_logps_and_entropies`` for text) in chunks of ``rows``.

    log Σp² is None without ``sum_sq`` or if the head does not return it; the hidden states, with ``keep_hidden``,
    are captured from ``backbone``'s output by a forward hook.
    """
    rows = rows or input_ids.size(0)
    captured: list[Tensor] = []
    hook = backbone.register_forward_hook(lambda m, a, out: captured.append(out[0])) if keep_hidden else None
    parts: list[tuple[Tensor, Tensor, Tensor | None]] = []
    token = _SUM_SQ.set(sum_sq)
    try:
        for r0 in range(0, input_ids.size(0), rows):
            ids, am = input_ids[r0:r0 + rows], attention_mask[r0:r0 + rows]
            labels = ids.masked_fill(am == 0, -100)
            labels[:, :-T] = -100
            with autocast():
                out = model(input_ids=ids, attention_mask=am, labels=labels, fused_lm_head=True)
            parts.append((out.log_probs[:, -T:], out.entropy[:, -T:],
                          None if out.log_sum_sq_probs is None else out.log_sum_sq_probs[:, -T:]))
    finally:
        _SUM_SQ.reset(token)
        if hook is not None:
            hook.remove()
    logps = torch.cat([p[0] for p in parts])
    entropy = torch.cat([p[1] for p in parts])
    lss = None if any(p[2] is None for p in parts) else torch.cat([p[2] for p in parts])
    hidden = torch.cat([h[:, -T - 1:-1] for h in captured]) if keep_hidden else None
    return Fused(logps, entropy, lss, hidden)


def stats_from_fused(logps: Tensor, entropy: Tensor, log_sum_sq: Tensor | None, mask: Tensor) -> TokenStats:
    """TokenStats ([B, T] float32, zeros off the mask) from TRL's fused-head outputs at the sampling temperature.

    Without log Σp² (a model whose head was patched elsewhere), renyi2 and purity are NaN: their metrics drop out.
    """
    def on(x: Tensor) -> Tensor:
        return torch.where(mask, x.detach().float(), 0.0)

    if log_sum_sq is None:
        nan = torch.full(mask.shape, float("nan"), device=mask.device)
        renyi2, purity = nan, nan
    else:
        renyi2, purity = on(-log_sum_sq), on(log_sum_sq.exp())
    return TokenStats(entropy=on(entropy), renyi2=renyi2, purity=purity, logprob=on(logps), prob=on(logps.exp()))


# ------------------------------------------------------------------------------------------ the source


@dataclass(frozen=True)
class StatsSource:
    """The run's statistics: where they come from in each mode, decided once, and how they are computed.

    Built by :meth:`plan` when the trainer is; what varies at run time is only the mode, the selection's warm-up
    (no group JS: the caller passes no ``group_ids``) and the per-batch fallbacks of :func:`batch_path`.
    """

    paths: Mapping[str, str]      # mode ("train" / "eval") -> its planned path
    needs_js: bool                # the selector reads the group JS score
    stat_free: bool               # the selector reads no statistics (all, random)
    same_temperature: bool        # selection temperature == sampling temperature
    temperature: float            # the selection temperature
    topk: int | None              # group JS from each position's top-K log-probs (selection_topk)
    chunk_size: int | None        # rows of [V] logits at once in the head's sweep (None: sweep_rows)
    rows: Mapping[str, int]       # mode -> rows per forward of the separate pass (the mode's per-device batch)
    autocast: Autocast
    head: Callable[[Any], nn.Module]      # model -> its LM head as the engine exposes it
    backbone: Callable[[Any], nn.Module]  # model -> the module whose output is the final-norm hidden states

    @classmethod
    def plan(cls, facts: Callable[[bool], PathFacts], **settings: Any) -> StatsSource:
        """The source with the path of each mode, from ``facts(training)``."""
        return cls(paths={"train": plan_stats_path(facts(True)), "eval": plan_stats_path(facts(False))},
                   **settings)

    def fused(self, need_js: bool) -> bool:
        """The statistics can come from TRL's fused head: no group JS, and its temperature is the selection's."""
        return not need_js and self.same_temperature

    def forward(self, model: Any, input_ids: Tensor, attention_mask: Tensor, T: int, rows: int | None = None,
                keep_hidden: bool = False, sum_sq: bool = True) -> Fused:
        """:func:`fused_forward` with the run's engine."""
        return fused_forward(model, self.backbone(model), input_ids, attention_mask, T, self.autocast, rows,
                             keep_hidden=keep_hidden, sum_sq=sum_sq)

    def __call__(self, model: Any, input_ids: Tensor, attention_mask: Tensor, mask: Tensor,
                 group_ids: Tensor | None = None, *, mode: str = "train", hidden: Tensor | None = None,
                 fused: Fused | None = None, sampler_topk: tuple[Tensor, Tensor] | None = None,
                 group_size: int | None = None) -> tuple[TokenStats, Tensor | None]:
        """TokenStats ([B, T] fields) of the sampling policy at the completion positions of ``input_ids`` /
        ``attention_mask`` ([B, P + T] prompts and completions; ``mask`` the [B, T] response mask) and the [B, T]
        group JS (None without ``group_ids``; ``group_size``: each group's rows, from the trainer's layout).

        From ``fused`` (TRL's fused head: no group JS) when given, else the no-grad sweep of the LM head over
        ``hidden`` ([B, T, H]) when given, else over the model's own forward in chunks of the mode's rows
        (:func:`model_stats`). ``sampler_topk``: the [B, T, K] top-K log-probs and ids the sampler recorded.
        """
        if fused is not None:
            return stats_from_fused(fused.logps, fused.entropy, fused.log_sum_sq, mask), None
        settings = dict(temperature=self.temperature, topk=self.topk, chunk_size=self.chunk_size,
                        autocast=self.autocast, sampler_topk=sampler_topk, group_size=group_size)
        if hidden is not None:
            return hidden_stats(self.head(model), hidden.detach(), mask, input_ids[:, -mask.size(1):], group_ids,
                                **settings)
        return model_stats(model, self.head(model), input_ids, attention_mask, mask, group_ids,
                           rows=self.rows[mode], **settings)
