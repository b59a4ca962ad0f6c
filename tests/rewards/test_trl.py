"""TRL adapters: batched signatures, conversational completions, per-row reward kinds."""

from __future__ import annotations

import pytest

from ictrl.rewards import format_reward, math_reward, trl_kind_reward, trl_reward



def test_trl_reward_strings_and_conversations() -> None:
    f = trl_reward(math_reward, gold_column="answer")
    assert f.__name__ == "math_reward"
    as_text = ["\\boxed{2}", "\\boxed{3}"]
    as_chat = [[{"role": "assistant", "content": t}] for t in as_text]
    parts = [[{"role": "assistant", "content": [{"type": "text", "text": t}]}] for t in as_text]
    for completions in (as_text, as_chat, parts):
        assert f(prompts=["p", "q"], completions=completions, answer=["2", "2"], other=[0, 0]) == [1.0, 0.0]
    with pytest.raises(ValueError, match="answer"):
        f(prompts=["p"], completions=["\\boxed{2}"], solution=["2"])
    with pytest.raises(ValueError, match="1 completions but 2"):
        f(prompts=["p"], completions=["\\boxed{2}"], answer=["2", "3"])
    with pytest.raises(TypeError, match="'completions'"):  # TRL always passes it; Python names it when missing
        f(prompts=["p"], answer=["2"])
    fmt = trl_reward(format_reward, gold_column=None, name="boxed_format")
    assert fmt.__name__ == "boxed_format"
    assert fmt(prompts=None, completions=["\\boxed{1}", "none"]) == [1.0, 0.0]


def test_trl_kind_reward_dispatches() -> None:
    f = trl_kind_reward()
    assert f.__name__ == "verifiable_reward"
    out = f(
        prompts=[""] * 4,
        completions=["\\boxed{\\frac12}", "\\boxed{\\$1,000}", "The answer is (C)", "The answer is (C)"],
        answer=["0.5", "1000", "C", "D"],
        kind=["math", "gsm8k", "choice", "choice"],
    )
    assert out == [1.0, 1.0, 1.0, 0.0]
    with pytest.raises(ValueError, match="kind"):
        f(prompts=[""], completions=["x"], answer=["1"])


