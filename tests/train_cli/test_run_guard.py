"""One writer per output directory (a flock naming its holder; a killed holder's lock is taken), and a rank that
ends with its launcher."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from fixtures.procs import pid_alive
from ictrl import cli
from ictrl.dirlock import LOCK_NAME, OutputLock
from ictrl.errors import ConfigError
from ictrl.files import claim_files

TINY = Path(__file__).resolve().parents[2] / "configs" / "tiny" / "ict.yaml"


def test_second_writer_stops_naming_the_holder(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    with OutputLock(out) as held:
        assert (out / LOCK_NAME).read_text().startswith(f"pid {os.getpid()} on ")
        with pytest.raises(ConfigError, match=rf"{out} is in use by another run \(pid {os.getpid()} on "):
            OutputLock(out).acquire()  # a flock excludes a second open even in the same process
        assert held.path.is_file()
    assert (out / LOCK_NAME).read_text() == ""  # released in order
    with OutputLock(out):
        pass


def test_resume_while_the_run_goes_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    import ictrl.models

    monkeypatch.setattr(ictrl.models, "load_model_and_tokenizer", lambda *a, **k: pytest.fail("model loaded"))
    out = tmp_path / "run"
    (out / "checkpoint-1").mkdir(parents=True)
    claim_files(out, ["checkpoint-1"])  # the running run's, as ictrl lists its checkpoints
    staged = out / ".staging-checkpoint-2"
    staged.mkdir()
    with OutputLock(out):
        code = cli.main(["train", str(TINY), f"--output_dir={out}", "--dataset_name=[gsm8k_train]", "--resume"])
    err = capsys.readouterr().err
    assert code == 2
    errors = [line for line in err.splitlines() if "error" in line]
    assert errors == [f"ictrl train: error: output_dir: {out} is in use by another run (pid {os.getpid()} on "
                      f"{os.uname().nodename}, lock {out / LOCK_NAME}); wait for it to end or stop it"]
    assert staged.is_dir()  # the second writer touched nothing of the first's


HOLD = """
import os, sys, time
from ictrl.dirlock import OutputLock
lock = OutputLock(sys.argv[1])  # held while the object lives
lock.acquire()
print("held", flush=True)
time.sleep(600)
"""


def test_lock_of_a_killed_run_is_taken(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    out = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(ConfigError, match=f"pid {holder.pid} on "):
            OutputLock(out).acquire()
    finally:
        holder.kill()
        holder.wait(timeout=30)
    with caplog.at_level(logging.WARNING, logger="ictrl.train"), OutputLock(out) as lock:
        assert lock.path.read_text().startswith(f"pid {os.getpid()} ")
    assert f"taking over the lock of pid {holder.pid} on " in caplog.text


def test_refused_run_leaves_no_directory(tmp_path: Path) -> None:
    out = tmp_path / "new" / "run"
    with pytest.raises(RuntimeError), OutputLock(out):
        raise RuntimeError("stopped before writing anything")
    assert not out.exists()
    with OutputLock(out):
        (out / "metrics.jsonl").write_text("{}\n")
    assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME, "metrics.jsonl"]


LAUNCHER = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", sys.argv[1]], start_new_session=True)  # as torch elastic does
time.sleep(600)
"""
RANK = """
import os, time
from ictrl.train_cli.run_guard import die_with_launcher
assert die_with_launcher()
print(os.getpid(), flush=True)
time.sleep(600)
"""


def test_rank_dies_with_its_launcher(tmp_path: Path) -> None:
    env: dict[str, Any] = {**os.environ, "TORCHELASTIC_RUN_ID": "test"}
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, RANK], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert launcher.stdout is not None
        rank = int(launcher.stdout.readline())
        assert pid_alive(rank)
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait(timeout=30)
        deadline = time.monotonic() + 30
        while pid_alive(rank) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not pid_alive(rank)
    finally:
        launcher.kill()


def test_plain_process_is_not_tied_to_its_parent() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TORCHELASTIC_RUN_ID"}
    code = "from ictrl.train_cli.run_guard import die_with_launcher; print(die_with_launcher())"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False", done.stderr[-2000:]


@pytest.mark.parametrize("name, written", [
    ("metrics.jsonl", True), ("config.yaml", True), ("config.json", True), ("model-00001-of-00002.safetensors", True),
    ("tokenizer.json", True), ("adapter_config.json", True), ("checkpoint-3/rows.jsonl", True),
    (".staging-final/x.py", True), ("rows.jsonl", False), ("my_reward.py", False), ("data/metrics.jsonl", False),
    ("model-notes.jsonl", False),
])
def test_what_a_run_writes_in_its_output_dir(tmp_path: Path, name: str, written: bool) -> None:
    from ictrl.train_cli.output_dir import written_by_run

    assert written_by_run(tmp_path / "out" / name, tmp_path / "out") is written
    assert not written_by_run(tmp_path / "elsewhere" / name, tmp_path / "out")
