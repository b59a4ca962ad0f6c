"""From TRL's batches to what the loss reads: the separate pass's statistics at generation, the one selection of a
generation batch (:func:`select_tokens`, the only place a mask is decided), the normalisers, the loss's forward and
the sparse head (:class:`LossInputsBuilder`), and the views of a TRL batch."""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NamedTuple

import torch
from torch import Tensor

from ictrl.core.checks import require_on_device
from ictrl.core.logprobs import selected_token_logprobs, selected_token_logprobs_unchecked
from ictrl.core.metrics import Metric, read_metrics, step_metric_values
from ictrl.core.selection import SelectionInputs, Selector, SelectorError, in_warmup, rule_source_file
from ictrl.core.stats import TokenStats
from ictrl.engine.heads import call_head
from ictrl.engine.reward_policy import RunStop
from ictrl.engine.stats_source import STAT_FIELDS, LossForward, Stats, StatsSource, StepContext, Wants

# The one hand-off (docs/architecture.md, "One training step"): TRL shuffles and splits a generation batch over
# steps_per_generation carrying its [B, ...] tensors, so what a row's selection needs rides in the batch from
# generation to the loss: ``ictrl_row`` (each row's index in generation order), and on the separate path its
# statistics (``ictrl_stats``: [B, T, F], the fields of STAT_FIELDS in order; ``ictrl_ict_score``: [B, T]). The
# selection, made where the loss first sees a micro-batch of the buffer, writes ``ictrl_selected`` (the [B, T]
# mask) and the normalisers into every micro-batch TRL buffered. Only this module writes or reads them.
SELECTED, ROW, STATS, ICT_SCORE = "ictrl_selected", "ictrl_row", "ictrl_stats", "ictrl_ict_score"
NORMALISERS = ("ictrl_num_responses", "ictrl_num_tokens", "ictrl_num_mask_tokens")
log = logging.getLogger(__name__)


class LossInputs(NamedTuple):
    """What the loss reads of one micro-batch: [B, T] log π_θ (with grad), the response mask, the tokens that carry
    the loss, the normalisers (``LossExtras`` fields), where the forward gave them the entropy and router loss, and
    whether ``logps`` holds every response token (the sparse head's only the selected ones)."""

    logps: Tensor
    mask: Tensor
    selected: Tensor
    norm: dict[str, Tensor]
    entropy: Tensor | None = None
    aux: Tensor | None = None
    dense: bool = True


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
    # Checked on the device (no host read in the step): on a GPU a failure is raised at the next rollout.
    try:
        require_on_device((ids == ids[:, :1]).all(), _NOT_LOCAL)
    except ValueError as err:
        raise RuntimeError(_NOT_LOCAL) from err


_NOT_LOCAL = ("the completions in a block of num_generations rows on this process do not share one prompt: TRL's "
              "sampler layout changed, so groups cannot be kept local")


def gather_rows(accelerator: Any, x: Tensor, pad: float | int = 0) -> Tensor:
    """[B_local, T_local] → [B_global, T_max]: the generation batch of all processes, in TRL's row order."""
    return accelerator.gather(accelerator.pad_across_processes(x, dim=1, pad_index=pad))


def gather_stats(accelerator: Any, stats: TokenStats) -> TokenStats:
    return TokenStats(**{f: gather_rows(accelerator, getattr(stats, f)) for f in STAT_FIELDS})


def carry_stats(batch: dict[str, Any], stats: Stats) -> None:
    """Put a generation batch's statistics in it, to ride TRL's shuffle and split to the selection."""
    found, js = stats
    assert found is not None
    batch[STATS] = torch.stack([getattr(found, f) for f in STAT_FIELDS], dim=-1)
    if js is not None:
        batch[ICT_SCORE] = js


def carried_stats(batch: dict[str, Any]) -> Stats:
    """The statistics :func:`carry_stats` put in ``batch`` (a micro-batch of it after TRL's shuffle and split)."""
    packed = batch[STATS]
    return TokenStats(**{f: packed[..., i] for i, f in enumerate(STAT_FIELDS)}), batch.get(ICT_SCORE)


def _in_order(parts: list[Tensor | None], order: Tensor) -> Tensor | None:
    return None if any(p is None for p in parts) else torch.cat(parts)[order]  # type: ignore[arg-type]


def log_selection(metrics: dict[str, list[float]], g_mask: Tensor, g_stats: TokenStats | None,
                  g_js: Tensor | None, g_selected: Tensor, warming_up: bool, extra: list[Metric] | None = None
                  ) -> dict[str, float]:
    """Append the ``ictrl/*`` selection metrics of one generation batch (all processes) to TRL's metric lists,
    read from the device in one transfer with ``extra`` (none without statistics or ``extra``); returns what was
    read."""
    values = list(extra or [])
    if g_stats is not None:
        values += step_metric_values(g_stats, g_mask, g_selected)
    if g_js is not None:
        for name, where in (("all", g_mask), ("selected", g_selected & g_mask)):
            values.append((f"ict_score/{name}", g_js[where].double().mean(), where.sum()))
    if not values:
        return {}
    read = read_metrics(values)
    for key, value in read.items():
        if value == value:  # a NaN field (no log Σp² from the fused head) drops out
            metrics[f"ictrl/{key}"].append(value)
    if g_stats is not None:
        metrics["ictrl/warmup"].append(float(warming_up))
    return read


class EmptySelection(RunStop):
    """A rule selected no token for ``no_signal_steps`` optimizer steps in a row: the policy loss was 0."""


@dataclass
class SelectionWatch:
    """What a user's rule did that cannot be what was meant, named as it happens: a selection with no token (each
    time; after ``limit`` optimizer steps in a row, the ``no_signal_steps`` of the run, :class:`EmptySelection`
    stops the run as ictrl stops other runs that train nothing), padding selected (once: it is dropped)."""

    limit: int = 0
    steps_per_batch: int = 1
    empty_steps: int = 0
    said_padding: bool = False

    def observe(self, read: dict[str, float], rule: str, step: int) -> None:
        if read.get("selection/padding", 0) > 0 and not self.said_padding:
            self.said_padding = True
            log.warning("selector %s selected %d padding position(s) outside the response mask at step %d: they carry "
                        "no loss and are dropped (said once); a rule's mask is a subset of inputs.mask", rule,
                        int(read["selection/padding"]), step)
        if read.get("selection/empty") != 1.0:
            self.empty_steps = 0
            return
        self.empty_steps += max(1, self.steps_per_batch)
        log.warning("selector %s selected no token of the batch's response tokens at step %d: its policy loss and "
                    "gradient are 0 (ictrl/selection/empty)", rule, step)
        if self.limit and self.empty_steps >= self.limit:
            raise EmptySelection(f"selector {rule} selected no token for {self.empty_steps} optimizer steps in a row, "
                                 "so the policy loss and its gradient were 0: the run trains nothing; check the rule "
                                 "(its ratio or threshold), or set no_signal_steps: 0 to train on")


def _rule_metric(metrics: dict[str, list[float]], name: str, value: float) -> None:
    metrics[f"ictrl/rule/{name}"].append(value)


def mask_digest(selected: Tensor) -> Tensor:
    """A 0-d int64 fingerprint of a [B, T] bool mask (its positions weighted by a fixed hash), on its device: the
    processes compare theirs without reading the mask."""
    index = torch.arange(selected.numel(), device=selected.device)
    weights = (index * 2654435761) % 2147483647 + 1  # below 2**31: the sum of a batch's stays inside int64
    return (selected.reshape(-1).long() * weights).sum()


def high_entropy_mask(accelerator: Any, entropy: Tensor, mask: Tensor, quantile: float) -> Tensor:
    """TRL's ``get_high_entropy_mask``: the response tokens whose entropy reaches the ``1 - quantile`` quantile of
    the micro-batch's response tokens on all processes."""
    local = entropy[mask.bool()].float()
    pad = -1e9  # entropy is never negative, so the pad value cannot collide with one
    gathered = accelerator.gather(accelerator.pad_across_processes(local, dim=0, pad_index=pad))
    gathered = gathered[gathered != pad]
    if gathered.numel() == 0:
        return torch.zeros_like(entropy, dtype=torch.bool)
    threshold = torch.quantile(gathered, 1.0 - quantile)
    return ((entropy * mask.float()) >= threshold) & mask.bool()


def select_tokens(accelerator: Any, selector: Selector, options: dict[str, Any], warmup_steps: int, seed: int,
                  step: StepContext, mask: Tensor, stats: Stats, advantages: Tensor, group_ids: Tensor,
                  watch: SelectionWatch) -> Tensor:
    """The one place a step's token mask is decided: ``selector`` (with its ``options`` and ``warmup_steps``)
    applied to the generation batch gathered from all processes, from this process's rows in generation order
    (``mask``, ``stats``, ``advantages``; ``group_ids``: the gathered batch's), its generator seeded from ``seed``
    and ``step.step``. Returns the local rows' [B, T] selection; its ``ictrl/*`` metrics go to ``step.metrics``,
    and a user's rule is checked (:func:`_check_users_rule`)."""
    found, js = stats
    B, T = mask.shape
    g_mask = gather_rows(accelerator, mask.to(torch.uint8)).bool()
    g_stats = None if found is None else gather_stats(accelerator, found)
    g_js = None if js is None else gather_rows(accelerator, js)
    inputs = SelectionInputs.from_stats(
        g_mask, None if g_stats is None else dataclasses.replace(g_stats, ict_score=g_js), step.needs,
        step=step.step, seed=seed, metric_sink=partial(_rule_metric, step.metrics),
        advantages=accelerator.gather(advantages.float()), group_ids=group_ids)
    chosen = selector.choose(inputs, warmup_steps, options)
    g_selected = chosen & g_mask
    warming_up = in_warmup(step.step, warmup_steps)
    if rule_source_file(selector.fn) is None:  # ictrl's own rules: a subset of the mask, never empty
        log_selection(step.metrics, g_mask, g_stats, g_js, g_selected, warming_up)
    else:
        _check_users_rule(accelerator, selector.rule, watch, step, g_mask, g_stats, g_js, chosen, g_selected,
                          warming_up)
    rank = accelerator.process_index
    return g_selected[rank * B:(rank + 1) * B, :T].contiguous()


def _check_users_rule(accelerator: Any, rule: str, watch: SelectionWatch, step: StepContext, g_mask: Tensor,
                      g_stats: TokenStats | None, g_js: Tensor | None, chosen: Tensor, g_selected: Tensor,
                      warming_up: bool) -> None:
    """A user's rule's selection, its metrics and what it cannot have meant: another mask on another process
    (their fingerprints gathered), padding selected and an empty selection, read with the selection's metrics in
    one transfer (the one host read of a rule that reads no statistics), so each is named before the loss."""
    n_all, n_sel = g_mask.sum().double(), g_selected.sum().double()
    one = n_all.new_ones(())
    extra = [("selection/empty", ((n_sel == 0) & (n_all > 0)).double(), one),
             ("selection/padding", (chosen & ~g_mask).sum().double(), one)]
    if accelerator.num_processes > 1:  # every process's fingerprint of its mask, compared in the same read
        digests = accelerator.gather(mask_digest(g_selected).reshape(1))
        extra.append(("selection/processes_differ", (digests != digests[0]).any().double(), one))
    read = log_selection(step.metrics, g_mask, g_stats, g_js, g_selected, warming_up, extra)
    if read.get("selection/processes_differ"):
        raise SelectorError(f"selector {rule} gave the processes different masks at step {step.step}: a rule must "
                            "be a function of its inputs; draw random numbers from inputs.generator (seeded from "
                            "selection_seed and the step, the same on every process), not torch's global generator")
    if step.mode == "train":
        watch.observe(read, rule, step.step)


@dataclass(frozen=True)
class LossInputsBuilder:
    """What the loss reads of TRL's batches, built from them: the separate pass's statistics, the selection of a
    generation batch's micro-batches, the normalisers, the loss's forward and the sparse head (one per trainer).

    ``source``: where the statistics come from in each mode. ``temperature``: the sampling temperature, the
    loss's (``sparse_backward``'s head). ``options``: the selector's options as ``Selector.resolve_options``
    returned them. ``count_selected``: the token normaliser counts the selected tokens (``token_mean_selected``),
    else every response token. ``buffer_mean``: TRL's own token-mean loss types (dapo, cispo and vespo under
    ``all``) take the generation buffer's average, as TRL does. ``local_tokens``: TRL's bnpo, whose token mean is
    the micro-batch's own count. ``seed``: the run's ``selection_seed``, which seeds a rule's
    ``inputs.generator`` with the step. ``watch``: what a user's rule did that it cannot have meant, named.
    """

    accelerator: Any
    selector: Selector
    options: dict[str, Any]
    warmup_steps: int
    count_selected: bool
    buffer_mean: bool
    source: StatsSource
    temperature: float
    local_tokens: bool = False
    seed: int = 0
    watch: SelectionWatch = field(default_factory=SelectionWatch)

    def in_warmup(self, step: int) -> bool:
        """The first Θ optimizer steps select every response token (and need no group JS)."""
        return in_warmup(step, self.warmup_steps)

    # --------------------------------------------------------------------------------------- generation

    def statistics(self, model: Any, batch: dict[str, Any], step: StepContext) -> Stats:
        """The separate pass over the generation ``batch``: its statistics and, where the step reads it, the group
        JS."""
        return self.source(model, *model_inputs(batch), response_mask(batch), self._groups(batch, step, None))

    def keep_row_order(self, batch: dict[str, Any]) -> None:
        """Each row's index in generation order, for the selection made in the loss, after TRL's shuffle."""
        B, device = batch["completion_mask"].size(0), batch["completion_mask"].device
        batch[ROW] = self.accelerator.process_index * B + torch.arange(B, device=device)

    def _groups(self, batch: dict[str, Any], step: StepContext, row: Tensor | None) -> Tensor | None:
        """[B] group ids of ``batch`` when group JS is needed, after checking that each group is whole on this
        process, in TRL's generation order (``row``: each row's index in it, when TRL has shuffled the rows)."""
        if not step.need_js:
            return None
        rank, B = self.accelerator.process_index, batch["prompt_ids"].size(0)
        if row is None:
            check_local_groups(batch, step.G)
            return local_groups(rank, B, step.G, batch["prompt_ids"].device)
        order = torch.argsort(row - rank * B)
        check_local_groups({k: batch[k][order] for k in ("prompt_ids", "prompt_mask")}, step.G)
        return row // step.G

    def attach_normalisers(self, batches: list[dict[str, Any]], accumulation: int) -> None:
        """Attach each micro-batch's normalisers (0-d): totals over its optimizer step's micro-batches on all
        processes of the responses, the tokens (the selected ones when ``count_selected``, else every response
        token) and every response token.

        Exact when the buffered micro-batches split into whole optimizer steps (steps_per_generation a multiple
        of gradient_accumulation_steps, TRL's default); otherwise an optimizer step spans several generation
        batches not yet generated, and the buffer's totals are scaled by accumulation / len(batches), as TRL's
        'dapo' normaliser does; ``buffer_mean`` always takes that buffer average.
        """
        counts = []
        for b in batches:
            mask = response_mask(b)
            selected = b[SELECTED] & mask
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
        columns = (0, 1 if self.count_selected else 2, 2)
        for b, w in zip(batches, index):
            for key, col in zip(NORMALISERS, columns):
                b[key] = windows[w, col].clone()

    # --------------------------------------------------------------------------------------------- loss

    def loss_forward(self, model: Any, batch: dict[str, Any], step: StepContext, wants: Wants | None,
                     stats: bool = False) -> LossForward:
        """The loss's forward of the micro-batch ``batch``: TRL's fused head computing ``wants`` (None: the backbone
        alone, for the sparse head), and with ``stats`` the statistics it gives (:meth:`StatsSource.loss_forward`;
        with group JS in generation order where the batch keeps it)."""
        mask = response_mask(batch)
        groups = self._groups(batch, step, batch[ROW]) if stats else None
        req = self.source.request(model, mask, batch["completion_ids"], groups)
        return self.source.loss_forward(model, *model_inputs(batch), req, wants, stats)

    def select_batches(self, batches: list[dict[str, Any]], step: StepContext, stats: list[Stats],
                       accumulation: int) -> None:
        """Select the generation batch whose micro-batches (this process's, in TRL's shuffled order) are ``batches``,
        from their statistics ``stats``: the rows put back in generation order (``ictrl_row``), one selection of the
        batch gathered from all processes, each micro-batch's rows of it attached as ``ictrl_selected``, then the
        normalisers over ``accumulation`` micro-batches per optimizer step."""
        rows = torch.cat([b[ROW] for b in batches])
        local = rows - self.accelerator.process_index * rows.numel()  # index in generation order
        order = torch.argsort(local)
        found = [s[0] for s in stats]
        ordered = (None if any(f is None for f in found) else TokenStats(**{
            f: torch.cat([getattr(x, f) for x in found])[order] for f in STAT_FIELDS}),  # type: ignore[arg-type]
            _in_order([s[1] for s in stats], order))
        mask = torch.cat([response_mask(b) for b in batches])[order]
        acc = self.accelerator
        group_ids = torch.arange(acc.num_processes * mask.size(0), device=mask.device) // step.G
        selected = select_tokens(acc, self.selector, self.options, self.warmup_steps, self.seed, step, mask, ordered,
                                 torch.cat([b["advantages"] for b in batches])[order], group_ids, self.watch)[local]
        start = 0
        for b in batches:
            b[SELECTED] = selected[start:start + b[ROW].numel()]
            start += b[ROW].numel()
        self.attach_normalisers(batches, accumulation)

    def for_loss(self, model: Any, batch: dict[str, Any], step: StepContext, out: LossForward) -> LossInputs:
        """What the loss reads of the selected micro-batch ``batch`` after its forward ``out``: its log π_θ (the
        sparse head's where the forward kept hidden states), the tokens that carry the loss (narrowed by TRL's
        entropy mask under its dense forward) and the normalisers, the world division and bnpo's included."""
        mask = response_mask(batch)
        if out.stats is not None:
            step.metrics["ictrl/stats_time"].append(time.perf_counter() - out.started)
        selected = batch[SELECTED]
        if out.stats is not None and self.source.stat_free:  # selected without them: their metrics, from this forward
            assert out.stats[0] is not None
            self.log(step, mask, out.stats[0], selected)
        if step.dense and step.entropy_quantile < 1.0:  # TRL's own mask over this micro-batch
            assert out.entropy is not None
            selected = selected & high_entropy_mask(self.accelerator, out.entropy, mask, step.entropy_quantile)
        logps = out.logps if out.logps is not None else self._sparse_head(
            model, out.hidden, batch["completion_ids"], selected & mask)
        return LossInputs(logps, mask, selected, self._normalisers(batch, selected & mask, step, logps.dtype),
                          out.entropy, out.aux, out.logps is not None)

    def _normalisers(self, batch: dict[str, Any], active: Tensor, step: StepContext, dtype: torch.dtype
                     ) -> dict[str, Tensor]:
        """The loss's normalisers of this process: DDP averages the processes' gradients, so each divides the global
        counts by the process count; TRL's bnpo token mean is the micro-batch's own count, scaled for accumulation."""
        world = self.accelerator.num_processes
        responses, tokens, mask_tokens = (batch[k] for k in NORMALISERS)
        tokens = tokens / world
        if self.local_tokens:
            count = active if self.count_selected else response_mask(batch)
            tokens = count.sum().to(dtype) * step.accumulation
        return {"num_responses": responses / world, "num_tokens": tokens, "num_mask_tokens": mask_tokens / world}

    def _sparse_head(self, model: Any, hidden: Tensor | None, completion_ids: Tensor, selected: Tensor) -> Tensor:
        """[B, T] log π_θ from [B, T, H] hidden states, the head with grad on ``selected`` only (0 elsewhere).

        The head's whole weight comes from :func:`call_head`, so a sharded engine gathers it and reduces its
        gradient as for the model's own head (``sparse_backward``: ICTGRPOConfig).
        """
        assert hidden is not None
        logprobs_of = selected_token_logprobs if self.source.check else selected_token_logprobs_unchecked

        def sparse_head(lm: torch.nn.Module | Tensor, h: Tensor) -> Tensor:
            return logprobs_of(h, lm, completion_ids, selected, temperature=self.temperature)

        with self.source.autocast():
            return call_head(self.source.head(model), sparse_head, hidden, transform=self.source.transform)


    def log(self, step: StepContext, mask: Tensor, stats: TokenStats, selected: Tensor) -> None:
        """The metrics of a selection made without statistics (``all``, ``random``), from the statistics of the
        loss's forward on all processes."""
        acc = self.accelerator
        log_selection(step.metrics, gather_rows(acc, mask.to(torch.uint8)).bool(), gather_stats(acc, stats), None,
                      gather_rows(acc, selected.to(torch.uint8)).bool(), self.in_warmup(step.step))

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
