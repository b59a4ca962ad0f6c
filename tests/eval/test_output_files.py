"""``ictrl eval --output-dir`` as a user runs it: a file there that ictrl did not write is never replaced, one run at
a time writes the folder (its lock names the holder's pid), and a resumed evaluation leaves each problem once."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ictrl.cli import main
from ictrl.eval.harness import RESULTS_JSON, SAMPLES_FILE
from ictrl.files import LOCK_NAME

OUTPUT_FILES = ("settings.json", "samples.jsonl", "results.json", "results.md")  # what eval writes at the top
OWNED_FILE = ".ictrl-files.json"  # ictrl's list of the files it wrote there

PROBLEMS = 6


@pytest.fixture
def rows(tmp_path: Path) -> Path:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"question": f"{i}+1?", "answer": str(i + 1)}) + "\n"
                            for i in range(PROBLEMS)))
    return path


def eval_args(model: Path, rows: Path, out: Path | str, *extra: str) -> list[str]:
    return ["eval", "--model", str(model), "--benchmarks", f"jsonl:{rows}", "--n", "2", "--k", "1",
            "--max-new-tokens", "4", "--chunk-size", "2", "--method", "base", "--output-dir", str(out),
            "--no-progress", *extra]


def errors(err: str) -> list[str]:
    assert "Traceback" not in err, err
    return [line for line in err.splitlines() if line.startswith("ictrl eval: error:")]


def digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def keys(out: Path) -> list[tuple[int, str, str]]:
    return [(r["seed"], r["benchmark"], r["problem_id"])
            for r in map(json.loads, (out / SAMPLES_FILE).read_text().splitlines())]


@pytest.mark.parametrize("name", OUTPUT_FILES)
def test_a_file_ictrl_did_not_write_is_never_replaced(name: str, tiny_model_dir: Path, rows: Path, tmp_path: Path,
                                                      loader_calls: list[Any],
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "eval"
    out.mkdir()
    (out / name).write_text('{"mine": true}\n')
    before = digest(out)
    assert main(eval_args(tiny_model_dir, rows, out)) == 2
    assert errors(capsys.readouterr().err) == [
        f"ictrl eval: error: --output-dir: {out / name} was not written by ictrl and the command would replace it; "
        "choose another output directory or move the file away"]
    assert digest(out) == before and not loader_calls


def test_output_dir_dot_in_a_project_folder_is_refused(tiny_model_dir: Path, rows: Path, tmp_path: Path,
                                                       loader_calls: list[Any], monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    (project / "README.md").write_text("# my project\n")
    (project / "results.json").write_text('{"my": "numbers"}\n')
    monkeypatch.chdir(project)
    before = digest(project)
    assert main(eval_args(tiny_model_dir, rows, ".")) == 2
    lines = errors(capsys.readouterr().err)
    assert len(lines) == 1 and "--output-dir: results.json was not written by ictrl" in lines[0], lines
    assert digest(project) == before and not loader_calls


def test_a_held_folder_is_one_line_naming_the_holder(tiny_model_dir: Path, rows: Path, tmp_path: Path,
                                                     loader_calls: list[Any],
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    import fcntl

    out = tmp_path / "eval"
    out.mkdir()
    with open(out / ".ictrl.lock", "w") as held:  # held as ictrl train holds it: a flock, the holder written in it
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write(f"pid {os.getpid()} on host\n")
        held.flush()
        assert main(eval_args(tiny_model_dir, rows, out)) == 2
    lines = errors(capsys.readouterr().err)
    assert len(lines) == 1 and lines[0].startswith(f"ictrl eval: error: --output-dir: {out} is in use by another "
                                                   f"run (pid {os.getpid()} on host, lock "), lines
    assert "wait for it to end or stop it" in lines[0] and not loader_calls
    assert not (out / SAMPLES_FILE).exists()


def test_a_resumed_eval_leaves_each_problem_once(tiny_model_dir: Path, rows: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "eval"
    assert main(eval_args(tiny_model_dir, rows, out)) == 0
    once = keys(out)
    assert len(once) == len(set(once)) == PROBLEMS
    assert set(json.loads((out / OWNED_FILE).read_text())["files"]) >= set(OUTPUT_FILES)
    samples = (out / SAMPLES_FILE).read_text()
    # the folder of two unlocked runs of an older ictrl: every row twice, no list of ictrl's files
    (out / SAMPLES_FILE).write_text(samples + samples)
    (out / OWNED_FILE).unlink()
    assert main(eval_args(tiny_model_dir, rows, out)) == 0
    assert (out / SAMPLES_FILE).read_text() == samples
    assert len(json.loads((out / RESULTS_JSON).read_text())["records"]) == PROBLEMS


@pytest.mark.integration
def test_two_evals_at_once_into_one_folder(tiny_model_dir: Path, rows: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """The same command twice at once: while one holds the folder, the other stops in one line naming its pid; a
    rerun then adds nothing. The first is paused once it holds its lock, so the second always meets it held."""
    out = tmp_path / "eval"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-m", "ictrl", *eval_args(tiny_model_dir, rows, out, "--max-new-tokens", "16")]
    first = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lock, holder, deadline = out / LOCK_NAME, f"pid {first.pid} on ", time.monotonic() + 300
    while holder not in (lock.read_text() if lock.exists() else ""):
        assert first.poll() is None and time.monotonic() < deadline, ("the first eval ended or stalled before it "
                                                                     "was seen holding its lock", first.returncode)
        time.sleep(0.002)
    first.send_signal(signal.SIGSTOP)
    try:
        assert first.poll() is None, "the first eval had ended when it was paused"
        second = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    finally:
        first.send_signal(signal.SIGCONT)
    _, first_err = first.communicate(timeout=600)
    assert (first.returncode, second.returncode) == (0, 2), (first_err[-2000:], second.stderr[-2000:])
    lines = errors(second.stderr)
    assert len(lines) == 1 and f"is in use by another run ({holder}" in lines[0], lines
    assert sorted(keys(out)) == sorted(set(keys(out))) and len(keys(out)) == PROBLEMS
    samples = (out / SAMPLES_FILE).read_text()
    assert main(eval_args(tiny_model_dir, rows, out, "--max-new-tokens", "16")) == 0
    assert (out / SAMPLES_FILE).read_text() == samples


def test_a_full_disk_while_claiming_the_folder_is_one_line_before_the_model(tiny_model_dir: Path, rows: Path,
                                                                           tmp_path: Path, loader_calls: list[Any],
                                                                           monkeypatch: pytest.MonkeyPatch,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Every write into --output-dir under the lock reports a full disk as one line, the list of ictrl's files too."""
    import errno

    import ictrl.files

    def full(path: Path, data: object, **kwargs: Any) -> Path:
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(ictrl.files, "atomic_write_json", full)
    out = tmp_path / "eval"
    assert main(eval_args(tiny_model_dir, rows, out)) == 2
    lines = errors(capsys.readouterr().err)
    assert len(lines) == 1 and lines[0].startswith(
        f"ictrl eval: error: cannot write {out / OWNED_FILE}: No space left on device ("), lines
    assert not loader_calls and not (out / SAMPLES_FILE).exists()
