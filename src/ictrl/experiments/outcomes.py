"""Label a training run "collapsed", "exploded" or "stable" from its logged curves (issue #7).

The thresholds below were fixed before any sweep result was seen, from the numbers in environment.md:

- The noisy tiny base samples at ~0.30 nats/token. The one run that learned (15% -> 29% sampled pass@1) ended at
  0.08 nats/token, so a healthy run may sharpen to well under half the base entropy. ``entropy_floor = 0.05``
  sits below that healthy end point, at 1/6 of the base: a run under it has (nearly) stopped exploring. Low entropy
  alone is not a failure, so *collapsed* also requires that reward did not improve by more than
  ``min_reward_gain`` (0.02 = 2 points of mean reward) between the first and the last window.
- The failed runs (lr 5e-4, 1e-3) fell to near-zero reward with *rising* entropy. *Exploded* = the last-window
  entropy exceeds ``max(explode_ratio * first-window entropy, explode_min)`` (2x the start, and at least
  0.5 nats so that a near-deterministic start cannot "explode" by drifting from 0.01 to 0.03) AND the last-window
  reward is below the base reward minus ``reward_drop`` (0.05).
- *Stable* = neither. A run whose reward fell without an entropy excursion is still "stable" here: the study is
  about entropy stability; its reward shows in the results table.

Every quantity is a window mean over ``window`` logged steps (first / last), which smooths the per-step noise of
small batches (one step of 32 prompts x 8 samples moves the mean reward by several points). When a curve has fewer
than ``2 * window`` points the window shrinks to half the curve (at least one point), so the two windows never
overlap unless the curve has a single point.

Comparisons are strict: entropy exactly at the floor is not collapsed, exactly at the ceiling is not exploded,
a gain of exactly ``min_reward_gain`` counts as "did not improve by more than".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

LABELS = ("collapsed", "exploded", "stable")


@dataclass(frozen=True)
class OutcomeThresholds:
    """Fixed thresholds for ``label_run`` (module docstring gives the reasoning). Entropies in nats/token."""

    window: int = field(default=10, metadata={"help": "logged steps averaged at the start and at the end"})
    entropy_floor: float = field(default=0.05, metadata={"help": "collapsed if last-window H1 is below this"})
    min_reward_gain: float = field(
        default=0.02, metadata={"help": "collapsed only if reward gained at most this from first to last window"}
    )
    explode_ratio: float = field(default=2.0, metadata={"help": "exploded if last H1 > this x first-window H1"})
    explode_min: float = field(default=0.5, metadata={"help": "the explosion ceiling is never below this (nats)"})
    reward_drop: float = field(default=0.05, metadata={"help": "exploded only if last reward < base_reward - this"})
    entropy_key: str = field(default="ictrl/h1/all", metadata={"help": "metrics key of the mean token entropy"})
    reward_key: str = field(default="reward", metadata={"help": "metrics key of the mean reward"})

    def __post_init__(self) -> None:
        if not isinstance(self.window, int) or self.window < 1:
            raise ValueError(f"window must be a positive integer, got {self.window!r}")
        for name in ("entropy_floor", "min_reward_gain", "explode_min", "reward_drop"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if not math.isfinite(self.explode_ratio) or self.explode_ratio <= 1:
            raise ValueError(f"explode_ratio must be a finite number > 1, got {self.explode_ratio!r}")


@dataclass(frozen=True)
class RunSummary:
    """Window means behind a label: what a report prints next to it."""

    label: str
    entropy_first: float
    entropy_last: float
    reward_first: float
    reward_last: float
    base_reward: float
    entropy_ceiling: float
    window: int  # the window actually used (may be shorter than thresholds.window)
    num_points: int  # logged steps that carry both keys


def _series(records: Sequence[Mapping[str, Any]], thresholds: OutcomeThresholds) -> tuple[list[float], list[float]]:
    """(entropy, reward) over the records that carry both keys, in step order; None / missing keys are skipped."""
    points = []
    for i, rec in enumerate(records):
        if not isinstance(rec, Mapping):
            raise ValueError(f"records[{i}] must be a mapping, got {type(rec).__name__}")
        h, r = rec.get(thresholds.entropy_key), rec.get(thresholds.reward_key)
        if h is None or r is None:
            continue
        for key, value in ((thresholds.entropy_key, h), (thresholds.reward_key, r)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"records[{i}][{key!r}] must be a finite number, got {value!r}")
        points.append((rec.get("step", i), float(h), float(r)))
    points.sort(key=lambda p: p[0])  # stable: records without a step keep their order
    return [p[1] for p in points], [p[2] for p in points]


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values)


def summarize_run(
    records: Sequence[Mapping[str, Any]],
    base_reward: float | None = None,
    thresholds: OutcomeThresholds | None = None,
) -> RunSummary:
    """Window means and the outcome label of one run.

    records: metrics.jsonl records (dicts with ``thresholds.entropy_key`` and ``thresholds.reward_key``; others
    ignored; ordered by ``"step"`` when present). base_reward: the base model's mean reward; None uses the
    first-window reward.
    """
    t = thresholds if thresholds is not None else OutcomeThresholds()
    entropy, reward = _series(records, t)
    if not entropy:
        raise ValueError(f"records: no record carries both {t.entropy_key!r} and {t.reward_key!r}")
    k = max(1, min(t.window, len(entropy) // 2))
    h0, h1 = _mean(entropy[:k]), _mean(entropy[-k:])
    r0, r1 = _mean(reward[:k]), _mean(reward[-k:])
    if base_reward is None:
        base_reward = r0
    elif not math.isfinite(base_reward):
        raise ValueError(f"base_reward must be finite, got {base_reward!r}")
    ceiling = max(t.explode_ratio * h0, t.explode_min)
    if h1 < t.entropy_floor and r1 - r0 <= t.min_reward_gain:
        label = "collapsed"
    elif h1 > ceiling and r1 < base_reward - t.reward_drop:
        label = "exploded"
    else:
        label = "stable"
    return RunSummary(label, h0, h1, r0, r1, float(base_reward), ceiling, k, len(entropy))


def label_run(
    records: Sequence[Mapping[str, Any]],
    base_reward: float | None = None,
    thresholds: OutcomeThresholds | None = None,
) -> str:
    """"collapsed" | "exploded" | "stable" for one run's metrics records (see ``summarize_run``)."""
    return summarize_run(records, base_reward, thresholds).label


def stable_fraction(labels: Sequence[str]) -> float:
    """Fraction of ``labels`` equal to "stable" (labels of the seeds of one method x lr cell)."""
    if not labels:
        raise ValueError("labels must not be empty")
    bad = [x for x in labels if x not in LABELS]
    if bad:
        raise ValueError(f"labels: unknown label {bad[0]!r}; expected one of {LABELS}")
    return sum(x == "stable" for x in labels) / len(labels)


def widest_stable_range(
    labels_by_lr: Mapping[float, str | Sequence[str]], min_stable_fraction: float = 1.0
) -> tuple[float, float] | None:
    """The widest contiguous run of learning rates (in sorted order) that count as stable.

    labels_by_lr: lr -> one label, or the labels of its seeds. An lr counts as stable when its stable fraction is
    >= ``min_stable_fraction`` (default: every seed stable). Width is measured as hi / lo (lr grids are geometric);
    ties go to the run with more grid points, then to the lower lr. Returns (lo, hi), (lr, lr) for a single stable
    point, or None when no lr is stable.
    """
    if not 0 < min_stable_fraction <= 1:
        raise ValueError(f"min_stable_fraction must be in (0, 1], got {min_stable_fraction!r}")
    ok: list[tuple[float, bool]] = []
    for lr, labels in labels_by_lr.items():
        if not math.isfinite(lr) or lr <= 0:
            raise ValueError(f"labels_by_lr: learning rate must be finite and > 0, got {lr!r}")
        seq = [labels] if isinstance(labels, str) else list(labels)
        ok.append((float(lr), stable_fraction(seq) >= min_stable_fraction))
    ok.sort()
    # (log width, points, -lo) is maximised: widest, then most points, then lowest lr.
    best: tuple[tuple[float, int, float], float, float] | None = None
    start = None
    for i, (_, good) in enumerate(ok + [(math.inf, False)]):
        if good and start is None:
            start = i
        elif not good and start is not None:
            lo, hi = ok[start][0], ok[i - 1][0]
            key = (math.log(hi / lo), i - start, -lo)
            if best is None or key > best[0]:
                best = (key, lo, hi)
            start = None
    return None if best is None else (best[1], best[2])
