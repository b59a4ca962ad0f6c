"""The fast forms of ICT (stats, selection, loss) equal the plain float64 definitions in ictrl.core.reference."""

from __future__ import annotations

import pytest
import torch

from ictrl.core import reference as ref
from ictrl.core.selection import SelectionInputs, select
from ictrl.core.stats import group_js_divergence
from loss_call import policy_loss_kw


def _batch(seed: int, B: int = 6, T: int = 9, V: int = 11) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, T, V, generator=g) * 2
    lengths = torch.tensor([9, 4, 0, 1, 7, 9][:B])  # ragged, one empty response, one single-token response
    mask = torch.arange(T)[None, :] < lengths[:, None]
    group_ids = torch.tensor([5, 2, 5, 2, 5, 8][:B])  # non-adjacent groups, and group 8 has one member
    return logits, mask, group_ids


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_group_js_matches_the_reference(temperature: float) -> None:
    logits, mask, group_ids = _batch(0)
    got = group_js_divergence(logits, mask, group_ids, temperature=temperature)
    want = ref.group_js(logits, mask, group_ids, temperature)
    torch.testing.assert_close(got.double(), want, atol=2e-6, rtol=1e-5)
    assert float(want[mask].max()) > 0.01  # not vacuous
    assert float(want[5].abs().sum()) == 0.0  # a group of one has nothing to diverge from


@pytest.mark.parametrize("ratio", [0.1, 0.25, 0.5, 1.0])
def test_ict_selection_is_top_k_per_response(ratio: float) -> None:
    logits, mask, group_ids = _batch(1)
    score = (ref.group_js(logits, mask, group_ids) * 4).round() / 4  # coarse, so ties occur
    got = select("ict", SelectionInputs(mask=mask, ict_score=score.float(), group_ids=group_ids), ratio=ratio)
    want = ref.top_k_per_unit(score, mask, list(range(mask.size(0))), ratio)
    assert torch.equal(got, want)
    assert int(want.sum()) == sum(ref.ceil_count(ratio, int(n)) for n in mask.sum(1))


def test_sparse_grpo_loss_matches_the_reference() -> None:
    logits, mask, group_ids = _batch(2)
    g = torch.Generator().manual_seed(3)
    lp = torch.randn(mask.shape, generator=g, dtype=torch.float64) * 0.3 - 1
    old = lp + torch.randn(mask.shape, generator=g, dtype=torch.float64) * 0.3  # ratios on both sides of the clip
    adv = torch.tensor([1.0, -0.5, 0.3, 2.0, -1.0, 0.0], dtype=torch.float64)
    score = ref.group_js(logits, mask, group_ids)
    sel = ref.top_k_per_unit(score, mask, list(range(mask.size(0))), 0.25)
    got, _ = policy_loss_kw(lp, old, adv, mask, sel, eps_low=0.2, eps_high=0.28, norm="per_response_selected")
    assert float(got) == pytest.approx(ref.sparse_grpo_loss(lp, old, adv, mask, sel, 0.2, 0.28), rel=1e-12)
    empty = torch.zeros_like(mask)
    got_empty, _ = policy_loss_kw(lp, old, adv, mask, empty, eps_low=0.2, eps_high=0.28, norm="per_response_selected")
    assert float(got_empty) == 0.0 == ref.sparse_grpo_loss(lp, old, adv, mask, empty)


def test_ceil_count_is_exact_on_the_decimal_ratio() -> None:
    # binary floats overshoot: 0.07 * 100 == 7.000000000000001 and 0.1 * 30 == 3.0000000000000004
    cases = [(0.07, 100, 7), (0.1, 30, 3), (0.1, 31, 4), (0.2, 1, 1), (1.0, 5, 5), (0.25, 0, 0), (0.3, 7, 3)]
    for ratio, n, want in cases:
        assert ref.ceil_count(ratio, n) == want, (ratio, n)
    counts = torch.tensor([n for _, n, _ in cases])
    got = [int(ref.ceil_count(r, counts)[i]) for i, (r, _, _) in enumerate(cases)]
    assert got == [want for _, _, want in cases]  # the tensor form the selection counts with, the same numbers
