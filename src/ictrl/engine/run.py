"""``ictrl train``'s body: run config -> trainer arguments, rewards, model, data -> ICTGRPOTrainer.train().

Everything that can be wrong with the config is checked (``build_trainer_args``, ``build_rewards``,
``check_sources``, ``ictrl.preflight.check_model``) and every training row is read (``load_train_dataset``)
before the model loads.

Checkpoints and resume: ``ictrl.engine.resumable`` (the trainer hooks) and ``ictrl.checkpoints`` (the files).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import functools
import importlib
import logging
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from ictrl.checkpoints import (STAGING_PREFIX, check_weights, clear_staging, complete_checkpoints, finished_run,
                               trainer_state)
from ictrl.cliargs import VERBOSE_ENV, env_flag
from ictrl.engine.resumable import (check_resumable, check_unchanged, make_trainer_class, resume_point,
                                   save_final, verified_checkpoints)
from ictrl.engine.run_config import ConfigError, RunConfig, config_to_dict, save_config
from ictrl.engine.run_guard import RunLock, StopRequest, add_stop_callback, stopped
from ictrl.engine.value_checks import check_memory, check_output_dir
from ictrl.errors import Terminated, UserError, quote, shorten
from ictrl.files import reported_write

log = logging.getLogger("ictrl.train")



def trainer_classes() -> tuple[type, type]:
    """(ICTGRPOConfig, ICTGRPOTrainer), imported lazily: TRL takes seconds to import and config errors come first."""
    from ictrl.engine.config import ICTGRPOConfig
    from ictrl.engine.trainer import ICTGRPOTrainer

    return ICTGRPOConfig, ICTGRPOTrainer


# --- config -> trainer arguments ------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _note_cpu(precision: str) -> None:
    """Log the CPU run's precision once per process (a grid builds the trainer arguments once per run)."""
    log.warning("no CUDA device: training on CPU in %s", precision)


def blame(message: str, source: str, flags: dict[str, Any] | None) -> str:
    """Where a trainer-config error comes from: the command-line flag whose key the message names (``override
    --learning_rate=-1``), else ``source`` (the config file)."""
    import re

    for key, value in (flags or {}).items():
        if re.search(rf"(?<![\w.]){re.escape(key)}(?!\w)", message):
            return f"override --{key}={shorten(str(value), 100)}"
    return source


def build_trainer_args(cfg: RunConfig, source: str = "<config>", cpu: bool | None = None,
                       flags: dict[str, Any] | None = None) -> Any:
    """The trainer's config object from the run config's top-level keys. On a machine without CUDA sets
    ``use_cpu`` and the precision and logs it; ``use_vllm`` is honoured (vLLM's CPU build runs too). Errors name the key, and the flag (``flags``: the command-line overrides by key) when one set it."""
    config_cls, _ = trainer_classes()
    kwargs = dict(cfg.trainer)
    # ictrl train loads the model with model_init_kwargs itself (ictrl.engine.model_init); TRL would only warn
    # that they are ignored for a model passed in loaded.
    kwargs.pop("model_init_kwargs", None)
    cpu = not torch.cuda.is_available() if cpu is None else cpu
    if cpu:  # bf16 as written runs (AMX/AVX-512 CPUs compute it natively); unset, it is TRL's GPU default: fp32
        if kwargs.get("fp16"):
            raise ConfigError(f"{blame('fp16', source, flags)}: fp16: accelerate's fp16 mixed precision needs a GPU; "
                              "on CPU use bf16: true or neither")
        kwargs.update(use_cpu=True, fp16=False, bf16=bool(kwargs.get("bf16", False)))
        _note_cpu("bf16" if kwargs["bf16"] else "fp32 (bf16 not set; TRL's default bf16=True assumes a GPU)")
    try:
        args = config_cls(**kwargs)
    except (ValueError, TypeError) as exc:  # ICTGRPOConfig / TRL messages name the field, which is the key
        raise ConfigError(f"{blame(str(exc), source, flags)}: {shorten(str(exc))}") from None
    try:
        from ictrl.engine.config import process_count

        check_memory(args, cfg, source, process_count())
        check_resumable(args, source)
    except ConfigError as exc:  # the checks name the key after ``source``: a flag that set the key is blamed
        message = str(exc)
        where = blame(message, source, flags)
        if where == source or not message.startswith(f"{source}: "):
            raise
        raise ConfigError(f"{where}: {message[len(source) + 2:]}") from None
    return args


# --- rewards ---------------------------------------------------------------------------------------------------

# trl grpo's reward names (trl/scripts/grpo.py), with the values it uses.
TRL_REWARDS = ("accuracy_reward", "reasoning_accuracy_reward", "think_format_reward", "get_soft_overlong_punishment")


def _trl_reward(name: str) -> Callable[..., Any]:
    import trl.rewards

    if name == "get_soft_overlong_punishment":
        return trl.rewards.get_soft_overlong_punishment(max_completion_len=1280, soft_punish_cache=256)
    return getattr(trl.rewards, name)


def build_rewards(cfg: RunConfig, source: str = "<config>", gold_column: str = "answer") -> list[Any]:
    """TRL reward functions for ``reward_model_name_or_path`` (a model id or path, as TRL takes it) and
    ``reward_funcs``: ``verifiable`` (each row's ``kind`` column picks the math, gsm8k or choice reward: the
    default), an ictrl registry name wrapped by ``ictrl.rewards.trl_reward``, one of ``trl grpo``'s names, or a
    ``module:function`` / dotted ``module.function`` with TRL's signature, imported as it is."""
    from ictrl import rewards

    out: list[Any] = [cfg.script.reward_model_name_or_path] if cfg.script.reward_model_name_or_path else []
    for i, name in enumerate(cfg.script.reward_funcs or ["verifiable"]):
        key = f"reward_funcs[{i}]"
        if name == "verifiable":
            out.append(rewards.trl_kind_reward(gold_column=gold_column, name="verifiable"))
        elif name in TRL_REWARDS:
            out.append(_trl_reward(name))
        elif ":" in name or "." in name:
            module, _, attr = name.partition(":") if ":" in name else name.rpartition(".")
            try:
                fn = getattr(importlib.import_module(module), attr)
            except (ImportError, AttributeError) as exc:
                raise ConfigError(f"{source}: {key}: cannot import {name!r}: {exc}") from None
            out.append(fn)
        elif name in rewards.REWARDS:
            gold = None if name == "format" else gold_column
            out.append(rewards.trl_reward(rewards.REWARDS[name], gold_column=gold, name=name))
        else:
            choices = ["verifiable", *sorted(rewards.REWARDS), *TRL_REWARDS]
            close = difflib.get_close_matches(name, choices, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{source}: {key}: unknown reward {name!r}; choose from {choices} or give "
                              f"module:function{hint}")
    return out


def add_overlong_penalty(cfg: RunConfig, args: Any, reward_funcs: list[Callable[..., Any]],
                         source: str = "<config>") -> None:
    """Append DAPO's soft overlong punishment (``trl.rewards.get_soft_overlong_punishment`` over
    ``max_completion_length`` with ``overlong_buffer_length``) after the verifier rewards, with weight
    ``overlong_penalty_factor`` appended to ``args.reward_weights`` (all 1 before it when unset)."""
    buffer = cfg.script.overlong_buffer_length
    if buffer is None:
        return
    if buffer >= args.max_completion_length:  # DAPO's formula still holds; worth a word (a smoke-test override)
        log.warning("%s: overlong_buffer_length=%d >= max_completion_length=%d: every completion gets an "
                    "overlong penalty", source, buffer, args.max_completion_length)
    from trl.rewards import get_soft_overlong_punishment

    weights = list(args.reward_weights) if args.reward_weights is not None else [1.0] * len(reward_funcs)
    if len(weights) != len(reward_funcs):
        raise ConfigError(f"{source}: reward_weights: {len(weights)} weights for {len(reward_funcs)} rewards "
                          "(reward_funcs); the overlong penalty's weight is overlong_penalty_factor")
    reward_funcs.append(get_soft_overlong_punishment(max_completion_len=args.max_completion_length,
                                                     soft_punish_cache=buffer))
    args.reward_weights = [*weights, float(cfg.script.overlong_penalty_factor)]


def reward_label(fn: Callable[..., Any] | str) -> str:
    """The name TRL logs a reward under (``rewards/NAME/mean``); a reward model's is its path's last part."""
    return fn.rstrip("/").split("/")[-1] if isinstance(fn, str) else getattr(fn, "__name__", type(fn).__name__)


# --- data ------------------------------------------------------------------------------------------------------


def check_sources(cfg: RunConfig, config: str = "<config>", flags: dict[str, Any] | None = None) -> None:
    """Every data source must be a registry spec (``math_train:levels=3,4,5``) or ``jsonl:PATH`` to a file. Errors
    name the flag that set the key (``flags``), else ``config``."""
    from ictrl import data

    if not cfg.script.sources():
        raise ConfigError(f"{blame('dataset_name', config, flags)}: dataset_name: required: an ictrl.data name "
                          "(gsm8k_train, math_train), jsonl:PATH, a list of them or a mapping name: weight")
    script, directory = cfg.script, trl_dataset(cfg)
    for key, set_to in (("dataset_config", script.dataset_config), ("dataset_train_split", script.dataset_train_split)):
        if set_to not in (None, "train") and not directory:
            raise ConfigError(f"{blame(key, config, flags)}: {key}: applies to a dataset directory (trl grpo's "
                              "dataset_name); an ictrl.data source takes its options in the name (NAME:hub_split=...)")
    train = [] if directory else script.sources()
    for key, names in (("dataset_name", train), ("eval_datasets", script.eval_datasets)):
        source = blame(key, config, flags)
        for name in names:
            try:
                _, path = data.parse_spec(name)
            except ValueError as exc:
                close = difflib.get_close_matches(name.split(":", 1)[0], list(data.BENCHMARKS), n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ConfigError(f"{source}: {key}: {quote(name)}: {shorten(str(exc), 300)}{hint}") from None
            if path is not None and not Path(path).is_file():
                raise ConfigError(f"{source}: {key}: {quote(name)}: file not found")


def trl_dataset(cfg: RunConfig) -> bool:
    """Whether ``dataset_name`` is a dataset directory, which ``trl grpo`` reads with ``datasets.load_dataset``."""
    name = cfg.script.dataset_name
    return isinstance(name, str) and Path(name).is_dir()


def load_train_dataset(cfg: RunConfig) -> Any:
    """The training ``datasets.Dataset`` from ``ictrl.data.to_trl_dataset`` (columns ``prompt`` as a chat turn,
    ``answer``, ``kind``, ``id``, ``benchmark``). Called before the model loads: a bad row, a byte that is not
    UTF-8 or an empty file is a :class:`ictrl.errors.DataError` naming the file and line at once."""
    from ictrl import data

    if trl_dataset(cfg):  # as trl grpo: load_dataset(dataset_name, name=dataset_config)[dataset_train_split]
        from datasets import load_dataset

        from ictrl.errors import DataError

        script = cfg.script
        try:
            rows = load_dataset(script.dataset_name, name=script.dataset_config)[script.dataset_train_split]
        except (ValueError, KeyError, FileNotFoundError) as exc:
            raise DataError(f"dataset_name: {script.dataset_name}: {shorten(str(exc), 300)}") from None
        if "prompt" not in rows.column_names:
            raise DataError(f"dataset_name: {script.dataset_name}: no 'prompt' column (TRL's GRPOTrainer reads it); "
                            f"columns: {rows.column_names}")
        return rows.select(range(min(len(rows), script.dataset_limit))) if script.dataset_limit else rows
    train, names, limit = cfg.script.dataset_name, cfg.script.sources(), cfg.script.dataset_limit
    if len(names) == 1:
        return data.to_trl_dataset(names[0], limit=limit)
    weights = list(train.values()) if isinstance(train, dict) else None
    return data.to_trl_dataset(names, limit=limit, weights=weights, seed=cfg.seed)


def drop_long_prompts(dataset: Any, tokenizer: Any, limit: int | None, max_positions: int | None = None,
                      completion_length: int = 0) -> Any:
    """``dataset`` minus prompts longer than ``limit`` tokens (``max_prompt_length``), with a warning naming
    the first rows dropped and their lengths. Without a limit, a prompt that cannot fit in the model's
    ``max_positions`` beside ``completion_length`` tokens is an error naming its row."""
    from ictrl.errors import DataError
    from ictrl.eval.precheck import longest_token

    room = max_positions - completion_length if limit is None and max_positions is not None else None
    cap, longest = limit if limit is not None else room, longest_token(tokenizer)
    lengths, bounds = [], set()
    for i, prompt in enumerate(dataset["prompt"]):
        text = _prompt_text(prompt, tokenizer)
        at_least = -(-len(text) // longest)  # no token is longer than the vocabulary's longest entry
        if cap is not None and at_least > cap:  # too long without tokenising it (a megabyte takes tens of s)
            lengths.append(at_least)
            bounds.add(i)
        else:
            lengths.append(len(tokenizer(text, add_special_tokens=False)["input_ids"]))

    def rows(idx: list[int]) -> str:
        shown = ", ".join(f"row {i} (id {shorten(str(dataset[i].get('id', i)), 80)}, "
                          f"{'at least ' if i in bounds else ''}"
                          f"{lengths[i]} tokens)" for i in idx[:3])
        return shown + (f" and {len(idx) - 3} more" if len(idx) > 3 else "")

    if limit is None:
        too_long = [i for i, n in enumerate(lengths) if room is not None and n > room]
        if too_long:
            raise DataError(f"dataset_name: {rows(too_long)}: longer than the {room} tokens the model's "
                            f"{max_positions} positions leave beside max_completion_length {completion_length}; "
                            "set max_prompt_length to drop such prompts")
        return dataset
    long = [i for i, n in enumerate(lengths) if n > limit]
    if long:
        log.warning("max_prompt_length=%d: dropping %d of %d prompts longer than that: %s", limit, len(long),
                    len(lengths), rows(long))
        keep = set(long)
        dataset = dataset.select([i for i in range(len(lengths)) if i not in keep])
    return dataset


def check_enough_rows(dataset: Any, args: Any, source: str = "<config>") -> None:
    """At least one generation batch of prompts: with fewer, the trainer's sampler yields nothing and the run
    would 'finish' at step 0."""
    from ictrl.errors import DataError

    prompts = args.generation_batch_size // args.num_generations
    if len(dataset) == 0:
        raise DataError(f"{source}: dataset_name: no training rows left (check dataset_limit and max_prompt_length)")
    if len(dataset) < prompts:
        raise DataError(f"{source}: dataset_name: {len(dataset)} prompts, fewer than the {prompts} of one generation "
                        f"batch ({args.generation_batch_size} completions / num_generations {args.num_generations}):"
                        " raise dataset_limit or lower the batch")


def _prompt_text(prompt: Any, tokenizer: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    return str(tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True))


# --- the run ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class TrainResult:
    output_dir: Path
    global_step: int
    resumed_from: Path | None
    final_model: Path


def existing_checkpoints(cfg: RunConfig, resume: bool | str, source: str = "<config>") -> list[Path]:
    """The complete checkpoints in ``output_dir``, oldest first; without ``resume`` there must be none (a fresh
    run does not start over another run's checkpoints), with ``resume=True`` there must be one (a misspelt
    output_dir does not train from step 0); ``resume="auto"`` takes either."""
    out = Path(cfg.output_dir)
    checkpoints = complete_checkpoints(out)
    if checkpoints and not resume:
        raise ConfigError(f"{source}: output_dir: {out} already holds {checkpoints[-1].name}; pass --resume "
                          "to continue it or choose another output_dir")
    if not checkpoints and resume is True:
        where = "holds no checkpoint" if out.is_dir() else "does not exist"
        raise ConfigError(f"{source}: --resume: output_dir {out} {where}; check the output_dir, or pass "
                          "--resume=auto to start from step 0 when there is nothing to resume")
    return checkpoints


def prepare_output_dir(cfg: RunConfig, resume: bool | str, source: str = "<config>", args: Any = None) -> Path | None:
    """The checkpoint to resume from (None: start fresh): the newest whose files verify, when it ends the run
    (``final/`` of its step is there), else the newest that resumes exactly (``resumable.resume_point``; without
    ``args``, the newest verified). Refuses to start over existing checkpoints."""
    out = Path(cfg.output_dir)
    checkpoints = existing_checkpoints(cfg, resume, source)
    clear_staging(out)
    if not resume or not checkpoints:
        return None
    verified = verified_checkpoints(checkpoints)
    if args is None:
        return verified[0] if verified else None
    if verified and finished_run(verified[0], args.max_steps):
        return verified[0]
    return resume_point(verified, args, source)


RUN_LABELS = "run.json"


def write_run_labels(out: Path, args: Any) -> None:
    """``run.json``: the method label and training seed of the run, resolved (``ictrl eval`` records them for
    ``ictrl table``; config.yaml holds the keys as written, where an unset seed or selector is a default)."""
    import json

    from ictrl.files import atomic_write_text
    from ictrl.core.selection import get_selector

    labels = {"method": get_selector(args.token_selector).label, "token_selector": args.token_selector,
              "seed": int(args.seed)}
    atomic_write_text(out / RUN_LABELS, json.dumps(labels, indent=1) + "\n")


@contextlib.contextmanager
def cpu_threads(args: Any) -> Iterator[None]:
    """torch's intra-op threads at ``args.cpu_threads`` for a CPU run (``use_cpu``), restored on exit: an
    in-process caller keeps its own count."""
    threads = torch.get_num_threads()
    if args.cpu_threads is not None and args.use_cpu:
        torch.set_num_threads(args.cpu_threads)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def skip_deepspeed_unless_imported() -> None:
    """accelerate asks "is this model a DeepSpeedEngine?" (``extract_model_from_parallel``, which TRL calls at
    start and on every save) by importing DeepSpeed whenever it is installed: ~0.3 s, and "Setting accelerator to
    CPU" on a machine without a GPU, in runs that use no DeepSpeed config. A DeepSpeedEngine can exist only once
    DeepSpeed is imported (a ZeRO run imports it to build the engine), so the question is answered "no" without
    the import until then, and as before after it."""
    import sys

    import accelerate.utils.other

    accelerate.utils.other.is_deepspeed_available = lambda: "deepspeed" in sys.modules


def _not_tied_head_note(record: logging.LogRecord) -> bool:
    return "missing keys in the checkpoint model loaded: ['lm_head.weight']" not in record.getMessage()


def hide_tied_head_note() -> None:
    """Drop transformers' "missing keys ... ['lm_head.weight']" warning on resume: a tied head is the embedding
    matrix, which a checkpoint stores once, so nothing is missing (``--verbose`` keeps the warning)."""
    if not env_flag(VERBOSE_ENV):
        logging.getLogger("transformers.trainer").addFilter(_not_tied_head_note)


def check_config(cfg: RunConfig, source: str = "<config>", flags: dict[str, Any] | None = None,
                 cpu: bool | None = None) -> tuple[Any, dict[str, Any], Any, list[Callable[..., Any]]]:
    """Every value of the config checked, nothing loaded: (trainer arguments, model loading kwargs, LoRA config
    or None, reward functions). ``cpu``: as :func:`build_trainer_args`."""
    from ictrl.engine import model_init

    args = build_trainer_args(cfg, source, cpu=cpu, flags=flags)
    if args.use_vllm:
        from ictrl.vllm_env import INSTALL_HINT, installed

        if not installed():
            raise ConfigError(f"{blame('use_vllm', source, flags)}: use_vllm: vLLM is not installed: {INSTALL_HINT}")
    init_kwargs = model_init.load_kwargs(cfg, source)
    lora = model_init.peft_config(cfg, source)
    reward_funcs = build_rewards(cfg, blame("reward_funcs", source, flags))
    add_overlong_penalty(cfg, args, reward_funcs, source)
    check_sources(cfg, source, flags)
    check_trainer_inputs(args, source, flags)
    check_output_dir(cfg.output_dir, blame("output_dir", source, flags))
    return args, init_kwargs, lora, reward_funcs


def check_trainer_inputs(args: Any, source: str = "<config>", flags: dict[str, Any] | None = None) -> None:
    """What the trainer that ``ictrl train`` builds needs beyond its config: eval data for ``eval_strategy`` (the
    trainer gets none), the hub for ``push_to_hub``."""
    from ictrl import preflight

    strategy = getattr(args.eval_strategy, "value", args.eval_strategy)
    if strategy != "no":
        raise ConfigError(f"{blame('eval_strategy', source, flags)}: eval_strategy: {strategy!r} needs eval data, "
                          "which ictrl train does not give the trainer; evaluation during training is eval_benchmarks "
                          "(pass@k every eval_steps)")
    if args.push_to_hub and not preflight.hub_reachable():
        raise ConfigError(f"{blame('push_to_hub', source, flags)}: push_to_hub: {preflight._why_unreachable()}; "
                          "push the final model later with `hf upload`")


def check_inputs(cfg: RunConfig, init_kwargs: dict[str, Any], source: str = "<config>") -> Any:
    """The model path and its architecture options (no weights read), then every training row: returns the
    training dataset (:func:`load_train_dataset`)."""
    from ictrl import preflight
    from ictrl.engine import model_init

    preflight.check_model(cfg.model.model_name_or_path, "model_name_or_path")
    damaged = check_weights(cfg.model.model_name_or_path)
    if damaged is not None:
        raise ConfigError(f"{source}: model_name_or_path: {cfg.model.model_name_or_path}: {damaged}; the model "
                          "directory is damaged")
    model_init.check_architecture(cfg, init_kwargs, source)
    return load_train_dataset(cfg)


def check_before_launch(cfg: RunConfig, processes: int, resume: bool | str = False, source: str = "<config>",
                        flags: dict[str, Any] | None = None) -> None:
    """The checks :func:`train` makes before the model loads, for a run on ``processes`` processes, made by the
    parent of the launch before it starts any (``ictrl.engine.launch``). On the CPU, so the parent holds no GPU
    memory the processes need (the device-specific checks are left to them), and without writing to
    ``output_dir``. Raises :class:`ConfigError` / ``DataError`` as :func:`train` would."""
    from ictrl.engine.config import planned_processes

    quiet = log.level
    log.setLevel(logging.ERROR)  # the CPU note and warnings are the processes' to log, once, from rank 0
    try:
        with planned_processes(processes):
            args, init_kwargs, _, _ = check_config(cfg, source, flags, cpu=True)
        existing_checkpoints(cfg, resume, source)
        check_enough_rows(check_inputs(cfg, init_kwargs, source), args, source)
    finally:
        log.setLevel(quiet)


def train(cfg: RunConfig, resume: bool | str = False, source: str = "<config>",
          callbacks: list[Any] | None = None, resume_command: str | None = None,
          flags: dict[str, Any] | None = None) -> TrainResult:
    """Run ``ictrl train``. Config errors surface before the model loads; the run holds ``output_dir``'s lock
    (:class:`ictrl.engine.run_guard.RunLock`) from before it reads a checkpoint there until it returns. Ctrl-C
    raises :class:`ictrl.errors.Interrupted` naming the step, the last checkpoint and ``resume_command``; SIGTERM
    stops at the end of the generation batch with a checkpoint (:class:`ictrl.engine.run_guard.StopRequest`) and
    raises :class:`ictrl.errors.Terminated` naming them."""
    args, init_kwargs, lora, reward_funcs = check_config(cfg, source, flags)
    stop = StopRequest()
    try:
        with stop, RunLock(cfg.output_dir, args), cpu_threads(args):
            return _train_locked(cfg, args, reward_funcs, resume, source, callbacks, init_kwargs, lora,
                                 resume_command, stop)
    except Terminated:
        if not stop.before_training:
            raise
        raise stopped(Path(cfg.output_dir), None, resume_command, Terminated) from None  # nothing new to save


def _train_locked(cfg: RunConfig, args: Any, reward_funcs: list[Callable[..., Any]], resume: bool | str, source: str,
                  callbacks: list[Any] | None, init_kwargs: dict[str, Any], lora: Any,
                  resume_command: str | None, stop: Any) -> TrainResult:
    resume_from = prepare_output_dir(cfg, resume, source, args)
    out, final = Path(cfg.output_dir), Path(cfg.output_dir) / "final"
    if resume_from is not None and finished_run(resume_from, args.max_steps):
        step = trainer_state(resume_from)["global_step"]
        log.warning("--resume: the run is complete: %s is at step %d (max_steps %d) and %s holds its model; "
                    "nothing to train", resume_from.name, step, args.max_steps, final)
        return TrainResult(out, step, resume_from, final)
    if resume_from is not None:
        check_unchanged(out / "config.yaml", config_to_dict(cfg), args, source)
    dataset = check_inputs(cfg, init_kwargs, source)  # every row checked before the model loads

    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from ictrl.engine.callbacks import MetricsJSONL, NoSignalWarning, RichProgress, StopNow
    from ictrl.models import load_model_and_tokenizer

    skip_deepspeed_unless_imported()
    model, tokenizer = load_model_and_tokenizer(cfg.model.model_name_or_path, **init_kwargs)
    dataset = drop_long_prompts(dataset, tokenizer, cfg.script.max_prompt_length,
                                getattr(model.config, "max_position_embeddings", None), args.max_completion_length)
    check_enough_rows(dataset, args, source)
    with reported_write(out, "free space and run again"):
        out.mkdir(parents=True, exist_ok=True)
        save_config(cfg, out / "config.yaml")
        write_run_labels(out, args)

    accuracy = reward_label(reward_funcs[0])
    _, trainer_cls = trainer_classes()
    trainer = make_trainer_class(trainer_cls)(
        model=model, reward_funcs=reward_funcs, args=args, train_dataset=dataset, processing_class=tokenizer,
        peft_config=lora,
    )
    for cb in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(cb)
    trainer.add_callback(MetricsJSONL(out / "metrics.jsonl", accuracy_reward=accuracy))
    trainer.add_callback(NoSignalWarning())
    if not args.disable_tqdm:  # the rich bar stands in for transformers' tqdm bar
        trainer.add_callback(RichProgress(accuracy_reward=accuracy))
    for cb in callbacks or []:
        trainer.add_callback(cb)
    if args.eval_benchmarks:
        from ictrl.engine.eval_callback import PassAtKCallback

        trainer.add_callback(PassAtKCallback.from_args(args, tokenizer).bind(trainer))
    if resume_from is not None:
        step = trainer_state(resume_from)["global_step"]
        log.warning("resuming from %s", resume_from)
        if getattr(model.config, "tie_word_embeddings", False):
            hide_tied_head_note()
        if 0 < args.max_steps <= step:
            log.warning("--resume: %s is at step %d, max_steps is %d: no step left to train; writing %s from it",
                        resume_from.name, step, args.max_steps, final)
    add_stop_callback(trainer, stop, out)
    try:
        trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
    except KeyboardInterrupt:
        raise stopped(out, trainer.state.global_step, resume_command) from None
    except StopNow:
        pass
    except OSError as exc:  # TRL's client lost the vLLM server (vllm_mode=server): one line, then --resume
        if type(exc).__module__.split(".")[0] != "requests":
            raise
        url = args.vllm_server_base_url or f"http://{args.vllm_server_host}:{args.vllm_server_port}"
        kept = stopped(out, trainer.state.global_step, resume_command)
        raise UserError(f"vLLM server {url} stopped answering ({type(exc).__name__}); {kept}") from None
    if stop.received and trainer.state.global_step < trainer.state.max_steps:
        raise stopped(out, trainer.state.global_step, resume_command, Terminated)

    save_final(trainer, out / f"{STAGING_PREFIX}final", final)
    return TrainResult(out, trainer.state.global_step, resume_from, final)
