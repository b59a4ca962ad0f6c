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


def test_trusted_inputs_skips_argument_checks_but_not_the_divergence_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The trainer's step (``trusted_inputs``) takes its own tensors as built; a user's call is checked where it
    enters; ``ICTRL_DEBUG_CHECKS=1`` checks the step too. Non-finite logits or log-probs raise either way."""
    from ictrl.core.checks import DEBUG_ENV, checking, trusted_inputs
    from ictrl.core.loss import policy_loss
    from ictrl.core.stats import token_stats

    logits, mask = torch.zeros(2, 3, 5), torch.tensor([[1, 1, 0], [1, 0, 0]])
    lp, adv = torch.zeros(2, 3), torch.zeros(2)
    wrong = torch.tensor([[0, 2, 0], [1, 0, 0]])  # not 0/1
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    with pytest.raises(ValueError, match="mask must be bool or hold only 0/1"):
        token_stats(logits, wrong)
    with pytest.raises(ValueError, match="old_logprobs must have logprobs' shape"):
        policy_loss(lp, lp[:, :2], adv, mask)
    with trusted_inputs():
        assert not checking()
        assert token_stats(logits, wrong).entropy.shape == (2, 3)  # read as != 0, no host read
        policy_loss(lp, lp, adv, mask)
        logits[0, 1, 2] = float("nan")
        with pytest.raises(ValueError, match="logits .* is not finite"):
            token_stats(logits, mask)
        with pytest.raises(ValueError, match="logprobs is not finite"):
            policy_loss(lp.masked_fill(mask.bool(), float("nan")), lp, adv, mask)
    assert checking()
    monkeypatch.setenv(DEBUG_ENV, "1")
    with trusted_inputs(), pytest.raises(ValueError, match="mask must be bool or hold only 0/1"):
        token_stats(torch.zeros(2, 3, 5), wrong)
