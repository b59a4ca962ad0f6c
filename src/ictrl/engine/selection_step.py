"""The selection step: the one interface from a TRL batch to the loss's inputs: statistics, mask, normalisers.

:class:`SelectionStep` is built once when the trainer is, with the run's statistics source
(:class:`ictrl.engine.stats_pass.StatsSource`), resolved selector and options, warm-up Θ and normaliser flags. The
trainer reaches the statistics, the selection and the loss's forward only through it, one call per TRL hook:

- :meth:`SelectionStep.mask` after TRL built a generation batch: statistics (from the source, from what TRL's old
  log-probs pass kept, or none) → the selection, the batch's local [B, T] mask;
- :meth:`SelectionStep.old_logps` when TRL asks for old log-probs on path ``shared_old_logps``: one pass gives
  both, and the statistics wait in the trainer's generation record for :meth:`mask`;
- :meth:`SelectionStep.attach_normalisers` where TRL has buffered its micro-batches;
- :meth:`SelectionStep.policy_logps` in the loss: log π_θ with grad, on path ``training_forward`` from the forward
  whose statistics select the micro-batch (through :meth:`mask`), with ``sparse_backward`` from the head at the
  selected positions only.

Statistics are requested in one place, :meth:`SelectionStep.statistics`, which holds the group layout check.

TRL's sampler places each prompt's G completions contiguously in the global generation batch, and process p holds
rows [p·B, (p+1)·B). The selection runs on the [B_global, T] tensors gathered from all processes, so every process
computes the mask one process would, and keeps its own rows. The loss's normalisers are totals over each optimizer
step's micro-batches on all processes, so any split of one optimizer batch gives the one-big-batch gradient.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ictrl.core.logprobs import selected_token_logprobs
from ictrl.core.metrics import step_metrics
from ictrl.core.selection import SelectionInputs, Selector, in_warmup
from ictrl.core.stats import TokenStats
from ictrl.engine.heads import call_head
from ictrl.engine.stats_pass import STAT_FIELDS, STATS_PATHS, Fused, StatsSource, final_hidden

Stats = tuple[TokenStats | None, Tensor | None]  # the statistics and the [B, T] group JS (None without)


# ------------------------------------------------------------------------------------ a TRL batch's views


def response_mask(batch: dict[str, Any]) -> Tensor:
    """[B, T] bool: the completion tokens the loss and the statistics count (tool output excluded)."""
    mask = batch["completion_mask"].bool()
    return mask & batch["tool_mask"].bool() if "tool_mask" in batch else mask


def model_inputs(batch: dict[str, Any]) -> tuple[Tensor, Tensor]:
    """[B, P + T] input ids and attention mask of prompt and completion, as the model sees them."""
    return (torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1),
            torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1))


def local_groups(rank: int, B: int, G: int, device: torch.device) -> Tensor:
    """[B] group ids of this process's rows: TRL places each prompt's G completions contiguously."""
    return (rank * B + torch.arange(B, device=device)) // G


def check_local_groups(batch: dict[str, Any], G: int) -> None:
    """Group JS needs each group whole on one process: B a multiple of G, and each block of G rows one prompt."""
    B = batch["prompt_ids"].size(0)
    if B % G != 0:
        raise RuntimeError(f"group JS needs whole groups on each process, but this process holds {B} "
                           f"completions, not a multiple of num_generations={G}")
    ids = torch.where(batch["prompt_mask"].bool(), batch["prompt_ids"], -1).view(B // G, G, -1)
    # Checked on the device (no host read in the step): on a GPU a failure fails the stream with this message.
    try:
        torch._assert_async((ids == ids[:, :1]).all(), _NOT_LOCAL)
    except RuntimeError as err:
        raise RuntimeError(_NOT_LOCAL) from err


_NOT_LOCAL = ("the completions in a block of num_generations rows on this process do not share one prompt: TRL's "
              "sampler layout changed, so groups cannot be kept local")


def gather_rows(accelerator: Any, x: Tensor, pad: float | int = 0) -> Tensor:
    """[B_local, T_local] → [B_global, T_max]: the generation batch of all processes, in TRL's row order."""
    return accelerator.gather(accelerator.pad_across_processes(x, dim=1, pad_index=pad))


def gather_stats(accelerator: Any, stats: TokenStats) -> TokenStats:
    return TokenStats(**{f: gather_rows(accelerator, getattr(stats, f)) for f in STAT_FIELDS})


def drop_nan_metrics(metrics: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if v == v}


def log_selection(metrics: dict[str, list[float]], g_mask: Tensor, g_stats: TokenStats | None,
                  g_js: Tensor | None, g_selected: Tensor, warming_up: bool) -> None:
    """Append the ``ictrl/*`` selection metrics of one generation batch (all processes) to TRL's metric lists
    (none without statistics: a selector that reads none gets its metrics with the loss's forward)."""
    if g_stats is None:
        return
    for key, value in drop_nan_metrics(step_metrics(g_stats, g_mask, g_selected)).items():
        metrics[f"ictrl/{key}"].append(value)
    if g_js is not None:
        for name, where in (("all", g_mask), ("selected", g_selected & g_mask)):
            if bool(where.any()):
                metrics[f"ictrl/ict_score/{name}"].append(float(g_js[where].double().mean()))
    metrics["ictrl/warmup"].append(float(warming_up))


@dataclass(frozen=True)
class SelectionStep:
    """The run's statistics, selection and the loss's normalisers (built once; see the module docstring).

    ``source``: where the statistics come from in each mode. ``temperature``: the sampling temperature, the
    loss's (``sparse_backward``'s head). ``options``: the selector's options as ``Selector.resolve_options``
    returned them. ``count_selected``: the token normaliser counts the selected tokens (``token_mean_selected``),
    else every response token. ``buffer_mean``: TRL's own token-mean loss types (dapo, cispo and vespo under
    ``all``) take the generation buffer's average, as TRL does.
    """

    accelerator: Any
    selector: Selector
    options: dict[str, Any]
    warmup_steps: int
    count_selected: bool
    buffer_mean: bool
    source: StatsSource
    temperature: float

    def in_warmup(self, step: int) -> bool:
        """The first Θ optimizer steps select every response token (and need no group JS)."""
        return in_warmup(step, self.warmup_steps)

    def statistics(self, model: Any, batch: dict[str, Any], mask: Tensor, *, mode: str, G: int, need_js: bool,
                   fused: Fused | None = None, hidden: Tensor | None = None,
                   sampler_topk: tuple[Tensor, Tensor] | None = None) -> tuple[TokenStats, Tensor | None]:
        """The statistics of ``batch`` ([B, T] fields) and, with ``need_js``, its [B, T] group JS: from ``fused``
        (TRL's fused head) when given, else the source's sweep over ``hidden`` or over the model's own forward of
        ``batch`` in ``mode`` (``sampler_topk``: the top-K the sampler recorded). Group JS needs each group of ``G``
        rows whole on this process, checked here in TRL's generation order (``batch["ictrl_row"]``: each row's
        global index, when TRL has shuffled the rows)."""
        groups = None
        if need_js:  # never with ``fused``: TRL's fused head has no group JS (StatsSource.fused)
            rank, B = self.accelerator.process_index, mask.size(0)
            if "ictrl_row" in batch:
                order = torch.argsort(batch["ictrl_row"] - rank * B)
                check_local_groups({k: batch[k][order] for k in ("prompt_ids", "prompt_mask")}, G)
                groups = batch["ictrl_row"] // G
            else:
                check_local_groups(batch, G)
                groups = local_groups(rank, B, G, mask.device)
        return self.source(model, *model_inputs(batch), mask, groups, mode=mode, hidden=hidden, fused=fused,
                           sampler_topk=sampler_topk, group_size=G)

    def mask(self, model: Any, batch: dict[str, Any], metrics: dict[str, list[float]], step: int, *, mode: str,
             G: int, need_js: bool, stats: Stats | None = None, fused: Fused | None = None,
             hidden: Tensor | None = None, sampler_topk: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """Statistics, then the selection: the local [B, T] mask of ``batch``, a whole local generation batch,
        chosen on the generation batch of all processes (:meth:`select`). ``stats``: the statistics already in hand
        ((None, None): a selector that reads none); else :meth:`statistics` of ``fused`` / ``hidden`` / the model.
        With ``batch["ictrl_row"]`` its rows are TRL's shuffle of the generation batch: they are selected in
        generation order and the mask is put back in the batch's order."""
        mask = response_mask(batch)
        found, js = stats if stats is not None else self.statistics(
            model, batch, mask, mode=mode, G=G, need_js=need_js, fused=fused, hidden=hidden, sampler_topk=sampler_topk)
        if "ictrl_row" not in batch:
            return self.select(metrics, step, mask, found, js, batch["advantages"], G)
        local = batch["ictrl_row"] - self.accelerator.process_index * mask.size(0)  # index in generation order
        order = torch.argsort(local)
        ordered = None if found is None else TokenStats(**{f: getattr(found, f)[order] for f in STAT_FIELDS})
        return self.select(metrics, step, mask[order], ordered, None if js is None else js[order],
                           batch["advantages"][order], G)[local]

    def old_logps(self, model: Any, input_ids: Tensor, attention_mask: Tensor, T: int, *, rows: int | None,
                  mode: str, G: int, need_js: bool) -> tuple[Tensor, Stats]:
        """Path ``shared_old_logps``: TRL's [B, T] old log-probs and the statistics of the same rows from one
        no-grad pass: TRL's fused head (in chunks of ``rows``) when the statistics need neither group JS nor another
        temperature, else the statistics sweep, whose ``logprob`` (same rows, same temperature) TRL gets."""
        mask = attention_mask[:, -T:].bool()
        batch = {"prompt_ids": input_ids[:, :-T], "completion_ids": input_ids[:, -T:],
                 "prompt_mask": attention_mask[:, :-T], "completion_mask": attention_mask[:, -T:]}
        if self.source.fused(need_js):
            fused = self.source.forward(model, input_ids, attention_mask, T, rows=rows)
            return fused.logps, self.statistics(model, batch, mask, mode=mode, G=G, need_js=need_js, fused=fused)
        stats, js = self.statistics(model, batch, mask, mode=mode, G=G, need_js=need_js)
        return stats.logprob, (stats, js)

    def policy_logps(self, model: Any, inputs: dict[str, Any], metrics: dict[str, list[float]], step: int, *,
                     G: int, accumulation: int, logged: bool, sparse: bool, trl_logps: Callable[[], Tensor]
                     ) -> Tensor:
        """The loss's [B, T] log π_θ (with grad) of the micro-batch ``inputs``.

        Path ``training_forward`` (the batch carries ``ictrl_row``): :meth:`_training_forward`, whose statistics
        select the micro-batch. Otherwise the selection came with the batch: TRL's fused forward (``trl_logps``),
        or with ``sparse`` (``sparse_backward``) the backbone and then the head at the selected positions only.
        """
        if "ictrl_row" in inputs:
            return self._training_forward(model, inputs, metrics, step, G=G, accumulation=accumulation,
                                          logged=logged, sparse=sparse)
        if not sparse:
            return trl_logps()
        input_ids, attention_mask = model_inputs(inputs)
        T = inputs["completion_ids"].size(1)
        hidden = final_hidden(model, input_ids, attention_mask, T, self.source.autocast)
        selected = inputs["ictrl_selected"] & response_mask(inputs)
        return self._sparse_head(model, hidden, inputs["completion_ids"], selected)

    def _training_forward(self, model: Any, inputs: dict[str, Any], metrics: dict[str, list[float]], step: int, *,
                          G: int, accumulation: int, logged: bool, sparse: bool) -> Tensor:
        """Path ``training_forward``: [B, T] log π_θ (with grad) of the micro-batch, whose statistics select it.

        A selector that reads no statistics (``all``, ``random``): TRL's fused forward; its entropy and Σp² give
        the metrics (when ``logged``), the selection was made at generation. Other selectors: the micro-batch is the
        whole local generation batch, shuffled by TRL (``ictrl_row``). The backbone runs once with grad; the
        statistics sweep its hidden states without grad (TRL's fused entropy and Σp² for selectors without group
        JS); :meth:`mask` selects and the normalisers are attached; then the head with grad (``sparse``: the
        selected positions only).
        """
        source = self.source
        input_ids, attention_mask = model_inputs(inputs)
        mask = response_mask(inputs)
        T = mask.size(1)
        metrics["ictrl/stats_path"].append(STATS_PATHS["training_forward"])
        if source.stat_free:  # selected at generation; only the metrics of this micro-batch on all processes
            fused = source.forward(model, input_ids, attention_mask, T, sum_sq=logged)
            if logged:
                start = time.perf_counter()
                stats, _ = self.statistics(model, inputs, mask, mode="train", G=G, need_js=False, fused=fused)
                self.log(metrics, step, mask, stats, inputs["ictrl_selected"])
                metrics["ictrl/stats_time"].append(time.perf_counter() - start)
            return fused.logps
        need_js = source.needs_js and not self.in_warmup(step)
        hidden = None
        if sparse:
            fused, hidden = None, final_hidden(model, input_ids, attention_mask, T, source.autocast)
        elif source.fused(need_js):
            fused = source.forward(model, input_ids, attention_mask, T)
        else:
            fused = source.forward(model, input_ids, attention_mask, T, keep_hidden=True, sum_sq=False)
            hidden = fused.hidden
        start = time.perf_counter()
        selected = self.mask(model, inputs, metrics, step, mode="train", G=G, need_js=need_js,
                             fused=fused if hidden is None else None, hidden=hidden)
        inputs["ictrl_selected"] = selected
        self.attach_normalisers([inputs], accumulation)
        metrics["ictrl/stats_time"].append(time.perf_counter() - start)  # the no-grad sweep, selection, metrics
        if fused is None:
            return self._sparse_head(model, hidden, inputs["completion_ids"], selected & mask)
        return fused.logps

    def _sparse_head(self, model: Any, hidden: Tensor | None, completion_ids: Tensor, selected: Tensor) -> Tensor:
        """[B, T] log π_θ from [B, T, H] hidden states, the head with grad on ``selected`` only (0 elsewhere).

        The head's whole weight comes from :func:`call_head`, so a sharded engine gathers it and reduces its
        gradient as for the model's own head (``sparse_backward``: ICTGRPOConfig).
        """
        assert hidden is not None

        def sparse_head(lm: torch.nn.Module | Tensor, h: Tensor) -> Tensor:
            return selected_token_logprobs(h, lm, completion_ids, selected, temperature=self.temperature)

        with self.source.autocast():
            return call_head(self.source.head(model), sparse_head, hidden)

    def select(self, metrics: dict[str, list[float]], step: int, mask: Tensor, stats: TokenStats | None,
               js: Tensor | None, advantages: Tensor, G: int) -> Tensor:
        """The local rows' [B, T] selection at optimizer step ``step``, chosen on the generation batch gathered
        from all processes, with its ``ictrl/*`` metrics appended to ``metrics`` (TRL's lists of the mode)."""
        acc = self.accelerator
        B, T = mask.shape
        rank = acc.process_index
        g_mask = gather_rows(acc, mask.to(torch.uint8)).bool()
        g_stats = None if stats is None else gather_stats(acc, stats)
        inputs = SelectionInputs(
            mask=g_mask, step=step, ict_score=None if js is None else gather_rows(acc, js),
            entropy=None if g_stats is None else g_stats.entropy, prob=None if g_stats is None else g_stats.prob,
            advantages=acc.gather(advantages.float()),
            group_ids=torch.arange(g_mask.size(0), device=g_mask.device) // G)
        g_selected = self.selector.apply(inputs, self.warmup_steps, self.options)
        log_selection(metrics, g_mask, g_stats, inputs.ict_score, g_selected, self.in_warmup(step))
        return g_selected[rank * B:(rank + 1) * B, :T].contiguous()

    def log(self, metrics: dict[str, list[float]], step: int, mask: Tensor, stats: TokenStats,
            selected: Tensor) -> None:
        """The metrics of a selection made without statistics (``all``, ``random``), from the statistics of the
        loss's forward on all processes."""
        acc = self.accelerator
        g_stats = gather_stats(acc, stats)
        log_selection(metrics, gather_rows(acc, mask.to(torch.uint8)).bool(), g_stats, None,
                      gather_rows(acc, selected.to(torch.uint8)).bool(), self.in_warmup(step))

    def attach_normalisers(self, batches: list[dict[str, Any]], accumulation: int) -> None:
        """Attach ``ictrl_num_responses`` / ``ictrl_num_tokens`` / ``ictrl_num_mask_tokens`` (0-d): totals over each
        optimizer step's micro-batches on all processes (``ictrl_num_tokens``: the selected tokens when
        ``count_selected``, else every response token; ``ictrl_num_mask_tokens``: every response token).

        Exact when the buffered micro-batches split into whole optimizer steps (steps_per_generation a multiple
        of gradient_accumulation_steps, TRL's default); otherwise an optimizer step spans several generation
        batches not yet generated, and the buffer's totals are scaled by accumulation / len(batches), as TRL's
        'dapo' normaliser does; ``buffer_mean`` always takes that buffer average.
        """
        counts = []
        for b in batches:
            mask = response_mask(b)
            selected = b["ictrl_selected"] & mask
            # on the device: the totals go to the loss as tensors, so no host read here
            counts.append(torch.stack([torch.tensor(float(mask.size(0)), dtype=torch.float64, device=mask.device),
                                       selected.sum().double(), mask.sum().double()]))
        local = torch.stack(counts).double()  # [n, 3]
        n = local.size(0)
        if n % accumulation == 0 and not self.buffer_mean:
            windows = local.view(n // accumulation, accumulation, 3).sum(dim=1)
            index = [i // accumulation for i in range(n)]
        else:
            windows = local.sum(dim=0, keepdim=True) * (accumulation / n)
            index = [0] * n
        windows = self.accelerator.reduce(windows.to(self.accelerator.device), reduction="sum")
        token_col = 1 if self.count_selected else 2
        for b, w in zip(batches, index):
            b["ictrl_num_responses"] = windows[w, 0].clone()
            b["ictrl_num_tokens"] = windows[w, token_col].clone()
            b["ictrl_num_mask_tokens"] = windows[w, 2].clone()


def metrics_logged(args: Any, state: Any, training: bool) -> bool:
    """Whether the metrics of the optimizer step in progress reach a log: transformers' DefaultFlowCallback logs
    after step ``global_step + 1`` when it is a multiple of ``logging_steps``, or is the first step with
    ``logging_first_step``. True when not ``training`` (in ``train()`` with the model in train mode) and under
    the epoch strategy (the last step of an epoch is not known here); False with ``logging_strategy="no"``. A log
    another callback forces on a step off the cadence carries TRL's metrics without these."""
    step = int(state.global_step) + 1
    if not training or args.logging_strategy == "epoch":
        return True
    if bool(args.logging_first_step) and step == 1:
        return True
    return args.logging_strategy == "steps" and step % max(int(state.logging_steps), 1) == 0
