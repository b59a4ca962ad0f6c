"""``publish_model``: the final model renamed into the output directory beside the run's files, never seen whole
before it is."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ictrl.checkpoints import MANIFEST, check_weights, checkpoint_state, publish_model, write_manifest


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
    assert checkpoint_state(out / "checkpoint-2").finished(2)
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
    assert not checkpoint_state(out / "checkpoint-2").finished(2)
    if (out / "config.json").exists():
        assert renames_before_the_kill > 3
        assert all((out / n).read_bytes() == n.encode() * 10 for n in ("model-1.bin", "model-2.bin"))
    else:
        assert renames_before_the_kill <= 3


def _checkpoint(root: Path, step: int, rng: object, manifest: bool = True) -> Path:
    """A checkpoint's files as the Trainer writes them: trainer state, an optimizer state, the RNG states (numpy's
    among them), ``rng`` written as rng_state.pth."""
    import numpy as np
    import torch

    path = root / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "trainer_state.json").write_text(json.dumps({"global_step": step, "max_steps": 8}))
    torch.save({"state": {0: {"exp_avg": torch.zeros(3)}}, "param_groups": []}, path / "optimizer.pt")
    torch.save(rng if rng is not None else {"python": (3, tuple(range(5)), None), "numpy": np.random.get_state(),
                                            "cpu": torch.get_rng_state()}, path / "rng_state.pth")
    if manifest:
        write_manifest(path)
    return path


@pytest.mark.parametrize("damage", ["refused-pickle", "refused-with-its-manifest", "garbage"])
def test_a_checkpoint_whose_pickles_cannot_load_safely_is_passed_over(damage: str, tmp_path: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    """As a truncated checkpoint is: the newest one torch's weights_only loading refuses (or cannot read at all) is
    skipped with a line naming the file, and the last readable one resumes."""
    import argparse
    import logging

    from ictrl.engine.resumable import verified_checkpoints

    good = _checkpoint(tmp_path, 2, None)
    bad = _checkpoint(tmp_path, 4, argparse.Namespace(seed=1), manifest=damage != "refused-pickle")
    if damage == "garbage":
        (bad / "optimizer.pt").write_bytes(b"\x80\x04not a pickle at all")
        write_manifest(bad)
    with caplog.at_level(logging.WARNING, logger="ictrl.train"):
        assert verified_checkpoints([good, bad]) == [good]
    line = " ".join(r.getMessage() for r in caplog.records)
    assert "skipping" in line and str(bad) in line
    assert ("optimizer.pt cannot be read" if damage == "garbage" else
            "rng_state.pth: torch's safe loading refuses it (Unsupported global: GLOBAL argparse.Namespace") in line


def test_the_model_digest_sees_new_weights_of_the_same_shapes_without_reading_them_whole(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``model_digest`` (what ``--resume`` compares for the base model): new weights of the same shapes (the file's
    size and safetensors header unchanged) change it, a file sampled rather than read whole too; a copy of the
    folder elsewhere, a later mtime or a README edit do not."""
    import shutil

    import torch
    from safetensors.torch import save_file

    import ictrl.checkpoints as checkpoints

    model = tmp_path / "model"
    model.mkdir()
    weights = {"embed_tokens.weight": torch.randn(64, 32), "lm_head.weight": torch.randn(64, 32)}
    save_file(weights, model / "model.safetensors")
    (model / "config.json").write_text('{"vocab_size": 64}')
    (model / "README.md").write_text("card")
    for whole in (checkpoints.WHOLE_FILE_BYTES, 1024):  # hashed whole; sampled (header + blocks)
        monkeypatch.setattr(checkpoints, "WHOLE_FILE_BYTES", whole)
        monkeypatch.setattr(checkpoints, "SAMPLE_BYTES", 256)
        before = checkpoints.model_digest(model)
        size = (model / "model.safetensors").stat().st_size
        shutil.copytree(model, tmp_path / f"copy-{whole}")
        assert checkpoints.model_digest(tmp_path / f"copy-{whole}") == before
        (model / "README.md").write_text("another card")
        os.utime(model / "model.safetensors", (0, 0))
        assert checkpoints.model_digest(model) == before
        save_file({k: v + 1e-3 for k, v in weights.items()}, model / "model.safetensors")
        assert (model / "model.safetensors").stat().st_size == size
        assert checkpoints.model_digest(model) != before
        save_file(weights, model / "model.safetensors")
        assert checkpoints.model_digest(model) == before
        (model / "config.json").write_text('{"vocab_size": 64, "rope_theta": 1}')
        assert checkpoints.model_digest(model) != before
        (model / "config.json").write_text('{"vocab_size": 64}')
    assert checkpoints.model_digest("Qwen/Qwen2.5-0.5B") is None  # not a folder: the caller resolves a hub id
