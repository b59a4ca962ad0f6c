"""The checks of ``ICTGRPOConfig``'s fields that TRL leaves unchecked, run by its ``__post_init__`` before anything
else: each value in its range (:data:`RANGES`), every number finite and within int64, and a run that trains
something, each a one-line ``ValueError`` naming the field; and the trackers (``report_to``) and kernels
(``use_liger_kernel``) it names installed, a one-line :class:`ictrl.errors.UserError` naming what to install."""

from __future__ import annotations

import difflib
import importlib.util
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ictrl.errors import MissingExtraError, UserError, quote

INT64 = 1 << 63
SEED_LIMIT = 1 << 32  # numpy's seed range, which transformers' set_seed feeds


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

# Trainer field -> the range its value must lie in (None values are skipped: they mean "the default"). Fields
# whose value is resolved first (temperature, selection_temperature) are checked there; the loss's values (epsilon,
# epsilon_high, beta, the vllm_importance_sampling_* options, ...) by the LossSpec the config builds
# (ictrl.core.loss), the selector's (selection_ratio, selection_seed, ...) by its registration (ictrl.core.selection).
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
    "reward_timeout": POSITIVE,
    "no_signal_steps": NON_NEGATIVE,
    "data_seed": SEED,
    "eval_seed": SEED,
    "per_device_train_batch_size": AT_LEAST_ONE,
    "gradient_accumulation_steps": AT_LEAST_ONE,
    "num_generations": Range(2),
    "max_completion_length": AT_LEAST_ONE,
    "num_iterations": AT_LEAST_ONE,
    "steps_per_generation": AT_LEAST_ONE,
    "generation_batch_size": AT_LEAST_ONE,  # 0: TRL's __post_init__ divides by it
    "top_p": Range(0, 1, open_low=True),
    "top_k": NON_NEGATIVE,
    "min_p": UNIT,
    "repetition_penalty": POSITIVE,
    "logging_steps": POSITIVE,
    "save_steps": POSITIVE,
    "prompts_per_step": AT_LEAST_ONE,
    "eval_num_samples": AT_LEAST_ONE,
    "eval_temperature": NON_NEGATIVE,
    "eval_max_new_tokens": AT_LEAST_ONE,
}


# Fields TRL 1.16 annotates `int | None` but computes with (GRPOConfig.__post_init__ divides by num_generations;
# the completion length sizes every batch): None is no default there.
NOT_NULL = ("num_generations", "max_completion_length")


def check_ranges(config: Any) -> None:
    for key in NOT_NULL:
        if getattr(config, key, 0) is None:
            raise ValueError(f"{key}: expected a number {RANGES.get(key, AT_LEAST_ONE)}, got null")
    for key, bound in RANGES.items():
        value = getattr(config, key, None)
        if isinstance(value, bool):  # an int to Python, so TRL would divide by false
            raise ValueError(f"{key}: expected a number {bound}, got {str(value).lower()}")
        if value is None or not isinstance(value, (int, float)):
            continue
        if value not in bound:
            raise ValueError(f"{key}: must be {bound}, got {quote(value)}")


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


def check_finite(values: dict[str, Any]) -> None:
    """Every number in ``values`` (key -> value; lists and mappings walked) finite and within int64."""
    for key, value in values.items():
        found = _bad_number(key, value)
        if found:
            where, why = found
            raise ValueError(f"{where}: {why}, got {quote(_at(value, where[len(key):]))}")


def _at(value: Any, path: str) -> Any:
    """The item of ``value`` at ``path`` (``.name`` or ``[i]`` steps, as :func:`_bad_number` writes them)."""
    for step in re.findall(r"\.([^.\[]+)|\[(\d+)\]", path):
        value = value[step[0]] if step[0] else value[int(step[1])]
    return value


def check_trains_something(args: Any) -> None:
    """``max_steps`` >= 1, or -1 (transformers' "train num_train_epochs epochs") with epochs > 0."""
    steps, epochs = args.max_steps, args.num_train_epochs
    if steps == 0 or steps < -1:
        raise ValueError(f"max_steps: must be >= 1, or -1 to train num_train_epochs epochs; got "
                          f"{quote(steps)}, which trains nothing")
    if steps == -1 and not epochs > 0:
        raise ValueError(f"num_train_epochs: must be > 0 when max_steps is -1 (unset), got "
                          f"{quote(epochs)}, which trains nothing")


# tracker name (as transformers' report_to spells it) -> (module that must import, pip install hint)
TRACKERS: dict[str, tuple[str, str]] = {
    "tensorboard": ("tensorboard", "pip install 'ictrl[tensorboard]'"),
    "wandb": ("wandb", "pip install wandb"),
    "trackio": ("trackio", "pip install trackio"),
    "mlflow": ("mlflow", "pip install mlflow"),
    "comet_ml": ("comet_ml", "pip install comet_ml"),
    "clearml": ("clearml", "pip install clearml"),
    "dvclive": ("dvclive", "pip install dvclive"),
    "swanlab": ("swanlab", "pip install swanlab"),
}


def report_to_list(value: str | Sequence[str] | None) -> list[str]:
    """transformers' ``report_to`` as a list: a list, a comma-separated string, "none"/None -> [], "all" kept."""
    if value is None:
        return []
    items = value.split(",") if isinstance(value, str) else list(value)
    return [n for n in (str(v).strip() for v in items) if n and n != "none"]


def check_trackers(value: str | Sequence[str] | None, option: str = "report_to") -> list[str]:
    """Each tracker known and its package importable; returns the list. A missing package names the install
    command (the ``tensorboard`` extra for TensorBoard)."""
    names = report_to_list(value)
    for name in names:
        if name == "all":
            continue
        if name not in TRACKERS:
            raise UserError(f"{option}: unknown tracker {name!r}{_suggest(name, TRACKERS)} "
                            f"(choose from none, all, {', '.join(TRACKERS)})")
        module, hint = TRACKERS[name]
        if importlib.util.find_spec(module) is None:
            raise MissingExtraError(f"{option}: {name} needs the {module!r} package, which is not installed: {hint}")
    return names


def check_liger(enabled: bool, option: str = "use_liger_kernel") -> None:
    """``use_liger_kernel`` in TRL 1.16's GRPOTrainer swaps in Liger's layer kernels (RMSNorm, RoPE, SwiGLU; its
    fused cross-entropy is refused by TRL), the same step up to kernel numerics; transformers imports the package
    only when training starts, after the model loaded. Checked here instead."""
    if enabled and importlib.util.find_spec("liger_kernel") is None:
        raise MissingExtraError(f"{option}: needs the liger-kernel package, which is not installed: "
                                "pip install liger-kernel (or trl's liger extra)")


def _suggest(name: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""
