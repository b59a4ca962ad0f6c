"""Option conventions every ``ictrl`` command shares: lists are comma-separated (``--benchmarks gsm8k,math500``;
the space-separated form ``--benchmarks gsm8k math500`` is read the same way)."""

from __future__ import annotations

import argparse
import os
import re
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
# The path options of the commands (argparse dests), expanded alike.
PATH_OPTIONS = frozenset({"output_dir", "model", "data_root", "out", "save_rollouts", "rollouts", "prompts",
                          "accelerate_config", "results"})


def expand_path(text: str, where: str) -> str:
    """``text`` with ``$VAR``/``${VAR}`` and a leading ``~`` expanded (after a ``jsonl:`` prefix, for a data spec).
    A variable that is not set is a :class:`UserError` naming ``where`` and the variable, not a folder named
    ``$VAR``."""
    if "$" not in text and "~" not in text:
        return text
    prefix = "jsonl:" if text.startswith("jsonl:") else ""
    expanded = os.path.expanduser(os.path.expandvars(text[len(prefix):]))
    unset = re.search(r"\$(\{[A-Za-z_]\w*\}|[A-Za-z_]\w*)", expanded)
    if unset:
        raise UserError(f"{where}: {text!r}: the environment variable {unset.group(1).strip('{}')} is not set")
    return prefix + expanded


def expand_paths(value: Any, where: str) -> Any:
    """:func:`expand_path` over a string, the strings of a list and the keys of a mapping (a data mixture). One level
    only: a list holding lists (a recursive YAML alias among them) is left as it is for its field's check to refuse."""
    if isinstance(value, str):
        return expand_path(value, where)
    if isinstance(value, list):
        return [expand_path(item, where) if isinstance(item, str) else item for item in value]
    if isinstance(value, dict):
        return {expand_paths(key, where) if isinstance(key, str) else key: item for key, item in value.items()}
    return value
