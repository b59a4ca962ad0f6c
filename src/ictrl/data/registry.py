"""The benchmark registry: :class:`Problem`, :class:`Benchmark`, ``BENCHMARKS`` and spec parsing."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, Literal

from annotated_types import Interval

from ictrl.data.prompts import LETTERS, PROMPT_TEMPLATES, chat_prompt, user_message
from ictrl.rewards import get_reward
from ictrl.validation import AT_LEAST_ONE, NON_NEGATIVE, check_fields

Kind = Literal["math", "gsm8k", "choice"]


@dataclass
class Problem:
    """One benchmark item. ``gold`` is the final answer (a letter for multiple choice); ``meta`` holds
    the benchmark name and source fields such as level, subject or the full reference solution."""

    id: str
    question: str
    gold: str
    choices: list[str] | None = None
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Benchmark:
    """A registry entry. Field lists hold candidate keys tried in order (dotted paths reach nested keys)."""

    name: str
    kind: Kind
    hub_id: str | None = None
    hub_config: str | None = None
    hub_split: str = "test"
    local_path: str | None = None  # relative to the data root
    question_field: tuple[str, ...] = ("problem", "question")
    answer_field: tuple[str, ...] = ("answer",)
    choices_field: tuple[str, ...] = ()
    id_field: tuple[str, ...] = ("id", "unique_id")
    meta_fields: tuple[str, ...] = ()
    prompt_template: str | None = None  # None: PROMPT_TEMPLATES[kind]
    adapter: Callable[[dict[str, Any]], dict[str, Any]] | None = None  # rewrites a raw row first
    row_filter: Callable[[dict[str, Any]], bool] | None = None  # keeps a raw row (after the adapter)
    levels: tuple[int, ...] | None = None  # MATH levels to keep
    skip_missing_gold: bool = False  # drop rows whose gold is null or "" (known holes: 4 rows of math_train)
    # Generation defaults of `ictrl eval` for this benchmark (flags override them; the result file records them).
    max_new_tokens: Annotated[int, AT_LEAST_ONE] = 1024
    temperature: Annotated[float, NON_NEGATIVE] = 0.6
    top_p: Annotated[float, Interval(gt=0, le=1)] = 0.95

    def __post_init__(self) -> None:
        check_fields(self, types=False, where=f"benchmark {self.name!r}: ", sentence=True)
        if self.hub_id is None and self.local_path is None:
            raise ValueError(f"benchmark {self.name!r}: needs a hub_id or a local_path")
        if self.kind == "choice" and not self.choices_field and self.adapter is None:
            raise ValueError(f"benchmark {self.name!r}: a choice benchmark needs choices_field")

    @property
    def generation(self) -> dict[str, Any]:
        """The evaluation sampling defaults: ``{"max_new_tokens", "temperature", "top_p"}``."""
        return {"max_new_tokens": self.max_new_tokens, "temperature": self.temperature, "top_p": self.top_p}

    @property
    def reward(self) -> Callable[..., float]:
        """``fn(completion, gold) -> float`` for this benchmark's kind."""
        return get_reward(self.kind)

    @property
    def template(self) -> str:
        return self.prompt_template or PROMPT_TEMPLATES[self.kind]


# ----------------------------------------------------------------------------------------------------------
# Source-specific adapters
# ----------------------------------------------------------------------------------------------------------


def _gpqa_adapter(row: dict[str, Any]) -> dict[str, Any]:
    """GPQA stores the correct answer first; shuffle the four options with a seed derived from the question
    so the gold letter is uniform and stable across runs and machines. A missing column is a ``KeyError`` naming
    it, which ``row_to_problem`` reports with the row."""
    options = [row["Correct Answer"]] + [row[f"Incorrect Answer {i}"] for i in (1, 2, 3)]
    question = row["Question"]
    order = list(range(4))
    random.Random(int(hashlib.sha256(str(question).encode()).hexdigest()[:16], 16)).shuffle(order)
    return {
        "id": row.get("Record ID"),
        "question": question,
        "choices": [str(options[i]).strip() for i in order],
        "answer": LETTERS[order.index(0)],
        "subdomain": row.get("Subdomain"),
    }


def _arc_local_adapter(row: dict[str, Any]) -> dict[str, Any]:
    """The ARC test.jsonl copy has one column per label ("A".."E" or "1".."4") and a "label" list."""
    if "label" in row and isinstance(row["label"], list) and "choices" not in row:
        row = dict(row)
        row["choices"] = {"label": row["label"], "text": [row.get(str(lab)) for lab in row["label"]]}
    return row


BENCHMARKS: dict[str, Benchmark] = {}


def register_benchmark(bench: Benchmark) -> Benchmark:
    if bench.name in BENCHMARKS:
        raise ValueError(f"benchmark {bench.name!r} is already registered")
    BENCHMARKS[bench.name] = bench
    return bench


# Generation defaults (choices; the papers' evaluation sampling is unpublished, docs/method.md §6): temperature 0.6 and
# top_p 0.95 everywhere (the DeepSeek-R1 / Qwen reasoning-eval convention for pass@k); new-token budgets long
# enough that a correct chain of thought is not cut: 4096 for competition math (MATH-500 solutions of Qwen2.5
# base models run past 1024 tokens; AIME longer), 1024 for GSM8K and the short multiple-choice sets, 2048 for
# GPQA (graduate-level reasoning before the letter).
MATH_TOKENS = 4096
for _b in (
    Benchmark("math500", "math", "HuggingFaceH4/MATH-500", local_path="math500/test.jsonl",
              meta_fields=("subject", "level"), max_new_tokens=MATH_TOKENS),
    Benchmark("gsm8k", "gsm8k", "openai/gsm8k", "main", local_path="gsm8k/test.jsonl",
              question_field=("question",)),
    Benchmark("gsm8k_train", "gsm8k", "openai/gsm8k", "main", "train", local_path="gsm8k/train.jsonl",
              question_field=("question",)),
    Benchmark("math_train", "math", "DigitalLearningGmbH/MATH-lighteval", hub_split="train",
              local_path="math_train/math.json", meta_fields=("type", "level", "difficulty"), skip_missing_gold=True,
              max_new_tokens=MATH_TOKENS),
    Benchmark("aime23", "math", "AI-MO/aimo-validation-aime", hub_split="train", local_path="aime23/test.jsonl",
              row_filter=lambda r: "url" not in r or "2023_AIME" in str(r["url"]), max_new_tokens=MATH_TOKENS),
    Benchmark("aime24", "math", "HuggingFaceH4/aime_2024", hub_split="train", local_path="aime24/test.jsonl",
              max_new_tokens=MATH_TOKENS),
    Benchmark("aime25", "math", "math-ai/aime25", local_path="aime25/test.jsonl", max_new_tokens=MATH_TOKENS),
    Benchmark("amc23", "math", "math-ai/amc23", question_field=("question", "problem"), max_new_tokens=MATH_TOKENS),
    Benchmark("minerva_math", "math", "math-ai/minervamath", question_field=("question", "problem"),
              max_new_tokens=MATH_TOKENS),
    Benchmark("olympiadbench", "math", "math-ai/olympiadbench", question_field=("question", "problem"),
              answer_field=("final_answer", "answer"), max_new_tokens=MATH_TOKENS),
    Benchmark("mmlu_stem", "choice", "TIGER-Lab/MMLU-STEM", local_path="mmlu_stem/test.jsonl",
              question_field=("question",), choices_field=("choices",), meta_fields=("type", "subject")),
    Benchmark("gpqa_diamond", "choice", "Idavidrein/gpqa", "gpqa_diamond", "train",
              question_field=("question",), choices_field=("choices",), adapter=_gpqa_adapter,
              meta_fields=("subdomain",), max_new_tokens=2048),
    Benchmark("commonsenseqa", "choice", "tau/commonsense_qa", hub_split="validation",
              local_path="commonsenseqa/dev_rand_split.jsonl", question_field=("question.stem", "question"),
              answer_field=("answerKey",), choices_field=("question.choices", "choices")),
    Benchmark("arc_challenge", "choice", "allenai/ai2_arc", "ARC-Challenge", local_path="arc_challenge/test.jsonl",
              question_field=("question",), answer_field=("answer", "answerKey"), choices_field=("choices",),
              adapter=_arc_local_adapter),
):
    register_benchmark(_b)


def get_benchmark(name: str) -> Benchmark:
    if name not in BENCHMARKS:
        raise ValueError(f"benchmark: unknown name {name!r}; known: {sorted(BENCHMARKS)} or 'jsonl:PATH'")
    return BENCHMARKS[name]


def parse_spec(spec: str) -> tuple[Benchmark, str | None]:
    """A registry entry (with ``:key=value`` options applied) and, for ``jsonl:PATH``, the path. A path with ``=``
    in it is written as the ``path`` option: ``jsonl:path=data/run=3/train.jsonl:kind=gsm8k``."""
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"benchmark: expected a non-empty name or spec, got {spec!r}")
    parts = spec.split(":")
    head, path = parts[0], None
    options = dict(p.split("=", 1) for p in parts[1:] if "=" in p)
    if head == "jsonl":
        path_parts = [p for p in parts[1:] if "=" not in p]
        given = options.pop("path", None)
        if given is not None and path_parts:
            raise ValueError(f"benchmark spec {spec!r}: two paths: {':'.join(path_parts)!r} and path={given!r}")
        if given is None and not path_parts:
            raise ValueError(f"benchmark spec {spec!r}: 'jsonl:' needs a path (one with '=' in it is written "
                             "jsonl:path=PATH)")
        path = given if given is not None else ":".join(path_parts)
        if not path:
            raise ValueError(f"benchmark spec {spec!r}: path= needs a path")
        bench = Benchmark(name=f"jsonl:{Path(path).name}", kind="math", local_path=path)
    else:
        bench = get_benchmark(head)
    return apply_options(bench, **options), path


GENERATION_OPTIONS: dict[str, Callable[[Any], Any]] = {"max_new_tokens": int, "temperature": float, "top_p": float}


def apply_options(bench: Benchmark, **options: Any) -> Benchmark:
    """``bench`` with overrides: kind, levels ("3,4,5" or ints), *_field ("a" or "a,b"), hub_split,
    prompt_template (the user message, with ``{question}``: ``"jsonl:f.jsonl:prompt_template={question}"`` sends the
    question alone, without the boxed-answer instruction) and the generation defaults max_new_tokens, temperature,
    top_p (``"math500:max_new_tokens=8192"``)."""
    changes: dict[str, Any] = {}
    for key, value in options.items():
        if value is None:
            continue
        if key == "levels":
            items = value.split(",") if isinstance(value, str) else value
            try:
                changes["levels"] = tuple(int(v) for v in items)
            except (TypeError, ValueError):
                raise ValueError(f"levels: expected integers like '3,4,5', got {value!r}") from None
        elif key in ("question_field", "answer_field", "choices_field", "id_field"):
            changes[key] = tuple(value.split(",")) if isinstance(value, str) else tuple(value)
        elif key in ("kind", "hub_split"):
            changes[key] = value
        elif key == "prompt_template":
            if "{question}" not in str(value):
                raise ValueError(f"prompt_template: must contain {{question}}, got {value!r}")
            changes[key] = str(value)
        elif key in GENERATION_OPTIONS:
            try:
                changes[key] = GENERATION_OPTIONS[key](value)
            except (TypeError, ValueError):
                raise ValueError(f"{key}: expected a number, got {value!r}") from None
        else:
            raise ValueError(f"benchmark option {key!r}: unknown; use kind, levels, hub_split, *_field, "
                             "prompt_template, max_new_tokens, temperature or top_p")
    return replace(bench, **changes) if changes else bench


def build_prompt(problem: Problem, benchmark: Benchmark | str, tokenizer: Any = None) -> str:
    """The prompt text of ``problem`` for ``benchmark`` (a record or a spec such as ``"math500"``): the tokenizer's
    chat template (one user turn + generation prompt) when it has one, else the plain user message and a newline."""
    bench = parse_spec(benchmark)[0] if isinstance(benchmark, str) else benchmark
    return chat_prompt(user_message(problem, bench), tokenizer)
