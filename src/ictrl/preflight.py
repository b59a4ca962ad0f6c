"""Checks every command runs first, before torch, transformers or a model loads.

Each check raises a :class:`ictrl.errors.UserError` whose message is one line naming the option, file or field
that is wrong; ``ictrl.cli.main`` prints it and exits 2. Nothing here imports torch or transformers: a mistake
costs a fraction of a second, not the minutes a model load takes.
"""

from __future__ import annotations

import difflib
import functools
import importlib.util
import os
import socket
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from ictrl.errors import DataError, MissingExtraError, ModelNotFoundError, UserError

# tracker name (as transformers' report_to spells it) -> (module that must import, pip install hint)
TRACKERS: dict[str, tuple[str, str]] = {
    "tensorboard": ("tensorboard", "pip install 'ictrl[tensorboard]'"),
    "wandb": ("wandb", "pip install wandb"),
    "trackio": ("trackio", "pip install trackio"),
    "mlflow": ("mlflow", "pip install mlflow"),
    "comet_ml": ("comet_ml", "pip install comet_ml"),
    "clearml": ("clearml", "pip install clearml"),
    "dvclive": ("dvclive", "pip install dvclive"),
    "swanlab": ("swanlab", "pip install swanlab"),
}
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


def _why_unreachable() -> str:
    return "HF_HUB_OFFLINE is set" if hub_offline() else "the hub is unreachable (no network)"


def _looks_like_path(name: str) -> bool:
    """A name only a local path can be: absolute, ./ or ~/ relative, more than one slash, or a trailing slash."""
    return name.startswith(("/", ".", "~")) or name.count("/") > 1 or name.endswith("/") or os.sep != "/" and os.sep in name


def _valid_repo_id(name: str) -> bool:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def _in_hub_cache(repo_id: str, kind: str = "model") -> bool:
    from huggingface_hub import constants

    folder = Path(constants.HF_HUB_CACHE) / f"{kind}s--{repo_id.replace('/', '--')}"
    return (folder / "snapshots").is_dir() and any((folder / "snapshots").iterdir())


def check_model(name_or_path: str, option: str = "--model") -> None:
    """A local checkpoint directory (with config.json), a hub id in the local cache, or a hub id while the hub is
    reachable. Anything else is a :class:`ModelNotFoundError` naming ``option``."""
    path = Path(name_or_path).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ModelNotFoundError(f"{option}: {name_or_path} is a file, not a model directory")
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"{option}: {name_or_path} has no config.json, so it is not a model checkpoint")
        return
    if _looks_like_path(name_or_path) or not _valid_repo_id(name_or_path):
        raise ModelNotFoundError(f"{option}: {name_or_path}: no such directory")
    if _in_hub_cache(name_or_path) or hub_reachable():
        return
    raise ModelNotFoundError(f"{option}: {name_or_path}: no local directory or hub-cache copy, and "
                             f"{_why_unreachable()}")


def _suggest(name: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def check_benchmarks(names: Sequence[str], data_root: str | os.PathLike[str] | None = None,
                     option: str = "--benchmarks") -> None:
    """Every name is a registry name or spec (did-you-mean for a typo) or ``jsonl:PATH`` to an existing file, and
    one with no local file can reach the hub (or its cache)."""
    from ictrl.data import BENCHMARKS, default_data_root, parse_spec

    root = Path(data_root) if data_root is not None else default_data_root()
    if not names:  # `--benchmarks ''`: the comma list is empty
        raise UserError(f"{option}: no benchmark named (known: {', '.join(sorted(BENCHMARKS))}, or jsonl:PATH)")
    for name in names:
        head = name.split(":", 1)[0]
        if head != "jsonl" and head not in BENCHMARKS:
            raise UserError(f"{option}: unknown benchmark {head!r}{_suggest(head, BENCHMARKS)} "
                            f"(known: {', '.join(sorted(BENCHMARKS))}, or jsonl:PATH)")
        try:
            bench, path = parse_spec(name)
        except ValueError as exc:
            raise UserError(f"{option}: {name!r}: {exc}") from None
        if path is not None:
            check_file(path, f"{option}: {name!r}")
            continue
        if bench.local_path is not None and root is not None and (root / bench.local_path).is_file():
            continue
        if bench.hub_id is not None and (_in_hub_cache(bench.hub_id, "dataset") or hub_reachable()):
            continue
        where = f"{root / bench.local_path}" if root is not None and bench.local_path else f"data root {root}"
        raise DataError(f"{option}: {bench.name}: no local copy ({where}), and {_why_unreachable()} to fetch "
                        f"{bench.hub_id}; set --data-root / ICTRL_DATA_ROOT to a folder holding it")


def check_file(path: str | os.PathLike[str], option: str) -> Path:
    """An existing regular file; a :class:`UserError` naming ``option`` otherwise."""
    p = Path(path).expanduser()
    if not p.exists():
        raise UserError(f"{option}: {path}: no such file")
    if not p.is_file():
        raise UserError(f"{option}: {path}: not a file")
    return p


def report_to_list(value: str | Sequence[str] | None) -> list[str]:
    """transformers' ``report_to`` as a list: a list, a comma-separated string, "none"/None -> [], "all" kept."""
    if value is None:
        return []
    items = value.split(",") if isinstance(value, str) else list(value)
    return [n for n in (str(v).strip() for v in items) if n and n != "none"]


def check_trackers(value: str | Sequence[str] | None, option: str = "report_to") -> list[str]:
    """Each tracker known and its package importable; returns the list. A missing package names the install
    command (the ``tensorboard`` extra for TensorBoard)."""
    names = report_to_list(value)
    for name in names:
        if name == "all":
            continue
        if name not in TRACKERS:
            raise UserError(f"{option}: unknown tracker {name!r}{_suggest(name, TRACKERS)} "
                            f"(choose from none, all, {', '.join(TRACKERS)})")
        module, hint = TRACKERS[name]
        if importlib.util.find_spec(module) is None:
            raise MissingExtraError(f"{option}: {name} needs the {module!r} package, which is not installed: {hint}")
    return names


def check_liger(enabled: bool, option: str = "use_liger_kernel") -> None:
    """``use_liger_kernel`` in TRL 1.16's GRPOTrainer swaps in Liger's layer kernels (RMSNorm, RoPE, SwiGLU; its
    fused cross-entropy is refused by TRL), the same step up to kernel numerics; transformers imports the package
    only when training starts, after the model loaded. Checked here instead."""
    if enabled and importlib.util.find_spec("liger_kernel") is None:
        raise MissingExtraError(f"{option}: needs the liger-kernel package, which is not installed: "
                                "pip install liger-kernel (or trl's liger extra)")


# --- YAML: every file ictrl reads ---------------------------------------------------------------------------------


def yaml_loader() -> type:
    """PyYAML's safe loader with duplicate keys refused (:func:`load_yaml`): PyYAML keeps the last of two equal
    keys without a word, so ``token_selector: ict`` at the top and ``token_selector: random`` at the end would
    train random selection. Merge keys (``<<: *base``) still override, as YAML means them to."""
    import yaml

    global _LOADER
    if _LOADER is not None:
        return _LOADER

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            if isinstance(node, yaml.MappingNode):
                seen: dict[Any, int] = {}
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge":
                        continue
                    key = self.construct_object(key_node, deep=True)
                    line = key_node.start_mark.line + 1
                    try:
                        first = seen.get(key)
                    except TypeError:  # an unhashable key: the base loader names it
                        continue
                    if first is not None:
                        raise DuplicateKeyError(f"duplicate key {str(key)[:100]!r} at lines {first} and {line}; "
                                                "the later value would silently replace the first: keep one")
                    seen[key] = line
            return super().construct_mapping(node, deep)

    _LOADER = UniqueKeyLoader
    return _LOADER


_LOADER: type | None = None


class DuplicateKeyError(Exception):
    """Two equal keys in one YAML mapping; the message names the key and both lines."""


def load_yaml(text: str, where: str) -> Any:
    """``text`` as YAML (:func:`yaml_loader`); not YAML or a duplicate key is a one-line
    :class:`ictrl.errors.ConfigError` naming ``where``."""
    import yaml

    from ictrl.errors import ConfigError

    try:
        return yaml.load(text, Loader=yaml_loader())  # noqa: S506 - a SafeLoader subclass
    except DuplicateKeyError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: not valid YAML: {' '.join(str(exc).split())[:300]}") from None
