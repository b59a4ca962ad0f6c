"""YAML for run configs: a flag's value read as YAML (a file's text: ``ictrl.yamlfile.load_yaml``), and a file's
value checked against its field's type (:func:`file_value`).

A run config is the user's own file: its aliases expand as YAML says, with no bound of ictrl's.

A file's value is typed already (YAML's int, float, bool, null, list, mapping), so it is checked, not parsed: one
pydantic ``TypeAdapter`` per field, over the field's type as TRL's parser reads it (:func:`reading`). YAML 1.1
reads ``1e-6`` as text, so text stands for a number where the field is one (as the same text written as a flag);
a number stands for text where the field is text; a bool stays as written where the field takes text (TRL's
``scale_rewards: false``); a single value stands for a list of one, as after a flag; a list's items that are
themselves lists or mappings are left to the field's own dataclass (``reward_funcs: [[a, b]]`` is
``ScriptArguments``' to name). Ranges and the checks between fields come after, in the config classes.
"""

from __future__ import annotations

import enum
import functools
import types
import typing
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import BeforeValidator, ConfigDict, InstanceOf, Strict, TypeAdapter, ValidationError

from ictrl.errors import ConfigError, quote
from ictrl.validation import type_text
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
def _adapter(hint: Any, choices: tuple[Any, ...] | None, nullable: bool) -> TypeAdapter[Any]:
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
        return _adapter(hint, choices, nullable).validate_python(value)
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
