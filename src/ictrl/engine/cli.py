"""``ictrl train CONFIG.yaml [--KEY=VALUE | --KEY VALUE ...] [--resume] [--print-config]``.

``--config CONFIG.yaml`` (TRL's habit) works as well as the positional file. Keys are the run config's own
(``src/ictrl/engine/run_config.py``): any ``ICTGRPOConfig`` field by name (``--learning_rate=2e-6``,
``--token_selector random``) or a section key (``--model.name_or_path=/path``, ``--data.train=[math_train]``);
values are YAML scalars and a bare ``--flag`` means true; a key may be spelt with dashes (``--output-dir``,
``--learning-rate``). TRL's script flags ``--model_name_or_path`` (= ``model.name_or_path``) and
``--dataset_name`` (a pointer to ``data.train``) are understood. A bad key or value exits with status 2 and one line
naming the key, before any model loads. ``ictrl train --help`` lists the keys with their help.

``--num-processes N [--accelerate-config FILE] [--main-process-port PORT]`` (TRL's underscore spellings too) starts
the run on ``N`` processes through accelerate's launcher from this process, after checking the config for them:
``ictrl.engine.launch``.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shlex
import sys
from typing import Any

import yaml

from ictrl.cliargs import VERBOSE_ENV, env_flag
from ictrl.engine.launch import FLAGS as LAUNCH_FLAGS
from ictrl.engine.launch import Launch, LaunchError

FLAGS = ("--resume", "--resume=auto", "--print-config")
USAGE = ("ictrl train (CONFIG.yaml | --config CONFIG.yaml) [--KEY=VALUE | --KEY VALUE ...] [--resume] [--print-config]"
         " [--num-processes N [--accelerate-config FILE] [--main-process-port PORT]]")


# TRL's example scripts take these flags (TrlParser's ScriptArguments / ModelConfig); their run-config keys:
# a flag with an equivalent key is renamed, one without gets a pointer.
TRL_RENAMES = {"model_name_or_path": "model.name_or_path", "torch_dtype": "model.dtype", "dtype": "model.dtype",
               "trust_remote_code": "model.trust_remote_code"}
TRL_POINTERS = {
    "dataset_name": "data.train, a list of ictrl.data names or jsonl:FILE (--data.train=[gsm8k_train])",
    "dataset_config": "a source option in data.train (gsm8k_train:levels=..., jsonl:FILE:question_field=...)",
    "dataset_train_split": "a source option in data.train (NAME:hub_split=train)",
    "dataset_test_split": "data.eval (benchmarks for `ictrl eval`)",
}
# The trainer fields most runs set, listed by `ictrl train --help` beside ictrl's own (every field is accepted).
COMMON_TRL_KEYS = ("output_dir", "learning_rate", "max_steps", "num_generations", "per_device_train_batch_size",
                   "max_completion_length", "temperature", "beta", "epsilon", "epsilon_high", "seed", "save_steps",
                   "logging_steps", "report_to", "use_vllm")


def _first_sentence(text: str, width: int = 110) -> str:
    text = " ".join(str(text).split())
    end = re.search(r"(?<!e\.g)(?<!i\.e)(?<!Eq)\.\s+(?=[A-Z`])", text)  # a sentence end, not "e.g. " / "Eq. 13"
    text = text if end is None else text[: end.start() + 1]
    return text if len(text) <= width else text[: width - 3] + "..."


def config_keys_help() -> str:
    """The run-config keys with their help (from the dataclasses that own them), for ``ictrl train --help``."""
    import dataclasses

    from ictrl.engine.config import ICTGRPOConfig
    from ictrl.engine.run_config import SECTIONS
    from trl import GRPOConfig

    def rows(fields: list[Any], prefix: str = "") -> list[str]:
        return [f"  {prefix}{f.name:<{34 - len(prefix)}} {_first_sentence(f.metadata.get('help', ''))}"
                for f in fields]

    lines = ["config keys (YAML or --KEY=VALUE; the help comes from the dataclass that checks the value):"]
    for name, cls in SECTIONS.items():
        lines.append(f" {name}:")
        lines += rows(list(dataclasses.fields(cls)), f"{name}.")
    trl_names = {f.name for f in dataclasses.fields(GRPOConfig)}
    fields = {f.name: f for f in dataclasses.fields(ICTGRPOConfig) if f.init}
    lines.append(" token selection (ictrl's ICTGRPOConfig):")
    lines += rows([f for n, f in fields.items() if n not in trl_names])
    lines.append(f" common TRL GRPOConfig keys (all {len(trl_names)} GRPOConfig / TrainingArguments fields are "
                 "accepted by name):")
    lines += rows([fields[n] for n in COMMON_TRL_KEYS if n in fields])
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.usage = USAGE
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    flags_help = ("--resume: continue from the last complete checkpoint in output_dir (an error if there is none;\n"
                  "  --resume=auto starts from step 0 then, for a job script that is requeued).\n"
                  "--print-config: print the resolved config and exit. More on keys: configs/README.md.\n"
                  "--num-processes N: check the config, then start N processes through accelerate's launcher "
                  "(data parallel;\n  on CPU, gloo). --accelerate-config FILE: accelerate's config "
                  "(configs/accelerate/{ddp,fsdp2,zero2,zero3}.yaml);\n  its num_processes unless --num-processes "
                  "is given. --main-process-port PORT: the rendezvous port (default 29500).")
    parser.add_argument("argv", nargs=argparse.REMAINDER, metavar="ARGS",
                        help="the config file and overrides, e.g. configs/qwen2.5-1.5b/ict.yaml --learning_rate=2e-6")
    help_only = parser.parse_args

    def parse_args(args: list[str] | None = None, namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        # Overrides are open-ended (any trainer field), so argparse sees only -h; split_argv reads the rest.
        args = list(sys.argv[1:] if args is None else args)
        if "-h" in args or "--help" in args:
            parser.epilog = flags_help + "\n\n" + config_keys_help()
            return help_only(["--help"])
        return argparse.Namespace(argv=args)

    parser.parse_args = parse_args  # type: ignore[method-assign]


LAUNCH_ARGV_ENV = "ICTRL_LAUNCH_ARGV"  # `ictrl train --num-processes`'s arguments, for the processes it starts


class UsageError(ValueError):
    pass


def normalize_overrides(overrides: list[str]) -> list[str]:
    """Overrides with dashed keys spelt as the fields are (``--output-dir`` -> ``--output_dir``) and TRL's script
    flags renamed (``--model_name_or_path`` -> ``--model.name_or_path``); a TRL flag with no equivalent key is a
    :class:`UsageError` naming the key to use."""
    out = []
    for arg in overrides:
        if arg.startswith("--") and len(arg) > 2:
            key, eq, value = arg[2:].partition("=")
            key = key.replace("-", "_")
            if key in TRL_POINTERS:
                raise UsageError(f"--{key} is a flag of TRL's scripts; in ictrl the data is {TRL_POINTERS[key]}")
            arg = f"--{TRL_RENAMES.get(key, key)}{eq}{value}"
        out.append(arg)
    return out


def _launch_flag(arg: str) -> str | None:
    """The launch field a ``--num-processes`` style argument sets (dashes or underscores), else None."""
    if not arg.startswith("--"):
        return None
    key = arg[2:].partition("=")[0].replace("-", "_")
    return key if key in LAUNCH_FLAGS else None


def split_argv(argv: list[str]) -> tuple[str, list[str], set[str]]:
    """(config path, overrides, flags) from the command line after ``ictrl train`` (launch flags: split_launch)."""
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


def split_launch(argv: list[str]) -> tuple[list[str], Launch]:
    """(the arguments without the launch flags, the :class:`ictrl.engine.launch.Launch` they give); a flag without a
    value or with a bad one is a :class:`UsageError`."""
    rest: list[str] = []
    launch = Launch()
    i = 0
    while i < len(argv):
        field = _launch_flag(argv[i])
        if field is None:
            rest.append(argv[i])
        else:
            flag, eq, value = argv[i].partition("=")
            if not eq:
                if i + 1 == len(argv) or argv[i + 1].startswith("--"):
                    raise UsageError(f"{flag} needs a value")
                i += 1
                value = argv[i]
            try:
                launch.set(field, value)
            except LaunchError as exc:
                raise UsageError(str(exc)) from None
        i += 1
    return rest, launch


def run(args: argparse.Namespace) -> int:
    from ictrl.engine.run_config import config_to_dict, load_config, parse_overrides
    from ictrl.engine.run_guard import die_with_launcher

    die_with_launcher()  # a rank of `accelerate launch` / torchrun ends with it, not training on detached
    _setup_logging()
    try:
        argv, launch = split_launch(list(args.argv))
        config, overrides, flags = split_argv(argv)
        overrides = normalize_overrides(overrides)
        cfg = load_config(config, overrides)
        from ictrl.engine.process_group import process_group_left
        from ictrl.engine.run import build_trainer_args, train

        set_by_flag = parse_overrides(overrides)
        if launch.requested() and "--print-config" not in flags:
            from ictrl.engine.launch import check_and_launch

            # the processes' Ctrl-C line names the command that resumes the launch, flags included
            os.environ[LAUNCH_ARGV_ENV] = shlex.join(args.argv)
            try:
                return check_and_launch(cfg, launch, argv, _resume(flags), config, set_by_flag)
            finally:
                del os.environ[LAUNCH_ARGV_ENV]
        # Building the trainer arguments joins the launcher's process group; every exit leaves it.
        with process_group_left():
            if "--print-config" in flags:
                from ictrl.engine import model_init
                from ictrl.engine.config import planned_processes, process_count

                # every value checked before it is shown, for the processes the run will have
                with planned_processes(launch.total_processes() if launch.requested() else process_count()):
                    build_trainer_args(cfg, config, flags=set_by_flag)
                model_init.load_kwargs(cfg, config)
                model_init.peft_config(cfg, config)
                sys.stdout.write(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
                return 0

            launched = shlex.split(os.environ.get(LAUNCH_ARGV_ENV, "")) or argv
            again = ["ictrl", "train", *[a for a in launched if not a.startswith("--resume")], "--resume"]
            result = train(cfg, resume=_resume(flags), source=config, resume_command=shlex.join(again),
                           flags=set_by_flag)
    except (UsageError, LaunchError) as exc:  # a ConfigError (a UserError) goes to ictrl.cli: one line, --debug
        print(f"ictrl train: error: {exc}", file=sys.stderr)
        return 2
    logging.getLogger("ictrl.train").info("finished at step %d; model in %s", result.global_step, result.final_model)
    return 0


def _resume(flags: set[str]) -> bool | str:
    """``--resume``: True (a checkpoint must be there); ``--resume=auto``: "auto" (start fresh without one)."""
    return "auto" if "--resume=auto" in flags else "--resume" in flags


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
    # Under `accelerate launch` every process runs this command: rank 0 logs, the others only errors (a warning
    # printed once per process says nothing more). --verbose / ICTRL_VERBOSE=1 keeps every rank's lines.
    verbose = env_flag(VERBOSE_ENV)
    first = os.environ.get("RANK", "0") in ("0", "")
    logging.basicConfig(level=logging.INFO if first or verbose else logging.ERROR, handlers=[handler], force=True)
    for noisy in ("httpx", "urllib3", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
