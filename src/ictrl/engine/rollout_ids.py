"""Token ids checked on the host before they reach the model: one line naming the id, instead of a device-side
assert (on a GPU an out-of-range id in an embedding or a gather stops the process with ``CUDA error: device-side
assert triggered`` and leaves the CUDA context unusable, so not even a checkpoint can be written).

:func:`checked_rollout` wraps the trainer's ``_generate_single_turn`` (TRL's rollout, whose ids are host lists):
before generating it compares the tokenizer's vocabulary with the model's embedding and LM-head rows, checks the
prompt ids, and raises any device-side check of the previous step that failed (``ictrl.core.checks.
raise_failed_device_checks``: the rollout is where the host waits for the device anyway); after, it checks the
completion ids. Each failure is a :class:`ictrl.errors.UserError`: one line, naming the id, its (row, column)
and both vocabulary sizes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from ictrl.core.checks import check_token_ids, check_vocab_sizes, raise_failed_device_checks
from ictrl.errors import UserError

F = TypeVar("F", bound=Callable[..., Any])


def model_rows(model: Any) -> int:
    """Rows of the model's input embedding and LM head (the smaller, if they differ): an id must be below it.
    Module attributes, not weight shapes, so a sharded (FSDP, ZeRO-3) weight still gives its full size."""
    rows = []
    emb = model.get_input_embeddings()
    if getattr(emb, "num_embeddings", None) is not None:
        rows.append(int(emb.num_embeddings))
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if getattr(head, "out_features", None) is not None:
        rows.append(int(head.out_features))
    return min(rows) if rows else int(model.config.get_text_config().vocab_size)


def tokenizer_size(processing_class: Any) -> int:
    """``len`` of the tokenizer (added tokens included), or of a processor's tokenizer."""
    return len(getattr(processing_class, "tokenizer", processing_class))


def vocab_sizes(trainer: Any) -> tuple[int, int]:
    """(model rows, tokenizer size) of a trainer, read once and kept on it (neither changes during a run)."""
    sizes = trainer.__dict__.get("_ictrl_vocab_sizes")
    if sizes is None:
        sizes = (model_rows(trainer.accelerator.unwrap_model(trainer.model)), tokenizer_size(trainer.processing_class))
        trainer._ictrl_vocab_sizes = sizes
    return sizes


def check_rollout(trainer: Any, rows: Any, what: str) -> None:
    """Raise :class:`UserError` unless ``rows`` (host lists of ids) index the trainer's model, and (first) unless the
    tokenizer's vocabulary fits the model's and no deferred device-side check failed."""
    rows_model, size = vocab_sizes(trainer)
    try:
        check_vocab_sizes(rows_model, size)
        check_token_ids(rows, what, rows_model, size)
        raise_failed_device_checks()
    except ValueError as err:
        raise UserError(str(err)) from None


def checked_rollout(method: F) -> F:
    """``_generate_single_turn`` with its prompt ids checked before it runs and its completion ids after."""

    @functools.wraps(method)
    def wrapper(self: Any, prompt_ids: Any, *args: Any, **kwargs: Any) -> Any:
        check_rollout(self, prompt_ids, "prompt")
        out = method(self, prompt_ids, *args, **kwargs)
        check_rollout(self, out[0], "completion")
        return out

    return wrapper  # type: ignore[return-value]
