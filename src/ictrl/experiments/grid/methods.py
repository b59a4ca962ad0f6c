"""A grid's methods as ``ictrl compare --methods`` names them: a selector (a registered name, its label, or
``module:function``) with options of its own, ``NAME(key=value, ...)``, so that a ratio sweep is one command::

    --methods 'ict,h2rule:top_h2(ratio=0.2),h2rule:top_h2(ratio=0.3)'

Each entry's label (``top_h2(ratio=0.2)``) names its row in the report; :func:`folder_name` turns it into a run
folder's name that stays inside the output folder; :func:`run_identity` is what a run's ``done.json`` records of its
rule (``ictrl.core.selection.selector_identity``), so an edited rule is a new run, never "already done".
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from ictrl.errors import UserError

Options = tuple[tuple[str, Any], ...]  # (option, value) pairs in the order given: hashable, for a RunSpec

_ENTRY = re.compile(r"^\s*(?P<name>[^()]+?)\s*(?:\((?P<args>.*)\))?\s*$", re.DOTALL)
_UNSAFE = re.compile(r"[^A-Za-z0-9._+=-]")


def split_entries(text: str) -> list[str]:
    """``"a,b(x=1, y=2),c"`` -> ``["a", "b(x=1, y=2)", "c"]``: the commas outside parentheses, brackets and quotes."""
    items, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return [item.strip() for item in items if item.strip()]


def _value(where: str, entry: str, key: str, node: ast.expr) -> Any:
    """A literal option value; a bare word (``scope=group``) is that string."""
    if isinstance(node, ast.Name):
        return node.id
    try:
        return _hashable(ast.literal_eval(node))
    except (ValueError, RecursionError) as exc:
        why = str(exc) if isinstance(exc, _Unhashable) else ("not a literal value (a number, a quoted string, "
                                                              "True/False/None, a list)")
        raise UserError(f"{where}: {entry}: option {key!r} is {why}") from None


class _Unhashable(ValueError):
    """An option value a hashable RunSpec cannot carry."""


def _hashable(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, (dict, set)):
        raise _Unhashable("a mapping or set, which a method entry cannot carry")
    return value


def _options(where: str, entry: str, args: str) -> Options:
    try:
        call = ast.parse(f"_({args})", mode="eval").body
    except (SyntaxError, RecursionError, MemoryError):  # a value nested too deep for the parser: not an option
        call = None
    if not isinstance(call, ast.Call) or call.args or any(k.arg is None for k in call.keywords):
        raise UserError(f"{where}: {entry}: options are key=value pairs, e.g. top_h2(ratio=0.2)")
    keys = [k.arg for k in call.keywords]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise UserError(f"{where}: {entry}: option {twice[0]!r} given twice")
    return tuple((k.arg, _value(where, entry, k.arg, k.value)) for k in call.keywords if k.arg is not None)


def parse_call(entry: str, where: str = "methods") -> tuple[str, Options]:
    """``"h2rule:top_h2(ratio=0.2)"`` -> ``("h2rule:top_h2", (("ratio", 0.2),))``: the name as given and the
    options as written (not yet checked by the selector); a malformed entry is one :class:`UserError` line that
    starts with ``where`` (the option that gave it)."""
    match = _ENTRY.match(entry)
    if match is None:
        raise UserError(f"{where}: {entry!r}: not a method name, nor NAME(key=value, ...)")
    return match["name"], _options(where, entry, match["args"]) if match["args"] is not None else ()


def parse_entry(entry: str) -> tuple[str, Options]:
    """``"h2rule:top_h2(ratio=0.2)"`` -> ``("top_h2", (("ratio", 0.2),))``: the selector's label and the options
    given, each checked by the selector (:meth:`~ictrl.core.selection.Selector.resolve_options`); a mistake is one
    :class:`UserError` line naming the entry."""
    from ictrl.core.selection import get_selector

    name, given = parse_call(entry)
    try:
        selector = get_selector(name)
    except ValueError as exc:
        raise UserError(f"methods: {str(exc).replace('unknown selector', 'unknown method')}") from None
    try:
        resolved = selector.resolve_options(dict(given))
    except ValueError as exc:
        raise UserError(f"methods: {entry}: {exc}") from None
    return selector.label, tuple((key, _hashable(resolved[key])) for key, _ in given)


def _shown(value: Any) -> str:
    return value if isinstance(value, str) and value.isidentifier() else repr(value)


def entry_label(label: str, options: Options) -> str:
    """The row name of a method with options: ``top_h2(ratio=0.2)``; the label alone without. It parses back to
    the same method (:func:`parse_entry`)."""
    return label + (f"({', '.join(f'{k}={_shown(v)}' for k, v in options)})" if options else "")


def folder_name(name: str) -> str:
    """``name`` as one folder name inside the output folder: characters other than letters, digits and ``._+=-``
    become ``_``, and a leading dot another ``_`` in front (no ``..``, no hidden folder, no path)."""
    safe = _UNSAFE.sub("_", name) or "_"
    return "_" + safe if safe.startswith(".") else safe


def config_keys(options: Options) -> dict[str, Any]:
    """The run config's keys for a method's options: ``ratio``, ``scope`` and ``seed`` have their own field
    (``selection_ratio`` ...), the rest go to ``selection_options``."""
    from ictrl.engine.config import OPTION_FIELDS

    keys: dict[str, Any] = {OPTION_FIELDS[k]: v for k, v in options if k in OPTION_FIELDS}
    rest = {k: list(v) if isinstance(v, tuple) else v for k, v in options if k not in OPTION_FIELDS}
    if rest:
        keys["selection_options"] = rest
    return keys


def run_identity(method: str, options: dict[str, Any]) -> dict[str, Any]:
    """What a run records of its rule: ``selector_identity`` (name, spec, source file and its sha256, resolved
    options) as JSON reads it back."""
    from ictrl.core.selection import get_selector, selector_identity

    identity = selector_identity(get_selector(method), options)
    return json.loads(json.dumps(identity, default=repr))


COMPARED = ("name", "spec", "sha256", "options")  # not the file's path: a moved project holds the same rule


def changed(stored: Any, current: dict[str, Any]) -> str:
    """Why a finished run's recorded rule is not ``current`` (empty when it is): its source changed, its options
    or the rule it names. A record from before runs recorded their rule is trusted for ictrl's own rules only."""
    if stored is None:
        return "" if current["sha256"] is None else "it ran before ictrl recorded a rule's source"
    if not isinstance(stored, dict):
        return "its record of the rule is not an object"
    if stored.get("sha256") != current["sha256"]:
        return f"its rule's source {current['file'] or current['spec']} changed since it ran"
    if stored.get("options") != current["options"]:
        return f"its rule's options were {stored.get('options')}, now {current['options']}"
    if any(stored.get(k) != current[k] for k in COMPARED):
        return f"it ran rule {stored.get('spec')!r}, now {current['spec']!r}"
    return ""
