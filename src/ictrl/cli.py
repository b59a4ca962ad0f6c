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
``accelerate launch`` only rank 0 prints these lines, and every rank ends without interpreter finalisation once it has
left its process group (``exit_launched``). ``--verbose`` keeps the libraries' bars and notes (``quiet``).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import errno
import importlib
import io
import logging
import mmap
import os
import signal
import sys
import traceback
import warnings
from collections.abc import Sequence
from typing import NoReturn

from ictrl.cliargs import DEBUG_ENV, PATH_OPTIONS, VERBOSE_ENV, env_flag, expand_path
from ictrl.errors import Interrupted, Terminated, UserError, interrupts_once, note_reported, one_line

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
    "tiny-model": ("ictrl.experiments.tasks.tinymodel", "write the embedded tiny model (or a random Qwen2.5-shaped "
                   "one, --shape) and a tiny-task train.jsonl to a directory"),
}

# What each command's memory grows with: named when it runs out (a host MemoryError or an accelerator's).
LOWER: dict[str, str] = {
    "train": "per_device_train_batch_size (raise gradient_accumulation_steps to keep the batch), "
             "max_completion_length or num_generations, or use a machine with more memory",
    "eval": "--batch-size, --chunk-size or --max-new-tokens",
    "demo": "--threads, or close other programs",
    "compare": "the methods' batch (per_device_train_batch_size) or max_completion_length",
    "inspect": "--num-generations or --max-new-tokens",
    "regime": "--num-generations, --num-prompts or --max-new-tokens",
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


def rank() -> int:
    """This process's rank under ``accelerate launch`` / ``torchrun`` (0 outside one)."""
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def _not_cpu_accelerator_note(record: logging.LogRecord) -> bool:
    return "Setting accelerator to CPU" not in record.getMessage()


def _not_accumulation_note(record: logging.LogRecord) -> bool:
    # Under DeepSpeed the Trainer accumulates through DeepSpeed's engine, whose count it fills from the trainer's
    # gradient_accumulation_steps; accelerate's own plugin keeps 1 and calls the difference a mismatch. The ZeRO
    # launch test matches a DDP run's metrics and weights, so the note warns of nothing.
    return "Gradient accumulation steps mismatch" not in record.getMessage()


def quiet() -> None:
    """The libraries' noise off (``--verbose`` keeps it): the weight loading / shard writing bars of transformers
    and huggingface_hub (read from the environment when they are first imported), and DeepSpeed's "Setting
    accelerator to CPU" warning, which it logs whenever it is imported on a machine without a GPU (accelerate
    imports it, when installed, on a run's first save: ``extract_model_from_parallel``), accelerate's note on
    the gradient accumulation count under DeepSpeed, the deprecation warnings of ZeRO's collectives, and vLLM's
    info and warning lines (its logger is configured when TRL imports it)."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    logging.getLogger("vllm").setLevel(logging.ERROR)
    logging.getLogger("DeepSpeed").addFilter(_not_cpu_accelerator_note)
    logging.getLogger("accelerate.accelerator").addFilter(_not_accumulation_note)
    # DeepSpeed's ZeRO calls torch collectives that torch has deprecated (all_gather_into_tensor,
    # reduce_scatter_tensor): a warning per process and per call site, nothing for the user to change
    warnings.filterwarnings("ignore", message=r"`torch\.distributed\.\w+` is deprecated", category=FutureWarning)


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
    # `module:function` names (selectors, rewards) import from the working directory, as under `python -m`: the
    # console script puts only its own directory on the path. Last, so an installed package wins over a local file.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())
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
        for dest in PATH_OPTIONS & vars(args).keys():  # ~ and $VAR in a path option, as in a config's paths
            value = getattr(args, dest)
            if isinstance(value, (str, os.PathLike)):
                expanded = expand_path(os.fspath(value), f"--{dest.replace('_', '-')}")
                setattr(args, dest, type(value)(expanded) if not isinstance(value, str) else expanded)
        with interrupts_once():  # a second Ctrl-C while the first one's shutdown runs is absorbed
            return int(module.run(args) or 0)
    except UserError as err:
        if debug:
            raise
        if rank() == 0:  # every process of a launch hits the same config error: one line, from rank 0
            print(f"ictrl {name}: error: {one_line(err)}", file=sys.stderr)
            note_reported(2)
        return 2
    except (MemoryError, RuntimeError, ImportError, OSError) as err:
        release_reserve()  # the command has ended either way; telling out-of-memory apart allocates too
        if debug or not out_of_memory(err):
            raise
        return report_out_of_memory(name, err)
    except (Interrupted, KeyboardInterrupt) as err:
        if debug:
            raise
        what = one_line(err) if isinstance(err, Interrupted) else "interrupted"
        status = err.status if isinstance(err, Interrupted) else 130
        if rank() == 0:
            print(f"\nictrl {name}: {what}", file=sys.stderr)
            note_reported(status)
        return status


# The commands that ran out of memory in this process: their exit handlers may run out again (torch's import a
# module at exit), and :func:`entry` keeps that second traceback off the console.
MEMORY_SPENT: list[str] = []

# Address space the process entry maps (never touched, so no resident memory) and unmaps when a command runs out of
# memory: under a cap (ulimit -v) the import that failed left nothing free, and the one line saying so (tracebacks
# walked, a string formatted) and the exit handlers after it must still allocate.
RESERVE_BYTES = 16 << 20
_RESERVE: list[mmap.mmap] = []


def prepare_out_of_memory() -> None:
    """Map :data:`RESERVE_BYTES` for :func:`release_reserve` to hand back; a cap too low for even that is left
    to the command, which then fails where it would have. Also keeps the MemoryErrors Python cannot raise (a
    generator or finaliser running out while the failed import unwinds) off the console: the command's own line
    says it ran out."""
    with contextlib.suppress(OSError, MemoryError, ValueError):
        _RESERVE.append(mmap.mmap(-1, RESERVE_BYTES))
    shown = sys.unraisablehook

    def unraisable(info: sys.UnraisableHookArgs) -> None:
        if not isinstance(info.exc_value, MemoryError):
            shown(info)

    sys.unraisablehook = unraisable


def release_reserve() -> None:
    while _RESERVE:
        _RESERVE.pop().close()


# CPython's SystemError words when C code fails without setting an exception: under a memory cap (ulimit -v), an
# allocation inside the import machinery or an extension module failing, which a lazy import then wraps.
_FAILED_ALLOCATION = "returned NULL without setting an exception"
_FAILED_ALLOCATION_RETURN = "error return without exception set"


def out_of_memory(err: BaseException) -> bool:
    """A host ``MemoryError`` or an accelerator's out-of-memory error (``torch.OutOfMemoryError``, a RuntimeError,
    named by class so this needs no torch import), also as the cause of another error (a lazy import's
    RuntimeError wraps the MemoryError it met)."""
    seen: BaseException | None = err
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, MemoryError) or type(seen).__name__ == "OutOfMemoryError" \
                or str(seen).startswith(("CUDA out of memory", "MPS backend out of memory")) \
                or isinstance(seen, (OSError, ImportError)) and "failed to map segment" in str(seen) \
                or isinstance(seen, OSError) and seen.errno == errno.ENOMEM \
                or _FAILED_ALLOCATION in str(seen) or _FAILED_ALLOCATION_RETURN in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def memory_line(name: str, err: BaseException) -> str:
    """One line for running out of memory: where (the module being imported, when an import ran out), and what
    the command can lower. A memory cap (``ulimit -v``, a scheduler's limit) hit while importing torch is a cap
    too low for ictrl at all."""
    chain, seen = [], err
    while seen is not None and len(chain) < 8:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    frames = [f for e in chain for f in traceback.extract_tb(e.__traceback__)]
    if any(f.filename.startswith("<frozen importlib") for f in frames):
        module = next((f.filename for f in reversed(frames) if not f.filename.startswith("<frozen")), "?")
        return (f"out of memory while importing the libraries ({module}): the process's memory limit (ulimit -v, "
                "the job's memory request) is below what torch and transformers need to load; raise it")
    device = "" if isinstance(err, (MemoryError, OSError)) else " on the accelerator"  # OSError: a host ENOMEM
    return f"out of memory{device} ({type(err).__name__}: {one_line(err)[:120]}); lower {LOWER.get(name, 'the batch')}"


def report_out_of_memory(name: str, err: BaseException) -> int:
    """Print the command's one out-of-memory line (rank 0) and return its exit status."""
    MEMORY_SPENT.append(name)
    if rank() == 0:
        try:
            line = memory_line(name, err)
        except (MemoryError, SystemError):  # the cap still bites: the line without the module's name
            line = f"out of memory ({type(err).__name__}); lower {LOWER.get(name, 'the batch')}"
        print(f"ictrl {name}: error: {line}", file=sys.stderr)
        note_reported(2)
    return 2


def launched() -> bool:
    """Whether this process is a rank of a multi-process launch (``WORLD_SIZE`` > 1, as ``accelerate launch`` and
    ``torchrun`` set it) or holds an initialised torch.distributed process group."""
    with contextlib.suppress(ValueError):
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            return True
    dist = sys.modules.get("torch.distributed")
    return dist is not None and dist.is_available() and dist.is_initialized()


def exit_launched(code: object) -> NoReturn:
    """End a launched rank without interpreter finalisation, after it has left its process group.

    A rank that finalises normally can still abort after its work is saved ("terminate called without an active
    exception"): FSDP2, DeepSpeed and gloo keep native threads that may need the GIL while the interpreter tears
    down, and a thread stopped there ends in ``std::terminate``. The atexit handlers still run, first, while the
    interpreter is whole: they flush and close the logging handlers, finish trackers (wandb finishes its run from
    atexit) and stop the grader workers. ``code`` as ``SystemExit``'s (None is 0, anything but an int is printed and
    is 1).
    """
    if "torch.distributed" in sys.modules:
        from ictrl.train_cli.process_group import leave_process_group

        leave_process_group(wait=False)  # a no-op after `ictrl train`, which leaves the group on every path
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(0 if code is None else code)


def entry() -> NoReturn:
    """The process entry (``ictrl``, ``python -m ictrl``, ``python -m ictrl.cli``): :func:`main`, then exit with its
    status. A launched rank exits through :func:`exit_launched`; an unexpected error there prints its traceback
    first and exits 1 (130 for Ctrl-C), as the interpreter would. Library and in-process callers use :func:`main`,
    which returns."""
    code: object
    prepare_out_of_memory()
    try:
        code = main()
    except SystemExit as exc:
        code = exc.code
    except BaseException as exc:
        if not launched():
            raise
        traceback.print_exc()
        code = 130 if isinstance(exc, KeyboardInterrupt) else 1
    if MEMORY_SPENT and not launched():  # the exit handlers run with what memory is left: their failures unshown
        with contextlib.redirect_stderr(io.StringIO()):
            atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code if isinstance(code, int) else 1)
    if code in (Interrupted.status, Terminated.status):  # stopping already: a Ctrl-C now would only add a traceback
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    if launched():
        exit_launched(code)
    raise SystemExit(code)


if __name__ == "__main__":
    entry()
