"""The pass@k evaluation loop: sample, grade, persist incrementally, aggregate, report.

The harness knows nothing about data files or models: callers pass ``EvalTask``s (problems, a prompt builder, a
reward) and a backend (``ictrl.eval.generate``); the CLI, the trainer's eval and the demo call :func:`evaluate`.
What :func:`evaluate` would refuse is also checkable before a model loads, beside the code it guards:
:func:`validate_tasks` (the tasks), :func:`check_prompt_lengths` (a prompt that fills the model's positions, given
the numbers ``ictrl.eval.tokenizer_checks`` reads) and :func:`check_saved_run` (the output directory).

Files in ``output_dir`` (all optional; ``output_dir=None`` keeps everything in memory):

- ``settings.json``  the run's settings and each benchmark's generation settings; a rerun must match its
  sampling fields (new benchmarks are added to it).
- ``samples.jsonl``  one line per finished (seed, benchmark, problem), appended and fsynced after every
  backend call, so a crash loses at most the call in flight; a rerun skips what is there, and regrades from
  their saved completions the rows whose gold answer the data has since corrected (``ictrl.eval.samples``).
- ``results.json``   settings + summary + every sample, rewritten atomically at the end.
- ``results.md``     the table in the paper's layout; ``<model>/results_*.json``, ``samples_*``: lm-eval's (``lmeval``).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import numpy as np
from annotated_types import Interval

from ictrl import __version__
from ictrl.errors import DataError, quote
from ictrl.eval import lmeval
from ictrl.files import atomic_write_text, read_json
from ictrl.eval.markdown import GENERATION_FIELDS, format_markdown
from ictrl.eval.passk import bootstrap_ci, mean_std, pass_at_k
from ictrl.eval.samples import (SAMPLES_FILE, ResumeMismatchError, check_finished, load_finished,
                                regrade_changed_golds, sample_missing)
from ictrl.eval.samples import json_safe as _json_safe
from ictrl.validation import AT_LEAST_ONE, NON_NEGATIVE, check_fields

SETTINGS_FILE = "settings.json"
NUCLEUS = Interval(gt=0, le=1)  # top_p: a probability mass, 1 keeps every token
RESULTS_JSON = "results.json"
RESULTS_MD = "results.md"

if TYPE_CHECKING:  # generate imports torch; the harness itself does not need it
    from ictrl.eval.generate import Backend
    from ictrl.eval.tokenizer_checks import ModelTokenizer


@dataclass
class EvalConfig:
    """Sampling and reporting settings for one evaluation."""

    model: str = field(metadata={"help": "Model name or path, recorded in the outputs and checked on resume unless "
                                 "model_sha256 identifies the model."})
    n: Annotated[int, AT_LEAST_ONE] = field(default=4, metadata={"help": "Samples per problem; must be >= max(ks)."})
    ks: tuple[int, ...] = field(default=(1, 4), metadata={"help": "k values of pass@k to report."})
    max_new_tokens: Annotated[int | None, AT_LEAST_ONE] = field(
        default=None, metadata={"help": "Generation budget per completion. None: each task's own (a registry "
                                "benchmark's default, ictrl.data.Benchmark.max_new_tokens)."})
    temperature: Annotated[float | None, NON_NEGATIVE] = field(
        default=None, metadata={"help": "Sampling temperature; 0 means greedy. None: each task's own."})
    top_p: Annotated[float | None, NUCLEUS] = field(
        default=None, metadata={"help": "Nucleus sampling mass. None: each task's own."})
    seeds: tuple[int, ...] = field(default=(0,), metadata={"help": "One full evaluation per seed."})
    chunk_size: Annotated[int, AT_LEAST_ONE] = field(
        default=32, metadata={"help": "Problems per backend call (and per flush to disk)."})
    n_bootstrap: Annotated[int, AT_LEAST_ONE] = field(
        default=1000, metadata={"help": "Bootstrap replicates for the CI."})
    ci: Annotated[float, Interval(gt=0, lt=1)] = field(
        default=0.95, metadata={"help": "Confidence level of the bootstrap interval."})
    method: str | None = field(
        default=None, metadata={"help": "Label of the training method that produced the model (``ictrl table`` "
                                "groups runs by it); no effect on sampling."})
    train_seed: int | None = field(
        default=None, metadata={"help": "Training seed of the evaluated model (``ictrl table`` pairs methods by "
                                "it); no effect on sampling."})
    model_sha256: str | None = field(
        default=None, metadata={"help": "sha256 of the model's weights (``ictrl.checkpoints.weights_digest``): on "
                                "resume the model is identified by it, not by its path."})

    # fields that change the samples themselves: resuming across a change would mix two experiments (the
    # generation fields are compared per benchmark, after resolving each task's defaults; chunk_size sets which
    # problems share a backend call and its seed). "model" is compared as model_sha256 when both runs have it.
    RESUME_FIELDS = ("model", "n", "chunk_size")

    def __post_init__(self) -> None:
        self.ks = tuple(int(k) for k in self.ks)
        self.seeds = tuple(int(s) for s in self.seeds)
        check_fields(self, types=False, sentence=True)  # each bound: "n must be an int >= 1, got 0"
        if not self.ks or min(self.ks) < 1:
            raise ValueError(f"ks must be non-empty positive integers, got {self.ks}")
        if max(self.ks) > self.n:
            raise ValueError(f"ks={self.ks} needs n >= {max(self.ks)} samples per problem, got n={self.n}")
        if len(set(self.ks)) != len(self.ks):
            raise ValueError(f"ks has duplicates: {self.ks}")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds must be non-empty and distinct, got {self.seeds}")


@dataclass(frozen=True)
class EvalTask:
    """One benchmark, ready to run. Problems need ``.id`` (unique) and ``.gold``.

    The generation fields are the task's defaults; a non-None value in :class:`EvalConfig` overrides them.
    """

    name: str
    problems: Sequence[Any]
    prompt_fn: Callable[[Any], str]  # problem -> fully formatted prompt text
    reward_fn: Callable[[str, Any], float]  # (completion, gold) -> reward; >= 1 counts as correct
    extract_fn: Callable[[str], str | None] | None = None  # completion -> extracted answer, for the record
    max_new_tokens: Annotated[int | None, AT_LEAST_ONE] = None
    temperature: Annotated[float | None, NON_NEGATIVE] = None
    top_p: Annotated[float | None, NUCLEUS] = None

    def __post_init__(self) -> None:
        check_fields(self, types=False, where=f"task {self.name!r}: ", sentence=True)

    def generation(self, config: EvalConfig) -> dict[str, Any]:
        """``{"max_new_tokens", "temperature", "top_p"}``: the config's value where set, else the task's."""
        out = {}
        for name in GENERATION_FIELDS:
            value = getattr(config, name)
            out[name] = getattr(self, name) if value is None else value
            if out[name] is None:
                raise ValueError(f"task {self.name!r}: no {name}; set it on the EvalConfig (--{name.replace('_', '-')})"
                                 " or the EvalTask")
        return out


@dataclass
class EvalResult:
    summary: dict[str, Any]  # settings, per-benchmark / average / total statistics
    records: list[dict[str, Any]]  # one per (seed, benchmark, problem), with every sample
    markdown: str
    harness_file: Path | None = None  # the lm-evaluation-harness results file, when written to an output_dir


def benchmark_tasks(
    specs: Sequence[str], tokenizer: Any = None, limit: int | None = None,
    data_root: str | os.PathLike[str] | None = None,
) -> list[EvalTask]:
    """EvalTasks for registered benchmarks (``ictrl.data`` specs such as ``"gsm8k"`` or ``"math_train:levels=5"``).

    Prompts use the tokenizer's chat template when it has one; the reward and the recorded
    extracted answer follow the benchmark's kind (math / gsm8k / choice).
    """
    from ictrl.data import build_prompt, load_problems, parse_spec
    from ictrl.rewards import DEFAULT_EXTRACTOR, extract_choice

    tasks = []
    for spec in specs:
        bench = parse_spec(spec)[0]
        problems = load_problems(spec, limit=limit, data_root=data_root)
        tasks.append(
            EvalTask(
                name=spec,
                problems=problems,
                prompt_fn=lambda p, b=bench: build_prompt(p, b, tokenizer),
                reward_fn=bench.reward,
                extract_fn=extract_choice if bench.kind == "choice" else DEFAULT_EXTRACTOR.extract,
                **bench.generation,
            )
        )
    return tasks


def settings_of(config: EvalConfig, tasks: Sequence[EvalTask]) -> dict[str, Any]:
    """The config plus each task's resolved generation settings, under ``generation``."""
    return {**asdict(config), "generation": {t.name: t.generation(config) for t in tasks}}


def _check_settings(output_dir: Path, config: EvalConfig, tasks: Sequence[EvalTask]) -> None:
    path = output_dir / SETTINGS_FILE
    current = settings_of(config, tasks)
    if not path.exists():
        atomic_write_text(path, json.dumps(current, indent=2) + "\n")
        return
    stored = read_json(path, "remove the folder's samples to start over, or choose another output directory")
    if not isinstance(stored, dict):
        raise ValueError(f"{path}: not the settings of an evaluation (a JSON object); choose another output directory")
    by_hash = bool(stored.get("model_sha256") and current.get("model_sha256"))  # else by the path
    diffs = [f"{name}: stored {stored.get(name)!r}, requested {current[name]!r}" for name in EvalConfig.RESUME_FIELDS
             if stored.get(name) != current[name] and not (by_hash and name == "model")]
    if by_hash and stored["model_sha256"] != current["model_sha256"]:
        diffs.append(f"the model's weights differ from those the samples were drawn with (sha256 "
                     f"{stored['model_sha256'][:12]} stored, {current['model_sha256'][:12]} now)")
    # settings.json written before per-benchmark generation held one set of values for every benchmark
    legacy = {f: stored.get(f) for f in GENERATION_FIELDS}
    stored_gen = stored.get("generation") or {}
    for name, gen in current["generation"].items():
        before = stored_gen.get(name, legacy if "generation" not in stored else gen)
        diffs += [f"{name} {f}: stored {before.get(f)!r}, requested {gen[f]!r}" for f in GENERATION_FIELDS
                  if before.get(f) != gen[f]]
    if not diffs and "generation" in stored and set(current["generation"]) - set(stored_gen):
        merged = {**stored, "generation": {**stored_gen, **current["generation"]}}
        atomic_write_text(path, json.dumps(merged, indent=2) + "\n")
    if diffs:
        raise ResumeMismatchError(
            f"{output_dir} holds samples drawn with different settings ({'; '.join(diffs)}); "
            "rerun with the same settings or choose another output directory"
        )


def validate_tasks(tasks: Sequence[EvalTask], config: EvalConfig) -> None:
    """What :func:`evaluate` refuses of ``tasks`` before it samples (none, a name twice, a task without problems, a
    problem id twice in a task, a generation setting that resolves to nothing), as a ValueError naming it."""
    if not tasks:
        raise ValueError("tasks must not be empty")
    names = [t.name for t in tasks]
    if len(set(names)) != len(names):
        raise ValueError(f"task names must be distinct, got {names}")
    for task in tasks:
        if not task.problems:
            raise ValueError(f"task {task.name!r} has no problems")
        ids = [str(p.id) for p in task.problems]
        if len(set(ids)) != len(ids):
            dup = next(i for i in ids if ids.count(i) > 1)
            raise ValueError(f"task {task.name!r}: problem id {dup!r} appears more than once (resume keys on ids)")
    for task in tasks:
        task.generation(config)  # every generation setting resolves before anything is sampled


def check_prompt_lengths(tasks: Sequence[EvalTask], model: ModelTokenizer, config: EvalConfig,
                         option: str = "--benchmarks") -> None:
    """Each task's prompts leave room for a generated token in the model's positions (``model``, from
    :func:`ictrl.eval.tokenizer_checks.checked_tokenizer`); :class:`DataError` naming ``option``, the benchmark and
    the problem id otherwise.

    Generation past the positions is left to the model: rotary-embedding models run on past them, and the tiny test
    models (256 positions) are evaluated with budgets of 1024 tokens. Prompts are measured cheaply first: no token is
    longer than the vocabulary's longest entry (in characters; a byte-level BPE entry spells each byte as one
    character), so a prompt of ``c`` characters is at least ``c / longest`` tokens, and one too long by that bound is
    refused without tokenising it (a megabyte of text takes the tokenizer tens of seconds)."""
    if model.positions is None:
        return
    room = model.positions - 1
    for task in tasks:
        budget = int(task.generation(config)["max_new_tokens"])
        prompts = [task.prompt_fn(p) for p in task.problems]
        for problem, prompt in zip(task.problems, prompts):
            at_least = math.ceil(len(prompt) / model.longest)
            if at_least > room:
                _too_long(option, task.name, problem, f"at least {at_least}", budget, model.positions)
        lengths = [len(ids) for ids in model.tokenizer(prompts, add_special_tokens=False)["input_ids"]]
        for problem, n in zip(task.problems, lengths):
            if n > room:
                _too_long(option, task.name, problem, str(n), budget, model.positions)


def _too_long(option: str, name: str, problem: Any, tokens: str, budget: int, positions: int) -> None:
    raise DataError(f"{option}: {name}: problem {quote(str(problem.id), 80)}: a prompt of {tokens} tokens leaves no "
                    f"room in the model's {positions} positions (max_new_tokens {budget}); drop the problem or use a "
                    "model with more positions")


def check_saved_run(output_dir: str | os.PathLike[str], config: EvalConfig, tasks: Sequence[EvalTask]) -> int:
    """What :func:`evaluate` checks of ``output_dir`` before it samples (its settings against ``config``, every
    stored row readable), for a caller to run before the model loads; raises as :func:`evaluate` would. A folder
    with no settings yet is left as it is: a model that then fails to load leaves no settings to hold a rerun to.
    Returns how many (seed, benchmark, problem) rows have no saved row: 0 when a rerun samples nothing (it may
    still regrade), so the model need not load."""
    out = Path(output_dir)
    if (out / SETTINGS_FILE).exists():
        _check_settings(out, config, tasks)
    finished = load_finished(out / SAMPLES_FILE)
    return sum((seed, t.name, str(p.id)) not in finished for seed in config.seeds for t in tasks for p in t.problems)


def evaluate(tasks: Sequence[EvalTask], backend: Backend, config: EvalConfig,
             output_dir: str | os.PathLike[str] | None = None, progress: bool = True) -> EvalResult:
    """Sample ``config.n`` completions per problem per seed, grade them and report pass@k.

    Resumable: with an ``output_dir`` that already holds samples from matching settings, finished problems are not
    regenerated. Raises :class:`ResumeMismatchError` naming the fields that differ.
    """
    started = time.perf_counter()
    validate_tasks(tasks, config)
    out = Path(output_dir) if output_dir is not None else None
    finished: dict[tuple[int, str, str], dict[str, Any]] = {}
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        _check_settings(out, config, tasks)
        finished = load_finished(out / SAMPLES_FILE)

    samples = out / SAMPLES_FILE if out is not None else None  # None: the rows are kept in memory
    prompts = {t.name: [t.prompt_fn(p) for p in t.problems] for t in tasks}
    check_finished(finished, tasks, prompts, config)
    regrade_changed_golds(finished, tasks, samples)
    sample_missing(tasks, prompts, backend, config, finished, samples, progress)

    records = [finished[(seed, t.name, str(p.id))] for seed in config.seeds for t in tasks for p in t.problems]
    for rec in records:
        rec["pass_at_k"] = {str(k): pass_at_k(config.n, int(rec["num_correct"]), k) for k in config.ks}
    summary = summarize(records, tasks, config)
    markdown = format_markdown(summary)
    harness_file = (None if out is None
                    else _write_results(out, summary, records, markdown, time.perf_counter() - started))
    return EvalResult(summary=_json_safe(summary), records=records, markdown=markdown, harness_file=harness_file)


def _write_results(out: Path, summary: dict[str, Any], records: list[Any], markdown: str, seconds: float) -> Path:
    """results.json, results.md and the lm-evaluation-harness files, each atomically; the harness results file."""
    payload = _json_safe({"summary": summary, "records": records})
    atomic_write_text(out / RESULTS_JSON, json.dumps(payload, indent=1, ensure_ascii=False) + "\n")
    atomic_write_text(out / RESULTS_MD, markdown)
    return lmeval.write(out, payload["summary"], records, seconds, __version__)


def _stat(per_seed: np.ndarray, groups: list[np.ndarray], config: EvalConfig) -> dict[str, Any]:
    """per_seed: [S] score per seed; groups: per-benchmark [P_b] per-problem scores averaged over seeds."""
    mean, std = mean_std(per_seed)
    low, high = bootstrap_ci(groups, n_boot=config.n_bootstrap, ci=config.ci, seed=0)
    return {"mean": mean, "std": std, "per_seed": per_seed.tolist(), "ci": [low, high]}


def summarize(records: Sequence[dict[str, Any]], tasks: Sequence[EvalTask], config: EvalConfig) -> dict[str, Any]:
    """Per-benchmark pass@k, their average over benchmarks, and Total = mean over ks of the averages.

    With ks = (1, 4) Total = (avg P@1 + avg P@4) / 2, the paper's figure. Each statistic has
    mean and std over seeds and a bootstrap CI over problems (seed-averaged per problem,
    stratified by benchmark for the average and Total).
    """
    seeds, ks = list(config.seeds), list(config.ks)
    # scores[name]: [S, P, K] per-problem pass@k
    scores: dict[str, np.ndarray] = {}
    for task in tasks:
        arr = np.zeros((len(seeds), len(task.problems), len(ks)), dtype=np.float64)
        scores[task.name] = arr
    pos = {(t.name, str(p.id)): i for t in tasks for i, p in enumerate(t.problems)}
    for rec in records:
        s, i = seeds.index(int(rec["seed"])), pos[(rec["benchmark"], rec["problem_id"])]
        scores[rec["benchmark"]][s, i] = [rec["pass_at_k"][str(k)] for k in ks]

    benchmarks: dict[str, Any] = {}
    for task in tasks:
        name, arr = task.name, scores[task.name]
        benchmarks[name] = {
            "num_problems": arr.shape[1],
            "generation": task.generation(config),
            "pass_at_k": {str(k): _stat(arr[:, :, j].mean(axis=1), [arr[:, :, j].mean(axis=0)], config)
                          for j, k in enumerate(ks)},
        }
    average = {
        str(k): _stat(
            np.mean([arr[:, :, j].mean(axis=1) for arr in scores.values()], axis=0),
            [arr[:, :, j].mean(axis=0) for arr in scores.values()],
            config,
        )
        for j, k in enumerate(ks)
    }
    total = _stat(
        np.mean([arr.mean(axis=(1, 2)) for arr in scores.values()], axis=0),
        [arr.mean(axis=(0, 2)) for arr in scores.values()],
        config,
    )
    return {
        "settings": settings_of(config, tasks),
        "benchmarks": benchmarks,
        "average": {"num_problems": sum(a.shape[1] for a in scores.values()), "pass_at_k": average},
        "total": total,
    }
