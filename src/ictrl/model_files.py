"""A model folder's files, read before anything loads them: whether its weights are whole (:func:`check_weights`,
each safetensors file against its header, an ictrl manifest's records), whether its JSON, tokenizer and embedding
agree (:func:`model_folder_problem`), and digests that change when its files do (:func:`model_digest`,
:func:`weights_digest`), which a resume compares. Plain files only; a folder ictrl wrote is known by its
``manifest.json`` (``ictrl.checkpoints``).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from ictrl.checkpoints import MANIFEST, sha256_file, verify_checkpoint


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
