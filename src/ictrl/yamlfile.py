"""YAML as ictrl reads every file: PyYAML's safe loader with duplicate keys refused.

PyYAML keeps the last of two equal keys without a word, so ``token_selector: ict`` at the top of a file and
``token_selector: random`` at its end would train random selection. Every YAML read in ictrl (run configs, their
``base:`` files, accelerate configs, a saved run's ``config.yaml``) goes through :func:`load_yaml` or
:func:`yaml_loader`.
"""

from __future__ import annotations

from typing import Any

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
    """``text`` as YAML (:func:`yaml_loader`); not YAML, a duplicate key or nesting past Python's recursion limit is
    a one-line :class:`ictrl.errors.ConfigError` naming ``where``."""
    import yaml

    from ictrl.errors import ConfigError

    try:
        return yaml.load(text, Loader=yaml_loader())  # noqa: S506 - a SafeLoader subclass
    except DuplicateKeyError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: not valid YAML: {' '.join(str(exc).split())[:300]}") from None
    except RecursionError:
        raise ConfigError(f"{where}: YAML nested too deeply") from None
