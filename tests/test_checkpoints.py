"""``publish_model``: the final model renamed into the output directory beside the run's files, never seen whole
before it is."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ictrl.checkpoints import MANIFEST, check_weights, finished_run, publish_model, write_manifest


def _staged(root: Path, step: int, shards: list[str]) -> Path:
    staging = root / ".staging-final"
    staging.mkdir(parents=True)
    for name in shards:
        (staging / name).write_bytes(name.encode() * 10)
    (staging / "adapter").mkdir()
    (staging / "adapter" / "adapter_model.bin").write_bytes(b"a")
    (staging / "config.json").write_text("{}")
    (staging / "trainer_state.json").write_text(json.dumps({"global_step": step, "max_steps": step}))
    write_manifest(staging)
    return staging


def _run_dir(tmp_path: Path) -> Path:
    out = tmp_path / "run"
    (out / "checkpoint-2").mkdir(parents=True)
    (out / "checkpoint-2" / "trainer_state.json").write_text(json.dumps({"global_step": 2, "max_steps": 2}))
    for name in ("config.yaml", "run.json", "metrics.jsonl"):
        (out / name).write_text("kept")
    return out


def test_the_model_lands_beside_the_run_files_and_an_earlier_save_is_replaced(tmp_path: Path) -> None:
    out = _run_dir(tmp_path)
    publish_model(_staged(out, 2, ["model-1.bin", "model-2.bin"]), out)
    assert not (out / ".staging-final").exists() and check_weights(out) is None
    assert finished_run(out / "checkpoint-2", 2)
    assert {p.name for p in out.iterdir()} == {"checkpoint-2", "config.yaml", "run.json", "metrics.jsonl",
                                              "model-1.bin", "model-2.bin", "adapter", "config.json",
                                              "trainer_state.json", MANIFEST, ".ictrl-files.json"}
    # listed as ictrl's before they appeared: a rerun with --overwrite replaces them, a foreign file never
    assert {"model-1.bin", "model-2.bin", "adapter", "config.json", MANIFEST} <= set(
        json.loads((out / ".ictrl-files.json").read_text())["files"])
    publish_model(_staged(out, 2, ["model.bin"]), out)  # another shard count: the earlier shards go
    assert not (out / "model-1.bin").exists() and not (out / "model-2.bin").exists() and check_weights(out) is None
    assert all((out / name).read_text() == "kept" for name in ("config.yaml", "run.json", "metrics.jsonl"))
    assert (out / "checkpoint-2" / "trainer_state.json").is_file()


@pytest.mark.parametrize("renames_before_the_kill", [0, 1, 3, 4, 5])
def test_a_kill_mid_publish_leaves_no_model_that_looks_complete(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               renames_before_the_kill: int) -> None:
    out = _run_dir(tmp_path)
    publish_model(_staged(out, 2, ["model.bin"]), out)  # an earlier save of the same run
    staging = _staged(out, 2, ["model-1.bin", "model-2.bin"])
    done: list[str] = []
    real = os.replace

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        if Path(dst).name == ".ictrl-files.json":  # the list of ictrl's files, written before any model file
            return real(src, dst)
        if len(done) == renames_before_the_kill:
            raise KeyboardInterrupt  # the kill
        done.append(Path(dst).name)
        real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        publish_model(staging, out)
    # adapter/, model-1.bin, model-2.bin, then config.json: before it there is no model to load; after it every
    # file of the new one is in place. The run is finished (trainer_state.json) only once the model is whole.
    assert not finished_run(out / "checkpoint-2", 2)
    if (out / "config.json").exists():
        assert renames_before_the_kill > 3
        assert all((out / n).read_bytes() == n.encode() * 10 for n in ("model-1.bin", "model-2.bin"))
    else:
        assert renames_before_the_kill <= 3
