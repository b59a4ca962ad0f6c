"""The boundary of a selection rule, a user's held to the same standard as ictrl's own: its signature and options
checked when it is registered and configured, what it returns checked where it returns, every failure one line
naming the rule (``file:function``), the step and what it returned or raised (docs/method.md, "Write your own
rule"). Used by :mod:`ictrl.core.selection`."""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import os
import sys
from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor

from ictrl.core.checks import OptionError
from ictrl.core.describe import failure, shorten
from ictrl.core.selection_inputs import STAT_FIELDS, SelectorError, SelectorExit

_PACKAGE = Path(__file__).resolve().parents[1]
# module name -> the file it was loaded from, for rules given as path/to/file.py:NAME
FILE_MODULES: dict[str, Path] = {}


def rule_source_file(fn: Callable[..., Any]) -> Path | None:
    """The resolved source file of a user's rule ``fn``; None for one of ictrl's (a file of this package) or one
    defined where no file holds it (an interpreter session)."""
    try:
        source = inspect.getsourcefile(fn if inspect.isroutine(fn) else type(fn))
    except TypeError:  # a builtin, or defined in no file
        source = None
    if not source or not Path(source).is_file():
        return None
    path = Path(source).resolve()
    return None if path.is_relative_to(_PACKAGE) else path


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def rule_label(name: str, fn: Callable[..., Any]) -> str:
    """How messages name a rule: ``file:function`` for a user's (the file relative to the working directory where
    it lies below it), the quoted registered name for ictrl's own."""
    path = rule_source_file(fn)
    if path is None:
        return repr(name)
    try:
        shown = path.relative_to(Path.cwd().resolve())
    except ValueError:
        shown = path
    return f"{shown}:{getattr(fn, '__name__', name)}"


# --- registration and options ----------------------------------------------------------------------------------


def rule_options(fn: Callable[..., Any], key: str) -> dict[str, Any]:
    """The options of the rule ``fn`` (registered as ``key``) and their defaults: its keyword-only parameters. The
    signature must be ``fn(inputs, *, option=default, ...)``: any other parameter is a ``ValueError`` naming it,
    since a run could neither pass nor check it."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # no signature to read (a builtin): called with the inputs alone
        return {}
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    shown = getattr(fn, "__name__", key)
    how = f"write it as def {key if shown == '<lambda>' else shown}(inputs, *, option=default, ...)"
    if not positional and not any(p.kind is p.VAR_POSITIONAL for p in params):
        raise ValueError(f"selector {key!r} takes no positional parameter for its inputs; {how}")
    if len(positional) > 1:
        raise ValueError(f"selector {key!r}: option {positional[1].name!r} must be keyword-only (after a *), so a "
                         f"config can set it by name; {how}")
    for p in params:
        if p.kind is p.VAR_KEYWORD:
            raise ValueError(f"selector {key!r} takes **{p.name}: name each option keyword-only with its default, "
                             f"so a config's options can be checked; {how}")
        if p.kind is p.KEYWORD_ONLY and p.default is p.empty:
            raise ValueError(f"selector {key!r}: option {p.name!r} has no default; give it one ({p.name}=...)")
    return {p.name: p.default for p in params if p.kind is p.KEYWORD_ONLY}


def check_option_type(key: str, value: Any, default: Any) -> Any:
    """``value`` of a rule's own option ``key`` held to its default's type: an int default takes an int, a float
    default a number (as a float), a str a str, a bool a bool, a tuple a list or tuple (as a tuple); a default of
    None or of another type takes any value. An :class:`OptionError` names the option otherwise."""
    if default is None:
        return value
    kind = type(default)
    if kind is bool or isinstance(value, bool):
        ok = isinstance(value, bool) and kind is bool
    elif kind is int:
        ok = isinstance(value, int)
    elif kind is float:
        ok = isinstance(value, (int, float))
        value = float(value) if ok else value
    elif kind is str:
        ok = isinstance(value, str)
    elif kind in (tuple, list):
        ok = isinstance(value, (tuple, list))
        value = kind(value) if ok else value
    else:
        return value
    if not ok:
        raise OptionError(key, f"must be {_KIND_WORDS.get(kind, kind.__name__)} (its default is {default!r}), "
                               f"got {type(value).__name__} {shorten(repr(value), 60)}")
    return value


_KIND_WORDS = {bool: "true or false", int: "an int", float: "a number", str: "a string", tuple: "a list",
               list: "a list"}


# --- what the rule returns -------------------------------------------------------------------------------------


def describe_value(value: Any) -> str:
    """A returned value in a phrase: its type, and for an array its shape, dtype and device."""
    if isinstance(value, Tensor):
        return f"a {value.dtype} tensor of shape [{', '.join(map(str, value.shape))}] on {value.device}"
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    kind = f"{type(value).__module__}.{type(value).__qualname__}" if type(value).__module__ != "builtins" else \
        type(value).__name__
    if shape is not None:
        return f"{kind} of shape {tuple(shape)}, dtype {dtype}"
    return "None" if value is None else f"{kind} {shorten(repr(value), 60)}"


def check_result(result: Any, mask: Tensor, rule: str, step: int) -> Tensor:
    """``result`` if it is a bool tensor of ``mask``'s shape on its device, else :class:`SelectorError` naming the
    rule, the step and what it returned. Nothing is converted: a float tensor may be a score returned by mistake,
    a [B, 1] one would broadcast to whole responses; shape, dtype and device are read without touching the data
    (no host read)."""
    want = f"a torch.bool tensor of the mask's shape [{', '.join(map(str, mask.shape))}] on {mask.device}"
    if isinstance(result, Tensor) and result.dtype == torch.bool and result.shape == mask.shape \
            and result.device == mask.device:
        return result
    hint = ""
    if isinstance(result, Tensor) and result.shape == mask.shape and result.dtype != torch.bool:
        hint = ("; a score is not a mask (top_fraction(score, inputs, ratio) picks from one), and a 0/1 tensor is "
                "made one with `!= 0`")
    elif isinstance(result, Tensor) and result.dim() == mask.dim() and result.shape != mask.shape:
        hint = "; one value per token is needed: a per-response [B, 1] value is not broadcast to whole responses"
    elif isinstance(result, Tensor) and result.device != mask.device:
        hint = "; create it on inputs.mask.device"
    elif not isinstance(result, Tensor) and hasattr(result, "shape"):
        hint = "; torch.as_tensor(x, device=inputs.mask.device) != 0 makes an array one"
    raise SelectorError(f"selector {rule} returned {describe_value(result)} at step {step}: a rule returns {want}"
                        f"{hint}")


# The tensors of SelectionInputs a rule is handed (its ``needs`` narrow which it may read).
INPUT_TENSORS = ("mask", *STAT_FIELDS, "advantages", "group_ids")


def input_versions(inputs: Any) -> dict[str, int]:
    """The version counter of each input tensor: torch bumps it on every in-place write, through a view too."""
    versions = {}
    for name in INPUT_TENSORS:
        value = object.__getattribute__(inputs, name)
        if isinstance(value, Tensor) and not value.is_inference():  # an inference tensor keeps no counter
            versions[name] = value._version
    return versions


def check_inputs_unwritten(before: dict[str, int], inputs: Any, rule: str, step: int) -> None:
    """A :class:`SelectorError` when the rule wrote one of its inputs in place: the same tensors feed the run's
    selection metrics and the loss's mask, which would then report or train on what the rule made of them."""
    changed = [name for name, version in before.items() if object.__getattribute__(inputs, name)._version != version]
    if changed:
        raise SelectorError(f"selector {rule} wrote SelectionInputs.{changed[0]} in place at step {step}: the inputs "
                            "are shared with the run's metrics and the loss; compute on a copy "
                            f"(inputs.{changed[0]}.clone()) or out of place")


def raised(exc: BaseException, rule: str, fn: Callable[..., Any], step: int) -> SelectorError:
    """The one-line error of a rule that raised ``exc`` at ``step``, naming the line of the rule's own file it was
    raised from (the last frame in that file) where there is one."""
    if isinstance(exc, SelectorError):
        return exc
    path = rule_source_file(fn)
    line, tb = None, exc.__traceback__
    while tb is not None:  # the last frame in the rule's own file: its line, not ictrl's or torch's
        if path is not None and Path(tb.tb_frame.f_code.co_filename).resolve() == path:
            line = tb.tb_lineno
        tb = tb.tb_next
    if line is None:
        text = failure(exc)
    else:
        first = next((p.strip() for p in str(exc).splitlines() if p.strip()), "")
        text = f"{type(exc).__name__}: {shorten(first, 300)}" if first else type(exc).__name__
        text += f" ({rule.rsplit(':', 1)[0]}, line {line})"
    kind = SelectorExit if not isinstance(exc, Exception) else SelectorError
    return kind(f"selector {rule} raised {text} at step {step}")


def import_failure(exc: BaseException) -> str:
    """``exc``, raised while a user's rule module was imported, in a phrase naming the last line of the user's own
    code it passed through (not ictrl's decorator or a library's internals), else :func:`failure`'s."""
    text, line = failure(exc), None
    tb = exc.__traceback__
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        path = None if name.startswith("<") else Path(name).resolve()
        if path is not None and not path.is_relative_to(_PACKAGE) \
                and not any(part.endswith("-packages") for part in path.parts):
            line = (path, tb.tb_lineno)
        tb = tb.tb_next
    if line is None or isinstance(exc, SyntaxError):
        return text
    first = next((p.strip() for p in str(exc).splitlines() if p.strip()), "")
    return f"{type(exc).__name__}: {shorten(first, 300)} ({line[0]}, line {line[1]})" if first else \
        f"{type(exc).__name__} ({line[0]}, line {line[1]})"


# --- a rule given by its file ----------------------------------------------------------------------------------


def is_file_spec(spec: str) -> bool:
    """Whether ``spec`` names its rule by a file (``path/to/rules.py:NAME``) rather than a module."""
    module = spec.rpartition(":")[0]
    return module.endswith(".py") or os.sep in module or "/" in module


def load_rule_file(spec: str) -> tuple[Any, str]:
    """The module of ``path/to/rules.py:NAME`` (imported once per file, under a name of its own, with the file's
    folder on the path for its own imports) and NAME. A missing file or an import that fails is a ``ValueError``
    in one line."""
    file, _, attr = spec.rpartition(":")
    path = Path(os.path.expanduser(file)).resolve()
    if not path.is_file():
        raise ValueError(f"selector {spec!r}: no file {file} (from {Path.cwd()})")
    for name, loaded in FILE_MODULES.items():
        if loaded == path and name in sys.modules:
            return sys.modules[name], attr
    name = f"ictrl_rules_{hashlib.blake2b(str(path).encode(), digest_size=6).hexdigest()}_{path.stem}"
    module_spec = importlib.util.spec_from_file_location(name, path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    if str(path.parent) not in sys.path:
        sys.path.append(str(path.parent))
    try:
        module_spec.loader.exec_module(module)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - a user's file: whatever its import raises, named in one line
        sys.modules.pop(name, None)
        raise ValueError(f"selector {spec!r}: cannot import it: {import_failure(exc)}") from None
    FILE_MODULES[name] = path
    return module, attr
