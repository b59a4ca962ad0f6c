"""One pass serves all: where the trainer's token statistics come from, without a forward pass of their own.

Three paths, chosen per generation batch by :meth:`OnePassMixin._plan_stats_path` and logged as
``ictrl/stats_path`` (:data:`STATS_PATHS`):

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

Selectors that need no group JS (``all``, ``entropy``, ``stapo``, ``random``, a warm-up step) take their statistics
from TRL's fused head (``log_probs``, ``entropy``, ``log_sum_sq_probs``: Σp²) when the selection temperature is
the sampling temperature, so they pay no sweep at all; every metric (h1, h2, purity, prob) is still there.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

from ictrl.engine.sampler_topk import TopKRows, pad_rows
from ictrl.core.metrics import step_metrics
from ictrl.core.selection import SelectionInputs, get_selector, in_warmup, select
from ictrl.core.stats import TokenStats

STATS_PATHS = {"separate": 0.0, "shared_old_logps": 1.0, "training_forward": 2.0}
_STAT_FIELDS = ("entropy", "renyi2", "purity", "logprob", "prob")
FUSED_OUTPUTS = ("log_probs", "entropy", "log_sum_sq_probs")


@contextlib.contextmanager
def fused_head_with_sum_sq() -> Iterator[None]:
    """While TRL's ``GRPOTrainer.__init__`` runs: its fused LM head on the policy also returns log Σp² (the kernel
    computes it from the same tiles; TRL's own calls ignore it)."""
    import trl.trainer.grpo_trainer as grpo

    original = grpo.add_fused_lm_head

    def patched(model: Any, *args: Any, outputs: tuple[str, ...] = ("log_probs",), **kwargs: Any) -> None:
        if "entropy" in outputs:  # the policy's head (the reference model's asks for log-probs only)
            outputs = FUSED_OUTPUTS
        original(model, *args, outputs=outputs, **kwargs)

    grpo.add_fused_lm_head = patched
    try:
        yield
    finally:
        grpo.add_fused_lm_head = original


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


def drop_nan_metrics(metrics: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if v == v}


class OnePassMixin:
    """Statistics-path methods of ``ICTGRPOTrainer`` (see the module docstring). Expects TRL's GRPOTrainer below."""

    #: False: always the separate statistics pass (the reference the one-pass paths are tested against).
    one_pass: bool = True

    def _trl_computes_old_logps(self) -> bool:
        args = self.args
        generate_every = args.steps_per_generation * self.num_iterations
        return args.gradient_accumulation_steps % generate_every != 0 or bool(
            self.use_vllm and args.vllm_importance_sampling_correction)

    def _cheap_stats(self, need_js: bool) -> bool:
        """The statistics can come from TRL's fused head: no group JS, and its temperature is the selection's."""
        return not need_js and self.args.selection_temperature == self.temperature

    def _stat_free(self) -> bool:
        """The selector reads no statistics (``all``, ``random``): it selects at generation with no pass at all,
        and its metrics come from TRL's fused head in the loss."""
        return not (get_selector(self.args.token_selector).needs & {"ict_score", "entropy", "prob"})

    def _plan_stats_path(self, need_js: bool) -> str:
        args = self.args
        if not self.one_pass or self._sampler_topk is not None or getattr(args, "dynamic_sampling", False) \
                or self._dense_trl_forward():
            return "separate"
        if self._stat_free():
            return "training_forward" if self._cheap_stats(False) else "separate"
        if not self.model.training:
            return "separate"
        if self._trl_computes_old_logps():
            ok = not self.tools and args.selection_temperature == self.temperature
            return "shared_old_logps" if ok else "separate"
        if self.num_iterations == 1 and args.steps_per_generation == 1:
            return "training_forward"
        return "separate"

    # ---------------------------------------------------------------------------- TRL's fused head

    def _fused_forward(self, model: Any, input_ids: Tensor, attention_mask: Tensor, T: int, rows: int | None = None,
                       keep_hidden: bool = False) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
        """TRL's fused forward (its ``_get_per_token_logps_and_entropies`` for text) in chunks of ``rows``.

        Returns [B, T] log-probs (with grad when enabled), entropy and log Σp² (None if the head does not return
        it), and with ``keep_hidden`` the [B, T, H] final-norm hidden states (the LM head's input) captured from
        the backbone's output by a forward hook.
        """
        rows = rows or input_ids.size(0)
        backbone = self._backbone(model)
        captured: list[Tensor] = []
        hook = backbone.register_forward_hook(lambda m, a, out: captured.append(out[0])) if keep_hidden else None
        parts: list[tuple[Tensor, Tensor, Tensor | None]] = []
        try:
            for r0 in range(0, input_ids.size(0), rows):
                ids, am = input_ids[r0:r0 + rows], attention_mask[r0:r0 + rows]
                labels = ids.masked_fill(am == 0, -100)
                labels[:, :-T] = -100
                with self.accelerator.autocast():
                    out = model(input_ids=ids, attention_mask=am, labels=labels, fused_lm_head=True)
                parts.append((out.log_probs[:, -T:], out.entropy[:, -T:],
                              None if out.log_sum_sq_probs is None else out.log_sum_sq_probs[:, -T:]))
        finally:
            if hook is not None:
                hook.remove()
        logps = torch.cat([p[0] for p in parts])
        entropy = torch.cat([p[1] for p in parts])
        lss = None if any(p[2] is None for p in parts) else torch.cat([p[2] for p in parts])
        hidden = torch.cat([h[:, -T - 1:-1] for h in captured]) if keep_hidden else None
        return logps, entropy, lss, hidden

    def _backbone(self, model: Any) -> torch.nn.Module:
        unwrapped = self.accelerator.unwrap_model(model)
        if hasattr(unwrapped, "get_base_model"):
            unwrapped = unwrapped.get_base_model()
        return unwrapped.base_model

    # ----------------------------------------------------------------------- shared old log-probs

    def _get_per_token_logps_and_entropies(self, model: Any, input_ids: Tensor, attention_mask: Tensor,
                                           logits_to_keep: int, batch_size: int | None = None,
                                           compute_entropy: bool = False, compute_aux_loss: bool = False,
                                           **kwargs: Any) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """TRL's method; while ``_old_logps_request`` is armed (inside generation, path ``shared_old_logps``) its
        one no-grad call on the policy is served by the statistics pass, whose results are kept for the trainer."""
        request = getattr(self, "_old_logps_request", None)
        if (request is None or model is not self.model or torch.is_grad_enabled() or compute_entropy
                or compute_aux_loss or any(v is not None for v in kwargs.values())):
            return super()._get_per_token_logps_and_entropies(  # type: ignore[misc]
                model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size,
                compute_entropy=compute_entropy, compute_aux_loss=compute_aux_loss, **kwargs)
        self._old_logps_request = None
        T = logits_to_keep
        mask = attention_mask[:, -T:].bool()
        if not request["need_js"] and self._cheap_stats(False):
            logps, entropy, lss, _ = self._fused_forward(model, input_ids, attention_mask, T, batch_size)
            stats, js = stats_from_fused(logps, entropy, lss, mask), None
        else:
            batch = {"prompt_ids": input_ids[:, :-T], "completion_ids": input_ids[:, -T:],
                     "prompt_mask": attention_mask[:, :-T], "completion_mask": attention_mask[:, -T:]}
            groups = None
            if request["need_js"]:
                self._check_local_groups(batch, request["G"])
                B, rank = mask.size(0), self.accelerator.process_index
                groups = (rank * B + torch.arange(B, device=mask.device)) // request["G"]
            stats, js = self._selection_stats(batch, mask, groups)
            logps = stats.logprob
        self._shared_stats = (input_ids.size(0), stats, js)
        return logps, None, None

    @contextlib.contextmanager
    def _serving_old_logps(self, request: dict[str, Any] | None) -> Iterator[None]:
        self._old_logps_request, self._shared_stats = request, None
        try:
            yield
        finally:
            self._old_logps_request = None

    # ----------------------------------------------------------------------------------- selection

    def _check_local_groups(self, batch: dict[str, Any], G: int) -> None:
        B = batch["prompt_ids"].size(0)
        if B % G != 0:
            raise RuntimeError(f"group JS needs whole groups on each process, but this process holds {B} "
                               f"completions, not a multiple of num_generations={G}")
        ids = torch.where(batch["prompt_mask"].bool(), batch["prompt_ids"], -1).view(B // G, G, -1)
        if not bool((ids == ids[:, :1]).all()):
            raise RuntimeError("the completions in a block of num_generations rows on this process do not share "
                               "one prompt: TRL's sampler layout changed, so groups cannot be kept local")

    def _recorded_topk(self, rollout_topk: TopKRows | None, B: int, T: int,
                       device: torch.device) -> tuple[Tensor, Tensor] | None:
        """[B, T, K] top-K log-probs and ids recorded by the sampler, or None (the statistics pass's head)."""
        recorded = rollout_topk is not None and len(rollout_topk) == B and self._rollout_calls == 1
        if self._sampler_topk is None or not (recorded or self.args.selection_topk_source == "sampler"):
            return None
        # 'auto' falls back to the head when a subclass's generation bypassed the hook (logged by the caller)
        if not recorded:
            raise RuntimeError(f"selection_topk_source: the sampler's top-K log-probs cover "
                               f"{0 if rollout_topk is None else len(rollout_topk)} rows in "
                               f"{self._rollout_calls} generation calls, expected {B} rows in one call")
        return pad_rows(rollout_topk, T, device)


    def _select_and_log(self, mask: Tensor, stats: TokenStats | None, js: Tensor | None, advantages: Tensor,
                        G: int, warm: bool, mode: str) -> Tensor:
        """The local rows' [B, T] selection, chosen on the generation batch gathered from all processes (rows in
        TRL's order: process p holds [p·B, (p+1)·B)), identical on every process and to one process; logs the
        ``ictrl/*`` selection metrics (not when ``stats`` is None: a selector that reads no statistics, whose
        metrics come with the loss's forward)."""
        args = self.args
        B, T = mask.shape
        rank = self.accelerator.process_index
        g_mask = self._gather_rows(mask.to(torch.uint8)).bool()
        g_stats = None if stats is None else TokenStats(**{f: self._gather_rows(getattr(stats, f))
                                                          for f in _STAT_FIELDS})
        g_js = self._gather_rows(js) if js is not None else None
        g_adv = self.accelerator.gather(advantages.float())
        g_groups = torch.arange(g_mask.size(0), device=g_mask.device) // G
        sel_inputs = SelectionInputs(mask=g_mask, step=int(self.state.global_step), ict_score=g_js,
                                     entropy=None if g_stats is None else g_stats.entropy,
                                     prob=None if g_stats is None else g_stats.prob, advantages=g_adv,
                                     group_ids=g_groups)
        g_selected = select(args.token_selector, sel_inputs, warmup_steps=args.selection_warmup_steps,
                            **args.selector_options())
        if g_stats is not None:
            self._log_selection(g_mask, g_stats, g_js, g_selected, warm, mode)
        return g_selected[rank * B:(rank + 1) * B, :T].contiguous()

    def _log_selection(self, g_mask: Tensor, g_stats: TokenStats, g_js: Tensor | None, g_selected: Tensor,
                       warm: bool, mode: str) -> None:
        metrics = self._metrics[mode]
        for key, value in drop_nan_metrics(step_metrics(g_stats, g_mask, g_selected)).items():
            metrics[f"ictrl/{key}"].append(value)
        if g_js is not None:
            for name, where in (("all", g_mask), ("selected", g_selected & g_mask)):
                if bool(where.any()):
                    metrics[f"ictrl/ict_score/{name}"].append(float(g_js[where].double().mean()))
        metrics["ictrl/warmup"].append(float(warm))

    # ------------------------------------------------------------------- statistics from the loss forward

    def _training_forward_logps(self, model: Any, inputs: dict[str, Any], input_ids: Tensor,
                                attention_mask: Tensor, mask: Tensor) -> Tensor:
        """Path ``training_forward``: [B, T] log π_θ (with grad) of the micro-batch, whose statistics select it.

        A selector that reads no statistics (``all``, ``random``): TRL's fused forward; its entropy and Σp² give
        the metrics, the selection was made at generation. Other selectors: the micro-batch is the whole local generation batch, shuffled by TRL
        (``ictrl_row`` holds each row's global index), so rows are put back in TRL's generation order for the
        selection and the local mask is permuted back. The backbone runs once with grad; the statistics sweep its
        hidden states without grad (TRL's fused entropy and Σp² for selectors without group JS); then the head
        with grad (``sparse_backward``: the selected positions only).
        """
        args = self.args
        mode = "train" if self.model.training else "eval"
        T = mask.size(1)
        metrics = self._metrics[mode]
        metrics["ictrl/stats_path"].append(STATS_PATHS["training_forward"])
        warm = in_warmup(int(self.state.global_step), args.selection_warmup_steps)
        if self._stat_free():  # selected at generation; the metrics of this micro-batch on all processes
            logps, entropy, lss, _ = self._fused_forward(model, input_ids, attention_mask, T)
            start = time.perf_counter()
            stats = stats_from_fused(logps, entropy, lss, mask)
            g_stats = TokenStats(**{f: self._gather_rows(getattr(stats, f)) for f in _STAT_FIELDS})
            self._log_selection(self._gather_rows(mask.to(torch.uint8)).bool(), g_stats, None,
                                self._gather_rows(inputs["ictrl_selected"].to(torch.uint8)).bool(), warm, mode)
            metrics["ictrl/stats_time"].append(time.perf_counter() - start)
            return logps
        need_js = self._needs_js and not warm
        cheap = self._cheap_stats(need_js)
        sparse = bool(args.sparse_backward)
        rank, B = self.accelerator.process_index, mask.size(0)
        local = inputs["ictrl_row"] - rank * B  # each micro-batch row's index in TRL's generation order
        order = torch.argsort(local)
        logps = hidden = None
        if cheap and not sparse:
            logps, entropy, lss, _ = self._fused_forward(model, input_ids, attention_mask, T)
            start = time.perf_counter()
            stats, js = stats_from_fused(logps, entropy, lss, mask), None
        else:
            if sparse:
                hidden = self._final_hidden(model, input_ids, attention_mask, T)
            else:
                logps, _, _, hidden = self._fused_forward(model, input_ids, attention_mask, T, keep_hidden=True)
            start = time.perf_counter()
            groups = None
            if need_js:
                G = self.num_generations
                self._check_local_groups({k: inputs[k][order] for k in ("prompt_ids", "prompt_mask")}, G)
                groups = inputs["ictrl_row"] // G
            stats, js = self._hidden_stats(hidden.detach(), mask, inputs["completion_ids"], groups)
        fields = {f: getattr(stats, f)[order] for f in _STAT_FIELDS}
        selected = self._select_and_log(mask[order], TokenStats(**fields), None if js is None else js[order],
                                        inputs["advantages"][order], self.num_generations, warm, mode)[local]
        inputs["ictrl_selected"] = selected
        self._attach_normalisers([inputs], args.gradient_accumulation_steps)
        metrics["ictrl/stats_time"].append(time.perf_counter() - start)  # the no-grad sweep, selection, metrics
        if logps is None:
            logps = self._sparse_head(model, hidden, inputs["completion_ids"], selected & mask)
        return logps
