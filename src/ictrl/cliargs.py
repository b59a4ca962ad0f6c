"""Option conventions every ``ictrl`` command shares: lists are comma-separated (``--benchmarks gsm8k,math500``;
the space-separated form ``--benchmarks gsm8k math500`` is read the same way)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from typing import Any

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
