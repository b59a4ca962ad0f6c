"""The ``ictrl`` command line: one thin dispatcher over per-command modules.

Each subcommand lives in its own module exposing ``add_arguments(parser)`` and
``run(args) -> int``. Modules are imported only when their command is chosen, so
``ictrl --help`` stays fast and a missing optional dependency (vLLM) breaks only
the command that needs it.

Errors: a :class:`ictrl.errors.UserError` (a wrong path, name, data row, missing extra) raised anywhere in a
command becomes one line ``ictrl COMMAND: error: MESSAGE`` on stderr and exit status 2. ``--debug`` anywhere on
the command line (or ``ICTRL_DEBUG=1``) shows the traceback instead.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from ictrl.errors import UserError, one_line

# command -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("ictrl.engine.cli", "train a model with ICT or a baseline from a YAML config"),
    "eval": ("ictrl.eval.cli", "evaluate a model on benchmarks with pass@k"),
    "table": ("ictrl.eval.table", "the paper's Table 1 (methods x training seeds) from `ictrl eval` results"),
    "demo": ("ictrl.experiments.demo", "build the tiny embedded model and watch ICT improve it on CPU"),
    "compare": ("ictrl.experiments.compare", "run methods x seeds and write a comparison report"),
    "sweep": ("ictrl.experiments.sweep", "learning-rate x method x seed stability study"),
    "inspect": ("ictrl.experiments.inspect", "HTML heatmap of ICT scores and entropy over response tokens"),
    "tiny-model": ("ictrl.experiments.tasks.tinymodel", "write the embedded tiny model (or a random Qwen2.5-shaped "
                   "one, --shape) and a tiny-task train.jsonl to a directory"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ictrl",
        description="RLVR with ICT (Independent Combinatorial Tokens) and its baselines.",
    )
    parser.add_argument("--debug", action="store_true",
                        help="show the full traceback of an error (also: ICTRL_DEBUG=1), anywhere on the line")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("ICTRL_DEBUG", "").lower() in ("1", "true", "yes")
    argv = [a for a in argv if a != "--debug"]
    parser = build_parser()
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0
    if argv[0] not in COMMANDS:
        parser.error(f"unknown command {argv[0]!r}; choose from {', '.join(COMMANDS)}")
    name = argv[0]
    try:
        module = importlib.import_module(COMMANDS[name][0])
        sub_parser = argparse.ArgumentParser(prog=f"ictrl {name}", description=COMMANDS[name][1])
        module.add_arguments(sub_parser)
        args = sub_parser.parse_args(argv[1:])
        return int(module.run(args) or 0)
    except UserError as err:
        if debug:
            raise
        print(f"ictrl {name}: error: {one_line(err)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
