"""Checkpoint directories on disk: which are complete, publishing one in a rename, and what a resume reads of one,
once (``checkpoint_state``). Plain files and ``os`` only; the trainer hooks that use them: ``ictrl.engine.resumable``.

A checkpoint ``checkpoint-N/`` is written in full under ``.staging-…`` and renamed into place (``publish_dir``),
so a directory with the checkpoint name is complete: a kill mid-save leaves only a staging directory, removed on
the next start (``clear_staging``). Before the rename, ``manifest.json`` records every file's size and sha256
(``write_manifest``); ``verify_checkpoint`` checks them before a resume reads the directory, so a file truncated or
changed after the save (a full disk, a copy cut short, bit rot) is found before it is used.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any, Callable

from ictrl.files import claim_files, owned_files

CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
STAGING_PREFIX = ".staging-"
MANIFEST = "manifest.json"
RNG_STATE_RE = re.compile(r"^rng_state(?:_(\d+))?\.pth$")


def complete_checkpoints(output_dir: str | os.PathLike[str]) -> list[Path]:
    """``checkpoint-N`` directories holding a trainer state, oldest first."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir()
             if (m := CHECKPOINT_RE.match(p.name)) and (p / "trainer_state.json").is_file()]
    return [p for _, p in sorted(found)]


# ictrl train's flag for a fresh run in an output directory an earlier run wrote (transformers 5 has no
# overwrite_output_dir): named here, where the advice after a failed write is made
OVERWRITE_FLAG = "--overwrite"


def rerun_advice(output_dir: str | os.PathLike[str], done: str = "") -> str:
    """How to go on after a write into ``output_dir`` failed (a full disk), led by ``done`` (what stopped):
    ``--resume`` when a complete checkpoint is there, else the same command with :data:`OVERWRITE_FLAG` (the run's
    record is there already, so a plain rerun is refused)."""
    lead = f"{done}; " if done else ""
    if complete_checkpoints(output_dir):
        return f"{lead}free space and resume with --resume"
    return f"{lead}no checkpoint yet: free space and run the same command with {OVERWRITE_FLAG}"


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
    _fsync_dir(root)


def publish_dir(staging: Path, final: Path) -> None:
    """Make the fully written ``staging`` directory appear as ``final`` in one rename, listed first in its folder's
    ``.ictrl-files.json`` as ictrl's (:func:`rotate_checkpoints` deletes only checkpoints listed there)."""
    fsync_tree(staging)
    claim_files(final.parent, [final.name])
    if final.exists():
        shutil.rmtree(final)
    os.replace(staging, final)


def own_checkpoints(output_dir: str | os.PathLike[str], legacy: Callable[[Path], bool] | None = None) -> list[Path]:
    """The ``checkpoint-N`` folders in ``output_dir`` that ictrl wrote, oldest first: those its ``.ictrl-files.json``
    lists. Where the list names no checkpoint at all (written before ictrl listed them), a checkpoint holding
    ictrl's ``manifest.json`` counts as its own; where there is no list, every checkpoint does when ``legacy(root)``
    says the folder is an earlier run's (its record, from before the list existed)."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = sorted((int(m.group(1)), p) for p in root.iterdir() if (m := CHECKPOINT_RE.match(p.name)) and p.is_dir())
    owned = owned_files(root)
    if owned is None:
        return [p for _, p in found] if legacy is not None and legacy(root) else []
    unlisted = not any(CHECKPOINT_RE.match(name) for name in owned)
    return [p for _, p in found if p.name in owned or unlisted and (p / MANIFEST).is_file()]


def foreign_checkpoints(output_dir: str | os.PathLike[str], legacy: Callable[[Path], bool] | None = None) -> list[Path]:
    """The ``checkpoint-N`` entries of ``output_dir`` ictrl did not write (:func:`own_checkpoints`), oldest first:
    a run would resume from the newest or delete them in rotation."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    own = set(own_checkpoints(root, legacy))
    found = sorted((int(m.group(1)), p) for p in root.iterdir() if (m := CHECKPOINT_RE.match(p.name)))
    return [p for _, p in found if p not in own]


def rotate_checkpoints(output_dir: str | os.PathLike[str], save_total_limit: int | None,
                       best: str | None = None) -> list[Path]:
    """``save_total_limit`` as transformers' ``rotate_checkpoints`` keeps it (the newest and the best checkpoint
    always stay), counted and deleted among :func:`own_checkpoints` only: a folder ictrl did not write, even one
    named ``checkpoint-N``, is never deleted, nor taken for the newest. Returns the deleted folders."""
    if save_total_limit is None or save_total_limit <= 0:
        return []
    own = own_checkpoints(output_dir)
    if len(own) <= save_total_limit:
        return []
    protected = {own[-1].resolve()} | ({Path(best).resolve()} if best else set())
    keep, deleted = max(save_total_limit, len(protected)), []
    for checkpoint in own:
        if len(own) - len(deleted) <= keep:
            break
        if checkpoint.resolve() not in protected:
            shutil.rmtree(checkpoint, ignore_errors=True)
            deleted.append(checkpoint)
    return deleted


# Renamed last, in this order, by publish_model: config.json is what a loader reads first (without it a directory
# is no model to from_pretrained), the manifest is what ictrl checks the files against, trainer_state.json marks
# the run finished (finished_run).
LAST_FILES = ("config.json", MANIFEST, "trainer_state.json")
RUN_FILES = ("config.yaml", "run.json", "metrics.jsonl", "README.md")  # the run's, never a model save's to remove


def publish_model(staging: Path, out: Path) -> None:
    """Move the fully written model in ``staging`` into ``out``, beside the run's checkpoints and logs, where
    ``Trainer.save_model(output_dir)`` and ``trl grpo`` leave it. ``out`` is not one rename away (it holds the
    checkpoints), so no moment shows a model that is not whole: an earlier save's :data:`LAST_FILES` go first, then
    every other file is renamed in (each rename atomic; a directory such as ``adapter/`` whole), then the
    :data:`LAST_FILES`. A kill in between leaves ``out`` without ``config.json``: no model, and no finished run, so
    ``--resume`` writes it again. Files an earlier save listed that this one lacks are removed."""
    fsync_tree(staging)
    out.mkdir(parents=True, exist_ok=True)
    earlier: set[str] = set()
    if (out / MANIFEST).is_file():
        try:
            earlier = {name.split("/", 1)[0] for name in json.loads((out / MANIFEST).read_text())["files"]}
        except (OSError, ValueError, KeyError, TypeError):
            earlier = set()
    for name in LAST_FILES:
        (out / name).unlink(missing_ok=True)
    entries = sorted(p.name for p in staging.iterdir())
    claim_files(out, entries)  # listed before they appear: the next run replaces them as ictrl's own
    for stale in sorted(earlier - set(entries)):  # a model file of the earlier save only (another shard count)
        path = out / stale
        if path.is_file() and not CHECKPOINT_RE.match(stale) and stale not in RUN_FILES:
            path.unlink()
        elif stale == "adapter" and path.is_dir():
            shutil.rmtree(path)
    _fsync_dir(out)
    for name in [n for n in entries if n not in LAST_FILES] + [n for n in LAST_FILES if n in entries]:
        target = out / name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        os.replace(staging / name, target)
    _fsync_dir(out)
    staging.rmdir()


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def trainer_state(directory: Path) -> dict[str, Any]:
    """``directory/trainer_state.json`` (a checkpoint's, or the final model's), checked for ``global_step``."""
    path = directory / "trainer_state.json"
    try:
        state = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read the trainer state: {exc}") from None
    if not isinstance(state, dict) or not isinstance(state.get("global_step"), int):
        raise ValueError(f"{path}: no integer global_step")
    return state


@dataclasses.dataclass(frozen=True)
class CheckpointState:
    """What a resume reads of a checkpoint folder, once (:func:`checkpoint_state`)."""
    path: Path
    step: int  # its trainer state's global_step
    recorded_max_steps: Any  # the max_steps that trainer state recorded
    world_size: int  # the processes that wrote it (:func:`checkpoint_world_size`)

    def finished(self, max_steps: int) -> bool:
        """Whether the final model beside the checkpoint (:func:`publish_model`) was saved at its step, and that
        step reaches ``max_steps`` (-1: the ``max_steps`` it recorded, from num_train_epochs)."""
        target = max_steps if max_steps > 0 else int(self.recorded_max_steps)
        if self.step < target or not (self.path.parent / "trainer_state.json").is_file():
            return False
        return trainer_state(self.path.parent)["global_step"] == self.step


def checkpoint_state(directory: Path) -> CheckpointState:
    """``directory``'s state; ValueError when its trainer state does not read (:func:`trainer_state`)."""
    state = trainer_state(directory)
    return CheckpointState(directory, state["global_step"], state.get("max_steps", 0), checkpoint_world_size(directory))


def finished_run(checkpoint: Path, max_steps: int) -> bool:
    return checkpoint_state(checkpoint).finished(max_steps)  # CheckpointState.finished, for a path


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(directory: Path) -> None:
    """``directory/manifest.json``: each file's path relative to ``directory``, size and sha256."""
    from ictrl.files import atomic_write_json

    files = {path.relative_to(directory).as_posix(): {"size": path.stat().st_size, "sha256": sha256_file(path)}
             for path in sorted(directory.rglob("*")) if path.is_file() and path.name != MANIFEST}
    atomic_write_json(directory / MANIFEST, {"files": files}, indent=1)


# The files of a checkpoint Trainer resumes without (a fresh optimizer and schedule, unseeded sampling): lost, the
# resume is inexact, not impossible.
TRAINING_STATE_PREFIXES = ("optimizer", "scheduler", "rng_state")


def verify_checkpoint(directory: Path, lost_state_ok: bool = False) -> str | None:
    """None when ``directory`` holds every file its manifest lists, each of the recorded size and sha256; else why
    not, in a phrase. A checkpoint written before manifests existed passes when its trainer state reads and its
    RNG state is there (without it a resumed run samples differently). ``lost_state_ok``: a missing optimizer,
    scheduler or RNG state file passes (an inexact resume, accepted by name); one that is there is still checked."""
    manifest = directory / MANIFEST
    if not manifest.is_file():
        try:
            trainer_state(directory)
        except ValueError as exc:
            return str(exc).removeprefix(f"{directory}/")
        if not lost_state_ok and not any(RNG_STATE_RE.match(p.name) for p in directory.iterdir()):
            return "no rng_state.pth (a resumed run would sample differently)"
        return None
    try:
        files = json.loads(manifest.read_text())["files"]
        entries = [(str(name), int(rec["size"]), str(rec["sha256"])) for name, rec in files.items()]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return f"{MANIFEST} cannot be read ({type(exc).__name__}: {exc})"
    for name, size, digest in entries:
        path = directory / name
        if not path.is_file() and lost_state_ok and "/" not in name and name.startswith(TRAINING_STATE_PREFIXES):
            continue
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != size:
            return f"{name} has {path.stat().st_size} bytes, {size} were written"
        if sha256_file(path) != digest:
            return f"{name} is not the file that was written (sha256 differs)"
    return None


def checkpoint_world_size(directory: Path) -> int:
    """The processes that wrote ``directory``: one RNG state each (``rng_state_N.pth``; one: ``rng_state.pth``)."""
    ranks = [m.group(1) for p in directory.iterdir() if (m := RNG_STATE_RE.match(p.name))]
    return len(ranks) if any(r is not None for r in ranks) else 1
