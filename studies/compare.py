"""``python -m studies compare``: ``ictrl compare``'s options and runs, plus the project's two study protocols.

- ``--tune``: each method at its own tuned learning rate and normaliser, fresh seeds, matched update size
  (``protocols.tune``, driven by ``tunecli``);
- ``--horizon SETTING``: the long-horizon protocol (``protocols.horizon``, driven by ``horizoncli``): collapse /
  explosion over at least 400 steps, held-out pass@1/4/16 along the way.

Without either flag it is ``ictrl compare``.
"""

from __future__ import annotations

import argparse

from ictrl.errors import UserError
from ictrl.files import check_output_dir
from ictrl.experiments import compare
from studies import horizoncli, tunecli


def add_arguments(parser: argparse.ArgumentParser) -> None:
    compare.add_arguments(parser)
    tunecli.add_arguments(parser)  # --tune and the tuned protocol's grid
    horizoncli.add_arguments(parser)  # --horizon SETTING: the long-horizon protocol


def run(args: argparse.Namespace) -> int:
    check_output_dir(args.output_dir)  # before any run or model load
    if args.tune and args.horizon:
        raise UserError("--tune and --horizon are two protocols: choose one")
    if args.horizon:
        return horizoncli.run(args)
    if args.tune:
        return tunecli.run(args)
    return compare.run(args)
