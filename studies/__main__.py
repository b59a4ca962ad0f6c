"""``python -m studies COMMAND`` from the repository's root: the project's studies on top of ictrl.

- ``compare``: ``ictrl compare`` plus the study protocols ``--tune`` (each method at its own tuned lr and
  normaliser, ``protocols.tune``) and ``--horizon SETTING`` (collapse / explosion over a long horizon,
  ``protocols.horizon``);
- ``sweep``: the learning rate x method x seed stability study (``sweep``).

Errors are ``ictrl``'s: a :class:`ictrl.errors.UserError` is one line and exit status 2.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from ictrl.cli import OneLineParser
from ictrl.library_noise import quiet
from ictrl.errors import UserError, one_line

COMMANDS = {"compare": ("studies.compare", "ictrl compare plus the tuned (--tune) and long-horizon (--horizon) "
                                           "protocols"),
            "sweep": ("studies.sweep", "learning-rate x method x seed stability study")}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        print("usage: python -m studies {" + ",".join(COMMANDS) + "} ...\n\n"
              + "\n".join(f"  {name:8} {help_text}" for name, (_, help_text) in COMMANDS.items()),
              file=sys.stdout if not argv or argv[0] in ("-h", "--help") else sys.stderr)
        return 0 if not argv or argv[0] in ("-h", "--help") else 2
    name = argv[0]
    quiet()
    module = importlib.import_module(COMMANDS[name][0])
    parser = OneLineParser(prog=f"python -m studies {name}", description=COMMANDS[name][1])
    module.add_arguments(parser)
    try:
        return int(module.run(parser.parse_args(argv[1:])) or 0)
    except UserError as err:
        print(f"studies {name}: error: {one_line(err)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
