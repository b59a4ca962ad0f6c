"""Value checks of a run config, run before anything heavy: the one place a new field's bounds join.

:func:`check_values` takes the built trainer config (``ICTGRPOConfig``, its derived fields filled in) and the run
config's sections, and raises :class:`ictrl.engine.run_config.ConfigError` for the first value that is

- not finite (NaN or infinity in any float field, including inside lists), or an integer beyond int64;
- outside its range in :data:`RANGES` (a new field's bounds: one row there);
- training nothing (``max_steps`` 0 or below -1, or no positive epoch count when ``max_steps`` is -1);
- too large for memory by arithmetic: the token ids of one generation batch on one process,
  completions x (``max_prompt_length`` + ``max_completion_length``), against :func:`max_batch_tokens`.

:func:`check_output_dir` checks that ``output_dir`` can be a writable directory and warns, in one line, when the
path leaves the working directory through ``..``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ictrl.engine.run_config import ConfigError, RunConfig
from ictrl.errors import quote

log = logging.getLogger("ictrl.train")

INT64 = 1 << 63
SEED_LIMIT = 1 << 32  # numpy's seed range, which transformers' set_seed feeds
# Token ids held for one generation batch on one process. At ~40 bytes per token across the batch's tensors (int64
# ids and masks, float32 log-probs, advantages and selection statistics) 2**25 tokens is ~1.3 GiB of buffers before
# any activation; a batch past it is a typo (an extra zero) far more often than a plan. ICTRL_MAX_BATCH_TOKENS
# raises it.
MAX_BATCH_TOKENS = 1 << 25


@dataclass(frozen=True)
class Range:
    """``low <= value <= high`` (``<`` where ``open_low`` / ``open_high``); None: unbounded on that side."""

    low: float | None = None
    high: float | None = None
    open_low: bool = False
    open_high: bool = False

    def __contains__(self, value: float) -> bool:
        if self.low is not None and (value <= self.low if self.open_low else value < self.low):
            return False
        return not (self.high is not None and (value >= self.high if self.open_high else value > self.high))

    def __str__(self) -> str:
        parts = []
        if self.low is not None:
            parts.append(f"{'>' if self.open_low else '>='} {self.low}")
        if self.high is not None:
            parts.append(f"{'<' if self.open_high else '<='} {self.high}")
        return " and ".join(parts)


POSITIVE = Range(0, open_low=True)
NON_NEGATIVE = Range(0)
AT_LEAST_ONE = Range(1)
UNIT = Range(0, 1)
SEED = Range(0, SEED_LIMIT, open_high=True)

# Trainer field -> the range its value must lie in (None values are skipped: they mean "the default").
RANGES: dict[str, Range] = {
    "learning_rate": NON_NEGATIVE,
    "weight_decay": NON_NEGATIVE,
    "adam_beta1": Range(0, 1, open_high=True),
    "adam_beta2": Range(0, 1, open_high=True),
    "adam_epsilon": NON_NEGATIVE,
    "max_grad_norm": NON_NEGATIVE,
    "warmup_ratio": UNIT,
    "warmup_steps": NON_NEGATIVE,
    "seed": SEED,
    "data_seed": SEED,
    "selection_seed": SEED,
    "eval_seed": SEED,
    "per_device_train_batch_size": AT_LEAST_ONE,
    "gradient_accumulation_steps": AT_LEAST_ONE,
    "num_generations": Range(2),
    "max_completion_length": AT_LEAST_ONE,
    "num_iterations": AT_LEAST_ONE,
    "steps_per_generation": AT_LEAST_ONE,
    "temperature": POSITIVE,
    "top_p": Range(0, 1, open_low=True),
    "top_k": NON_NEGATIVE,
    "min_p": UNIT,
    "repetition_penalty": POSITIVE,
    "beta": NON_NEGATIVE,
    "epsilon": NON_NEGATIVE,
    "epsilon_high": NON_NEGATIVE,
    "logging_steps": POSITIVE,
    "save_steps": POSITIVE,
    "selection_ratio": Range(0, 1, open_low=True),
    "selection_temperature": POSITIVE,
    "prompts_per_step": AT_LEAST_ONE,
    "eval_num_samples": AT_LEAST_ONE,
    "eval_temperature": NON_NEGATIVE,
    "eval_max_new_tokens": AT_LEAST_ONE,
}


def max_batch_tokens() -> int:
    """The bound of :func:`check_memory`: ``ICTRL_MAX_BATCH_TOKENS`` when set, else :data:`MAX_BATCH_TOKENS`."""
    raw = os.environ.get("ICTRL_MAX_BATCH_TOKENS", "").strip()
    if not raw:
        return MAX_BATCH_TOKENS
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"ICTRL_MAX_BATCH_TOKENS: expected an integer, got {quote(raw)}") from None


def _bad_number(key: str, value: Any) -> tuple[str, str] | None:
    """(the key of the offending number, why) for a number in ``value`` (lists and mappings walked), or None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return key, "must be finite"
    if isinstance(value, int) and not -INT64 <= value < INT64:
        return key, "must fit in 64 bits"
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, (list, tuple)) else ()
    for sub, item in items:
        found = _bad_number(f"{key}.{sub}" if isinstance(value, dict) else f"{key}[{sub}]", item)
        if found:
            return found
    return None


def check_finite(values: dict[str, Any], source: str) -> None:
    """Every number in ``values`` (key -> value; lists and mappings walked) finite and within int64."""
    for key, value in values.items():
        found = _bad_number(key, value)
        if found:
            where, why = found
            raise ConfigError(f"{source}: {where}: {why}, got {quote(_at(value, where[len(key):]))}")


def _at(value: Any, path: str) -> Any:
    """The item of ``value`` at ``path`` (``.name`` or ``[i]`` steps, as :func:`_bad_number` writes them)."""
    for step in re.findall(r"\.([^.\[]+)|\[(\d+)\]", path):
        value = value[step[0]] if step[0] else value[int(step[1])]
    return value


def check_ranges(args: Any, source: str, ranges: dict[str, Range] = RANGES) -> None:
    for key, bound in ranges.items():
        value = getattr(args, key, None)
        if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if value not in bound:
            raise ConfigError(f"{source}: {key}: must be {bound}, got {quote(value)}")


def check_trains_something(args: Any, source: str) -> None:
    """``max_steps`` >= 1, or -1 (transformers' "train num_train_epochs epochs") with epochs > 0."""
    steps, epochs = args.max_steps, args.num_train_epochs
    if steps == 0 or steps < -1:
        raise ConfigError(f"{source}: max_steps: must be >= 1, or -1 to train num_train_epochs epochs; got "
                          f"{quote(steps)}, which trains nothing")
    if steps == -1 and not epochs > 0:
        raise ConfigError(f"{source}: num_train_epochs: must be > 0 when max_steps is -1 (unset), got "
                          f"{quote(epochs)}, which trains nothing")


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


def check_values(args: Any, cfg: RunConfig, source: str = "<config>") -> None:
    """Every check above on the built trainer config ``args`` and the sections of ``cfg``."""
    from ictrl.engine.config import process_count

    fields = {f.name: getattr(args, f.name) for f in dataclasses.fields(args) if f.init and hasattr(args, f.name)}
    check_ranges(args, source)  # first: a range names the bound (a seed's), the generic check only int64
    check_finite(fields, source)
    check_trains_something(args, source)
    check_memory(args, cfg, source, process_count())


def check_output_dir(path: str, source: str = "<config>") -> None:
    """``path`` is, or can be made, a writable directory; a path that leaves the working directory through ``..``
    is named in one warning line."""
    out = Path(path).expanduser()
    if out.exists() or out.is_symlink():
        if not out.is_dir():
            kind = "a file" if out.is_file() else "not a directory"
            raise ConfigError(f"{source}: output_dir: {quote(path)} is {kind}; give a directory")
        if not os.access(out, os.W_OK | os.X_OK):
            raise ConfigError(f"{source}: output_dir: {quote(path)} is not writable")
    else:
        parent = out.absolute().parent
        while not parent.exists():
            parent = parent.parent
        if not parent.is_dir():
            raise ConfigError(f"{source}: output_dir: {quote(path)}: {parent} is not a directory")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise ConfigError(f"{source}: output_dir: {quote(path)}: cannot create it, {parent} is not writable")
    if ".." in out.parts:
        resolved, cwd = out.resolve(), Path.cwd().resolve()
        if not resolved.is_relative_to(cwd):
            log.warning("output_dir %s leaves the working directory %s: writing to %s", path, cwd, resolved)
