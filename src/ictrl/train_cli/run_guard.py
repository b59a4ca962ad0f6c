"""One writer per output directory, and no rank outliving its launcher.

:class:`RunLock` holds :class:`ictrl.dirlock.OutputLock` on ``output_dir`` for the run: a second writer (a
``--resume`` while the first run still goes, two runs given one directory) finds it held and stops with one line
naming the holder's pid; a lock left by a killed run is taken, saying whose it was.

Under several processes only the main process (global rank 0) takes the lock: a flock excludes every other open
of the file, the ranks of the same run included, and rank 0 is the process whose lifetime is the run's. Its
verdict is broadcast before any rank touches the directory, so every rank of a refused run stops with the same
line.

:func:`die_with_launcher` ties a rank to the process that started it: ``accelerate launch`` (one process) and the
torch elastic agent (``accelerate launch --multi_gpu``, ``torchrun``; accelerate runs the agent inside the launcher
process) start ranks as direct children, in sessions of their own, so neither ``kill -9`` of the launcher nor a
signal to its process group reaches them.

:func:`run_failure` turns what ends a training loop that is the run's own end (divergence, a selector's
``sys.exit``) into one line with the last checkpoint. What ``output_dir`` may hold and replace is
:mod:`ictrl.train_cli.output_dir`'s.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from types import TracebackType
from typing import Any

from ictrl.checkpoints import OVERWRITE_FLAG
from ictrl.dirlock import OutputLock
from ictrl.errors import ConfigError, UserError, shorten

log = logging.getLogger("ictrl.train")


class RunLock:
    """:class:`ictrl.dirlock.OutputLock` taken by the main process of a (possibly multi-process) run, its outcome
    shared over the launcher's process group, which the run joined when it built its trainer arguments
    (``TrainingArguments.__post_init__`` sets up its device, as the trainer does: backend, timeout)."""

    def __init__(self, out: str | os.PathLike[str]) -> None:
        self.lock = OutputLock(out)

    def __enter__(self) -> RunLock:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world == 1:
            self.lock.acquire()
            return self
        from accelerate.utils import broadcast_object_list

        error = None
        if int(os.environ.get("RANK", "0")) == 0:
            try:
                self.lock.acquire()
            except UserError as exc:  # a held lock, or a disk with no room for it
                error = str(exc)
        error = broadcast_object_list([error], from_process=0)[0]
        if error:
            raise ConfigError(error)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.lock.release()


def _launched_by_accelerate(parent: int) -> bool:
    try:
        argv = Path(f"/proc/{parent}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(a.endswith(b"accelerate") or a == b"accelerate.commands.launch" for a in argv[:3]) and (
        b"launch" in argv[:4] or b"accelerate.commands.launch" in argv[:3])


def die_with_launcher() -> bool:
    """Under a launcher (torch elastic's ``TORCHELASTIC_RUN_ID``, or a parent that is ``accelerate launch``), end
    this process when the launcher ends: :func:`ictrl.rewards.worker.die_with_parent`. Returns whether it armed.
    A process started any other way (a shell, ``nohup``) is left alone."""
    parent = os.getppid()
    if "TORCHELASTIC_RUN_ID" not in os.environ and not _launched_by_accelerate(parent):
        return False
    from ictrl.rewards.worker import die_with_parent

    die_with_parent(parent)
    return True


class StopRequest:
    """SIGTERM during ``ictrl train`` (``with StopRequest() as stop:``). While the training loop runs it is a request
    (``received``) that :class:`ictrl.train_cli.callbacks.StopOnRequest` honours at the end of TRL's generation batch,
    with a checkpoint; later SIGTERMs add nothing (a launcher forwards the scheduler's, and the scheduler's SIGKILL
    ends the wait). Outside the loop (checks and loading before it, the final save after it) nothing new is left to
    save and it raises :class:`ictrl.errors.Terminated` at once."""

    def __init__(self) -> None:
        self.received = False
        self.training = False
        self.before_training = False  # raised Terminated outside the training loop
        self._previous: Any = None
        self.reward_policy: Any = None  # the trainer's RewardPolicy, set by add_stop_callback
        self._reward_since: float | None = None

    def __enter__(self) -> StopRequest:
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)
        return self

    def reinstall(self) -> None:
        """Take SIGTERM back from a handler installed since (transformers' JIT checkpoint installs its own)."""
        import signal

        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._handle)

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        import signal

        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None

    def _handle(self, signum: int, frame: object) -> None:
        import time

        from ictrl.errors import Terminated

        if not self.training:
            self.before_training = True
            raise Terminated("terminated (SIGTERM)")
        policy = self.reward_policy
        if self.received and policy is not None and policy.calling and self._reward_since is not None \
                and time.monotonic() - self._reward_since >= self.reward_grace_s():
            raise policy.abandon()  # the reward call outlived its grace: the run stops without it
        if not self.received:
            self.received = True
            log.warning("SIGTERM: stopping at the end of this generation batch, with a checkpoint")
            if policy is not None and policy.calling:  # a reward call on this thread: give it a grace, then stop
                self._reward_since = time.monotonic()
                self._wake_after(self.reward_grace_s())

    @staticmethod
    def reward_grace_s() -> float:
        from ictrl.engine.reward_policy import SIGTERM_GRACE_S

        return SIGTERM_GRACE_S

    def _wake_after(self, seconds: float) -> None:
        """SIGTERM to this (main) thread after ``seconds``: the handler then finds whether the reward call ended."""
        import signal
        import threading

        main = threading.main_thread().ident
        timer = threading.Timer(seconds + 0.05,
                                lambda: signal.pthread_kill(main, signal.SIGTERM))  # type: ignore[arg-type]
        timer.daemon = True
        timer.start()


def add_stop_callback(trainer: Any, stop: StopRequest, out: Path) -> None:
    """Honour ``stop`` in ``trainer``'s loop (:class:`ictrl.train_cli.callbacks.StopOnRequest`). ictrl's stop is what
    transformers' ``enable_jit_checkpoint`` asks for, made exact: its own callback, which saves wherever the
    signal finds the run (inside a generation batch), is not installed."""
    from transformers.trainer_jit_checkpoint import JITCheckpointCallback

    from ictrl.train_cli.callbacks import StopOnRequest
    from ictrl.engine.resumable import at_buffer_boundary

    trainer.remove_callback(JITCheckpointCallback)
    stop.reinstall()
    policy = getattr(trainer, "reward_policy", None)
    if policy is not None:  # a reward call on a deadline thread ends within its grace after SIGTERM
        stop.reward_policy = policy
        policy.stop_requested = lambda: stop.received

    def save() -> None:
        step = trainer.state.global_step
        if step > 0 and not (out / f"checkpoint-{step}" / "trainer_state.json").is_file():
            trainer._save_checkpoint(trainer.model, None)

    trainer.add_callback(StopOnRequest(stop, lambda step: at_buffer_boundary(step, trainer.args), save,
                                       trainer.args.device))


def stopped(out: Path, step: int | None, resume_command: str | None, kind: type | None = None,
            what: str | None = None) -> Exception:
    """The one-line :class:`ictrl.errors.Interrupted` (Ctrl-C) or ``kind`` (:class:`ictrl.errors.Terminated`) of a
    run stopped at ``step`` (None: outside the training loop): the last complete checkpoint and the command that
    continues from it (``--resume`` redoes the steps after that checkpoint exactly)."""
    from ictrl.checkpoints import complete_checkpoints
    from ictrl.errors import Interrupted, Terminated

    kind = kind or Interrupted
    checkpoints = complete_checkpoints(out)
    what = what or ("terminated (SIGTERM)" if kind is Terminated else "interrupted")
    at = f" at step {step}" if step is not None else ""
    kept = f"last complete checkpoint {checkpoints[-1]}" if checkpoints else "no checkpoint yet (save_steps)"
    again = f"; resume with `{resume_command}`" if resume_command and checkpoints else ""
    return kind(f"{what}{at}; {kept}{again}")


# --- the flags of a run that would otherwise be refused ----------------------------------------------------------

NO_OP_FLAG = "--allow-no-op"  # a run that changes no weight (learning_rate 0), asked for by name
MODE_FLAGS = (OVERWRITE_FLAG, NO_OP_FLAG)

# --- what ends a training loop -------------------------------------------------------------------------------------

# The checks that find non-finite numbers in the model's outputs (ictrl.core.loss, core.stats_checks, the selection
# inputs) and the sampler's own (torch.multinomial in transformers' generate): each is the weights gone non-finite.
DIVERGED = re.compile(r"^(?:(?:old_|ref_|sampler_|behaviour_)?logprobs|logits\b.*?) is not finite"
                      r"|^(?:ict_score|entropy|prob) holds NaN"
                      r"|probability tensor contains either `inf`, `nan` or element < 0")


def run_failure(exc: BaseException, out: Path, step: int, resume_command: str | None, learning_rate: float) -> \
        UserError | None:
    """The one line for ``exc``, which ended the training loop after ``step`` optimizer steps, when it is the run's
    own end rather than a bug: training diverged (:data:`DIVERGED`), or a selection rule failed (it raised, ended
    the process or returned no mask: ``core.selection.SelectorError``). None for anything else, which keeps its
    traceback."""
    from ictrl.checkpoints import complete_checkpoints
    from ictrl.core.selection import SelectorError

    message = str(exc).strip().split("\n")[0]
    if isinstance(exc, SelectorError):
        return UserError(f"{message}; {stopped(out, step, resume_command, what='stopped')}")
    if isinstance(exc, (ValueError, RuntimeError)) and DIVERGED.search(message):
        kept = stopped(out, step, None, what="stopped")
        # a resume is exact and keeps learning_rate (train_cli.exact_resume.check_unchanged): it would diverge again
        again = f" (`{resume_command}` would repeat the same steps: a resume keeps learning_rate)" \
            if resume_command and complete_checkpoints(out) else ""
        return UserError(f"training diverged: loss/log-probs not finite at step {step + 1} ({shorten(message, 200)}): "
                         f"lower learning_rate (now {learning_rate:g}) and start again in another output_dir; "
                         f"{kept}{again}")
    return None


def note_short_run(step: int, max_steps: int, out: Path) -> None:
    """A training loop that returned before ``max_steps`` without an error (a callback asked it to stop) says so:
    the model saved is that step's."""
    if 0 < max_steps and step < max_steps:
        log.warning("training ended at step %d of max_steps %d (a callback stopped it); %s holds the model of step "
                    "%d", step, max_steps, out, step)
