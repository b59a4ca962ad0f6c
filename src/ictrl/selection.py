"""Token selectors: which response tokens carry the policy gradient (method.md §3, §4).

A small registry in the style of verl: ``SELECTORS`` maps a name to a ``Selector``; ``select(name, inputs,
**options)`` returns a ``[B, T]`` bool tensor that is always a subset of ``inputs.mask``.

Registered selectors (defaults in brackets):

- ``all``: the response mask (GRPO).
- ``ict(ratio=0.1, scope="response", warmup_steps=0)``: the top-k positions by ``ict_score`` within each scope
  unit (``response``: one row; ``group``: all rows with the same ``group_ids`` value, adjacent or not; ``batch``:
  the whole batch). While ``step < warmup_steps`` it returns the whole mask (the first Θ optimizer steps update
  every token).
- ``entropy(ratio=0.2, scope="batch")``: the top-k positions by ``entropy`` (20-Entropy). ``batch`` uses one
  cut-off for the batch, as in the 80/20 paper; ``response`` ranks within each row.
- ``stapo(tau_p=0.002, q=0.75)``: returns the *kept* mask = mask minus the silenced tokens. Candidates are the
  active tokens with ``advantages[b] > 0`` and ``prob < tau_p``; of the ``n`` candidates in the batch the
  ``ceil(q * n)`` with the lowest entropy are silenced ("bottom q" = rank < ceil(q·n) in ascending entropy, ties
  broken by the rule below, so exactly that many are silenced).
- ``random(ratio=0.1, scope="response", seed=0)``: as many positions per unit as ``ict`` would pick, uniformly at
  random. The draw comes from a CPU ``torch.Generator`` seeded from ``(seed, inputs.step)``: reproducible across
  devices and runs, different across steps, independent of the global RNG.
- ``frequent(ratio=0.1, scope="response", warmup_steps=0)``: the mask minus ``ict``'s selection (the whole mask
  during warm-up).

Counting and ties, shared by every ratio-based selector:

- A unit with ``n`` active tokens gets ``k = ceil(ratio * n)`` of them, so ``n >= 1`` gives ``k >= 1``. The product
  is shrunk by a relative 1e-12 before the ceiling because binary floats overshoot exact integers
  (``0.07 * 100 == 7.000000000000001``), which would otherwise add a token.
- Among equal scores the earlier position wins: lower flat index ``b * T + t``. Ranking is one stable descending
  sort of the active positions (taken in flat-index order) on the score, which keeps the lower index first among
  ties, then one sort on the unique key (unit, score rank); no Python loop over positions or units.

``Selector.needs`` lists the ``SelectionInputs`` fields a selector always reads; ``scope="group"`` additionally
reads ``group_ids``. A missing field, an unknown option, or a bad option value raises ``ValueError`` naming it.
"""

from __future__ import annotations

import hashlib
import inspect
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor

from ictrl.checks import as_bool_mask

_FIELDS = ("ict_score", "entropy", "prob", "advantages", "group_ids")
SCOPES = ("response", "group", "batch")


@dataclass
class SelectionInputs:
    """Everything a selector may read. ``mask`` is required; the rest are optional per selector.

    mask [B, T] bool (0/1 accepted, converted); ict_score, entropy, prob [B, T]; advantages [B];
    group_ids [B] integer prompt labels; step: the optimizer step (warm-up and the random draw).
    """

    mask: Tensor
    step: int = 0
    ict_score: Tensor | None = None
    entropy: Tensor | None = None
    prob: Tensor | None = None
    advantages: Tensor | None = None
    group_ids: Tensor | None = None

    def __post_init__(self) -> None:
        self.mask = as_bool_mask(self.mask, "mask")
        if self.mask.dim() != 2:
            raise ValueError(f"mask must be [B, T], got shape {tuple(self.mask.shape)}")
        if isinstance(self.step, bool) or not isinstance(self.step, int) or self.step < 0:
            raise ValueError(f"step must be an int >= 0, got {self.step!r}")
        B = self.mask.shape[0]
        for name in ("ict_score", "entropy", "prob"):
            value = getattr(self, name)
            if value is not None and tuple(value.shape) != tuple(self.mask.shape):
                raise ValueError(f"{name} must have the mask's shape {tuple(self.mask.shape)}, got {tuple(value.shape)}")
            if value is not None and bool(torch.isnan(value[self.mask]).any()):
                raise ValueError(f"{name} holds NaN at active positions")
        for name in ("advantages", "group_ids"):
            value = getattr(self, name)
            if value is not None and tuple(value.shape) != (B,):
                raise ValueError(f"{name} must be [B] = ({B},), got shape {tuple(value.shape)}")
        if self.group_ids is not None and (self.group_ids.is_floating_point() or self.group_ids.dtype == torch.bool):
            raise ValueError(f"group_ids must be an integer tensor, got {self.group_ids.dtype}")


@dataclass(frozen=True)
class Selector:
    """A registered selection rule: ``fn(inputs, **options) -> [B, T] bool``.

    ``defaults`` are the option names and defaults read from ``fn``'s keyword-only parameters.
    """

    name: str
    fn: Callable[..., Tensor]
    needs: frozenset[str]
    defaults: dict[str, Any]

    def __call__(self, inputs: SelectionInputs, **options: Any) -> Tensor:
        unknown = sorted(set(options) - set(self.defaults))
        if unknown:
            raise ValueError(
                f"unknown option(s) {unknown} for selector {self.name!r}; it accepts {sorted(self.defaults)}"
            )
        for field in sorted(self.needs):
            if getattr(inputs, field) is None:
                raise ValueError(f"selector {self.name!r} needs SelectionInputs.{field}, which is None")
        return self.fn(inputs, **options) & inputs.mask


SELECTORS: dict[str, Selector] = {}


def register_selector(name: str, needs: tuple[str, ...] = ()) -> Callable[[Callable[..., Tensor]], Callable[..., Tensor]]:
    """Decorator registering ``fn(inputs, *, option=default, ...)`` under ``name``."""
    bad = sorted(set(needs) - set(_FIELDS))
    if bad:
        raise ValueError(f"needs holds unknown field(s) {bad}; valid: {list(_FIELDS)}")

    def decorator(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
        if name in SELECTORS:
            raise ValueError(f"selector {name!r} is already registered")
        params = inspect.signature(fn).parameters.values()
        defaults = {p.name: p.default for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}
        SELECTORS[name] = Selector(name, fn, frozenset(needs), defaults)
        return fn

    return decorator


def get_selector(name: str) -> Selector:
    if name not in SELECTORS:
        raise ValueError(f"unknown selector {name!r}; registered: {sorted(SELECTORS)}")
    return SELECTORS[name]


def select(name: str, inputs: SelectionInputs, **options: Any) -> Tensor:
    """Apply selector ``name``: returns a [B, T] bool tensor, a subset of ``inputs.mask``."""
    return get_selector(name)(inputs, **options)


# ---------------------------------------------------------------------------------------------- helpers


def _check_ratio(value: Any, name: str = "ratio") -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < float(value) <= 1.0:
        raise ValueError(f"{name} must be a number in (0, 1], got {value!r}")
    return float(value)


def _check_scope(scope: Any, allowed: tuple[str, ...]) -> str:
    if scope not in allowed:
        raise ValueError(f"scope must be one of {list(allowed)}, got {scope!r}")
    return scope


def _check_nonneg_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    return value


def _units(inputs: SelectionInputs, scope: str) -> Tensor:
    """[B, T] long unit id of every position: its row, its group (0..G-1), or 0 for the batch."""
    B, T = inputs.mask.shape
    device = inputs.mask.device
    if scope == "response":
        row_unit = torch.arange(B, device=device)
    elif scope == "group":
        if inputs.group_ids is None:
            raise ValueError("scope='group' needs SelectionInputs.group_ids, which is None")
        row_unit = torch.unique(inputs.group_ids.to(device), return_inverse=True)[1]
    else:
        row_unit = torch.zeros(B, dtype=torch.long, device=device)
    return row_unit[:, None].expand(B, T)


def _ceil_count(ratio: float, n: Tensor) -> Tensor:
    """k = ceil(ratio * n) for integer counts n, immune to float overshoot; k >= 1 wherever n >= 1."""
    k = torch.ceil(n.double() * ratio * (1.0 - 1e-12)).long()
    return torch.minimum(k.clamp(min=1), n) * (n > 0)


def _top_k_per_unit(score: Tensor, mask: Tensor, units: Tensor, ratio: float) -> Tensor:
    """[B, T] bool: in each unit, the ceil(ratio * n_active) active positions with the highest score.

    Ties go to the lower flat index. Vectorised: sort the active positions by (unit, -score, index).
    """
    flat_mask = mask.reshape(-1)
    idx = flat_mask.nonzero(as_tuple=True)[0]  # ascending flat index
    out = torch.zeros_like(flat_mask)
    if idx.numel() == 0:
        return out.view_as(mask)
    s = score.reshape(-1)[idx]
    u = units.reshape(-1)[idx]
    n = idx.numel()
    by_score = torch.sort(s, descending=True, stable=True).indices  # ties keep the lower index first
    n_units = int(u.max()) + 1
    if n_units == 1:
        order = by_score
    else:
        # Group by unit, keeping score order, with one sort of unique keys unit * n + score_rank. The key is
        # float64 (exact below 2**53) because CPU torch sorts int64 about 3x slower than float64.
        score_rank = torch.empty_like(by_score)
        score_rank[by_score] = torch.arange(n, device=idx.device)
        order = torch.sort(u.double() * n + score_rank.double()).indices
    u_sorted = u[order]
    counts = torch.bincount(u, minlength=n_units)
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.arange(n, device=idx.device) - starts[u_sorted]
    keep = rank < _ceil_count(ratio, counts)[u_sorted]
    out[idx[order[keep]]] = True
    return out.view_as(mask)


def _step_seed(seed: int, step: int) -> int:
    """A 63-bit seed derived from (seed, step) with a fixed hash: no collisions like seed*N + step."""
    digest = hashlib.blake2b(f"{seed}:{step}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


# --------------------------------------------------------------------------------------------- selectors


@register_selector("all")
def _select_all(inputs: SelectionInputs) -> Tensor:
    return inputs.mask.clone()


@register_selector("ict", needs=("ict_score",))
def _select_ict(
    inputs: SelectionInputs, *, ratio: float = 0.1, scope: str = "response", warmup_steps: int = 0
) -> Tensor:
    ratio = _check_ratio(ratio)
    scope = _check_scope(scope, SCOPES)
    if inputs.step < _check_nonneg_int(warmup_steps, "warmup_steps"):
        return inputs.mask.clone()
    assert inputs.ict_score is not None
    return _top_k_per_unit(inputs.ict_score, inputs.mask, _units(inputs, scope), ratio)


@register_selector("entropy", needs=("entropy",))
def _select_entropy(inputs: SelectionInputs, *, ratio: float = 0.2, scope: str = "batch") -> Tensor:
    ratio = _check_ratio(ratio)
    scope = _check_scope(scope, ("batch", "response"))
    assert inputs.entropy is not None
    return _top_k_per_unit(inputs.entropy, inputs.mask, _units(inputs, scope), ratio)


@register_selector("stapo", needs=("entropy", "prob", "advantages"))
def _select_stapo(inputs: SelectionInputs, *, tau_p: float = 0.002, q: float = 0.75) -> Tensor:
    if isinstance(tau_p, bool) or not isinstance(tau_p, (int, float)) or not 0.0 < float(tau_p) <= 1.0:
        raise ValueError(f"tau_p must be a probability in (0, 1], got {tau_p!r}")
    q = _check_ratio(q, "q")
    assert inputs.entropy is not None and inputs.prob is not None and inputs.advantages is not None
    positive = (inputs.advantages > 0).to(inputs.mask.device)[:, None]
    candidates = inputs.mask & positive & (inputs.prob < tau_p)
    # Bottom q by entropy = top q by negated entropy; one unit for the whole batch.
    silenced = _top_k_per_unit(-inputs.entropy, candidates, torch.zeros_like(inputs.mask, dtype=torch.long), q)
    return inputs.mask & ~silenced


@register_selector("random")
def _select_random(inputs: SelectionInputs, *, ratio: float = 0.1, scope: str = "response", seed: int = 0) -> Tensor:
    ratio = _check_ratio(ratio)
    scope = _check_scope(scope, SCOPES)
    seed = _check_nonneg_int(seed, "seed")
    generator = torch.Generator(device="cpu").manual_seed(_step_seed(seed, inputs.step))
    score = torch.rand(inputs.mask.shape, generator=generator, dtype=torch.float64).to(inputs.mask.device)
    return _top_k_per_unit(score, inputs.mask, _units(inputs, scope), ratio)


@register_selector("frequent", needs=("ict_score",))
def _select_frequent(
    inputs: SelectionInputs, *, ratio: float = 0.1, scope: str = "response", warmup_steps: int = 0
) -> Tensor:
    unique = _select_ict(inputs, ratio=ratio, scope=scope, warmup_steps=warmup_steps)
    if inputs.step < warmup_steps:
        return inputs.mask.clone()
    return inputs.mask & ~unique
