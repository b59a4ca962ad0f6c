"""A resumed run is the run it continues: :func:`check_unchanged` compares the run config ``ictrl train`` is given
with the ``config.yaml`` the run wrote beside its checkpoints, and :func:`check_exact` refuses a checkpoint without
the state an exact resume restores, unless the user accepts an inexact one."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ictrl.errors import ConfigError
from ictrl.yamlfile import load_yaml

log = logging.getLogger("ictrl.train")

# ictrl train's flags that accept a resume which cannot continue the same run exactly, each named by the user
INEXACT_FLAG = "--resume-inexact"  # from a checkpoint without its optimizer, scheduler or RNG state
NEW_SCHEDULE_FLAG = "--resume-new-schedule"  # with max_steps / num_train_epochs changed under a decaying schedule


def missing_state(checkpoint: Path, args: Any) -> list[str]:
    """What ``checkpoint`` lacks of the training state Trainer restores on resume (``save_only_model``, or files
    lost): the optimizer's state, the learning-rate scheduler's, each process's RNG state; each named with its
    file. DeepSpeed keeps the optimizer and scheduler in its ``global_step*`` folder."""
    names = {p.name for p in checkpoint.iterdir()}
    engine = any(n.startswith("global_step") for n in names)  # DeepSpeed's own folder holds both
    missing = []
    if not engine and not any(n.startswith("optimizer") for n in names):  # optimizer.pt; FSDP's optimizer_0
        missing.append("optimizer state (optimizer.pt)")
    if not engine and "scheduler.pt" not in names:
        missing.append("learning-rate scheduler state (scheduler.pt)")
    world = int(getattr(args, "world_size", 1) or 1)
    rng = ["rng_state.pth"] if world == 1 else [f"rng_state_{i}.pth" for i in range(world)]
    lost = [n for n in rng if n not in names]
    if lost:
        missing.append(f"RNG state ({', '.join(lost)})")
    return missing


def check_exact(checkpoint: Path, args: Any, accept: bool, source: str = "<config>") -> None:
    """Refuse, in one line naming what is missing, a resume from a checkpoint without the state that makes it
    exact (:func:`missing_state`), unless ``accept`` (:data:`INEXACT_FLAG`): then one warning line says what
    the resumed run does differently from an uninterrupted one."""
    missing = missing_state(checkpoint, args)
    if not missing:
        return
    why = " (save_only_model: true writes the weights alone)" if getattr(args, "save_only_model", False) else ""
    if not accept:
        raise ConfigError(f"{source}: --resume: {checkpoint} has no {', no '.join(missing)}{why}, so a resumed run "
                          f"would not continue the same run; pass {INEXACT_FLAG} to resume from its weights anyway, "
                          "or start a fresh run in another output_dir")
    differ = []
    if any("optimizer" in m for m in missing):
        differ.append("the optimizer starts fresh (no moment estimates)")
    if any("scheduler" in m for m in missing):
        differ.append(f"the {args.lr_scheduler_type} learning-rate schedule starts again from its first step")
    if any("RNG" in m for m in missing):
        differ.append("sampling draws from the seed's start, not where the run left off")
    log.warning("%s: resuming from %s, which has no %s%s: %s; the result will differ from an uninterrupted run",
                INEXACT_FLAG, checkpoint, ", no ".join(missing), why, "; ".join(differ))


# Keys a resumed run may change: they decide where the run stops, what it logs and when it saves, not its steps.
RESUME_FREE_KEYS = frozenset({
    "max_steps", "num_train_epochs", "save_steps", "save_strategy", "save_total_limit", "logging_steps",
    "logging_first_step", "logging_strategy", "report_to", "run_name", "project", "disable_tqdm", "log_level",
    "cpu_threads", "output_dir", "resume_from_checkpoint", "dataloader_num_workers", "enable_jit_checkpoint",
    # where a vLLM server is and how long to wait for it: a restarted server is the usual reason to resume
    "vllm_server_base_url", "vllm_server_host", "vllm_server_port", "vllm_server_timeout", "vllm_group_port"})
LENGTH_KEYS = ("max_steps", "num_train_epochs")  # the schedule's length, unless the learning rate is constant


def check_unchanged(saved: Path, now: dict[str, Any], args: Any, source: str = "<config>",
                    new_schedule: bool = False) -> None:
    """Refuse a resume whose config (``now``, the run config as a dict) differs from ``saved`` (the config.yaml of
    the run) in a key that changes the steps: the resumed run would not equal an uninterrupted one. The run's
    length under a decaying schedule may change with ``new_schedule`` (:data:`NEW_SCHEDULE_FLAG`), said in one
    line."""
    import yaml

    if not saved.is_file():
        return
    try:
        before = _flatten(load_yaml(saved.read_text(), str(saved)) or {})
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{saved}: cannot read the run's config to compare: {str(exc).splitlines()[0]}") from None
    after = _flatten(load_yaml(yaml.safe_dump(now), "<config>") or {})
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    constant = args.lr_scheduler_type in ("constant", "constant_with_warmup") and (
        args.lr_scheduler_type == "constant" or not 0 < float(args.warmup_steps) < 1)
    free = RESUME_FREE_KEYS - (set() if constant or new_schedule else set(LENGTH_KEYS))
    bad = [k for k in changed if k not in free]
    if bad:
        shown = "; ".join(f"{k}: {before.get(k)!r} -> {after.get(k)!r}" for k in bad[:6])
        length = set(bad) <= set(LENGTH_KEYS)
        why = (f" (the {args.lr_scheduler_type} learning-rate schedule spans max_steps, so the steps already taken "
               "followed another schedule)" if length else "")
        choice = f", pass {NEW_SCHEDULE_FLAG} to resume on the new schedule," if length else ""
        raise ConfigError(f"{source}: --resume: the config differs from {saved} in {shown}{why}; a resumed run would "
                          f"not continue the same run: restore the values{choice} or start a fresh run in another "
                          "output_dir")
    lengths = [k for k in changed if k in LENGTH_KEYS]
    if lengths and new_schedule and not constant:
        log.warning("%s: %s changed (%s): the %s learning-rate schedule is recomputed over the new length from the "
                    "resumed step on, so the steps taken before followed another schedule", NEW_SCHEDULE_FLAG,
                    ", ".join(lengths), "; ".join(f"{before.get(k)!r} -> {after.get(k)!r}" for k in lengths),
                    args.lr_scheduler_type)


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out
