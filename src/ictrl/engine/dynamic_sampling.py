"""DAPO dynamic sampling (Yu et al. 2025, §3.2): every optimizer step trains on groups whose rewards differ.

A group whose G rewards are all equal has zero advantage in every row, so it carries no policy gradient and only
dilutes the normaliser. With ``dynamic_sampling=True`` the trainer drops such groups from each generation batch
and samples more prompts, in extra generation rounds, until every process again holds its full count of groups
(``generation_batch_size / num_generations`` in all), each informative. After ``dynamic_sampling_max_rounds`` extra
rounds a process still short is filled with the first round's uniform groups (logged, so the shortfall shows).

Design choices (docs/method-choices.md):

- Selection is per process: each process keeps its own informative groups, so groups stay whole and local, and
  no completion moves between processes. Every process runs the same number of rounds (the rounds are collective:
  TRL gathers rewards across processes), decided by a global all-reduce of the shortfall.
- Extra prompts come from a draw seeded by (``seed``, optimizer step, round), not from the training dataloader:
  the main data order, and the batches skipped on resume, stay exactly what they are without dynamic sampling,
  and a resumed run redraws the same extra prompts. A draw is without replacement within a round.
- Groups are taken in order: the first round's informative groups, then each extra round's.

Logged per generation batch: ``ictrl/dynamic_sampling_rounds`` (extra rounds run), ``ictrl/informative_groups``
(informative groups in the final batch, all processes) and ``ictrl/informative_groups_first_round``. TRL's own
reward metrics average over every round generated (what was sampled, dropped groups included).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

log = logging.getLogger(__name__)

# [B, ...] keys padded on the left (prompts); other [B, T] keys are completion-aligned and padded on the right.
LEFT_PADDED = {"prompt_ids": "pad", "prompt_mask": 0}
RIGHT_PAD = {"completion_ids": "pad", "tool_mask": 1}


def informative_groups(rewards: Tensor, num_generations: int) -> Tensor:
    """rewards: [N * G] (NaN = unscorable, ignored) -> [N] bool, True where the group's rewards are not all equal.

    Same criterion as TRL's ``frac_reward_zero_std`` (``isclose(std, 0)``), so a group counted there as zero-std is
    dropped here.
    """
    grouped = rewards.view(-1, num_generations).double()
    valid = ~torch.isnan(grouped)
    count = valid.sum(dim=1)
    mean = torch.where(valid, grouped, 0.0).sum(dim=1) / count.clamp(min=1)
    var = torch.where(valid, (grouped - mean[:, None]) ** 2, 0.0).sum(dim=1) / (count - 1).clamp(min=1)
    std = var.sqrt()
    return (count >= 2) & ~torch.isclose(std, torch.zeros_like(std))


def draw_prompts(dataset_size: int, count: int, seed: int, step: int, round_index: int) -> list[int]:
    """``count`` dataset indices for extra round ``round_index`` of optimizer step ``step``: a function of these
    arguments only (identical on every process and after a resume); without replacement when the dataset allows."""
    key = hashlib.sha256(f"ictrl-dynamic-sampling/{seed}/{step}/{round_index}".encode()).digest()
    generator = torch.Generator().manual_seed(int.from_bytes(key[:8], "little") & ((1 << 63) - 1))
    if count <= dataset_size:
        return torch.randperm(dataset_size, generator=generator)[:count].tolist()
    return torch.randint(0, dataset_size, (count,), generator=generator).tolist()


def _pad_value(key: str, table: dict[str, Any], pad_token_id: int, default: float | int) -> float | int:
    value = table.get(key, default)
    return pad_token_id if value == "pad" else value


def take_rows(parts: list[tuple[dict[str, Any], Tensor]], pad_token_id: int) -> dict[str, Any]:
    """Concatenate the rows ``index`` [n_i] of each batch dict (TRL's generation output) into one batch.

    Prompt tensors are re-padded on the left, completion-aligned [B, T] tensors on the right, to the widest kept
    row (columns that hold only padding after the selection are cut). ``num_items_in_batch`` is left to the
    caller (it is a cross-process total). Raises for keys it cannot place (multimodal inputs).
    """
    first = parts[0][0]
    out: dict[str, Any] = {}
    for key, value in first.items():
        if key == "num_items_in_batch":
            continue
        if not isinstance(value, Tensor) or value.dim() == 0:
            raise ValueError(f"dynamic sampling cannot merge the generation-batch field {key!r} "
                             f"({type(value).__name__}); turn dynamic_sampling off for this model/data")
        rows = [batch[key][index] for batch, index in parts]
        if value.dim() == 1:
            out[key] = torch.cat(rows)
            continue
        left = key in LEFT_PADDED
        pad = _pad_value(key, LEFT_PADDED if left else RIGHT_PAD, pad_token_id, 0)
        width = max(r.size(1) for r in rows)
        padded = []
        for r in rows:
            fill = r.new_full((r.size(0), width - r.size(1), *r.shape[2:]), pad)
            padded.append(torch.cat([fill, r] if left else [r, fill], dim=1))
        out[key] = torch.cat(padded)
    return _trim(out)


def _trim(batch: dict[str, Any]) -> dict[str, Any]:
    """Drop leading prompt columns and trailing completion columns that are padding in every kept row."""
    prompt_used = batch["prompt_mask"].bool().any(dim=0).nonzero()
    start = int(prompt_used[0]) if len(prompt_used) else batch["prompt_mask"].size(1)
    completion_used = batch["completion_mask"].bool().any(dim=0).nonzero()
    end = int(completion_used[-1]) + 1 if len(completion_used) else 1
    width_t = batch["completion_mask"].size(1)
    width_p = batch["prompt_mask"].size(1)
    for key, value in batch.items():
        if value.dim() < 2:
            continue
        if key in LEFT_PADDED and value.size(1) == width_p:
            batch[key] = value[:, start:]
        elif key not in LEFT_PADDED and value.size(1) == width_t:
            batch[key] = value[:, :end]
    return batch


class DynamicSampling:
    """The generation-batch filter of ``args.dynamic_sampling``, one per trainer (``ICTGRPOTrainer.batch_filter``):
    :meth:`generate` runs TRL's generation, in rounds, into a batch of informative groups (training only); the
    trainer hands it TRL's gathered rewards of each round through :meth:`keep_rewards`."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer  # the ICTGRPOTrainer this filter is part of
        self.rewards: Tensor | None = None

    def keep_rewards(self, rewards_per_func: Tensor) -> Tensor:
        self.rewards = rewards_per_func  # [global rows, reward funcs], all processes
        return rewards_per_func

    def _local_informative(self, rows: int) -> Tensor:
        """[rows / G] bool: this process's groups of the last scored batch whose weighted rewards differ."""
        per_func, trainer = self.rewards, self.trainer
        assert per_func is not None, "TRL scored the batch without its _calculate_rewards"
        rewards = (per_func * trainer.reward_weights.to(per_func.device)).nansum(dim=1)
        rewards[torch.isnan(per_func).all(dim=1)] = float("nan")
        rank = trainer.accelerator.process_index
        return informative_groups(rewards[rank * rows:(rank + 1) * rows], trainer.num_generations)

    def _refill_inputs(self, round_index: int, groups: int) -> list[dict[str, Any]]:
        trainer = self.trainer
        dataset = trainer.train_dataset
        if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
            raise ValueError("dynamic_sampling draws extra prompts by index: it needs a map-style train_dataset")
        acc = trainer.accelerator
        indices = draw_prompts(len(dataset), groups * acc.num_processes, trainer.args.seed,
                               int(trainer.state.global_step), round_index)
        local = indices[acc.process_index * groups:(acc.process_index + 1) * groups]
        return [dataset[int(i)] for i in local for _ in range(trainer.num_generations)]

    def generate(self, score: Callable[[list[dict[str, Any]]], dict[str, Any]],
                 inputs: list[dict[str, Any]]) -> dict[str, Any]:
        """``score(inputs)`` (TRL's ``_generate_and_score_completions``), or with dynamic sampling on in training,
        its rounds filtered into one generation batch of ``len(inputs) / G`` informative groups."""
        trainer = self.trainer
        args = trainer.args
        if not (getattr(args, "dynamic_sampling", False) and trainer.model.training):
            return score(inputs)
        G, rows = trainer.num_generations, len(inputs)
        if rows % G:
            raise RuntimeError(f"dynamic sampling keeps whole groups on each process, but this process holds {rows} "
                               f"completions, not a multiple of num_generations={G}")
        quota = rows // G
        acc = trainer.accelerator
        parts: list[tuple[dict[str, Any], Tensor]] = []
        kept, extra_rounds, batch_inputs = 0, 0, inputs
        first: tuple[dict[str, Any], Tensor] | None = None
        while True:
            batch = score(batch_inputs)
            informative = self._local_informative(rows)
            if first is None:
                first = (batch, informative)
            groups = informative.nonzero().flatten()[:quota - kept]
            if len(groups):
                parts.append((batch, _group_rows(groups, G)))
                kept += len(groups)
            short = acc.reduce(torch.tensor(float(quota - kept), device=acc.device), reduction="sum")
            if float(short) == 0 or extra_rounds >= args.dynamic_sampling_max_rounds:
                break
            extra_rounds += 1
            batch_inputs = self._refill_inputs(extra_rounds, quota)
        informative_total = acc.reduce(torch.tensor(float(kept), device=acc.device), reduction="sum")
        if kept < quota:  # cap reached: the first round's uniform groups keep the batch shape (zero advantage)
            log.warning("dynamic sampling: %d of %d groups informative after %d extra rounds; filling with uniform "
                        "groups", kept, quota, extra_rounds)
            uniform = (~first[1]).nonzero().flatten()[:quota - kept]
            parts.append((first[0], _group_rows(uniform, G)))
        # processing_class is a tokenizer, or a processor that holds one (a vision-language model)
        tokenizer = getattr(trainer.processing_class, "tokenizer", trainer.processing_class)
        out = take_rows(parts, tokenizer.pad_token_id)
        loss_mask = out["completion_mask"] * out["tool_mask"] if "tool_mask" in out else out["completion_mask"]
        out["num_items_in_batch"] = acc.reduce(loss_mask.sum().to(acc.device), reduction="sum")  # as TRL counts it
        metrics = trainer._metrics["train"]
        metrics["ictrl/dynamic_sampling_rounds"].append(float(extra_rounds))
        metrics["ictrl/informative_groups"].append(float(informative_total))
        metrics["ictrl/informative_groups_first_round"].append(
            float(acc.reduce(first[1].sum().float().to(acc.device), reduction="sum")))
        return out


def _group_rows(groups: Tensor, G: int) -> Tensor:
    """[n] group indices -> [n * G] row indices, each group's rows contiguous."""
    return (groups[:, None] * G + torch.arange(G, device=groups.device)).flatten()
