"""``ictrl train CONFIG.yaml [--KEY=VALUE | --KEY VALUE ...] [--resume] [--print-config]``.

``--config CONFIG.yaml`` (TRL's habit) works as well as the positional file. The file is a ``trl grpo --config``
file (``src/ictrl/train_cli/run_config.py``): keys of TRL's ``GRPOScriptArguments``, ``GRPOConfig`` and ``ModelConfig``
plus ictrl's own; flags set any of them as TRL's parser reads them (``--learning_rate=2e-6``, ``--use_peft``,
``--scale_rewards=false``, dashes or underscores). A bad key or value exits with status 2 and one line naming the
flag or the file and the key, before any model loads. ``ictrl train --help`` lists the keys with their help.

``--num-processes N [--accelerate-config FILE] [--main-process-port PORT]`` (TRL's underscore spellings too) starts
the run on ``N`` processes through accelerate's launcher from this process, after checking the config for them:
``ictrl.train_cli.launch``.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
from dataclasses import dataclass, field
from typing import Any

import yaml

from ictrl.cliargs import VERBOSE_ENV, env_flag
from ictrl.errors import shorten
from ictrl.files import redact_command
from ictrl.train_cli.launch import FLAGS as LAUNCH_FLAGS
from ictrl.train_cli.launch import Launch, LaunchError
from ictrl.train_cli.run_guard import MODE_FLAGS, NO_OP_FLAG, OVERWRITE_FLAG
from ictrl.train_cli.run_inputs import ACCEPT_CHANGED_FLAG

RESUME_FLAGS = ("--resume-inexact", "--resume-new-schedule")  # exact_resume's INEXACT_FLAG, NEW_SCHEDULE_FLAG
FLAGS = ("--resume", "--resume=auto", "--print-config", ACCEPT_CHANGED_FLAG, *MODE_FLAGS, *RESUME_FLAGS)
USAGE = ("ictrl train (CONFIG.yaml | --config CONFIG.yaml) [--KEY=VALUE | --KEY VALUE ...] [--resume] [--print-config]"
         f" [{OVERWRITE_FLAG}] [{NO_OP_FLAG}]"
         " [--num-processes N [--accelerate-config FILE] [--main-process-port PORT]]")


def _default(f: Any) -> str:
    """A field's default as a config file writes it."""
    from ictrl.train_cli.run_config import field_default

    value = field_default(f)
    value = getattr(value, "value", value)  # an enum member: its string
    if isinstance(value, str):
        return repr(value)
    return yaml.safe_dump(value, default_flow_style=True, width=1 << 20).strip().removesuffix("...").strip()


def config_keys_help(width: int = 110) -> str:
    """Every run-config key, grouped by the dataclass that owns it, with its default and full help (from the
    dataclass), for ``ictrl train --help``: what ``trl grpo --help`` lists, plus ictrl's keys."""
    import dataclasses
    import textwrap

    from transformers import TrainingArguments
    from trl import GRPOConfig
    from trl import ModelConfig as TRLModelConfig
    from trl.scripts.grpo import GRPOScriptArguments

    from ictrl.engine.config_fields import RANGES
    from ictrl.train_cli.run_config import DEFAULT_SELECTOR, owners
    from ictrl.validation import bound_text, declared

    fields = {f.name: f for cls in set(owners().values()) for f in dataclasses.fields(cls) if f.init}
    declared_bounds = {n: b for cls in set(owners().values()) for n, (_, b) in declared(cls).items() if b is not None}
    bounds = {n: bound_text(b) for n, b in {**RANGES, **declared_bounds}.items()}
    names = {cls: [f.name for f in dataclasses.fields(cls) if f.init] for cls in
             (GRPOScriptArguments, TRLModelConfig, GRPOConfig, TrainingArguments)}
    trl_keys = {n for cls in (GRPOScriptArguments, TRLModelConfig, GRPOConfig) for n in names[cls]}
    groups = [
        ("ictrl's own keys (token selection, data, rewards, step shape, evaluation during training)",
         [n for n in owners() if n not in trl_keys]),
        ("trl grpo's script keys (GRPOScriptArguments; dataset_name and reward_funcs also take ictrl's names)",
         names[GRPOScriptArguments]),
        ("model keys (TRL's ModelConfig)", names[TRLModelConfig]),
        ("GRPO keys (TRL's GRPOConfig; what each means under ictrl: docs/trl-contract.md)",
         [n for n in names[GRPOConfig] if n not in names[TrainingArguments]]),
        ("training keys (transformers' TrainingArguments, through GRPOConfig)",
         [n for n in names[TrainingArguments] if n in owners()]),
    ]
    out = ["config keys: YAML in the file, or --KEY=VALUE / --KEY VALUE before or after it (dashes or underscores);",
           f"{len(owners())} keys, each with its default, its range or choices where it has them, and the help of the "
           "dataclass that checks it."]
    for title, keys in groups:
        out += ["", f"{title}:"]
        for name in keys:
            f = fields[name]
            default = f"{DEFAULT_SELECTOR!r} under ictrl train when the file sets none (TRL's GRPO); the Python " \
                      f"ICTGRPOConfig's: {_default(f)}" if name == "token_selector" else _default(f)
            choices = f.metadata.get("choices")
            bound = bounds.get(name) or (f"one of {', '.join(map(repr, choices))}" if choices else "")
            out.append(f"  --{name} (default: {default}" + (f"; {bound}" if bound else "") + ")")
            text = " ".join(str(f.metadata.get("help", "")).split())
            if text:
                out += textwrap.wrap(text, width, initial_indent="      ", subsequent_indent="      ",
                                     break_on_hyphens=False)
    return "\n".join(out)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.usage = USAGE
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    flags_help = ("--resume: continue from the last complete checkpoint in output_dir (an error if there is none;\n"
                  "  --resume=auto starts from step 0 then, for a job script that is requeued).\n"
                  f"{ACCEPT_CHANGED_FLAG}: with --resume, continue although the training data, the model's files\n"
                  "  or a local reward module (or one it imports) changed since the run started (refused otherwise;\n"
                  "  run.json records it).\n"
                  "--resume-inexact: resume from a checkpoint without its optimizer, scheduler or RNG state\n"
                  "  (save_only_model, or lost files), or over changed inputs as above (refused otherwise), saying\n"
                  "  what will differ.\n"
                  "--resume-new-schedule: resume with max_steps / num_train_epochs changed under a decaying\n"
                  "  learning-rate schedule (refused otherwise): after the first resumed step, which keeps the old\n"
                  "  schedule's rate, the steps follow the schedule over the new length; the rates are said.\n"
                  "--print-config: print the resolved config and exit. More on keys: configs/README.md.\n"
                  f"{OVERWRITE_FLAG}: start a fresh run in an output_dir that holds an earlier run's model or record\n"
                  "  (refused otherwise; its checkpoints are still refused: --resume continues them).\n"
                  f"{NO_OP_FLAG}: run although learning_rate is 0 (rollouts and rewards, no weight changes).\n"
                  "--num-processes N: check the config, then start N processes through accelerate's launcher "
                  "(data parallel;\n  on CPU, gloo). --accelerate-config FILE: accelerate's config "
                  "(configs/accelerate/{ddp,fsdp2,zero2,zero3}.yaml);\n  its num_processes unless --num-processes "
                  "is given. --main-process-port PORT: the rendezvous port (default 29500).")
    parser.add_argument("argv", nargs=argparse.REMAINDER, metavar="ARGS",
                        help="the config file and overrides (before or after it), e.g. configs/qwen2.5-1.5b/ict.yaml "
                             "--learning_rate=2e-6")
    help_only = parser.parse_args

    def parse_args(args: list[str] | None = None, namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        # Overrides are open-ended (any trainer field): parse_argv reads the whole line, -h included, in one pass.
        parsed = parse_argv(list(sys.argv[1:] if args is None else args))
        if parsed.help:
            parser.epilog = flags_help + "\n\n" + config_keys_help()
            return help_only(["--help"])
        return argparse.Namespace(train=parsed)

    parser.parse_args = parse_args  # type: ignore[method-assign]


LAUNCH_ARGV_ENV = "ICTRL_LAUNCH_ARGV"  # `ictrl train --num-processes`'s arguments, for the processes it starts
HELP = ("-h", "--help")
MAX_FLAG_CHARS = 1 << 16  # a flag's value; a longer one belongs in the config file


class UsageError(ValueError):
    pass


def _launch_flag(arg: str) -> str | None:
    """The launch field a ``--num-processes`` style argument sets (dashes or underscores), else None."""
    if not arg.startswith("--"):
        return None
    key = arg[2:].partition("=")[0].replace("-", "_")
    return key if key in LAUNCH_FLAGS else None


@dataclass
class TrainArgs:
    """The command line after ``ictrl train``, read in one pass."""

    config: str
    overrides: list[str]
    flags: set[str]
    launch: Launch
    child_argv: list[str]  # everything but the launch flags: what each process a launch starts is given
    argv: list[str] = field(default_factory=list)  # the line as given: the command a model card and a resume name
    help: bool = False  # -h / --help anywhere: the help, whatever else the line holds
    problem: str | None = None  # the line's first mistake (a UsageError's message); None when it has none


def _config_file(arg: str) -> bool:
    """``arg`` names a config file (a YAML name or a file that exists), not a flag's value."""
    return arg.endswith((".yaml", ".yml")) or os.path.isfile(arg)


def _too_long(arg: str) -> str | None:
    """The mistake of an override whose value is longer than :data:`MAX_FLAG_CHARS`, else None."""
    key, eq, value = arg.partition("=")
    size = len(value if eq else arg)
    if size <= MAX_FLAG_CHARS:
        return None
    return (f"override {shorten(key, 100)}: a value of {size} characters, more than {MAX_FLAG_CHARS}; put long "
            "values in the config file")


def parse_argv(argv: list[str]) -> TrainArgs:
    """The one reading of ``ictrl train``'s arguments: the config file (positional or ``--config``), the
    ``--KEY=VALUE`` overrides (each value at most :data:`MAX_FLAG_CHARS` characters; TRL's parser reads them
    later), ictrl's flags, the launch flags (:class:`ictrl.train_cli.launch.Launch`) and ``-h`` / ``--help``. A flag
    without its value, a bad launch value, a second config file or none is the ``problem`` it returns (the first),
    which help, asked anywhere on the line, overrides."""
    config: str | None = None
    overrides: list[str] = []
    flags: set[str] = set()
    launch = Launch()
    child_argv: list[str] = []
    problems: list[str] = []
    wants_help = False
    args = iter(argv)
    takes_value = False  # the argument before was a bare --KEY, whose value this one may be
    for arg in args:
        wants_help |= arg in HELP
        flag, eq, value = arg.partition("=")
        field = _launch_flag(arg)
        if field is not None or flag == "--config":
            if not eq:
                value = next(args, "")
                wants_help |= value in HELP
                if not value or (field is not None and value.startswith("--")):
                    problems.append(f"{flag} needs a value" if field is not None else "--config needs a file")
                    continue
            if field is not None:
                try:
                    launch.set(field, value)
                except LaunchError as exc:
                    problems.append(str(exc))
                continue
            if config is not None:
                problems.append(f"two config files: {config} and {value}")
            config = value
            child_argv += [arg] if eq else [arg, value]
            continue
        child_argv.append(arg)
        if arg in FLAGS:
            flags.add(arg)
        elif not arg.startswith("--") and config is None and (not takes_value or _config_file(arg)):
            config = arg  # before or after the overrides, as trl grpo takes --config
        else:
            if too_long := _too_long(arg):
                problems.append(too_long)
            overrides.append(arg)
        takes_value = arg.startswith("--") and not eq and arg not in FLAGS
    if config is None:
        problems.append(f"no config file; usage: {USAGE}")
    return TrainArgs(config or "", overrides, flags, launch, child_argv, list(argv), help=wants_help,
                     problem=problems[0] if problems else None)


def run(args: argparse.Namespace) -> int:
    from ictrl.train_cli.run_config import config_record, load_config
    from ictrl.train_cli.run_guard import die_with_launcher

    die_with_launcher()  # a rank of `accelerate launch` / torchrun ends with it, not training on detached
    _setup_logging()
    parsed: TrainArgs = args.train
    config, flags, launch = parsed.config, parsed.flags, parsed.launch
    try:
        if parsed.problem is not None:
            raise UsageError(parsed.problem)
        cfg = load_config(config, parsed.overrides)
        cfg.modes = frozenset(flags & {*MODE_FLAGS, *RESUME_FLAGS})
        from ictrl.train_cli.trainer_inputs import build_trainer_inputs
        from ictrl.train_cli.process_group import process_group_left
        from ictrl.train_cli.run import train

        set_by_flag = cfg.flags
        if launch.requested() and "--print-config" not in flags:
            from ictrl.train_cli.launch import check_and_launch

            # the processes' Ctrl-C line names the command that resumes the launch, its launch flags included
            os.environ[LAUNCH_ARGV_ENV] = shlex.join(parsed.argv)
            try:
                return check_and_launch(cfg, launch, parsed.child_argv, _resume(flags), config, set_by_flag)
            finally:
                del os.environ[LAUNCH_ARGV_ENV]
        # Building the trainer arguments joins the launcher's process group; every exit leaves it.
        with process_group_left():
            if "--print-config" in flags:
                # every value checked before it is shown, for the processes the run will have
                checked = build_trainer_inputs(cfg, config, set_by_flag, values_only=True,
                                               processes=launch.total_processes() if launch.requested() else None)
                # less its secrets, as config.yaml is: a printed file is kept and shared as one
                sys.stdout.write(yaml.safe_dump(config_record(cfg), sort_keys=False))
                sys.stdout.write(_method_comment(cfg, checked.args))
                return 0

            launched = shlex.split(os.environ.get(LAUNCH_ARGV_ENV, "")) or parsed.argv
            again = ["ictrl", "train", *[a for a in launched if not a.startswith("--resume")
                                         and a not in (ACCEPT_CHANGED_FLAG, OVERWRITE_FLAG)], "--resume"]
            # every line ictrl prints or writes of the command hides its secrets (--hub_token=<redacted>)
            resume_command = redact_command(shlex.join(again))
            result = train(cfg, resume=_resume(flags), source=config, resume_command=resume_command,
                           flags=set_by_flag, accept_changed_inputs=ACCEPT_CHANGED_FLAG in flags,
                           command=redact_command(shlex.join(["ictrl", "train", *launched])))
    except (UsageError, LaunchError) as exc:  # a ConfigError (a UserError) goes to ictrl.cli: one line, --debug
        print(f"ictrl train: error: {exc}", file=sys.stderr)
        return 2
    logging.getLogger("ictrl.train").info("finished at step %d; model in %s", result.global_step, result.final_model)
    return 0


def _method_comment(cfg: Any, trainer_args: Any) -> str:
    """The resolved method as YAML comments after ``--print-config``'s keys: shown, and the printed file still
    loads as the same config."""
    import json

    from ictrl.core.selection import selector_identity
    from ictrl.engine.model_card import resolved_method

    method = resolved_method(trainer_args)
    identity = selector_identity(trainer_args.selector, trainer_args.selector_options)  # file, hash, options
    where = {"file": "the file", "flag": "a flag", "default": "the default, as the file sets none: TRL's GRPO"}
    lines = [f"# resolved method (token_selector from {where[cfg.method_from]}):",
             *(f"#   {key}: {'null' if value is None else value}" for key, value in method.items()),
             f"# selector (as run.json records it): {json.dumps(identity, default=str)}"]
    return "\n".join(lines) + "\n"


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
