"""What a training run accepts from its reward functions, the same from Python (``ICTGRPOTrainer``) and the CLI.

TRL's ``GRPOTrainer._calculate_rewards`` takes each reward function's list as it comes: ``None`` is its convention
for "this reward does not score this completion" (it becomes NaN, which ``nansum`` and ``nanmean`` skip), and
anything else goes through ``torch.tensor``. So a string crashes deep inside TRL without naming the reward, an
``inf`` turns the group's advantages into NaN, which TRL sets to 0 (no learning signal, no word), a returned NaN
is skipped as a ``None`` is, and a reward that hangs has no deadline. :class:`RewardPolicy` wraps each reward
*function* of a trainer (:meth:`RewardPolicy.wrap`, TRL's name and sync/async kind kept) and stops the run at that
step with a :class:`RewardError` naming the reward, the row and the value when:

- the result is not a list/tuple of one value per completion;
- a value is not a real number or ``None`` (a string, a list, a tensor of several values);
- a value is ``inf`` / ``-inf``, or NaN: ``None`` is how a reward says "not scored", a NaN is a failure of
  ictrl's methods; under ``token_selector: all`` (TRL's loss, ``nan_is_none``) a NaN is taken as TRL takes it, as
  ``None`` (``nansum`` over the rewards skips it), with one warning naming the reward the first time;
- the reward raises (the exception's type and first line; ``sys.exit`` and any ``BaseException`` but Ctrl-C too,
  so no reward ends a run silently), or runs past ``reward_timeout`` seconds.

TRL hands every reward the same lists (``prompts``, ``completions``, ``completion_ids`` and each data column), and
after the calls it counts, logs and trains on those very lists: a reward that edits them in place changes what the
next reward grades and what is logged, and one that clears them ends in TRL's count check. So each call gets its
own deep copy of the batch (:func:`own_copy`; the trainer's state, its logging hooks and the rollouts'
environments stay shared: they are the trainer's objects, not the batch), and the result is checked against the
batch as TRL holds it. The copy is a few microseconds a call at the demo's batch (``bench/bench_reward_copy.py``).
A reward that changes the working directory (a code sandbox's ``os.chdir``) or the run's SIGTERM / SIGINT handler
is named once and the run's restored after each of its calls.

A reward *model* (an ``nn.Module``) has no per-function hook in TRL: :meth:`RewardPolicy.check_scores` checks the
gathered scores for ``inf`` after TRL computes them. :meth:`RewardPolicy.observe_advantages` counts optimizer steps
in a row whose every advantage is 0 (equal rewards in every group, or NaN advantages TRL zeroed) and stops the run
with :class:`NoLearningSignal` after ``no_signal_steps`` of them (0: never); a stretch of :data:`NO_SIGNAL_STEPS`
such steps that does not stop the run is said in one line, once per stretch (TRL's GRPO trains on without a word).

With ``reward_timeout`` set, each call runs in a daemon thread the training thread waits on; a call past the
deadline is abandoned (Python cannot stop a thread; the process ends soon after, with the one line). A stop
request (SIGTERM, ``stop_requested``) during a call gives the call :data:`SIGTERM_GRACE_S` seconds to finish, then
abandons it: the run stops within that bound plus the checkpoint line. Without a deadline the call runs on the
training thread (math-verify's own timeouts need the main thread) and SIGTERM interrupts it there
(:class:`ictrl.train_cli.run_guard.StopRequest`). Either way a call still running after
:data:`STILL_RUNNING_NOTE_S` seconds is named on the console (the reward and the step), once a period.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import inspect
import logging
import math
import numbers
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any, Callable

from ictrl.errors import Interrupted, UserError, quote

# A reward call's time to finish after SIGTERM: the run then ends within 20 s, under a scheduler's usual 30 s grace.
SIGTERM_GRACE_S = 5.0
POLL_S = 0.2
# How often a reward call that has not returned is named on the console. There is no deadline by default (a slow
# judge may be fine), but a hung reward must not hang the run without a word.
STILL_RUNNING_NOTE_S = 60.0
# Optimizer steps in a row without learning signal at which ictrl's methods stop by default
# (ICTGRPOConfig.no_signal_steps) and at which a run that trains on says so, once per stretch: a run TRL's GRPO
# trains through gets the line where ICT would have stopped.
NO_SIGNAL_STEPS = 20

log = logging.getLogger("ictrl.train")


class RunStop(UserError):
    """The run stopped itself at a step: the CLI adds the last checkpoint and the command that resumes."""


class RewardError(RunStop):
    """A reward function's result (or its raising, or its deadline) that the run cannot train on."""


class NoLearningSignal(RunStop):
    """Every advantage was 0 for ``no_signal_steps`` optimizer steps in a row."""


class RewardAbandoned(RunStop):
    """A stop request found a reward call running and it did not finish within :data:`SIGTERM_GRACE_S`."""


# What TRL passes a reward besides the batch: the trainer's state and logging hooks, and the rollouts' environments,
# whose own state a reward reads (``get_reward``). These are shared, not copied.
SHARED_KWARGS = frozenset({"trainer_state", "log_extra", "log_metric", "environments"})


# Values no reward can change in place: shared by the copies.
_IMMUTABLE = frozenset({str, int, float, bool, type(None), bytes, complex})


def own_copy(args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
    """A reward call's own copy of the batch: every argument but :data:`SHARED_KWARGS` copied all the way down, so
    whatever the reward does to its inputs stays in its call."""
    return _fresh(args), {key: value if key in SHARED_KWARGS else _fresh(value) for key, value in kwargs.items()}


def _fresh(value: Any) -> Any:
    """``copy.deepcopy(value)``, with lists, tuples and dicts of plain values (a batch's strings, token ids and
    messages) copied at C speed: deepcopy visits each of the demo batch's 11k token ids in Python, 8 ms a call."""
    kind = type(value)
    if kind in _IMMUTABLE:
        return value
    if kind is list or kind is tuple:
        if set(map(type, value)) <= _IMMUTABLE:
            return list(value) if kind is list else value
        return kind(map(_fresh, value))
    if kind is dict:
        return {key: _fresh(item) for key, item in value.items()}
    return copy.deepcopy(value)


# The signals whose handlers the run installs (ictrl.train_cli.run_guard.StopRequest, Ctrl-C): a reward's own
# handler would lose the stop with a checkpoint.
RUN_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _run_state() -> tuple[str | None, tuple[Any, ...]]:
    """The working directory (None: it was removed) and the handlers of :data:`RUN_SIGNALS`."""
    try:
        cwd: str | None = os.getcwd()
    except OSError:
        cwd = None
    return cwd, tuple(signal.getsignal(sig) for sig in RUN_SIGNALS)


def _label(fn: Any) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__


class RewardPolicy:
    """The checks above, for one trainer. ``stop_requested``: a callable saying whether a stop (SIGTERM) is
    pending; ``step``: a callable giving the optimizer step, for the messages."""

    def __init__(self, timeout: float | None = None, no_signal_steps: int = 0, steps_per_batch: int = 1,
                 step: Callable[[], int] | None = None, nan_is_none: bool = False) -> None:
        self.timeout = timeout
        self.nan_is_none = nan_is_none
        self.no_signal_steps = no_signal_steps
        self.steps_per_batch = max(1, steps_per_batch)
        self.step = step or (lambda: 0)
        self.stop_requested: Callable[[], bool] = lambda: False
        self.zero_steps = 0
        self.note_after = NO_SIGNAL_STEPS
        self.calling: str | None = None  # the reward running on the training thread (no deadline), for SIGTERM
        self.named: set[tuple[str, str]] = set()  # (reward, what it changed) named already: _keep_state
        self.watch = StillRunning()

    @classmethod
    def from_args(cls, args: Any, step: Callable[[], int]) -> RewardPolicy:
        """The policy an ``ICTGRPOConfig`` sets (``reward_timeout``, ``no_signal_steps``), counting optimizer steps
        per generation batch as TRL's buffer does; a returned NaN is TRL's "not scored" under TRL's loss."""
        per_batch = args.steps_per_generation * args.num_iterations // args.gradient_accumulation_steps
        return cls(args.reward_timeout, args.no_signal_steps or 0, per_batch, step=step,
                   nan_is_none=bool(getattr(args.selector, "trl_loss", False)))

    def abandon(self) -> RewardAbandoned:
        """What SIGTERM raises in the training thread when a reward call outlives :data:`SIGTERM_GRACE_S`."""
        return RewardAbandoned(f"reward {self.calling!r} was still running {SIGTERM_GRACE_S:g} s after SIGTERM, at "
                               f"step {self.step()}; abandoned it")

    # --- reward functions --------------------------------------------------------------------------------------

    def wrap(self, fn: Callable[..., Any], name: str | None = None) -> Callable[..., Any]:
        """``fn`` called with its own copy of the batch (:func:`own_copy`), its results checked (and its calls timed,
        with ``timeout``); TRL's name kept."""
        name = name or _label(fn)
        if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None)):
            async def checked_async(*args: Any, **kwargs: Any) -> Any:
                own_args, own_kwargs = own_copy(args, kwargs)
                try:
                    with self._watched(name):
                        out = await fn(*own_args, **own_kwargs)
                except (RunStop, Interrupted, KeyboardInterrupt, asyncio.CancelledError):
                    raise
                except BaseException as exc:  # noqa: BLE001 - a user's reward: any failure (sys.exit too) is named
                    raise self._raised(name, exc) from exc
                return self.check(name, out, kwargs)

            wrapped: Callable[..., Any] = functools.update_wrapper(checked_async, fn) \
                if hasattr(fn, "__name__") else checked_async
        else:
            def checked(*args: Any, **kwargs: Any) -> Any:
                with self._watched(name):
                    out = self._call(name, fn, *own_copy(args, kwargs))
                return self.check(name, out, kwargs)

            wrapped = functools.update_wrapper(checked, fn) if hasattr(fn, "__name__") else checked
        wrapped.__name__ = name
        wrapped.ictrl_checked = True  # type: ignore[attr-defined]
        return wrapped

    @contextlib.contextmanager
    def _watched(self, name: str) -> Iterator[None]:
        """The block's call, listed for the watch (:class:`StillRunning`) while it runs; the process state the run
        depends on that it found, given back after it (:meth:`_keep_state`)."""
        token = self.watch.begin(name, self.step())
        before = _run_state()
        try:
            yield
        finally:
            self.watch.end(token)
            self._keep_state(name, before)

    def _keep_state(self, name: str, before: tuple[str | None, tuple[Any, ...]]) -> None:
        """The run's working directory and its SIGTERM / SIGINT handlers (the stop with a checkpoint, Ctrl-C's
        line) restored after a reward call that changed them: a code sandbox's ``os.chdir`` (into a folder it may
        have removed since), a library's own signal handler. The run's relative paths, its stop and the next call
        find what the run set. Each reward is named once for each."""
        cwd, handlers = before
        now, now_handlers = _run_state()
        if cwd is not None and now != cwd:
            try:
                os.chdir(cwd)
            except OSError as exc:
                log.warning("reward %r changed the working directory at step %d and %s cannot be restored: %s",
                            name, self.step(), cwd, exc.strerror or exc)
            else:
                self._name_once(name, "cwd", f"reward {name!r} changed the working directory (to "
                                f"{now or 'a folder since removed'}) at step {self.step()}; the run restores {cwd} "
                                "after each of its calls")
        if now_handlers != handlers and threading.current_thread() is threading.main_thread():
            for sig, handler in zip(RUN_SIGNALS, handlers):
                signal.signal(sig, handler)
            self._name_once(name, "signals", f"reward {name!r} replaced the run's SIGTERM / SIGINT handler at step "
                            f"{self.step()}; the run restores its own after each of its calls")

    def _name_once(self, name: str, what: str, message: str) -> None:
        if (name, what) not in self.named:
            self.named.add((name, what))
            log.warning(message)

    def _raised(self, name: str, exc: BaseException) -> RewardError:
        first = (str(exc).strip().splitlines() or [""])[0]
        return RewardError(f"reward {name!r} raised {type(exc).__name__}: {quote(first, 300)} at step {self.step()}"
                           " (--debug shows the traceback)")

    def _call(self, name: str, fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> Any:
        if self.timeout is None:
            self.calling = name
            try:
                return fn(*args, **kwargs)
            except (RunStop, Interrupted, KeyboardInterrupt):  # a stop of the run's own, not the reward's failure
                raise
            except BaseException as exc:  # noqa: BLE001 - a user's reward: any failure (sys.exit too) is named
                raise self._raised(name, exc) from exc
            finally:
                self.calling = None
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["out"] = fn(*args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - handed to the training thread
                box["error"] = exc

        thread = threading.Thread(target=run, name=f"reward {name}", daemon=True)
        start = time.monotonic()
        thread.start()
        stop_seen: float | None = None
        while thread.is_alive():
            thread.join(POLL_S)
            now = time.monotonic()
            if not thread.is_alive():
                break
            if stop_seen is None and self.stop_requested():
                stop_seen = now
            if stop_seen is not None and now - stop_seen >= SIGTERM_GRACE_S:
                raise RewardAbandoned(f"reward {name!r} was still running {SIGTERM_GRACE_S:g} s after the stop "
                                      f"request, at step {self.step()}; abandoned it")
            if now - start >= self.timeout:
                raise RewardError(f"reward {name!r} ran past reward_timeout={self.timeout:g} s at step {self.step()}"
                                  "; raise reward_timeout or make the reward faster")
        if "error" in box:
            if isinstance(box["error"], RunStop):
                raise box["error"]
            raise self._raised(name, box["error"]) from box["error"]
        return box["out"]

    def check(self, name: str, out: Any, kwargs: dict[str, Any]) -> list[Any]:
        """``out`` as TRL takes it, or :class:`RewardError` naming ``name``, the row (its ``id`` column when the
        data has one) and the value."""
        expected = len(kwargs["completions"]) if "completions" in kwargs else None
        if not isinstance(out, (list, tuple)):
            raise RewardError(f"reward {name!r} returned {type(out).__name__} {quote(out, 80)} at step "
                              f"{self.step()}; a reward returns a list with one float (or None) per completion")
        if expected is not None and len(out) != expected:
            raise RewardError(f"reward {name!r} returned {len(out)} values for {expected} completions at step "
                              f"{self.step()}; a reward returns one float (or None) per completion")
        ids = kwargs.get("id")
        for i, value in enumerate(out):
            problem = _problem(value)
            if problem is not None:
                row = f"row {i}" + (f" (id {quote(ids[i], 80)})" if isinstance(ids, list) and i < len(ids) else "")
                if problem == NAN_PROBLEM and self.nan_is_none:
                    self._name_once(name, "nan", f"reward {name!r} returned NaN for {row} at step {self.step()}: "
                                    "taken as None (not scored), as TRL's GRPO takes it under token_selector: all")
                    continue
                raise RewardError(f"reward {name!r} returned {quote(value, 80)} for {row} at step {self.step()}: "
                                  f"{problem}")
        return list(out)

    def check_scores(self, scores: Any, names: list[str]) -> None:
        """The gathered [completions, rewards] tensor TRL computed: no ``inf`` (a reward model's score)."""
        import torch

        bad = torch.isinf(scores)
        if bool(bad.any()):
            row, col = (int(v) for v in bad.nonzero()[0])
            raise RewardError(f"reward {names[col]!r} scored row {row} {float(scores[row, col])} at step "
                              f"{self.step()}: not finite")

    def score(self, calculate: Callable[..., Any], funcs: list[Any], names: list[str], *args: Any,
              **kwargs: Any) -> Any:
        """TRL's ``_calculate_rewards`` (``calculate``) with every reward function (``funcs``, TRL's list, wrapped
        in place once: TRL's names and its sync/async split are those it made at init) checked, and the gathered
        scores checked."""
        import torch

        for i, (fn, name) in enumerate(zip(funcs, names)):
            if not isinstance(fn, torch.nn.Module) and not getattr(fn, "ictrl_checked", False):
                funcs[i] = self.wrap(fn, name)
        scores = calculate(*args, **kwargs)
        self.check_scores(scores, list(names))
        return scores

    # --- advantages --------------------------------------------------------------------------------------------

    def observe_batch(self, batch: dict[str, Any], gather: Callable[[Any], Any]) -> None:
        """A training generation batch's advantages, all processes' (``gather``), for ``no_signal_steps`` and the
        no-signal line."""
        advantages = batch.get("advantages")
        if advantages is not None:
            # built on the device: the decision below is this batch's one host read
            nonzero = gather((advantages != 0).any().float().reshape(1))
            self.observe_advantages(not bool(nonzero.any()))

    def observe_advantages(self, all_zero: bool) -> None:
        """One generation batch's advantages: all zero or not. Stops the run after ``no_signal_steps`` optimizer
        steps in a row of all-zero advantages; a run that trains on is told once per such stretch, when it reaches
        ``note_after`` steps."""
        before = self.zero_steps
        self.zero_steps = self.zero_steps + self.steps_per_batch if all_zero else 0
        why = ("each group's rewards were equal or not finite, so the loss and the gradient were 0 (the model "
               "needs some right and some wrong answers per prompt); check the rewards, the prompt format it was "
               "trained on and max_completion_length")
        if self.no_signal_steps and self.zero_steps >= self.no_signal_steps:
            raise NoLearningSignal(
                f"no learning signal: every advantage was 0 for {self.zero_steps} optimizer steps in a row: {why}, "
                "or set no_signal_steps: 0 to train on")
        if before < self.note_after <= self.zero_steps:
            log.warning("no learning signal: every advantage was 0 for %d optimizer steps in a row (step %d): %s; "
                        "training on (no_signal_steps=%d; set it to N > 0 to stop after N such steps)",
                        self.zero_steps, self.step(), why, self.no_signal_steps)


class StillRunning:
    """Names each reward call still running on the console every :data:`STILL_RUNNING_NOTE_S` seconds. One
    thread for all calls, started at the first: a thread started per call costs the training thread a GIL hand-off
    (milliseconds on a loaded machine) each call."""

    def __init__(self) -> None:
        self.changed = threading.Condition()
        self.running: dict[int, list[Any]] = {}  # token -> [reward name, step, start, notes given]
        self.tokens = 0
        self.thread: threading.Thread | None = None

    def begin(self, name: str, step: int) -> int:
        with self.changed:
            self.tokens += 1
            self.running[self.tokens] = [name, step, time.monotonic(), 0]
            if self.thread is None or not self.thread.is_alive():  # a fork keeps no threads
                self.thread = threading.Thread(target=self._loop, name="ictrl reward watch", daemon=True)
                self.thread.start()
            self.changed.notify()
            return self.tokens

    def end(self, token: int) -> None:
        with self.changed:
            self.running.pop(token, None)

    def _loop(self) -> None:
        with self.changed:
            while True:
                every = STILL_RUNNING_NOTE_S  # read each time: a test lowers it
                self.changed.wait(every / 4 if self.running else None)
                now = time.monotonic()
                for call in self.running.values():
                    name, step, start, given = call
                    if int((now - start) // every) > given:
                        call[3] = int((now - start) // every)
                        log.warning("reward %r is still running after %.0f s at step %d", name, now - start, step)


NAN_PROBLEM = "NaN; return None for a completion the reward does not score"


def _problem(value: Any) -> str | None:
    if value is None or isinstance(value, bool):
        return None
    if not isinstance(value, numbers.Real):
        numel = getattr(value, "numel", None)  # a one-value tensor, which torch.tensor takes
        if callable(numel) and numel() == 1:
            return _problem(value.item())
        return f"not a number ({type(value).__name__}); a reward is a float, or None for a completion it does not score"
    try:
        number = float(value)
    except OverflowError:  # an int or Fraction past float's range (10**400): TRL's float tensor cannot hold it
        return "beyond the range of a float (about 1.8e308)"
    if math.isnan(number):
        return NAN_PROBLEM
    if math.isinf(number):
        return "not finite"
    return None
