"""grpo_advantages against a plain-Python float64 reference."""

from __future__ import annotations

import math

import pytest
import torch

from ictrl.core.advantages import grpo_advantages


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_grpo_advantages_non_finite_reward_names_row_and_group(value: float) -> None:
    """A NaN reward silently gave its whole group advantage 0."""
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 1.0])
    rewards[4] = value
    with pytest.raises(ValueError, match=r"rewards is not finite at row 4 \(group 7\)"):
        grpo_advantages(rewards, torch.tensor([3, 3, 5, 5, 7, 7]))


def naive_advantages(rewards, groups, scale, eps):
    out = []
    for r, g in zip(rewards, groups):
        members = [x for x, h in zip(rewards, groups) if h == g]
        mean = sum(members) / len(members)
        if scale == "none":
            out.append(r - mean)
            continue
        std = math.sqrt(sum((x - mean) ** 2 for x in members) / (len(members) - 1)) if len(members) > 1 else 0.0
        out.append((r - mean) / (std + eps) if std + eps > 0 else 0.0)
    return out


@pytest.mark.parametrize("scale", ["std", "none"])
def test_grpo_advantages_vs_reference(scale: str) -> None:
    rewards = [1.0, 0.0, 0.0, 1.0, 1.0, 0.5, 0.0, 1.0, 0.25]
    groups = [4, 2, 4, 2, 4, 9, 2, 4, 7]  # non-adjacent groups, and a singleton group (7)
    got = grpo_advantages(torch.tensor(rewards, dtype=torch.float64), torch.tensor(groups), scale=scale)
    expected = naive_advantages(rewards, groups, scale, 1e-4)
    assert got.tolist() == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert got[8].item() == 0.0


def test_grpo_advantages_edge_cases() -> None:
    same = grpo_advantages(torch.ones(4), torch.zeros(4, dtype=torch.long), eps=0.0)
    assert torch.equal(same, torch.zeros(4))  # constant group with eps=0: 0, not NaN
    ints = grpo_advantages(torch.tensor([1, 0]), torch.tensor([0, 0]))
    assert ints.dtype == torch.float32 and ints[0].item() > 0 > ints[1].item()
    for kwargs, name in [({"scale": "mad"}, "scale"), ({"eps": -1.0}, "eps"),
                         ({"group_ids": torch.zeros(3, dtype=torch.long)}, "group_ids"),
                         ({"group_ids": torch.zeros(2)}, "group_ids")]:
        args = {"rewards": torch.ones(2), "group_ids": torch.zeros(2, dtype=torch.long), **kwargs}
        with pytest.raises(ValueError, match=name):
            grpo_advantages(**args)
