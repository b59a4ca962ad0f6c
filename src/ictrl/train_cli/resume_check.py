"""A resumed run is the run it continues: :func:`check_unchanged` compares the run config ``ictrl train`` is given
with the ``config.yaml`` the run wrote beside its checkpoints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ictrl.errors import ConfigError
from ictrl.yamlfile import load_yaml

# Keys a resumed run may change: they decide where the run stops, what it logs and when it saves, not its steps.
RESUME_FREE_KEYS = frozenset({
    "max_steps", "num_train_epochs", "save_steps", "save_strategy", "save_total_limit", "logging_steps",
    "logging_first_step", "logging_strategy", "report_to", "run_name", "project", "disable_tqdm", "log_level",
    "cpu_threads", "output_dir", "resume_from_checkpoint", "dataloader_num_workers", "enable_jit_checkpoint",
    # where a vLLM server is and how long to wait for it: a restarted server is the usual reason to resume
    "vllm_server_base_url", "vllm_server_host", "vllm_server_port", "vllm_server_timeout", "vllm_group_port"})
LENGTH_KEYS = ("max_steps", "num_train_epochs")  # the schedule's length, unless the learning rate is constant


def check_unchanged(saved: Path, now: dict[str, Any], args: Any, source: str = "<config>") -> None:
    """Refuse a resume whose config (``now``, the run config as a dict) differs from ``saved`` (the config.yaml of
    the run) in a key that changes the steps: the resumed run would not equal an uninterrupted one."""
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
    free = RESUME_FREE_KEYS - (set() if constant else set(LENGTH_KEYS))
    bad = [k for k in changed if k not in free]
    if bad:
        shown = "; ".join(f"{k}: {before.get(k)!r} -> {after.get(k)!r}" for k in bad[:6])
        why = (f" (the {args.lr_scheduler_type} learning-rate schedule spans max_steps, so the steps already taken "
               "followed another schedule)" if set(bad) <= set(LENGTH_KEYS) else "")
        raise ConfigError(f"{source}: --resume: the config differs from {saved} in {shown}{why}; a resumed run would "
                          "not continue the same run: restore the values or start a fresh run in another output_dir")


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out
