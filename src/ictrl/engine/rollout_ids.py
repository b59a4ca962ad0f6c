"""Token ids checked on the host before they reach the model: one line naming the id, instead of a device-side
assert (on a GPU an out-of-range id in an embedding or a gather stops the process with ``CUDA error: device-side
assert triggered`` and leaves the CUDA context unusable, so not even a checkpoint can be written).

Where each id comes from decides where it is checked, once at a boundary:

- the tokenizer's: :func:`check_vocab` when the trainer is built compares the tokenizer's vocabulary with the model's
  embedding and LM-head rows, so no prompt id the tokenizer produces (nor a tool's output it tokenizes) is out of
  range;
- the sampler's: transformers' ``generate`` and vLLM sample from logits over the model's rows;
- a user's ``rollout_func``: :func:`checked_rollout_func` wraps it before it is handed to TRL, and checks the prompt and
  completion ids it returns.

:func:`raise_deferred_checks` raises any device-side check of an earlier step that failed (``ictrl.core.checks.
raise_failed_device_checks``), once per generation batch, where the host waits for the device anyway. Each failure
is a :class:`ictrl.errors.UserError`: one line, naming the id, its (row, column) and both vocabulary sizes.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

from ictrl.core.checks import check_token_ids, check_vocab_sizes, raise_failed_device_checks
from ictrl.errors import UserError


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


@contextlib.contextmanager
def _user_error() -> Iterator[None]:
    """The core's ``ValueError`` as a :class:`UserError`: one line, its message, no traceback."""
    try:
        yield
    except ValueError as err:
        raise UserError(str(err)) from None


def check_vocab(model: Any, processing_class: Any) -> tuple[int, int]:
    """(model rows, tokenizer size); :class:`UserError` unless every id of the tokenizer has a row in the model."""
    sizes = model_rows(model), tokenizer_size(processing_class)
    with _user_error():
        check_vocab_sizes(*sizes)
    return sizes


def check_ids(rows: Any, what: str, sizes: tuple[int, int]) -> None:
    """:class:`UserError` unless ``rows`` (host lists of ids; ``what``: "prompt", "completion") index the model's
    ``sizes[0]`` rows."""
    with _user_error():
        check_token_ids(rows, what, *sizes)


def raise_deferred_checks() -> None:
    """:class:`UserError` for the first device-side check of an earlier step that failed (none pending: no read)."""
    with _user_error():
        raise_failed_device_checks()


def checked_rollout_func(rollout_func: Callable[..., Any],
                         sizes: Callable[[], tuple[int, int]]) -> Callable[..., Any]:
    """A user's ``rollout_func(prompts, trainer)`` whose returned ``prompt_ids`` and ``completion_ids`` are checked
    before the trainer's model sees them (a missing key is left to TRL, which names it). ``sizes`` gives the trainer's
    (model rows, tokenizer size) when the function runs: it is wrapped before the trainer, which builds the model,
    exists."""

    @functools.wraps(rollout_func)
    def checked(*args: Any, **kwargs: Any) -> Any:
        output = rollout_func(*args, **kwargs)
        for what in ("prompt", "completion"):
            if isinstance(output, dict) and output.get(f"{what}_ids") is not None:
                check_ids(output[f"{what}_ids"], what, sizes())
        return output

    return checked
