"""A resumed run is the run it continues (:func:`check_resume`, which the run calls under its lock):
:func:`check_unchanged` compares the run config ``ictrl train`` is given with the ``config.yaml`` the run wrote
beside its checkpoints, and :func:`check_exact` refuses a checkpoint without the state an exact resume restores,
unless the user accepts an inexact one."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ictrl.checkpoints import CheckpointState
from ictrl.errors import ConfigError
from ictrl.files import without_secrets
from ictrl.train_cli.run_config import INIT_KWARGS, RunConfig, config_record
from ictrl.yamlfile import load_yaml

log = logging.getLogger("ictrl.train")

# ictrl train's flags that accept a resume which cannot continue the same run exactly, each named by the user
INEXACT_FLAG = "--resume-inexact"  # from a checkpoint without its optimizer, scheduler or RNG state
NEW_SCHEDULE_FLAG = "--resume-new-schedule"  # with max_steps / num_train_epochs changed under a decaying schedule


def check_resume(cfg: RunConfig, resumed: CheckpointState, args: Any, source: str = "<config>") -> None:
    """A resume continues the run exactly: the checkpoint (``resumed``, as ``checkpoints.checkpoint_state`` read it)
    holds the optimizer, scheduler and RNG state (:func:`check_exact`), and the config is that of the run it ends
    (its folder's ``config.yaml``, :func:`check_unchanged`, against ``run_config.config_record``, what the run
    writes there); unless the command accepts the difference by name (:data:`INEXACT_FLAG`,
    :data:`NEW_SCHEDULE_FLAG`), when one line says what differs."""
    # what the warnings of the two flags say of the resumed steps: read only when one of them is given
    rates = resumed_rates(resumed, args) if cfg.modes & {INEXACT_FLAG, NEW_SCHEDULE_FLAG} else ""
    check_exact(resumed, args, INEXACT_FLAG in cfg.modes, source, rates)
    check_unchanged(resumed.path.parent / "config.yaml", config_record(cfg), args, source,
                    new_schedule=NEW_SCHEDULE_FLAG in cfg.modes, rates=rates)


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


def check_exact(resumed: CheckpointState, args: Any, accept: bool, source: str = "<config>", rates: str = "") -> None:
    """Refuse, in one line naming what is missing, a resume from a checkpoint without the state that makes it
    exact (:func:`missing_state`), unless ``accept`` (:data:`INEXACT_FLAG`): then one warning line says what
    the resumed run does differently from an uninterrupted one (with ``rates``, :func:`resumed_rates`)."""
    checkpoint = resumed.path
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
    if any("optimizer" in m or "scheduler" in m for m in missing):  # Trainer restores the two together or neither
        differ.append(f"the {_name(args)} learning-rate schedule starts again from its first step (Trainer restores "
                      f"the optimizer and the scheduler together or neither){rates}")
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
                    new_schedule: bool = False, rates: str = "") -> None:
    """Refuse a resume whose config (``now``, the run config as a dict) differs from ``saved`` (the config.yaml of
    the run) in a key that changes the steps: the resumed run would not equal an uninterrupted one. The run's
    length under a decaying schedule may change with ``new_schedule`` (:data:`NEW_SCHEDULE_FLAG`), said in one
    line."""
    import yaml

    if not saved.is_file():
        return
    try:
        text = saved.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{saved}: cannot read the run's config to compare: {str(exc).splitlines()[0]}") from None
    # both read as YAML, so each value compares as the file holds it (`now` through a dump: 1e-6 as 1.0e-06)
    written, given = load_yaml(text, str(saved)) or {}, load_yaml(yaml.safe_dump(now), "<config>") or {}
    legacy = written.get(INIT_KWARGS) if isinstance(written, dict) else None
    if isinstance(legacy, str):  # an older ictrl wrote TRL's JSON text (JSON is YAML), secrets and all
        written = {**written, INIT_KWARGS: load_yaml(legacy, f"{saved}: {INIT_KWARGS}")}
    before, after = _flatten(without_secrets(written)), _flatten(given)  # `now` is config_record's: no secret
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
        log.warning("%s: %s changed (%s): the steps taken followed the %s learning-rate schedule over the old length; "
                    "the first resumed step keeps the rate the old schedule set for it, the steps after it follow the "
                    "schedule over the new length%s", NEW_SCHEDULE_FLAG, ", ".join(lengths),
                    "; ".join(f"{before.get(k)!r} -> {after.get(k)!r}" for k in lengths), _name(args), rates)


def _name(args: Any) -> str:
    return str(getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type))


def resumed_rates(resumed: CheckpointState, args: Any) -> str:
    """What the resumed steps' learning rates will be, as Trainer sets them (``: step 3 at 0.000333, step 4 at
    0.0005, step 5 at 0.000333, step 6 at 0.000167``; past four steps the first three, then the last; '' when
    ``max_steps`` is not set or the schedule follows the metrics). With the optimizer's and scheduler's state
    restored, the first resumed step keeps the rate the old schedule left in the optimizer (the scheduler's last,
    in ``scheduler.pt``), and each step after it the schedule over the new ``max_steps`` at its step; without them
    (either file missing: Trainer loads both or neither), the schedule starts again at its step 0."""
    import torch
    from transformers import get_scheduler

    total = int(getattr(args, "max_steps", -1) or -1)
    if total <= 0:  # the length comes from num_train_epochs: Trainer knows it only once the data loader is built
        return ""
    checkpoint, step = resumed.path, resumed.step
    if total <= step:
        return ""
    names = {p.name for p in checkpoint.iterdir()}
    restored = "scheduler.pt" in names and any(n.startswith("optimizer") for n in names)
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=float(args.learning_rate))
    schedule = get_scheduler(args.lr_scheduler_type, optimizer, num_warmup_steps=args.get_warmup_steps(total),
                             num_training_steps=total, scheduler_specific_kwargs=args.lr_scheduler_kwargs or {})
    first: list[float] = []
    if restored:
        try:
            saved = torch.load(checkpoint / "scheduler.pt", map_location="cpu", weights_only=True)
            first = [float(saved["_last_lr"][0])]
        except (OSError, RuntimeError, KeyError, IndexError, TypeError, ValueError):  # not a schedule torch wrote
            return ""
    # resumed step s takes the schedule's rate after index(s) steps: the restored scheduler's next step is step + 1
    steps = list(range(step + 1, total + 1))
    shown = steps if len(steps) <= 4 else [*steps[:3], steps[-1]]
    index = {s: s - 1 if restored else s - step - 1 for s in shown if not (restored and s == step + 1)}
    if not isinstance(schedule, torch.optim.lr_scheduler.LambdaLR):  # reduce_lr_on_plateau: set by the metrics
        return ""
    rates = dict(zip([step + 1], first))  # transformers' other schedules are LambdaLRs: a rate is one call
    rates.update({s: float(args.learning_rate) * schedule.lr_lambdas[0](n) for s, n in index.items()})
    said = [f"step {s} at {rates[s]:.3g}" for s in shown]
    return ": " + ", ".join(said if len(steps) <= 4 else [*said[:3], "...", said[-1]])


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out
