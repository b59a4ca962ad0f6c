"""``ictrl train CONFIG.yaml [--section.key=value ...] [--resume] [--print-config]``.

Overrides use dotted keys and YAML scalars: ``--optim.learning_rate=1e-6``, ``--data.train=[gsm8k_train]``,
``--trainer.save_total_limit=2``. A bad key or value exits with status 2 and a message naming the key, before
any model loads.
"""

from __future__ import annotations

import argparse
import logging
import sys

import yaml

FLAGS = ("--resume", "--print-config")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="run config YAML (see configs/README.md)")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the last complete checkpoint in output_dir (start fresh if none)")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    parser.add_argument("overrides", nargs=argparse.REMAINDER, metavar="--section.key=value",
                        help="config overrides, e.g. --optim.learning_rate=1e-6 --model.name_or_path=/path")


def run(args: argparse.Namespace) -> int:
    from ictrl.engine.run_config import ConfigError, config_to_dict, load_config

    # argparse hands everything after the first override to REMAINDER, flags included
    overrides = [a for a in args.overrides if a not in FLAGS]
    resume = args.resume or "--resume" in args.overrides
    print_only = args.print_config or "--print-config" in args.overrides
    _setup_logging()
    try:
        cfg = load_config(args.config, overrides)
        if print_only:
            sys.stdout.write(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
            return 0
        from ictrl.engine.run import train

        result = train(cfg, resume=resume, source=args.config)
    except ConfigError as exc:
        print(f"ictrl train: error: {exc}", file=sys.stderr)
        return 2
    logging.getLogger("ictrl.train").info("finished at step %d; model in %s", result.global_step, result.final_model)
    return 0


def _setup_logging() -> None:
    handler: logging.Handler
    if sys.stderr.isatty():
        from rich.console import Console
        from rich.logging import RichHandler

        handler = RichHandler(console=Console(stderr=True), show_path=False, show_time=False, markup=False)
        handler.setFormatter(logging.Formatter("%(message)s"))
    else:  # one unwrapped line per message in log files and CI
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)
    for noisy in ("httpx", "urllib3", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
