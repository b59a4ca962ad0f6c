"""The resumable (method, seed[, lr]) grid of ``ictrl compare`` (and of the studies built on it).

One *run* = RL training with one method and seed (and learning rate), then a held-out pass@k evaluation. Each
run owns a directory ``<root>/[lr<lr>/]<method>/seed<seed>/`` holding ``metrics.jsonl`` (the trainer's per-step
log), ``eval/`` (the harness's samples and results), ``rule.json`` (the rule it started with, first) and, written
atomically and last, ``done.json`` (the run's result and its rule). A rerun skips runs whose ``done.json`` exists and
restarts the others from scratch; in ``--config`` mode (the engine saves checkpoints) an unfinished run resumes from
its last complete checkpoint instead. A run whose rule changed since (its source file's sha256, its options) is
never "done" nor resumed: it starts over, so a report never mixes versions of a rule.

This module is the scheduler and the method names; the runs come from ``tinyrun`` (the embedded tasks, the
default) or ``configrun`` (``--config``: ``ictrl train``'s own run), and ``gridcli`` turns the shared command-line
options into either.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ictrl.errors import Interrupted, Terminated, UserError, one_line, sigterm_raises
from ictrl.experiments.grid.methods import (Options, changed, entry_label, folder_name, parse_entry, run_identity,
                                            split_entries)
from ictrl.files import atomic_write_text, read_json, reported_write

DONE_FILE = "done.json"
RULE_FILE = "rule.json"  # the rule a run was started with (``methods.run_identity``), written before it trains
EVAL_DIR = "eval"



def _methods() -> dict[str, Any]:
    """Method label (grpo, entropy20, ...) -> its registered selector, in registration order."""
    from ictrl.core.selection import SELECTORS

    return {selector.label: selector for selector in SELECTORS.values()}


METHODS = _methods()
DEFAULT_METHODS = tuple(label for label, selector in METHODS.items() if selector.in_default_grid)


def parse_methods(names: str | Sequence[str]) -> list[str]:
    """``"grpo,ict"`` or ``["grpo", "ict"]`` -> de-duplicated method labels, order kept. Any name the
    selector registry accepts is allowed (``all`` = ``grpo``, ``module:function``), with options of its own as
    ``NAME(key=value, ...)`` (``ictrl.experiments.grid.methods``); the label (``top_h2(ratio=0.2)``) names the runs."""
    items = split_entries(names) if isinstance(names, str) else [n.strip() for n in names if n.strip()]
    if not items:
        raise UserError("methods: need at least one method")
    return list(dict.fromkeys(entry_label(*parse_entry(name)) for name in items))


def theta(rl: dict[str, Any]) -> int:
    """Θ of an embedded-task grid whose settings are ``rl`` (``TinyRL`` as a dict): its ``selection_warmup``, or
    ICT's registered default."""
    return int(rl["selection_warmup"]) if rl.get("selection_warmup") is not None else METHODS["ict"].warmup_steps


@dataclass(frozen=True)
class RunSpec:
    """One cell of the grid; ``lr`` None means the recipe's learning rate. ``options`` are the method's own
    (``top_h2(ratio=0.2)``: ``(("ratio", 0.2),)``). ``ratio`` / ``norm`` override the method's selected fraction /
    loss normaliser (a tuning grid's variants); None keeps its default."""

    method: str
    seed: int
    lr: float | None = None
    ratio: float | None = None
    norm: str | None = None
    options: Options = ()

    @property
    def label(self) -> str:
        """The method with its options, the name of its row: ``ict``, ``top_h2(ratio=0.2)``."""
        return entry_label(self.method, self.options)

    @property
    def variant(self) -> str:
        """The method with its options and overrides, e.g. ``ict``, ``ict-r0.2``, ``random10-per_response_all``,
        ``top_h2-ratio=0.2``."""
        return (self.method + "".join(f"-{k}={v}" for k, v in self.options)
                + (f"-r{self.ratio:g}" if self.ratio is not None else "")
                + (f"-{self.norm}" if self.norm is not None else ""))

    @property
    def relpath(self) -> str:
        """The run's folder under the grid's root; a label's ``/``, ``..`` and the like never leave it."""
        head = f"lr{self.lr:g}/" if self.lr is not None else ""
        return f"{head}{folder_name(self.variant)}/seed{self.seed}"

    def selector_options(self) -> dict[str, Any]:
        """The options the run passes its selector: its own, and the ``ratio`` override where the rule has one."""
        from ictrl.core.selection import get_selector

        given = dict(self.options)
        if self.ratio is not None and "ratio" in get_selector(self.method).options:
            given["ratio"] = self.ratio
        return given


def grid_specs(methods: Sequence[str], seeds: int, lrs: Sequence[float] | None = None) -> list[RunSpec]:
    """Every (lr, method, seed) cell, seeds innermost so that a partial grid covers methods evenly per lr. ``lrs``
    come checked (finite and > 0) from the command's flag: ``compare --learning-rate``, ``sweep --lrs``."""
    if seeds < 1:
        raise UserError(f"seeds: need at least 1, got {seeds}")
    entries = [parse_entry(m) for m in parse_methods(methods)]
    cells = [(m, o, s, lr) for lr in (lrs if lrs is not None else [None]) for s in range(seeds) for m, o in entries]
    specs = [RunSpec(m, s, None if lr is None else float(lr), options=o) for m, o, s, lr in cells]
    folders: dict[str, str] = {}
    for spec in specs:
        other = folders.setdefault(spec.relpath, spec.label)
        if other != spec.label:
            raise UserError(f"methods: {other} and {spec.label} would share the run folder {spec.relpath}; "
                            "rename one's label")
    return specs


def run_grid(
    specs: Sequence[RunSpec],
    root: str | Path,
    run_one: Callable[[RunSpec, Path], dict[str, Any]],
    log: Callable[[str], None] = print,
    jobs: int = 1,
    threads: int | None = None,
) -> dict[RunSpec, dict[str, Any]]:
    """Run every spec without a done marker; returns spec -> result (the content of its ``done.json``).

    ``run_one(spec, run_dir)`` trains and evaluates into ``run_dir`` (which may hold an unfinished attempt: the
    runner decides between resuming and starting over) and returns a JSON-serialisable dict with at least
    ``p1`` and ``p4``. The grid adds ``spec`` and ``seconds`` and writes ``done.json`` atomically, last.

    jobs > 1 runs that many worker processes (spawned; ``run_one`` must be picklable, e.g. a
    ``functools.partial`` of a module-level function), each with ``threads`` torch threads (default 1): on a
    few CPU cores, single-threaded processes side by side get more done with tiny models than one process
    with several threads.
    """
    if jobs < 1:
        raise UserError(f"jobs must be at least 1, got {jobs}")
    root = Path(root)
    identities = {spec: rule_identity(spec) for spec in specs}
    results, todo = _done_and_todo(specs, root, identities, log)
    log(f"grid: {len(specs)} runs, {len(results)} already done, {len(todo)} to run"
        + (f" in {jobs} processes" if jobs > 1 and todo else ""))

    ran: list[float] = []  # seconds of the runs finished by this call, for the ETA

    def finish(spec: RunSpec, result: dict[str, Any], seconds: float) -> None:
        for key in ("p1", "p4"):
            if key not in result:
                raise ValueError(f"{spec.relpath}: the runner's result has no {key!r}")
        result = {"spec": asdict(spec), "seconds": seconds, **result, "selector": identities[spec]}
        done = root / spec.relpath / DONE_FILE
        text = json.dumps(result, indent=1) + "\n"
        with reported_write(done, "the runs finished before it are kept; free space and rerun to go on"):
            atomic_write_text(done, text)
        results[spec] = result = json.loads(text)  # as a rerun reads it back (the options' tuples are lists)
        ran.append(seconds)
        log(f"{progress_bar(len(results), len(specs))} {spec.relpath}: P@1 {result['p1']:.3f} P@4 {result['p4']:.3f} "
            f"final reward {result.get('final_reward', math.nan):.3f} ({seconds:.0f}s)"
            + eta(ran, len(specs) - len(results), min(jobs, len(todo))))

    for spec in todo:
        _prepare_run_dir(root / spec.relpath, spec.relpath, identities[spec], log)
    with _stopped_resumable(root, lambda: len(results), len(specs)):
        if jobs == 1 or len(todo) <= 1:
            for spec in todo:
                start = time.perf_counter()
                result = run_one(spec, root / spec.relpath)
                finish(spec, result, time.perf_counter() - start)
        else:
            _run_in_processes(todo, root, run_one, jobs, threads, finish)
    return {spec: results[spec] for spec in specs}


@contextlib.contextmanager
def _stopped_resumable(root: Path, done: Callable[[], int], total: int) -> Iterator[None]:
    """Ctrl-C or SIGTERM inside the block (SIGTERM raises, as Ctrl-C does) ends it with one line: how many runs are
    done and kept under ``root`` and that the same command goes on (``ictrl.cli`` prints it, exit 130 / 143)."""
    try:
        with sigterm_raises():
            yield
    except (KeyboardInterrupt, Interrupted) as stop:  # Interrupted: a run's own line (ictrl train's), kept first
        how = one_line(stop) if isinstance(stop, Interrupted) else "interrupted"
        kind = Terminated if isinstance(stop, Terminated) else Interrupted
        raise kind(f"{how}; {done()} of {total} runs are done and kept in {root}; rerun the same command to run the "
                   "others") from None


def _prepare_run_dir(run_dir: Path, relpath: str, identity: dict[str, Any], log: Callable[[str], None]) -> None:
    """Make ``run_dir`` ready for a run of the rule ``identity``, recorded in its :data:`RULE_FILE` first. An
    unfinished attempt of another rule (its source or options changed since) is cleared: resuming it would go on
    from the old rule's checkpoints."""
    if run_dir.exists():
        try:
            stored = json.loads((run_dir / RULE_FILE).read_text(encoding="utf-8"))
        except FileNotFoundError:  # an attempt from before runs recorded their rule: kept, as before
            stored = identity
        except (OSError, ValueError):
            stored = "unreadable"
        why = changed(stored, identity)
        log(f"{relpath}: unfinished earlier attempt found (no {DONE_FILE})"
            + (f", of another rule ({why}): starting it over" if why else ""))
        if why:
            shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    with reported_write(run_dir / RULE_FILE, "nothing of this run was written yet; free space and rerun"):
        atomic_write_text(run_dir / RULE_FILE, json.dumps(identity, indent=1) + "\n")


def rule_identity(spec: RunSpec) -> dict[str, Any]:
    """What the run's ``done.json`` records of its rule (``methods.run_identity``)."""
    return run_identity(spec.method, spec.selector_options())


def _done_and_todo(specs: Sequence[RunSpec], root: Path, identities: dict[RunSpec, dict[str, Any]],
                   log: Callable[[str], None]) -> tuple[dict[RunSpec, dict[str, Any]], list[RunSpec]]:
    """(spec -> its ``done.json`` for the specs with a done marker of the same rule, the other specs in order). A
    run whose rule changed since it ran (its source, options or spec: ``methods.changed``) is cleared and run again,
    so a report never mixes versions of a rule."""
    results: dict[RunSpec, dict[str, Any]] = {}
    todo = []
    for spec in specs:
        done = root / spec.relpath / DONE_FILE
        if done.is_file():
            result = read_json(done, f"remove it to run {spec.relpath} again")
            if not isinstance(result, dict) or not all(isinstance(result.get(k), (int, float)) for k in ("p1", "p4")):
                raise UserError(f"{done}: not the result of a finished run (no numbers p1 and p4); remove it to run "
                                f"{spec.relpath} again")
            why = changed(result.get("selector"), identities[spec])
            if not why:
                results[spec] = result
                continue
            log(f"{spec.relpath}: {why}; running it again")
            shutil.rmtree(root / spec.relpath)
        todo.append(spec)
    return results, todo


def _run_in_processes(todo: Sequence[RunSpec], root: Path, run_one: Callable[[RunSpec, Path], dict[str, Any]],
                      jobs: int, threads: int | None,
                      finish: Callable[[RunSpec, dict[str, Any], float], None]) -> None:
    """Run ``todo`` in ``jobs`` spawned worker processes of ``threads`` torch threads each (default 1), calling
    ``finish(spec, result, seconds)`` in this process as each run ends."""
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    ctx = multiprocessing.get_context("spawn")  # fork after torch/OpenMP initialisation can deadlock
    pool = ProcessPoolExecutor(jobs, mp_context=ctx, initializer=_init_worker, initargs=(threads or 1,))
    try:
        pending = {pool.submit(_timed, run_one, spec, root / spec.relpath): spec for spec in todo}
        while pending:
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                spec = pending.pop(future)
                result, seconds = future.result()
                finish(spec, result, seconds)
    except BaseException:
        # Ctrl-C, SIGTERM or a failed run: the pool's own exit would wait for every queued run to finish, with its
        # workers still writing into run folders a rerun starts again; they end now, with nothing recorded.
        _end_workers(pool)
        raise
    pool.shutdown()


def _end_workers(pool: Any) -> None:
    """Kill ``pool``'s worker processes and drop its queued runs, without waiting for them."""
    workers = list((getattr(pool, "_processes", None) or {}).values())  # no public handle before Python 3.14
    pool.shutdown(wait=False, cancel_futures=True)
    for process in workers:
        process.kill()
    for process in workers:
        process.join(timeout=10)


def progress_bar(done: int, total: int, width: int = 20) -> str:
    """``[#####---------------] 5/20``: a text bar that reads the same in a terminal and in a log file."""
    filled = round(width * done / total) if total else width
    return f"[{'#' * filled}{'-' * (width - filled)}] {done}/{total}"


def eta(seconds: Sequence[float], left: int, parallel: int = 1) -> str:
    """``"; ETA 4m10s"``: ``left`` more runs at the mean time of ``seconds`` (this invocation's runs), ``parallel``
    at a time; empty when nothing is left or nothing has been timed."""
    if left <= 0 or not seconds:
        return ""
    total = int(round(math.fsum(seconds) / len(seconds) * math.ceil(left / max(1, parallel))))
    return (f"; ETA {total // 3600}h{total % 3600 // 60:02d}m" if total >= 3600
            else f"; ETA {total // 60}m{total % 60:02d}s")


def _init_worker(threads: int) -> None:
    import torch

    from ictrl.rewards.worker import die_with_parent

    # A killed `ictrl compare` must not leave its workers training on: they would compete with a resumed run for
    # the same run directories (seen: SIGTERM to the parent left both spawned workers at full CPU).
    die_with_parent(os.getppid())
    # Ctrl-C reaches the whole foreground process group: the command ends its workers itself, with one line, so a
    # worker does not print its own KeyboardInterrupt traceback first.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(threads)


def _timed(run_one: Callable[[RunSpec, Path], dict[str, Any]], spec: RunSpec,
           run_dir: Path) -> tuple[dict[str, Any], float]:
    start = time.perf_counter()
    return run_one(spec, run_dir), time.perf_counter() - start


def cached_result(path: Path, compute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``compute()`` once: its JSON result is stored atomically at ``path`` and read back on later calls."""
    if path.is_file():
        stored = read_json(path, "remove it to compute it again")
        if not isinstance(stored, dict):
            raise UserError(f"{path}: not a stored result (a JSON object); remove it to compute it again")
        return stored
    result = compute()
    atomic_write_text(path, json.dumps(result, indent=1) + "\n")
    return result


def final_reward(records: Sequence[dict[str, Any]], window: int = 5) -> float:
    """Mean ``reward`` over the last ``window`` logged steps (NaN when none logged a reward)."""
    rewards = [float(r["reward"]) for r in records if isinstance(r.get("reward"), (int, float))]
    tail = rewards[-window:]
    return math.fsum(tail) / len(tail) if tail else math.nan


def load_grid_metrics(root: Path, specs: Sequence[RunSpec]) -> dict[RunSpec, list[dict[str, Any]]]:
    from ictrl.files import load_metrics

    try:
        return {s: load_metrics(root / s.relpath / "metrics.jsonl") for s in specs}
    except (OSError, ValueError) as exc:  # a torn line names its file and line
        raise UserError(f"{exc}; remove the run's {DONE_FILE} to run it again") from None
