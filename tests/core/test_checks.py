from __future__ import annotations

import pytest
import torch

from ictrl.core.checks import as_bool_mask, require_finite


def test_as_bool_mask_accepts_01_and_rejects_other_values() -> None:
    assert as_bool_mask(torch.tensor([[0, 1]])).dtype == torch.bool
    with pytest.raises(ValueError, match="sel must be bool"):
        as_bool_mask(torch.tensor([0, 2]), "sel")


def test_require_finite_names_first_active_offender_and_ignores_masked() -> None:
    x = torch.zeros(3, 4)
    x[0, 1] = float("nan")                     # masked out: allowed
    x[2, 3] = float("-inf")                    # active
    mask = torch.ones(3, 4, dtype=torch.bool)
    mask[0, 1] = False
    with pytest.raises(ValueError, match=r"old_logprobs is not finite at \(row 2, position 3\): -inf \(1 non"):
        require_finite("old_logprobs", x, mask)
    mask[2, 3] = False
    require_finite("old_logprobs", x, mask)    # nothing active is bad


def test_require_finite_broadcasts_a_position_mask_over_the_vocabulary() -> None:
    logits = torch.zeros(2, 3, 5)
    logits[1, 0, 4] = float("nan")
    where = torch.tensor([[True, True, True], [False, True, True]])
    require_finite("logits", logits, where)
    where[1, 0] = True
    with pytest.raises(ValueError, match=r"\(row 1, position 0, vocab id 4\): nan"):
        require_finite("logits", logits, where)
    with pytest.raises(ValueError, match=r"advantages is not finite at \(row 1\)"):
        require_finite("advantages", torch.tensor([0.0, float("nan")]))
