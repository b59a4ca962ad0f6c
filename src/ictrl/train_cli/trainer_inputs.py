"""What ``ictrl train`` builds its trainer from, checked before anything heavy loads: the trainer arguments, the
model's ``from_pretrained`` kwargs, the LoRA config, the reward functions and the training rows
(:class:`TrainerInputs`), with the checks only the command makes.

Each value's own type, range and choices are checked once, by the field that declares it, when the config is
built: TRL's parser and ``ScriptArguments`` / ``ModelConfig`` (``ictrl.train_cli.run_config``), ``ICTGRPOConfig``
(``ictrl.engine.config``, ``ictrl.engine.config_fields``), the same checks a Python user gets. What is left needs
the command: the machine (fp16 on CPU, vLLM installed, the hub), the processes (a generation batch's memory on each),
files (reward modules, data sources, the model's files and architecture, every training row), the output directory
(``ictrl.train_cli.output_dir``: writable, none of the run's inputs among what it writes, its checkpoints against
``--resume``, no earlier run without ``--overwrite``), checkpoints at buffer boundaries, a learning rate that trains
(0 only with ``--allow-no-op``) and what ``ictrl train`` gives the trainer (no eval data).

:func:`build_trainer_inputs` is the one entry point, in stages: ``--print-config`` stops after the values (no file
read but the config); ``ictrl.train_cli.run.train`` goes on to the command's checks, then under its lock reads the
inputs (:func:`check_inputs`) and, once the tokenizer is loaded, keeps the rows that fit (:func:`train_rows`); the
parent of a launch (:func:`check_before_launch`) makes them all for the processes it is about to start. What needs the
checkpoint a resume picks (``engine.resumable.resume_point``, ``exact_resume.check_unchanged``, ``run_inputs``'
``inputs_record``) stays with the run, under its lock. Each failure is one :class:`ConfigError` / ``DataError``
line naming the file or the flag and the key.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
from pathlib import Path
from typing import Any, Callable

import torch

from ictrl.checkpoints import check_weights
from ictrl.engine.resumable import check_resumable
from ictrl.engine.trl_args import cpu_kernel_problem, launch_precision, run_precision
from ictrl.errors import quote, shorten
from ictrl.train_cli import model_init
from ictrl.train_cli.process_group import answered_once
from ictrl.train_cli.output_dir import checked_output_dir, existing_checkpoints
from ictrl.train_cli.run_config import INIT_KWARGS, ConfigError, RunConfig
from ictrl.train_cli.run_guard import NO_OP_FLAG
from ictrl.train_cli.run_inputs import (blame, check_enough_rows, check_sources, drop_long_prompts,
                                        load_train_dataset, name_the_key, reward_functions, trl_dataset)

log = logging.getLogger("ictrl.train")

# Token ids held for one generation batch on one process. At ~40 bytes per token across the batch's tensors (int64
# ids and masks, float32 log-probs, advantages and selection statistics) 2**25 tokens is ~1.3 GiB of buffers before
# any activation; a batch past it is a typo (an extra zero) far more often than a plan. ICTRL_MAX_BATCH_TOKENS
# raises it.
MAX_BATCH_TOKENS = 1 << 25


@dataclasses.dataclass
class TrainerInputs:
    """What the checks hand the run: the trainer arguments, the model's ``from_pretrained`` kwargs, the LoRA config
    (None without ``use_peft``) and the reward functions (empty after ``--print-config``'s values-only checks)."""

    args: Any
    init_kwargs: dict[str, Any]
    lora: Any = None
    reward_funcs: list[Callable[..., Any]] = dataclasses.field(default_factory=list)


def build_trainer_inputs(cfg: RunConfig, source: str = "<config>", flags: dict[str, Any] | None = None, *,
                         processes: int | None = None, cpu: bool | None = None,
                         values_only: bool = False) -> TrainerInputs:
    """``ictrl train``'s checks of ``cfg`` in order, nothing loaded. ``flags``: the command-line overrides by key
    (errors blame the flag that set a key). ``processes``: check for a run on that many (default: this run's);
    ``cpu``: as :func:`build_trainer_args`.

    1. the values: the trainer arguments (:func:`trainer_args`) and the model's load kwargs; ``values_only``
       (``--print-config``) stops here;
    2. the command: LoRA's package, the reward functions, the data sources, ``output_dir``
       (``output_dir.checked_output_dir``, which makes ``args.output_dir`` the absolute path the run writes to);
       then the machine: the hub for ``push_to_hub``, vLLM installed.

    What reads the output directory's checkpoints and the inputs comes after, under the run's lock
    (``ictrl.train_cli.run``), or in the parent of a launch (:func:`check_before_launch`)."""
    from ictrl.engine.config import planned_processes

    with planned_processes(processes) if processes is not None else contextlib.nullcontext():
        args = trainer_args(cfg, source, flags, cpu)
    checked = TrainerInputs(args, model_init.load_kwargs(cfg, blame(INIT_KWARGS, source, flags)))
    if values_only:
        return checked
    checked.lora = model_init.peft_config(cfg, source)
    checked.reward_funcs = reward_functions(cfg, args, source, flags)
    check_sources(cfg, source, flags)
    args.output_dir = str(checked_output_dir(cfg, checked.reward_funcs, source, blame("output_dir", source, flags)))
    # last, the machine: an error in the file itself is named first, on any machine
    if args.push_to_hub:
        from ictrl.hub import hub_reachable, why_unreachable

        if not hub_reachable():
            raise ConfigError(f"{blame('push_to_hub', source, flags)}: push_to_hub: {why_unreachable()}; "
                              "push the final model later with `hf upload`")
    if args.use_vllm:
        from ictrl.vllm_env import require_installed

        require_installed(f"{blame('use_vllm', source, flags)}: use_vllm")  # as the trainer does, after the model loads
    return checked


def check_before_launch(cfg: RunConfig, processes: int, resume: bool | str = False, source: str = "<config>",
                        flags: dict[str, Any] | None = None) -> None:
    """The checks ``ictrl.train_cli.run.train`` makes before the model loads, for a run on ``processes``
    processes, made by the parent of the launch before it starts any (``ictrl.train_cli.launch``). On the CPU, so
    the parent holds no GPU memory the processes need (the device-specific checks are left to them), and without
    writing to ``output_dir``. Raises :class:`ConfigError` / ``DataError`` as the run would."""
    quiet = log.level
    log.setLevel(logging.ERROR)  # the CPU note and warnings are the processes' to log, once, from rank 0
    try:
        checked = build_trainer_inputs(cfg, source, flags, processes=processes, cpu=True)
        existing_checkpoints(cfg, resume, source)
        check_enough_rows(check_inputs(cfg, checked.init_kwargs, source), checked.args, source)
    finally:
        log.setLevel(quiet)


# --- the values --------------------------------------------------------------------------------------------------


def trainer_classes() -> tuple[type, type]:
    """(ICTGRPOConfig, ICTGRPOTrainer), imported lazily: TRL takes seconds to import and config errors come first."""
    from ictrl.engine.config import ICTGRPOConfig
    from ictrl.engine.trainer import ICTGRPOTrainer

    return ICTGRPOConfig, ICTGRPOTrainer


@functools.lru_cache(maxsize=None)
def _note_cpu(precision: str) -> None:
    """Log the CPU run's precision once per process (a grid builds the trainer arguments once per run)."""
    log.warning("no CUDA device: training on CPU in %s", precision)


SHORT_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


@functools.lru_cache(maxsize=None)
def _note_precision(precision: str) -> None:
    """Log a GPU run's precision once per process."""
    log.info("training in %s", precision)


@functools.lru_cache(maxsize=None)
def _note_processes(count: int, simple_launch: bool) -> None:
    """Log the run's process count once per process; a single process started by ``accelerate launch`` without a
    config file (its simple launcher, which runs one process whatever ``--num_processes`` says) is named."""
    if count == 1 and simple_launch:
        log.info("1 process: accelerate launch without a config file (or --multi_gpu) runs the script once, whatever "
                 "--num_processes says; ictrl train --num-processes N starts N (gloo on CPU), as does accelerate "
                 "launch --config_file configs/accelerate/ddp.yaml")
    else:
        log.info("%d process%s", count, "" if count == 1 else "es (data parallel)")


def weights_dtype(cfg: RunConfig) -> tuple[str, str] | None:
    """(dtype, the key that set it) of the weights the run loads (``ictrl.models.load_model_and_tokenizer``), for
    the precision line: ``model_init_kwargs.dtype``, else ``dtype``; ``auto`` is the checkpoint's own, on CPU as on
    a GPU (as ``trl grpo`` loads it), read where ``from_pretrained`` reads it first, a local ``config.json``'s
    ``dtype`` (None: not known before the weights load, nor for a quantized model, whose weights are the
    quantizer's)."""
    raw = cfg.trainer.get(INIT_KWARGS) or {}
    if cfg.model.load_in_4bit or cfg.model.load_in_8bit or raw.get("quantization_config") is not None:
        return None
    key, dtype = ((f"{INIT_KWARGS}.dtype", raw["dtype"]) if raw.get("dtype") is not None
                  else ("dtype", cfg.model.dtype))
    if dtype in (None, "auto"):  # else the line after the load names the weights' real dtype
        saved = _saved_dtype(cfg.model.model_name_or_path)
        return (saved, f"{key}: auto, the checkpoint's") if saved is not None else None
    return (str(dtype), key) if dtype in model_init.DTYPES else None


def _saved_dtype(model: str | None) -> str | None:
    """The dtype a local checkpoint's ``config.json`` records (``dtype``, or transformers 4's ``torch_dtype``),
    when it is one of ``model_init.DTYPES``; None for a hub id or an unreadable file (the model load says why)."""
    import json

    path = Path(model or "") / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (OSError, ValueError, RecursionError):
        return None
    saved = config.get("dtype", config.get("torch_dtype")) if isinstance(config, dict) else None
    return saved if saved in model_init.DTYPES and saved != "auto" else None


def build_trainer_args(cfg: RunConfig, source: str = "<config>", cpu: bool | None = None,
                       flags: dict[str, Any] | None = None) -> Any:
    """The trainer's config object from the run config's top-level keys; every field checks its own value. On a
    machine without CUDA sets ``use_cpu`` and the precision and logs it; ``use_vllm`` is honoured (vLLM's CPU build
    runs too). Errors name the key, and the flag (``flags``: the command-line overrides by key) when one set it."""
    config_cls, _ = trainer_classes()
    kwargs = dict(cfg.trainer)
    # ictrl train loads the model with model_init_kwargs itself (ictrl.train_cli.model_init); TRL would only warn
    # that they are ignored for a model passed in loaded.
    kwargs.pop("model_init_kwargs", None)
    cpu = not torch.cuda.is_available() if cpu is None else cpu
    if cpu and (kernel := cpu_kernel_problem()) is not None:  # TRL 1.15 on CPU: one line, not its traceback
        raise ConfigError(f"{source}: {kernel}")
    if cpu:  # bf16 as written runs (AMX/AVX-512 CPUs compute it natively); unset, it is TRL's GPU default: fp32
        if kwargs.get("fp16"):
            raise ConfigError(f"{blame('fp16', source, flags)}: fp16: accelerate's fp16 mixed precision needs a GPU; "
                              "on CPU use bf16: true or neither")
        kwargs.update(use_cpu=True, fp16=False, bf16=bool(kwargs.get("bf16", False)))
    try:
        args = config_cls(**kwargs)
    except (ValueError, TypeError) as exc:  # ICTGRPOConfig / TRL messages name the field, which is the key
        message = name_the_key(str(exc), kwargs, config_cls)
        raise ConfigError(f"{blame(message, source, flags)}: {shorten(message)}") from None
    # the trainer checks this after TRL's own checks (whose errors a TRL user catches); here, before the model loads
    from ictrl.engine.config_fields import check_liger

    check_liger(args.use_liger_kernel)
    # the precision the Trainer's Accelerator gets (args.mixed_precision): the config's bf16/fp16, else what a
    # launcher set; unlaunched, what trl grpo's own accelerate launch would set, not the shell's variable
    precision, why = run_precision(args)
    if (by_launch := launch_precision()) is not None and not (args.bf16 or args.fp16):
        args.mixed_precision = by_launch[0]
        precision, why = run_precision(args)[0], by_launch[1] or run_precision(args)[1]
    weights = weights_dtype(cfg)
    if weights is not None and weights[0] != "float32" and precision == "fp32":  # no autocast: the weights' dtype
        precision, why = SHORT_DTYPES[weights[0]], f"the model's weights load in {weights[0]} ({weights[1]}); {why}"
    (_note_cpu if cpu else _note_precision)(f"{precision} ({why})")
    # accelerate's simple launcher sets ACCELERATE_USE_CPU and no WORLD_SIZE; its multi-process launchers set both
    # (ictrl train --num-processes 1 goes through it too, and marks its processes with REPORTED_FILE_ENV)
    from ictrl.engine.config import process_count
    from ictrl.errors import REPORTED_FILE_ENV

    simple = "ACCELERATE_USE_CPU" in os.environ and not {"WORLD_SIZE", REPORTED_FILE_ENV} & set(os.environ)
    _note_processes(process_count(), simple)
    return args


def trainer_args(cfg: RunConfig, source: str = "<config>", flags: dict[str, Any] | None = None,
                 cpu: bool | None = None) -> Any:
    """:func:`build_trainer_args`, then what the arguments ask of the command: a learning rate that trains
    (:func:`check_trains`), what the trainer the command builds needs (:func:`check_trainer_inputs`), one
    generation batch's memory on each of the run's processes (:func:`check_memory`) and checkpoints where the
    generation buffer is empty (``resumable.check_resumable``)."""
    from ictrl.engine.config import process_count

    args = build_trainer_args(cfg, source, cpu=cpu, flags=flags)
    check_trains(cfg, args, source, flags)
    check_trainer_inputs(args, source, flags, cfg)
    try:
        check_memory(args, cfg, source, process_count())
        check_resumable(args, source)
    except ConfigError as exc:  # the checks name the key after ``source``: a flag that set the key is blamed
        message = str(exc)
        where = blame(message, source, flags)
        if where == source or not message.startswith(f"{source}: "):
            raise
        raise ConfigError(f"{where}: {message[len(source) + 2:]}") from None
    return args


def max_batch_tokens() -> int:
    """The bound of :func:`check_memory`: ``ICTRL_MAX_BATCH_TOKENS`` when set, else :data:`MAX_BATCH_TOKENS`."""
    raw = os.environ.get("ICTRL_MAX_BATCH_TOKENS", "").strip()
    if not raw:
        return MAX_BATCH_TOKENS
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"ICTRL_MAX_BATCH_TOKENS: expected an integer, got {quote(raw)}") from None


def check_memory(args: Any, cfg: RunConfig, source: str, processes: int) -> None:
    """Completions of one generation batch on one process x their longest length, against
    :func:`max_batch_tokens`. The prompt part is ``max_prompt_length`` (not counted when it is null)."""
    per_process = args.generation_batch_size // max(processes, 1)
    prompt = cfg.script.max_prompt_length or 0
    tokens = per_process * (prompt + args.max_completion_length)
    bound = max_batch_tokens()
    if tokens > bound:
        prompt_part = f"max_prompt_length {prompt} + " if prompt else ""
        raise ConfigError(
            f"{source}: generation batch too large: {per_process} completions per process (generation_batch_size "
            f"{args.generation_batch_size} / {processes} process(es)) x ({prompt_part}max_completion_length "
            f"{args.max_completion_length}) tokens = {tokens} tokens, over the bound of {bound} tokens per process "
            "(ICTRL_MAX_BATCH_TOKENS raises it); lower num_generations, per_device_train_batch_size, "
            "steps_per_generation, prompts_per_step or the lengths")


def check_trains(cfg: RunConfig, args: Any, source: str = "<config>", flags: dict[str, Any] | None = None) -> None:
    """``learning_rate`` 0 leaves every weight as it is: refused as ``max_steps: 0`` is, unless the command names
    the no-op (``--allow-no-op``: rollouts and rewards of the base model)."""
    if args.learning_rate == 0 and NO_OP_FLAG not in cfg.modes:
        raise ConfigError(f"{blame('learning_rate', source, flags)}: learning_rate: 0 trains nothing (the model "
                          f"would stay the base model, bit for bit); set a learning_rate > 0, or pass {NO_OP_FLAG} "
                          "to run rollouts and rewards without changing it")


# --- the command -------------------------------------------------------------------------------------------------


def check_trainer_inputs(args: Any, source: str = "<config>", flags: dict[str, Any] | None = None,
                         cfg: RunConfig | None = None) -> None:
    """What the trainer that ``ictrl train`` builds needs beyond its config: benchmarks ``eval_benchmarks`` names
    (the command builds their evaluation), eval data for ``eval_strategy`` (as ``trl grpo``: the
    ``dataset_test_split`` of a dataset directory, hub id, data file or ``datasets`` mixture; an ictrl.data source
    has none), a streamed dataset's keys and length. (The hub ``push_to_hub`` needs is the machine's:
    :func:`build_trainer_inputs` asks last.)"""
    from ictrl import data

    for i, spec in enumerate(args.eval_benchmarks or []):  # the library keeps the names; the command resolves them
        try:
            data.parse_spec(spec)
        except ValueError as err:
            raise ConfigError(f"{blame('eval_benchmarks', source, flags)}: eval_benchmarks[{i}]: {err}") from None
    strategy = getattr(args.eval_strategy, "value", args.eval_strategy)
    if strategy != "no" and (cfg is None or not trl_dataset(cfg)):
        raise ConfigError(f"{blame('eval_strategy', source, flags)}: eval_strategy: {strategy!r} needs eval data: "
                          "as in trl grpo, the dataset_test_split of a dataset directory, hub id, data file or "
                          "datasets mixture; an ictrl.data source has none: evaluation during training is "
                          "eval_benchmarks (pass@k every eval_steps)")
    if cfg is not None and (cfg.script.dataset_streaming or cfg.script.streaming):
        from ictrl.train_cli.trl_data import streamed

        key = "dataset_streaming" if cfg.script.dataset_streaming else "streaming"
        if not trl_dataset(cfg):
            raise ConfigError(f"{blame(key, source, flags)}: {key}: streams data trl grpo reads (a dataset directory, "
                              "hub id, data file or datasets mixture); an ictrl.data source is read whole")
        if not streamed(cfg.script):  # as trl grpo: the mixture reads streaming, dataset_name dataset_streaming
            right = "streaming" if key == "dataset_streaming" else "dataset_streaming"
            raise ConfigError(f"{blame(key, source, flags)}: {key}: does not apply to "
                              f"{'the datasets mixture' if cfg.script.datasets else 'dataset_name'}; use {right}")
        if args.max_steps <= 0:
            raise ConfigError(f"{blame('max_steps', source, flags)}: max_steps: a streamed dataset has no length, so "
                              f"the run's length is max_steps (TRL requires it too): set max_steps with {key}")


# --- the inputs --------------------------------------------------------------------------------------------------


def check_inputs(cfg: RunConfig, init_kwargs: dict[str, Any], source: str = "<config>") -> Any:
    """The model path and its files, its context and architecture options (no weights read), then every training
    row: returns the training dataset (``run_inputs.load_train_dataset``)."""
    from ictrl.hub import check_model

    check_model(cfg.model.model_name_or_path, "model_name_or_path", bool(init_kwargs.get("trust_remote_code")))
    damaged = answered_once(lambda: check_weights(cfg.model.model_name_or_path), f"{source}: model_name_or_path",
                            per_node=True)
    if damaged is not None:
        raise ConfigError(f"{source}: model_name_or_path: {cfg.model.model_name_or_path}: {damaged}; the model "
                          "directory is damaged")
    model_init.check_architecture(cfg, init_kwargs, source)
    return load_train_dataset(cfg)


def train_rows(cfg: RunConfig, dataset: Any, tokenizer: Any, model_config: Any, args: Any,
               source: str = "<config>") -> Any:
    """The training rows as the trainer gets them, once the tokenizer is loaded: prompts longer than
    ``max_prompt_length`` dropped (without it, one that cannot fit the model's positions beside
    ``max_completion_length`` refused), one generation batch of prompts left at least."""
    from ictrl.train_cli.trl_data import check_stream, streamed

    positions = getattr(model_config, "max_position_embeddings", None)
    if not (trl_dataset(cfg) and streamed(cfg.script)):
        check_chat_template(dataset, tokenizer, cfg, source)
        dataset = drop_long_prompts(dataset, tokenizer, cfg.script.max_prompt_length,
                                    positions, args.max_completion_length,
                                    source, str(cfg.script.dataset_name))
        check_enough_rows(dataset, args, source)
        return dataset
    # a stream: each row checked as the run reads it
    name = "datasets" if cfg.script.datasets else f"dataset_name {shorten(str(cfg.script.dataset_name), 200)}"
    return check_stream(dataset, tokenizer, f"{source}: {name}", cfg.script.max_prompt_length, positions,
                        args.max_completion_length)


def check_chat_template(dataset: Any, tokenizer: Any, cfg: RunConfig, source: str = "<config>") -> None:
    """Chat-message prompts need the tokenizer's chat template: without one (a base model), one line naming the
    first such row and ``chat_template_path``, before the model loads (TRL fails in its first generation)."""
    if getattr(tokenizer, "chat_template", None):
        return
    row = next((i for i, prompt in enumerate(dataset["prompt"]) if not isinstance(prompt, str)), None)
    if row is not None:
        from ictrl.errors import DataError

        raise DataError(f"{source}: dataset_name {shorten(str(cfg.script.dataset_name), 200)}: row {row}: the prompt "
                        f"is a list of chat messages, and the tokenizer of {cfg.model.model_name_or_path} has no chat "
                        "template to render it; set chat_template_path (a .jinja file, or a tokenizer folder or hub "
                        "id whose template to use), or give plain-text prompts")
