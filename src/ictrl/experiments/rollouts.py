"""The rollouts file of ``ictrl inspect`` (``--save-rollouts`` writes it, ``--rollouts`` reads it) and a rule applied
again to the statistics it holds.

JSONL, one object per response::

    {"prompt": str, "group": int, "tokens": [str, ...], "u": [float, ...], "entropy": [float, ...],
     "prob": [float, ...], "renyi2": [float, ...], "purity": [float, ...], "logprob": [float, ...],
     "selected": [bool, ...], "reward": float | null}

``tokens`` are the response tokens as decoded strings (response positions only, padding removed); ``u`` (the ICT
score), ``entropy`` (H1, nats), ``prob`` (the sampled token's probability) and the optional ``renyi2`` (H2),
``purity`` (β = Σp²) and ``logprob`` have one value per token; ``group`` (optional, default 0) is the prompt label;
``reward`` is optional. ``--selector X`` on such a file selects again from the statistics X reads (:func:`reselect`).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ictrl.errors import UserError
from ictrl.files import atomic_write_text, read_jsonl

# The file's key of each statistic a rule may read (SelectionInputs' field names), in the page's order.
FILE_KEYS = {"ict_score": "u", "entropy": "entropy", "renyi2": "renyi2", "purity": "purity", "logprob": "logprob",
             "prob": "prob"}
OPTIONAL = ("renyi2", "purity", "logprob")  # statistics a file written before ictrl saved them lacks


@dataclass
class Rollout:
    """One response: its tokens (decoded strings) and per-token u, H1, pi (and, where known, H2, β, log π) and
    selection, all of equal length. ``advantage`` is computed from the group's rewards (:func:`with_advantages`),
    never stored."""

    prompt: str
    tokens: list[str]
    u: list[float]
    entropy: list[float]
    prob: list[float]
    selected: list[bool]
    reward: float | None = None
    group: int = 0
    renyi2: list[float] | None = None
    purity: list[float] | None = None
    logprob: list[float] | None = None
    advantage: float | None = field(default=None, compare=False)
    where: str = field(default="rollout", repr=False, compare=False)  # names the source in error messages

    def __post_init__(self) -> None:
        w = self.where
        if not isinstance(self.prompt, str):
            raise ValueError(f"{w}: field 'prompt' must be a string")
        if not isinstance(self.tokens, list) or not all(isinstance(t, str) for t in self.tokens):
            raise ValueError(f"{w}: field 'tokens' must be a list of strings")
        n = len(self.tokens)
        numbers = [k for k in FILE_KEYS.values() if getattr(self, k) is not None]
        for name in (*numbers, "selected"):
            values = getattr(self, name)
            if not isinstance(values, list) or len(values) != n:
                raise ValueError(f"{w}: field {name!r} must be a list of {n} values (one per token)")
        for name in numbers:
            for i, v in enumerate(getattr(self, name)):
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                    raise ValueError(f"{w}: field {name!r}[{i}] must be a finite number, got {v!r}")
            setattr(self, name, [float(v) for v in getattr(self, name)])
        for i, v in enumerate(self.selected):
            if v not in (True, False, 0, 1):
                raise ValueError(f"{w}: field 'selected'[{i}] must be a bool or 0/1, got {v!r}")
        self.selected = [bool(v) for v in self.selected]
        if self.reward is not None:
            if (isinstance(self.reward, bool) or not isinstance(self.reward, (int, float))
                    or not math.isfinite(self.reward)):
                raise ValueError(f"{w}: field 'reward' must be a finite number or null, got {self.reward!r}")
            self.reward = float(self.reward)
        if isinstance(self.group, bool) or not isinstance(self.group, int):
            raise ValueError(f"{w}: field 'group' must be an integer, got {self.group!r}")

    def statistic(self, name: str) -> list[float] | None:
        """The per-token values of statistic ``name`` (a SelectionInputs field: ``ict_score``, ``entropy`` ...)."""
        return getattr(self, FILE_KEYS[name])

    def to_json(self) -> dict[str, Any]:
        """The JSON object of one line; the statistics at float32 precision (they are float32)."""
        import numpy as np

        d = asdict(self)
        for name in ("where", "advantage", *(k for k in OPTIONAL if d[k] is None)):
            del d[name]
        for name in FILE_KEYS.values():
            if name in d:
                d[name] = [float(str(np.float32(v))) for v in d[name]]  # shortest repr that round-trips float32
        return d


def save_rollouts(path: str | os.PathLike[str], rollouts: Sequence[Rollout]) -> Path:
    """Write rollouts as JSONL (schema in the module docstring), atomically."""
    lines = [json.dumps(r.to_json(), ensure_ascii=False) for r in rollouts]
    return atomic_write_text(path, "".join(line + "\n" for line in lines))


def load_rollouts(path: str | os.PathLike[str]) -> list[Rollout]:
    """Read a rollouts JSONL file; a bad line raises ValueError naming the file, line and field."""
    allowed = {"prompt", "tokens", *FILE_KEYS.values(), "selected", "reward", "group"}
    required = allowed - {"reward", "group", *OPTIONAL}
    out = []
    for where, obj in read_jsonl(path):
        missing = sorted(required - obj.keys())
        if missing:
            raise ValueError(f"{where}: missing field {missing[0]!r}")
        unknown = sorted(obj.keys() - allowed)
        if unknown:
            raise ValueError(f"{where}: unknown field {unknown[0]!r}")
        out.append(Rollout(**obj, where=where))
    if not out:
        raise ValueError(f"{path}: no rollouts in file")
    return out


def rollouts_from_tensors(
    prompts: Sequence[str],
    tokens: Sequence[Sequence[str]],
    mask: Any,
    u: Any,
    entropy: Any,
    prob: Any,
    selected: Any,
    rewards: Sequence[float] | None = None,
    group_ids: Sequence[int] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> list[Rollout]:
    """Build Rollouts from batch tensors in the shifted layout, keeping the masked-in positions of each row. The
    tensors are ``score_group``'s own (one step's statistics and selection, which ``select`` keeps inside the
    mask), so their shapes are taken as built.

    prompts: [B] prompt text per response; tokens: [B][T] decoded token strings (``token_strings``); mask, u,
    entropy, prob, selected: [B, T] tensors (or nested lists); rewards, group_ids: [B] or None; extra: the
    optional statistics (``renyi2``, ``purity``, ``logprob``) as [B, T] tensors.
    """
    import torch

    named = {"mask": mask, "u": u, "entropy": entropy, "prob": prob, "selected": selected, **(extra or {})}
    as_t = {n: torch.as_tensor(v).detach().cpu() for n, v in named.items() if v is not None}
    m = as_t["mask"].bool()
    out = []
    for i in range(m.shape[0]):
        keep = m[i].nonzero().flatten().tolist()
        values = {n: as_t[n][i, keep].double().tolist() for n in ("u", "entropy", "prob", *OPTIONAL) if n in as_t}
        out.append(Rollout(prompt=prompts[i], tokens=[tokens[i][j] for j in keep],
                           selected=as_t["selected"][i, keep].bool().tolist(),
                           reward=None if rewards is None else float(rewards[i]),
                           group=0 if group_ids is None else int(group_ids[i]), where=f"response {i}", **values))
    return out


def with_advantages(rollouts: Sequence[Rollout]) -> list[Rollout]:
    """``rollouts`` with ``advantage`` set where every response of its group has a reward: the group-normalised
    reward (r − mean) / (std + 1e-4), sample std, as TRL's GRPO (``scale_rewards='group'``)."""
    import dataclasses
    import statistics

    groups: dict[int, list[float | None]] = {}
    for r in rollouts:
        groups.setdefault(r.group, []).append(r.reward)
    out = []
    for r in rollouts:
        rewards = groups[r.group]
        if r.reward is None or None in rewards:
            out.append(r)
            continue
        known = [float(x) for x in rewards if x is not None]
        std = statistics.stdev(known) if len(known) > 1 else 0.0
        out.append(dataclasses.replace(r, advantage=(r.reward - statistics.fmean(known)) / (std + 1e-4)))
    return out


def reselect(rollouts: Sequence[Rollout], selector: Any, options: dict[str, Any], step: int,
             source: str) -> list[Rollout]:
    """``rollouts`` with ``selected`` replaced by ``selector``'s mask over the statistics they hold (its warm-up
    not applied: the page shows the rule's own choice at ``step``). A statistic the rule reads that ``source``
    lacks, or advantages without every reward, is one :class:`UserError` line naming it."""
    import dataclasses

    import torch

    from ictrl.core.selection import STAT_FIELDS, SelectionInputs

    reads = sorted(selector.needs & set(STAT_FIELDS))
    for name in reads:
        if any(r.statistic(name) is None for r in rollouts):
            raise UserError(f"--selector {selector.name}: it reads {name} ({FILE_KEYS[name]!r}), which {source} "
                            "does not hold; score the prompt again with --model ... --save-rollouts")
    advantages = None
    if "advantages" in selector.needs:
        if any(r.advantage is None for r in rollouts):
            raise UserError(f"--selector {selector.name}: it reads advantages, which need every response's reward: "
                            "give --answer to grade them")
        advantages = torch.tensor([r.advantage for r in rollouts], dtype=torch.float32)
    width = max(len(r.tokens) for r in rollouts)
    mask = torch.tensor([[t < len(r.tokens) for t in range(width)] for r in rollouts], dtype=torch.bool)

    def padded(name: str) -> torch.Tensor:
        return torch.tensor([r.statistic(name) + [0.0] * (width - len(r.tokens)) for r in rollouts],
                            dtype=torch.float32)

    groups = torch.tensor([r.group for r in rollouts], dtype=torch.long)
    inputs = SelectionInputs(mask=mask, step=step, advantages=advantages, group_ids=groups,
                             **{name: padded(name) for name in reads})
    chosen = selector(inputs, warmup_steps=0, **options).tolist()
    return [dataclasses.replace(r, selected=chosen[i][: len(r.tokens)]) for i, r in enumerate(rollouts)]
