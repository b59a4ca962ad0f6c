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
# the run finished (CheckpointState.finished).
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


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")


def _weight_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.is_file() and p.suffix in WEIGHT_SUFFIXES
                  and not p.name.startswith(("optimizer", "scheduler", "rng_state", "training_args")))


def safetensors_problem(path: Path) -> str | None:
    """Why the safetensors file ``path`` cannot be whole (its header promises more bytes than it has, or cannot be
    read), or None: a check of the layout, without reading the tensors."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
            length = int.from_bytes(head, "little") if len(head) == 8 else -1
            if not 0 < length <= size - 8:
                return f"{path.name} has {size} bytes, too few for its header"
            header = json.loads(fh.read(length))
        end = max((int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"), default=0)
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError, RecursionError) as exc:
        return f"{path.name}: unreadable safetensors header ({type(exc).__name__})"
    if 8 + length + end != size:
        return f"{path.name} has {size} bytes, its header describes {8 + length + end}"
    return None


def check_weights(directory: str | os.PathLike[str]) -> str | None:
    """Why the model directory's weights are not whole, or None (also for a hub id or a directory without weight
    files): every file its manifest lists, when it has one (``verify_checkpoint``), and each safetensors file's
    length against its header."""
    root = Path(directory)
    if not root.is_dir():
        return None
    if (root / MANIFEST).is_file():
        problem = verify_checkpoint(root)
        if problem is not None:
            return problem
    for path in _weight_files(root):
        if path.suffix == ".safetensors" and (problem := safetensors_problem(path)) is not None:
            return problem
    return None


def _recorded_files(root: Path) -> dict[str, Any]:
    """The per-file records (size, sha256) of ``root``'s ictrl manifest, or {} where it has none or it cannot be
    read (the digests then hash the files themselves)."""
    try:
        recorded = json.loads((root / MANIFEST).read_text())["files"] if (root / MANIFEST).is_file() else {}
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    return recorded if isinstance(recorded, dict) else {}


def weights_digest(directory: str | os.PathLike[str]) -> str | None:
    """The sha256 over the model directory's weight files (name and sha256 of each; from its manifest when it has
    one, so a verified checkpoint is not hashed twice); None for a hub id or a directory without weights."""
    root = Path(directory)
    if not root.is_dir():
        return None
    files = _weight_files(root)
    if not files:
        return None
    recorded = _recorded_files(root)
    digest = hashlib.sha256()
    for path in files:
        known = recorded.get(path.name)
        file_hash = known["sha256"] if isinstance(known, dict) and "sha256" in known else sha256_file(path)
        digest.update(f"{path.name}\0{file_hash}\n".encode())
    return digest.hexdigest()


# model_digest: files up to this size are hashed whole (config, tokenizer, a tiny model's weights); a larger one by
# its size, its safetensors header and SAMPLE_BLOCKS blocks of SAMPLE_BYTES spread over it.
WHOLE_FILE_BYTES = 16 << 20
SAMPLE_BLOCKS, SAMPLE_BYTES = 64, 64 << 10


def model_digest(directory: str | os.PathLike[str]) -> str | None:
    """A sha256 that changes when the model folder's files do, without reading big weights whole: each file
    ``from_pretrained`` reads at the folder's top (weights, configs, tokenizer, custom code) by name and size; a
    small file's whole content; a large one's safetensors header (names, dtypes, shapes, offsets) and
    :data:`SAMPLE_BLOCKS` blocks spread over its bytes (new weights of the same shapes change every block). A file
    ictrl's ``manifest.json`` records is known by its recorded sha256 (``check_weights`` verified them before).
    None for a hub id."""
    root = Path(directory)
    if not root.is_dir():
        return None
    recorded = _recorded_files(root)
    digest = hashlib.sha256()
    for path in sorted(p for p in root.iterdir() if p.is_file() and _model_file(p.name)):
        name, size = path.name, path.stat().st_size
        known = recorded.get(name)
        if isinstance(known, dict) and known.get("size") == size and "sha256" in known:
            content = str(known["sha256"])
        else:
            content = sha256_file(path) if size <= WHOLE_FILE_BYTES else _sampled_sha256(path, size)
        digest.update(f"{name}\0{size}\0{content}\n".encode())
    return digest.hexdigest()


# What from_pretrained reads of a model folder (weights, configs, tokenizer files, custom code); a run's own record
# beside a model it wrote (run.json, its trainer state, its arguments) is not the model.
_MODEL_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".json", ".model", ".txt", ".tiktoken", ".jinja", ".py")
_NOT_MODEL = frozenset({"run.json", "trainer_state.json", MANIFEST, "training_args.bin"})


def _model_file(name: str) -> bool:
    return not name.startswith(".") and name.endswith(_MODEL_SUFFIXES) and name not in _NOT_MODEL


def _sampled_sha256(path: Path, size: int) -> str:
    """sha256 of a large file's safetensors header (when it has one) and of blocks spread evenly over it."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        if path.suffix == ".safetensors":
            length = int.from_bytes(fh.read(8), "little")
            if 0 < length <= min(size - 8, 100 << 20):
                digest.update(fh.read(length))
        span = max(size - SAMPLE_BYTES, 0)
        for i in range(SAMPLE_BLOCKS):
            fh.seek(span * i // (SAMPLE_BLOCKS - 1))
            digest.update(fh.read(SAMPLE_BYTES))
    return digest.hexdigest()


# The tokenizer files transformers reads from a model folder, one set per tokenizer kind. A folder with none
# complete makes AutoTokenizer fall back to another tokenizer with a note, and generation crash later.
TOKENIZER_FILES = (("tokenizer.json",), ("vocab.json", "merges.txt"), ("tokenizer.model",), ("spiece.model",),
                   ("sentencepiece.bpe.model",), ("vocab.txt",))
EMBEDDING_NAMES = ("embed_tokens.weight", "wte.weight", "word_embeddings.weight", "embed_in.weight")
# The JSON files transformers reads from a model folder (the weights' index too): each must be one JSON object
MODEL_JSON_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                    "special_tokens_map.json", "added_tokens.json", "vocab.json", "preprocessor_config.json",
                    "chat_template.json", "model.safetensors.index.json", "pytorch_model.bin.index.json")


def model_folder_problem(directory: str | os.PathLike[str]) -> str | None:
    """Why the local model folder cannot load as itself, or None (also for a hub id): a JSON file transformers
    reads is torn or not JSON; it has no complete set of tokenizer files; its config's ``vocab_size`` disagrees
    with the embedding rows in its safetensors header. Reads the JSON files and the headers only."""
    root = Path(directory)
    problem = json_files_problem(root)
    if problem is not None:
        return problem
    try:
        config = json.loads((root / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None  # no folder or no config: check_model says so
    if not isinstance(config, dict):
        return None
    own = any(root.glob("*.tiktoken")) or "auto_map" in _json_text(root / "tokenizer_config.json")  # its own code
    if not own and not any(all((root / name).is_file() for name in kind) for kind in TOKENIZER_FILES):
        partial = next((kind for kind in TOKENIZER_FILES if any((root / name).is_file() for name in kind)), None)
        missing = ([n for n in partial if not (root / n).is_file()] if partial else
                   ["tokenizer.json (or vocab.json and merges.txt, or tokenizer.model)"])
        return (f"the tokenizer files are missing: {', '.join(missing)} (transformers would fall back to another "
                "tokenizer); copy the model's tokenizer files into the folder")
    return vocab_problem(root, config)


def json_files_problem(root: Path) -> str | None:
    """The first of the folder's :data:`MODEL_JSON_FILES` that is not one JSON object (torn by a copy cut short, or
    a link to another file), named with why, or None. transformers would stop on it with a traceback."""
    for name in MODEL_JSON_FILES:
        path = root / name
        if not path.is_file():
            continue
        link = f" (a link to {os.readlink(path)})" if path.is_symlink() else ""
        try:
            value = json.loads(path.read_bytes())
        except OSError as exc:
            return f"{name}{link} cannot be read ({exc.strerror or exc})"
        except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            why = f"{exc.msg} at line {exc.lineno}" if isinstance(exc, json.JSONDecodeError) else type(exc).__name__
            return f"{name}{link} is not valid JSON ({why}): torn or not the model's; copy it again from the model"
        if not isinstance(value, dict):
            return f"{name}{link} holds a JSON {type(value).__name__}, not the object transformers reads"
        missing = [key for key in _REQUIRED_KEYS.get(name, ()) if key not in value]
        if missing:
            return f"{name}{link} is not a {name} (no {', '.join(map(repr, missing))}); copy it again from the model"
    return None


# what transformers reads of a file without checking it is there (a KeyError otherwise)
_REQUIRED_KEYS = {"tokenizer.json": ("model", "added_tokens")}


def _json_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, ValueError):
        return ""


def vocab_problem(root: Path, config: dict[str, Any]) -> str | None:
    """config.json's ``vocab_size`` against the embedding rows its safetensors header records, or None."""
    vocab = config.get("vocab_size", (config.get("text_config") or {}).get("vocab_size"))
    found = embedding_rows(root)
    if not isinstance(vocab, int) or found is None:
        return None
    name, rows = found
    if rows == vocab:
        return None
    return (f"config.json says vocab_size {vocab} but the weights' {name} has {rows} rows; set vocab_size to {rows} "
            "or use the weights the config was written for")


def embedding_rows(root: Path) -> tuple[str, int] | None:
    """The input embedding's name and row count from the folder's safetensors header(s), or None."""
    for path in sorted(root.glob("*.safetensors")):
        try:
            with open(path, "rb") as fh:
                length = int.from_bytes(fh.read(8), "little")
                header = json.loads(fh.read(length)) if 0 < length <= path.stat().st_size else {}
        except (OSError, ValueError, RecursionError):
            continue
        for key, tensor in header.items() if isinstance(header, dict) else ():
            shape = tensor.get("shape") if isinstance(tensor, dict) else None
            if key.endswith(EMBEDDING_NAMES) and isinstance(shape, list) and shape and isinstance(shape[0], int):
                return key, shape[0]
    return None
