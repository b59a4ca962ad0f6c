"""Rewards: extraction, equivalence, adversarial inputs, thread/process safety, TRL adapters, real data."""

from __future__ import annotations

import multiprocessing
import random
import re
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import pytest

from fixtures.grader_adversarial import adversarial_cases
from ictrl import rewards
from ictrl.rewards import (
    MathExtractor,
    choice_reward,
    extract_choice,
    format_reward,
    gsm8k_reward,
    last_boxed,
    math_reward,
    reward_stats,
    trl_kind_reward,
    trl_reward,
)


@pytest.fixture(autouse=True)
def _default_config():
    rewards.configure(guard="process", timeout=3.0, workers=1, cache_size=65536)
    yield
    rewards.configure(guard="process", timeout=3.0, workers=1, cache_size=65536)


# ---------------------------------------------------------------------------------------------- extraction


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("first \\boxed{1} then \\boxed{\\frac{2}{3}}.", "\\frac{2}{3}"),
        ("\\fbox{x^{2}+1}", "x^{2}+1"),
        ("nested \\boxed{\\left\\{1, 2\\right\\}}", "\\left\\{1, 2\\right\\}"),
        ("\\boxed 7 is it", "7"),
        ("ok \\boxed{5} but truncated \\boxed{\\frac{1}{", "5"),  # unbalanced last box -> previous box
        ("no box at all", None),
    ],
)
def test_last_boxed(text: str, expected: str | None) -> None:
    assert last_boxed(text) == expected


def test_extractor_order_and_fallbacks() -> None:
    ex = MathExtractor()
    assert ex.extract("So the answer is $\\frac{3}{4}$. Done") == "\\frac{3}{4}"
    assert ex.extract("Final Answer: The final answer is 12. I hope it is correct.") == "12"
    assert ex.extract("answer: 3.5") == "3.5"
    assert ex.extract("we get 3, then 1,024 apples") == "1024"
    text = "The answer is 9. Check: \\boxed{8}"
    assert ex.extract(text) == "8"
    assert MathExtractor(order=("answer_is", "boxed")).extract(text) == "9"
    assert MathExtractor(order=("boxed",)).extract("the answer is 4") is None
    with pytest.raises(ValueError, match="order"):
        MathExtractor(order=("boxed", "nonsense"))


# ------------------------------------------------------------------------------------------- math_reward


@pytest.mark.parametrize(
    ("completion", "gold", "expected"),
    [
        ("Thus \\boxed{\\frac{1}{2}}.", "0.5", 1.0),
        ("Thus \\boxed{0.5}.", "\\frac12", 1.0),
        ("The answer is $\\dfrac{1}{2}$.", "\\frac{1}{2}", 1.0),
        ("\\boxed{1,000}", "1000", 1.0),
        ("\\boxed{x^2 + 2x + 1}", "(x+1)^2", 1.0),
        ("\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}", "\\left( 3, \\frac{\\pi}{2} \\right)", 1.0),
        ("\\boxed{(3, \\pi/2)}", "\\left( 3, \\frac{\\pi}{2} \\right)", 1.0),
        ("\\boxed{12}", "13", 0.0),
        ("\\boxed{\\frac{1}{3}}", "0.5", 0.0),
        ("\\boxed{x+1}", "x+2", 0.0),
        ("I am not sure.", "5", 0.0),
        ("", "5", 0.0),
    ],
)
def test_math_reward(completion: str, gold: str, expected: float) -> None:
    assert math_reward(completion, gold) == expected


def test_math_reward_guards_agree_and_count() -> None:
    pairs = [("\\boxed{\\frac{1}{2}}", "0.5"), ("\\boxed{\\sqrt{2}/2}", "\\frac{\\sqrt2}{2}"), ("\\boxed{3}", "\\pi")]
    rewards.configure(cache_size=0)
    rewards.reset_reward_stats()
    via_process = [math_reward(c, g) for c, g in pairs]
    stats = reward_stats()
    assert stats["calls"] == 3 and stats["verify_calls"] == 3 and stats["timeouts"] == 0
    rewards.configure(guard="inline", cache_size=0)
    assert [math_reward(c, g) for c, g in pairs] == via_process == [1.0, 1.0, 0.0]


def test_math_reward_cache_hits() -> None:
    rewards.reset_reward_stats()
    for _ in range(3):
        assert math_reward("\\boxed{\\frac{2}{4}}", "0.5") == 1.0
    assert reward_stats()["cache_hits"] == 2


def test_math_reward_rejects_bad_gold() -> None:
    with pytest.raises(ValueError, match="gold"):
        math_reward("\\boxed{1}", None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="gold"):
        math_reward("\\boxed{1}", "  ")
    with pytest.raises(ValueError, match="completion"):
        math_reward(b"\\boxed{1}", "1")  # type: ignore[arg-type]


@pytest.mark.parametrize("name", sorted(adversarial_cases()))
def test_adversarial_inputs_bounded(name: str) -> None:
    completion = adversarial_cases()[name]
    math_reward("\\boxed{1}", "\\frac{1}{2}")  # worker started outside the timing
    t0 = time.perf_counter()
    result = math_reward(completion, "\\frac{1}{2}")
    elapsed = time.perf_counter() - t0
    assert result in (0.0, 1.0)
    assert elapsed < 5.0, f"{name}: {elapsed:.2f}s"
    assert gsm8k_reward(completion, "5") in (0.0, 1.0)
    assert choice_reward(completion, "A") in (0.0, 1.0)
    assert format_reward(completion) in (0.0, 1.0)


def test_timeout_kills_worker_and_counts() -> None:
    # Not caught by the pre-checks: sympy evaluates (9^9)^(9^9) exactly, so only the deadline stops it.
    slow = "\\boxed{(9^9)^{(9^9)}}"
    assert not rewards._explosive(slow[7:-1], "5")
    rewards.configure(timeout=1.0)
    math_reward("\\boxed{1}", "\\frac{1}{2}")
    rewards.reset_reward_stats()
    t0 = time.perf_counter()
    assert math_reward(slow, "\\frac{1}{2}") == 0.0
    assert time.perf_counter() - t0 < 3.0
    stats = reward_stats()
    assert stats["timeouts"] == 1 and stats["worker_starts"] >= 1
    # the replacement worker grades correctly
    assert math_reward("\\boxed{\\frac{2}{4}}", "\\frac{1}{2}") == 1.0


_PAIRS = [
    (f"so \\boxed{{{a}}}", g)
    for a, g in [
        ("\\frac{1}{2}", "0.5"), ("2", "3"), ("\\sqrt{8}", "2\\sqrt{2}"), ("x^2", "x\\cdot x"), ("(1,2)", "(2,1)"),
        ("\\pi", "3.14159"), ("10\\%", "0.1"), ("-4", "-4.0"), ("\\infty", "\\infty"), ("\\{1,2\\}", "\\{2,1\\}"),
    ]
]


def _grade_all(pairs: list[tuple[str, str]]) -> list[float]:
    return [math_reward(c, g) for c, g in pairs]


def test_thread_safety() -> None:
    rewards.configure(cache_size=0, workers=2)
    sequential = _grade_all(_PAIRS)
    assert sum(sequential) >= 5  # the list mixes right and wrong answers
    with ThreadPoolExecutor(max_workers=4) as pool:
        threaded = list(pool.map(lambda p: math_reward(*p), _PAIRS * 3))
    assert threaded == sequential * 3


@pytest.mark.integration
def test_forked_process_pool() -> None:
    rewards.configure(cache_size=0)
    sequential = _grade_all(_PAIRS)  # the parent's worker exists before the fork: children must not share it
    with ProcessPoolExecutor(max_workers=2, mp_context=multiprocessing.get_context("fork")) as pool:
        forked = list(pool.map(_grade_all, [_PAIRS, _PAIRS]))
    assert forked == [sequential, sequential]


@pytest.mark.integration
def test_daemonic_spawned_pool() -> None:
    # multiprocessing.Pool workers are daemonic (they may not start multiprocessing children) and "spawn"
    # re-imports everything: the plain-subprocess verify worker must still work there.
    rewards.configure(cache_size=0)
    sequential = _grade_all(_PAIRS)
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        spawned = pool.map(_grade_all, [_PAIRS, _PAIRS])
    assert spawned == [sequential, sequential]


# ------------------------------------------------------------------------------------- gsm8k, choice, format


@pytest.mark.parametrize(
    ("completion", "gold", "expected"),
    [
        ("She makes \\boxed{18} dollars.", "Janet sells 9 eggs.\n#### 18", 1.0),
        ("The answer is $18.", "18", 1.0),
        ("The answer is \\$18.00.", "18", 1.0),
        ("\\boxed{18.0}", "18", 1.0),
        ("\\boxed{\\$1,080}", "#### 1,080", 1.0),
        ("total: 1080 dollars", "1,080", 1.0),
        ("\\boxed{18 \\text{ dollars}}", "18", 1.0),
        ("\\boxed{-3}", "-3", 1.0),
        ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("The answer is 17.", "18", 0.0),
        ("\\boxed{180}", "18", 0.0),
        ("\\boxed{1.8}", "18", 0.0),
        ("no numbers here", "18", 0.0),
    ],
)
def test_gsm8k_reward(completion: str, gold: str, expected: float) -> None:
    assert gsm8k_reward(completion, gold) == expected


def test_gsm8k_reward_bad_gold() -> None:
    with pytest.raises(ValueError, match="gold"):
        gsm8k_reward("\\boxed{1}", "#### none")


@pytest.mark.parametrize(
    ("completion", "letter"),
    [
        ("The answer is (B).", "B"),
        ("Answer: C", "C"),
        ("answer: (D)", "D"),
        ("so the answer is E", "E"),
        ("\\boxed{B}", "B"),
        ("\\boxed{\\text{(C)}}", "C"),
        ("The correct answer is option J.", "J"),
        ("**Answer:** A", "A"),
        ("The answer is \\text{D}", "D"),
        ("(A) looks wrong, (B) looks wrong; so the answer is (C). Checking (A) again.", "C"),
        ("Answer: A. Wait, no. The answer is B.", "B"),
        ("Between (A) and (D) I pick (D)", "D"),
        ("B", "B"),
        ("the answer is Alice", None),
        ("a bit unclear", None),
    ],
)
def test_extract_choice(completion: str, letter: str | None) -> None:
    assert extract_choice(completion) == letter


def test_choice_reward() -> None:
    assert choice_reward("The answer is (B).", "B") == 1.0
    assert choice_reward("The answer is (B).", "b") == 1.0
    assert choice_reward("The answer is (B).", "C") == 0.0
    assert choice_reward("nothing", "A") == 0.0
    with pytest.raises(ValueError, match="gold_letter"):
        choice_reward("The answer is (B).", "K")


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("Reasoning... so $\\boxed{5}$.", 1.0),
        ("\\[\\boxed{\\frac{1}{2}}\\]", 1.0),
        ("no box", 0.0),
        ("\\boxed{1} and \\boxed{2}", 0.0),
        ("\\boxed{5} because of many reasons", 0.0),
        ("\\boxed{}", 0.0),
        ("\\boxed{5", 0.0),
    ],
)
def test_format_reward(completion: str, expected: float) -> None:
    assert format_reward(completion) == expected


# ------------------------------------------------------------------------------------------------- TRL


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


# ------------------------------------------------------------------------------------------- real data


def _completion(kind: str, gold: str) -> str:
    if kind == "choice":
        return f"Let me think. The answer is ({gold})."
    return f"Let me think step by step. The answer is \\boxed{{{gold}}}."


def gold_roundtrip(problems: list, kind: str) -> tuple[list, list, int]:
    """(right answers graded wrong, other problems' golds graded right, number of wrong-gold checks).

    The wrong gold is the next problem's whose gold differs after removing whitespace."""
    reward = rewards.get_reward(kind)
    key = [re.sub(r"\s+", "", p.gold) for p in problems]
    right_fail, wrong_fail, checks = [], [], 0
    for i, p in enumerate(problems):
        if reward(_completion(kind, p.gold), p.gold) != 1.0:
            right_fail.append((p.id, p.gold))
        other = next((problems[(i + j) % len(problems)] for j in range(1, len(problems))
                      if key[(i + j) % len(problems)] != key[i]), None)
        if other is None:
            continue
        checks += 1
        if reward(_completion(kind, other.gold), p.gold) != 0.0:
            wrong_fail.append((p.id, p.gold, other.gold))
    return right_fail, wrong_fail, checks


ARC_ICL = ("jsonl:{root}/arc_challenge/arc_challenge.jsonl"
           ":kind=choice:question_field=query:answer_field=gold:choices_field=choices")
FAST_FILES = ["gsm8k", "gsm8k_train", "aime23", "aime24", "aime25", "mmlu_stem", "commonsenseqa", "arc_challenge",
              ARC_ICL]


def _check_roundtrip(spec: str, shared_data, sample: int | None = None) -> None:
    from ictrl.data import load_problems, parse_spec

    spec = spec.format(root=shared_data)
    problems = load_problems(spec, data_root=shared_data)
    if sample is not None:
        problems = random.Random(0).sample(problems, sample)
    kind = parse_spec(spec)[0].kind
    right_fail, wrong_fail, checks = gold_roundtrip(problems, kind)
    assert checks >= 0.9 * len(problems)
    assert len(right_fail) <= 0.01 * len(problems), right_fail[:20]
    assert len(wrong_fail) <= 0.01 * checks, wrong_fail[:20]


@pytest.mark.parametrize("spec", FAST_FILES)
def test_gold_roundtrip_real_data(spec: str, shared_data) -> None:
    _check_roundtrip(spec, shared_data)


@pytest.mark.integration
@pytest.mark.parametrize(("spec", "sample"), [("math500", None), ("math_train", 1000)])
def test_gold_roundtrip_real_data_math(spec: str, sample: int | None, shared_data) -> None:
    _check_roundtrip(spec, shared_data, sample)
