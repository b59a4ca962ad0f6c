"""Label a training run "collapsed", "exploded", "degraded" or "stable" from its logged curves.

Two rule sets, kept side by side (``OutcomeThresholds.v1()`` / ``.v2()``; the default is v2):

**v1** was fixed before the first sweep ran, from the numbers measured on the embedded task before then (a noisy tiny base sampling at
~0.30 nats/token; the one run that learned ended at 0.08; the failed runs at lr 5e-4 / 1e-3 fell to near-zero reward
with rising entropy). collapsed = last-window H1 < ``entropy_floor`` (0.05 nats, absolute) and reward gained at most
``min_reward_gain`` (0.02); exploded = last-window H1 > ``max(explode_ratio x first-window H1, explode_min)``
(2x, at least 0.5 nats) and last-window reward < base reward - ``reward_drop`` (0.05); stable = neither.
**v1 proved uninformative**: the first sweep's base model samples at ~0.15 nats/token, so the absolute 0.5-nat
explosion floor was out of reach, and runs whose reward fell to ~0 without an entropy excursion counted as stable.
All 75 runs of that sweep (seeds 0-2) were labelled stable.

**v2** was set *after seeing sweep 1 (seeds 0-2)*, by the lead, and is applied to fresh seeds (3-5) it was not
tuned on. Its thresholds are relative to the run's own first window, plus a fourth label:

- collapsed: last-window H1 < ``collapse_ratio`` (0.33) x first-window H1 AND reward gain (last - first window)
  <= ``min_reward_gain`` (0.02);
- exploded: last-window H1 > ``explode_ratio`` (1.25) x first-window H1 AND last-window reward < base reward -
  ``reward_drop`` (0.05);
- degraded: last-window reward < base reward - ``reward_drop`` and neither of the above (reward lost without an
  entropy excursion);
- stable: none of these. Only "stable" counts towards a stable fraction.

Under both presets a run that would be stable but never logged a positive reward (every step's mean reward 0: no
group had a correct completion, so there was nothing to learn from) is "unrewarded" instead: nothing was tested.

The checks go collapsed, exploded, degraded, unrewarded, stable. Under either preset collapsed and exploded cannot hold
together (the collapse floor lies below the first-window entropy or the 0.5-nat minimum ceiling, the explosion
ceiling above it), so the order only matters for degraded, the fallback of a reward drop. In general the collapse floor is
``max(entropy_floor, collapse_ratio x first-window H1)`` and the explosion ceiling
``max(explode_ratio x first-window H1, explode_min)``; v1 sets ``collapse_ratio = 0`` (absolute floor only) and v2
``entropy_floor = explode_min = 0`` (relative bounds only).

Every quantity is a window mean over ``window`` logged steps (first / last), which smooths the per-step noise of
small batches (one step of 32 prompts x 8 samples moves the mean reward by several points). When a curve has fewer
than ``2 * window`` points the window shrinks to half the curve (at least one point), so the two windows never
overlap unless the curve has a single point.

Comparisons are strict: entropy exactly at the floor is not collapsed, exactly at the ceiling is not exploded,
reward exactly at base - reward_drop is not a drop, and a gain of exactly ``min_reward_gain`` counts as "did not
improve by more than".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ictrl.errors import UserError

LABELS = ("collapsed", "exploded", "degraded", "unrewarded", "stable")


@dataclass(frozen=True)
class OutcomeThresholds:
    """Thresholds for ``label_run`` (module docstring gives the reasoning). Entropies in nats/token.

    The defaults are the v2 rules; ``OutcomeThresholds.v1()`` gives the rules fixed before the first sweep.
    """

    version: str = field(default="v2", metadata={"help": "name of the rule set, stored with every labelled sweep"})
    window: int = field(default=10, metadata={"help": "logged steps averaged at the start and at the end"})
    entropy_floor: float = field(default=0.0, metadata={"help": "collapsed if last-window H1 is below this (nats)"})
    collapse_ratio: float = field(
        default=0.33, metadata={"help": "collapsed if last-window H1 < this x first-window H1 (0: absolute floor only)"}
    )
    min_reward_gain: float = field(
        default=0.02, metadata={"help": "collapsed only if reward gained at most this from first to last window"}
    )
    explode_ratio: float = field(default=1.25, metadata={"help": "exploded if last H1 > this x first-window H1"})
    explode_min: float = field(default=0.0, metadata={"help": "the explosion ceiling is never below this (nats)"})
    reward_drop: float = field(
        default=0.05, metadata={"help": "exploded / degraded only if last reward < base_reward - this"}
    )
    degraded: bool = field(
        default=True, metadata={"help": "label a reward drop without an entropy excursion 'degraded' (v1: stable)"}
    )
    entropy_key: str = field(default="ictrl/h1/all", metadata={"help": "metrics key of the mean token entropy"})
    reward_key: str = field(default="reward", metadata={"help": "metrics key of the mean reward"})

    def __post_init__(self) -> None:
        if not isinstance(self.version, str) or not self.version:
            raise ValueError(f"version must be a non-empty string, got {self.version!r}")
        if not isinstance(self.window, int) or self.window < 1:
            raise ValueError(f"window must be a positive integer, got {self.window!r}")
        for name in ("entropy_floor", "min_reward_gain", "explode_min", "reward_drop"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if not math.isfinite(self.collapse_ratio) or not 0 <= self.collapse_ratio < 1:
            raise ValueError(f"collapse_ratio must be a finite number in [0, 1), got {self.collapse_ratio!r}")
        if not math.isfinite(self.explode_ratio) or self.explode_ratio <= 1:
            raise ValueError(f"explode_ratio must be a finite number > 1, got {self.explode_ratio!r}")
        if self.entropy_floor == 0 and self.collapse_ratio == 0:
            raise ValueError("entropy_floor and collapse_ratio are both 0: nothing could ever be collapsed")

    @classmethod
    def v1(cls) -> OutcomeThresholds:
        """The rules fixed before the first sweep: absolute entropy floor, 2x / 0.5-nat ceiling, three labels."""
        return cls(version="v1", entropy_floor=0.05, collapse_ratio=0.0, explode_ratio=2.0, explode_min=0.5,
                   degraded=False)

    @classmethod
    def v2(cls) -> OutcomeThresholds:
        """The rules set after sweep 1 (seeds 0-2): entropy bounds relative to the start, plus "degraded"."""
        return cls()

    @classmethod
    def preset(cls, name: str) -> OutcomeThresholds:
        """``"v1"`` or ``"v2"``."""
        if name not in PRESETS:
            raise UserError(f"thresholds: unknown preset {name!r}; expected one of {sorted(PRESETS)}")
        return getattr(cls, name)()

    @property
    def labels(self) -> tuple[str, ...]:
        """The labels these rules can give."""
        return LABELS if self.degraded else tuple(x for x in LABELS if x != "degraded")


PRESETS = ("v1", "v2")


def _bound(absolute: float, ratio: float, edge: str) -> str:
    """"below 0.05 nats" / "below 0.33 x its first-window H1" / "above max(2 x first-window H1, 0.5 nats)"."""
    rel = f"{ratio:g} x its first-window H1" if ratio else ""
    if absolute and rel:
        return f"{edge} the larger of {rel} and {absolute:g} nats"
    return f"{edge} {rel or f'{absolute:g} nats'}"


def describe_thresholds(t: OutcomeThresholds) -> list[str]:
    """The rules of ``t`` in words, one sentence per label, for a report a person reads (no dict dump)."""
    w = f"mean over the first / last {t.window} logged steps"
    lines = [
        f"Collapsed: the last-window entropy H1 ({w}) is {_bound(t.entropy_floor, t.collapse_ratio, 'below')}, and "
        f"the reward rose by at most {t.min_reward_gain:g} from the first window.",
        f"Exploded: H1 ends {_bound(t.explode_min, t.explode_ratio, 'above')}, and the last-window reward is more "
        f"than {t.reward_drop:g} below the base model's reward.",
    ]
    if t.degraded:
        lines.append(f"Degraded: the last-window reward is more than {t.reward_drop:g} below the base model's, "
                     "without either entropy excursion.")
    lines.append("Unrewarded: no logged step had a positive mean reward (nothing to learn from, nothing tested).")
    lines.append("Stable: none of these" + (" (only stable counts towards the stable fraction)." if t.degraded
                                             else "."))
    return lines


@dataclass(frozen=True)
class RunSummary:
    """Window means behind a label: what a report prints next to it."""

    label: str
    entropy_first: float
    entropy_last: float
    reward_first: float
    reward_last: float
    base_reward: float
    entropy_floor: float  # the collapse floor used: max(entropy_floor, collapse_ratio x entropy_first)
    entropy_ceiling: float  # the explosion ceiling used: max(explode_ratio x entropy_first, explode_min)
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
    first-window reward. thresholds: None = ``OutcomeThresholds()`` (v2).
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
    floor = max(t.entropy_floor, t.collapse_ratio * h0)
    ceiling = max(t.explode_ratio * h0, t.explode_min)
    reward_lost = r1 < base_reward - t.reward_drop
    if h1 < floor and r1 - r0 <= t.min_reward_gain:
        label = "collapsed"
    elif h1 > ceiling and reward_lost:
        label = "exploded"
    elif reward_lost and t.degraded:
        label = "degraded"
    elif max(reward) <= 0:
        label = "unrewarded"
    else:
        label = "stable"
    return RunSummary(label, h0, h1, r0, r1, float(base_reward), floor, ceiling, k, len(entropy))


def label_run(
    records: Sequence[Mapping[str, Any]],
    base_reward: float | None = None,
    thresholds: OutcomeThresholds | None = None,
) -> str:
    """"collapsed" | "exploded" | "degraded" | "stable" for one run's metrics records (see ``summarize_run``)."""
    return summarize_run(records, base_reward, thresholds).label


def stable_fraction(labels: Sequence[str]) -> float:
    """Fraction of ``labels`` equal to "stable" (labels of the seeds of one method x lr cell); "degraded" is not."""
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
