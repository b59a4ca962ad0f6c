"""The selection step: one mask for the whole generation batch, the same on every process, and its normalisers.

:class:`SelectionStep` is built once when the trainer is, with the run's resolved selector and options, its
warm-up Θ and the normaliser flags; the trainer calls :meth:`SelectionStep.select` where a generation batch's
statistics are ready and :meth:`SelectionStep.attach_normalisers` where TRL has buffered its micro-batches.

TRL's sampler places each prompt's G completions contiguously in the global generation batch, and process p holds
rows [p·B, (p+1)·B). The selection runs on the [B_global, T] tensors gathered from all processes, so every process
computes the mask one process would, and keeps its own rows. The loss's normalisers are totals over each optimizer
step's micro-batches on all processes, so any split of one optimizer batch gives the one-big-batch gradient.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ictrl.core.metrics import step_metrics
from ictrl.core.selection import SelectionInputs, Selector, in_warmup
from ictrl.core.stats import TokenStats
from ictrl.engine.stats_pass import STAT_FIELDS, response_mask


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
    """The run's selection and the loss's normalisers (built once; see the module docstring).

    ``options``: the selector's options as ``Selector.resolve_options`` returned them. ``count_selected``: the
    token normaliser counts the selected tokens (``token_mean_selected``), else every response token.
    ``buffer_mean``: TRL's own token-mean loss types (dapo, cispo and vespo under ``all``) take the generation
    buffer's average, as TRL does.
    """

    accelerator: Any
    selector: Selector
    options: dict[str, Any]
    warmup_steps: int
    count_selected: bool
    buffer_mean: bool

    def in_warmup(self, step: int) -> bool:
        """The first Θ optimizer steps select every response token (and need no group JS)."""
        return in_warmup(step, self.warmup_steps)

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
