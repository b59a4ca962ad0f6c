"""The one check of a dataclass's values where they enter ictrl: each field declares what it takes, and
:func:`check_fields` holds an instance to those declarations; a value a run config file holds is read as its field
takes it first (:func:`file_value`), as a flag's text is by TRL's parser.

A field declares its bound in its type, ``Annotated[int | None, AT_LEAST_ONE]`` (annotated-types' ``Ge``, ``Gt``,
``Le``, ``Lt`` or ``Interval``; ``MinLen`` for a length), and its ``choices`` in its metadata (argparse's keyword,
which ``HfArgumentParser`` reads too) or as a ``Literal`` type. The check is pydantic's: one strict
``TypeAdapter`` per declaration (a bool is no number, a float no int, a bounded number is finite); what pydantic
reports becomes one line naming the field, the bound and the value. Fields another package declares (TRL's,
transformers') are handed their bounds by name. A class calls it first in its
``__post_init__``; the rules between its fields (A needs B) come after, in that one method.

``ictrl.core.checks`` (``check_number``, ``check_tensor``) stays the public core functions' check of their own
arguments: the core imports torch and the standard library only.
"""

from __future__ import annotations

import enum
import functools
import math
import re
import types
import typing
from collections.abc import Collection, Mapping
from dataclasses import fields
from typing import Annotated, Any, Literal, Union

import annotated_types as at
from pydantic import BeforeValidator, ConfigDict, InstanceOf, Strict, TypeAdapter, ValidationError

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
    return f"an int {text}" if _whole_only(hint) else text


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


def _whole_only(hint: Any) -> bool:
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
def _adapter(hint: Any, bound: Bound | None) -> TypeAdapter[Any]:
    """The strict pydantic ``TypeAdapter`` of a declaration: a bounded number is finite too (one check holds
    both)."""
    checked = _sequences(hint)
    if bound is None:
        return TypeAdapter(checked, config=ConfigDict(strict=True))
    return TypeAdapter(Annotated[checked, bound], config=ConfigDict(strict=True, allow_inf_nan=False))


def _kinds(adapter: TypeAdapter[Any], value: Any) -> set[str] | None:
    """The kinds of pydantic's errors for ``value`` (``greater_than_equal``, ``int_type``, ...), or None."""
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
    elif kinds is None or kinds == {"literal_error"} and choices is not None:  # a Literal type's values: choices
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


def _literal(hint: Any) -> tuple[Any, ...] | None:
    """The values a ``Literal`` type (or ``Literal[...] | None``) declares: its field's choices."""
    if typing.get_origin(hint) in (Union, types.UnionType):
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        return _literal(inner[0]) if len(inner) == 1 else None
    return typing.get_args(hint) if typing.get_origin(hint) is Literal else None


def check_fields(obj: Any, cls: type | None = None, *, inherited: Mapping[str, Bound] | None = None,
                 types: bool = True, not_null: Collection[str] = (), where: str = "", sentence: bool = False) -> None:
    """Every field of the dataclass instance ``obj`` held to its declaration, in field order: each field ``cls``
    (``obj``'s class unless given) declares, its type (only where it has a bound or choices unless ``types``: a
    class whose ``__post_init__`` reads wider values first) and bound; each field in ``inherited`` (name -> bound:
    another package's fields) its bound; every field its ``choices`` (its metadata's, or its ``Literal`` type's).
    ``not_null``: fields that must hold a value although their type admits None. ``sentence``: the line says
    ``name must be ...`` (the eval and data settings' wording) instead of ``name: must be ...``. Raises
    ``ValueError``, one line starting with ``where`` and the field."""
    own = declared(cls or type(obj))
    inherited = inherited or {}
    for f in fields(obj):
        value = getattr(obj, f.name, None)
        hint, bound = own.get(f.name, (None, inherited.get(f.name)))
        choices = f.metadata.get("choices") or _literal(hint)
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


# --- a value written in a file ----------------------------------------------------------------------------------
# A file's value is typed already (YAML's int, float, bool, null, list, mapping), so it is read, not parsed: one
# pydantic ``TypeAdapter`` per field, over the field's type as TRL's parser reads a flag (:func:`reading`). YAML
# 1.1 reads ``1e-6`` as text, so text stands for a number where the field is one (as the same text written as a
# flag); a number stands for text where the field is text; a bool stays as written where the field takes text
# (TRL's ``scale_rewards: false``); a single value stands for a list of one, as after a flag; a list's items that
# are themselves lists or mappings are left to the field's own dataclass. Bounds and the rules between fields come
# after, when the dataclass is built (:func:`check_fields`).

def _no_bool(value: Any) -> Any:
    if isinstance(value, bool):  # an int to Python and to pydantic's lax mode; a number field takes no bool
        raise ValueError("a bool is no number")
    return value


NOT_WHOLE = "a float is no whole number"


def _whole(value: Any) -> Any:
    if isinstance(value, float):  # 3.0 is no count: int() of its text, as a flag, refuses it too
        raise ValueError(NOT_WHOLE)
    return _no_bool(value)


def _one_item(value: Any) -> Any:
    return value if isinstance(value, (list, dict, bool)) or value is None else [value]


def _null_text(value: Any) -> Any:
    return None if isinstance(value, str) and value.lower() in ("none", "null") else value


AS_WRITTEN = Annotated[bool, Strict()]  # a bool where the annotation names text: kept, never read as 0 or 'yes'
SCALARS: dict[Any, Any] = {
    int: Annotated[int, BeforeValidator(_whole)],
    float: Annotated[float, BeforeValidator(_no_bool)],
    bool: bool,
    Any: Any,
    type(None): None,
    dict: dict[Any, Any],
}


def reading(hint: Any, choices: tuple[Any, ...] | None = None, one_item: bool = True, field: bool = True) -> Any:
    """The type a file's value of a field annotated ``hint`` is checked against: ``hint`` as TRL's parser
    (``trl.scripts._hf_argparser``) reads it, with the file's readings above. As the parser: a union of text and one
    other type without None is that type (an enum's: its members' values); ``X | None`` takes ``none`` or ``null``
    as text for None where X is a number, a mapping or a class; ``choices`` (a field's metadata) are the values a
    text field takes. A bool stays as written wherever the annotation names text (``scale_rewards: false``,
    ``save_strategy: no``). A single value is a list of one (``one_item``) unless the field also takes text. A
    class other than these takes no value a file can hold. ``field``: ``hint`` is a field's own type, not an item
    of one (the parser's narrowing is the field's)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Annotated:
        return reading(args[0], choices, one_item, field)
    if origin in (Union, types.UnionType):
        if field and str in args and type(None) not in args:
            return _union([reading(next(a for a in args if a is not str), choices), AS_WRITTEN])
        inner = next(a for a in args if a is not type(None))
        if field and len(args) == 2 and _takes_null_text(inner, choices):
            return Annotated[typing.Optional[reading(inner)], BeforeValidator(_null_text)]  # noqa: UP007
        return _union([reading(a, choices, str not in args, field) for a in args])
    if hint is str:
        return _union([Literal[choices] if choices is not None else str, AS_WRITTEN]) if field else str
    if choices is not None and hint is not type(None):
        return Literal[choices]
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return Literal[tuple(member.value for member in hint)]
    if origin is Literal:
        return hint
    if origin is list or hint is list:
        item = reading(args[0], field=False) if args else Any
        items = list[_union([item, list[Any], dict[Any, Any]])]  # type: ignore[misc]
        return Annotated[items, BeforeValidator(_one_item)] if one_item else items
    if origin is dict:
        return dict[args[0], reading(args[1], field=False)] if args else dict[Any, Any]  # type: ignore[valid-type]
    if hint in SCALARS:
        return SCALARS[hint]
    return InstanceOf[hint] if isinstance(hint, type) else Any


def _takes_null_text(inner: Any, choices: tuple[Any, ...] | None) -> bool:
    """Whether TRL's parser reads ``none`` / ``null`` as None for ``inner | None``: not for text, bools, lists or
    choices, whose parser types it does not wrap."""
    origin = typing.get_origin(inner) or inner
    return choices is None and inner not in (str, bool, type(None)) and origin not in (list, Literal) and not (
        isinstance(inner, type) and issubclass(inner, enum.Enum))


def _union(members: list[Any]) -> Any:
    return Union[tuple(members)] if len(members) > 1 else members[0]  # noqa: UP007


@functools.lru_cache(maxsize=None)
def _file_adapter(hint: Any, choices: tuple[Any, ...] | None, nullable: bool) -> TypeAdapter[Any]:
    read = reading(hint, choices)
    return TypeAdapter(typing.Optional[read] if nullable else read,  # noqa: UP007
                       config=ConfigDict(coerce_numbers_to_str=True))


def file_value(key: str, value: Any, hint: Any, choices: tuple[Any, ...] | None = None,
               nullable: bool = False) -> Any:
    """``value`` (a run config file's, for ``key``) checked against its field's type ``hint`` (:func:`reading`;
    ``nullable``: the field takes null), returned as the field takes it (``'1e-6'`` -> ``1e-06``, ``q_proj`` ->
    ``['q_proj']``). Raises ValueError ``"KEY: why"``: text a number or choice field cannot read is named as a
    flag's value would be (``invalid int value: 'two'``), anything else ``expected TYPE, got VALUE``."""
    try:
        return _file_adapter(hint, choices, nullable).validate_python(value)
    except ValidationError as exc:
        raise ValueError(_why(key, value, hint, exc.errors(include_url=False))) from None


def _why(key: str, value: Any, hint: Any, errors: list[Any]) -> str:
    for error in errors:  # text (or a number for a choice) the field cannot read: as a flag's would be named
        bad = error["input"]
        kind = {"int_parsing": "int", "float_parsing": "float"}.get(error["type"])
        if error["type"] == "value_error" and str(error["ctx"]["error"]) == NOT_WHOLE:
            kind = "int"
        scalar = isinstance(bad, (str, int, float)) and not isinstance(bad, bool)
        if kind and scalar:
            return f"{key}: invalid {kind} value: {quote(str(bad))}"
        if error["type"] == "literal_error" and scalar:
            choices = ", ".join(error["ctx"]["expected"].rsplit(" or ", 1))  # argparse's list
            return f"{key}: invalid choice: {quote(str(bad))} (choose from {choices})"
    shown = "null" if value is None else str(value).lower() if isinstance(value, bool) else quote(value)
    return f"{key}: expected {type_text(hint)}, got {shown}"
