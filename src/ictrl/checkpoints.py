"""Checkpoint directories on disk: which ones are complete, publishing a directory in one rename, and a saved
trainer state's step. Plain files and ``os`` only; the trainer hooks that use them are in
``ictrl.engine.resumable``.

A checkpoint ``checkpoint-N/`` is written in full under ``.staging-…`` and renamed into place (``publish_dir``),
so a directory with the checkpoint name is complete: a kill mid-save leaves only a staging directory, removed on
the next start (``clear_staging``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
STAGING_PREFIX = ".staging-"


def complete_checkpoints(output_dir: str | os.PathLike[str]) -> list[Path]:
    """``checkpoint-N`` directories holding a trainer state, oldest first."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir()
             if (m := CHECKPOINT_RE.match(p.name)) and (p / "trainer_state.json").is_file()]
    return [p for _, p in sorted(found)]


def clear_staging(output_dir: str | os.PathLike[str]) -> None:
    """Remove the staging directories a kill during a save left in ``output_dir``."""
    root = Path(output_dir)
    if root.is_dir():
        for stale in root.glob(f"{STAGING_PREFIX}*"):
            shutil.rmtree(stale, ignore_errors=True)


def fsync_tree(root: Path) -> None:
    """fsync every file under ``root``, then ``root`` itself."""
    for path in sorted(root.rglob("*")):
        if path.is_file():
            with open(path, "rb") as fh:
                os.fsync(fh.fileno())
    fd = os.open(root, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish_dir(staging: Path, final: Path) -> None:
    """Make the fully written ``staging`` directory appear as ``final`` in one rename."""
    fsync_tree(staging)
    if final.exists():
        shutil.rmtree(final)
    os.replace(staging, final)


def trainer_state(directory: Path) -> dict[str, Any]:
    """``directory/trainer_state.json`` (a checkpoint's, or final/'s), checked for ``global_step``."""
    path = directory / "trainer_state.json"
    try:
        state = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read the trainer state: {exc}") from None
    if not isinstance(state, dict) or not isinstance(state.get("global_step"), int):
        raise ValueError(f"{path}: no integer global_step")
    return state


def finished_run(checkpoint: Path, max_steps: int) -> bool:
    """True when ``final/`` beside ``checkpoint`` was saved at the checkpoint's step and that step reaches
    ``max_steps`` (-1: the ``max_steps`` the checkpoint recorded, from num_train_epochs)."""
    state = trainer_state(checkpoint)
    step = state["global_step"]
    target = max_steps if max_steps > 0 else int(state.get("max_steps", 0))
    final = checkpoint.parent / "final"
    if step < target or not (final / "trainer_state.json").is_file():
        return False
    return trainer_state(final)["global_step"] == step
