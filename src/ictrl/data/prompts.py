"""Prompt templates and :func:`build_prompt` (chat template when the tokenizer has one, else plain text)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ictrl.data.registry import Benchmark, Problem

LETTERS = "ABCDEFGHIJ"
MATH_SUFFIX = "Please reason step by step, and put your final answer within \\boxed{}."
CHOICE_SUFFIX = "Please reason step by step, and put the letter of your final answer within \\boxed{}."
PROMPT_TEMPLATES: dict[str, str] = {
    "math": "{question}\n" + MATH_SUFFIX,
    "gsm8k": "{question}\n" + MATH_SUFFIX,
    "choice": "{question}\n\n{choices}\n\n" + CHOICE_SUFFIX,
}


def user_message(problem: Problem, benchmark: Benchmark) -> str:
    """The benchmark's template filled in; choices lettered inline ("A. ...\\nB. ...")."""
    choices = "\n".join(f"{LETTERS[i]}. {c}" for i, c in enumerate(problem.choices or []))
    return benchmark.template.replace("{question}", problem.question.strip()).replace("{choices}", choices)


def build_prompt(problem: Problem, benchmark: Benchmark | str, tokenizer: Any = None) -> str:
    """The prompt text: the tokenizer's chat template (one user turn + generation prompt) when it has one,
    else the plain user message followed by a newline."""
    from ictrl.data.registry import parse_spec

    bench = parse_spec(benchmark)[0] if isinstance(benchmark, str) else benchmark
    message = user_message(problem, bench)
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": message}], tokenize=False, add_generation_prompt=True
        )
    return message + "\n"
