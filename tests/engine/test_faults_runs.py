"""Faults injected into real runs of the tiny model (6 steps, checkpoints every 3, as test_resume): SIGTERM during a
save and in the middle of a step, a truncated checkpoint file, a full disk during a save. Each ends in one line with
a documented exit status and nothing torn on disk, and the run resumed from what was left equals the uninterrupted
one (``uninterrupted_reference``) metric for metric and weight for weight."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from test_resume import STEPS, TIMING_KEYS, command, rows

# The reward of test_resume (the same module name: the reference run's config names it), with three hooks for the
# faults: hold the N-th reward call until a file appears (the run is then in the middle of a step), send this
# process SIGTERM during the first checkpoint's save, or fail the save of checkpoint-6 as a full disk fails it.
FAULTS_MODULE = '''
import os, signal, time
from pathlib import Path
from ictrl.rewards import completion_text

_calls = 0

def letters(prompts=None, completions=None, **columns):
    global _calls
    _calls += 1
    if _calls == int(os.environ.get("ICTRL_TEST_HOLD_AT", "0")):
        Path(os.environ["ICTRL_TEST_HELD"]).write_text("held")
        while not Path(os.environ["ICTRL_TEST_RELEASE"]).exists():
            time.sleep(0.05)
    texts = [completion_text(c) for c in completions]
    return [sum(ch.isalpha() for ch in t) / max(len(t), 1) for t in texts]

if os.environ.get("ICTRL_TEST_TERM_IN_SAVE"):
    import ictrl.engine.resumable as _resumable
    _write_manifest = _resumable.write_manifest

    def _term_then_write(directory):
        os.kill(os.getpid(), signal.SIGTERM)
        _resumable.write_manifest = _write_manifest
        return _write_manifest(directory)

    _resumable.write_manifest = _term_then_write

if os.environ.get("ICTRL_TEST_FULL_AT"):
    import torch
    _save = torch.save

    def _full_disk_save(obj, f, *args, **kwargs):
        if os.environ["ICTRL_TEST_FULL_AT"] in str(f):
            Path(f).write_bytes(b"PK\\x03\\x04 the first bytes")
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 466")
        return _save(obj, f, *args, **kwargs)

    torch.save = _full_disk_save
'''


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    (tmp_path / "ictrl_resume_reward.py").write_text(FAULTS_MODULE)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
            "OMP_NUM_THREADS": "1", "ICTRL_TEST_HELD": str(tmp_path / "held"),
            "ICTRL_TEST_RELEASE": str(tmp_path / "release"), **extra}


def _ictrl_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("ictrl train")]


def _clean(run: Path) -> None:
    """Nothing torn: no staging directory, no checkpoint without its manifest, no final model of a cut run."""
    from ictrl.checkpoints import verify_checkpoint

    assert not list(run.glob(".staging-*"))
    for checkpoint in run.glob("checkpoint-*"):
        assert (checkpoint / "manifest.json").is_file() and verify_checkpoint(checkpoint) is None, checkpoint


def _same_run(ref: Path, run: Path) -> None:
    from safetensors.torch import load_file

    expected, got = rows(ref), rows(run)
    assert [r["step"] for r in got] == [r["step"] for r in expected] == list(range(1, STEPS + 1))
    bad = [(want["step"], key) for want, have in zip(expected, got) for key, value in want.items()
           if key not in TIMING_KEYS and isinstance(value, (int, float))
           and not math.isclose(have[key], value, rel_tol=1e-5, abs_tol=1e-7)]
    assert not bad, bad
    a, b = load_file(ref / "model.safetensors"), load_file(run / "model.safetensors")
    assert a.keys() == b.keys() and all((a[k] - b[k]).abs().max().item() <= 1e-6 for k in a)


def _wait_for(path: Path, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 600
    while not path.exists():
        assert proc.poll() is None, proc.stderr.read()[-3000:] if proc.stderr else "exited"
        assert time.monotonic() < deadline, f"never saw {path}"
        time.sleep(0.05)


@pytest.mark.integration
def test_sigterm_and_a_truncated_checkpoint_then_resume_matches(tiny_model_dir: Path, uninterrupted_reference: Path,
                                                                 tmp_path: Path) -> None:
    run = tmp_path / "run"

    # SIGTERM while checkpoint-3 is being saved: the save completes, the run stops before step 4 does anything.
    # transformers' enable_jit_checkpoint asks for this stop: its own save (mid-batch) must not happen.
    first = subprocess.run(command(tiny_model_dir, run, "--enable_jit_checkpoint=true"),
                           env=_env(tmp_path, ICTRL_TEST_TERM_IN_SAVE="1"), capture_output=True, text=True,
                           timeout=600)
    assert first.returncode == 143, first.stderr[-3000:]
    lines = _ictrl_lines(first.stderr)
    assert len(lines) == 1 and lines[0].startswith(
        f"ictrl train: terminated (SIGTERM) at step 3; last complete checkpoint {run / 'checkpoint-3'}; resume with "
        "`ictrl train ") and lines[0].endswith(" --resume`"), lines
    assert "Traceback" not in first.stderr and "done:" not in first.stderr and "finished" not in first.stderr
    assert [r["step"] for r in rows(run)] == [1, 2, 3]
    assert not (run / "model.safetensors").exists()
    _clean(run)

    # SIGTERM in the middle of step 5 (its reward is being computed): step 5 is finished and saved, then the stop
    env = _env(tmp_path, ICTRL_TEST_HOLD_AT="2")  # the resumed process's second step
    proc = subprocess.Popen(command(tiny_model_dir, run, "--resume"), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    _wait_for(tmp_path / "held", proc)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    (tmp_path / "release").write_text("go")
    _, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 143, stderr[-3000:]
    lines = _ictrl_lines(stderr)
    assert len(lines) == 1 and lines[0].startswith(
        f"ictrl train: terminated (SIGTERM) at step 5; last complete checkpoint {run / 'checkpoint-5'}; "), lines
    assert "Traceback" not in stderr and "done:" not in stderr
    assert [r["step"] for r in rows(run)] == [1, 2, 3, 4, 5]
    _clean(run)

    # checkpoint-5's weights cut short (a copy or a disk that failed after the save): resume falls back to 3
    weights = run / "checkpoint-5" / "model.safetensors"
    size = weights.stat().st_size
    weights.write_bytes(weights.read_bytes()[: size // 2])
    done = subprocess.run(command(tiny_model_dir, run, "--resume"), env=_env(tmp_path), capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (f"--resume: skipping {run / 'checkpoint-5'}: model.safetensors has {size // 2} bytes, {size} were "
            "written") in done.stderr
    assert f"resuming from {run / 'checkpoint-3'}" in done.stderr
    _same_run(uninterrupted_reference, run)


@pytest.mark.integration
def test_a_full_disk_during_a_save_then_resume_matches(tiny_model_dir: Path, uninterrupted_reference: Path,
                                                       tmp_path: Path) -> None:
    run = tmp_path / "run"
    failed = subprocess.run(command(tiny_model_dir, run), env=_env(tmp_path, ICTRL_TEST_FULL_AT="checkpoint-6"),
                            capture_output=True, text=True, timeout=600)
    assert failed.returncode == 2, failed.stderr[-3000:]
    lines = _ictrl_lines(failed.stderr)
    assert len(lines) == 1 and lines[0].startswith(f"ictrl train: error: cannot write {run / 'checkpoint-6'}: "
                                                   "[enforce fail at inline_container.cc:672] . unexpected pos"), lines
    assert lines[0].endswith(" free); checkpoint-3 is intact; free space and resume with --resume")
    assert "Traceback" not in failed.stderr
    assert sorted(p.name for p in run.glob("*checkpoint*")) == ["checkpoint-3"]
    assert not (run / "model.safetensors").exists()
    _clean(run)

    done = subprocess.run(command(tiny_model_dir, run, "--resume"), env=_env(tmp_path), capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    _same_run(uninterrupted_reference, run)



@pytest.mark.integration
def test_sigterm_to_the_launcher_of_two_processes_stops_them_at_one_step(tiny_model_dir: Path,
                                                                         tmp_path: Path) -> None:
    """What Kubernetes does: SIGTERM to the container's first process, here `ictrl train --num-processes 2`. The
    launcher passes it to the ranks, which finish the step they are in, save it and stop together; the resumed run
    is the subject of test_launcher_kill (a 2-process resume from a checkpoint equals the uninterrupted run)."""
    import mp_worker as w

    run = tmp_path / "run"
    launch = [*command(tiny_model_dir, run), "--num-processes", "2", "--main-process-port", str(w.free_port())]
    proc = subprocess.Popen(launch, env=_env(tmp_path, ICTRL_TEST_HOLD_AT="5"), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    _wait_for(tmp_path / "held", proc)
    proc.send_signal(signal.SIGTERM)
    time.sleep(1)
    (tmp_path / "release").write_text("go")
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 143, stderr[-3000:]
    lines = _ictrl_lines(stderr)
    assert len(lines) == 1 and lines[0].startswith(
        f"ictrl train: terminated (SIGTERM) at step 5; last complete checkpoint {run / 'checkpoint-5'}; resume with "
        "`ictrl train ") and lines[0].endswith(" --num-processes 2 --main-process-port " + launch[-1] + " --resume`"), \
        stderr[-3000:]
    assert "Traceback" not in stderr and "death signal" not in stderr and "done:" not in stderr, stderr[-3000:]
    assert [r["step"] for r in rows(run)] == [1, 2, 3, 4, 5]
    assert sorted(p.name for p in (run / "checkpoint-5").glob("rng_state*")) == ["rng_state_0.pth", "rng_state_1.pth"]
    _clean(run)


@pytest.mark.integration
def test_a_checkpoint_inside_a_generation_batch_is_passed_over_for_an_exact_resume(tiny_model_dir: Path,
                                                                                    tmp_path: Path) -> None:
    """Two optimizer steps per generation batch (num_iterations 2): a 3-step run's last checkpoint falls inside a
    batch, whose completions no checkpoint holds. Extended to 6 steps, --resume passes over it (one line) for the
    one before, and the result equals an uninterrupted 6-step run."""
    batch = ["--num_iterations=2", "--save_steps=2"]
    ref, run = tmp_path / "ref", tmp_path / "run"
    done = subprocess.run(command(tiny_model_dir, ref, *batch), env=_env(tmp_path), capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    short = subprocess.run(command(tiny_model_dir, run, *batch, "--max_steps=3"), env=_env(tmp_path),
                           capture_output=True, text=True, timeout=600)
    assert short.returncode == 0, short.stderr[-3000:]
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-3"]

    longer = subprocess.run(command(tiny_model_dir, run, *batch, "--resume"), env=_env(tmp_path),
                            capture_output=True, text=True, timeout=600)
    assert longer.returncode == 0, longer.stderr[-3000:]
    assert "--resume: skipping checkpoint-3: step 3 falls inside a generation batch" in longer.stderr
    assert f"resuming from {run / 'checkpoint-2'}" in longer.stderr
    _same_run(ref, run)
