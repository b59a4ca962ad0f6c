"""The checks of a run that need the command, not the config alone (each field's own bounds are checked by the
dataclass that owns it: ``ictrl.engine.config_fields`` for ``ICTGRPOConfig``).

- :func:`check_memory`: the token ids of one generation batch on one process, completions x (``max_prompt_length``
  + ``max_completion_length``), against :func:`max_batch_tokens`, for the run's process count;
- :func:`check_output_dir`: ``output_dir`` can be a writable directory; a path that leaves the working directory
  through ``..`` is named in one warning line.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from ictrl.errors import UserError, quote
from ictrl.train_cli.run_config import ConfigError, RunConfig

log = logging.getLogger("ictrl.train")

# Token ids held for one generation batch on one process. At ~40 bytes per token across the batch's tensors (int64
# ids and masks, float32 log-probs, advantages and selection statistics) 2**25 tokens is ~1.3 GiB of buffers before
# any activation; a batch past it is a typo (an extra zero) far more often than a plan. ICTRL_MAX_BATCH_TOKENS
# raises it.
MAX_BATCH_TOKENS = 1 << 25


def max_batch_tokens() -> int:
    """The bound of :func:`check_memory`: ``ICTRL_MAX_BATCH_TOKENS`` when set, else :data:`MAX_BATCH_TOKENS`."""
    raw = os.environ.get("ICTRL_MAX_BATCH_TOKENS", "").strip()
    if not raw:
        return MAX_BATCH_TOKENS
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"ICTRL_MAX_BATCH_TOKENS: expected an integer, got {quote(raw)}") from None


def check_memory(args: Any, cfg: RunConfig, source: str, processes: int) -> None:
    """Completions of one generation batch on one process x their longest length, against
    :func:`max_batch_tokens`. The prompt part is ``max_prompt_length`` (not counted when it is null)."""
    per_process = args.generation_batch_size // max(processes, 1)
    prompt = cfg.script.max_prompt_length or 0
    tokens = per_process * (prompt + args.max_completion_length)
    bound = max_batch_tokens()
    if tokens > bound:
        prompt_part = f"max_prompt_length {prompt} + " if prompt else ""
        raise ConfigError(
            f"{source}: generation batch too large: {per_process} completions per process (generation_batch_size "
            f"{args.generation_batch_size} / {processes} process(es)) x ({prompt_part}max_completion_length "
            f"{args.max_completion_length}) tokens = {tokens} tokens, over the bound of {bound} tokens per process "
            "(ICTRL_MAX_BATCH_TOKENS raises it); lower num_generations, per_device_train_batch_size, "
            "prompts_per_step or the lengths")


def check_output_dir(path: str, source: str = "<config>") -> None:
    """``path`` is, or can be made, a writable directory; a path that leaves the working directory through ``..``
    is named in one warning line."""
    from ictrl.files import check_output_dir as check_writable

    out = Path(path).expanduser()
    try:
        check_writable(path, "output_dir")
    except UserError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    if ".." in out.parts:
        resolved, cwd = out.resolve(), Path.cwd().resolve()
        if not resolved.is_relative_to(cwd):
            log.warning("output_dir %s leaves the working directory %s: writing to %s", path, cwd, resolved)
