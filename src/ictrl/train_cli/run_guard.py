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

What ``output_dir`` may not replace (:func:`check_not_an_input`: the model directory, a data file, the config file
or a reward module the run reads; :func:`check_no_previous_run`: an earlier run's model or record, unless
``--overwrite``) is checked before any model loads. :func:`run_failure` turns what ends a training loop that is the
run's own end (divergence, a selector's ``sys.exit``) into one line with the last checkpoint.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from types import TracebackType
from typing import Any

from ictrl.checkpoints import (CHECKPOINT_RE, LAST_FILES, MANIFEST, OVERWRITE_FLAG, RUN_FILES, STAGING_PREFIX,
                               foreign_checkpoints)
from ictrl.dirlock import LOCK_NAME, OutputLock
from ictrl.errors import ConfigError, UserError, shorten
from ictrl.files import OWNED_FILE, check_own_files

log = logging.getLogger("ictrl.train")

class RunLock:
    """:class:`ictrl.dirlock.OutputLock` taken by the main process of a (possibly multi-process) run, its outcome
    shared."""

    def __init__(self, out: str | os.PathLike[str], args: Any) -> None:
        self.lock = OutputLock(out)
        self.args = args

    def __enter__(self) -> RunLock:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world == 1:
            self.lock.acquire()
            return self
        from accelerate.utils import broadcast_object_list

        _ = self.args.device  # the process group, set up as the trainer sets it up (backend, timeout)
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


# --- what output_dir must not replace ------------------------------------------------------------------------------

NO_OP_FLAG = "--allow-no-op"  # a run that changes no weight (learning_rate 0), asked for by name
MODE_FLAGS = (OVERWRITE_FLAG, NO_OP_FLAG)

# Names at the top of output_dir a run writes (its record, the final model's save, the lock), besides the
# checkpoint-N and staging folders it writes, rotates and clears.
_RUN_WRITES = frozenset({*RUN_FILES, *LAST_FILES, LOCK_NAME, "generation_config.json", "special_tokens_map.json",
                         "vocab.json", "merges.txt", "added_tokens.json", "training_args.bin", "tokenizer.json",
                         "tokenizer_config.json", "model.safetensors.index.json"})
_SAVE_SUFFIXES = (".safetensors", ".bin", ".jinja", ".model", ".pt", ".pth")


def written_by_run(path: Path, out: Path) -> bool:
    """Whether a run with ``output_dir`` ``out`` writes, replaces or removes ``path`` (both resolved): a file at
    the top of ``out`` with a name the run's record or final model save uses, or anything under one of its
    ``checkpoint-N`` (rotated by ``save_total_limit``) or staging folders (cleared at start)."""
    if not path.is_relative_to(out) or path == out:
        return False
    top = path.relative_to(out).parts[0]
    if CHECKPOINT_RE.match(top) or top.startswith(STAGING_PREFIX):
        return True
    if len(path.relative_to(out).parts) > 1:
        return False
    return top in _RUN_WRITES or top.startswith("adapter_") or top.endswith(_SAVE_SUFFIXES)


def run_writes(out: Path) -> list[str]:
    """The entries at the top of ``out`` that a run writes over (:func:`written_by_run`; a LoRA run's final
    ``adapter/``), but for its
    ``checkpoint-N`` and staging folders, which :func:`ictrl.train_cli.preflight.existing_checkpoints` and
    ``checkpoints.clear_staging`` answer for."""
    if not out.is_dir():
        return []
    return [p.name for p in sorted(out.iterdir()) if p.name == "adapter" or written_by_run(p, out)
            and not CHECKPOINT_RE.match(p.name) and not p.name.startswith(STAGING_PREFIX)]


def earlier_run(out: Path) -> bool:
    """Whether ``out`` holds the ``run.json`` of an ``ictrl train`` run written before ictrl listed its files."""
    from ictrl.files import holds_record

    return holds_record(out / "run.json", ("method_from", "seed"))


def check_own_output(out_dir: str, label: str) -> None:
    """Refuse an ``output_dir`` holding a file the run would write over that ictrl did not write there
    (``files.check_own_files``): a project's README.md or config.yaml under ``--output-dir .``, or a
    ``checkpoint-N`` folder (``checkpoints.foreign_checkpoints``), which a resume would start from and rotation
    delete. ``--overwrite`` replaces only ictrl's own files, so it does not lift this."""
    out = Path(out_dir).expanduser()
    check_own_files(out, run_writes(out), f"{label}: output_dir", earlier_run,
                    f" ({OVERWRITE_FLAG} replaces only files ictrl wrote)")
    foreign = foreign_checkpoints(out, earlier_run)
    if foreign:
        more = f" (and {len(foreign) - 1} more)" if len(foreign) > 1 else ""
        raise ConfigError(f"{label}: output_dir: {foreign[-1]}{more} was not written by ictrl (not in its "
                          f"{OWNED_FILE}): a run would resume from it or delete it in rotation (save_total_limit); "
                          "move it away or choose another output directory")


def check_not_an_input(out_dir: str, inputs: list[tuple[str, Path]], source: str) -> None:
    """Refuse an ``output_dir`` whose writes would replace a file the run reads: the model directory itself (its
    weights, config and tokenizer; a folder inside it is fine), or a data file, the config file or a local reward
    module (``inputs``: (what, path) pairs) that :func:`written_by_run` says the run writes. A config file that is
    the ``config.yaml`` an earlier run wrote beside its ``run.json`` (``ictrl train OUT/config.yaml --resume``) is
    the run's own record, written back as it was read."""
    out = Path(out_dir).expanduser().resolve()
    for what, path in inputs:
        path = path.expanduser().resolve()
        if what == "model_name_or_path" and path == out:
            raise ConfigError(f"{source}: output_dir: {out_dir} is the model directory (model_name_or_path): the run "
                              "would replace its weights, config and tokenizer; choose another output_dir (a folder "
                              "inside the model directory is fine)")
        if what == "the config file" and path == out / "config.yaml" and (out / "run.json").is_file():
            continue
        if written_by_run(path, out):
            raise ConfigError(f"{source}: output_dir: {out_dir}: the run writes {path}, which is {what}; choose "
                              "another output_dir or move the file out of it")


def previous_run(out: Path, finished_only: bool) -> list[str]:
    """The files in ``out`` that an earlier run left: its model (weights, ``config.json``, ``manifest.json``),
    and with ``finished_only`` False its record (``run.json``, ``metrics.jsonl``) too."""
    if not out.is_dir():
        return []
    record = () if finished_only else ("run.json", "metrics.jsonl")
    found = []
    for path in sorted(out.iterdir()):
        name = path.name
        if path.is_file() and (name in (*record, "config.json", "manifest.json", "adapter_config.json")
                               or name.endswith((".safetensors", ".bin")) and name != "training_args.bin"):
            found.append(name)
    return found


def check_no_previous_run(out: Path, resume: bool | str, modes: frozenset[str] | set[str], source: str) -> None:
    """With no checkpoint to resume, ``out`` must hold no earlier run (:func:`previous_run`: its record or its
    model; under ``--resume=auto``, which starts over when nothing is left to resume, its model), unless
    :data:`OVERWRITE_FLAG`: TRL's ``Trainer.save_model`` would replace it without a word."""
    if OVERWRITE_FLAG in modes:
        return
    found = previous_run(out, finished_only=resume == "auto")
    if found:
        shown = ", ".join(found[:4]) + (f" and {len(found) - 4} more" if len(found) > 4 else "")
        raise ConfigError(f"{source}: output_dir: {out} holds an earlier run ({shown}) and no checkpoint to resume; "
                          f"choose another output_dir, or pass {OVERWRITE_FLAG} to replace it")


def forget_previous_run(out: Path) -> None:
    """Under :data:`OVERWRITE_FLAG`, remove the marks of the earlier run's final model (``manifest.json``,
    ``trainer_state.json``) before this run writes: a later ``--resume`` then never takes that model for this
    run's (``checkpoints.finished_run``). The earlier files themselves are replaced as this run writes its own."""
    for name in (MANIFEST, "trainer_state.json"):
        (out / name).unlink(missing_ok=True)


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
        # a resume is exact and keeps learning_rate (train_cli.resume_check.check_unchanged): it would diverge again
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
