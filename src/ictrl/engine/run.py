"""``ictrl train``'s body: run config -> trainer arguments, rewards, model, data -> ICTGRPOTrainer.train().

Everything that can be wrong with the config is checked (``build_trainer_args``, ``build_rewards``,
``check_sources``) before the model loads.

Checkpoints and resume (checked against transformers 5.23 / trl 1.16, see tests/engine/test_resume.py):

- ``Trainer._save_checkpoint`` writes ``checkpoint-N/`` file by file, in place: a kill mid-save leaves a
  directory that ``get_last_checkpoint`` would pick. :class:`ResumableMixin` makes it write into
  ``.staging-checkpoint-N/``, fsyncs the files, then renames the directory into place, so every
  ``checkpoint-N`` is complete.
- Trainer restores model, optimizer, scheduler, ``trainer_state.json`` and the python/numpy/torch RNG states,
  and skips the batches already consumed in the current epoch. The RNG is restored after the skip and before
  the first resumed step, so TRL's sampling (``model.generate`` draws from the global torch RNG) continues
  exactly.
- One gap: TRL's ``RepeatSampler`` (the prompt order) draws each epoch's permutation from a generator seeded
  once at construction, so a run resumed in epoch e > 0 would replay epoch 0's order. :class:`EpochRepeatSampler`
  derives epoch e's permutation from (seed, e), the same sequence TRL produces in an uninterrupted run.
- TRL buffers one generation batch for ``steps_per_generation x num_iterations`` micro-steps and does not save
  the buffer, so a checkpoint must fall on a buffer boundary: ``build_trainer_args`` checks ``save_steps``.
- Trainer stops at ``max_steps`` only after a step (``DefaultFlowCallback.on_step_end``). A run resumed from a
  checkpoint at ``max_steps`` that falls inside an epoch re-enters that epoch and trains one step too many
  (at an epoch boundary the epoch loop is empty). :meth:`ResumableMixin._run_epoch` skips the epoch when no
  step is left, and ``train`` returns at once when ``final/`` already holds the last checkpoint's step.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any, Callable

import torch

from ictrl.engine.run_config import ConfigError, RunConfig, config_to_dict, save_config

log = logging.getLogger("ictrl.train")

CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
STAGING_PREFIX = ".staging-"


def trainer_classes() -> tuple[type, type]:
    """(ICTGRPOConfig, ICTGRPOTrainer), imported lazily: TRL takes seconds to import and config errors come first."""
    from ictrl.engine.config import ICTGRPOConfig
    from ictrl.engine.trainer import ICTGRPOTrainer

    return ICTGRPOConfig, ICTGRPOTrainer


# --- config -> trainer arguments ------------------------------------------------------------------------------


def build_trainer_args(cfg: RunConfig, source: str = "<config>", cpu: bool | None = None) -> Any:
    """The trainer's config object from the run config's top-level keys. On a machine without CUDA sets
    ``use_cpu``, turns off bf16/fp16 and vLLM, and says so in the log. Errors name the key."""
    config_cls, _ = trainer_classes()
    kwargs = dict(cfg.trainer)
    cpu = not torch.cuda.is_available() if cpu is None else cpu
    if cpu:
        notes = ["use_cpu=True", "bf16=False"] + (["use_vllm=False"] if kwargs.get("use_vllm") else [])
        kwargs.update(use_cpu=True, bf16=False, fp16=False, use_vllm=False)
        log.warning("no CUDA device: training on CPU (%s)", ", ".join(notes))
    try:
        args = config_cls(**kwargs)
    except (ValueError, TypeError) as exc:  # ICTGRPOConfig / TRL messages name the field, which is the key
        raise ConfigError(f"{source}: {exc}") from None
    check_resumable(args, source)
    return args


def check_resumable(args: Any, source: str = "<config>") -> None:
    """A checkpoint must fall where TRL's generation buffer is empty (it is not saved)."""
    if args.save_strategy != "steps":
        return
    micro_per_buffer = args.steps_per_generation * args.num_iterations
    micro_per_save = int(args.save_steps) * args.gradient_accumulation_steps
    if micro_per_save % micro_per_buffer:
        raise ConfigError(
            f"{source}: save_steps: {args.save_steps} optimizer steps x gradient_accumulation_steps "
            f"{args.gradient_accumulation_steps} must be a multiple of steps_per_generation {args.steps_per_generation}"
            f" x num_iterations {args.num_iterations}: a checkpoint inside a generation buffer cannot resume exactly")


# --- rewards ---------------------------------------------------------------------------------------------------

def build_rewards(cfg: RunConfig, source: str = "<config>", gold_column: str = "answer") -> list[Callable[..., list[float]]]:
    """TRL reward functions for ``reward.names``: ``verifiable`` (each row's ``kind`` column picks the math,
    gsm8k or choice reward: the default), a registry name wrapped by ``ictrl.rewards.trl_reward``, or a
    ``module:function`` with TRL's signature, imported as it is."""
    from ictrl import rewards

    out = []
    for i, name in enumerate(cfg.reward.names or ["verifiable"]):
        key = f"reward.names[{i}]"
        if name == "verifiable":
            out.append(rewards.trl_kind_reward(gold_column=gold_column, name="verifiable"))
        elif ":" in name:
            module, _, attr = name.partition(":")
            try:
                fn = getattr(importlib.import_module(module), attr)
            except (ImportError, AttributeError) as exc:
                raise ConfigError(f"{source}: {key}: cannot import {name!r}: {exc}") from None
            out.append(fn)
        elif name in rewards.REWARDS:
            gold = None if name == "format" else gold_column
            out.append(rewards.trl_reward(rewards.REWARDS[name], gold_column=gold, name=name))
        else:
            choices = ["verifiable", *sorted(rewards.REWARDS)]
            close = difflib.get_close_matches(name, choices, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{source}: {key}: unknown reward {name!r}; choose from {choices} or give "
                              f"module:function{hint}")
    return out


def reward_label(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


# --- data ------------------------------------------------------------------------------------------------------


def check_sources(cfg: RunConfig, source: str = "<config>") -> None:
    """Every data source must be a registry spec (``math_train:levels=3,4,5``) or ``jsonl:PATH`` to a file."""
    from ictrl import data

    for key, names in (("data.train", cfg.data.source_names()), ("data.eval", cfg.data.eval)):
        for name in names:
            try:
                _, path = data.parse_spec(name)
            except ValueError as exc:
                close = difflib.get_close_matches(name.split(":", 1)[0], list(data.BENCHMARKS), n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ConfigError(f"{source}: {key}: {name!r}: {exc}{hint}") from None
            if path is not None and not Path(path).is_file():
                raise ConfigError(f"{source}: {key}: {name!r}: file not found")


def build_dataset(cfg: RunConfig, tokenizer: Any) -> Any:
    """The training ``datasets.Dataset`` from ``ictrl.data.to_trl_dataset`` (columns ``prompt`` as a chat
    turn, ``answer``, ``kind``, ``id``, ``benchmark``), minus prompts longer than ``data.max_prompt_length``."""
    from ictrl import data

    train = cfg.data.train
    names = list(train)
    if len(names) == 1:
        dataset = data.to_trl_dataset(names[0], limit=cfg.data.limit)
    else:
        weights = list(train.values()) if isinstance(train, dict) else None
        dataset = data.to_trl_dataset(names, limit=cfg.data.limit, weights=weights, seed=cfg.seed)
    limit = cfg.data.max_prompt_length
    if limit is not None:
        before = len(dataset)
        dataset = dataset.filter(lambda row: _prompt_tokens(row["prompt"], tokenizer) <= limit)
        if len(dataset) < before:
            log.warning("dropped %d of %d prompts longer than data.max_prompt_length=%d tokens",
                        before - len(dataset), before, limit)
    if len(dataset) == 0:
        raise ConfigError("data.train: no training rows left (check data.limit and data.max_prompt_length)")
    return dataset


def _prompt_tokens(prompt: Any, tokenizer: Any) -> int:
    if not isinstance(prompt, str):
        prompt = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    return len(tokenizer(prompt, add_special_tokens=False)["input_ids"])


# --- checkpoints -----------------------------------------------------------------------------------------------


def complete_checkpoints(output_dir: str | os.PathLike[str]) -> list[Path]:
    """``checkpoint-N`` directories holding a trainer state, oldest first."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir()
             if (m := CHECKPOINT_RE.match(p.name)) and (p / "trainer_state.json").is_file()]
    return [p for _, p in sorted(found)]


def _fsync_tree(root: Path) -> None:
    for path in sorted(root.rglob("*")):
        if path.is_file():
            with open(path, "rb") as fh:
                os.fsync(fh.fileno())
    fd = os.open(root, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish_dir(staging: Path, final: Path) -> None:
    """Make the fully written ``staging`` directory appear as ``final`` in one rename."""
    _fsync_tree(staging)
    if final.exists():
        shutil.rmtree(final)
    os.replace(staging, final)


class EpochRepeatSampler:
    """Wraps TRL's ``RepeatSampler`` so epoch e's prompt order depends only on (seed, e)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.inner)

    def __iter__(self) -> Any:
        if self.inner.shuffle:
            generator = torch.Generator()
            generator.manual_seed(self.inner.seed)
            for _ in range(self.epoch):  # TRL draws one permutation per epoch from one generator
                torch.randperm(self.inner.num_samples, generator=generator)
            self.inner.generator = generator
        return iter(self.inner)


def _restore_cpu_index(storage: Any, location: str) -> Any:
    """torch.load location handler for "cpu:N". Trainer maps optimizer states to ``args.device`` when
    world_size > 1, which on CPU processes (gloo) is "cpu:0", a location torch's own CPU handler refuses
    ("don't know how to restore data location"): without this, --resume fails on several CPU processes."""
    return storage if re.fullmatch(r"cpu:\d+", location) else None


torch.serialization.register_package(11, lambda obj: None, _restore_cpu_index)


class ResumableMixin:
    """Atomic checkpoint directories and epoch-exact prompt order; mixed in front of the trainer class."""

    def _get_train_sampler(self, dataset: Any = None) -> Any:
        sampler = super()._get_train_sampler(dataset)  # type: ignore[misc]
        return EpochRepeatSampler(sampler) if getattr(sampler, "seed", None) is not None else sampler

    def _run_epoch(self, *args: Any, **kwargs: Any) -> None:
        state = self.state  # type: ignore[attr-defined]
        if 0 < state.max_steps <= state.global_step:  # resumed at max_steps: the epoch would still run a step
            self.control.should_training_stop = True  # type: ignore[attr-defined]
            return
        super()._run_epoch(*args, **kwargs)  # type: ignore[misc]

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        from transformers.trainer_utils import rotate_checkpoints

        run_dir = Path(self._get_output_dir(trial=trial))  # type: ignore[attr-defined]
        name = f"checkpoint-{self.state.global_step}"  # type: ignore[attr-defined]
        staging = run_dir / f"{STAGING_PREFIX}{name}"
        barrier = self.accelerator.wait_for_everyone  # type: ignore[attr-defined]
        if self.args.should_save:  # type: ignore[attr-defined]
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(parents=True)
        barrier()
        # Trainer and TRL build the checkpoint path from _get_output_dir: point it at the staging directory.
        self._get_output_dir = lambda trial=None: str(staging)  # type: ignore[method-assign]
        try:
            super()._save_checkpoint(model, trial)  # type: ignore[misc]
        finally:
            del self._get_output_dir
        barrier()  # every process has written its files (per-process RNG states) before the rename
        if self.args.should_save:  # type: ignore[attr-defined]
            publish_dir(staging / name, run_dir / name)
            staging.rmdir()
            best = self.state.best_model_checkpoint  # type: ignore[attr-defined]
            if best and str(staging) in best:
                self.state.best_model_checkpoint = best.replace(str(staging / name), str(run_dir / name))
            rotate_checkpoints(output_dir=str(run_dir), save_total_limit=self.args.save_total_limit,  # type: ignore
                               best_model_checkpoint=self.state.best_model_checkpoint, use_mtime=False)
        barrier()


def make_trainer_class(base: type) -> type:
    return type(f"Resumable{base.__name__}", (ResumableMixin, base), {})


# --- the run ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class TrainResult:
    output_dir: Path
    global_step: int
    resumed_from: Path | None
    final_model: Path


def prepare_output_dir(cfg: RunConfig, resume: bool, source: str = "<config>") -> Path | None:
    """The checkpoint to resume from (None: start fresh). Refuses to start over existing checkpoints."""
    out = Path(cfg.output_dir)
    checkpoints = complete_checkpoints(out)
    if out.is_dir():
        for stale in out.glob(f"{STAGING_PREFIX}*"):  # left by a kill during a save
            shutil.rmtree(stale, ignore_errors=True)
    if not resume:
        if checkpoints:
            raise ConfigError(f"{source}: output_dir: {out} already holds {checkpoints[-1].name}; pass --resume "
                              "to continue it or choose another output_dir")
        return None
    if not checkpoints:
        log.warning("--resume: no complete checkpoint in %s, starting from step 0", out)
        return None
    return checkpoints[-1]


def trainer_state(directory: Path) -> dict[str, Any]:
    """``directory/trainer_state.json`` (a checkpoint's, or final/'s), checked for ``global_step``."""
    import json

    path = directory / "trainer_state.json"
    try:
        state = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read the trainer state: {exc}") from None
    if not isinstance(state, dict) or not isinstance(state.get("global_step"), int):
        raise ValueError(f"{path}: no integer global_step")
    return state


def finished_run(checkpoint: Path, max_steps: int) -> bool:
    """True when ``final/`` beside ``checkpoint`` was saved at the checkpoint's step and that step reaches
    ``max_steps`` (-1: the ``max_steps`` the checkpoint recorded, from num_train_epochs)."""
    state = trainer_state(checkpoint)
    step = state["global_step"]
    target = max_steps if max_steps > 0 else int(state.get("max_steps", 0))
    final = checkpoint.parent / "final"
    if step < target or not (final / "trainer_state.json").is_file():
        return False
    return trainer_state(final)["global_step"] == step


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _warn_config_changes(path: Path, cfg: RunConfig) -> None:
    import yaml

    if not path.is_file():
        return
    before, now = _flatten(yaml.safe_load(path.read_text()) or {}), _flatten(config_to_dict(cfg))
    changed = sorted(k for k in before.keys() | now.keys() if before.get(k) != now.get(k))
    if changed:
        log.warning("--resume with a config that differs from %s in: %s", path, ", ".join(changed))


def train(cfg: RunConfig, resume: bool = False, source: str = "<config>",
          callbacks: list[Any] | None = None) -> TrainResult:
    """Run ``ictrl train``. Config errors surface before the model loads."""
    args = build_trainer_args(cfg, source)
    reward_funcs = build_rewards(cfg, source)
    check_sources(cfg, source)
    resume_from = prepare_output_dir(cfg, resume, source)
    out, final = Path(cfg.output_dir), Path(cfg.output_dir) / "final"
    if resume_from is not None and finished_run(resume_from, args.max_steps):
        step = trainer_state(resume_from)["global_step"]
        log.warning("--resume: the run is complete: %s is at step %d (max_steps %d) and %s holds its model; "
                    "nothing to train", resume_from.name, step, args.max_steps, final)
        return TrainResult(out, step, resume_from, final)

    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from ictrl.engine.callbacks import MetricsJSONL, RichProgress
    from ictrl.models import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(cfg.model.name_or_path, dtype=cfg.model.dtype,
                                                trust_remote_code=cfg.model.trust_remote_code)
    dataset = build_dataset(cfg, tokenizer)
    out.mkdir(parents=True, exist_ok=True)
    if resume_from is not None:
        _warn_config_changes(out / "config.yaml", cfg)
    save_config(cfg, out / "config.yaml")

    accuracy = reward_label(reward_funcs[0])
    _, trainer_cls = trainer_classes()
    trainer = make_trainer_class(trainer_cls)(
        model=model, reward_funcs=reward_funcs, args=args, train_dataset=dataset, processing_class=tokenizer,
    )
    for cb in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(cb)
    trainer.add_callback(MetricsJSONL(out / "metrics.jsonl", accuracy_reward=accuracy))
    if not args.disable_tqdm:  # the rich bar stands in for transformers' tqdm bar
        trainer.add_callback(RichProgress(accuracy_reward=accuracy))
    for cb in callbacks or []:
        trainer.add_callback(cb)
    if resume_from is not None:
        step = trainer_state(resume_from)["global_step"]
        log.warning("resuming from %s", resume_from)
        if 0 < args.max_steps <= step:
            log.warning("--resume: %s is at step %d, max_steps is %d: no step left to train; writing %s from it",
                        resume_from.name, step, args.max_steps, final)
    trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)

    save_final(trainer, out / f"{STAGING_PREFIX}final", final)
    return TrainResult(out, trainer.state.global_step, resume_from, final)


def save_final(trainer: Any, staging: Path, final: Path) -> None:
    """The HF-format model in ``final``, written to ``staging`` then renamed. ``save_model`` runs on every
    process: under ZeRO-3 and FSDP it gathers the full weights (a collective; on the main process alone it would
    hang), and only the main process writes. FSDP checkpoints may be sharded (SHARDED_STATE_DICT), for which
    ``save_model`` writes no weights: the final save switches the plugin to a full state dict for its duration."""
    barrier = trainer.accelerator.wait_for_everyone
    if trainer.args.should_save:
        shutil.rmtree(staging, ignore_errors=True)
    barrier()
    plugin = getattr(trainer.accelerator.state, "fsdp_plugin", None) if trainer.is_fsdp_enabled else None
    previous = plugin.state_dict_type if plugin is not None else None
    if plugin is not None and "FULL_STATE_DICT" not in str(previous):
        plugin.set_state_dict_type("FULL_STATE_DICT")
    try:
        trainer.save_model(str(staging))
    finally:
        if plugin is not None:
            plugin.state_dict_type = previous
    barrier()
    if trainer.args.should_save:
        trainer.state.save_to_json(str(staging / "trainer_state.json"))  # its step: finished_run reads it
        publish_dir(staging, final)
    barrier()
