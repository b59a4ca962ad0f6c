"""YAML for run configs: PyYAML's safe loader with alias expansion bounded.

PyYAML shares one object per anchor, so loading an alias bomb (each level a list of the previous level's alias,
nine times over) is cheap, but anything that walks the result (the type checks, an error message quoting it) does
the full expansion: 9 levels are hundreds of megabytes. Aliases keep working; a document that expands past
:data:`MAX_YAML_VALUES` values or refers to itself is refused with one line.
"""

from __future__ import annotations

from typing import Any

import yaml

from ictrl.errors import ConfigError, shorten
from ictrl.yamlfile import DuplicateKeyError, yaml_loader

MAX_CONFIG_BYTES = 1 << 20  # a run config is a few kilobytes; anything past this is the wrong file
MAX_YAML_VALUES = 100_000


class BoundedLoader(yaml_loader()):  # type: ignore[misc]
    """``yaml.SafeLoader`` refusing duplicate keys (:func:`ictrl.files.yaml_loader`); documents it loads go through
    :func:`check_expansion`."""


def check_expansion(data: Any, where: str) -> None:
    """Refuse ``data`` when its aliases expand past :data:`MAX_YAML_VALUES` values, or one refers to itself.
    Counting memoises each shared object, so it costs one visit per object, not per expanded value."""
    sizes: dict[int, int] = {}
    open_ids: set[int] = set()

    def size(node: Any) -> int:
        if not isinstance(node, (list, dict)):
            return 1
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in open_ids:
            raise ConfigError(f"{where}: a YAML alias refers to itself (a recursive value)")
        open_ids.add(key)
        total = 1
        for child in [*node.keys(), *node.values()] if isinstance(node, dict) else node:
            total += size(child)
            if total > MAX_YAML_VALUES:
                raise ConfigError(f"{where}: YAML aliases expand to more than {MAX_YAML_VALUES} values; write the "
                                  "values out or use fewer aliases")
        open_ids.discard(key)
        sizes[key] = total
        return total

    size(data)


def load_yaml_text(text: str, where: str) -> Any:
    """A config document; not YAML, nested too deep or an alias bomb is a :class:`ConfigError` naming ``where``."""
    try:
        data = yaml.load(text, Loader=BoundedLoader)  # noqa: S506 - a SafeLoader subclass
    except DuplicateKeyError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: not valid YAML: {shorten(str(exc).replace(chr(10), ' '))}") from None
    except RecursionError:
        raise ConfigError(f"{where}: YAML nested too deeply") from None
    check_expansion(data, where)
    return data


def load_yaml_value(raw: str, where: str) -> Any:
    """A flag's value read as YAML (``1e-6``, ``[a, b]``, ``null``); text that is not YAML stays the string."""
    try:
        value = yaml.load(raw, Loader=BoundedLoader)  # noqa: S506 - a SafeLoader subclass
    except DuplicateKeyError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    except (yaml.YAMLError, RecursionError):
        return raw
    check_expansion(value, where)
    return value
