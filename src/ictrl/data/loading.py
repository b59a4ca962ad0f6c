"""Loading problems from local JSON/JSONL files or the hub, mixtures, and TRL datasets."""

from __future__ import annotations

import json
import logging
import math
import os
import random
import re
import unicodedata
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ictrl.data.prompts import LETTERS, user_message
from ictrl.data.registry import Benchmark, Problem, apply_options, build_prompt, parse_spec
from ictrl.errors import DataError, one_line, quote
from ictrl.rewards import gsm8k_gold, last_boxed
from ictrl.rewards.normalize import first_format_char

logger = logging.getLogger(__name__)
BOM = b"\xef\xbb\xbf"


def default_data_root() -> Path | None:
    """``$ICTRL_DATA_ROOT``, else ``<repo>/../shared/data`` when it exists, else None."""
    env = os.environ.get("ICTRL_DATA_ROOT")
    if env:
        return Path(env)
    candidate = Path(__file__).resolve().parents[3].parent / "shared" / "data"
    return candidate if candidate.is_dir() else None


def read_records(path: Path) -> list[tuple[int, Any]]:
    """(line number, record) pairs from a JSONL file or a JSON list (whatever the extension says).

    JSON Lines as ``datasets`` and Python's ``json`` read them line by line: lines end at ``\\n`` only (a ``\\r``
    before it is dropped), so U+2028, U+0085 and the other characters ``str.splitlines`` would also split at stay
    inside their string; a UTF-8 byte order mark at the start is skipped with one warning.

    Raises:
        DataError: a byte that is not UTF-8 or a line that is not JSON, naming the file and the line.
    """
    raw_bytes = path.read_bytes()
    if raw_bytes.startswith(BOM):
        logger.warning("%s: skipping the UTF-8 byte order mark at the start of the file", path)
        raw_bytes = raw_bytes[len(BOM):]
    try:
        text = raw_bytes.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw_bytes.count(b"\n", 0, e.start) + 1
        column = e.start - (raw_bytes.rfind(b"\n", 0, e.start) + 1) + 1
        raise DataError(f"{path}: line {line}: byte 0x{raw_bytes[e.start]:02x} at column {column} is not UTF-8; "
                        "save the file as UTF-8") from None
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
                raise DataError(f"{path}: unterminated JSON list")
            if text[i] == "]":
                return records
            line += text.count("\n", last, i)
            last = i
            try:
                obj, i = decoder.raw_decode(text, i)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}: line {e.lineno}, column {e.colno}: invalid JSON ({e.msg})") from None
            except ValueError as e:  # an integer of more digits than int() converts (4300)
                line += text.count("\n", last, i)
                raise DataError(f"{path}: line {line}: {_TOO_LONG} ({one_line(e).split(':')[0]})") from None
            except RecursionError:
                raise DataError(f"{path}: line {line + text.count(chr(10), last, i)}: {_TOO_DEEP}") from None
            records.append((line, obj))
    for lineno, raw in enumerate(text.split("\n"), 1):
        raw = raw.removesuffix("\r")
        if not raw.strip():
            continue
        try:
            records.append((lineno, json.loads(raw)))
        except json.JSONDecodeError as e:
            raise DataError(f"{path}: line {lineno}, column {e.colno}: invalid JSON ({e.msg})") from None
        except ValueError as e:  # an integer of more digits than int() converts (4300)
            raise DataError(f"{path}: line {lineno}: {_TOO_LONG} ({one_line(e).split(':')[0]})") from None
        except RecursionError:
            raise DataError(f"{path}: line {lineno}: {_TOO_DEEP}") from None
    return records


# Python's json parser recurses once per level of nesting; no problem row nests more than a few levels
_TOO_DEEP = "the row nests lists or objects deeper than Python's JSON parser can read; no problem row nests so deep"
_TOO_LONG = "a number longer than Python's JSON reader converts; write a gold that long as a string"
# a line with fewer brackets than this cannot nest past the parser's recursion (about 1000 levels)
_SHALLOW = 512


def check_json_nesting(path: Path, where: str) -> None:
    """A DataError naming ``where`` and the line when a row of the JSON Lines (or JSON) file ``path`` nests past
    what Python's parser reads, before ``datasets`` reads it: its json builder fails on such a row with a
    RecursionError, or, some ten thousand levels deep, a segmentation fault. Only a line with hundreds of brackets
    is parsed here; the rest is counted in C."""
    with open(path, "rb") as fh:
        chunks = [fh.read()] if path.suffix.lower() == ".json" else fh
        for lineno, raw in enumerate(chunks, 1):
            if raw.count(b"[") + raw.count(b"{") <= _SHALLOW:
                continue
            try:
                json.loads(raw)
            except RecursionError:
                raise DataError(f"{where}: {'line ' + str(lineno) if chunks is fh else 'the file'}: "
                                f"{_TOO_DEEP}") from None
            except ValueError:  # not JSON, or not UTF-8: the reader names it
                continue


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


def _typed_gold(row: dict[str, Any], bench: Benchmark, gold: Any, gkey: str,
                where: str) -> tuple[list[str] | None, str]:
    """(choices, gold as a string): a choice row's choices and gold letter, else None and the gold answer (a finite
    number written as a string); a gold of another type raises."""
    if bench.kind == "choice":
        ckey, raw_choices = _lookup(row, bench.choices_field)
        if ckey is None:
            raise DataError(f"{where}: field {bench.choices_field[0]!r} missing")
        try:
            labels, choices = _normalize_choices(raw_choices)
        except (TypeError, KeyError) as e:
            raise DataError(f"{where}: field {ckey!r}: {e}") from None
        try:
            return choices, _choice_gold(gold, labels)
        except TypeError as e:
            raise DataError(f"{where}: field {gkey!r}: {e}") from None
    if isinstance(gold, int) and not isinstance(gold, bool):
        return None, str(gold)  # exact, however long (10**400 is past float's range)
    if isinstance(gold, float):
        if not math.isfinite(gold):  # JSON's NaN / Infinity: no completion can equal it
            raise DataError(f"{where}: field {gkey!r}: {gold} is not a gold answer (not a finite number)")
        return None, str(int(gold)) if gold.is_integer() else str(gold)
    if not isinstance(gold, str) or not gold.strip():
        raise DataError(f"{where}: field {gkey!r} must be a non-empty string or number, got {type(gold).__name__}")
    return None, gold


def _normalised_gold(bench: Benchmark, gold: str, gkey: str, where: str, meta: dict[str, Any]) -> str | None:
    """The gold answer as graded: a GSM8K solution's final number (the solution kept in ``meta``), a math answer
    without ``$``. An answer empty once normalised is None when the benchmark skips rows without gold, else raises."""
    original = gold
    if bench.kind == "gsm8k":
        meta["solution"] = gold
        gold = gsm8k_gold(gold)
    gold = gold.strip().strip("$").strip() if bench.kind == "math" else gold
    if not gold.strip():
        if bench.skip_missing_gold:
            return None
        raise DataError(f"{where}: field {gkey!r}: the gold answer is empty once normalised (kind {bench.kind}: "
                        f"{quote(original, 60)}); no completion can match it")
    return gold


def row_to_problem(row: Any, bench: Benchmark, index: int, where: str) -> Problem | None:
    """One raw record as a :class:`Problem` (None if filtered out). ``where`` ("FILE: line N") prefixes errors."""
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
    if bench.adapter is not None:
        try:
            row = bench.adapter(row)
        except KeyError as e:
            raise DataError(f"{where}: field {e.args[0]!r} missing") from None
    if bench.row_filter is not None and not bench.row_filter(row):
        return None

    key, question = _lookup(row, bench.question_field)
    if key is None:
        raise DataError(f"{where}: field {bench.question_field[0]!r} missing (tried {list(bench.question_field)})")
    if not isinstance(question, str) or not question.strip():
        raise DataError(f"{where}: field {key!r} must be a non-empty string, got {type(question).__name__}")

    gkey, gold = _lookup(row, bench.answer_field)
    if gkey is None and bench.kind == "math" and isinstance(row.get("solution"), str):
        gkey, gold = "solution", last_boxed(row["solution"])  # hub MATH copies carry only the solution
    if gkey is None:
        raise DataError(f"{where}: field {bench.answer_field[0]!r} missing (tried {list(bench.answer_field)})")
    if bench.skip_missing_gold and (gold is None or (isinstance(gold, str) and not gold.strip())):
        logger.debug("%s: skipping a row without a gold answer", where)
        return None
    if isinstance(gold, list) and len(gold) == 1:  # OlympiadBench: final_answer is a one-item list
        gold = gold[0]

    meta: dict[str, Any] = {"benchmark": bench.name}
    choices, gold = _typed_gold(row, bench, gold, gkey, where)
    gold = _normalised_gold(bench, gold, gkey, where, meta)
    if gold is None:
        return None

    for mkey in bench.meta_fields:
        if mkey in row and row[mkey] is not None:
            meta[mkey] = row[mkey]
    if bench.levels is not None:
        level = _math_level(row)
        if level is None:
            raise DataError(f"{where}: levels were requested but the row has no 'level' or 'difficulty'")
        if level not in bench.levels:
            return None
        meta["level"] = level
    _, rid = _lookup(row, bench.id_field)
    _check_unicode(where, [(key, question), (gkey, gold), (bench.choices_field[0] if choices else "", choices),
                           ("id", rid)])
    return Problem(id=str(rid) if rid is not None else f"{bench.name}-{index}", question=question,
                   gold=gold, choices=choices, meta=meta)


def _check_unicode(where: str, fields: list[tuple[str, Any]]) -> None:
    """Every string of ``fields`` is valid Unicode: JSON's ``\\ud800`` escape decodes to a lone surrogate, which
    no file or Arrow table can hold (``datasets`` fails on it later, far from the row)."""
    for key, value in fields:
        for text in value if isinstance(value, list) else [value]:
            if isinstance(text, str):
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError as e:
                    raise DataError(f"{where}: field {key!r}: a lone surrogate {text[e.start]!r} at character "
                                    f"{e.start} (an unpaired \\ud800-\\udfff escape) is not valid Unicode") from None


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
        DataError: a malformed row, naming the file, the line and the field; an empty file; no local copy and
            no network.
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
    if file is not None:
        return _problems_from_file(file, bench, limit)
    return _problems_from_hub(bench, limit, data_root)


def _problems_from_file(file: Path, bench: Benchmark, limit: int | None) -> list[Problem]:
    """The first ``limit`` problems of a JSON/JSONL file (errors name the file and the line)."""
    if not file.is_file():
        raise DataError(f"{file}: no such file" if not file.exists() else f"{file}: not a file")
    records = read_records(file)
    if not records:
        raise DataError(f"{file}: no rows (the file is empty)")
    problems: list[Problem] = []
    lines: list[int] = []
    for index, (lineno, row) in enumerate(records):
        p = row_to_problem(row, bench, index, f"{file}: line {lineno}")
        if p is not None:
            problems.append(p)
            lines.append(lineno)
            if limit is not None and len(problems) >= limit:
                break
    _note_format_chars(str(file), problems, [f"line {n}" for n in lines])
    return problems


def _note_format_chars(source: str, problems: list[Problem], places: list[str]) -> None:
    """One line naming the rows whose question or gold holds an invisible format character (U+200B, U+FEFF, a
    soft hyphen...): a gold pasted with one looks right and is not; the grader ignores them (as it ignores NBSP),
    and the prompt goes to the model as written. A warning when a gold holds one; information when only questions
    do (GSM8K's train split has a U+200B in one question)."""
    found = [(place, field, char) for p, place in zip(problems, places)
             for field, text in (("question", p.question), ("gold", p.gold))
             if (char := first_format_char(text)) is not None]
    if found:
        place, field, char = found[0]
        rows = len({f[0] for f in found})
        # a gold is where one misleads (it reads as its clean answer); in a question alone it is the text's own
        level = logging.WARNING if any(f[1] == "gold" for f in found) else logging.INFO
        logger.log(level, "%s: %d row(s) hold invisible format characters (first: %s, the %s, U+%04X %s); the "
                   "grader ignores them in answers, prompts are sent as written", source, rows, place, field,
                   ord(char), unicodedata.name(char, "unnamed"))


def _problems_from_hub(bench: Benchmark, limit: int | None,
                       data_root: str | os.PathLike[str] | None) -> list[Problem]:
    """The first ``limit`` problems of the benchmark's hub dataset (``data_root`` only names where no local file was
    found, in the log and the offline error)."""
    if bench.hub_id is None:
        raise DataError(f"benchmark {bench.name!r}: local file {bench.local_path!r} not found and no hub id")
    import datasets  # heavy; and looked up at call time so tests can monkeypatch load_dataset

    logger.info("%s: no local file (data root: %s); loading %s from the hub", bench.name,
                data_root or default_data_root(), bench.hub_id)

    try:
        ds = datasets.load_dataset(bench.hub_id, bench.hub_config, split=bench.hub_split)
    except ConnectionError as exc:  # offline: datasets retries, then says only "Couldn't reach"
        raise DataError(f"benchmark {bench.name}: no local copy (data root: {data_root or default_data_root()}), "
                        f"and no network to fetch {bench.hub_id} from the hub ({exc})") from exc
    where = f"hub:{bench.hub_id}" + (f"/{bench.hub_config}" if bench.hub_config else "") + f"[{bench.hub_split}]"
    problems: list[Problem] = []
    places: list[str] = []
    for index, row in enumerate(ds):
        p = row_to_problem(dict(row), bench, index, f"{where}: row {index}")
        if p is not None:
            problems.append(p)
            places.append(f"row {index}")
            if limit is not None and len(problems) >= limit:
                break
    _note_format_chars(where, problems, places)
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
    for spec, problems in zip(names, sources):  # the spec, not the benchmark's name: two files may share a name
        for p in problems:
            p.meta["source"] = spec
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
    # keyed by the whole spec: jsonl:a/train.jsonl and jsonl:b/train.jsonl share the name jsonl:train.jsonl, and each
    # keeps its own template, kind and options
    specs = [name] if isinstance(name, str) else list(name)
    benches = {s: parse_spec(s)[0] for s in specs}
    for p in problems:
        bench = benches[p.meta.get("source", specs[0])]
        msg = user_message(p, bench)
        prompt = [{"role": "user", "content": msg}] if conversational else build_prompt(p, bench, tokenizer)
        cols["prompt"].append(prompt)
        cols[gold_column].append(p.gold)
        cols["kind"].append(bench.kind)
        cols["id"].append(p.id)
        cols["benchmark"].append(bench.name)
    return datasets.Dataset.from_dict(cols)
