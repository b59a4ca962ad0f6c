"""The one check of a dataclass's values where they enter ictrl: each field declares what it takes, and
:func:`check_fields` holds an instance to those declarations.

A field declares its bound in its type, ``Annotated[int | None, AT_LEAST_ONE]`` (annotated-types' ``Ge``, ``Gt``,
``Le``, ``Lt`` or ``Interval``), and its ``choices`` in its metadata (argparse's keyword, which ``HfArgumentParser``
reads too). The check is pydantic's: one strict ``TypeAdapter`` per declaration (a bool is no number, a float no
int, a number is finite); what pydantic reports becomes one line naming the field, the bound and the value. Fields
another package declares (TRL's, transformers') are handed their bounds by name. A class calls it first in its
``__post_init__``; the rules between its fields (A needs B) come after, in that one method.

``ictrl.core.checks`` (``check_number``, ``check_tensor``) stays the public core functions' check of their own
arguments: the core imports torch and the standard library only.
"""

from __future__ import annotations

import functools
import math
import re
import types
import typing
from collections.abc import Collection, Mapping
from dataclasses import fields
from typing import Annotated, Any, Union

import annotated_types as at

from ictrl.errors import quote

INT64 = 1 << 63
SEED_LIMIT = 1 << 32  # numpy's seed range, which transformers' set_seed feeds

Bound = Union[at.Gt, at.Ge, at.Lt, at.Le, at.Interval]  # noqa: UP007 - a runtime alias for isinstance
POSITIVE = at.Gt(0)
NON_NEGATIVE = at.Ge(0)
AT_LEAST_ONE = at.Ge(1)
UNIT = at.Interval(ge=0, le=1)
SEED = at.Interval(ge=0, lt=SEED_LIMIT)

_SIGNS = (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="))  # the lower end first, as a reader says it
_RANGE_ERRORS = frozenset({"greater_than", "greater_than_equal", "less_than", "less_than_equal"})


def ends(bound: Bound) -> dict[str, Any]:
    """A bound's ends by annotated-types' names: ``{'gt': 0, 'le': 1}``."""
    return {key: getattr(bound, key) for key, _ in _SIGNS if getattr(bound, key, None) is not None}


def bound_text(bound: Bound) -> str:
    """``>= 1``, ``> 0 and <= 1``: a bound as the errors and ``ictrl train --help`` say it."""
    return " and ".join(f"{sign} {ends(bound)[key]}" for key, sign in _SIGNS if key in ends(bound))


def _sentence_bound(bound: Bound, hint: Any) -> str:
    """A bound as a sentence says it: ``an int >= 1``, ``in (0, 1]``."""
    edges = ends(bound)
    low, high = ("gt" in edges or "ge" in edges), ("lt" in edges or "le" in edges)
    if low and high:
        text = (f"in {'(' if 'gt' in edges else '['}{edges.get('gt', edges.get('ge'))}, "
                f"{edges.get('lt', edges.get('le'))}{')' if 'lt' in edges else ']'}")
    else:
        text = bound_text(bound)
    return f"an int {text}" if _whole(hint) else text


@functools.lru_cache(maxsize=None)
def declared(cls: type) -> dict[str, tuple[Any, Bound | None]]:
    """Each field ``cls`` itself declares -> (its type, its bound), read from ``Annotated`` once per class."""
    hints = typing.get_type_hints(cls, include_extras=True)
    out: dict[str, tuple[Any, Bound | None]] = {}
    for name in cls.__dict__.get("__annotations__", {}):
        hint, bound = hints[name], None
        if typing.get_origin(hint) is Annotated:
            inner, *extras = typing.get_args(hint)
            bound = next((e for e in extras if isinstance(e, typing.get_args(Bound))), None)
            rest = [e for e in extras if e is not bound]  # a length (MinLen) stays on the type it checks
            hint = Annotated[(inner, *rest)] if rest else inner
        out[name] = (hint, bound)
    return out


def type_text(hint: Any) -> str:
    """A type as a config file's reader writes it: ``int | None``, ``list[str]``."""
    if typing.get_origin(hint) is Annotated:
        return type_text(typing.get_args(hint)[0])
    if typing.get_origin(hint) in (Union, types.UnionType):
        return " | ".join(type_text(a) for a in typing.get_args(hint))
    if hint is type(None):
        return "None"
    return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")


def _whole(hint: Any) -> bool:
    """Whether ``hint`` takes whole numbers only (``int``, ``int | None``)."""
    args = typing.get_args(hint) if typing.get_origin(hint) in (Union, types.UnionType) else (hint,)
    return int in args and float not in args


def _sequences(hint: Any) -> Any:
    """``hint`` with each ``list[X]`` also taking a tuple (a Python caller's ``(1, 4)``), items as declared."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Annotated:
        return Annotated[(_sequences(args[0]), *hint.__metadata__)]
    if origin in (Union, types.UnionType):
        return Union[tuple(_sequences(a) for a in args)]  # noqa: UP007
    if origin is list or hint is list:
        item = _sequences(args[0]) if args else Any
        return Union[list[item], tuple[item, ...]]  # type: ignore[valid-type]  # noqa: UP007
    return hint


@functools.lru_cache(maxsize=None)
def _adapter(hint: Any, bound: Bound | None) -> Any:
    """The strict pydantic ``TypeAdapter`` of a declaration: a bounded number is finite too (one check holds
    both). pydantic is imported at the first check, not with the modules that declare fields."""
    from pydantic import ConfigDict, TypeAdapter

    checked = _sequences(hint)
    if bound is None:
        return TypeAdapter(checked, config=ConfigDict(strict=True))
    return TypeAdapter(Annotated[checked, bound], config=ConfigDict(strict=True, allow_inf_nan=False))


def _kinds(adapter: Any, value: Any) -> set[str] | None:
    """The kinds of pydantic's errors for ``value`` (``greater_than_equal``, ``int_type``, ...), or None."""
    from pydantic import ValidationError

    try:
        adapter.validate_python(value)
    except ValidationError as exc:
        return {error["type"] for error in exc.errors(include_url=False)}
    return None


def field_error(name: str, value: Any, hint: Any, bound: Bound | None, choices: Collection[Any] | None = None,
                *, sentence: bool = False) -> str | None:
    """Why ``value`` breaks field ``name``'s declaration (``hint``: its type, None for a field another package
    types, whose bound is then checked on numbers only; ``bound``; ``choices``), as ``name: why, got VALUE``
    (``name why, got VALUE`` where ``sentence``), or None."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is None and bound is not None and isinstance(value, bool):
        return f"{name}: expected a number {bound_text(bound)}, got {str(value).lower()}"
    checked = hint if hint is not None else (float if isinstance(value, float) else int) if number else None
    big = isinstance(value, int) and number and not -INT64 <= value < INT64  # checked at int64's edge
    kinds = _kinds(_adapter(checked, bound), max(min(value, INT64), -INT64 - 1) if big else value) \
        if checked is not None else None
    if kinds is None and big and bound is not None:
        why = "must fit in 64 bits"
    elif kinds is None:
        why = None if choices is None or value is None or value in choices else \
            f"must be one of {', '.join(map(repr, choices))}"
    elif kinds & _RANGE_ERRORS and bound is not None:
        why = f"must be {(_sentence_bound(bound, hint) if sentence else bound_text(bound))}"
    elif "finite_number" in kinds:
        why = "must be finite"
    elif "too_short" in kinds:
        why = "must be non-empty"
    elif sentence and bound is not None:
        why = f"must be {_sentence_bound(bound, hint)}"
    else:
        why = f"expected {type_text(checked)}"
    if why is None:
        return None
    if sentence:
        return f"{name} {why}, got {value!r}"
    return f"{name}: {why}, got {'null' if value is None else quote(value)}"


def check_fields(obj: Any, cls: type | None = None, *, inherited: Mapping[str, Bound] | None = None,
                 types: bool = True, not_null: Collection[str] = (), where: str = "", sentence: bool = False) -> None:
    """Every field of the dataclass instance ``obj`` held to its declaration, in field order: each field ``cls``
    (``obj``'s class unless given) declares, its type (only where it has a bound or choices unless ``types``: a
    class whose ``__post_init__`` reads wider values first) and bound; each field in ``inherited`` (name -> bound:
    another package's fields) its bound; every field its ``choices``. ``not_null``: fields that must hold a value
    although their type admits None. Raises ``ValueError``, one line starting with ``where`` and the field."""
    own = declared(cls or type(obj))
    inherited = inherited or {}
    for f in fields(obj):
        value = getattr(obj, f.name, None)
        hint, bound = own.get(f.name, (None, inherited.get(f.name)))
        choices = f.metadata.get("choices")
        if f.name in not_null and value is None:
            raise ValueError(f"{where}{f.name}: expected a number {bound_text(bound or AT_LEAST_ONE)}, got null")
        if bound is None and choices is None and (hint is None or not types):
            continue  # nothing declared, or a type its class reads itself
        why = field_error(f.name, value, hint, bound, choices, sentence=sentence)
        if why is not None:
            raise ValueError(where + why)


def _bad_number(key: str, value: Any) -> tuple[str, str] | None:
    """(the key of the offending number, why) for a number in ``value`` (lists and mappings walked), or None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return key, "must be finite"
    if isinstance(value, int) and not -INT64 <= value < INT64:
        return key, "must fit in 64 bits"
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, (list, tuple)) else ()
    for sub, item in items:
        found = _bad_number(f"{key}.{sub}" if isinstance(value, dict) else f"{key}[{sub}]", item)
        if found:
            return found
    return None


def check_finite(values: Mapping[str, Any]) -> None:
    """Every number in ``values`` (key -> value; lists and mappings walked) finite and within int64: the rule of
    the values no declaration bounds (a bound's own check holds its field to both)."""
    for key, value in values.items():
        found = _bad_number(key, value)
        if found:
            where, why = found
            raise ValueError(f"{where}: {why}, got {quote(_at(value, where[len(key):]))}")


def _at(value: Any, path: str) -> Any:
    """The item of ``value`` at ``path`` (``.name`` or ``[i]`` steps, as :func:`_bad_number` writes them)."""
    for step in re.findall(r"\.([^.\[]+)|\[(\d+)\]", path):
        value = value[step[0]] if step[0] else value[int(step[1])]
    return value

