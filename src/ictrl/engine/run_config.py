"""The run config of ``ictrl train``: one YAML file -> :class:`RunConfig` -> ``ICTGRPOConfig``.

The schema is the trainer's own, as with TRL's ``--config``: every top-level key is an
:class:`ictrl.engine.config.ICTGRPOConfig` field by its exact name (``learning_rate``, ``num_generations``,
``token_selector``, ...), validated by that dataclass with its help text. Small sections hold what the
trainer config does not: ``model:`` (:class:`ModelConfig`), ``data:`` (:class:`DataConfig`), ``reward:``
(:class:`RewardConfig`) and the optional ``peft:`` (:class:`PeftSection`, LoRA), whose keys are their field
names. ``base:`` (a path or a list, relative to the file)
names files merged first. Command-line flags override any key: ``--learning_rate=2e-6``, ``--learning_rate
2e-6``, ``--data.train=[math_train]``.

Every key is checked (name and type) on load, before anything heavy happens; values are checked by the dataclass
that owns them. Errors are :class:`ConfigError` naming where the key came from (the file or the flag) and, for a
typo, the closest valid key.
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

from ictrl.engine.config_yaml import MAX_CONFIG_BYTES, load_yaml_text, load_yaml_value
from ictrl.errors import QUOTE_LIMIT, ConfigError, quote, shorten
from ictrl.files import atomic_write_text


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
                    raise ValueError(f"data.train.{name}: mixture weight must be > 0, got {quote(weight)}")
        elif not self.train:
            raise ValueError("data.train: at least one source is required")
        if self.max_prompt_length is not None and self.max_prompt_length < 1:
            raise ValueError(f"data.max_prompt_length: must be >= 1 or null, got {quote(self.max_prompt_length)}")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"data.limit: must be >= 1 or null, got {quote(self.limit)}")

    def source_names(self) -> list[str]:
        return list(self.train)


@dataclass
class RewardConfig:
    names: list[str] | None = field(
        default=None,
        metadata=_help("Reward functions: 'verifiable' (each row's kind picks the math/gsm8k/choice reward), "
                       "an ictrl.rewards registry name (math, gsm8k, choice, format) or 'module:function' with "
                       "TRL's signature. None: ['verifiable']. The first one is reported as `accuracy`. Weights: "
                       "the trainer field reward_weights."),
    )
    overlong_buffer_length: int | None = field(
        default=None,
        metadata=_help("DAPO's soft overlong penalty (Eq. 13; TRL's get_soft_overlong_punishment), added after the "
                       "rewards above: 0 up to max_completion_length - L, then falling linearly to -1 at "
                       "max_completion_length, times overlong_penalty_factor. L is this buffer length in tokens; "
                       "None: no penalty. Truncation masking is the trainer field mask_truncated_completions."),
    )
    overlong_penalty_factor: float = field(
        default=1.0, metadata=_help("Weight of the overlong penalty (its entry in reward_weights).")
    )

    def __post_init__(self) -> None:
        if self.names is not None and not self.names:
            raise ValueError("reward.names: empty list; use null for the data's default reward")
        buffer = self.overlong_buffer_length
        if buffer is not None and (isinstance(buffer, bool) or not isinstance(buffer, int) or buffer < 1):
            raise ValueError(f"reward.overlong_buffer_length: must be an int >= 1 or null, got {quote(buffer)}")
        factor = self.overlong_penalty_factor
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 <= factor < float("inf"):
            raise ValueError(f"reward.overlong_penalty_factor: must be a finite number >= 0, got {quote(factor)}")


@dataclass
class PeftSection:
    """LoRA through TRL's ``peft_config`` (``ictrl.engine.model_init.peft_config``); the defaults are TRL's
    command line's (``trl grpo --use_peft``). Present means on; ``peft: null`` turns a base file's LoRA off."""

    r: int = field(default=16, metadata=_help("LoRA rank."))
    lora_alpha: int = field(default=32, metadata=_help("LoRA scaling numerator (the update is alpha / r · BA)."))
    lora_dropout: float = field(default=0.05, metadata=_help("Dropout on the LoRA branch's input."))
    target_modules: list[str] | None = field(
        default=None,
        metadata=_help("Module names to adapt (q_proj, v_proj, ...), or 'all-linear'. None: peft's default for "
                       "the architecture (q_proj and v_proj for Qwen2 and Llama)."),
    )

    def __post_init__(self) -> None:
        if isinstance(self.r, bool) or not isinstance(self.r, int) or self.r < 1:
            raise ValueError(f"peft.r: must be an int >= 1, got {self.r!r}")
        if isinstance(self.lora_alpha, bool) or not isinstance(self.lora_alpha, int) or self.lora_alpha < 1:
            raise ValueError(f"peft.lora_alpha: must be an int >= 1, got {self.lora_alpha!r}")
        if not 0.0 <= self.lora_dropout < 1.0:
            raise ValueError(f"peft.lora_dropout: must be in [0, 1), got {self.lora_dropout!r}")
        if self.target_modules is not None and not self.target_modules:
            raise ValueError("peft.target_modules: empty list; use null for peft's default")


SECTIONS: dict[str, type] = {"model": ModelConfig, "data": DataConfig, "reward": RewardConfig, "peft": PeftSection}
# Sections whose absence (or null) means "off" rather than "defaults".
OPTIONAL_SECTIONS = ("peft",)


@dataclass
class RunConfig:
    """A validated run config: the ictrl sections (``peft`` None when LoRA is off) plus ``trainer``, the top-level
    ``ICTGRPOConfig`` keys as written (type-checked; their values are checked when
    :func:`ictrl.engine.run.build_trainer_args` builds the trainer config)."""

    model: ModelConfig
    data: DataConfig = field(default_factory=DataConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    trainer: dict[str, Any] = field(default_factory=dict)
    peft: PeftSection | None = None

    @property
    def output_dir(self) -> str:
        return str(self.trainer["output_dir"])

    @property
    def seed(self) -> int:
        return int(self.trainer.get("seed", 42))  # TrainingArguments' default


def trainer_fields() -> dict[str, dataclasses.Field[Any]]:
    """``ICTGRPOConfig``'s init fields by name (imports TRL: a few seconds, still before any model loads)."""
    from ictrl.engine.config import ICTGRPOConfig

    return {f.name: f for f in dataclasses.fields(ICTGRPOConfig) if f.init}


def _trainer_hints() -> dict[str, Any]:
    from ictrl.engine.config import ICTGRPOConfig

    hints: dict[str, Any] = {}
    for klass in reversed(ICTGRPOConfig.__mro__):  # per class: one unresolvable hint must not hide the others
        try:
            hints.update(typing.get_type_hints(klass))
        except Exception:  # noqa: BLE001 - an annotation we cannot evaluate is left unchecked here
            continue
    return hints


def valid_keys() -> list[str]:
    """Every key a run config accepts: trainer fields, the sections, then ``section.key``."""
    return [*trainer_fields(), *SECTIONS,
            *(f"{s}.{f.name}" for s, cls in SECTIONS.items() for f in dataclasses.fields(cls))]


# --- type checking --------------------------------------------------------------------------------------------


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce_union(value: Any, tp: Any, key: str) -> Any:
    args = typing.get_args(tp)
    if value is None and type(None) in args:
        return None
    known = (bool, int, float, str, list, dict)
    # Known types first: an enum or Literal member accepts anything here (its dataclass checks it).
    options = sorted((a for a in args if a is not type(None)),
                     key=lambda a: (a not in known and typing.get_origin(a) not in (list, dict)))
    if len(options) == 1:  # Optional[X]: X's own message
        return _coerce(value, options[0], key)
    for arg in options:
        try:
            return _coerce(value, arg, key)
        except ValueError:
            pass
    raise ValueError(f"{key}: expected {' or '.join(_type_name(a) for a in args)}, got {quote(value)}")


def _coerce_container(value: Any, tp: Any, key: str) -> Any:
    args = typing.get_args(tp)
    if typing.get_origin(tp) is list:
        items = value if isinstance(value, list) else [value] if isinstance(value, (str, int, float)) else None
        if items is None:
            raise ValueError(f"{key}: expected a list, got {quote(value)}")
        return [_coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(items)] if args else items
    if not isinstance(value, dict):
        raise ValueError(f"{key}: expected a mapping, got {quote(value)}")
    if not args:
        return value
    return {_coerce(k, args[0], key): _coerce(v, args[1], f"{key}.{k}") for k, v in value.items()}


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against annotation ``tp``; convert YAML's '1e-6' string -> float, and a
    scalar -> one-element list. Annotations it does not know (enums, Literal) pass the value through to the
    dataclass that owns it. Raises ValueError naming ``key``."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return _coerce_union(value, tp, key)
    if origin in (list, dict) or tp in (list, dict):
        return _coerce_container(value, tp, key)
    if tp is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{key}: expected true/false, got {quote(value)}")
    elif tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{key}: expected an integer, got {quote(value)}")
    elif tp is float:
        if isinstance(value, str):  # PyYAML (YAML 1.1) reads 1e-6 as a string
            try:
                return float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{key}: expected a number, got {quote(value)}")
        return value  # an int stays an int (save_steps: 50, not 50.0)
    elif tp is str and isinstance(value, bool):
        return "yes" if value else "no"  # YAML 1.1 reads no/off/yes/on as booleans: `save_strategy: no`
    elif tp is str and not isinstance(value, str):
        raise ValueError(f"{key}: expected a string, got {quote(value)}")
    elif tp is type(None) and value is not None:
        raise ValueError(f"{key}: expected null, got {quote(value)}")
    return value


def _suggest(key: str, candidates: list[str]) -> str:
    if len(key) > 100:  # no key is that long; difflib's work grows with it
        return ""
    close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
    if not close:  # a right field in the wrong place: match the last component
        leaf = key.rsplit(".", 1)[-1]
        close = [c for c in candidates if c.rsplit(".", 1)[-1] == leaf][:1]
    return f"; did you mean {close[0]!r}?" if close else ""


def _build_section(cls: type, data: Any, prefix: str, source_of: Any) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{source_of(prefix)}: {prefix}: expected a mapping of keys, got {quote(data)}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}.{key}"
        if key not in fields:
            raise ConfigError(f"{source_of(dotted)}: unknown key {quote(dotted)}{_suggest(dotted, valid_keys())}")
        try:
            value = _coerce(value, hints[key], dotted)
        except ValueError as exc:
            raise ConfigError(f"{source_of(dotted)}: {exc}") from None
        choices = fields[key].metadata.get("choices")
        if choices and value is not None and value not in choices:
            raise ConfigError(f"{source_of(dotted)}: {dotted}: must be one of {list(choices)}, got {quote(value)}"
                              f"{_suggest(str(value), list(choices))}")
        kwargs[key] = value
    try:
        return cls(**kwargs)
    except ValueError as exc:
        msg = str(exc)
        raise ConfigError(f"{source_of(msg.split(':', 1)[0] if ':' in msg else prefix)}: {msg}") from None


def _check_trainer_keys(data: dict[str, Any], source_of: Any) -> dict[str, Any]:
    fields = trainer_fields()
    hints = _trainer_hints()
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key not in fields:
            raise ConfigError(f"{source_of(key)}: unknown key {quote(key)}{_suggest(key, valid_keys())}")
        try:
            out[key] = _coerce(value, hints[key], key) if key in hints else value
        except ValueError as exc:
            raise ConfigError(f"{source_of(key)}: {exc}") from None
    return out


# --- loading --------------------------------------------------------------------------------------------------


def _deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict) and key in SECTIONS:
            out[key] = _deep_merge_section(out[key], value)
        else:
            out[key] = value  # lists and trainer mappings replace rather than merge
    return out


def _deep_merge_section(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    return {**base, **top}  # data.train (list or mixture) replaces


def read_yaml(path: str | os.PathLike[str], _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """Read a config file, resolving ``base:`` (a path or list of paths, relative to the file) first."""
    path = Path(path).resolve()
    if path in _seen:
        raise ConfigError(f"{path}: base: inheritance cycle through {[str(p) for p in _seen]}")
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    size = path.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: {size} bytes, more than a run config's {MAX_CONFIG_BYTES}; is it the right file?")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not a text file (byte {exc.start} is not UTF-8); a run config is YAML") from None
    data = load_yaml_text(text, str(path)) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping of keys, got {type(data).__name__}")
    bases = data.pop("base", None) or []
    merged: dict[str, Any] = {}
    for base in [bases] if isinstance(bases, str) else bases:
        merged = _deep_merge(merged, read_yaml(path.parent / base, _seen + (path,)))
    return _deep_merge(merged, data)


MAX_FLAG_CHARS = 1 << 16  # a value typed on a command line; PyYAML reads a megabyte in seconds


def _scalar(key: str, raw: str | None) -> Any:
    if raw is None:
        return True  # a bare --flag
    if len(raw) > MAX_FLAG_CHARS:
        raise ConfigError(f"override --{shorten(key, 100)}: a value of {len(raw)} characters, more than "
                          f"{MAX_FLAG_CHARS}; put long values in the config file")
    return load_yaml_value(raw, f"override {quote(raw)}") if raw else None


def parse_overrides(args: list[str]) -> dict[str, Any]:
    """``['--learning_rate=1e-6', '--seed', '3', '--data.limit=8', '--bf16']`` -> ``{'learning_rate': 1e-6,
    'seed': 3, 'data.limit': 8, 'bf16': True}`` (values read as YAML scalars; a bare flag is true)."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--") or not arg[2:] or arg[2:].startswith("="):
            raise ConfigError(f"override {quote(arg)}: expected --key=value or --key value")
        body = arg[2:]
        if "=" in body:
            key, raw = body.split("=", 1)
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            key, raw = body, args[i + 1]
            i += 1
        else:
            key, raw = body, None
        out[key] = _scalar(key, raw)
        i += 1
    return out


def apply_overrides(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    data = _deep_merge({}, data)
    for dotted, value in overrides.items():
        section, dot, key = dotted.partition(".")
        if not dot:
            data[dotted] = value
            continue
        node = data.get(section)
        if node is None:
            node = data[section] = {}
        if not isinstance(node, dict):
            raise ConfigError(f"override --{dotted}: {section!r} is not a section")
        data[section] = {**node, key: value}
    return data


def _shown(value: Any) -> str:
    """A flag's value as the user typed it (a string or number), else :func:`ictrl.errors.quote`."""
    if isinstance(value, str):
        return shorten(value, QUOTE_LIMIT)
    return str(value) if value is None or isinstance(value, (bool, float)) else quote(value)


def config_from_dict(data: dict[str, Any], source: str = "<dict>",
                     overrides: dict[str, Any] | None = None) -> RunConfig:
    """Validate a merged mapping (plus flag overrides, ``{'learning_rate': 1e-6}``) into a :class:`RunConfig`."""
    overrides = overrides or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: top level must be a mapping")
    data = apply_overrides(data, overrides)

    def source_of(dotted: str) -> str:
        for key in overrides:
            if dotted == key or dotted.startswith(key + ".") or key.startswith(dotted + "."):
                return f"override --{shorten(key, 100)}={_shown(overrides[key])}"
        return source

    sections = {name: _build_section(cls, data[name] or {}, name, source_of)
                for name, cls in SECTIONS.items()
                if name in data and not (name in OPTIONAL_SECTIONS and data[name] is None)}
    if "model" not in sections:
        raise ConfigError(f"{source}: missing required key model.name_or_path")
    if not data.get("output_dir"):
        raise ConfigError(f"{source}: missing required key output_dir")
    trainer = _check_trainer_keys({k: v for k, v in data.items() if k not in SECTIONS}, source_of)
    weights, names = trainer.get("reward_weights"), sections.get("reward", RewardConfig()).names
    if weights is not None and (names is None or len(weights) != len(names)):
        raise ConfigError(f"{source_of('reward_weights')}: reward_weights: needs exactly one weight per entry of "
                          "reward.names")
    return RunConfig(trainer=trainer, **sections)


def load_config(path: str | os.PathLike[str], overrides: list[str] | None = None) -> RunConfig:
    """Load ``path`` (with its ``base:`` files) and apply flag overrides; check every key."""
    return config_from_dict(read_yaml(path), str(path), parse_overrides(overrides or []))


def config_to_dict(cfg: RunConfig) -> dict[str, Any]:
    """The YAML form: the sections in full (an optional one only when on), then the trainer keys as given."""
    out: dict[str, Any] = {name: dataclasses.asdict(getattr(cfg, name)) for name in SECTIONS
                           if getattr(cfg, name) is not None}
    return {**out, **cfg.trainer}


def save_config(cfg: RunConfig, path: str | os.PathLike[str]) -> None:
    """Write the resolved config as YAML, atomically."""
    atomic_write_text(path, yaml.safe_dump(config_to_dict(cfg), sort_keys=False))


# -------------------------------------------------------------------------------------- a method's keys

# Every trainer key that belongs to the method: a grid replaces them all when it sets its own method.
METHOD_FIELDS = ("token_selector", "selection_ratio", "selection_scope", "selection_warmup_steps",
                 "selection_options", "loss_normalization", "run_name")


def method_config(name: str, warmup_steps: int | None = None) -> dict[str, Any]:
    """The trainer keys that choose method ``name`` (a selector name, label or ``module:function``): its selector,
    its registered loss normaliser (for ``all`` it would otherwise follow TRL's ``loss_type``) and run name (the
    method's label), plus Θ = ``warmup_steps`` for a method that warms up. Everything else is the selector's
    registered default, resolved by ``ICTGRPOConfig``."""
    from ictrl.core.selection import get_selector

    selector = get_selector(name)
    keys: dict[str, Any] = {"token_selector": name if ":" in name else selector.name, "run_name": selector.label,
                            "loss_normalization": selector.normalization}
    if warmup_steps is not None and selector.warmup_steps > 0:
        keys["selection_warmup_steps"] = warmup_steps
    return keys
