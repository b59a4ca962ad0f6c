"""Resumable training: the trainer's part that makes every checkpoint complete and a resumed run continue
exactly (docs/architecture.md, "Module notes")."""

from __future__ import annotations

import itertools
import logging
import math
import re
import shutil
from pathlib import Path
from typing import Any, Callable

import torch

from ictrl.checkpoints import (STAGING_PREFIX, checkpoint_state, publish_dir, publish_model, rotate_checkpoints,
                               verify_checkpoint, write_manifest)
from ictrl.errors import ConfigError
from ictrl.files import is_write_failure, write_error

log = logging.getLogger("ictrl.train")


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


def at_buffer_boundary(step: int, args: Any) -> bool:
    """Whether TRL's generation buffer is empty after optimizer step ``step`` (a checkpoint there resumes exactly)."""
    return step * args.gradient_accumulation_steps % (args.steps_per_generation * args.num_iterations) == 0


def verified_checkpoints(checkpoints: list[Path], lost_state_ok: bool = False) -> list[Path]:
    """``checkpoints`` (oldest first) whose files match their manifest, newest first; one warning line for each
    that does not (it is skipped, the next older one is used). ``lost_state_ok``: a lost optimizer, scheduler or
    RNG state file does not skip a checkpoint (``--resume-inexact``)."""
    good = []
    for checkpoint in reversed(checkpoints):
        problem = verify_checkpoint(checkpoint, lost_state_ok) or refused_pickle(checkpoint)
        if problem is None:
            good.append(checkpoint)
        else:
            log.warning("--resume: skipping %s: %s", checkpoint, problem)
    return good


def refused_pickle(checkpoint: Path) -> str | None:
    """The first pickle of ``checkpoint`` (optimizer, scheduler, RNG states) that torch's safe loading refuses, as
    the Trainer loads it (``weights_only`` with transformers' numpy allowlist), or None. Memory-mapped: the tensors
    are not read. A file another tool wrote, or one changed with its manifest, is found here, before the resume."""
    import pickle

    from transformers.trainer_pt_utils import safe_globals

    for path in sorted(checkpoint.iterdir()):
        # training_args.bin is the Trainer's record of its arguments, never loaded on resume
        if path.suffix not in (".pt", ".pth", ".bin") or not path.is_file() or path.name == "training_args.bin":
            continue
        try:
            with safe_globals():
                torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except pickle.UnpicklingError as exc:
            reason = next((line for line in str(exc).splitlines() if "WeightsUnpickler error" in line), str(exc))
            reason = reason.split("WeightsUnpickler error: ")[-1].split(". ")[0][:160].strip()
            return f"{path.name}: torch's safe loading refuses it ({reason})"
        except (RuntimeError, OSError, EOFError, ValueError) as exc:
            return f"{path.name} cannot be read ({type(exc).__name__}: {(str(exc) or '?').splitlines()[0][:160]})"
    return None


def resume_point(verified: list[Path], args: Any, source: str = "<config>", finished_ok: bool = False) -> Path:
    """The newest of ``verified`` (newest first) that resumes exactly: written on as many processes as this run has,
    and at a step where TRL's generation buffer is empty (a checkpoint inside one, such as the last step of a run
    whose max_steps ends mid-buffer, is skipped with a line). With ``finished_ok`` (``--resume`` in the run's own
    output_dir), the newest when it ends the run (``CheckpointState.finished``: the final model of its step is
    beside it), wherever it falls. Each checkpoint is read once (``checkpoints.checkpoint_state``).
    :class:`ConfigError` when none is."""
    states = (checkpoint_state(checkpoint) for checkpoint in verified)
    newest = next(states, None)
    if newest is not None and finished_ok and newest.finished(args.max_steps):
        return newest.path
    if newest is None:
        raise ConfigError(f"{source}: --resume: no checkpoint in the output_dir is complete (each is named above); "
                          "start a fresh run in another output_dir")
    if newest.world_size != args.world_size:
        raise ConfigError(f"{source}: --resume: {newest.path} was written by {newest.world_size} process(es) and this "
                          f"run has {args.world_size}: each process's RNG state and share of the batch depend on the "
                          f"count; resume with {newest.world_size} (--num-processes {newest.world_size})")
    buffer = args.steps_per_generation * args.num_iterations // args.gradient_accumulation_steps
    for state in itertools.chain([newest], states):
        if at_buffer_boundary(state.step, args):
            return state.path
        log.warning("--resume: skipping %s: step %d falls inside a generation batch (one every %s optimizer "
                    "steps), which checkpoints do not hold", state.path.name, state.step, buffer)
    raise ConfigError(f"{source}: --resume: every checkpoint falls inside a generation batch, which checkpoints do "
                      "not hold, so none resumes exactly; start a fresh run")


class EpochRepeatSampler:
    """Wraps TRL's ``RepeatSampler`` so epoch e's prompt order depends only on (seed, e); ``exhausted``: no prompt
    (a resumed run with no step left)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.epoch = 0
        self.exhausted = False

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.inner)

    def __iter__(self) -> Any:
        if self.exhausted:
            return iter(())
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


class Resumable:
    """Atomic checkpoint directories and epoch-exact prompt order, one per trainer (``ICTGRPOTrainer.resumable``):
    the trainer's ``_get_train_sampler`` and ``_save_checkpoint`` hand Trainer's own result or method to the one here,
    and a callback of the trainer's hands it the Trainer's ``on_train_begin`` and ``on_epoch_begin`` events."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer  # the Trainer this is part of
        self.epoch_sampler: EpochRepeatSampler | None = None
        self.no_step_left = False

    def train_sampler(self, sampler: Any) -> Any:
        """TRL's ``RepeatSampler`` wrapped so epoch e's prompt order depends only on (seed, e)."""
        if getattr(sampler, "seed", None) is None:
            return sampler
        self.epoch_sampler = EpochRepeatSampler(sampler)
        return self.epoch_sampler

    def train_begins(self, state: Any, control: Any) -> None:
        """A run resumed at max_steps inside an epoch trains no step (the Trainer re-enters that epoch and would
        still run one): training stops, and the epoch's sampler gives no prompt (:meth:`epoch_begins`)."""
        self.no_step_left = 0 < state.max_steps <= state.global_step
        if self.no_step_left:
            control.should_training_stop = True

    def epoch_begins(self, state: Any) -> None:
        """The sampler set to the epoch beginning, before the Trainer iterates its dataloader."""
        sampler = self.epoch_sampler
        if sampler is None:
            return
        # Trainer's set_epoch reaches the sampler through accelerate's wrappers, except in a resumed epoch on several
        # processes: SkipBatchSampler(BatchSamplerShard(BatchSampler(sampler))) is one level deeper than it looks,
        # so that epoch replayed epoch 0's prompt order. state.epoch counts the epochs done (a fraction inside one,
        # as a resumed run's checkpoint recorded it): its floor is the epoch beginning.
        sampler.set_epoch(math.floor(state.epoch or 0))
        sampler.exhausted = self.no_step_left

    def save_checkpoint(self, save: Callable[[Any, Any], None], model: Any, trial: Any) -> None:
        """Trainer's ``_save_checkpoint`` (``save``) into a staging directory, then a manifest and a rename: every
        ``checkpoint-N`` is complete."""
        trainer = self.trainer
        run_dir = Path(trainer._get_output_dir(trial=trial))
        name = f"checkpoint-{trainer.state.global_step}"
        staging = run_dir / f"{STAGING_PREFIX}{name}"
        barrier = trainer.accelerator.wait_for_everyone
        failure: BaseException | None = None
        if trainer.args.should_save:
            shutil.rmtree(staging, ignore_errors=True)
            failure = _attempt(lambda: staging.mkdir(parents=True))
        failure = _agree(failure, barrier, getattr(trainer.args, "device", None))
        if failure is None:
            # Trainer and TRL build the checkpoint path from _get_output_dir: point it at the staging directory.
            trainer._get_output_dir = lambda trial=None: str(staging)
            try:
                failure = _attempt(lambda: save(model, trial))
            finally:
                del trainer._get_output_dir
            # every process has written its files (per-process RNG states) before the manifest and the rename
            failure = _agree(failure, barrier, getattr(trainer.args, "device", None))
        if failure is None and trainer.args.should_save:
            failure = _attempt(lambda: (write_manifest(staging / name), publish_dir(staging / name, run_dir / name)))
        if failure is not None:
            shutil.rmtree(staging, ignore_errors=True)  # nothing half-written stays; earlier checkpoints untouched
            raise _save_failed(run_dir / name, failure)
        if trainer.args.should_save:
            staging.rmdir()
            best = trainer.state.best_model_checkpoint
            if best and str(staging) in best:
                trainer.state.best_model_checkpoint = best.replace(str(staging / name), str(run_dir / name))
            # among the checkpoints ictrl wrote only: a user's own checkpoint-N folder is neither deleted nor newest
            rotate_checkpoints(run_dir, trainer.args.save_total_limit, trainer.state.best_model_checkpoint)
        barrier()


def _attempt(write: Any) -> BaseException | None:
    """Run ``write``; the write failure it raised (a full disk), else None. Any other error propagates."""
    try:
        write()
    except Exception as exc:  # noqa: BLE001 - torch and safetensors report a full disk as RuntimeError / their own
        if not is_write_failure(exc):
            raise
        return exc
    return None


def _agree(failure: BaseException | None, barrier: Any, device: Any = None) -> BaseException | None:
    """The barrier, and whether any process failed to write: every process then stops at the same point (a
    process that raised alone would leave the others waiting in the next collective)."""
    import torch.distributed as dist

    barrier()
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return failure
    flag = torch.tensor([0 if failure is None else 1], device=device)  # on the backend's device (NCCL: a GPU)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if failure is None and flag.item():
        return OSError(28, "another process could not write its part")
    return failure


def _save_failed(path: Path, exc: BaseException) -> Exception:
    from ictrl.checkpoints import OVERWRITE_FLAG, complete_checkpoints

    kept = complete_checkpoints(path.parent)
    after = (f"{kept[-1].name} is intact; free space and resume with --resume" if kept
             else f"no earlier checkpoint; free space and run again (ictrl train: with {OVERWRITE_FLAG})")
    return write_error(path, exc, after)


def save_final(trainer: Any, staging: Path, final: Path) -> None:
    """The HF-format model in ``final`` (the output directory), written to ``staging`` then renamed in
    (``checkpoints.publish_model``). The save runs on every process: under ZeRO-3 and FSDP it gathers the full
    weights (a collective; on the main process alone it would hang), and only the main process writes
    (:func:`_save_model`). A LoRA run writes the merged model there and its adapter in ``adapter/``
    (:func:`_save_lora`)."""
    barrier = trainer.accelerator.wait_for_everyone
    if trainer.args.should_save:
        shutil.rmtree(staging, ignore_errors=True)
    barrier()
    if _is_peft(trainer.model):
        failure = _attempt(lambda: _save_lora(trainer, staging))
    else:
        failure = _attempt(lambda: _save_model(trainer, staging))
    failure = _agree(failure, barrier, getattr(trainer.args, "device", None))
    if failure is None and trainer.args.should_save:
        def publish() -> None:
            # its step, which CheckpointState.finished reads
            trainer.state.save_to_json(str(staging / "trainer_state.json"))
            write_manifest(staging)
            publish_model(staging, final)

        failure = _attempt(publish)
    if failure is not None:
        shutil.rmtree(staging, ignore_errors=True)
        raise _save_failed(final, failure)
    barrier()


def _save_model(trainer: Any, directory: Path) -> None:
    """What ``trainer.save_model(directory)`` writes, the weights whole under FSDP too. Under FSDP ``save_model``
    writes weights only when the plugin's state dict type is FULL_STATE_DICT, and checkpoints may be sharded
    (SHARDED_STATE_DICT); ``accelerator.get_state_dict`` gathers the full state dict whatever that type (FSDP1: a
    full-state-dict context on the model for that call; FSDP2: ``get_model_state_dict(full_state_dict=True)``), on
    every process (a collective), and the main process writes it as ``save_model`` does."""
    if not trainer.is_fsdp_enabled:
        trainer.save_model(str(directory))
        return
    from transformers.trainer import TRAINING_ARGS_NAME

    state_dict = trainer.accelerator.get_state_dict(trainer.model)
    if not trainer.args.should_save:
        return
    directory.mkdir(parents=True, exist_ok=True)
    # A PeftModel's save_pretrained keeps the adapter's entries of the full state dict.
    trainer.accelerator.unwrap_model(trainer.model).save_pretrained(str(directory), state_dict=state_dict)
    if trainer.processing_class is not None:
        trainer.processing_class.save_pretrained(str(directory))
    torch.save(trainer.args, directory / TRAINING_ARGS_NAME)


def _is_peft(model: Any) -> bool:
    from accelerate.utils import is_peft_model

    return is_peft_model(model)


def _save_lora(trainer: Any, staging: Path) -> None:
    """``staging/adapter``: the adapter as TRL saves it; ``staging``: the base model with the adapter merged in and
    the tokenizer, so ``ictrl eval`` and vLLM read the output directory as any checkpoint. The merge changes the
    trainer's model in place (training is over). Under ZeRO-3 or FSDP the weights are shards on each process: only the
    adapter is written, with a warning."""
    import logging

    _save_model(trainer, staging / "adapter")  # a collective under the sharded engines
    deepspeed = getattr(trainer.accelerator.state, "deepspeed_plugin", None)
    if trainer.is_fsdp_enabled or (deepspeed is not None and deepspeed.zero_stage == 3):
        logging.getLogger("ictrl.train").warning(
            "final model: the LoRA weights are sharded across processes, so only the adapter is saved (adapter/); "
            "merge it into the base model with peft's merge_and_unload before ictrl eval")
        return
    if trainer.args.should_save:
        merged = trainer.accelerator.unwrap_model(trainer.model).merge_and_unload()
        merged.save_pretrained(str(staging))
        trainer.processing_class.save_pretrained(str(staging))
