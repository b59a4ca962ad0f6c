"""What ictrl installs for the whole process (exit and signal handlers, the unraisable hook, logger levels and
filters, warnings filters, the import path) is tabled in docs/architecture.md ("Process-global hooks"), each kind
found in the source named there, and each hook pinned by a test here or named in the table."""

from __future__ import annotations

import logging
import re
import signal
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
START, END = "<!-- global-hooks: start -->", "<!-- global-hooks: end -->"

# Each kind of process-global hook -> how it reads in the source.
HOOKS = {
    "unraisable hook": r"\bsys\.unraisablehook\s*=[^=]",
    "excepthook": r"\bsys\.excepthook\s*=[^=]",
    "exit handler": r"\batexit\.register\(",
    "warnings filter": r"\bwarnings\.(filterwarnings|simplefilter)\(",
    "logger filter": r"\.addFilter\(",
    "logger level": r"\.setLevel\(|\blogging\.(basicConfig|disable)\(",
    "signal handler": r"\bsignal\.signal\(",
    "import path": r"\bsys\.path\.(append|insert)\(",
}


def _table() -> list[list[str]]:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    rows = text.split(START, 1)[1].split(END, 1)[0].strip().splitlines()[2:]
    return [[cell.strip() for cell in row.strip("|").split(" | ")] for row in rows]


def installers() -> dict[str, list[str]]:
    """Each file of ``src/ictrl`` that installs a hook -> the kinds it installs (comments aside)."""
    found: dict[str, list[str]] = {}
    for path in sorted((ROOT / "src" / "ictrl").rglob("*.py")):
        code = "\n".join(line.split("#", 1)[0] for line in path.read_text(encoding="utf-8").splitlines())
        kinds = [kind for kind, pattern in HOOKS.items() if re.search(pattern, code)]
        if kinds:
            found[str(path.relative_to(ROOT))] = kinds
    return found


def test_the_table_names_every_file_that_installs_a_hook_and_no_other() -> None:
    tabled = [row[0].strip("`") for row in _table()]
    assert len(tabled) == len(set(tabled))
    found = installers()
    assert sorted(set(found) - set(tabled)) == []  # a new hook: add its row (where, scope, why, the test)
    assert sorted(set(tabled) - set(found)) == []  # a hook gone: its row goes too
    assert {"src/ictrl/process_exit.py", "src/ictrl/library_noise.py"} <= set(found)  # the scan scans


def test_each_hook_is_pinned_by_a_test_that_exists() -> None:
    missing = []
    for row in _table():
        tests = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", row[-1])
        if not tests:
            missing.append(f"{row[0]}: no test named")
        for file, name in tests:
            path = ROOT / file
            if not path.is_file() or not re.search(rf"^def {name}\(", path.read_text(encoding="utf-8"), re.M):
                missing.append(f"{row[0]}: {file}::{name}")
    assert missing == []


@pytest.fixture
def loggers_restored() -> Iterator[None]:
    """Every logger's level, filters and handlers (the root's included) as they were before the test."""
    names = [None, *logging.root.manager.loggerDict]
    saved = {}
    for name in names:
        logger = logging.getLogger(name)
        saved[name] = (logger.level, list(logger.filters), list(logger.handlers))
    yield
    for name, (level, filters, handlers) in saved.items():
        logger = logging.getLogger(name)
        logger.setLevel(level)
        logger.filters[:], logger.handlers[:] = filters, handlers
    for name in set(logging.root.manager.loggerDict) - set(names):  # made during the test
        logger = logging.getLogger(name)
        logger.setLevel(logging.NOTSET)
        logger.filters[:], logger.handlers[:] = [], []


def _record(name: str, message: str, level: int = logging.WARNING) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, message, None, None)


def test_quiet_drops_the_named_notes_and_keeps_the_rest(loggers_restored: None,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from ictrl.library_noise import quiet

    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "INFO")  # the user's own setting stays
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        quiet()  # its filter goes first
        deepspeed, accelerator = logging.getLogger("DeepSpeed"), logging.getLogger("accelerate.accelerator")
        assert not deepspeed.filter(_record("DeepSpeed", "Setting accelerator to CPU."))
        assert deepspeed.filter(_record("DeepSpeed", "ZeRO stage 3 on 2 processes"))
        assert not accelerator.filter(_record("accelerate.accelerator", "Gradient accumulation steps mismatch: 1, 4"))
        assert accelerator.filter(_record("accelerate.accelerator", "anything else"))
        assert logging.getLogger("vllm").level == logging.ERROR
        warnings.warn("`torch.distributed.all_gather_into_tensor` is deprecated", FutureWarning)
        warnings.warn("other", FutureWarning)
    assert [str(w.message) for w in seen] == ["other"]
    import os

    assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1" and os.environ["VLLM_LOGGING_LEVEL"] == "INFO"


def test_a_stopped_command_ignores_a_further_ctrl_c(monkeypatch: pytest.MonkeyPatch) -> None:
    from ictrl import process_exit

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setattr(process_exit, "_RESERVE", [])
    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)
    handler = signal.getsignal(signal.SIGINT)
    try:
        for status, ignored in ((0, False), (2, False), (130, True), (143, True)):
            signal.signal(signal.SIGINT, signal.default_int_handler)
            with pytest.raises(SystemExit) as exited:
                process_exit.run_then_exit(lambda status=status: status)
            assert exited.value.code == status
            assert (signal.getsignal(signal.SIGINT) is signal.SIG_IGN) is ignored, status
    finally:
        signal.signal(signal.SIGINT, handler)
        process_exit.release_reserve()


@pytest.mark.parametrize(("rank", "verbose", "level"), [("0", False, logging.INFO), ("1", False, logging.ERROR),
                                                         ("1", True, logging.INFO)])
def test_ictrl_train_logs_info_from_rank_zero_and_errors_elsewhere(rank: str, verbose: bool, level: int,
                                                                    loggers_restored: None,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from ictrl.train_cli.cli import _setup_logging

    monkeypatch.setenv("RANK", rank)
    monkeypatch.setenv("ICTRL_VERBOSE", "1" if verbose else "0")
    _setup_logging()
    assert logging.root.level == level and len(logging.root.handlers) == 1
    assert all(logging.getLogger(name).level == logging.WARNING for name in ("httpx", "urllib3", "filelock"))


@pytest.mark.parametrize("verbose", [False, True])
def test_the_launchers_loggers_are_silent_unless_verbose(verbose: bool, loggers_restored: None,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import accelerate.commands.launch

    from ictrl.train_cli.launch import LAUNCHER_LOGGERS, Launch, run_launch

    launched: list[Any] = []
    monkeypatch.setattr(accelerate.commands.launch, "launch_command", launched.append)
    monkeypatch.setenv("ICTRL_VERBOSE", "1" if verbose else "0")
    monkeypatch.delenv("ICTRL_DEBUG", raising=False)
    for name in LAUNCHER_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET)
    assert run_launch(Launch(num_processes=2), ["c.yaml"]) == 0 and len(launched) == 1
    levels = {logging.getLogger(name).level for name in LAUNCHER_LOGGERS}
    assert levels == ({logging.NOTSET} if verbose else {logging.CRITICAL})


def test_the_launch_parents_checks_log_only_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    from ictrl.train_cli import trainer_inputs

    seen: list[int] = []
    checked = trainer_inputs.TrainerInputs(args=None, init_kwargs={})
    monkeypatch.setattr(trainer_inputs, "build_trainer_inputs",
                        lambda *args, **kwargs: seen.append(trainer_inputs.log.level) or checked)
    for name in ("existing_checkpoints", "check_inputs", "check_enough_rows"):  # the files the checks would read
        monkeypatch.setattr(trainer_inputs, name, lambda *args, **kwargs: None)
    before = trainer_inputs.log.level
    trainer_inputs.check_before_launch(None, processes=2)  # type: ignore[arg-type]
    assert seen == [logging.ERROR] and trainer_inputs.log.level == before


@pytest.mark.parametrize("verbose", [False, True])
def test_the_tied_head_note_is_dropped_unless_verbose(verbose: bool, loggers_restored: None,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from ictrl.train_cli.run import hide_tied_head_note

    monkeypatch.setenv("ICTRL_VERBOSE", "1" if verbose else "0")
    trainer = logging.getLogger("transformers.trainer")
    monkeypatch.setattr(trainer, "filters", [])  # an earlier in-process run of the suite may have added the filter
    hide_tied_head_note()
    note = "There were missing keys in the checkpoint model loaded: ['lm_head.weight']."
    assert bool(trainer.filter(_record("transformers.trainer", note))) is verbose
    assert trainer.filter(_record("transformers.trainer", "There were missing keys: ['model.norm.weight']"))


def test_the_grader_registers_its_worker_shutdown_at_import() -> None:
    """The one exit handler registered by importing a module of ictrl's: a no-op without a worker pool."""
    script = ("import atexit\nseen = []\nregister = atexit.register\n"
              "atexit.register = lambda f, *a, **k: (seen.append(f.__module__ + '.' + f.__qualname__), "
              "register(f, *a, **k))[1]\n"
              "import ictrl.rewards.verify\nprint([s for s in seen if s.startswith('ictrl.')])\n"
              "ictrl.rewards.verify.shutdown_workers()\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "['ictrl.rewards.verify.shutdown_workers']"
