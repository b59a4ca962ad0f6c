"""Where a model comes from: a local checkpoint directory, the hub cache, or the hub while it is reachable.

The trainer (a hub id given to ``ICTGRPOTrainer``) and every command check a model name here before anything
loads, so an uncached hub id offline is one error naming it, not a minute of hub retries. Nothing here imports
torch or transformers.
"""

from __future__ import annotations

import functools
import json
import os
import socket
from pathlib import Path
from urllib.parse import urlparse

from ictrl.errors import ModelNotFoundError

_TRUTHY = {"1", "true", "yes", "on"}


def hub_offline() -> bool:
    """True when the user asked for no hub access (``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE``)."""
    return any(os.environ.get(v, "").strip().lower() in _TRUTHY for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


@functools.lru_cache(maxsize=1)
def _endpoint_reachable(endpoint: str, timeout: float) -> bool:
    url = urlparse(endpoint)
    try:
        with socket.create_connection((url.hostname or "huggingface.co", url.port or 443), timeout=timeout):
            return True
    except OSError:
        return False


def hub_reachable(timeout: float = 3.0) -> bool:
    """False when offline mode is on or a TCP connection to the hub endpoint fails within ``timeout`` s."""
    if hub_offline():
        return False
    return _endpoint_reachable(os.environ.get("HF_ENDPOINT", "https://huggingface.co"), timeout)


def why_unreachable() -> str:
    return "HF_HUB_OFFLINE is set" if hub_offline() else "the hub is unreachable (no network)"


def _looks_like_path(name: str) -> bool:
    """A name only a local path can be: absolute, ./ or ~/ relative, more than one slash, or a trailing slash."""
    return (name.startswith(("/", ".", "~")) or name.count("/") > 1 or name.endswith("/")
            or os.sep != "/" and os.sep in name)


def _valid_repo_id(name: str) -> bool:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def in_hub_cache(repo_id: str, kind: str = "model") -> bool:
    from huggingface_hub import constants

    folder = Path(constants.HF_HUB_CACHE) / f"{kind}s--{repo_id.replace('/', '--')}"
    return (folder / "snapshots").is_dir() and any((folder / "snapshots").iterdir())


def cached_snapshot(model_id: str) -> Path | None:
    """The hub cache's snapshot folder of ``model_id`` that its ``main`` resolves to there (what a run loads from
    offline), holding its config.json; None for a local path, an invalid id or a model not cached."""
    if Path(model_id).exists() or _looks_like_path(model_id) or not _valid_repo_id(model_id):
        return None
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(model_id, "config.json")
    return Path(found).parent if isinstance(found, str) else None


def check_model(name_or_path: str, option: str = "--model", trust_remote_code: bool | None = None) -> None:
    """A local checkpoint directory (with config.json) that loads as itself (``checkpoints.model_folder_problem``:
    its tokenizer files, its vocab_size against its weights, custom code only with ``trust_remote_code``; None: the
    command has no such option), a hub id in the local cache, or a hub id while the hub is reachable. Anything else
    is a :class:`ModelNotFoundError` naming ``option``."""
    from ictrl.checkpoints import model_folder_problem

    path = Path(name_or_path).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ModelNotFoundError(f"{option}: {name_or_path} is a file, not a model directory")
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"{option}: {name_or_path} has no config.json, so it is not a model checkpoint")
        custom = None if trust_remote_code else custom_code(path)
        if custom is not None:
            way = "set trust_remote_code: true to run it" if trust_remote_code is False else \
                "this command runs no code from a model folder"
            raise ModelNotFoundError(f"{option}: {name_or_path}: {custom}; {way}")
        problem = model_folder_problem(path)
        if problem is not None:
            raise ModelNotFoundError(f"{option}: {name_or_path}: {problem}")
        return
    if _looks_like_path(name_or_path) or not _valid_repo_id(name_or_path):
        raise ModelNotFoundError(f"{option}: {name_or_path}: no such directory")
    if in_hub_cache(name_or_path) or hub_reachable():
        return
    raise ModelNotFoundError(f"{option}: {name_or_path}: no local directory or hub-cache copy, and "
                             f"{why_unreachable()}")


def checked_model(name_or_path: str, option: str = "--model") -> str | None:
    """:func:`check_model`, then the model's weights whole (``checkpoints.check_weights``: a truncated or changed file
    is one :class:`ictrl.errors.UserError` line naming ``option``, not a traceback from the loader); returns the
    sha256 of a local model's weights (``checkpoints.weights_digest``: their manifest's, when ``ictrl train`` wrote
    one; None for a hub id)."""
    from ictrl.checkpoints import check_weights, weights_digest
    from ictrl.errors import UserError

    check_model(name_or_path, option)
    problem = check_weights(name_or_path)
    if problem is not None:
        raise UserError(f"{option}: {name_or_path}: {problem}; the model directory is damaged")
    return weights_digest(name_or_path)


def custom_code(folder: Path) -> str | None:
    """Why loading the model folder runs its own code (its config.json's ``auto_map`` for a ``model_type``
    transformers lacks), or None. transformers' rule: a type it knows loads its own class, the folder's code unrun."""
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # unreadable: checkpoints.json_files_problem names it
        return None
    auto_map = config.get("auto_map") if isinstance(config, dict) else None
    if not isinstance(auto_map, dict) or not auto_map:
        return None
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    if config.get("model_type") in CONFIG_MAPPING_NAMES:
        return None  # transformers loads its own class and ignores the folder's code
    code = sorted({str(v if isinstance(v, str) else v[0] if isinstance(v, (list, tuple)) and v else v)
                   for v in auto_map.values()})
    return (f"its model_type {config.get('model_type')!r} is custom code in the folder (auto_map: "
            f"{', '.join(code)[:200]}), which runs only with trust_remote_code")
