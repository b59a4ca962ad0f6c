"""Fault injection on the launched path: ``kill -9`` of ``accelerate launch`` in the middle of a step (1 process, and
2 CPU processes on gloo) leaves no rank running; a ``--resume`` started while the run still goes is refused with
one line naming the holder; the ``--resume`` after the kill takes the dead run's lock and ends with the metrics and
weights of an uninterrupted run (on 2 processes a launch; on one the plain run test_resume matches too)."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import mp_worker as w
from fixtures.procs import pid_alive
from ictrl import cli
from test_resume import BLOCK_AT, REWARD_MODULE, SAVE_STEPS, STEPS, TIMING_KEYS, command, rows


def launch(processes: int, args: list[str]) -> list[str]:
    head = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", str(processes),
            "--mixed_precision", "no"]
    if processes > 1:
        head += ["--multi_gpu", "--main_process_port", str(w.free_port())]
    return [*head, "-m", "ictrl.cli", *args]


def children(pid: int) -> list[int]:
    """Live processes whose parent is ``pid`` (the ranks of a launcher)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] not in ("Z", "X"):
            found.append(int(stat.parent.name))
    return found


@pytest.mark.integration
@pytest.mark.parametrize("processes", [1, 2])
def test_kill_launcher_then_resume_matches_uninterrupted(processes: int, tiny_model_dir: Path, shared_data: Path,
                                                         tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         request: pytest.FixtureRequest) -> None:
    (tmp_path / "ictrl_resume_reward.py").write_text(REWARD_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))  # the in-process --resume imports the same reward
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
           "ICTRL_TEST_BLOCKED": str(tmp_path / "blocked"), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    run = tmp_path / "run"
    train = command(tiny_model_dir, run)[3:]  # ["train", CONFIG, --flags...]
    if processes == 1:  # one launched process trains as one plain process: the run test_resume matches too
        ref = request.getfixturevalue("uninterrupted_reference")
    else:
        ref = tmp_path / "ref"
        done = subprocess.run(launch(processes, command(tiny_model_dir, ref)[3:]), env=env, capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]

    launcher = subprocess.Popen(launch(processes, train), env={**env, "ICTRL_TEST_BLOCK_AT": str(BLOCK_AT)},
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not (tmp_path / "blocked").exists():
            assert launcher.poll() is None, launcher.stderr.read()[-3000:] if launcher.stderr else "exited"
            assert time.monotonic() < deadline, "the run never reached the blocking step"
            time.sleep(0.05)
        ranks = children(launcher.pid)
        assert len(ranks) == processes and (run / f"checkpoint-{SAVE_STEPS}" / "trainer_state.json").is_file()

        # a second writer while the run goes: one line naming the holder (the first rank)
        assert cli.main([*train, "--resume"]) == 2
        errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
        assert len(errors) == 1 and "is in use by another run (pid " in errors[0], errors
        holder = int(errors[0].split("(pid ", 1)[1].split()[0])
        assert holder in ranks
        if processes > 1:  # and a launched one: rank 0's verdict reaches every rank, none hangs or writes
            before = sorted(p.name for p in run.iterdir())
            second = subprocess.run(launch(processes, [*train, "--resume"]), env=env, capture_output=True, text=True,
                                    timeout=300)
            assert second.returncode != 0 and f"is in use by another run (pid {holder} " in second.stderr
            assert sorted(p.name for p in run.iterdir()) == before

        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait(timeout=60)
        deadline = time.monotonic() + 30
        while any(map(pid_alive, ranks)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(map(pid_alive, ranks)), "a rank outlived its launcher"
    finally:
        launcher.kill()
    assert not (run / "model.safetensors").exists()
    assert [r["step"] for r in rows(run)] == list(range(1, BLOCK_AT))

    done = subprocess.run(launch(processes, [*train, "--resume"]), env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"taking over the lock of pid {holder} " in done.stderr
    assert "resuming from" in done.stderr and f"checkpoint-{SAVE_STEPS}" in done.stderr

    expected, got = rows(ref), rows(run)
    assert [r["step"] for r in got] == [r["step"] for r in expected] == list(range(1, STEPS + 1))
    assert len({round(r["grad_norm"], 9) for r in expected}) == STEPS  # the steps differ: a real run
    mismatches = [(want["step"], key, value, have[key]) for want, have in zip(expected, got)
                  for key, value in want.items() if key not in TIMING_KEYS and isinstance(value, (int, float))
                  and not math.isclose(have[key], value, rel_tol=1e-5, abs_tol=1e-7)]
    assert sum(isinstance(v, (int, float)) for r in expected for v in r.values()) > 100
    from safetensors.torch import load_file

    final_ref, final_run = load_file(ref / "model.safetensors"), load_file(run / "model.safetensors")
    assert final_ref.keys() == final_run.keys()
    mismatches += [(STEPS, name, 0.0, (tensor - final_run[name]).abs().max().item()) for name, tensor in final_ref.items()
                   if (tensor - final_run[name]).abs().max().item() > 1e-6]
    assert not mismatches, mismatches[:5]
