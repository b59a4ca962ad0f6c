"""The run config of ``ictrl train``: YAML sections -> validated dataclasses -> trainer arguments.

A run config is one YAML file (optionally inheriting others through a top-level ``base:`` list) plus
``--section.key=value`` overrides. Every key is checked against the dataclasses below before anything heavy
happens, and a bad key or value raises :class:`ConfigError` naming the key, where it came from (the file or the
override) and, for a typo, the closest valid key.

Sections map onto :class:`ictrl.engine.config.ICTGRPOConfig` (TRL's ``GRPOConfig`` + token selection) in
:func:`trainer_kwargs`; ``trainer:`` passes any other ``GRPOConfig`` field through unchanged.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ictrl.files import atomic_write_text
from ictrl.loss import NORM_MODES
from ictrl.selection import SCOPES

# The built-in selectors (a YAML config cannot register code; custom selectors are for the Python API).
SELECTORS = ("all", "ict", "entropy", "stapo", "random", "frequent")
REPORT_TO = ("none", "tensorboard", "trackio", "wandb")


class ConfigError(ValueError):
    """A bad key or value in a run config; the message names the key and its source."""


def _help(text: str, choices: tuple[str, ...] | None = None) -> dict[str, Any]:
    return {"help": text, "choices": choices} if choices else {"help": text}


@dataclass
class ModelConfig:
    name_or_path: str = field(
        default="",
        metadata=_help("Hub id (needs network) or local directory holding config.json, weights and tokenizer."),
    )
    dtype: str = field(
        default="auto",
        metadata=_help("Weights dtype; 'auto' keeps the checkpoint's on GPU and uses float32 on CPU.",
                       ("auto", "float32", "bfloat16", "float16")),
    )
    trust_remote_code: bool = field(default=False, metadata=_help("Allow model code shipped with the checkpoint."))

    def __post_init__(self) -> None:
        if not self.name_or_path:
            raise ValueError("model.name_or_path: required (a hub id or a local checkpoint directory)")


@dataclass
class DataConfig:
    train: list[str] | dict[str, float] = field(
        default_factory=lambda: ["gsm8k_train"],
        metadata=_help("Training sources: a list of ictrl.data registry names (gsm8k_train, math_train, "
                       "jsonl:PATH) concatenated, or a mapping name -> weight sampled as a mixture."),
    )
    eval: list[str] = field(
        default_factory=list,
        metadata=_help("Benchmarks to evaluate the trained model on with `ictrl eval` (recorded in config.yaml; "
                       "not run during training)."),
    )
    max_prompt_length: int | None = field(
        default=512,
        metadata=_help("Drop training prompts longer than this many tokens (after the chat template); None keeps "
                       "all. Dropping, not truncating: a cut question has no verifiable answer."),
    )
    limit: int | None = field(default=None, metadata=_help("Use at most this many training rows (of the mixture "
                                                            "when several sources are given)."))

    def __post_init__(self) -> None:
        if isinstance(self.train, dict):
            if not self.train:
                raise ValueError("data.train: the mixture is empty")
            for name, weight in self.train.items():
                if not weight > 0:
                    raise ValueError(f"data.train.{name}: mixture weight must be > 0, got {weight!r}")
        elif not self.train:
            raise ValueError("data.train: at least one source is required")
        if self.max_prompt_length is not None and self.max_prompt_length < 1:
            raise ValueError(f"data.max_prompt_length: must be >= 1 or null, got {self.max_prompt_length}")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"data.limit: must be >= 1 or null, got {self.limit}")

    def source_names(self) -> list[str]:
        return list(self.train) if isinstance(self.train, dict) else list(self.train)


@dataclass
class RewardConfig:
    names: list[str] | None = field(
        default=None,
        metadata=_help("Reward functions: 'verifiable' (each row's kind picks the math/gsm8k/choice reward), "
                       "an ictrl.rewards registry name (math, gsm8k, choice, format) or 'module:function' with "
                       "TRL's signature. None: ['verifiable']. The first one is reported as `accuracy`."),
    )
    weights: list[float] | None = field(
        default=None, metadata=_help("One weight per reward (TRL reward_weights); None: all 1.")
    )

    def __post_init__(self) -> None:
        if self.names is not None and not self.names:
            raise ValueError("reward.names: empty list; use null for the data's default reward")
        if self.weights is not None:
            if self.names is None or len(self.weights) != len(self.names):
                raise ValueError("reward.weights: needs exactly one weight per entry of reward.names")


@dataclass
class MethodConfig:
    name: str = field(default="grpo", metadata=_help("Label of the method (run names, plots); no effect."))
    selector: str = field(
        default="all",
        metadata=_help("Which tokens carry the gradient: all (GRPO), ict, entropy (20-Entropy), stapo, random, "
                       "frequent. -> token_selector", SELECTORS),
    )
    ratio: float | None = field(
        default=None, metadata=_help("Selected fraction per scope unit; None: the selector's default. "
                                     "-> selection_ratio")
    )
    scope: str | None = field(
        default=None, metadata=_help("Percentile scope: response, group or batch; None: the selector's default. "
                                     "-> selection_scope", SCOPES)
    )
    warmup_steps: int | None = field(
        default=None, metadata=_help("Θ: optimizer steps that update every token before selection starts; None: "
                                     "the selector's default. -> selection_warmup_steps")
    )
    normalization: str | None = field(
        default=None, metadata=_help("Loss normaliser; None: the selector's default. -> loss_normalization",
                                     NORM_MODES)
    )
    stapo_tau_p: float | None = field(default=None, metadata=_help("STAPO τ_p (0.002). -> stapo_tau_p"))
    stapo_q: float | None = field(default=None, metadata=_help("STAPO q (0.75). -> stapo_q"))
    temperature: float | None = field(
        default=None, metadata=_help("Temperature of the selection statistics; None: sampling.temperature. "
                                     "-> selection_temperature")
    )
    stats_chunk_size: int | None = field(
        default=None, metadata=_help("Rows of full-vocabulary logits per statistics chunk. -> stats_chunk_size")
    )
    topk: int | None = field(
        default=None, metadata=_help("Score ICT from each position's top-K log-probs plus a tail bucket instead of "
                                     "full distributions; None: exact. -> selection_topk")
    )
    sparse_backward: bool | None = field(
        default=None, metadata=_help("Apply the LM head with gradient only at selected tokens (same gradient, "
                                     "less memory); None: off. -> sparse_backward")
    )
    seed: int | None = field(default=None, metadata=_help("Random selector seed; None: optim.seed. -> selection_seed"))

    def __post_init__(self) -> None:
        if self.ratio is not None and not 0.0 < self.ratio <= 1.0:
            raise ValueError(f"method.ratio: must be in (0, 1], got {self.ratio}")
        if self.warmup_steps is not None and self.warmup_steps < 0:
            raise ValueError(f"method.warmup_steps: must be >= 0, got {self.warmup_steps}")
        for key in ("stapo_tau_p", "stapo_q"):
            value = getattr(self, key)
            if value is not None and not 0.0 < value <= 1.0:
                raise ValueError(f"method.{key}: must be in (0, 1], got {value}")
        if self.temperature is not None and not self.temperature > 0:
            raise ValueError(f"method.temperature: must be > 0, got {self.temperature}")
        if self.topk is not None and (isinstance(self.topk, bool) or self.topk < 1):
            raise ValueError(f"method.topk: must be an integer >= 1, got {self.topk}")


@dataclass
class SamplingConfig:
    num_generations: int = field(default=8, metadata=_help("G: responses sampled per prompt (>= 2)."))
    max_completion_length: int = field(default=1024, metadata=_help("Most tokens generated per response."))
    temperature: float = field(default=1.0, metadata=_help("Sampling temperature."))
    top_p: float = field(default=1.0, metadata=_help("Nucleus sampling mass."))
    use_vllm: bool = field(default=False, metadata=_help("Generate with vLLM (GPU only; turned off on CPU)."))
    vllm_mode: str = field(
        default="colocate",
        metadata=_help("colocate: vLLM shares the training GPU; server: a separate `trl vllm-serve` process.",
                       ("colocate", "server")),
    )

    def __post_init__(self) -> None:
        if self.num_generations < 2:
            raise ValueError(f"sampling.num_generations: GRPO needs >= 2, got {self.num_generations}")
        if self.max_completion_length < 1:
            raise ValueError(f"sampling.max_completion_length: must be >= 1, got {self.max_completion_length}")
        if not self.temperature > 0:
            raise ValueError(f"sampling.temperature: must be > 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"sampling.top_p: must be in (0, 1], got {self.top_p}")


@dataclass
class OptimConfig:
    learning_rate: float = field(default=1e-6, metadata=_help("Peak AdamW learning rate."))
    lr_scheduler_type: str = field(
        default="constant", metadata=_help("transformers scheduler name (constant, linear, cosine, ...).")
    )
    warmup_steps: float = field(
        default=0, metadata=_help("LR warm-up: an int number of steps, or a float in [0, 1) = ratio of max_steps.")
    )
    epsilon: float = field(default=0.2, metadata=_help("ε_low: lower clip of the ratio (1 - ε_low)."))
    epsilon_high: float | None = field(
        default=0.28, metadata=_help("ε_high: upper clip (1 + ε_high); None = epsilon (symmetric GRPO).")
    )
    beta: float = field(default=0.0, metadata=_help("KL coefficient β against the reference model; 0 = no KL."))
    num_iterations: int = field(default=1, metadata=_help("μ: optimizer passes over each generation batch."))
    per_device_train_batch_size: int = field(
        default=8, metadata=_help("Completions (not prompts) per device per micro-batch.")
    )
    gradient_accumulation_steps: int = field(default=1, metadata=_help("Micro-batches per optimizer step."))
    max_steps: int = field(default=-1, metadata=_help("Optimizer steps; -1 = num_train_epochs epochs."))
    num_train_epochs: float = field(default=1.0, metadata=_help("Epochs when max_steps = -1."))
    max_grad_norm: float = field(default=1.0, metadata=_help("Gradient-norm clip."))
    weight_decay: float = field(default=0.0, metadata=_help("AdamW weight decay."))
    seed: int = field(default=0, metadata=_help("Seed of data order, sampling and initialisation."))

    def __post_init__(self) -> None:
        if not self.learning_rate > 0:
            raise ValueError(f"optim.learning_rate: must be > 0, got {self.learning_rate}")
        if not (0 <= self.warmup_steps < 1 or self.warmup_steps == int(self.warmup_steps) >= 1):
            raise ValueError(f"optim.warmup_steps: an int >= 0 or a ratio in [0, 1), got {self.warmup_steps}")
        if not 0 <= self.epsilon < 1:
            raise ValueError(f"optim.epsilon: must be in [0, 1), got {self.epsilon}")
        if self.epsilon_high is not None and self.epsilon_high < 0:
            raise ValueError(f"optim.epsilon_high: must be >= 0, got {self.epsilon_high}")
        if self.beta < 0:
            raise ValueError(f"optim.beta: must be >= 0, got {self.beta}")
        for key in ("num_iterations", "per_device_train_batch_size", "gradient_accumulation_steps"):
            if getattr(self, key) < 1:
                raise ValueError(f"optim.{key}: must be >= 1, got {getattr(self, key)}")
        if self.max_steps == 0 or self.max_steps < -1:
            raise ValueError(f"optim.max_steps: must be >= 1 or -1, got {self.max_steps}")
        if self.seed < 0:
            raise ValueError(f"optim.seed: must be >= 0, got {self.seed}")


@dataclass
class LoggingConfig:
    report_to: str = field(
        default="none", metadata=_help("Tracker besides metrics.jsonl (always written).", REPORT_TO)
    )
    logging_steps: int = field(default=1, metadata=_help("Log every this many optimizer steps."))
    progress: bool = field(default=True, metadata=_help("Show the rich progress bar."))

    def __post_init__(self) -> None:
        if self.logging_steps < 1:
            raise ValueError(f"logging.logging_steps: must be >= 1, got {self.logging_steps}")


@dataclass
class RunConfig:
    model: ModelConfig = field(metadata=_help("What to train."))
    output_dir: str = field(metadata=_help("Checkpoints, metrics.jsonl, config.yaml and the final model."))
    data: DataConfig = field(default_factory=DataConfig, metadata=_help("Training data."))
    reward: RewardConfig = field(default_factory=RewardConfig, metadata=_help("Verifiable rewards."))
    method: MethodConfig = field(default_factory=MethodConfig, metadata=_help("Token selection + loss."))
    sampling: SamplingConfig = field(default_factory=SamplingConfig, metadata=_help("Rollouts."))
    optim: OptimConfig = field(default_factory=OptimConfig, metadata=_help("Optimisation."))
    logging: LoggingConfig = field(default_factory=LoggingConfig, metadata=_help("Logging."))
    save_steps: int = field(default=100, metadata=_help("Checkpoint every this many optimizer steps; 0 = never."))
    trainer: dict[str, Any] = field(
        default_factory=dict,
        metadata=_help("Any other GRPOConfig / TrainingArguments field, passed through unchanged (e.g. "
                       "save_total_limit, scale_rewards, vllm_gpu_memory_utilization)."),
    )

    def __post_init__(self) -> None:
        if not self.output_dir:
            raise ValueError("output_dir: required")
        if self.save_steps < 0:
            raise ValueError(f"save_steps: must be >= 0, got {self.save_steps}")
        gen_keys = {"generation_batch_size", "steps_per_generation"} & set(self.trainer)
        if not gen_keys:
            per_step = self.optim.per_device_train_batch_size * self.optim.gradient_accumulation_steps
            if per_step % self.sampling.num_generations:
                raise ValueError(
                    "optim.per_device_train_batch_size: per_device_train_batch_size x gradient_accumulation_steps "
                    f"= {per_step} completions per step must be a multiple of sampling.num_generations = "
                    f"{self.sampling.num_generations} (whole prompt groups)")


SECTIONS: dict[str, type] = {
    name: tp for name, tp in typing.get_type_hints(RunConfig).items() if dataclasses.is_dataclass(tp)
}


def valid_keys() -> list[str]:
    """Every dotted key a run config accepts (``trainer.*`` is open)."""
    keys = []
    for f in dataclasses.fields(RunConfig):
        if f.name in SECTIONS:
            keys += [f"{f.name}.{g.name}" for g in dataclasses.fields(SECTIONS[f.name])]
        keys.append(f.name)
    return keys


# --- type checking --------------------------------------------------------------------------------------------


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against annotation ``tp``; convert int -> float, YAML's '1e-6' string -> float, and a
    scalar -> one-element list. Raises ValueError naming ``key``."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(value, arg, key)
            except ValueError:
                pass
        raise ValueError(f"{key}: expected {' or '.join(_type_name(a) for a in args)}, got {value!r}")
    if tp is Any:
        return value
    if origin is list:
        (item,) = typing.get_args(tp)
        items = value if isinstance(value, list) else [value] if isinstance(value, (str, int, float)) else None
        if items is None:
            raise ValueError(f"{key}: expected a list, got {value!r}")
        return [_coerce(v, item, f"{key}[{i}]") for i, v in enumerate(items)]
    if origin is dict:
        key_tp, val_tp = typing.get_args(tp)
        if not isinstance(value, dict):
            raise ValueError(f"{key}: expected a mapping, got {value!r}")
        return {_coerce(k, key_tp, key): _coerce(v, val_tp, f"{key}.{k}") for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{key}: expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{key}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool):
            raise ValueError(f"{key}: expected a number, got {value!r}")
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):  # PyYAML (YAML 1.1) reads 1e-6 as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise ValueError(f"{key}: expected a number, got {value!r}")
    if tp is str:
        if not isinstance(value, str):
            raise ValueError(f"{key}: expected a string, got {value!r}")
        return value
    raise TypeError(f"{key}: unsupported annotation {tp!r}")  # a bug in this module, not in the config


def _suggest(key: str, candidates: list[str]) -> str:
    close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
    if not close:  # a right field in the wrong section: match the last component
        leaf = key.rsplit(".", 1)[-1]
        close = [c for c in candidates if c.rsplit(".", 1)[-1] == leaf][:1]
    return f"; did you mean {close[0]!r}?" if close else ""


def _build(cls: type, data: dict[str, Any], prefix: str, source_of: Any) -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if key not in names:
            raise ConfigError(f"{source_of(dotted)}: unknown key {dotted!r}{_suggest(dotted, valid_keys())}")
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            if not isinstance(value, dict):
                raise ConfigError(f"{source_of(dotted)}: {dotted}: expected a mapping of keys, got {value!r}")
            kwargs[key] = _build(tp, value, f"{dotted}.", source_of)
            continue
        try:
            value = _coerce(value, tp, dotted)
        except ValueError as exc:
            raise ConfigError(f"{source_of(dotted)}: {exc}") from None
        choices = next(f for f in dataclasses.fields(cls) if f.name == key).metadata.get("choices")
        if choices and value is not None and value not in choices:
            raise ConfigError(f"{source_of(dotted)}: {dotted}: must be one of {list(choices)}, got {value!r}"
                              f"{_suggest(str(value), list(choices))}")
        kwargs[key] = value
    try:
        return cls(**kwargs)
    except TypeError as exc:  # a required field is missing
        missing = [f.name for f in dataclasses.fields(cls)
                   if f.name not in kwargs and f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING]
        raise ConfigError(f"{source_of(prefix + (missing[0] if missing else ''))}: "
                          f"missing required key {prefix}{missing[0] if missing else '?'} ({exc})") from None
    except ValueError as exc:
        msg = str(exc)
        dotted = msg.split(":", 1)[0] if ":" in msg else prefix.rstrip(".")
        raise ConfigError(f"{source_of(dotted)}: {msg}") from None


# --- loading --------------------------------------------------------------------------------------------------


def _deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict) and key != "train":
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value  # lists and data.train (list or mixture) replace rather than merge
    return out


def read_yaml(path: str | os.PathLike[str], _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """Read a config file, resolving ``base:`` (a path or list of paths, relative to the file) first."""
    path = Path(path).resolve()
    if path in _seen:
        raise ConfigError(f"{path}: base: inheritance cycle through {[str(p) for p in _seen]}")
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping of sections, got {type(data).__name__}")
    bases = data.pop("base", None) or []
    merged: dict[str, Any] = {}
    for base in [bases] if isinstance(bases, str) else bases:
        merged = _deep_merge(merged, read_yaml(path.parent / base, _seen + (path,)))
    return _deep_merge(merged, data)


def parse_overrides(args: list[str]) -> dict[str, Any]:
    """``['--optim.learning_rate=1e-6', ...]`` -> ``{'optim.learning_rate': '1e-6', ...}`` (YAML scalars)."""
    out: dict[str, Any] = {}
    for arg in args:
        body = arg[2:] if arg.startswith("--") else arg
        if "=" not in body or not body.split("=", 1)[0]:
            raise ConfigError(f"override {arg!r}: expected --section.key=value")
        key, raw = body.split("=", 1)
        try:
            out[key] = yaml.safe_load(raw) if raw else None
        except yaml.YAMLError:
            out[key] = raw
    return out


def apply_overrides(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    data = _deep_merge({}, data)
    for dotted, value in overrides.items():
        parts = dotted.split(".")
        node = data
        for part in parts[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"override --{dotted}: {part!r} is not a section")
            node = child
        node[parts[-1]] = value
    return data


def config_from_dict(data: dict[str, Any], source: str = "<dict>",
                     overrides: dict[str, Any] | None = None) -> RunConfig:
    """Validate a merged mapping (plus dotted overrides) into a :class:`RunConfig`."""
    overrides = overrides or {}
    data = apply_overrides(data, overrides)

    def source_of(dotted: str) -> str:
        for key in overrides:
            if dotted == key or dotted.startswith(key + ".") or key.startswith(dotted + "."):
                return f"override --{key}={overrides[key]!s}"
        return source

    if not isinstance(data, dict):
        raise ConfigError(f"{source}: top level must be a mapping")
    cfg = _build(RunConfig, data, "", source_of)
    _check_trainer_passthrough(cfg, source_of)
    return cfg


def load_config(path: str | os.PathLike[str], overrides: list[str] | None = None) -> RunConfig:
    """Load ``path`` (with its ``base:`` files) and apply ``--key=value`` overrides; validate everything."""
    return config_from_dict(read_yaml(path), str(path), parse_overrides(overrides or []))


def config_to_dict(cfg: RunConfig) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def save_config(cfg: RunConfig, path: str | os.PathLike[str]) -> None:
    """Write the resolved config as YAML, atomically."""
    atomic_write_text(path, yaml.safe_dump(config_to_dict(cfg), sort_keys=False))


# --- mapping onto the trainer's config ------------------------------------------------------------------------

# run-config key -> trainer (GRPOConfig / ICTGRPOConfig) field
FIELD_MAP: dict[str, str] = {
    "sampling.num_generations": "num_generations",
    "sampling.max_completion_length": "max_completion_length",
    "sampling.temperature": "temperature",
    "sampling.top_p": "top_p",
    "sampling.use_vllm": "use_vllm",
    "sampling.vllm_mode": "vllm_mode",
    "optim.learning_rate": "learning_rate",
    "optim.lr_scheduler_type": "lr_scheduler_type",
    "optim.warmup_steps": "warmup_steps",
    "optim.epsilon": "epsilon",
    "optim.epsilon_high": "epsilon_high",
    "optim.beta": "beta",
    "optim.num_iterations": "num_iterations",
    "optim.per_device_train_batch_size": "per_device_train_batch_size",
    "optim.gradient_accumulation_steps": "gradient_accumulation_steps",
    "optim.max_steps": "max_steps",
    "optim.num_train_epochs": "num_train_epochs",
    "optim.max_grad_norm": "max_grad_norm",
    "optim.weight_decay": "weight_decay",
    "optim.seed": "seed",
    "logging.report_to": "report_to",
    "logging.logging_steps": "logging_steps",
    "output_dir": "output_dir",
    "save_steps": "save_steps",
    "method.selector": "token_selector",
    "method.ratio": "selection_ratio",
    "method.scope": "selection_scope",
    "method.warmup_steps": "selection_warmup_steps",
    "method.normalization": "loss_normalization",
    "method.stapo_tau_p": "stapo_tau_p",
    "method.stapo_q": "stapo_q",
    "method.temperature": "selection_temperature",
    "method.stats_chunk_size": "stats_chunk_size",
    "method.topk": "selection_topk",
    "method.sparse_backward": "sparse_backward",
    "method.seed": "selection_seed",
}
# Set by ictrl train itself: a passthrough would be overwritten or break logging.
RESERVED = {"disable_tqdm", "save_strategy", "reward_weights", "model_init_kwargs"}


def _get(cfg: RunConfig, dotted: str) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def _trainer_field_names() -> set[str]:
    from ictrl.engine.run import trainer_classes  # lazy: pulls in TRL

    return {f.name for f in dataclasses.fields(trainer_classes()[0]) if f.init}


def _check_trainer_passthrough(cfg: RunConfig, source_of: Any) -> None:
    if not cfg.trainer:
        return
    owner = {v: k for k, v in FIELD_MAP.items()}
    names = _trainer_field_names()
    for key in cfg.trainer:
        dotted = f"trainer.{key}"
        if key in owner:
            raise ConfigError(f"{source_of(dotted)}: {dotted}: set it as {owner[key]!r} instead")
        if key in RESERVED:
            raise ConfigError(f"{source_of(dotted)}: {dotted}: managed by ictrl train; remove it")
        if key not in names:
            raise ConfigError(f"{source_of(dotted)}: unknown trainer field {dotted!r}"
                              f"{_suggest(key, sorted(names)).replace(repr(''), '')}")


def trainer_kwargs(cfg: RunConfig) -> dict[str, Any]:
    """Keyword arguments for the trainer's config class; ``None`` method fields are left to its defaults."""
    kwargs: dict[str, Any] = {}
    for dotted, name in FIELD_MAP.items():
        value = _get(cfg, dotted)
        if dotted.startswith("method.") and value is None:
            continue
        kwargs[name] = value
    if kwargs["warmup_steps"] >= 1:  # a step count; transformers reads floats < 1 as a ratio
        kwargs["warmup_steps"] = int(kwargs["warmup_steps"])
    if kwargs["epsilon_high"] is None:
        kwargs["epsilon_high"] = kwargs["epsilon"]
    kwargs["save_strategy"] = "steps" if cfg.save_steps > 0 else "no"
    if cfg.save_steps == 0:
        kwargs.pop("save_steps")
    kwargs["disable_tqdm"] = True  # the rich bar replaces tqdm and the per-step dict printer
    kwargs["run_name"] = f"{cfg.method.name}-{Path(cfg.output_dir).name}"
    if cfg.reward.weights is not None:
        kwargs["reward_weights"] = list(cfg.reward.weights)
    kwargs.update(cfg.trainer)
    return kwargs


def key_for_trainer_field(name: str) -> str:
    """The run-config key that sets trainer field ``name`` (``trainer.NAME`` if none does)."""
    return {v: k for k, v in FIELD_MAP.items()}.get(name, f"trainer.{name}")
