"""``ictrl train``'s body: run config -> checked trainer arguments, rewards, data -> model -> ICTGRPOTrainer.train().

Everything that can be wrong with the config is checked by ``ictrl.train_cli.trainer_inputs`` before the lock is
taken, and the model's files and every training row (``trainer_inputs.check_inputs``) before the model loads.

Checkpoints and resume: ``ictrl.engine.resumable`` (the trainer hooks) and ``ictrl.checkpoints`` (the files).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from pathlib import Path
from typing import Any, Iterator

import torch

from ictrl.checkpoints import RUN_FILES, STAGING_PREFIX, checkpoint_state, own_checkpoints, rerun_advice
from ictrl.cliargs import VERBOSE_ENV, env_flag
from ictrl.core.selection import selector_identity
from ictrl.engine.resumable import save_final
from ictrl.train_cli.exact_resume import INEXACT_FLAG, check_resume
from ictrl.errors import Terminated, UserError
from ictrl.files import claim_files, reported_write
from ictrl.engine.reward_policy import RewardAbandoned, RunStop
from ictrl.train_cli.output_dir import earlier_run, prepare_output_dir
from ictrl.train_cli.trainer_inputs import (TrainerInputs, build_trainer_inputs, check_inputs, train_rows,
                                            trainer_classes)
from ictrl.train_cli.run_config import RunConfig, save_config
from ictrl.train_cli.callbacks import add_run_callbacks
from ictrl.train_cli.run_guard import RunLock, StopRequest, add_stop_callback, note_short_run, run_failure, stopped
from ictrl.train_cli.run_inputs import ACCEPT_CHANGED_FLAG, eval_rows, input_hashes, inputs_record

log = logging.getLogger("ictrl.train")


# --- the run ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class TrainResult:
    output_dir: Path
    global_step: int
    resumed_from: Path | None
    final_model: Path


RUN_LABELS = "run.json"


def write_run_labels(out: Path, args: Any, method_from: str = "file", inputs: dict[str, Any] | None = None) -> None:
    """``run.json``: the method (label, selector, ratio, scope, warm-up, normaliser; where ``token_selector`` came
    from), the training seed of the run, resolved (``ictrl eval`` records the label and seed for ``ictrl table``;
    config.yaml holds the keys as written, where an unset seed or ratio is a default), the rule itself under
    ``selector`` (``core.selection.selector_identity``: its file, that file's sha256 and the resolved options), and
    the hashes of what the run reads (``inputs``: the resume check compares them)."""
    import json

    from ictrl.files import atomic_write_text

    from ictrl.engine.model_card import resolved_method

    labels = {**resolved_method(args), "method_from": method_from, "seed": int(args.seed),
              "selector": selector_identity(args.selector, args.selector_options), **(inputs or {})}
    atomic_write_text(out / RUN_LABELS, json.dumps(labels, indent=1) + "\n")


def cpu_thread_count(args: Any) -> tuple[int, str]:
    """(torch threads, why) of a CPU run: ``cpu_threads``, else ``OMP_NUM_THREADS``, else 1, as ``trl grpo``'s
    accelerate launch sets it (its ``--num_cpu_threads_per_process`` default). Measured on a 2-core machine
    (bench/README.md, CPU threads): loaded, one thread is faster at both shapes; idle, two threads cost nothing at
    the tiny config and make Qwen2.5-0.5B's width 1.5x faster, which the line says."""
    if args.cpu_threads is not None:
        return int(args.cpu_threads), "cpu_threads"
    omp = os.environ.get("OMP_NUM_THREADS", "").strip()
    if omp.isdigit() and int(omp) > 0:
        return int(omp), "OMP_NUM_THREADS"
    return 1, ("as trl grpo, whose accelerate launch sets OMP_NUM_THREADS=1; cpu_threads or OMP_NUM_THREADS sets "
               "more: on an idle machine a real-width model steps 1.5x faster on 2 cores, bench/README.md")


@contextlib.contextmanager
def cpu_threads(args: Any) -> Iterator[None]:
    """torch's intra-op threads for a CPU run (``use_cpu``) at :func:`cpu_thread_count`, said in one line, restored
    on exit: an in-process caller keeps its own count."""
    threads = torch.get_num_threads()
    if args.use_cpu:
        count, why = cpu_thread_count(args)
        log.info("CPU threads: %d (%s; %d cores)", count, why, os.cpu_count() or 1)
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _not_tied_head_note(record: logging.LogRecord) -> bool:
    return "missing keys in the checkpoint model loaded: ['lm_head.weight']" not in record.getMessage()


def hide_tied_head_note() -> None:
    """Drop transformers' "missing keys ... ['lm_head.weight']" warning on resume: a tied head is the embedding
    matrix, which a checkpoint stores once, so nothing is missing (``--verbose`` keeps the warning)."""
    if not env_flag(VERBOSE_ENV):
        logging.getLogger("transformers.trainer").addFilter(_not_tied_head_note)


def method_line(cfg: RunConfig, source: str = "<config>") -> str:
    """The first line ``ictrl train`` logs: the method and where it came from (the file's key, a flag, the
    default), and for the default the way to get ICT."""
    from ictrl.core.selection import get_selector
    from ictrl.train_cli.run_config import DEFAULT_SELECTOR

    name = str(cfg.trainer.get("token_selector", DEFAULT_SELECTOR))
    try:
        selector = get_selector(name)
        what = "TRL's GRPO" if selector.trl_loss else selector.label
    except ValueError:
        what = name  # an unknown name is the config check's error, a line later
    if cfg.method_from == "default":
        return (f"method: {what} (token_selector: {name}, the default: {source} sets no token_selector, so it runs "
                "as trl grpo does); for ICT set token_selector: ict in the file or pass --token_selector=ict")
    where = f"--token_selector={cfg.flags.get('token_selector', name)}" if cfg.method_from == "flag" else source
    return f"method: {what} (token_selector: {name}, from {where})"


def train(cfg: RunConfig, resume: bool | str = False, source: str = "<config>",
          callbacks: list[Any] | None = None, resume_command: str | None = None,
          flags: dict[str, Any] | None = None, command: str | None = None,
          accept_changed_inputs: bool = False) -> TrainResult:
    """Run ``ictrl train``. Config errors surface before the model loads (``ictrl.train_cli.trainer_inputs``); the run
    holds ``output_dir``'s lock (:class:`ictrl.train_cli.run_guard.RunLock`) from before it reads a checkpoint there
    until it returns. Ctrl-C raises :class:`ictrl.errors.Interrupted` naming the step, the last checkpoint and
    ``resume_command``; SIGTERM stops at the end of the generation batch with a checkpoint
    (:class:`ictrl.train_cli.run_guard.StopRequest`) and raises :class:`ictrl.errors.Terminated` naming them. The
    first line logged names the method and its source. The final model and tokenizer are saved in ``output_dir``
    (as ``trl grpo``), with a model card naming the base model, the method and ``command``."""
    log.info(method_line(cfg, source))
    checked = build_trainer_inputs(cfg, source, flags)
    out = Path(checked.args.output_dir)  # absolute, checked (output_dir.checked_output_dir): the lock's folder
    stop = StopRequest()
    try:
        with stop, RunLock(out), cpu_threads(checked.args):
            return _train_locked(cfg, checked, resume, source, callbacks, resume_command, stop, command,
                                 accepting_flag(cfg, accept_changed_inputs))
    except Terminated:
        if not stop.before_training:
            raise
        raise stopped(out, None, resume_command, Terminated) from None  # nothing new to save


def accepting_flag(cfg: RunConfig, accept_changed_inputs: bool) -> str | None:
    """The flag under which ``--resume`` goes on over changed inputs (naming them), or None (it refuses):
    ``--accept-changed-inputs``, or ``--resume-inexact``, which accepts a resume that is not the same run."""
    if accept_changed_inputs:
        return ACCEPT_CHANGED_FLAG
    return INEXACT_FLAG if INEXACT_FLAG in cfg.modes else None


def _train_locked(cfg: RunConfig, checked: TrainerInputs, resume: bool | str, source: str, callbacks: list[Any] | None,
                  resume_command: str | None, stop: Any, command: str | None = None,
                  accept: str | None = None) -> TrainResult:
    args, reward_funcs = checked.args, checked.reward_funcs
    # The final model goes where Trainer.save_model(output_dir) and `trl grpo` put it: output_dir itself, the
    # absolute path the lock was taken on.
    out = Path(args.output_dir)
    resume_from = prepare_output_dir(cfg, resume, source, args)
    resumed = checkpoint_state(resume_from) if resume_from is not None else None
    step = resumed.step if resumed is not None else 0  # where the run starts
    if resumed is not None and resumed.path.parent.resolve() == out.resolve() and resumed.finished(args.max_steps):
        log.warning("--resume: the run is complete: %s is at step %d (max_steps %d) and %s holds its model; "
                    "nothing to train", resume_from.name, step, args.max_steps, out)
        return TrainResult(out, step, resume_from, out)
    if resumed is not None:
        check_resume(cfg, resumed, args, source)
    dataset = check_inputs(cfg, checked.init_kwargs, source)  # every row checked before the model loads
    inputs = inputs_record(resume_from.parent if resume_from is not None else out,
                           input_hashes(dataset, reward_funcs, cfg.model.model_name_or_path, args),
                           step if resume_from is not None else None, accept is not None, source,
                           flag=accept or ACCEPT_CHANGED_FLAG)

    eval_dataset = eval_rows(cfg, args)  # trl grpo's dataset_test_split, under eval_strategy
    from ictrl.train_cli.model_init import tokenizer_and_config

    tokenizer, text_config = tokenizer_and_config(cfg, checked.init_kwargs, source)
    dataset = train_rows(cfg, dataset, tokenizer, text_config, args, source)  # a row that cannot fit: before weights
    model, tokenizer = _model_and_tokenizer(cfg, checked.init_kwargs, tokenizer.chat_template)
    with reported_write(out, lambda: rerun_advice(out)):
        out.mkdir(parents=True, exist_ok=True)
        # checked before the lock: ictrl's own (an older ictrl's checkpoints, unlisted until now, listed here too)
        claim_files(out, [*RUN_FILES, *(p.name for p in own_checkpoints(out, earlier_run))])
        save_config(cfg, out / "config.yaml")
        write_run_labels(out, args, cfg.method_from, inputs)

    _, trainer_cls = trainer_classes()
    trainer = trainer_cls(
        model=model, reward_funcs=reward_funcs, args=args, train_dataset=dataset, processing_class=tokenizer,
        peft_config=checked.lora, eval_dataset=eval_dataset,
    )
    trainer.command = command  # for the model card
    add_run_callbacks(trainer, cfg, reward_funcs, tokenizer, out, callbacks)
    if resume_from is not None:
        log.warning("resuming from %s", resume_from)
        if getattr(model.config, "tie_word_embeddings", False):
            hide_tied_head_note()
        if 0 < args.max_steps <= step:
            log.warning("--resume: %s is at step %d, max_steps is %d: no step left to train; writing %s from it",
                        resume_from.name, step, args.max_steps, out)
    add_stop_callback(trainer, stop, out)
    _train(trainer, args, out, resume_from, resume_command)
    if stop.received and trainer.state.global_step < trainer.state.max_steps:
        raise stopped(out, trainer.state.global_step, resume_command, Terminated)
    note_short_run(trainer.state.global_step, trainer.state.max_steps, out)

    save_final(trainer, out / f"{STAGING_PREFIX}final", out)
    with reported_write(out, lambda: rerun_advice(out)):
        trainer.create_model_card()
    return TrainResult(out, trainer.state.global_step, resume_from, out)


def _model_and_tokenizer(cfg: RunConfig, init_kwargs: dict[str, Any], template: str | None) -> tuple[Any, Any]:
    """The model and its tokenizer as ``trl grpo`` loads them; with ``chat_template_path``, the tokenizer keeps
    ``template``, the one the rows were checked with (saved with the model)."""
    from ictrl.models import load_model_and_tokenizer

    # dtype auto is the checkpoint's dtype on CPU too, as trl grpo's from_pretrained reads it
    model, tokenizer = load_model_and_tokenizer(cfg.model.model_name_or_path, float32_on_cpu=False, **init_kwargs)
    # the weights' real dtype: the precision line before the load could only read it from the keys (auto on a GPU
    # is the checkpoint's)
    dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in model.parameters() if p.is_floating_point()})
    log.info("%s loaded: its weights in %s", cfg.model.model_name_or_path, ", ".join(dtypes) or "integers")
    if cfg.script.chat_template_path:
        tokenizer.chat_template = template
    return model, tokenizer


def _train(trainer: Any, args: Any, out: Path, resume_from: Path | None, resume_command: str | None) -> None:
    """``trainer.train()``, from ``resume_from`` when given. A stop request ends it quietly; Ctrl-C, a run stop, a
    lost vLLM server or a divergence ends it with one line naming the checkpoint to continue from."""
    from ictrl.train_cli.callbacks import StopNow

    try:
        trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
    except KeyboardInterrupt:
        raise stopped(out, trainer.state.global_step, resume_command) from None
    except StopNow:
        pass
    except RunStop as exc:  # a reward the run cannot train on, no learning signal: the step, then how to go on
        kind = Terminated if isinstance(exc, RewardAbandoned) else type(exc)
        what = "terminated (SIGTERM)" if kind is Terminated else "stopped"
        raise kind(f"{exc}; {stopped(out, trainer.state.global_step, resume_command, what=what)}") from None
    except OSError as exc:  # TRL's client lost the vLLM server (vllm_mode=server): one line, then --resume
        if type(exc).__module__.split(".")[0] != "requests":
            raise
        url = args.vllm_server_base_url or f"http://{args.vllm_server_host}:{args.vllm_server_port}"
        kept = stopped(out, trainer.state.global_step, resume_command)
        raise UserError(f"vLLM server {url} stopped answering ({type(exc).__name__}); {kept}") from None
    except (ValueError, RuntimeError) as exc:  # divergence, a selector's sys.exit: one line, then --resume
        failure = run_failure(exc, out, trainer.state.global_step, resume_command, args.learning_rate)
        if failure is None:
            raise
        raise failure from exc
