"""``ictrl.model_files``: a model folder's digest, which ``--resume`` compares."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def test_the_model_digest_sees_new_weights_of_the_same_shapes_without_reading_them_whole(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``model_digest`` (what ``--resume`` compares for the base model): new weights of the same shapes (the file's
    size and safetensors header unchanged) change it, a file sampled rather than read whole too; a copy of the
    folder elsewhere, a later mtime or a README edit do not."""
    import shutil

    import torch
    from safetensors.torch import save_file

    import ictrl.model_files as model_files

    model = tmp_path / "model"
    model.mkdir()
    weights = {"embed_tokens.weight": torch.randn(64, 32), "lm_head.weight": torch.randn(64, 32)}
    save_file(weights, model / "model.safetensors")
    (model / "config.json").write_text('{"vocab_size": 64}')
    (model / "README.md").write_text("card")
    for whole in (model_files.WHOLE_FILE_BYTES, 1024):  # hashed whole; sampled (header + blocks)
        monkeypatch.setattr(model_files, "WHOLE_FILE_BYTES", whole)
        monkeypatch.setattr(model_files, "SAMPLE_BYTES", 256)
        before = model_files.model_digest(model)
        size = (model / "model.safetensors").stat().st_size
        shutil.copytree(model, tmp_path / f"copy-{whole}")
        assert model_files.model_digest(tmp_path / f"copy-{whole}") == before
        (model / "README.md").write_text("another card")
        os.utime(model / "model.safetensors", (0, 0))
        assert model_files.model_digest(model) == before
        save_file({k: v + 1e-3 for k, v in weights.items()}, model / "model.safetensors")
        assert (model / "model.safetensors").stat().st_size == size
        assert model_files.model_digest(model) != before
        save_file(weights, model / "model.safetensors")
        assert model_files.model_digest(model) == before
        (model / "config.json").write_text('{"vocab_size": 64, "rope_theta": 1}')
        assert model_files.model_digest(model) != before
        (model / "config.json").write_text('{"vocab_size": 64}')
    assert model_files.model_digest("Qwen/Qwen2.5-0.5B") is None  # not a folder: the caller resolves a hub id
