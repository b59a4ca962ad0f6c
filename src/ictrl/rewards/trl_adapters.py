"""TRL adapters: rewards in TRL's batched signature ``(prompts, completions, **columns) -> list[float]``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ictrl.errors import UserError, did_you_mean, failure, quote
from ictrl.rewards.graders import choice_reward, format_reward, gsm8k_reward, math_reward


def completion_text(completion: str | Sequence[dict[str, Any]]) -> str:
    """Plain text of a TRL completion: a string, or a conversational list of {"role", "content"} messages
    (the content of the last message; content parts of type "text" are joined)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Sequence) and completion and isinstance(completion[-1], dict):
        content = completion[-1].get("content", "")
        if isinstance(content, str):
            return content
        if isinstance(content, Sequence):
            return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    if isinstance(completion, Sequence) and not completion:
        return ""
    raise ValueError(f"completions: expected str or list of messages, got {type(completion).__name__}")


def trl_reward(
    fn: Callable[..., float], gold_column: str | None = "answer", name: str | None = None
) -> Callable[..., list[float]]:
    """Wrap ``fn(completion, gold) -> float`` as a TRL reward ``f(prompts, completions, **columns) -> list``.

    The gold comes from the dataset column ``gold_column`` (TRL passes every extra column as a keyword); with
    ``gold_column=None`` ``fn`` takes the completion only (e.g. :func:`format_reward`). ``__name__`` is
    ``name`` or ``fn.__name__``: TRL logs each reward under it.
    """
    label = name or getattr(fn, "__name__", "reward")

    def reward(prompts: Sequence[Any] | None, completions: Sequence[Any], **kwargs: Any) -> list[float]:
        texts = [completion_text(c) for c in completions]
        if gold_column is None:
            return [float(fn(t)) for t in texts]
        if gold_column not in kwargs:
            raise ValueError(f"{label}: gold column {gold_column!r} missing; got columns {sorted(kwargs)}")
        golds = kwargs[gold_column]
        if len(golds) != len(texts):
            raise ValueError(f"{label}: {len(texts)} completions but {len(golds)} values in {gold_column!r}")
        return [float(fn(t, g)) for t, g in zip(texts, golds)]

    reward.__name__ = reward.__qualname__ = label
    return reward


make_trl_reward = trl_reward

REWARDS: dict[str, Callable[..., float]] = {
    "math": math_reward,
    "gsm8k": gsm8k_reward,
    "choice": choice_reward,
    "format": format_reward,
}


def get_reward(kind: str) -> Callable[..., float]:
    """The reward for a benchmark kind ("math", "gsm8k", "choice") or "format"."""
    if kind not in REWARDS:
        raise ValueError(f"kind: unknown reward {kind!r}; choose from {sorted(REWARDS)}")
    return REWARDS[kind]


def trl_kind_reward(
    gold_column: str = "answer", kind_column: str = "kind", name: str = "verifiable_reward"
) -> Callable[..., list[float]]:
    """A TRL reward for mixed data sets: each row's ``kind_column`` ("math", "gsm8k", "choice") picks the
    reward applied to it (see :func:`ictrl.data.to_trl_dataset`, which writes that column)."""

    def reward(prompts: Sequence[Any] | None, completions: Sequence[Any], **kwargs: Any) -> list[float]:
        for col in (gold_column, kind_column):
            if col not in kwargs or len(kwargs[col]) != len(completions):
                raise ValueError(f"{name}: column {col!r} missing or not one value per completion")
        return [
            float(get_reward(k)(completion_text(c), g))
            for c, g, k in zip(completions, kwargs[gold_column], kwargs[kind_column])
        ]

    reward.__name__ = reward.__qualname__ = name
    return reward


def import_reward(spec: str) -> Callable[..., Any]:
    """The reward function ``module:function`` (or ``module.function``) names, imported. Raises
    :class:`UserError` in one line when the module fails to import (whatever it raises, ``SystemExit`` included:
    the exception, its file and line), lacks the name, or the name is not callable."""
    import importlib

    module, _, attr = spec.partition(":") if ":" in spec else spec.rpartition(".")
    try:
        fn = getattr(importlib.import_module(module), attr)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - a user's module: whatever its import raises, named
        raise UserError(f"cannot import {spec!r}: {failure(exc)}") from None
    if not callable(fn):
        raise UserError(f"{spec!r} is {type(fn).__name__} {quote(fn, 80)}, not a function; a reward is a function "
                        "(prompts, completions, **columns) -> list of floats")
    return fn


# trl grpo's reward names (trl/scripts/grpo.py), with the values it uses.
TRL_REWARDS = ("accuracy_reward", "reasoning_accuracy_reward", "think_format_reward", "get_soft_overlong_punishment")


def reward_function(name: str, gold_column: str = "answer") -> Callable[..., Any]:
    """The TRL reward function a reward name gives: ``verifiable`` (each row's ``kind`` column picks the math, gsm8k
    or choice reward), one of :data:`REWARDS` wrapped by :func:`trl_reward`, one of ``trl grpo``'s names
    (:data:`TRL_REWARDS`, with the values it uses), or a ``module:function`` / dotted ``module.function`` with TRL's
    signature, imported as it is (:func:`import_reward`). Raises :class:`UserError` in one line otherwise."""
    if name == "verifiable":
        return trl_kind_reward(gold_column=gold_column, name="verifiable")
    if name in TRL_REWARDS:
        import trl.rewards

        if name == "get_soft_overlong_punishment":
            return trl.rewards.get_soft_overlong_punishment(max_completion_len=1280, soft_punish_cache=256)
        return getattr(trl.rewards, name)
    if ":" in name or "." in name:
        return import_reward(name)
    if name in REWARDS:
        return trl_reward(REWARDS[name], gold_column=None if name == "format" else gold_column, name=name)
    choices = ["verifiable", *sorted(REWARDS), *TRL_REWARDS]
    raise UserError(f"unknown reward {name!r}; choose from {choices} or give module:function"
                    f"{did_you_mean(name, choices)}")
