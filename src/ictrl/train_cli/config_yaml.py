"""YAML for run configs: a flag's value read as YAML (a file's text: ``ictrl.yamlfile.load_yaml``) and the size
bound of a run config. A file's value is read as its field takes it by ``ictrl.validation.file_value``.

A run config is the user's own file: its aliases expand as YAML says, with no bound of ictrl's.
"""

from __future__ import annotations

from typing import Any

import yaml

from ictrl.errors import ConfigError
from ictrl.yamlfile import DuplicateKeyError, yaml_loader

MAX_CONFIG_BYTES = 1 << 20  # a run config is a few kilobytes; anything past this is the wrong file


def load_yaml_value(raw: str, where: str) -> Any:
    """A flag's value read as YAML (``1e-6``, ``[a, b]``, ``null``); text that is not YAML stays the string."""
    try:
        value = yaml.load(raw, Loader=yaml_loader())  # noqa: S506 - a SafeLoader subclass
    except DuplicateKeyError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    except (yaml.YAMLError, RecursionError):
        return raw
    return value
