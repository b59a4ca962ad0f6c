"""Option conventions every ``ictrl`` command shares: lists are comma-separated (``--benchmarks gsm8k,math500``;
the space-separated form ``--benchmarks gsm8k math500`` is read the same way)."""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

from ictrl.errors import UserError

# How --debug / --verbose reach every module of a command and the processes it starts (ictrl.cli sets them).
DEBUG_ENV, VERBOSE_ENV = "ICTRL_DEBUG", "ICTRL_VERBOSE"


def env_flag(name: str) -> bool:
    """Whether the environment variable ``name`` is set to 1, true or yes (any case)."""
    return os.environ.get(name, "").lower() in ("1", "true", "yes")


def comma_list(convert: Callable[[str], Any] = str) -> Callable[[str], list[Any]]:
    """argparse ``type``: ``"a,b"`` -> ``[convert("a"), convert("b")]`` (empty items dropped)."""

    def parse(text: str) -> list[Any]:
        items = [t.strip() for t in text.split(",") if t.strip()]
        try:
            return [convert(t) for t in items]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of "
                                             f"{getattr(convert, '__name__', 'values')}, got {text!r}") from None

    return parse


class CommaList(argparse.Action):
    """With ``nargs="+"`` and ``type=comma_list(...)``: the items of every value, flattened, in order."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: str | Sequence[Any] | None, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, [x for v in values or [] for x in v])


# Run-config keys that hold paths (or, dataset_name and eval_datasets, data specs holding one): `~` and `$VAR` in
# them are expanded as a shell would, so a config shared between machines can say $SCRATCH/runs/x.
PATH_KEYS = frozenset({"output_dir", "logging_dir", "model_name_or_path", "dataset_name", "eval_datasets",
                       "resume_from_checkpoint", "chat_template_path", "deepspeed", "reward_model_name_or_path"})
# The path options of the commands (argparse dests): a leading `~` the shell left (`--output-dir=~/x`) is expanded.
PATH_OPTIONS = frozenset({"output_dir", "model", "data_root", "out", "save_rollouts", "rollouts", "prompts",
                          "accelerate_config", "results"})
_VARIABLE = re.compile(r"\$(\{[A-Za-z_]\w*\}|[A-Za-z_]\w*)")


def expand_path(text: str, where: str, variables: bool = True) -> str:
    """``text`` with a leading ``~`` and, with ``variables`` (a value from a file, which no shell read),
    ``$VAR``/``${VAR}`` expanded. In a ``jsonl:`` data spec only its path is (``jsonl:$DATA/t.jsonl`` or the
    ``path=`` option); its other options are text (``prompt_template=Let $n$ be {question}``). A variable that is
    not set is a :class:`UserError` naming ``where`` and the variable, not a folder named ``$VAR``.

    A value from the command line keeps its ``$``: the shell expanded every variable it was not told to keep
    (``'$HOME/x'`` in single quotes means the text), but leaves the ``~`` of ``--output-dir=~/x``."""
    if "$" not in text and "~" not in text:
        return text
    if not text.startswith("jsonl:"):
        return _expand(text, text, where, variables)
    parts = text.split(":")  # as ictrl.data.parse_spec splits a spec: options hold "=", the path's parts do not
    first = next((i for i, part in enumerate(parts[1:], 1) if "=" not in part), None)
    for i, part in enumerate(parts[1:], 1):
        if i == first:
            parts[i] = _expand(part, text, where, variables)
        elif part.startswith("path="):
            parts[i] = "path=" + _expand(part[len("path="):], text, where, variables)
        elif "=" not in part:
            parts[i] = _expand(part, text, where, variables, home=False)  # a later piece of a path with ":" in it
    return ":".join(parts)


def _expand(path: str, text: str, where: str, variables: bool, home: bool = True) -> str:
    expanded = os.path.expandvars(path) if variables else path
    unset = _VARIABLE.search(expanded) if variables else None
    if unset:
        raise UserError(f"{where}: {text!r}: the environment variable {unset.group(1).strip('{}')} is not set")
    return os.path.expanduser(expanded) if home else expanded


def expand_paths(value: Any, where: str, variables: bool = True) -> Any:
    """:func:`expand_path` over a string, the strings of a list and the keys of a mapping (a data mixture). One level
    only: a list holding lists (a recursive YAML alias among them) is left as it is for its field's check to refuse."""
    if isinstance(value, str):
        return expand_path(value, where, variables)
    if isinstance(value, list):
        return [expand_path(item, where, variables) if isinstance(item, str) else item for item in value]
    if isinstance(value, dict):
        return {expand_paths(key, where, variables) if isinstance(key, str) else key: item
                for key, item in value.items()}
    return value


def expand_path_options(args: argparse.Namespace) -> None:
    """The leading ``~`` the shell left in a command's path options (:data:`PATH_OPTIONS`: ``--output-dir=~/x``),
    expanded in place; the shell had already expanded the ``$VAR``s."""
    for dest in PATH_OPTIONS & vars(args).keys():
        value = getattr(args, dest)
        if isinstance(value, (str, os.PathLike)):
            expanded = expand_path(os.fspath(value), f"--{dest.replace('_', '-')}", variables=False)
            setattr(args, dest, type(value)(expanded) if not isinstance(value, str) else expanded)


def import_from_working_directory() -> None:
    """``module:function`` names (selectors, rewards) import from the working directory, as under ``python -m``:
    the console script puts only its own directory on the path. Appended last, so an installed package wins over a
    local file (a process-global hook: docs/architecture.md's table)."""
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())
