"""``ictrl train CONFIG --num-processes N [--accelerate-config FILE] [--main-process-port PORT]``: the launch
from ictrl's own process, as TRL's ``trl grpo --num_processes N`` does it.

The parent checks the whole config for an ``N``-process run first (``ictrl.train_cli.trainer_inputs``: no model loaded,
no device touched), so a mistake is one line and exit status 2 before any process starts. Then it
calls accelerate's launcher (``accelerate.commands.launch.launch_command``) with ``-m ictrl train`` and the same
arguments minus these flags. A process that fails has already said why (rank 0's one line for an ictrl error, its
own traceback otherwise): the parent exits with that process's status and leaves out torchrun's
``ChildFailedError`` traceback and its log lines (``--debug`` keeps them, ``--verbose`` keeps the log lines).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from ictrl.cliargs import DEBUG_ENV, VERBOSE_ENV, env_flag

# torchrun's loggers: "failed (exitcode: 2) local_rank: 0 ...", "Sending process ... closing signal SIGTERM", the
# OMP_NUM_THREADS note. The failed process has already printed why; ictrl's own line replaces the rest.
LAUNCHER_LOGGERS = ("torch.distributed.elastic", "torch.distributed.run", "torch.distributed.launcher")


class LaunchError(ValueError):
    """A launch flag that cannot be honoured (one line, exit status 2)."""


@dataclasses.dataclass
class Launch:
    """The launch flags of ``ictrl train``, named as the flags: ``num_processes`` is the total over machines, as
    accelerate counts it."""

    num_processes: int | None = None
    accelerate_config: str | None = None
    main_process_port: int | None = None

    def requested(self) -> bool:
        return self.num_processes is not None or self.accelerate_config is not None

    def set(self, key: str, value: str) -> None:
        """One flag's value from the command line (``key`` as spelt in the dataclass); :class:`LaunchError`
        names the flag when the value is bad."""
        flag = "--" + key.replace("_", "-")
        if key == "accelerate_config":
            if not Path(value).is_file():
                raise LaunchError(f"{flag} {value}: file not found")
            self.accelerate_config = value
            return
        try:
            number = int(value)
        except ValueError:
            number = -1
        least = 1 if key == "num_processes" else 0
        if number < least:
            raise LaunchError(f"{flag}: expected a whole number >= {least}, got {value!r}")
        setattr(self, key, number)

    def config_value(self, key: str, default: Any) -> Any:
        """``key`` of the accelerate config file (``default`` without one, or when the file lacks it)."""
        if self.accelerate_config is None:
            return default
        from ictrl.yamlfile import load_yaml

        path = str(self.accelerate_config)
        try:  # not YAML: load_yaml's ConfigError, one line as this LaunchError
            data = load_yaml(Path(path).read_text(), f"--accelerate-config {path}")
        except (OSError, UnicodeDecodeError) as exc:
            raise LaunchError(f"--accelerate-config {path}: cannot read {key}: {str(exc).splitlines()[0]}") from None
        return data.get(key, default) if isinstance(data, dict) else default

    def total_processes(self) -> int:
        """The processes of the run: ``--num-processes``, else the accelerate config's ``num_processes``."""
        if self.num_processes is not None:
            return self.num_processes
        path = str(self.accelerate_config)
        value = self.config_value("num_processes", 1)
        try:
            processes = int(value)
        except (TypeError, ValueError):
            processes = 0
        if processes < 1:
            raise LaunchError(f"--accelerate-config {path}: num_processes: expected a whole number >= 1, got "
                              f"{value!r}; or give --num-processes N")
        return processes


# the launch flags, spelt with dashes or underscores (TRL's spelling) on the command line
FLAGS = tuple(f.name for f in dataclasses.fields(Launch))


def launch_arguments(launch: Launch, child_argv: list[str]) -> list[str]:
    """The ``accelerate launch`` command line (after ``accelerate launch``) that runs ``ictrl train child_argv``.
    Without ``--accelerate-config`` and without a default accelerate config (``accelerate config``), ``N > 1``
    processes are plain data parallel (DDP; gloo on CPU), with accelerate's other defaults spelt out so it does not
    warn about them; the precision is the run config's (``bf16``), which the trainer sets in every process. Without
    CUDA, mixed precision is off whatever the accelerate config says, as the trainer's CPU fallback has it."""
    from accelerate.commands.config import default_config_file

    import torch

    out = ["--num_processes", str(launch.total_processes())]
    no_config = launch.accelerate_config is None and not os.path.isfile(default_config_file)
    if launch.accelerate_config is not None:
        out += ["--config_file", launch.accelerate_config]
    elif no_config:
        out += (["--multi_gpu"] if launch.total_processes() > 1 else []) + ["--num_machines", "1",
                                                                             "--dynamo_backend", "no"]
    if no_config or not torch.cuda.is_available():
        # without CUDA the trainer runs in fp32 (bf16=False); a config's bf16 would reach DeepSpeed's own config,
        # which then disagrees with the trainer's and stops the run after the model loads
        out += ["--mixed_precision", "no"]
    if launch.main_process_port is not None:
        out += ["--main_process_port", str(launch.main_process_port)]
    return [*out, "-m", "ictrl", "train", *child_argv]


def exit_status(code: int) -> int:
    """A process's exit code as a shell reports it: 128 + N for a process killed by signal N."""
    return 128 - code if code < 0 else code


def _failure_line(rank: int, code: int, processes: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        what = f"was killed by {name}" + (" (out of memory?)" if -code == signal.SIGKILL else "")
    else:
        what = f"exited with status {code}"
    return (f"ictrl train: error: process {rank} of {processes} {what}; its output is above (--debug adds the "
            "launcher's traceback)")


def run_launch(launch: Launch, child_argv: list[str]) -> int:
    """Start the processes through accelerate's launcher and wait for them: 0 when every process finished, else
    the exit status of the failure: rank 0's when it printed the run's one line (an ictrl error, Ctrl-C; it says so
    through ``ictrl.errors.REPORTED_FILE_ENV``), else the first failed process's, named in one line here."""
    import tempfile

    from accelerate.commands.launch import launch_command, launch_command_parser

    from ictrl.errors import REPORTED_FILE_ENV

    debug = env_flag(DEBUG_ENV)
    verbose = env_flag(VERBOSE_ENV)
    if not verbose and not debug:
        # their imports set each module logger's own level (torch's elastic get_logger): set ours after them, on
        # every one ("Received 15 death signal" on SIGTERM comes from the agent's)
        import torch.distributed.elastic.agent.server.api  # noqa: F401
        import torch.distributed.elastic.multiprocessing.api  # noqa: F401
        import torch.distributed.run  # noqa: F401

        for name in [*LAUNCHER_LOGGERS, *logging.root.manager.loggerDict]:
            if name.startswith(LAUNCHER_LOGGERS):
                logging.getLogger(name).setLevel(logging.CRITICAL)
    args = launch_command_parser().parse_args(launch_arguments(launch, child_argv))
    with tempfile.TemporaryDirectory(prefix="ictrl-launch-") as tmp:
        reported = Path(tmp) / "reported"
        os.environ[REPORTED_FILE_ENV] = str(reported)  # the processes inherit the environment
        try:
            failed = _launch_and_wait(launch_command, args, debug)
        finally:
            del os.environ[REPORTED_FILE_ENV]
        said = reported.read_text().strip() if reported.is_file() else ""
    if failed is None:
        return 0
    if said.isdigit():
        return int(said)
    rank, code = failed
    print(_failure_line(rank, code, launch.total_processes()) if rank >= 0 else "\nictrl train: interrupted",
          file=sys.stderr)
    return exit_status(code)


def _launch_and_wait(launch_command: Any, args: Any, debug: bool) -> tuple[int, int] | None:
    """Run accelerate's ``launch_command``: None when it succeeded, else (the rank that failed first, its exit
    code; rank -1 for Ctrl-C in this process). ``debug`` lets the launcher's exceptions through."""
    import subprocess

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    try:
        launch_command(args)
    except ValueError as exc:  # accelerate's checks of its config and flags, before it starts anything
        if debug:
            raise
        raise LaunchError(f"accelerate launch: {str(exc).strip().splitlines()[0]}") from None
    except ChildFailedError as err:
        if debug:
            raise
        rank, failure = err.get_first_failure()
        return rank, failure.exitcode
    except subprocess.CalledProcessError as err:  # accelerate's launcher of a single process
        if debug:
            raise
        return 0, err.returncode
    except (SignalException, KeyboardInterrupt):  # Ctrl-C: the processes say where they stopped
        if debug:
            raise
        return -1, 130
    return None


def check_and_launch(cfg: Any, launch: Launch, child_argv: list[str], resume: bool | str, source: str,
                     flags: dict[str, Any]) -> int:
    """``ictrl train ... --num-processes N``: refuse a launch from inside a launched process, check the config
    for ``N`` processes (a ``ConfigError`` / ``DataError`` propagates: one line, exit status 2, nothing started),
    then :func:`run_launch`."""
    from ictrl.train_cli.trainer_inputs import check_before_launch

    if int(os.environ.get("WORLD_SIZE", "1")) > 1 or "LOCAL_RANK" in os.environ:
        raise LaunchError("--num-processes / --accelerate-config: this process was already started by a launcher "
                          "(WORLD_SIZE is set); leave the flags out under `accelerate launch` or torchrun")
    from ictrl.errors import sigterm_raises

    # the checks read every training row and the model's files; a scheduler's SIGTERM meanwhile gets one line
    with sigterm_raises("terminated (SIGTERM) during the checks before the launch; no process was started"):
        check_before_launch(cfg, launch.total_processes(), resume=resume, source=source, flags=flags)
    import torch

    if launch.config_value("distributed_type", None) == "FSDP" and not torch.cuda.is_available():
        logging.getLogger("ictrl.train").warning(
            "%s: accelerate shards with FSDP on GPUs only; these CPU processes run plain data parallel (every "
            "process holds the whole model)", launch.accelerate_config)
    return run_launch(launch, child_argv)
