"""How an ``ictrl`` process ends: its exit status, a command's error, stop or out of memory as one line
(:func:`command_status`), and a launched rank's exit.

:func:`run_then_exit` is the process entry's whole life around the command (``ictrl.cli.main``): it maps
:data:`RESERVE_BYTES` of address space first (:func:`prepare_out_of_memory`), which a command that runs out of memory
hands back (:func:`release_reserve`) so that its one line (:func:`report_out_of_memory`) and the exit handlers can
still allocate, and exits with the command's status. A rank of a multi-process launch leaves its process group and
ends without interpreter finalisation (:func:`exit_launched`).

The process-global hooks installed here (``sys.unraisablehook``, SIGINT ignored while stopping) are in
docs/architecture.md's table of global hooks, with the tests that pin them.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import io
import mmap
import os
import signal
import sys
import traceback
from collections.abc import Callable
from typing import NoReturn

from ictrl.errors import Interrupted, Terminated, UserError, note_reported, one_line

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


def rank() -> int:
    """This process's rank under ``accelerate launch`` / ``torchrun`` (0 outside one)."""
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


# The commands that ran out of memory in this process: their exit handlers may run out again (torch's import a
# module at exit), and :func:`run_then_exit` keeps that second traceback off the console.
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


def _chain(err: BaseException) -> list[BaseException]:
    """``err`` and the errors it was raised from or during (at most 8)."""
    chain: list[BaseException] = []
    seen: BaseException | None = err
    while seen is not None and len(chain) < 8:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    return chain


def _importing(chain: list[BaseException]) -> bool:
    """Whether an error of ``chain`` was raised while a module was being imported: the import system's frames, or
    a module's top-level code below the frame that caught it (the import system drops its own frames from the
    traceback of an error a module's body raises)."""
    return any(f.filename.startswith("<frozen importlib") or (i > 0 and f.name == "<module>")
               for e in chain for i, f in enumerate(traceback.extract_tb(e.__traceback__)))


# How close to an address-space cap the process's peak must have come for a failed import to count as the cap's:
# the allocation that failed is not known, only that the peak plus it passed the cap.
CAP_MARGIN_BYTES = 128 << 20


def peak_near_cap(margin: int = CAP_MARGIN_BYTES) -> bool:
    """Whether this process runs under an address-space cap (``ulimit -v``) and its peak address space
    (``VmPeak``) came within ``margin`` of it (False where either is unknown)."""
    try:
        import resource

        cap = resource.getrlimit(resource.RLIMIT_AS)[0]
        if cap == resource.RLIM_INFINITY:
            return False
        with open("/proc/self/status", encoding="ascii") as status:
            peak = next((int(line.split()[1]) << 10 for line in status if line.startswith("VmPeak:")), None)
    except (ImportError, OSError, ValueError, IndexError):
        return False
    return peak is not None and peak >= cap - margin


def _memory_error(seen: BaseException) -> bool:
    """One error, not its chain: the ways running out of memory shows itself."""
    return isinstance(seen, MemoryError) or type(seen).__name__ == "OutOfMemoryError" \
        or str(seen).startswith(("CUDA out of memory", "MPS backend out of memory")) \
        or isinstance(seen, (OSError, ImportError)) and "failed to map segment" in str(seen) \
        or isinstance(seen, OSError) and seen.errno == errno.ENOMEM \
        or _FAILED_ALLOCATION in str(seen) or _FAILED_ALLOCATION_RETURN in str(seen)


def out_of_memory(err: BaseException) -> bool:
    """A host ``MemoryError`` or an accelerator's out-of-memory error (``torch.OutOfMemoryError``, a RuntimeError,
    named by class so this needs no torch import), also as the cause of another error (a lazy import's
    RuntimeError wraps the MemoryError it met). Also an import that failed with its address space at a cap
    (:func:`peak_near_cap`): a library can swallow the allocation's own error (linecache reads a failed ``open``
    as a missing source, which a JIT decorator then reports as not being in a Python file)."""
    chain = _chain(err)
    if any(_memory_error(seen) for seen in chain):
        return True
    return _importing(chain) and peak_near_cap()


def memory_line(name: str, err: BaseException) -> str:
    """One line for running out of memory: where (the module being imported, when an import ran out), and what
    the command can lower. A memory cap (``ulimit -v``, a scheduler's limit) hit while importing torch is a cap
    too low for ictrl at all."""
    chain = _chain(err)
    frames = [f for e in chain for f in traceback.extract_tb(e.__traceback__)]
    if _importing(chain):
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


# What ends a command with its one line rather than a traceback (unless --debug): a user's mistake, running out of
# memory (an accelerator's is a RuntimeError, a failed map an OSError or ImportError), Ctrl-C and SIGTERM.
ENDINGS = (UserError, MemoryError, RuntimeError, ImportError, OSError, Interrupted, KeyboardInterrupt)


def command_status(name: str, err: BaseException, debug: bool) -> int | None:
    """The exit status of ``ictrl NAME`` ended by ``err`` (one of :data:`ENDINGS`), its one line printed (rank 0
    only: every process of a launch meets the same error); None when ``err`` keeps its traceback (``debug``, or not
    a user's mistake, out of memory or a stop). A :class:`UserError` is ``ictrl NAME: error: MESSAGE``, status 2;
    out of memory is :func:`report_out_of_memory`'s line, the reserve handed back first; Ctrl-C / SIGTERM say
    what was kept, status 130 / 143."""
    if isinstance(err, UserError):
        if debug:
            return None
        if rank() == 0:
            print(f"ictrl {name}: error: {one_line(err)}", file=sys.stderr)
            note_reported(2)
        return 2
    if isinstance(err, (MemoryError, RuntimeError, ImportError, OSError)):
        release_reserve()  # the command has ended either way; telling out-of-memory apart allocates too
        if debug or not out_of_memory(err):
            return None
        return report_out_of_memory(name, err)
    if debug:
        return None
    what = one_line(err) if isinstance(err, Interrupted) else "interrupted"
    status = err.status if isinstance(err, Interrupted) else 130
    if rank() == 0:
        print(f"\nictrl {name}: {what}", file=sys.stderr)
        note_reported(status)
    return status


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


def run_then_exit(command: Callable[[], int]) -> NoReturn:
    """Run ``command`` (the process entry's ``ictrl.cli.main``) and exit with its status. A launched rank exits
    through :func:`exit_launched`; an unexpected error there prints its traceback first and exits 1 (130 for
    Ctrl-C), as the interpreter would."""
    code: object
    prepare_out_of_memory()
    try:
        code = command()
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
