"""YAML for run configs: PyYAML's safe loader (no Python tags) with duplicate keys refused, each failure one line.

A run config is the user's own file: its aliases expand as YAML says, with no bound of ictrl's.
"""

from __future__ import annotations

from typing import Any

import yaml

from ictrl.errors import ConfigError, shorten
from ictrl.yamlfile import DuplicateKeyError, yaml_loader

MAX_CONFIG_BYTES = 1 << 20  # a run config is a few kilobytes; anything past this is the wrong file


def load_yaml_text(text: str, where: str) -> Any:
    """A config document; not YAML or nested too deep is a :class:`ConfigError` naming ``where``."""
    try:
        data = yaml.load(text, Loader=yaml_loader())  # noqa: S506 - a SafeLoader subclass
    except DuplicateKeyError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: not valid YAML: {shorten(str(exc).replace(chr(10), ' '))}") from None
    except RecursionError:
        raise ConfigError(f"{where}: YAML nested too deeply") from None
    return data


def load_yaml_value(raw: str, where: str) -> Any:
    """A flag's value read as YAML (``1e-6``, ``[a, b]``, ``null``); text that is not YAML stays the string."""
    try:
        value = yaml.load(raw, Loader=yaml_loader())  # noqa: S506 - a SafeLoader subclass
    except DuplicateKeyError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    except (yaml.YAMLError, RecursionError):
        return raw
    return value
