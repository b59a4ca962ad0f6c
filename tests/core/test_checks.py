from __future__ import annotations

import pytest
import torch

from ictrl.core.checks import (FLOAT, INT, MASK, OptionError, as_bool_mask, check_number, check_tensor,
                               require_finite, to_bool_mask)


def test_as_bool_mask_accepts_01_and_rejects_other_values() -> None:
    assert as_bool_mask(torch.tensor([[0, 1]])).dtype == torch.bool
    with pytest.raises(ValueError, match="sel must be bool"):
        as_bool_mask(torch.tensor([0, 2]), "sel")


@pytest.mark.parametrize(("value", "shape", "kind", "says"), [
    ([[1.0]], ("B", "T"), None, r"^x must be a torch.Tensor, got list$"),
    (torch.zeros(2), ("B", "T"), None, r"^x must be a 2-D tensor \[B, T\], got shape \(2,\)$"),
    (torch.zeros(2, 4), (2, 3), None, r"^x must have logprobs' shape \(2, 3\), got \(2, 4\)$"),
    (torch.zeros(2, 3, dtype=torch.long), ("B", "T"), FLOAT, r"^x must be floating point, got dtype torch.int64$"),
    (torch.zeros(2, 3, dtype=torch.bool), ("B", "T"), INT, r"^x must be an integer tensor, got dtype torch.bool$"),
    (torch.full((2, 3), 2), ("B", 3), MASK, r"^x must be bool or hold only 0/1 values$"),
])
def test_check_tensor_names_the_argument(value: object, shape: tuple, kind: str | None, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        check_tensor("x", value, shape, kind, of="logprobs' ")


def test_check_tensor_returns_a_bool_mask_and_to_bool_mask_only_converts() -> None:
    assert check_tensor("m", torch.tensor([[0, 1]]), ("B", 2), MASK).tolist() == [[False, True]]
    ids = torch.zeros(2, dtype=torch.long)
    assert check_tensor("ids", ids, (2,), INT) is ids
    assert to_bool_mask(torch.tensor([[0, 2]])).tolist() == [[False, True]]  # taken as built
    built = torch.tensor([True, False])
    assert to_bool_mask(built) is built


@pytest.mark.parametrize(("value", "rule", "reason"), [
    (0.0, {"low": 0, "high": 1, "above": True}, "must be a number in (0, 1], got 0.0"),
    (float("nan"), {}, "must be a finite number >= 0, got nan"),
    (True, {"above": True}, "must be a finite number > 0, got True"),
    (-1, {"integer": True}, "must be an int >= 0 and < 2**63, got -1"),
    (1 << 63, {"integer": True}, "must be an int >= 0 and < 2**63, got 9223372036854775808"),
    (1.0, {"integer": True, "optional": True}, "must be None or an int >= 0 and < 2**63, got 1.0"),
])
def test_check_number_names_the_rule(value: object, rule: dict, reason: str) -> None:
    with pytest.raises(OptionError) as err:
        check_number("x", value, **rule)
    assert err.value.field == "x" and err.value.reason == reason and str(err.value) == f"x {reason}"


def test_check_number_returns_the_value() -> None:
    assert check_number("x", 1, 0, 1, above=True) == 1.0 and isinstance(check_number("x", 1), float)
    assert check_number("x", 3, integer=True) == 3 and check_number("x", None, optional=True) is None


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


def test_first_bad_token_id_names_row_column_and_id_in_ragged_host_rows() -> None:
    from ictrl.core.checks import check_token_ids, check_vocab_sizes, first_bad_token_id

    assert first_bad_token_id([[1, 2], [], [0, 9]], 10) is None
    assert first_bad_token_id([[1, 2], [3, 10, 4, 11]], 10) == (1, 1, 10)
    assert first_bad_token_id([[1, -1]], 10) == (0, 1, -1)
    assert first_bad_token_id(torch.tensor([[1, 2], [3, 12]]), 10) == (1, 1, 12)
    with pytest.raises(ValueError, match=r"^completion token id 12 at \(row 1, column 1\) is outside the model's "
                                         r"vocabulary: model embedding rows 10, tokenizer vocabulary 8$"):
        check_token_ids([[1, 2], [3, 12]], "completion", 10, 8)
    check_vocab_sizes(10, 10)
    with pytest.raises(ValueError, match=r"^token id 10 \(and up to 11\) of the tokenizer has no row in the model: "
                                         r"tokenizer vocabulary 12, model embedding rows 10;"):
        check_vocab_sizes(10, 12)


def test_require_on_device_raises_at_once_on_cpu_and_deferred_checks_raise_when_read() -> None:
    from ictrl.core import checks

    checks.require_on_device(torch.tensor(True), "fine")
    with pytest.raises(ValueError, match="^bad row$"):
        checks.require_on_device(torch.tensor(False), "bad row")
    checks.raise_failed_device_checks()  # nothing pending: no read
    # What a GPU leaves pending (device-independent logic): the first failed message is raised, all are cleared.
    checks._DEFERRED.update({"ok": torch.tensor(True), "first": torch.tensor(False), "second": torch.tensor(False)})
    with pytest.raises(ValueError, match=r"^first \(a device-side check of an earlier training step\)$"):
        checks.raise_failed_device_checks()
    assert checks._DEFERRED == {}
    checks.raise_failed_device_checks()


@pytest.mark.gpu
def test_require_on_device_on_cuda_defers_without_a_device_assert() -> None:
    from ictrl.core import checks

    checks.require_on_device(torch.tensor(True, device="cuda"), "cuda check")
    checks.require_on_device(torch.tensor(False, device="cuda"), "cuda check")  # folded: False from now on
    checks.require_on_device(torch.tensor(True, device="cuda"), "cuda check")
    with pytest.raises(ValueError, match=r"^cuda check \(a device-side check"):
        checks.raise_failed_device_checks()
    assert torch.ones(2, device="cuda").sum().item() == 2  # the context still works


def test_unchecked_bodies_skip_argument_checks_but_not_the_divergence_checks() -> None:
    """The public faces check their arguments; the unchecked bodies the trainer's step calls take its own tensors
    as built. Non-finite logits or log-probs raise either way."""
    from ictrl.core.loss import policy_loss, policy_loss_unchecked
    from ictrl.core.stats import token_stats, token_stats_unchecked

    logits, mask = torch.zeros(2, 3, 5), torch.tensor([[1, 1, 0], [1, 0, 0]])
    lp, adv = torch.zeros(2, 3), torch.zeros(2)
    wrong = torch.tensor([[0, 2, 0], [1, 0, 0]])  # not 0/1
    with pytest.raises(ValueError, match="mask must be bool or hold only 0/1"):
        token_stats(logits, wrong)
    with pytest.raises(ValueError, match="old_logprobs must have logprobs' shape"):
        policy_loss(lp, lp[:, :2], adv, mask)
    assert token_stats_unchecked(logits, wrong).entropy.shape == (2, 3)  # read as != 0, no host read
    policy_loss_unchecked(lp, lp, adv, mask)
    logits[0, 1, 2] = float("nan")
    with pytest.raises(ValueError, match="logits .* is not finite"):
        token_stats_unchecked(logits, mask)
    with pytest.raises(ValueError, match="logprobs is not finite"):
        policy_loss_unchecked(lp.masked_fill(mask.bool(), float("nan")), lp, adv, mask)