"""The evaluation's ``samples.jsonl``: one row per finished (seed, benchmark, problem), its completions graded.

A row is done for the problem it was drawn for: the prompt it was sampled with (a changed prompt needs new samples,
so a rerun is refused) and the gold answer it was graded against (a corrected gold is regraded from the saved
completions, no new sample drawn, and the file rewritten with the new grades).
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ictrl.files import append_whole, atomic_write_text, reported_write

SAMPLES_FILE = "samples.jsonl"
log = logging.getLogger("ictrl.eval")
Finished = dict[tuple[int, str, str], dict[str, Any]]


class ResumeMismatchError(ValueError):
    """An output directory holds samples drawn with different settings."""


def json_safe(obj: Any) -> Any:
    """NaN (std of one seed) is not JSON; write it as null."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def _row_line(record: dict[str, Any]) -> str:
    return json.dumps(json_safe(record), ensure_ascii=False) + "\n"


def load_finished(path: Path) -> Finished:
    """Read samples.jsonl; a torn last line (crash mid-write) is dropped and the file repaired, and so is a row
    already there (two unlocked runs of an older ictrl each appended every row), which readers would count twice."""
    if not path.exists():
        return {}
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: cannot read it ({err}); choose another output directory") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    finished: Finished = {}
    kept: list[str] = []
    for lineno, line in enumerate(lines, start=1):
        try:
            rec = json.loads(line)
            key = (int(rec["seed"]), str(rec["benchmark"]), str(rec["problem_id"]))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, RecursionError) as err:
            if lineno == len(lines):
                break
            raise ValueError(f"{path}:{lineno}: unreadable record ({type(err).__name__})") from err
        if key in finished:
            continue
        finished[key] = rec
        kept.append(line)
    if len(kept) != len(lines) or (text and not text.endswith("\n")):
        # drop the torn record and end with a newline, so the next append starts a fresh line
        atomic_write_text(path, "".join(k + "\n" for k in kept))
    return finished


def append_records(sink: int | None, path: Path, records: list[dict[str, Any]]) -> None:
    """The records as lines of ``path`` (open at ``sink``), all or none, and fsynced; None: kept in memory."""
    if sink is None:
        return
    with reported_write(path, "the rows before are kept; free space and run the same command again"):
        append_whole(sink, "".join(_row_line(r) for r in records).encode())
        os.fsync(sink)


def grade_completions(task: Any, problem: Any, completions: list[str]) -> list[dict[str, Any]]:
    """Each completion with its extracted answer and reward against ``problem.gold`` (``task``: an
    :class:`ictrl.eval.harness.EvalTask`, which imports this module); a reward that is not a
    finite number is a ValueError naming the task and the problem."""
    samples = []
    for text in completions:
        value = task.reward_fn(text, problem.gold)
        try:
            reward = float(value)
        except (TypeError, ValueError, OverflowError):  # 10**400 is a number float() cannot hold
            reward = math.nan
        if not math.isfinite(reward):
            shown = repr(value)[:80] if not isinstance(value, int) or abs(value) < 10**80 else "an integer past 1e80"
            raise ValueError(f"{task.name}: reward for problem {problem.id} is {shown}, not a finite number")
        extracted = task.extract_fn(text) if task.extract_fn is not None else None
        samples.append({"completion": text, "extracted": extracted, "reward": reward, "correct": reward >= 1.0})
    return samples


def check_finished(finished: Finished, tasks: Sequence[Any], prompts: dict[str, list[str]], config: Any) -> None:
    """Stored samples of this evaluation's problems have the prompts built now and ``config.n`` samples each, else
    :class:`ResumeMismatchError`."""
    prompt_of = {(t.name, str(p.id)): q for t in tasks for p, q in zip(t.problems, prompts[t.name])}
    for (_, name, pid), rec in finished.items():
        if (name, pid) in prompt_of and rec.get("prompt") != prompt_of[(name, pid)]:
            raise ResumeMismatchError(
                f"{name} problem {pid}: the prompt differs from the one stored in {SAMPLES_FILE} "
                "(prompt template or tokenizer changed); use another output directory"
            )
        if (name, pid) in prompt_of and len(rec.get("samples") or []) != config.n:
            raise ResumeMismatchError(f"{SAMPLES_FILE}: {name} problem {pid} holds {len(rec.get('samples') or [])} "
                                      f"samples, not n={config.n}; use another output directory")


def _as_stored(gold: Any) -> Any:
    """``gold`` as a row of samples.jsonl holds it once read back (a tuple is a list, NaN null)."""
    return json.loads(json.dumps(json_safe(gold), ensure_ascii=False))


def regrade_changed_golds(finished: Finished, tasks: Sequence[Any], path: Path | None) -> int:
    """Stored rows whose gold answer is not this evaluation's gold for the problem (the data was corrected since
    they were sampled): their saved completions graded again against the gold now, ``finished`` updated and, with
    a ``path``, samples.jsonl rewritten whole, so no row keeps a grade against a gold that is gone. The count of
    rows regraded; one logged line says how many and names the first."""
    problem_of = {(t.name, str(p.id)): (t, p) for t in tasks for p in t.problems}
    changed = []
    for key, rec in finished.items():
        found = problem_of.get(key[1:])
        if found is None or rec.get("gold") == _as_stored(found[1].gold):
            continue
        task, problem = found
        completions = [str(s.get("completion", "")) for s in rec.get("samples") or []]
        samples = grade_completions(task, problem, completions)
        finished[key] = {**rec, "gold": problem.gold, "samples": samples,
                         "num_correct": sum(s["correct"] for s in samples)}
        changed.append(key)
    if not changed:
        return 0
    if path is not None:
        with reported_write(path, f"{path} is kept as it was; free space and run the same command again"):
            atomic_write_text(path, "".join(_row_line(r) for r in finished.values()))
    seed, name, pid = changed[0]
    log.warning("%d saved row(s) were graded against a gold answer the data no longer holds (first: %s problem %s, "
                "seed %d): regraded from their saved completions", len(changed), name, pid, seed)
    return len(changed)
