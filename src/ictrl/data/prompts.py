"""Prompt templates, the user message of a problem, and the chat-template step. Imports nothing from the rest of
``ictrl.data`` (``ictrl.data.registry.build_prompt`` resolves a benchmark name and calls these)."""

from __future__ import annotations

from typing import Any, Protocol


class _Question(Protocol):
    question: str
    choices: list[str] | None


class _Templated(Protocol):
    template: str

LETTERS = "ABCDEFGHIJ"
MATH_SUFFIX = "Please reason step by step, and put your final answer within \\boxed{}."
CHOICE_SUFFIX = "Please reason step by step, and put the letter of your final answer within \\boxed{}."
PROMPT_TEMPLATES: dict[str, str] = {
    "math": "{question}\n" + MATH_SUFFIX,
    "gsm8k": "{question}\n" + MATH_SUFFIX,
    "choice": "{question}\n\n{choices}\n\n" + CHOICE_SUFFIX,
}


def user_message(problem: _Question, benchmark: _Templated) -> str:
    """The benchmark's template filled in; choices lettered inline ("A. ...\\nB. ...")."""
    choices = "\n".join(f"{LETTERS[i]}. {c}" for i, c in enumerate(problem.choices or []))
    return benchmark.template.replace("{question}", problem.question.strip()).replace("{choices}", choices)


def chat_prompt(message: str, tokenizer: Any = None) -> str:
    """The prompt text: the tokenizer's chat template (one user turn + generation prompt) when it has one, else
    ``message`` followed by a newline."""
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": message}], tokenize=False, add_generation_prompt=True
        )
    return message + "\n"
