"""The selection's dense top-k (what runs on a GPU: no host reads) equals the CPU's active-only top-k exactly."""

from __future__ import annotations

import pytest
import torch

from ictrl.core import selection
from ictrl.core.selection import SelectionInputs, _top_k_active, _top_k_dense, _units, select


def _case(seed: int, B: int = 8, T: int = 37) -> SelectionInputs:
    g = torch.Generator().manual_seed(seed)
    mask = torch.arange(T).unsqueeze(0) < torch.randint(0, T + 1, (B,), generator=g).unsqueeze(1)
    mask[0] = False  # an empty response
    score = torch.randint(0, 5, (B, T), generator=g).float() / 4  # many ties
    score[~mask] = torch.nan  # inactive positions may hold anything
    return SelectionInputs(mask=mask, step=5, ict_score=score, entropy=score.nan_to_num(0.0),
                           group_ids=torch.tensor([7, 3, 7, 3, 1, 1, 7, 3])[:B])


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("scope", ["response", "group", "batch"])
@pytest.mark.parametrize("ratio", [0.1, 0.37, 1.0])
def test_dense_equals_active_only(seed: int, scope: str, ratio: float) -> None:
    inputs = _case(seed)
    units = _units(inputs, scope)
    want = _top_k_active(inputs.ict_score, inputs.mask, units, ratio)
    got = _top_k_dense(inputs.ict_score, inputs.mask, units, ratio)
    assert torch.equal(got, want)
    assert not (got & ~inputs.mask).any()


@pytest.mark.parametrize("seed", range(3))
def test_selectors_agree_with_the_dense_path_on(monkeypatch, seed: int) -> None:
    inputs = _case(seed)
    cases = [("ict", {}), ("entropy", {"ties": "include"}), ("entropy", {"scope": "response"}), ("random", {})]
    want = [select(name, inputs, **opts) for name, opts in cases]
    monkeypatch.setattr(selection, "DENSE_ON_CPU", True)
    for (name, opts), w in zip(cases, want):
        assert torch.equal(select(name, inputs, **opts), w), name
