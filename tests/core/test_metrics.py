"""step_metrics against a plain-Python float64 reference."""

from __future__ import annotations

import math

import pytest
import torch

from ictrl.core.metrics import step_metrics
from ictrl.core.stats import TokenStats, token_stats


def random_logits(seed: int, B: int = 4, T: int = 7, V: int = 11) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, T, V, generator=g, dtype=torch.float64) * 2
    tokens = torch.randint(0, V, (B, T), generator=g)
    lengths = torch.tensor([7, 3, 0, 5][:B])
    return logits, tokens, torch.arange(T)[None, :] < lengths[:, None]


def stats_from_logits(seed: int) -> tuple[TokenStats, torch.Tensor]:
    """TokenStats of random logits, computed naively in float64; zeros at masked positions, as the contract says."""
    logits, tokens, mask = random_logits(seed)
    p = torch.softmax(logits, dim=-1)
    purity = (p * p).sum(-1)
    prob = p.gather(-1, tokens[..., None]).squeeze(-1)
    fields = {
        "entropy": -(p * p.log()).sum(-1),
        "renyi2": -purity.log(),
        "purity": purity,
        "logprob": prob.log(),
        "prob": prob,
    }
    return TokenStats(**{k: torch.where(mask, v, 0.0).float() for k, v in fields.items()}), mask


def naive_metrics(stats: TokenStats, mask: torch.Tensor, selected: torch.Tensor) -> dict[str, float]:
    B, T = mask.shape
    all_pos = [(b, t) for b in range(B) for t in range(T) if mask[b, t]]
    sel_pos = [(b, t) for (b, t) in all_pos if selected[b, t]]
    out = {"tokens/all": float(len(all_pos)), "tokens/selected": float(len(sel_pos)),
           "selected_frac": len(sel_pos) / len(all_pos) if all_pos else 0.0}
    for suffix, pos in (("all", all_pos), ("selected", sel_pos)):
        if not pos:
            continue
        for key, attr in (("h1", "entropy"), ("h2", "renyi2"), ("purity", "purity"), ("prob", "prob")):
            out[f"{key}/{suffix}"] = sum(float(getattr(stats, attr)[b, t]) for b, t in pos) / len(pos)
    if sel_pos:
        out["pi_minus_beta/selected"] = sum(
            float(stats.prob[b, t]) - float(stats.purity[b, t]) for b, t in sel_pos) / len(sel_pos)
        h1 = sorted(float(stats.entropy[b, t]) for b, t in all_pos)
        median = h1[(len(h1) - 1) // 2]  # lower median for an even count
        out["selected/high_entropy_frac"] = sum(float(stats.entropy[b, t]) > median for b, t in sel_pos) / len(sel_pos)
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_step_metrics_vs_reference(seed: int) -> None:
    stats, mask = stats_from_logits(seed)
    g = torch.Generator().manual_seed(100 + seed)
    selected = torch.rand(mask.shape, generator=g) < 0.5  # also hits masked positions: must be ignored
    got = step_metrics(stats, mask, selected)
    expected = naive_metrics(stats, mask, selected & mask)
    assert set(got) == set(expected)
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, rel=1e-6, abs=1e-9), key
        assert isinstance(got[key], float)


def test_high_entropy_split_uses_strict_lower_median() -> None:
    mask = torch.tensor([[True, True, True, True]])
    h1 = torch.tensor([[1.0, 2.0, 3.0, 4.0]])  # lower median 2.0
    zeros = torch.zeros(1, 4)
    stats = TokenStats(entropy=h1, renyi2=zeros, purity=zeros, logprob=zeros, prob=zeros)
    got = step_metrics(stats, mask, torch.tensor([[False, True, True, False]]))
    assert got["selected/high_entropy_frac"] == 0.5  # 3.0 > 2.0; 2.0 is not above the median


def test_empty_selection_omits_selected_means() -> None:
    stats, mask = stats_from_logits(0)
    got = step_metrics(stats, mask, torch.zeros_like(mask))
    assert got["selected_frac"] == 0.0 and got["tokens/selected"] == 0.0
    assert not any(k.endswith("/selected") and k != "tokens/selected" for k in got)
    assert "selected/high_entropy_frac" not in got
    assert "h1/all" in got
    assert all(math.isfinite(v) for v in got.values())
    empty = step_metrics(stats, torch.zeros_like(mask), torch.ones_like(mask))
    assert empty == {"tokens/all": 0.0, "tokens/selected": 0.0, "selected_frac": 0.0}


def test_bad_inputs_name_the_argument() -> None:
    stats, mask = stats_from_logits(0)
    with pytest.raises(ValueError, match="selected"):
        step_metrics(stats, mask, mask[:, :-1])
    with pytest.raises(ValueError, match="mask"):
        step_metrics(stats, mask.long() * 3, mask)
    bad = TokenStats(entropy=stats.entropy[:, :2], renyi2=stats.renyi2, purity=stats.purity,
                     logprob=stats.logprob, prob=stats.prob)
    with pytest.raises(ValueError, match="stats.entropy"):
        step_metrics(bad, mask, mask)


def test_accepts_token_stats_output() -> None:
    logits, tokens, mask = random_logits(4)
    naive, _ = stats_from_logits(4)
    selected = torch.zeros_like(mask)
    selected[0, ::2] = True
    selected[3, 1] = True
    got = step_metrics(token_stats(logits.float(), mask, tokens), mask, selected)
    expected = naive_metrics(naive, mask, selected)
    assert set(got) == set(expected)
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
