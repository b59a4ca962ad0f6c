"""Benchmark registry, problem loading, prompts and TRL datasets.

A :class:`Benchmark` names a data set twice: a hub id (``datasets.load_dataset(hub_id, hub_config,
split=hub_split)``, the path for users with network access) and a local file relative to the data root
(``$ICTRL_DATA_ROOT``, else ``../shared/data`` next to the repository), used first when present. Local copies
and hub versions of one benchmark often differ in layout (CommonsenseQA's nested ``question.stem``, ARC's
per-letter columns, MMLU's integer answer), so field names are lists of candidates (dotted paths allowed) and
choices/gold letters are normalised by one function for every layout seen.

Specs accepted by :func:`load_problems`: a registry name (``"math500"``), a name with options
(``"math_train:levels=3,4,5"``), or ``"jsonl:PATH[:key=value...]"`` with keys ``kind``, ``question_field``,
``answer_field``, ``choices_field``, ``id_field`` (a ``.json`` list works too).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from ictrl.rewards import get_reward, gsm8k_gold, last_boxed

logger = logging.getLogger(__name__)
Kind = Literal["math", "gsm8k", "choice"]
LETTERS = "ABCDEFGHIJ"
MATH_SUFFIX = "Please reason step by step, and put your final answer within \\boxed{}."
CHOICE_SUFFIX = "Please reason step by step, and put the letter of your final answer within \\boxed{}."
PROMPT_TEMPLATES: dict[str, str] = {
    "math": "{question}\n" + MATH_SUFFIX,
    "gsm8k": "{question}\n" + MATH_SUFFIX,
    "choice": "{question}\n\n{choices}\n\n" + CHOICE_SUFFIX,
}


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

    def __post_init__(self) -> None:
        if self.kind not in PROMPT_TEMPLATES:
            raise ValueError(f"kind: expected one of {sorted(PROMPT_TEMPLATES)}, got {self.kind!r}")
        if self.hub_id is None and self.local_path is None:
            raise ValueError(f"benchmark {self.name!r}: needs a hub_id or a local_path")
        if self.kind == "choice" and not self.choices_field and self.adapter is None:
            raise ValueError(f"benchmark {self.name!r}: a choice benchmark needs choices_field")

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
    so the gold letter is uniform and stable across runs and machines."""
    try:
        options = [row["Correct Answer"]] + [row[f"Incorrect Answer {i}"] for i in (1, 2, 3)]
        question = row["Question"]
    except KeyError as e:
        raise KeyError(f"{e.args[0]}") from None
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


for _b in (
    Benchmark("math500", "math", "HuggingFaceH4/MATH-500", local_path="math500/test.jsonl",
              meta_fields=("subject", "level")),
    Benchmark("gsm8k", "gsm8k", "openai/gsm8k", "main", local_path="gsm8k/test.jsonl",
              question_field=("question",)),
    Benchmark("gsm8k_train", "gsm8k", "openai/gsm8k", "main", "train", local_path="gsm8k/train.jsonl",
              question_field=("question",)),
    Benchmark("math_train", "math", "DigitalLearningGmbH/MATH-lighteval", hub_split="train",
              local_path="math_train/math.json", meta_fields=("type", "level", "difficulty"), skip_missing_gold=True),
    Benchmark("aime23", "math", "AI-MO/aimo-validation-aime", hub_split="train", local_path="aime23/test.jsonl",
              row_filter=lambda r: "url" not in r or "2023_AIME" in str(r["url"])),
    Benchmark("aime24", "math", "HuggingFaceH4/aime_2024", hub_split="train", local_path="aime24/test.jsonl"),
    Benchmark("aime25", "math", "math-ai/aime25", local_path="aime25/test.jsonl"),
    Benchmark("amc23", "math", "math-ai/amc23", question_field=("question", "problem")),
    Benchmark("minerva_math", "math", "math-ai/minervamath", question_field=("question", "problem")),
    Benchmark("olympiadbench", "math", "math-ai/olympiadbench", question_field=("question", "problem"),
              answer_field=("final_answer", "answer")),
    Benchmark("mmlu_stem", "choice", "TIGER-Lab/MMLU-STEM", local_path="mmlu_stem/test.jsonl",
              question_field=("question",), choices_field=("choices",), meta_fields=("type", "subject")),
    Benchmark("gpqa_diamond", "choice", "Idavidrein/gpqa", "gpqa_diamond", "train",
              question_field=("question",), choices_field=("choices",), adapter=_gpqa_adapter,
              meta_fields=("subdomain",)),
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
    """A registry entry (with ``:key=value`` options applied) and, for ``jsonl:PATH``, the path."""
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"benchmark: expected a non-empty name or spec, got {spec!r}")
    parts = spec.split(":")
    head, path = parts[0], None
    if head == "jsonl":
        path_parts = [p for p in parts[1:] if "=" not in p]
        if not path_parts:
            raise ValueError(f"benchmark spec {spec!r}: 'jsonl:' needs a path")
        path = ":".join(path_parts)
        bench = Benchmark(name=f"jsonl:{Path(path).name}", kind="math", local_path=path)
    else:
        bench = get_benchmark(head)
    options = dict(p.split("=", 1) for p in parts[1:] if "=" in p)
    return apply_options(bench, **options), path


def apply_options(bench: Benchmark, **options: Any) -> Benchmark:
    """``bench`` with overrides: kind, levels ("3,4,5" or ints), *_field ("a" or "a,b"), hub_split."""
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
        else:
            raise ValueError(f"benchmark option {key!r}: unknown; use kind, levels, hub_split or *_field")
    return replace(bench, **changes) if changes else bench


# ----------------------------------------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------------------------------------


def default_data_root() -> Path | None:
    """``$ICTRL_DATA_ROOT``, else ``<repo>/../shared/data`` when it exists, else None."""
    env = os.environ.get("ICTRL_DATA_ROOT")
    if env:
        return Path(env)
    candidate = Path(__file__).resolve().parents[2].parent / "shared" / "data"
    return candidate if candidate.is_dir() else None


def read_records(path: Path) -> list[tuple[int, Any]]:
    """(line number, record) pairs from a JSONL file or a JSON list (whatever the extension says)."""
    text = path.read_text(encoding="utf-8")
    stripped = text.lstrip()
    records: list[tuple[int, Any]] = []
    if stripped.startswith("["):
        # walk the array with raw_decode so each item keeps the line it starts on
        decoder = json.JSONDecoder()
        i, line = len(text) - len(stripped) + 1, 1 + text.count("\n", 0, len(text) - len(stripped))
        last = i
        while True:
            while i < len(text) and text[i] in " \t\r\n,":
                i += 1
            if i >= len(text):
                raise ValueError(f"{path}: unterminated JSON list")
            if text[i] == "]":
                return records
            line += text.count("\n", last, i)
            last = i
            try:
                obj, i = decoder.raw_decode(text, i)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: line {e.lineno}: invalid JSON ({e.msg})") from None
            records.append((line, obj))
    for lineno, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            records.append((lineno, json.loads(raw)))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: line {lineno}: invalid JSON ({e.msg})") from None
    return records


def _lookup(row: dict[str, Any], candidates: Sequence[str]) -> tuple[str | None, Any]:
    """(the key that matched, its value); (None, None) when no candidate is present."""
    for key in candidates:
        value: Any = row
        for part in key.split("."):
            if not isinstance(value, dict) or part not in value:
                break
            value = value[part]
        else:
            return key, value
    return None, None


def _normalize_choices(raw: Any) -> tuple[list[str], list[str]]:
    """(labels, texts) from a list of strings, {"label": [...], "text": [...]} or [{"label", "text"}]."""
    if isinstance(raw, dict) and "text" in raw:
        texts, labels = list(raw["text"]), list(raw.get("label") or LETTERS[: len(raw["text"])])
    elif isinstance(raw, list) and raw and all(isinstance(c, dict) for c in raw):
        texts, labels = [c["text"] for c in raw], [str(c.get("label", LETTERS[i])) for i, c in enumerate(raw)]
    elif isinstance(raw, list) and raw:
        texts, labels = list(raw), list(LETTERS[: len(raw)])
    else:
        raise TypeError("expected a non-empty list or a {label, text} mapping")
    if not 2 <= len(texts) <= len(LETTERS) or len(labels) != len(texts):
        raise TypeError(f"expected 2-{len(LETTERS)} choices with one label each, got {len(texts)}")
    if not all(isinstance(t, str) for t in texts):
        raise TypeError("every choice must be a string")
    return [str(lab) for lab in labels], texts


def _choice_gold(value: Any, labels: list[str]) -> str:
    """The gold as a letter: from a letter, a source label ("1".."4"), or an integer index."""
    if isinstance(value, bool):
        raise TypeError("expected a letter, label or index, got a bool")
    if isinstance(value, int):
        if not 0 <= value < len(labels):
            raise TypeError(f"index {value} out of range for {len(labels)} choices")
        return LETTERS[value]
    if isinstance(value, str) and value.strip() in labels:
        return LETTERS[labels.index(value.strip())]
    raise TypeError(f"{value!r} is not one of the labels {labels}")


def _math_level(row: dict[str, Any]) -> int | None:
    for key in ("level", "difficulty"):
        value = row.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return int(value)
        if isinstance(value, str) and (m := re.search(r"\d+", value)):
            return int(m.group(0))
    return None


def row_to_problem(row: Any, bench: Benchmark, index: int, where: str) -> Problem | None:
    """One raw record as a :class:`Problem` (None if filtered out). ``where`` ("FILE: line N") prefixes errors."""
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
    if bench.adapter is not None:
        try:
            row = bench.adapter(row)
        except KeyError as e:
            raise ValueError(f"{where}: field {e.args[0]!r} missing") from None
    if bench.row_filter is not None and not bench.row_filter(row):
        return None

    key, question = _lookup(row, bench.question_field)
    if key is None:
        raise ValueError(f"{where}: field {bench.question_field[0]!r} missing (tried {list(bench.question_field)})")
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"{where}: field {key!r} must be a non-empty string, got {type(question).__name__}")

    gkey, gold = _lookup(row, bench.answer_field)
    if gkey is None and bench.kind == "math" and isinstance(row.get("solution"), str):
        gkey, gold = "solution", last_boxed(row["solution"])  # hub MATH copies carry only the solution
    if gkey is None:
        raise ValueError(f"{where}: field {bench.answer_field[0]!r} missing (tried {list(bench.answer_field)})")
    if bench.skip_missing_gold and (gold is None or (isinstance(gold, str) and not gold.strip())):
        logger.debug("%s: skipping a row without a gold answer", where)
        return None
    if isinstance(gold, list) and len(gold) == 1:  # OlympiadBench: final_answer is a one-item list
        gold = gold[0]

    choices = None
    meta: dict[str, Any] = {"benchmark": bench.name}
    if bench.kind == "choice":
        ckey, raw_choices = _lookup(row, bench.choices_field)
        if ckey is None:
            raise ValueError(f"{where}: field {bench.choices_field[0]!r} missing")
        try:
            labels, choices = _normalize_choices(raw_choices)
        except (TypeError, KeyError) as e:
            raise ValueError(f"{where}: field {ckey!r}: {e}") from None
        try:
            gold = _choice_gold(gold, labels)
        except TypeError as e:
            raise ValueError(f"{where}: field {gkey!r}: {e}") from None
    elif isinstance(gold, (int, float)) and not isinstance(gold, bool):
        gold = str(int(gold)) if float(gold).is_integer() else str(gold)
    elif not isinstance(gold, str) or not gold.strip():
        raise ValueError(f"{where}: field {gkey!r} must be a non-empty string or number, got {type(gold).__name__}")
    if bench.kind == "gsm8k":
        meta["solution"] = gold
        gold = gsm8k_gold(gold)
    gold = gold.strip().strip("$").strip() if bench.kind == "math" else gold

    if bench.levels is not None:
        level = _math_level(row)
        if level is None:
            raise ValueError(f"{where}: levels were requested but the row has no 'level' or 'difficulty'")
        if level not in bench.levels:
            return None
        meta["level"] = level
    for mkey in bench.meta_fields:
        if mkey in row and row[mkey] is not None:
            meta[mkey] = row[mkey]
    _, rid = _lookup(row, bench.id_field)
    return Problem(id=str(rid) if rid is not None else f"{bench.name}-{index}", question=question,
                   gold=gold, choices=choices, meta=meta)


def load_problems(
    name_or_spec: str,
    path: str | os.PathLike[str] | None = None,
    limit: int | None = None,
    data_root: str | os.PathLike[str] | None = None,
    **options: Any,
) -> list[Problem]:
    """Problems of a benchmark, from ``path``, else its local file under the data root, else the hub.

    Args:
        name_or_spec: registry name, ``name:key=value...`` or ``jsonl:PATH[:key=value...]``.
        path: a JSON/JSONL file overriding the benchmark's local file.
        limit: keep the first ``limit`` problems (after filtering).
        data_root: overrides ``$ICTRL_DATA_ROOT`` / ``../shared/data``.
        options: as in the spec (``levels=(3, 4, 5)``, ``kind="choice"``, ``question_field="q"``...).

    Raises:
        ValueError: a malformed row, naming the file, the line and the field.
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit: must be >= 0, got {limit}")
    bench, spec_path = parse_spec(name_or_spec)
    bench = apply_options(bench, **options)
    file = Path(path) if path is not None else Path(spec_path) if spec_path is not None else None
    if file is None and bench.local_path is not None:
        root = Path(data_root) if data_root is not None else default_data_root()
        if root is not None and (root / bench.local_path).is_file():
            file = root / bench.local_path
    problems: list[Problem] = []
    if file is not None:
        if not file.is_file():
            raise ValueError(f"path: {file} is not a file")
        for index, (lineno, row) in enumerate(read_records(file)):
            p = row_to_problem(row, bench, index, f"{file}: line {lineno}")
            if p is not None:
                problems.append(p)
                if limit is not None and len(problems) >= limit:
                    break
        return problems
    if bench.hub_id is None:
        raise ValueError(f"benchmark {bench.name!r}: local file {bench.local_path!r} not found and no hub id")
    import datasets  # heavy; and looked up at call time so tests can monkeypatch load_dataset

    ds = datasets.load_dataset(bench.hub_id, bench.hub_config, split=bench.hub_split)
    where = f"hub:{bench.hub_id}" + (f"/{bench.hub_config}" if bench.hub_config else "") + f"[{bench.hub_split}]"
    for index, row in enumerate(ds):
        p = row_to_problem(dict(row), bench, index, f"{where}: row {index}")
        if p is not None:
            problems.append(p)
            if limit is not None and len(problems) >= limit:
                break
    return problems


def load_mixture(
    names: Sequence[str],
    weights: Sequence[float] | None = None,
    seed: int = 0,
    size: int | None = None,
    data_root: str | os.PathLike[str] | None = None,
) -> list[Problem]:
    """A shuffled training mixture. Without weights: every problem of every source. With weights: ``size``
    problems (default: the sum of the source sizes) drawn in proportion, without replacement while a source
    lasts, then cycling through a fresh shuffle. ``meta["benchmark"]`` tells each problem's source."""
    if not names:
        raise ValueError("names: need at least one benchmark")
    if weights is not None and (len(weights) != len(names) or any(w < 0 for w in weights) or sum(weights) <= 0):
        raise ValueError(f"weights: need {len(names)} non-negative weights with a positive sum, got {weights}")
    rng = random.Random(seed)
    sources = [load_problems(n, data_root=data_root) for n in names]
    if weights is None:
        mixed = [p for src in sources for p in src]
    else:
        total = size if size is not None else sum(len(s) for s in sources)
        counts = [int(round(total * w / sum(weights))) for w in weights]
        mixed = []
        for src, count in zip(sources, counts):
            while count > 0 and src:
                order = rng.sample(src, len(src))
                mixed.extend(order[:count])
                count -= len(order)
    rng.shuffle(mixed)
    return mixed


# ----------------------------------------------------------------------------------------------------------
# Prompts and TRL datasets
# ----------------------------------------------------------------------------------------------------------


def user_message(problem: Problem, benchmark: Benchmark) -> str:
    """The benchmark's template filled in; choices lettered inline ("A. ...\\nB. ...")."""
    choices = "\n".join(f"{LETTERS[i]}. {c}" for i, c in enumerate(problem.choices or []))
    return benchmark.template.replace("{question}", problem.question.strip()).replace("{choices}", choices)


def build_prompt(problem: Problem, benchmark: Benchmark | str, tokenizer: Any = None) -> str:
    """The prompt text: the tokenizer's chat template (one user turn + generation prompt) when it has one,
    else the plain user message followed by a newline."""
    bench = parse_spec(benchmark)[0] if isinstance(benchmark, str) else benchmark
    message = user_message(problem, bench)
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": message}], tokenize=False, add_generation_prompt=True
        )
    return message + "\n"


def to_trl_dataset(
    name: str | Sequence[str],
    path: str | os.PathLike[str] | None = None,
    limit: int | None = None,
    data_root: str | os.PathLike[str] | None = None,
    *,
    conversational: bool = True,
    tokenizer: Any = None,
    gold_column: str = "answer",
    weights: Sequence[float] | None = None,
    seed: int = 0,
) -> Any:
    """A ``datasets.Dataset`` for TRL's GRPOTrainer.

    Columns: ``prompt`` — conversational ``[{"role": "user", "content": msg}]`` (TRL applies the chat template)
    when ``conversational``, else the plain string from :func:`build_prompt` (``tokenizer`` optional);
    ``gold_column`` (the gold, a string); ``kind`` ("math"/"gsm8k"/"choice", for
    :func:`ictrl.rewards.trl_kind_reward`); ``id``; ``benchmark``. A list of names builds a mixture
    (:func:`load_mixture` with ``weights`` and ``seed``).
    """
    import datasets

    if isinstance(name, str):
        problems = load_problems(name, path=path, limit=limit, data_root=data_root)
    else:
        problems = load_mixture(list(name), weights=weights, seed=seed, data_root=data_root)[:limit]
    cols: dict[str, list[Any]] = {"prompt": [], gold_column: [], "kind": [], "id": [], "benchmark": []}
    specs = {name} if isinstance(name, str) else set(name)
    benches = {parse_spec(s)[0].name: parse_spec(s)[0] for s in specs}
    for p in problems:
        bench = benches[p.meta["benchmark"]]
        msg = user_message(p, bench)
        cols["prompt"].append([{"role": "user", "content": msg}] if conversational else build_prompt(p, bench, tokenizer))
        cols[gold_column].append(p.gold)
        cols["kind"].append(bench.kind)
        cols["id"].append(p.id)
        cols["benchmark"].append(bench.name)
    return datasets.Dataset.from_dict(cols)
