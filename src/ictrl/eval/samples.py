"""The evaluation's ``samples.jsonl``: one row per finished (seed, benchmark, problem), its completions graded; the
rows a run lacks drawn block by block, one backend call each (:func:`sample_missing`), and appended after each call.

A row is done for the problem it was drawn for: the prompt it was sampled with (a changed prompt needs new samples,
so a rerun is refused) and the gold answer it was graded against (a corrected gold is regraded from the saved
completions, no new sample drawn, and the file rewritten with the new grades).
"""

from __future__ import annotations

import hashlib
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


def _block_seed(seed: int, benchmark: str, block: int) -> int:
    """A seed per (seed, benchmark, block of problems): a resumed run redraws exactly what the first would have."""
    digest = hashlib.sha256(f"{seed}/{benchmark}/{block}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def sample_block(task: Any, idx: list[int], prompts: list[str], backend: Any, config: Any, seed: int,
                 block: int) -> list[dict[str, Any]]:
    """Sample and grade the problems ``idx`` of ``task`` in one backend call; one row per problem."""
    gen = task.generation(config)
    completions = backend.generate(
        [prompts[i] for i in idx], config.n, gen["max_new_tokens"], gen["temperature"], gen["top_p"],
        _block_seed(seed, task.name, block),
    )
    if len(completions) != len(idx) or any(len(c) != config.n for c in completions):
        raise ValueError(
            f"backend returned {[len(c) for c in completions]} completions for {len(idx)} prompts; "
            f"expected {config.n} per prompt"
        )
    records = []
    for i, texts in zip(idx, completions):
        problem = task.problems[i]
        samples = grade_completions(task, problem, list(texts))
        records.append({
            "seed": seed, "benchmark": task.name, "problem_id": str(problem.id), "prompt": prompts[i],
            "gold": problem.gold, "samples": samples, "num_correct": sum(s["correct"] for s in samples),
        })
    return records


def _progress_bar(progress: bool) -> Any:
    """A rich progress bar on stderr (disabled when ``progress`` is False)."""
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn(),
        console=Console(stderr=True),  # stdout carries only the results table
        disable=not progress,
    )


def sample_missing(tasks: Sequence[Any], prompts: dict[str, list[str]], backend: Any, config: Any,
                   finished: Finished, path: Path | None, progress: bool = True) -> None:
    """The rows ``finished`` lacks for each seed and task, drawn block by block (``config.chunk_size`` problems per
    backend call, :func:`sample_block`), added to ``finished`` and appended to ``path`` after each call
    (:func:`append_records`; None: kept in memory), with a progress bar on stderr."""
    bar = _progress_bar(progress)
    samples = path if path is not None else Path(SAMPLES_FILE)
    sink = os.open(samples, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644) if path is not None else None
    try:
        with bar:
            for seed in config.seeds:
                for task in tasks:
                    done = sum((seed, task.name, str(p.id)) in finished for p in task.problems)
                    bar_id = bar.add_task(f"seed {seed} {task.name}", total=len(task.problems), completed=done)
                    for block, start in enumerate(range(0, len(task.problems), config.chunk_size)):
                        whole = list(range(start, min(start + config.chunk_size, len(task.problems))))
                        idx = [i for i in whole if (seed, task.name, str(task.problems[i].id)) not in finished]
                        if not idx:
                            continue
                        # A backend's draws depend on every prompt of its call: a block cut short (a torn row,
                        # a stop) is drawn whole again, so the problems it lacks get an uninterrupted run's samples.
                        missing = {str(task.problems[i].id) for i in idx}
                        recs = [rec for rec in sample_block(task, whole, prompts[task.name], backend, config, seed,
                                                            block) if rec["problem_id"] in missing]
                        for rec in recs:
                            finished[(seed, task.name, rec["problem_id"])] = rec
                        append_records(sink, samples, recs)
                        bar.advance(bar_id, len(idx))
    finally:
        if sink is not None:
            os.close(sink)
