"""``ictrl train CONFIG.yaml [--KEY=VALUE | --KEY VALUE ...] [--resume] [--print-config]``.

``--config CONFIG.yaml`` (TRL's habit) works as well as the positional file. Keys are the run config's own
(``src/ictrl/engine/run_config.py``): any ``ICTGRPOConfig`` field by name (``--learning_rate=2e-6``,
``--token_selector random``) or a section key (``--model.name_or_path=/path``, ``--data.train=[math_train]``);
values are YAML scalars and a bare ``--flag`` means true. A bad key or value exits with status 2 and one line
naming the key, before any model loads.
"""

from __future__ import annotations

import argparse
import logging
import sys

import yaml

FLAGS = ("--resume", "--print-config")
USAGE = "ictrl train (CONFIG.yaml | --config CONFIG.yaml) [--KEY=VALUE | --KEY VALUE ...] [--resume] [--print-config]"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.usage = USAGE
    parser.epilog = ("--resume: continue from the last complete checkpoint in output_dir (start fresh if none). "
                     "--print-config: print the resolved config and exit. Keys: configs/README.md.")
    parser.add_argument("argv", nargs=argparse.REMAINDER, metavar="ARGS",
                        help="the config file and overrides, e.g. configs/qwen2.5-1.5b/ict.yaml --learning_rate=2e-6")
    help_only = parser.parse_args

    def parse_args(args: list[str] | None = None, namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        # Overrides are open-ended (any trainer field), so argparse sees only -h; split_argv reads the rest.
        args = list(sys.argv[1:] if args is None else args)
        if args[:1] in (["-h"], ["--help"]):
            return help_only(args)
        return argparse.Namespace(argv=args)

    parser.parse_args = parse_args  # type: ignore[method-assign]


class UsageError(ValueError):
    pass


def split_argv(argv: list[str]) -> tuple[str, list[str], set[str]]:
    """(config path, overrides, flags) from the command line after ``ictrl train``."""
    config: str | None = None
    overrides: list[str] = []
    flags: set[str] = set()
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in FLAGS:
            flags.add(arg)
        elif arg == "--config" or arg.startswith("--config="):
            if arg == "--config":
                if i + 1 == len(argv):
                    raise UsageError("--config needs a file")
                i += 1
            path = argv[i] if arg == "--config" else arg.split("=", 1)[1]
            if config is not None:
                raise UsageError(f"two config files: {config} and {path}")
            config = path
        elif not arg.startswith("--") and config is None and not overrides:
            config = arg
        else:
            overrides.append(arg)
        i += 1
    if config is None:
        raise UsageError(f"no config file; usage: {USAGE}")
    return config, overrides, flags


def run(args: argparse.Namespace) -> int:
    from ictrl.engine.run_config import config_to_dict, load_config

    _setup_logging()
    try:
        config, overrides, flags = split_argv(list(args.argv))
        cfg = load_config(config, overrides)
        from ictrl.engine.process_group import process_group_left
        from ictrl.engine.run import build_trainer_args, train

        # Building the trainer arguments joins the launcher's process group; every exit leaves it.
        with process_group_left():
            if "--print-config" in flags:
                build_trainer_args(cfg, config)  # every value checked before it is shown
                sys.stdout.write(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
                return 0

            result = train(cfg, resume="--resume" in flags, source=config)
    except UsageError as exc:  # a ConfigError (a UserError) goes to ictrl.cli: one line, --debug for the traceback
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
