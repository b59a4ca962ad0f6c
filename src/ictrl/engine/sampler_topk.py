"""The sampler's top-K log-probs per position, recorded during generation (transformers ``generate`` or vLLM)
for the ICT score (docs/architecture.md, "Module notes")."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor
from transformers import LogitsProcessor, LogitsProcessorList

from ictrl.engine.stats_pass import StepContext
from ictrl.engine.stats_paths import Separate

TopKRows = list[tuple[Tensor, Tensor]]  # per completion row: ([T_i, K] log-probs, [T_i, K] ids)


class TopKRecorder(LogitsProcessor):
    """Records each step's top-``k`` log-probs of softmax(scores / ``temperature``); leaves the scores unchanged."""

    def __init__(self, k: int, temperature: float) -> None:
        self.k, self.temperature = k, temperature
        self.logprobs: list[Tensor] = []
        self.ids: list[Tensor] = []

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        lp = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        values, ids = lp.topk(min(self.k, lp.size(-1)), dim=-1)  # [B, K], descending
        self.logprobs.append(values)
        self.ids.append(ids)
        return scores

    def rows(self) -> TopKRows:
        """Per generated row: ([steps, K], [steps, K]) over every step of the call (padding steps included)."""
        if not self.logprobs:
            return []
        lp, ids = torch.stack(self.logprobs, dim=1), torch.stack(self.ids, dim=1)  # [B, steps, K]
        return [(lp[i], ids[i]) for i in range(lp.size(0))]


@contextmanager
def recording_generate(model: Any, recorder: TopKRecorder) -> Iterator[None]:
    """Within the block, ``model.generate`` also runs ``recorder`` (after any logits processors passed to it)."""
    original = model.generate
    shadowed = "generate" in vars(model)  # an instance attribute set before the block: put it back after

    def generate(*args: Any, **kwargs: Any) -> Any:
        processors = LogitsProcessorList(kwargs.pop("logits_processor", None) or [])
        processors.append(recorder)
        return original(*args, logits_processor=processors, **kwargs)

    model.generate = generate  # an instance attribute shadows the class method for this block only
    try:
        yield
    finally:
        if shadowed:
            model.generate = original
        else:
            del model.generate


def split_vllm_logprobs(logprobs: list[list[list[float | None]]], token_ids: list[list[list[int]]],
                        completion_ids: list[list[int]], k: int) -> tuple[list[list[list[float | None]]], TopKRows]:
    """Split vLLM's per-position entries into TRL's sampled-token log-probs and the top-K rows.

    Args:
        logprobs, token_ids: per sequence, per position, vLLM's entries sorted by rank (None = not scored).
        completion_ids: per sequence, the sampled tokens.
        k: the K requested.

    Returns:
        (sampled, rows): ``sampled[i][t] == [log-prob of completion_ids[i][t]]`` (None if vLLM did not report it), the
        shape TRL's ``_generate_single_turn`` reads entry 0 of; ``rows[i]`` the ([T_i, K], [T_i, K]) top-K, with
        unreported (None) values as -inf (probability 0).
    """
    sampled, rows = [], []
    for seq_lp, seq_ids, tokens in zip(logprobs, token_ids, completion_ids, strict=True):
        if len(seq_lp) != len(tokens):
            raise RuntimeError(f"vLLM returned log-probs for {len(seq_lp)} positions of a {len(tokens)}-token "
                               "completion")
        picked = []
        for lps, ids, tok in zip(seq_lp, seq_ids, tokens):
            picked.append([next((lp for lp, i in zip(lps, ids) if i == tok), None)])
        sampled.append(picked)
        width = min(k, min((len(x) for x in seq_ids), default=k))
        lp = torch.tensor([[-torch.inf if v is None else v for v in x[:width]] for x in seq_lp],
                          dtype=torch.float32).view(len(tokens), width)
        ids = torch.tensor([x[:width] for x in seq_ids], dtype=torch.long).view(len(tokens), width)
        rows.append((lp, ids))
    return sampled, rows


def pad_rows(rows: TopKRows, T: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """[B, T, K] log-probs and ids from per-row tensors (truncated or zero-padded to T positions)."""
    K = min(r[0].size(1) for r in rows)
    lp = torch.zeros(len(rows), T, K, dtype=torch.float32)
    ids = torch.zeros(len(rows), T, K, dtype=torch.long)
    for i, (r_lp, r_ids) in enumerate(rows):
        n = min(T, r_lp.size(0))
        lp[i, :n] = r_lp[:n, :K].float().cpu()
        ids[i, :n] = r_ids[:n, :K].cpu()
    return lp.to(device), ids.to(device)


def recorded_topk(rows: TopKRows | None, calls: int, K: int | None, source: str, like: Tensor
                  ) -> tuple[Tensor, Tensor] | None:
    """[B, T, K] top-K log-probs and ids (on ``like``'s device, ``like`` a [B, T] tensor of the batch) the sampler
    recorded over ``calls`` generation calls, or None (the
    statistics pass's head scores instead). ``source`` ``auto`` falls back to the head when a subclass's generation
    bypassed the hook (the caller logs which source ran); ``sampler`` makes that an error."""
    (B, T), device = like.shape, like.device
    recorded = rows is not None and len(rows) == B and calls == 1
    if K is None or not (recorded or source == "sampler"):
        return None
    if not recorded:
        raise RuntimeError(f"selection_topk_source: the sampler's top-K log-probs cover "
                           f"{0 if rows is None else len(rows)} rows in {calls} generation calls, expected {B} "
                           "rows in one call")
    return pad_rows(rows, T, device)


class SamplerTopK(Separate):
    """The separate statistics pass whose ICT score reads the top-``K`` log-probs the sampler recorded
    (``selection_topk_source`` ``auto`` or ``sampler``), kept here from the generation call that recorded them;
    ``source`` ``auto`` scores from the LM head when the sampler recorded no single call of the batch's rows."""

    def __init__(self, K: int, source: str) -> None:
        self.K, self.source = K, source
        self.calls, self.rows = 0, None

    def generating(self, step: StepContext) -> None:
        self.calls, self.rows = 0, None

    def rollout_started(self) -> None:
        self.calls += 1

    def rollout_recorded(self, rows: Any) -> None:
        self.rows = rows

    def sampler_topk(self, batch: dict[str, Any], step: StepContext) -> tuple[Tensor, Tensor] | None:
        if not step.need_js:
            return None
        return recorded_topk(self.rows, self.calls, self.K, self.source, batch["completion_mask"])
