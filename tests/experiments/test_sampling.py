"""The sampler inspect and regime share: where each response ends."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from ictrl.experiments.sampling import eos_ids, until_end_mask


def test_response_mask_stops_after_first_eos() -> None:
    resp = torch.tensor([[5, 9, 7, 9], [5, 6, 7, 8], [9, 9, 9, 9]])
    assert until_end_mask(resp, [9]).tolist() == [
        [True, True, False, False], [True, True, True, True], [True, False, False, False]]
    end = torch.tensor([[5, 0, 7, 7], [5, 9, 9, 9]])  # either end token ends a row
    assert until_end_mask(end, [0, 9]).tolist() == [[True, True, False, False], [True, True, False, False]]


def test_the_end_tokens_are_the_generation_configs_and_the_tokenizers() -> None:
    """A chat model stops at every id its generation config lists; the row padded after the other one is no
    response (the tokenizer's EOS alone would count the padding as response tokens)."""
    tokenizer = SimpleNamespace(eos_token_id=7)
    for config_ids, want in ((None, [7]), (9, [7, 9]), ([9, 7, 3], [3, 7, 9])):
        model = SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=config_ids))
        assert eos_ids(model, tokenizer) == want
