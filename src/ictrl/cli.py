"""The ``ictrl`` command line: one thin dispatcher over per-command modules.

Each subcommand lives in its own module exposing ``add_arguments(parser)`` and
``run(args) -> int``. Modules are imported only when their command is chosen, so
``ictrl --help`` stays fast and a missing optional dependency (vLLM) breaks only
the command that needs it.

Errors: a :class:`ictrl.errors.UserError` (a wrong path, name, data row, missing extra) raised anywhere in a
command becomes one line ``ictrl COMMAND: error: MESSAGE`` on stderr and exit status 2. ``--debug`` anywhere on
the command line (or ``ICTRL_DEBUG=1``) shows the traceback instead. Ctrl-C is one line too (what was kept and how
to go on, for ``ictrl train``), exit status 130; SIGTERM likewise (``ictrl train`` first finishes the generation
batch and saves a checkpoint), exit status 143; an argparse error is one line with a pointer to ``--help``. Under
``accelerate launch`` only rank 0 prints these lines. Running out of memory is one line naming what to lower. These
lines and how the process ends (a launched rank without interpreter finalisation) are :mod:`ictrl.process_exit`'s
(``command_status``). ``--verbose`` keeps the libraries' bars and notes (otherwise
:func:`ictrl.library_noise.quiet`); a command's path options and the import path are :mod:`ictrl.cliargs`'.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from ictrl.cliargs import DEBUG_ENV, VERBOSE_ENV, env_flag, expand_path_options, import_from_working_directory
from ictrl.errors import interrupts_once, one_line
from ictrl.library_noise import quiet
from ictrl.process_exit import ENDINGS, command_status, run_then_exit

# command -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("ictrl.train_cli.cli", "train a model with ICT or a baseline from a YAML config"),
    "eval": ("ictrl.eval.cli", "evaluate a model on benchmarks with pass@k"),
    "table": ("ictrl.eval.table", "the paper's Table 1 (methods x training seeds) from `ictrl eval` results"),
    "demo": ("ictrl.experiments.demo", "build the tiny embedded model, train it with ICT on CPU, pass@k before and "
                                       "after"),
    "compare": ("ictrl.experiments.compare", "run methods x seeds and write a comparison report"),
    "inspect": ("ictrl.experiments.inspect", "HTML heatmap of ICT scores and entropy over response tokens"),
    "regime": ("ictrl.experiments.regime", "whether ICT's tokens differ from random ones on a model and prompt set "
               "(π, H1, overlap with 20-Entropy; HTML + JSON)"),
    "selectors": ("ictrl.experiments.selectors", "list the selection rules and the statistics a rule can read"),
    "tiny-model": ("ictrl.experiments.tasks.tinymodel", "write the embedded tiny model (or a random Qwen2.5-shaped "
                   "one, --shape) and a tiny-task train.jsonl to a directory"),
}

# Commands that left the package: the project's own studies, run from a clone of the repository.
MOVED: dict[str, str] = {"sweep": "python -m studies sweep"}


class OneLineParser(argparse.ArgumentParser):
    """An argparse parser whose errors are one line with a pointer to ``--help`` (argparse prints the whole
    usage first, which buries the message), exit status 2 as argparse's."""

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="ictrl",
        description="RLVR with ICT (Independent Combinatorial Tokens) and its baselines.",
    )
    parser.add_argument("--debug", action="store_true",
                        help="show the full traceback of an error (also: ICTRL_DEBUG=1), anywhere on the line")
    parser.add_argument("--verbose", action="store_true",
                        help="keep the libraries' progress bars and notes, and every process's log lines (also: "
                             "ICTRL_VERBOSE=1), anywhere on the line")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``ictrl`` command; the exit status. ``--debug`` / ``--verbose`` reach the processes a command starts
    through ``ICTRL_DEBUG`` / ``ICTRL_VERBOSE``, which are restored on return (an in-process caller keeps its own)."""
    saved = {key: os.environ.get(key) for key in (DEBUG_ENV, VERBOSE_ENV)}
    try:
        return _main(argv)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _main(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or env_flag(DEBUG_ENV)
    verbose = "--verbose" in argv or env_flag(VERBOSE_ENV)
    argv = [a for a in argv if a not in ("--debug", "--verbose")]
    if debug:
        os.environ[DEBUG_ENV] = "1"  # for the processes `ictrl train --num-processes` starts
    if verbose:
        os.environ[VERBOSE_ENV] = "1"  # for the commands' own log setup
    else:
        quiet()
    import_from_working_directory()
    parser = build_parser()
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0
    if argv[0] in MOVED:
        parser.error(f"{argv[0]!r} is a study of the ictrl repository now: from a clone, run {MOVED[argv[0]]}")
    if argv[0] not in COMMANDS:
        parser.error(f"unknown command {argv[0]!r}; choose from {', '.join(COMMANDS)}")
    name = argv[0]
    try:
        module = importlib.import_module(COMMANDS[name][0])
        sub_parser = OneLineParser(prog=f"ictrl {name}", description=COMMANDS[name][1])
        module.add_arguments(sub_parser)
        args = sub_parser.parse_args(argv[1:])
        expand_path_options(args)
        with interrupts_once():  # a second Ctrl-C while the first one's shutdown runs is absorbed
            return int(module.run(args) or 0)
    except ENDINGS as err:
        status = command_status(name, err, debug)
        if status is None:
            raise
        return status


def entry() -> NoReturn:
    """The process entry (``ictrl``, ``python -m ictrl``, ``python -m ictrl.cli``): :func:`main`, then exit with its
    status (``ictrl.process_exit.run_then_exit``). Library and in-process callers use :func:`main`, which returns."""
    run_then_exit(main)


if __name__ == "__main__":
    entry()
