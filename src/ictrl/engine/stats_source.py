"""The statistics pass: per-token statistics and the group JS score of the sampling policy, from the model's own
forward, from hidden states the loss's forward kept, or from TRL's fused LM head (which path a step takes:
``ictrl.engine.stats_paths``)."""

from __future__ import annotations

import contextlib
import functools
import time
import types
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ictrl.core import selection
from ictrl.core.stats import (TokenStats, group_js_divergence_topk, group_js_divergence_topk_unchecked, sweep_rows,
                              token_stats, token_stats_unchecked, topk_log_softmax)
from ictrl.engine.heads import LogitTransform, call_head

# ictrl/stats_path; 1.0 was a path since deleted (TRL's old-log-prob pass giving the statistics)
STATS_PATHS = {"separate": 0.0, "training_forward": 2.0}
# The statistics one sweep of each position's distribution gives (the group JS score comes apart: it needs groups)
STAT_FIELDS = tuple(f for f in selection.STAT_FIELDS if f != "ict_score")
FUSED_OUTPUTS = ("log_probs", "entropy", "log_sum_sq_probs")
SUM_SQ_STATS = frozenset({"renyi2", "purity"})  # from log Σp², which TRL's fused head computes only when asked
Autocast = Callable[[], contextlib.AbstractContextManager[Any]]
Stats = tuple[TokenStats | None, Tensor | None]  # the statistics and the [B, T] group JS (None without)


# ---------------------------------------------------------------------------------------------- the step


@dataclass(frozen=True)
class StepContext:
    """One step as the statistics and the selection read it, built by the trainer at each call."""

    mode: str                      # "train" / "eval"
    G: int                         # completions per prompt in this mode
    step: int                      # the optimizer step in progress (global_step)
    needs: frozenset[str]          # the statistics this step computes (ictrl.core.selection.needed_stats)
    metrics: dict[str, list[float]] = field(default_factory=dict)  # TRL's metric lists of the mode
    accumulation: int = 1          # micro-batches of this optimizer step (the Trainer's current window)
    window: int = 1                # gradient_accumulation_steps: the micro-batches the normalisers total over
    logged: bool = True            # this step's metrics reach a log
    dense: bool = False            # TRL's own forward for its entropy bonus, entropy mask or router loss
    sparse: bool = False           # sparse_backward: the LM head at the selected positions only
    entropy_quantile: float = 1.0  # TRL's top_entropy_quantile (< 1: its entropy mask over the micro-batch)
    router_loss: bool = False      # the dense forward also returns a MoE model's router loss

    @property
    def need_js(self) -> bool:
        """The step computes the group JS score (its groups must be whole on each process)."""
        return "ict_score" in self.needs

    @property
    def sum_sq(self) -> bool:
        """TRL's fused head computes log Σp²: the selection reads H2 or purity, or the step's metrics are logged."""
        return self.logged or bool(self.needs & SUM_SQ_STATS)


# ------------------------------------------------------------------------------------- the full sweep


@dataclass(frozen=True)
class Sweep:
    """How the LM head is swept: the selection temperature, top-K (``selection_topk``), rows of [V] logits at once
    (``chunk_size``, None: :func:`sweep_rows`), the engine's autocast, the vocabulary size and the rows per model
    forward (None: all)."""

    temperature: float
    topk: int | None
    chunk_size: int | None
    autocast: Autocast
    vocab: int
    rows: int | None = None
    transform: LogitTransform | None = None  # the model's final-logit transform (ictrl.engine.heads)
    check: bool = False  # the core's checked faces on the step's own tensors (ICTRL_DEBUG_CHECKS)


class Request(NamedTuple):
    """One batch as the statistics read it: the [B, T] response mask and completion ids, the [B] group ids (None:
    no group JS) and every group's size (lets the sweep skip host reads)."""

    mask: Tensor
    tokens: Tensor
    group_ids: Tensor | None = None
    group_size: int | None = None


def final_hidden(model: Any, input_ids: Tensor, attention_mask: Tensor, T: int, autocast: Autocast) -> Tensor:
    """[B, T, H] final-norm hidden states that predict the last T tokens (the LM head's input), from the
    model's own forward (engine hooks run; ``logits_to_keep=1`` keeps its head to one position)."""
    with autocast():
        out = model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True,
                    logits_to_keep=1, use_cache=False)
    return out.hidden_states[-1][:, -T - 1:-1]  # position P-1+t predicts completion token t


@torch.no_grad()
def hidden_stats(head: nn.Module, hidden: Tensor, req: Request, sweep: Sweep) -> Stats:
    """TokenStats ([B, T] fields) and the [B, T] group JS (None without group ids) from [B, T, H] hidden states.

    The LM head sweeps blocks of positions with its whole weight, gathered once by the engine (:func:`call_head`),
    so at most ``chunk_size`` rows of [V] logits exist at once, with every group intact (JS at position t needs only
    the group's distributions at t). With top-K the group JS comes from each position's top-K log-probs of the
    head. ``chunk_size`` None: :func:`sweep_rows` (on a GPU the rows of the
    head's dtype that fit in a fixed budget of bytes, ``ictrl.core.stats.SWEEP_BYTES``). On a GPU the logits go to
    the sweep in their own dtype (bf16 under autocast); on CPU, and for the in-place top-K, they are upcast to fp32.
    """
    mask, completion_ids, group_ids = req.mask, req.tokens, req.group_ids
    B, T = mask.shape
    topk = sweep.topk if group_ids is not None else None
    head_topk = topk is not None
    chunk_size, V = sweep.chunk_size, sweep.vocab
    itemsize = head.weight.element_size() if isinstance(getattr(head, "weight", None), Tensor) else 2  # >= logits'
    block = max(1, sweep_rows(chunk_size, V, hidden.device, itemsize) // B)
    group_size = req.group_size if topk is None and group_ids is not None else None
    stats_of = token_stats if sweep.check else token_stats_unchecked
    topk_js = group_js_divergence_topk if sweep.check else group_js_divergence_topk_unchecked

    def run(lm: nn.Module | Tensor, hidden_all: Tensor) -> tuple[list[TokenStats], list[tuple[Tensor, Tensor]]]:
        parts: list[TokenStats] = []
        topk_parts: list[tuple[Tensor, Tensor]] = []
        for t0 in range(0, T, block):
            h = hidden_all[:, t0:t0 + block]
            # Under bf16 the head's output is bf16 unless TRL's cast_lm_head_to_fp32=True made the head fp32.
            logits = lm(h) if isinstance(lm, nn.Module) else F.linear(h.to(lm.dtype), lm)
            if logits.device.type == "cpu" or head_topk:
                logits = logits.float()
            parts.append(stats_of(logits, mask[:, t0:t0 + block], tokens=completion_ids[:, t0:t0 + block],
                                  temperature=sweep.temperature, group_ids=group_ids if topk is None else None,
                                  group_size=group_size))
            if head_topk:
                topk_parts.append(topk_log_softmax(logits, topk, sweep.temperature))
            del logits
        return parts, topk_parts

    with sweep.autocast():
        parts, topk_parts = call_head(head, run, hidden, transform=sweep.transform)
    stats = TokenStats(**{f: torch.cat([getattr(p, f) for p in parts], dim=1) for f in STAT_FIELDS})
    if group_ids is None:
        return stats, None
    if topk is None:
        return stats, torch.cat([p.ict_score for p in parts], dim=1)
    return stats, topk_js(torch.cat([lp for lp, _ in topk_parts], dim=1),
                          torch.cat([ids for _, ids in topk_parts], dim=1), mask, group_ids)


@torch.no_grad()
def model_stats(model: Any, head: nn.Module, input_ids: Tensor, attention_mask: Tensor, req: Request,
                sweep: Sweep) -> Stats:
    """:func:`hidden_stats` of [B, P + T] prompts and completions: the model runs through its engine (FSDP2 /
    ZeRO-3 hooks gather each layer) in chunks of ``sweep.rows``, the same on every process, so every process makes
    the same number of (collective) forwards."""
    T, rows = req.mask.size(1), sweep.rows or input_ids.size(0)
    hidden = [final_hidden(model, input_ids[r0:r0 + rows], attention_mask[r0:r0 + rows], T, sweep.autocast)
              for r0 in range(0, input_ids.size(0), rows)]
    return hidden_stats(head, torch.cat(hidden), req, sweep)


# ------------------------------------------------------------------------------------- TRL's fused head


SUM_SQ_KWARG = "ictrl_log_sum_sq"  # the policy's forward argument: this fused call also computes log Σp²


@contextlib.contextmanager
def fused_head_with_sum_sq() -> Iterator[None]:
    """While TRL's ``GRPOTrainer.__init__`` runs: the policy gets TRL's fused LM head twice, with and without log
    Σp² (its kernel computes it from the same tiles, at one multiply and one sum per logit tile), and its forward
    takes ``ictrl_log_sum_sq=True`` to call the first (:func:`fused_forward` with ``Wants.sum_sq``); TRL's own
    calls pass nothing and go without it."""
    import trl.trainer.grpo_trainer as grpo

    original = grpo.add_fused_lm_head

    def patched(model: Any, *args: Any, outputs: tuple[str, ...] = ("log_probs",), **kwargs: Any) -> None:
        if "entropy" not in outputs:  # the reference model's head asks for log-probs only
            original(model, *args, outputs=outputs, **kwargs)
            return
        plain = model.forward
        original(model, *args, outputs=FUSED_OUTPUTS, **kwargs)
        with_sum_sq = model.forward
        model.forward = plain
        original(model, *args, outputs=tuple(o for o in FUSED_OUTPUTS if o != "log_sum_sq_probs"), **kwargs)
        without = model.forward

        # The model's own signature, as TRL keeps it: ``generate`` validates its model kwargs against it
        @functools.wraps(type(model).forward)
        def forward(self: Any, *a: Any, ictrl_log_sum_sq: bool = False, **kw: Any) -> Any:
            return (with_sum_sq if ictrl_log_sum_sq else without)(*a, **kw)

        model.forward = types.MethodType(forward, model)

    grpo.add_fused_lm_head = patched
    try:
        yield
    finally:
        grpo.add_fused_lm_head = original


def fused_head_stats() -> frozenset[str]:
    """The statistics TRL's fused LM head gives: log-probs and entropy, and H2 and purity where its kernel computes
    log Σp² (``log_sum_sq_probs``); a selector that reads another (the group JS) has its statistics swept."""
    from trl.kernels import chunked_logprob

    given = frozenset({"logprob", "prob", "entropy"})
    return given | SUM_SQ_STATS if "log_sum_sq_probs" in getattr(chunked_logprob, "OPTIONAL_OUTPUTS", ()) else given


class Wants(NamedTuple):
    """What :func:`fused_forward` computes besides log-probs and entropy."""

    sum_sq: bool = True              # log Σp² (one multiply and one sum per logit tile)
    hidden: nn.Module | None = None  # keep this module's output (the backbone's: the final-norm hidden states)
    aux: bool = False                # a MoE model's router load-balancing loss
    rows: int | None = None          # rows per forward (None: all)


class Fused(NamedTuple):
    """What :func:`fused_forward` returns: [B, T] log-probs (with grad when enabled), entropy and log Σp², the
    [B, T, H] final-norm hidden states when kept, and the router loss when asked."""

    logps: Tensor
    entropy: Tensor
    log_sum_sq: Tensor | None
    hidden: Tensor | None
    aux: Tensor | None = None


def fused_forward(model: Any, input_ids: Tensor, attention_mask: Tensor, T: int, autocast: Autocast,
                  wants: Wants = Wants()) -> Fused:
    """TRL's forward through its fused LM head (its ``_get_per_token_logps_and_entropies`` for text), in chunks of
    ``wants.rows``. log Σp² is None without ``wants.sum_sq`` or if the head does not return it."""
    rows = wants.rows or input_ids.size(0)
    captured: list[Tensor] = []
    hook = None if wants.hidden is None else wants.hidden.register_forward_hook(
        lambda m, a, out: captured.append(out[0]))
    parts: list[tuple[Tensor, Tensor, Tensor | None]] = []
    aux: list[Tensor] = []
    try:
        for r0 in range(0, input_ids.size(0), rows):
            ids, am = input_ids[r0:r0 + rows], attention_mask[r0:r0 + rows]
            labels = ids.masked_fill(am == 0, -100)
            labels[:, :-T] = -100
            router = {"output_router_logits": True} if wants.aux else {}
            with autocast():
                out = model(input_ids=ids, attention_mask=am, **router, labels=labels, fused_lm_head=True,
                            **{SUM_SQ_KWARG: True} if wants.sum_sq else {})
            parts.append((out.log_probs[:, -T:], out.entropy[:, -T:],
                          None if out.log_sum_sq_probs is None else out.log_sum_sq_probs[:, -T:]))
            if wants.aux:
                aux.append(out.aux_loss)
    finally:
        if hook is not None:
            hook.remove()
    logps = torch.cat([p[0] for p in parts])
    entropy = torch.cat([p[1] for p in parts])
    lss = None if any(p[2] is None for p in parts) else torch.cat([p[2] for p in parts])
    hidden = torch.cat([h[:, -T - 1:-1] for h in captured]) if captured else None
    return Fused(logps, entropy, lss, hidden, torch.stack(aux).mean() if aux else None)


def stats_from_fused(fused: Fused, mask: Tensor) -> TokenStats:
    """TokenStats ([B, T] float32, zeros off the mask) from TRL's fused-head outputs at the sampling temperature.

    Without log Σp² (a model whose head was patched elsewhere), renyi2 and purity are NaN: their metrics drop out.
    """
    def on(x: Tensor) -> Tensor:
        return torch.where(mask, x.detach().float(), 0.0)

    if fused.log_sum_sq is None:
        nan = torch.full(mask.shape, float("nan"), device=mask.device)
        renyi2, purity = nan, nan
    else:
        renyi2, purity = on(-fused.log_sum_sq), on(fused.log_sum_sq.exp())
    logps = fused.logps
    return TokenStats(entropy=on(fused.entropy), renyi2=renyi2, purity=purity, logprob=on(logps), prob=on(logps.exp()))


class LossForward(NamedTuple):
    """What the loss's forward gives: [B, T] log-probs (None: the sparse head runs after the selection), entropy
    and router loss where computed, the [B, T, H] hidden states the sparse head reads, the statistics the path
    takes from it, and when their computation began (``ictrl/stats_time``)."""

    logps: Tensor | None
    entropy: Tensor | None
    aux: Tensor | None
    hidden: Tensor | None
    stats: Stats | None
    started: float


# ------------------------------------------------------------------------------------------ the source


@dataclass(frozen=True)
class StatsSource:
    """The run's statistics: how each source computes them (which source a step takes: ``ictrl.engine.stats_paths``).

    The mode of a call is the model's (``model.training``): it picks the rows per forward and the group size.
    """

    needs: frozenset[str]         # the statistics the selector reads (the warm-up aside): needed_stats
    fused_stats: frozenset[str]   # the statistics TRL's fused head gives (fused_head_stats)
    same_temperature: bool        # selection temperature == sampling temperature
    temperature: float            # the selection temperature
    topk: int | None              # group JS from each position's top-K log-probs (selection_topk)
    chunk_size: int | None        # rows of [V] logits at once in the head's sweep (None: sweep_rows)
    vocab: int                    # the LM head's rows
    rows: Mapping[str, int]       # mode -> rows per forward of the separate pass (the mode's per-device batch)
    group_size: Mapping[str, int]  # mode -> completions per prompt
    autocast: Autocast
    head: Callable[[Any], nn.Module]      # model -> its LM head as the engine exposes it
    backbone: Callable[[Any], nn.Module]  # model -> the module whose output is the final-norm hidden states
    transform: LogitTransform | None = None  # the model's final-logit transform, after the head (heads.py)
    check: bool = False  # the step calls the core's checked faces on its own tensors too (ICTRL_DEBUG_CHECKS)

    @property
    def stat_free(self) -> bool:
        """The selector reads no statistics (all, random)."""
        return not self.needs

    def from_trl_head(self, needs: frozenset[str]) -> bool:
        """The statistics ``needs`` can come from TRL's fused head: it gives each of them, at the selection's
        temperature."""
        return self.same_temperature and needs <= self.fused_stats

    def sweep(self, model: Any) -> Sweep:
        mode = "train" if model.training else "eval"
        return Sweep(self.temperature, self.topk, self.chunk_size, self.autocast, self.vocab, self.rows[mode],
                     self.transform, self.check)

    def request(self, model: Any, mask: Tensor, tokens: Tensor, group_ids: Tensor | None) -> Request:
        size = None if group_ids is None else self.group_size["train" if model.training else "eval"]
        return Request(mask, tokens, group_ids, size)

    def fused_forward(self, model: Any, input_ids: Tensor, attention_mask: Tensor, T: int,
                      wants: Wants = Wants()) -> Fused:
        """:func:`fused_forward` with the run's engine (``keep_hidden`` in ``wants``: the backbone's output)."""
        return fused_forward(model, input_ids, attention_mask, T, self.autocast, wants)

    def __call__(self, model: Any, input_ids: Tensor, attention_mask: Tensor, mask: Tensor,
                 group_ids: Tensor | None = None) -> Stats:
        """The separate pass: TokenStats ([B, T] fields) and the [B, T] group JS (None without ``group_ids``) at
        the completion positions of ``input_ids`` / ``attention_mask`` ([B, P + T]; ``mask``: the [B, T] response
        mask), from the model's own forward."""
        req = self.request(model, mask, input_ids[:, -mask.size(1):], group_ids)
        return model_stats(model, self.head(model), input_ids, attention_mask, req, self.sweep(model))

    def from_hidden(self, model: Any, hidden: Tensor, req: Request) -> Stats:
        """The no-grad sweep of the LM head over [B, T, H] hidden states the loss's forward kept."""
        return hidden_stats(self.head(model), hidden.detach(), req, self.sweep(model))

    def loss_forward(self, model: Any, input_ids: Tensor, attention_mask: Tensor, req: Request, wants: Wants | None,
                     stats: bool = False) -> LossForward:
        """The loss's forward of one micro-batch: TRL's fused head computing ``wants``, or with None the backbone
        alone (the sparse head reads its hidden states); with ``stats`` the statistics it gives: the fused head's,
        or the sweep of the hidden states it kept (``wants.hidden``) or the backbone gave."""
        T = req.mask.size(1)
        fused = None if wants is None else fused_forward(model, input_ids, attention_mask, T, self.autocast, wants)
        hidden = final_hidden(model, input_ids, attention_mask, T, self.autocast) if fused is None else fused.hidden
        start = time.perf_counter()
        found: Stats | None = None
        if stats and fused is not None and hidden is None:
            found = (stats_from_fused(fused, req.mask), None)
        elif stats:
            assert hidden is not None
            found = self.from_hidden(model, hidden, req)
        if fused is None:
            return LossForward(None, None, None, hidden, found, start)
        return LossForward(fused.logps, fused.entropy, fused.aux, None, found, start)
