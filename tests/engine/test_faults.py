"""Faults of a cluster and a disk, without a training run: a checkpoint truncated or changed after its save, a full
disk during a save, a resume that could not be exact. The end-to-end runs are in test_faults_runs.py."""

from __future__ import annotations

import errno
import json
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

FILES = ("model.safetensors", "optimizer.pt", "rng_state.pth", "trainer_state.json")


class _FakeTrainer:
    """Writes a checkpoint file by file as Trainer._save_checkpoint does; ``fail`` is raised at file ``fail_at``."""

    def __init__(self, run_dir: Path, step: int, fail_at: int | None = None, fail: BaseException | None = None):
        self.run_dir, self.fail_at, self.fail = run_dir, fail_at, fail
        self.state = SimpleNamespace(global_step=step, best_model_checkpoint=None)
        self.args = SimpleNamespace(should_save=True, save_total_limit=None)
        self.accelerator = SimpleNamespace(wait_for_everyone=lambda: None)

    def _get_output_dir(self, trial: Any = None) -> str:
        return str(self.run_dir)

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        out = Path(self._get_output_dir(trial)) / f"checkpoint-{self.state.global_step}"
        out.mkdir(parents=True, exist_ok=True)
        for i, name in enumerate(FILES):
            if i == self.fail_at:
                (out / name).write_bytes(b"half a fi")  # a torn file, as a full disk leaves it
                raise self.fail  # type: ignore[misc]
            if name.endswith((".pt", ".pth")):  # a real pickle: the resume loads it as the Trainer would
                torch.save({"name": name}, out / name)
                continue
            body = json.dumps({"global_step": self.state.global_step}) if name == "trainer_state.json" else name * 50
            (out / name).write_text(body)


def _save(run_dir: Path, step: int, **kwargs: Any) -> None:
    from ictrl.engine.resumable import Resumable

    trainer = _FakeTrainer(run_dir, step, **kwargs)
    Resumable(trainer).save_checkpoint(trainer._save_checkpoint, None, None)


def _args(**kwargs: Any) -> SimpleNamespace:
    base = dict(gradient_accumulation_steps=4, steps_per_generation=4, num_iterations=2, world_size=1, max_steps=8,
                lr_scheduler_type="constant", warmup_steps=0)
    return SimpleNamespace(**{**base, **kwargs})


def _cfg(out: Path) -> Any:
    from ictrl.train_cli.run_config import config_from_dict

    return config_from_dict({"model_name_or_path": "m", "output_dir": str(out)})


def test_manifest_lists_every_file_with_its_size_and_hash(tmp_path: Path) -> None:
    import hashlib

    from ictrl.checkpoints import MANIFEST, verify_checkpoint

    _save(tmp_path, 2)
    ckpt = tmp_path / "checkpoint-2"
    files = json.loads((ckpt / MANIFEST).read_text())["files"]
    assert sorted(files) == sorted(FILES)
    for name, rec in files.items():
        data = (ckpt / name).read_bytes()
        assert rec == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert verify_checkpoint(ckpt) is None


@pytest.mark.parametrize("damage, reason", [
    (lambda p: p.write_bytes(p.read_bytes()[:10]), "model.safetensors has 10 bytes, 850 were written"),
    (lambda p: p.write_bytes(p.read_bytes()[::-1]), "model.safetensors is not the file that was written (sha256 differs)"),
    (lambda p: p.unlink(), "model.safetensors is missing"),
])
def test_a_damaged_checkpoint_is_skipped_for_the_previous_one(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                              damage: Any, reason: str) -> None:
    from ictrl.train_cli.output_dir import prepare_output_dir

    for step in (2, 4):
        _save(tmp_path, step)
    damage(tmp_path / "checkpoint-4" / "model.safetensors")
    with caplog.at_level(logging.WARNING, logger="ictrl.train"):
        assert prepare_output_dir(_cfg(tmp_path), True, args=_args()) == tmp_path / "checkpoint-2"
    assert [r.getMessage() for r in caplog.records] == [f"--resume: skipping {tmp_path / 'checkpoint-4'}: {reason}"]


def test_no_intact_checkpoint_is_one_error(tmp_path: Path) -> None:
    from ictrl.train_cli.output_dir import prepare_output_dir
    from ictrl.errors import ConfigError

    _save(tmp_path, 2)
    (tmp_path / "checkpoint-2" / "rng_state.pth").unlink()
    with pytest.raises(ConfigError, match="no checkpoint in the output_dir is complete"):
        prepare_output_dir(_cfg(tmp_path), True, args=_args())


def test_a_checkpoint_without_a_manifest_needs_its_rng_state(tmp_path: Path) -> None:
    from ictrl.checkpoints import MANIFEST, verify_checkpoint

    _save(tmp_path, 2)
    ckpt = tmp_path / "checkpoint-2"
    (ckpt / MANIFEST).unlink()  # written before manifests existed
    assert verify_checkpoint(ckpt) is None
    (ckpt / "rng_state.pth").unlink()
    assert "no rng_state.pth" in str(verify_checkpoint(ckpt))


def test_resume_skips_a_checkpoint_inside_a_generation_batch(tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """num_iterations 2: a generation batch spans 2 optimizer steps; checkpoint-3 (a max_steps=3 run's last save)
    holds none of its second half's samples."""
    from ictrl.engine.resumable import resume_point
    from ictrl.errors import ConfigError

    for step in (2, 3):
        _save(tmp_path, step)
    verified = [tmp_path / "checkpoint-3", tmp_path / "checkpoint-2"]
    with caplog.at_level(logging.WARNING, logger="ictrl.train"):
        assert resume_point(verified, _args()) == tmp_path / "checkpoint-2"
    assert "skipping checkpoint-3: step 3 falls inside a generation batch" in caplog.text
    assert resume_point(verified, _args(num_iterations=1)) == tmp_path / "checkpoint-3"
    with pytest.raises(ConfigError, match="every checkpoint falls inside a generation batch"):
        resume_point(verified[:1], _args())
    with pytest.raises(ConfigError, match=r"written by 1 process\(es\) and this run has 2.*--num-processes 1"):
        resume_point(verified, _args(world_size=2))


def test_checkpoint_world_size_from_its_rng_states(tmp_path: Path) -> None:
    from ictrl.checkpoints import checkpoint_world_size

    (tmp_path / "rng_state.pth").touch()
    assert checkpoint_world_size(tmp_path) == 1
    (tmp_path / "rng_state.pth").unlink()
    for rank in range(3):
        (tmp_path / f"rng_state_{rank}.pth").touch()
    assert checkpoint_world_size(tmp_path) == 3


def test_resume_without_a_checkpoint_refuses_unless_auto(tmp_path: Path) -> None:
    from ictrl.train_cli.output_dir import prepare_output_dir
    from ictrl.errors import ConfigError

    with pytest.raises(ConfigError, match=f"output_dir {tmp_path / 'typo'} does not exist;.*--resume=auto"):
        prepare_output_dir(_cfg(tmp_path / "typo"), True, args=_args())
    with pytest.raises(ConfigError, match="holds no checkpoint"):
        prepare_output_dir(_cfg(tmp_path), True, args=_args())
    assert prepare_output_dir(_cfg(tmp_path), "auto", args=_args()) is None


def test_a_config_change_that_changes_the_steps_is_refused(tmp_path: Path) -> None:
    import yaml

    from ictrl.train_cli.exact_resume import check_unchanged
    from ictrl.errors import ConfigError

    saved = tmp_path / "config.yaml"
    before = {"model_name_or_path": "m", "learning_rate": 2e-4, "max_steps": 3, "save_steps": 2}
    saved.write_text(yaml.safe_dump(before))
    check_unchanged(saved, {**before, "max_steps": 6, "save_steps": 4}, _args())  # a longer run: allowed
    with pytest.raises(ConfigError, match=r"learning_rate: 0.0002 -> 0.001"):
        check_unchanged(saved, {**before, "learning_rate": 1e-3}, _args())
    with pytest.raises(ConfigError, match=r"model_name_or_path: 'm' -> 'other'"):
        check_unchanged(saved, {**before, "model_name_or_path": "other"}, _args())
    with pytest.raises(ConfigError, match=r"max_steps: 3 -> 6 \(the linear learning-rate schedule spans max_steps"):
        check_unchanged(saved, {**before, "max_steps": 6}, _args(lr_scheduler_type="linear"))


# --- a full disk during a save --------------------------------------------------------------------------------


@pytest.mark.parametrize("fail", [
    OSError(errno.ENOSPC, "No space left on device"),
    RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 5184 vs 5072"),  # torch.save's
])
def test_a_full_disk_during_a_save_is_one_line_and_leaves_nothing(tmp_path: Path, fail: BaseException) -> None:
    from ictrl.errors import WriteError

    _save(tmp_path, 2)
    before = {p.name: p.read_bytes() for p in (tmp_path / "checkpoint-2").iterdir()}
    with pytest.raises(WriteError) as caught:
        _save(tmp_path, 4, fail_at=1, fail=fail)
    message = str(caught.value)
    assert message.startswith(f"cannot write {tmp_path / 'checkpoint-4'}: ")
    assert " free); checkpoint-2 is intact; free space and resume with --resume" in message
    assert "\n" not in message
    # no staging, no torn checkpoint-4
    assert sorted(p.name for p in tmp_path.iterdir()) == [".ictrl-files.json", "checkpoint-2"]
    assert {p.name: p.read_bytes() for p in (tmp_path / "checkpoint-2").iterdir()} == before


def test_an_error_that_is_not_a_write_failure_keeps_its_traceback(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="a bug"):
        _save(tmp_path, 2, fail_at=1, fail=ValueError("a bug"))


def test_free_space_is_read_from_the_nearest_existing_directory(tmp_path: Path) -> None:
    from ictrl.files import free_space

    assert free_space(tmp_path / "not" / "yet").endswith(" free")


# --- metrics.jsonl and the lock on a full disk ------------------------------------------------------------------


def _state(step: int) -> SimpleNamespace:
    return SimpleNamespace(global_step=step, is_world_process_zero=True)


def test_resume_cuts_metrics_in_place_so_tail_follows(tmp_path: Path) -> None:
    from ictrl.train_cli.callbacks import MetricsJSONL

    path = tmp_path / "metrics.jsonl"
    rows = "".join(json.dumps({"step": s, "loss": s / 10}) + "\n" for s in range(1, 6))
    path.write_text(rows + '{"step": 6, "lo')  # step 6 cut by a kill
    inode = path.stat().st_ino
    cb = MetricsJSONL(path)
    cb.on_train_begin(None, _state(3), None)  # resumed from checkpoint-3: steps 4 and 5 are redone
    cb.on_log(None, _state(4), None, logs={"loss": 0.25})
    cb.on_train_end(None, _state(4), None)
    assert path.stat().st_ino == inode  # the same file, not a replacement
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 3, 4]
    assert json.loads(path.read_text().splitlines()[-1])["loss"] == 0.25


@pytest.mark.parametrize("checkpoint, advice", [
    (True, "free space and resume with --resume"),
    (False, "no checkpoint yet: free space and run the same command with --overwrite"),  # --resume would refuse
])
def test_a_metrics_row_the_disk_has_no_room_for_is_not_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                checkpoint: bool, advice: str) -> None:
    import os

    from ictrl.train_cli.callbacks import MetricsJSONL
    from ictrl.errors import WriteError

    if checkpoint:
        (tmp_path / "checkpoint-1").mkdir()
        (tmp_path / "checkpoint-1" / "trainer_state.json").write_text('{"global_step": 1}')
    path = tmp_path / "metrics.jsonl"
    cb = MetricsJSONL(path)
    cb.on_train_begin(None, _state(0), None)
    cb.on_log(None, _state(1), None, logs={"loss": 0.5})
    before = path.read_bytes()
    real_write = os.write

    def half_then_full(fd: int, data: Any) -> int:  # the disk takes a few bytes, then is full
        if len(data) > 8:
            return real_write(fd, bytes(data[:8]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(WriteError, match=rf"^cannot write {path}: No space left on device \(.* free\); the run "
                                         rf"stopped at step 2; {advice}$"):
        cb.on_log(None, _state(2), None, logs={"loss": 0.4})
    monkeypatch.undo()
    assert path.read_bytes() == before  # no torn row
    cb.on_train_end(None, _state(2), None)


def test_no_room_for_the_lock_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from ictrl.dirlock import LOCK_NAME, OutputLock
    from ictrl.errors import WriteError

    def full(*args: Any) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    with pytest.raises(WriteError, match=rf"cannot write {tmp_path / LOCK_NAME}: No space left on device \(.* "
                                         r"free\); the run did not start"):
        OutputLock(tmp_path).acquire()
    monkeypatch.undo()
    with OutputLock(tmp_path):  # the failed attempt released everything
        pass


# --- SIGTERM ----------------------------------------------------------------------------------------------------


def test_sigterm_outside_the_loop_raises_and_inside_it_is_a_request(caplog: pytest.LogCaptureFixture) -> None:
    import os
    import signal

    from ictrl.train_cli.run_guard import StopRequest
    from ictrl.errors import Terminated

    before = signal.getsignal(signal.SIGTERM)
    with StopRequest() as stop:
        with pytest.raises(Terminated):  # loading: nothing to save, stop now
            os.kill(os.getpid(), signal.SIGTERM)
        assert stop.before_training
        stop.training = True
        with caplog.at_level(logging.WARNING, logger="ictrl.train"):
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)  # a launcher passing the scheduler's on adds nothing
        assert stop.received
        assert caplog.text.count("SIGTERM: stopping at the end of this generation batch") == 1
    assert signal.getsignal(signal.SIGTERM) == before


def test_a_requested_stop_waits_for_the_end_of_the_generation_batch() -> None:
    from ictrl.train_cli.callbacks import StopNow, StopOnRequest

    saved: list[int] = []
    state = SimpleNamespace(global_step=1, max_steps=10)
    request = SimpleNamespace(received=False, training=False)
    callback = StopOnRequest(request, lambda step: step % 2 == 0, lambda: saved.append(state.global_step))
    control = SimpleNamespace(should_save=False, should_training_stop=False)
    callback.on_train_begin(None, state, control)
    assert request.training
    callback.on_step_end(None, state, control)
    assert not control.should_training_stop  # no request yet
    request.received = True
    callback.on_step_end(None, state, control)  # step 1 is inside the batch: go on to step 2
    assert not control.should_save and not control.should_training_stop
    state.global_step = 2
    callback.on_step_end(None, state, control)
    assert control.should_save and control.should_training_stop and saved == []  # the trainer saves step 2

    # a request that arrives while step 2 is logged or saved: stop before step 3 does anything
    control = SimpleNamespace(should_save=False, should_training_stop=False)
    with pytest.raises(StopNow):
        callback.on_step_begin(None, state, control)
    assert saved == [2]
    state.global_step = 3
    callback.on_step_begin(None, state, control)  # inside a batch: the step runs, its end decides
    assert saved == [2]
