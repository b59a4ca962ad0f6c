"""The rewards: math, GSM8K, choice and format verdicts, and a gold round trip over the real benchmark files."""

from __future__ import annotations

import random
import re
from fractions import Fraction

import pytest

from fixtures.grader_adversarial import EXACT_CASES
from ictrl import rewards
from ictrl.rewards import choice_reward, format_reward, gsm8k_reward, math_reward, reward_stats
from ictrl.rewards.normalize import numeric, parse_number, strip_bold
from ictrl.rewards.worker import ROUNDED_GOLD_DECIMALS

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


def test_math_reward_rejects_bad_gold() -> None:
    with pytest.raises(ValueError, match="gold"):
        math_reward("\\boxed{1}", None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="gold"):
        math_reward("\\boxed{1}", "  ")
    with pytest.raises(ValueError, match="completion"):
        math_reward(b"\\boxed{1}", "1")  # type: ignore[arg-type]

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


# ------------------------------------------------------------------------------------------ forms and refusals

SCI = [  # (gold, completion): every written form of one number, both ways round
    ("8.7e8", "\\boxed{8.7 \\times 10^{8}}"),
    ("8.7e8", "\\boxed{870000000}"),
    ("8.7e8", "\\boxed{870,000,000}"),
    ("8.7e8", "\\boxed{870{,}000{,}000}"),
    ("8.7e8", "\\boxed{8.7\\cdot10^8}"),
    ("8.7 \\times 10^{8}", "\\boxed{8.7e8}"),
    ("870000000", "\\boxed{8.7e8}"),
    ("870\\,000\\,000", "The answer is $8.7 \\times 10^{8}$."),
    ("1.6 \\times 10^{-19}\\text{ C}", "\\boxed{1.6e-19}"),
    ("3 \\times 10^{8}\\ \\mathrm{m/s}", "\\boxed{3.0 \\times 10^{8}}"),
    ("10^{6}", "\\boxed{1000000}"),
    ("\\$1,080", "\\boxed{1.08 \\times 10^{3}}"),
    ("45^\\circ", "\\boxed{45}"),
    ("2e3 + x", "\\boxed{x + 2000}"),  # e-notation inside an expression reaches math-verify as 2 \times 10^{3}
]
SCI_WRONG = [
    ("8.7e8", "\\boxed{8.7 \\times 10^{9}}"),
    ("8.7e8", "\\boxed{87}"),
    ("1e-30", "\\boxed{2 \\times 10^{-30}}"),  # math-verify's 6-decimal rounding would call these equal
    ("8.7e8", "\\boxed{8.7e}"),
    ("2", "\\boxed{2\\mathrm{i}}"),  # \mathrm{i} is the imaginary unit, not a unit
]


@pytest.mark.parametrize(("gold", "completion"), SCI)
def test_scientific_notation_and_separators(gold: str, completion: str) -> None:
    assert math_reward(completion, gold) == 1.0


@pytest.mark.parametrize(("gold", "completion"), SCI_WRONG)
def test_scientific_notation_wrong_answers(gold: str, completion: str) -> None:
    assert math_reward(completion, gold) == 0.0


def test_gsm8k_reads_scientific_notation() -> None:
    assert gsm8k_reward("\\boxed{1.08 \\times 10^{3}}", "#### 1080") == 1.0
    assert gsm8k_reward("\\boxed{1.08e3}", "#### 1080") == 1.0
    assert gsm8k_reward("\\boxed{1.08e4}", "#### 1080") == 0.0


EQUIVALENT_FORMS = [  # (gold, completion, expected)
    ("\\frac{t}{m}", "\\boxed{\\frac{1}{m} t}", 1.0),  # math-verify alone read " t" as a unit (tonnes)
    ("\\frac{t}{m}", "\\boxed{t \\cdot \\frac{1}{m}}", 1.0),
    ("\\frac{1}{m} t", "\\boxed{\\frac{t}{m}}", 1.0),
    ("\\frac{t}{m}", "\\boxed{\\frac{1}{m}}", 0.0),
    ("E_1, E_2", "\\boxed{E_{1},E_{2}}", 1.0),  # E is Euler's number to latex2sympy: no parse, string compare
    ("E_{1},E_{2}", "\\boxed{E_1, E_2}", 1.0),
    ("E_1, E_2", "\\boxed{E_{1},E_{3}}", 0.0),
    ("x^{2}+y_{1}", "\\boxed{y_1 + x^2}", 1.0),
]


def test_equivalence_survives_commutation_and_braces() -> None:
    expected = [e for _, _, e in EQUIVALENT_FORMS]
    for guard in ("process", "inline"):  # both guards make the same math-verify calls
        rewards.configure(guard=guard)
        assert [math_reward(c, g) for g, c, _ in EQUIVALENT_FORMS] == expected, guard


def test_refused_box_scores_zero() -> None:
    # "\boxed{\sqrt{\sqrt{...2}}}" (12 levels) must not score 1.0 against gold 2: the box is refused for its
    # nesting, and the old extractor fell back to the last number inside it.
    deep = "\\boxed{" + "\\sqrt{" * 12 + "2" + "}" * 12 + "}"
    assert math_reward(deep, "2") == 0.0
    assert math_reward("First \\boxed{2}, finally " + deep, "2") == 0.0  # nor back to an earlier box
    assert math_reward("The answer is 2. " + deep, "2") == 0.0  # nor to "the answer is"
    assert math_reward("\\boxed{" + "\\sqrt{" * 11 + "2" + "}" * 11 + "}", "\\sqrt{" * 11 + "2" + "}" * 11) == 1.0


def test_last_number_fallback_ignores_random_bytes() -> None:
    # The last-number fallback must not credit random bytes. Graded against the very number
    # the fallback would find in each string, so every credit is a false one.
    rng = random.Random(17)
    number = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?(?:/\d+)?")
    credited, tried = [], 0
    for i in range(650):
        raw = bytes(rng.randrange(256) for _ in range(rng.randrange(32, 2048)))
        text = raw.decode("utf-8", errors=("replace", "surrogateescape", "ignore")[i % 3])
        found = number.findall(text)
        if not found:
            continue
        tried += 1
        gold = found[-1].replace(",", "")
        if math_reward(text, gold) or gsm8k_reward(text, gold):
            credited.append(i)
    assert tried > 500
    assert not credited, f"{len(credited)} random-byte strings credited: {credited[:10]}"
    assert math_reward("we get 3, then 1,024 apples", "1024") == 1.0  # prose keeps its fallback


# ------------------------------------------------------------------ decimals decided exactly, bold, long exponents


@pytest.mark.parametrize(("family", "answer", "gold", "expected"), EXACT_CASES)
def test_exact_cases(family: str, answer: str, gold: str, expected: float) -> None:
    # the same cases close the corpus benchmark (bench/bench_grader.py)
    assert math_reward(f"so \\boxed{{{answer}}}", gold) == expected, family


def test_exact_cases_agree_between_guards() -> None:
    inline_needed = [(a, g, e) for _, a, g, e in EXACT_CASES if numeric(strip_bold(a)) is None]
    assert len(inline_needed) > 10  # cases math-verify decides, not the fast path
    rewards.configure(guard="inline")
    assert [math_reward(f"\\boxed{{{a}}}", g) for a, g, _ in inline_needed] == [e for _, _, e in inline_needed]


def test_rounded_gold_needs_six_decimals_and_an_answer_without_one() -> None:
    assert ROUNDED_GOLD_DECIMALS == 6
    assert math_reward("\\boxed{\\frac{1}{3}}", "0.333333") == 1.0  # 6 decimals: rounded
    assert math_reward("\\boxed{\\frac{1}{3}}", "0.33333") == 0.0  # 5: exact
    assert math_reward("\\boxed{\\frac{1}{3}}", "0.3333333333333333333333") == 1.0  # every decimal counts
    assert math_reward("\\boxed{\\frac{1}{3}}", "0.3333333333333333333334") == 0.0
    assert math_reward("\\boxed{\\frac{1}{3}+0}", "0.333333") == 1.0
    assert math_reward("\\boxed{0.3333333+0}", "0.333333") == 0.0  # a decimal in the answer: exact


def test_long_exponents_are_compared_without_writing_the_number_out() -> None:
    # 10^(10^18) has 10^18 digits: only a comparison of (mantissa, exponent) can decide these
    huge = "9" * 18
    rewards.reset_reward_stats()
    assert math_reward(f"\\boxed{{1e{huge}}}", f"10^{{{huge}}}") == 1.0
    assert math_reward(f"\\boxed{{2.5e-{huge}}}", f"25 \\times 10^{{-{int(huge) + 1}}}") == 1.0
    assert math_reward(f"\\boxed{{1e{huge}}}", f"10^{{{int(huge) - 1}}}") == 0.0
    assert reward_stats()["fast_path"] == 3 and reward_stats()["verify_calls"] == 0
    assert numeric(f"1e{huge}").value is None  # never materialised
    assert parse_number(f"1e{huge}") is None and gsm8k_reward(f"\\boxed{{1e{huge}}}", "1") == 0.0
    # a 7-digit exponent against a gold of another shape is refused before math-verify (it would write it out)
    assert math_reward("\\boxed{1e1234567}", "\\infty") == 0.0 and reward_stats()["rejected"] == 1


@pytest.mark.parametrize(("forms", "key"), [
    (["0.125", "1.25e-1", "125 \\times 10^{-3}", ".125"], (Fraction(125), -3)),
    (["1000", "10^{3}", "0.001e6", "1{,}000", "1e3"], (Fraction(1), 3)),
    (["-0.5", "-5e-1", "-0.50"], (Fraction(-5), -1)),
    (["0", "0.0e5", "0 \\times 10^{-99999}"], (Fraction(0), 0)),
    (["1e99999", "10^{99999}", "0.1e100000"], (Fraction(1), 99999)),
])
def test_numeric_key_is_one_per_value(forms: list[str], key: tuple[Fraction, int]) -> None:
    assert [numeric(f).key() for f in forms] == [key] * len(forms)  # type: ignore[union-attr]


def test_bold_is_dropped() -> None:
    assert strip_bold("\\mathbf{\\boldsymbol{0.5}}") == "0.5"
    assert strip_bold("\\textbf {x+1}") == "x+1"
    assert strip_bold("2\\bm{x}+\\mathbf{y}") == "2{x}+{y}"  # a group inside an expression stays a group
    assert strip_bold("\\mathbf{a}+\\mathbf{b}") == "{a}+{b}"  # two groups, not one
    assert strip_bold("\\mathrm{x}") == "\\mathrm{x}"
    assert math_reward("\\boxed{2\\mathbf{x}+1}", "2x+1") == 1.0


# Invisible format characters (Unicode category Cf) a gold pasted from a web page or a PDF carries: each reads as
# nothing, as NBSP reads as a space.
INVISIBLE = ["\u200b", "\ufeff", "\u200e", "\u00ad", "\u200c", "\u2060", "\u2061", "\u202e", "\U000e0041"]


@pytest.mark.parametrize("char", INVISIBLE + ["\u00a0"])
def test_a_gold_with_an_invisible_character_matches_its_clean_answer(char: str) -> None:
    assert math_reward("so \\boxed{12}", f"1{char}2") == 1.0
    assert math_reward("so \\boxed{12}", f"{char}12{char}") == 1.0
    assert math_reward("\\boxed{\\frac{1}{2}}", f"\\frac{{1}}{{{char}2}}") == 1.0
    assert math_reward("\\boxed{x+1}", f"x+{char}1") == 1.0
    assert gsm8k_reward("The answer is 1080", f"#### 1{char}080") == 1.0
    assert choice_reward("(B)", f"{char}B") == 1.0
    assert math_reward(f"so \\boxed{{1{char}2}}", "12") == 1.0  # a model's answer is read alike
    assert rewards.verify_answer(f"1{char}2", "12")
    assert math_reward("so \\boxed{13}", f"1{char}2") == 0.0  # still the answer it was


def test_every_format_character_is_dropped_and_nothing_else() -> None:
    import sys
    import unicodedata

    from ictrl.rewards.normalize import first_format_char, strip_format_chars

    cf = "".join(chr(c) for c in range(sys.maxunicode + 1) if unicodedata.category(chr(c)) == "Cf")
    assert strip_format_chars(f"a{cf}b") == "ab" and first_format_char(f"x{cf[-1]}") == cf[-1]
    kept = "é\u00a0ß\u0301漢🙂\u2028x"  # letters, NBSP, a combining accent, an emoji, a line separator
    assert strip_format_chars(kept) == kept and first_format_char(kept) is None
