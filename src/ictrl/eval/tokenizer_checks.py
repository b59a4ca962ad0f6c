"""``ictrl eval``'s tokenizer, loaded and checked against the model before its weights load: every id of it has a
row in the model's embedding, and the model's positions and the vocabulary's longest entry are read for the
prompt-length check (:func:`ictrl.eval.harness.check_prompt_lengths`).
"""

from __future__ import annotations

from typing import Any, NamedTuple


def longest_token(tokenizer: Any) -> int:
    """Characters of the vocabulary's longest entry (at least 1)."""
    return max((len(t) for t in tokenizer.get_vocab()), default=1) or 1


def max_positions(model: str, trust_remote_code: bool = False) -> int | None:
    """The model's ``max_position_embeddings`` from its config (no weights load); None when it has none."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model, trust_remote_code=trust_remote_code)
    value = getattr(config, "max_position_embeddings", None)
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


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


class ModelTokenizer(NamedTuple):
    """A model's tokenizer, checked by :func:`checked_tokenizer`, and the room a prompt has in the model."""

    tokenizer: Any
    positions: int | None  # the model's max_position_embeddings; None when its config has none
    longest: int  # characters of the vocabulary's longest entry (:func:`longest_token`)


def checked_tokenizer(model: str) -> ModelTokenizer:
    """The tokenizer of ``model`` (a hub id or a folder), read with its config and, where the folder has them, its
    safetensors headers, but not its weights; :class:`UserError` naming ``--model`` when it cannot be loaded or
    holds ids the embedding has no row for (:func:`check_tokenizer_fits`)."""
    from transformers import AutoTokenizer

    from ictrl.errors import UserError

    try:
        tokenizer = AutoTokenizer.from_pretrained(model)
        positions = max_positions(model)
    except OSError as err:
        raise UserError(f"--model: {model}: cannot load its tokenizer: {str(err).splitlines()[0]}") from err
    checked = ModelTokenizer(tokenizer, positions, longest_token(tokenizer))
    check_tokenizer_fits(model, tokenizer)
    return checked
