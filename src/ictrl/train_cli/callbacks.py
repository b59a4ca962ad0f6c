"""Trainer callbacks of ``ictrl train``: per-step metrics to ``metrics.jsonl`` and a rich progress bar.

Both read the dict that ``Trainer.log`` hands to ``on_log``: TRL's keys (``reward``, ``rewards/NAME/mean``,
``clip_ratio/region_mean``, ``kl``, ``entropy``, ``step_time``, ``loss``, ...) and ICTGRPOTrainer's
``ictrl/*`` keys (``ictrl/selected_frac``, ``ictrl/h1/all``, ``ictrl/h1/selected``, ...).
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from transformers import TrainerCallback

from ictrl.checkpoints import rerun_advice
from ictrl.files import append_whole, atomic_write_text, reported_write

if TYPE_CHECKING:
    from ictrl.train_cli.run_config import RunConfig

CLIP_KEY = "ictrl/clip_frac"  # ICTGRPOTrainer's; plain TRL logs clip_ratio/region_mean
SUMMARY_KEYS = ("train_runtime", "train_samples_per_second")  # the end-of-training log, not a step


def _finite_row(row: dict[str, Any]) -> dict[str, Any]:
    """JSON has no NaN/inf: write them as null and list their keys under ``nonfinite``."""
    bad = [k for k, v in row.items() if isinstance(v, float) and not math.isfinite(v)]
    if bad:
        row = {k: (None if k in bad else v) for k, v in row.items()}
        row["nonfinite"] = bad
    return row


def warmup_line(args: Any, start: int, max_steps: int) -> str | None:
    """The line saying which of the steps after ``start`` (the step a run begins or resumes at) fall inside the
    selection warm-up (``selection_warmup_steps`` Θ: steps 1-Θ train on every response token), or None when none do
    or the method selects every token anyway."""
    warmup = int(getattr(args, "selection_warmup_steps", 0) or 0)
    selector = getattr(args, "selector", None)
    if warmup <= start or selector is None or selector.trl_loss:
        return None
    line = (f"selection warm-up: steps {start + 1}-{warmup} train on all tokens (selection_warmup_steps={warmup}); "
            f"{selector.label} selects from step {warmup + 1}")
    if 0 < max_steps <= warmup:  # the whole run is warm-up: it trains as GRPO on every token
        line += (f"; this run ends at step {max_steps}, inside the warm-up, so no step selects tokens "
                 "(--selection_warmup_steps=0 selects from step 1)")
    return line


class MetricsJSONL(TrainerCallback):
    """Append one JSON object per logging step to ``path`` (flushed at once; experiments tail it).

    Each row is ``{"step": global_step, "time": ISO 8601 UTC, "unix_time": seconds, **logs}`` plus ``accuracy``
    (the mean of the reward named ``accuracy_reward``): the wall clock lets a row be matched with a tracker's
    or a log's, and the gap between rows is the real time a step took, waits included. On resume the rows after
    the checkpoint's step, logged by the interrupted run and about to be redone, are cut off in place (the file
    is not replaced, so ``tail -f`` follows the resumed run) and each step appears once. A row the disk has no
    room for is not written at all, and the run stops with one line.
    """

    def __init__(self, path: str | os.PathLike[str], accuracy_reward: str | None = None) -> None:
        self.path = Path(path)
        self.accuracy_key = f"rewards/{accuracy_reward}/mean" if accuracy_reward else None
        self._fd: int | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not state.is_world_process_zero:
            return
        # said before the first row: the rows of warm-up steps show every token selected (ictrl/selected_frac 1)
        note = warmup_line(args, state.global_step, getattr(state, "max_steps", 0))
        if note:
            logging.getLogger("ictrl.train").info(note)
        with reported_write(self.path, lambda: rerun_advice(self.path.parent)):
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
            keep = _rows_through(os.pread(self._fd, os.fstat(self._fd).st_size, 0), state.global_step)
            if keep is None:  # rows out of step order (hand-edited): rewritten, no longer the file a tail follows
                os.close(self._fd)
                kept = [line for line in self.path.read_text().splitlines() if _step(line) <= state.global_step]
                atomic_write_text(self.path, "".join(line + "\n" for line in kept))
                self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
            else:
                # cut in place, not replaced: `tail -f metrics.jsonl` keeps following the run across --resume
                os.ftruncate(self._fd, keep)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
               **kwargs: Any) -> None:
        if self._fd is None or not logs or any(k in logs for k in SUMMARY_KEYS):
            return
        # One integer millisecond clock for both fields, so the ISO stamp and unix_time name the same instant.
        ms = time.time_ns() // 1_000_000
        when = datetime.fromtimestamp(ms // 1000, timezone.utc).replace(microsecond=ms % 1000 * 1000)
        stamp = when.isoformat(timespec="milliseconds").replace("+00:00", "Z")
        row: dict[str, Any] = {"step": state.global_step, "time": stamp, "unix_time": ms / 1000, **logs}
        if self.accuracy_key and self.accuracy_key in logs:
            row["accuracy"] = logs[self.accuracy_key]
        with reported_write(self.path, lambda: rerun_advice(self.path.parent,
                                                            f"the run stopped at step {state.global_step}")):
            append_whole(self._fd, (json.dumps(_finite_row(row)) + "\n").encode())

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _step(line: str | bytes) -> float:
    """A row's step; infinity for a line that is not a row (one cut by a kill), so it is dropped."""
    try:
        step = json.loads(line).get("step", math.inf)
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        return math.inf
    return step if isinstance(step, (int, float)) else math.inf


def _rows_through(data: bytes, step: int) -> int | None:
    """The length in bytes of the leading rows of ``data`` up to ``step`` (what a resumed run keeps), when every
    line after them is beyond it or torn; None when rows are out of order."""
    end, past = 0, False
    *whole, _ = data.split(b"\n")  # the part after the last newline is torn (or empty)
    for line in whole:
        if _step(line) > step:
            past = True
        elif past:
            return None
        else:
            end += len(line) + 1
    return end


def _fmt(logs: dict[str, Any], key: str, spec: str = ".3f") -> str:
    value = logs.get(key)
    return format(value, spec) if isinstance(value, (int, float)) else "-"


TREND = 10  # logged rewards in the running mean of the log line


def step_line(step: int, max_steps: int, logs: dict[str, Any], accuracy_key: str | None,
              recent: list[float] | None = None) -> str:
    """One compact line per logged step: the numbers a person watches. ``recent``: the last logged rewards (up to
    :data:`TREND`), shown as their mean (``avg10``): one generation batch's reward is noisy, their trend is not.
    ``acc`` (the accuracy reward's mean) only with an ``accuracy_key``: a run whose first reward is a 0/1
    verifier; a graded reward's mean is no accuracy."""
    trend = f" (avg{len(recent)} {sum(recent) / len(recent):.3f})" if recent else ""
    parts = [
        f"step {step}/{max_steps}",
        f"reward {_fmt(logs, 'reward')}{trend}",
        *([f"acc {_fmt(logs, accuracy_key)}"] if accuracy_key else []),
        f"sel {_fmt(logs, 'ictrl/selected_frac')}",
        f"H1 {_fmt(logs, 'ictrl/h1/all')}/{_fmt(logs, 'ictrl/h1/selected')}",
        f"clip {_fmt(logs, CLIP_KEY if CLIP_KEY in logs else 'clip_ratio/region_mean', '.4f')}",
        f"kl {_fmt(logs, 'kl', '.4f')}",
        f"loss {_fmt(logs, 'loss', '.4g')}",
        f"{_fmt(logs, 'step_time', '.2f')}s",
    ]
    return "  ".join(parts)


EVAL_PREFIX = "eval_"  # Trainer.evaluate's keys: TRL's eval_reward, eval_loss, eval_runtime, ...
PASS_AT_K_PREFIX = "eval/"  # the pass@k evaluation's keys (eval_callback.PREFIX), in a training step's row


def eval_line(step: int, max_steps: int, logs: dict[str, Any], accuracy_key: str | None) -> str:
    """The line of an evaluation row (``eval_strategy``'s ``eval_dataset``): TRL's reward on the eval prompts, the
    accuracy reward's mean as on a step line, the completion length, the loss and the time the evaluation took."""
    def key(name: str) -> str:
        return f"{EVAL_PREFIX}{name}"

    parts = [
        f"eval at step {step}/{max_steps}",
        f"reward {_fmt(logs, key('reward'))}",
        *([f"acc {_fmt(logs, key(accuracy_key))}"] if accuracy_key else []),
        f"reward_std {_fmt(logs, key('reward_std'))}",
        f"length {_fmt(logs, key('completions/mean_length'), '.1f')}",
        f"loss {_fmt(logs, key('loss'), '.4g')}",
        f"{_fmt(logs, key('runtime'), '.2f')}s",
    ]
    return "  ".join(parts)


def pass_at_k_line(logs: dict[str, Any]) -> str | None:
    """The pass@k evaluation's numbers logged with a training step (``eval_benchmarks``), or None."""
    shown = [f"{k.removeprefix(PASS_AT_K_PREFIX)} {_fmt(logs, k)}" for k in sorted(logs)
             if k.startswith(PASS_AT_K_PREFIX) and k != f"{PASS_AT_K_PREFIX}time"]
    return "  eval " + "  ".join(shown) if shown else None


class RichProgress(TrainerCallback):
    """A rich bar (step, reward, selected fraction) plus one printed line per logged step; with ``bar=False``
    (``disable_tqdm: true``) the lines alone, so a quiet run's console or log file still shows each step.

    Replaces transformers' tqdm bar and its dict printer (``disable_tqdm=True`` and the PrinterCallback
    removed by ``ictrl.train_cli.run``). On a non-terminal (CI, a log file) rich shows no live bar, and the
    printed lines are the record.
    """

    def __init__(self, accuracy_reward: str | None = None, console: Console | None = None, bar: bool = True) -> None:
        self.console = console or Console(stderr=True, soft_wrap=True)  # a log line stays one line
        self.accuracy_key = f"rewards/{accuracy_reward}/mean" if accuracy_reward else None
        self.bar = bar
        self.progress: Progress | None = None
        self.printing = False  # this process prints (the local main one, between train begin and end)
        self.task: Any = None
        self.rewards: list[float] = []

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not state.is_local_process_zero:
            return
        self.printing = True
        if not self.bar:
            return
        self.progress = Progress(
            TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(), TimeRemainingColumn(), console=self.console, transient=False,
        )
        self.task = self.progress.add_task("train", total=state.max_steps, completed=state.global_step, info="")
        self.progress.start()
        # a resumed run's state holds the log of the steps before it (trainer_state.json): the running mean goes on
        # from those rewards instead of starting again at the resume step
        self.rewards = [float(h["reward"]) for h in getattr(state, "log_history", None) or []
                        if isinstance(h.get("reward"), (int, float)) and not any(k in h for k in SUMMARY_KEYS)
                        and h.get("step", 0) <= state.global_step][-TREND:]

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.progress is not None:
            self.progress.update(self.task, completed=state.global_step)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
               **kwargs: Any) -> None:
        if not self.printing or not logs:
            return
        console = self.progress.console if self.progress is not None else self.console
        if any(k in logs for k in SUMMARY_KEYS):
            if state.global_step >= state.max_steps:  # a run stopped early says so itself, once
                console.print(f"done: {state.global_step} steps in {_fmt(logs, 'train_runtime', '.1f')}s",
                              highlight=False)
            return
        if any(k.startswith(EVAL_PREFIX) for k in logs):  # an evaluation's row: no training step of its own
            console.print(eval_line(state.global_step, state.max_steps, logs, self.accuracy_key), highlight=False)
            return
        if isinstance(logs.get("reward"), (int, float)):
            self.rewards = [*self.rewards, float(logs["reward"])][-TREND:]
        if self.progress is not None:
            info = f"reward {_fmt(logs, 'reward')}  sel {_fmt(logs, 'ictrl/selected_frac')}"
            self.progress.update(self.task, completed=state.global_step, info=info)
        console.print(step_line(state.global_step, state.max_steps, logs, self.accuracy_key, self.rewards),
                      highlight=False)
        if (evaluated := pass_at_k_line(logs)) is not None:
            console.print(evaluated, highlight=False)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.printing = False
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


class StopNow(Exception):
    """Raised inside the training loop to leave it at a step's start, when a requested stop finds nothing to train
    before it (:class:`StopOnRequest`)."""


class StopOnRequest(TrainerCallback):
    """Ends training after a stop request (``request.received``: SIGTERM,
    :class:`ictrl.train_cli.run_guard.StopRequest`) at the first step where TRL's generation batch is used up
    (``at_boundary(step)``), with a checkpoint of that step: a checkpoint inside the batch would not hold the rest of it
    and could not resume exactly. The steps to that point reuse completions already generated, so finishing them costs
    no generation. Every process asks the others at each step's start and end (one all-reduce), so all stop at the same
    step. A request that arrives while a step is logged or saved is honoured at the next step's start, before anything
    of it runs: ``save()`` writes that step's checkpoint unless it exists, then :class:`StopNow` leaves the loop."""

    def __init__(self, request: Any, at_boundary: Any, save: Any, device: Any = None) -> None:
        self.request, self.at_boundary, self.save, self.device = request, at_boundary, save, device
        self.said = False

    def _requested(self) -> bool:
        import torch
        import torch.distributed as dist

        flag = self.request.received
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            tensor = torch.tensor([int(flag)], device=self.device)
            dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
            flag = bool(tensor.item())
        self.request.received = flag
        return flag

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.request.training = True

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._requested() and self.at_boundary(state.global_step):
            self.save()
            raise StopNow()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self._requested():
            return
        if self.at_boundary(state.global_step) or state.global_step >= state.max_steps:
            control.should_save = True
            control.should_training_stop = True
        elif not self.said:
            self.said = True
            import logging

            logging.getLogger("ictrl.train").warning(
                "SIGTERM at step %d: finishing the generation batch's remaining steps first", state.global_step)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.request.training = False


# reward_funcs names whose scores are 0 or 1 (ictrl's verifiers, TRL's accuracy rewards): a mean is an accuracy
BINARY_REWARDS = ("verifiable", "math", "gsm8k", "choice", "accuracy_reward", "reasoning_accuracy_reward")


def add_run_callbacks(trainer: Any, cfg: RunConfig, reward_funcs: list[Callable[..., Any]], tokenizer: Any,
                      out: Path, callbacks: list[Any] | None) -> None:
    """``ictrl train``'s log (metrics.jsonl, the step line or rich bar) in place of transformers' printers, the
    caller's callbacks and the pass@k evaluation."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from ictrl.train_cli.run_inputs import reward_label

    args = trainer.args
    # the first reward is an accuracy (metrics' `accuracy`, the step line's `acc`) only when it is a 0/1 verifier
    first = cfg.script.reward_names()[0]
    binary = not cfg.script.reward_model_name_or_path and first in BINARY_REWARDS
    accuracy = reward_label(reward_funcs[0]) if binary else None
    for cb in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(cb)
    trainer.add_callback(MetricsJSONL(out / "metrics.jsonl", accuracy_reward=accuracy))
    # the rich bar stands in for transformers' tqdm bar; under disable_tqdm its step lines stay (TRL's dict printer
    # would print each step too)
    trainer.add_callback(RichProgress(accuracy_reward=accuracy, bar=not args.disable_tqdm))
    for cb in callbacks or []:
        trainer.add_callback(cb)
    if args.eval_benchmarks:
        from ictrl.train_cli.eval_callback import PassAtKCallback

        trainer.add_callback(PassAtKCallback.from_args(args, tokenizer).bind(trainer))
