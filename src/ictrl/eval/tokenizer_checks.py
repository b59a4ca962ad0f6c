"""``ictrl eval``'s checks that need the tokenizer but not the weights: every benchmark row read and every prompt's
length measured before the model loads.

A prompt that fills the model's positions (no room for one generated token) is an error naming the benchmark and
problem. Generation past the positions is left to the model: rotary-embedding models run on past them, and the
tiny test models (256 positions) are evaluated with budgets of 1024 tokens.

Prompts are measured cheaply first: no token is longer than the vocabulary's longest entry (in characters; a
byte-level BPE entry spells each byte as one character), so a prompt of ``c`` characters is at least
``c / longest`` tokens, and one too long by that bound is refused without tokenising it (a megabyte of text
takes the tokenizer tens of seconds).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ictrl.errors import DataError, quote


def longest_token(tokenizer: Any) -> int:
    """Characters of the vocabulary's longest entry (at least 1)."""
    return max((len(t) for t in tokenizer.get_vocab()), default=1) or 1


def max_positions(model: str, trust_remote_code: bool = False) -> int | None:
    """The model's ``max_position_embeddings`` from its config (no weights load); None when it has none."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model, trust_remote_code=trust_remote_code)
    value = getattr(config, "max_position_embeddings", None)
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def check_prompt_lengths(tasks: Sequence[Any], tokenizer: Any, config: Any, positions: int | None,
                         option: str = "--benchmarks") -> None:
    """Each task's prompts (``task.prompt_fn`` over ``task.problems``) leave room for a generated token in
    ``positions``; :class:`DataError` naming the benchmark and problem id otherwise."""
    if positions is None:
        return
    longest = longest_token(tokenizer)
    room = positions - 1
    for task in tasks:
        budget = int(task.generation(config)["max_new_tokens"])
        prompts = [task.prompt_fn(p) for p in task.problems]
        for problem, prompt in zip(task.problems, prompts):
            at_least = math.ceil(len(prompt) / longest)
            if at_least > room:
                _too_long(option, task.name, problem, f"at least {at_least}", budget, positions)
        lengths = [len(ids) for ids in tokenizer(prompts, add_special_tokens=False)["input_ids"]]
        for problem, n in zip(task.problems, lengths):
            if n > room:
                _too_long(option, task.name, problem, str(n), budget, positions)


def _too_long(option: str, name: str, problem: Any, tokens: str, budget: int, positions: int) -> None:
    raise DataError(f"{option}: {name}: problem {quote(str(problem.id), 80)}: a prompt of {tokens} tokens leaves no "
                    f"room in the model's {positions} positions (max_new_tokens {budget}); drop the problem or use a "
                    "model with more positions")


def check_tokenizer_fits(model: str, tokenizer: Any) -> None:
    """Every id of ``tokenizer`` must have a row in the model's embedding (from its safetensors header when the
    folder has one, else its config's ``vocab_size``), before the weights load: a larger tokenizer's ids index past
    the embedding in generation. Raises :class:`UserError` naming ``--model`` and both sizes."""
    from pathlib import Path

    from ictrl.checkpoints import embedding_rows
    from ictrl.core.checks import check_vocab_sizes
    from ictrl.errors import UserError

    found = embedding_rows(Path(model)) if Path(model).is_dir() else None
    rows = found[1] if found is not None else None
    if rows is None:
        from transformers import AutoConfig

        rows = getattr(AutoConfig.from_pretrained(model).get_text_config(), "vocab_size", None)
    if isinstance(rows, int):
        try:
            check_vocab_sizes(rows, len(tokenizer))
        except ValueError as err:
            raise UserError(f"--model: {model}: {err}") from None
