"""The run config of ``ictrl train``: the flat file of ``trl grpo --config``, read by TRL's own parser.

Every key is a field of one of the three dataclasses TRL's ``TrlParser`` reads for ``trl grpo``, and means what it
means there: :class:`ScriptArguments` (TRL's ``GRPOScriptArguments``: ``dataset_name``, ``reward_funcs``, ... plus
the few keys ictrl adds), ``ICTGRPOConfig`` (TRL's ``GRPOConfig`` plus token selection) and TRL's ``ModelConfig``
(``model_name_or_path``, ``dtype``, ``use_peft``, ``lora_r``, ``load_in_4bit``, ...). ``base:`` (a path or a list,
relative to the file) names files merged first, key by key; ``env:`` sets environment variables, as in TRL.

The command line's flags (``--learning_rate=2e-6``, ``--learning-rate 2e-6``, ``--scale_rewards=false``) are text,
parsed once by TRL's argument parser: its types, choices and booleans (``true``, ``no``, ``1``, ...) are their
checks. A file's values are typed already: each is checked against its field's type as that parser reads it
(``ictrl.validation.file_value``), so it means what the same text means as a flag; a value TRL's parser takes as it is
(``null``, a mapping, a list of mappings) keeps its YAML form, as ``TrlParser`` does. Errors are
:class:`ConfigError` lines naming the file or the flag and the key.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import yaml
import trl
from trl import TrlParser
from trl.scripts.grpo import GRPOScriptArguments

from ictrl.engine.config_fields import RANGES
from ictrl.train_cli.config_yaml import MAX_CONFIG_BYTES, load_yaml_value
from ictrl.cliargs import PATH_KEYS, expand_paths
from ictrl.errors import QUOTE_LIMIT, ConfigError, UserError, did_you_mean, quote, shorten
from ictrl.files import atomic_write_text, without_secrets
from ictrl.validation import AT_LEAST_ONE, NON_NEGATIVE, check_fields, file_value, type_text
from ictrl.yamlfile import load_yaml


@dataclass
class ScriptArguments(GRPOScriptArguments):
    """TRL's ``GRPOScriptArguments``; ``dataset_name`` and ``reward_funcs`` also take ictrl's names, and the keys
    below are ictrl's own (TRL has no equivalent)."""

    dataset_name: str | None = field(
        default=None,
        metadata={"help": "Training data: an ictrl.data registry name (gsm8k_train, math_train, "
                          "math_train:levels=3,4,5), jsonl:PATH, or as in trl grpo a local dataset directory or a hub "
                          "id owner/name (read by datasets.load_dataset with dataset_config and dataset_train_split, a "
                          "'prompt' column); in "
                          "YAML also a list (concatenated) or a mapping name: weight (a mixture); a flag takes the "
                          "same as YAML flow ('[a, b]', '{a: 1, b: 3}')."},
    )
    reward_funcs: list[str] | None = field(
        default=None,
        metadata={"help": "Reward functions: ictrl's graders ('verifiable', the default: each row's kind picks the "
                          "math, gsm8k or choice reward; or math, gsm8k, choice, format), trl grpo's names "
                          "(accuracy_reward, think_format_reward, ...) or a dotted path / module:function with TRL's "
                          "signature; a flag also takes the YAML list '[a, b]'. The first is reported as accuracy."},
    )
    dataset_limit: Annotated[int | None, AT_LEAST_ONE] = field(
        default=None, metadata={"help": "Use at most this many training rows (of the mixture when several)."})
    max_prompt_length: Annotated[int | None, AT_LEAST_ONE] = field(
        default=None,
        metadata={"help": "Drop training prompts longer than this many tokens (after the chat template); null (the "
                          "default, as TRL 1.16, which has no such key) keeps all, and a prompt that cannot fit the "
                          "model's positions beside max_completion_length is refused naming its row. Dropping, not "
                          "truncating: a cut question has no verifiable answer."},
    )
    eval_datasets: list[str] = field(
        default_factory=list,
        metadata={"help": "Benchmarks to evaluate the trained model on with `ictrl eval` (recorded in config.yaml; "
                          "not run during training: that is eval_benchmarks)."},
    )
    overlong_buffer_length: Annotated[int | None, AT_LEAST_ONE] = field(
        default=None,
        metadata={"help": "DAPO's soft overlong penalty (Eq. 13; TRL's get_soft_overlong_punishment) added after "
                          "reward_funcs: 0 up to max_completion_length - L, then falling linearly to -1 at "
                          "max_completion_length, times overlong_penalty_factor; L is this length in tokens."},
    )
    overlong_penalty_factor: Annotated[float, NON_NEGATIVE] = field(
        default=1.0, metadata={"help": "Weight of the overlong penalty (its entry in reward_weights)."})
    chat_template_path: str | None = field(
        default=None,
        metadata={"help": "The chat template for chat-message prompts when the model's tokenizer has none (a base "
                          "model), as TRL's SFTConfig key: a Jinja file (.jinja, .j2) or a tokenizer folder or hub id "
                          "whose template is used; saved with the trained model's tokenizer."},
    )

    # trl grpo's DatasetMixtureConfig keys, read by trl.get_dataset as trl grpo reads them
    datasets: list[dict[str, Any]] | str | None = field(  # str: a flag's YAML flow, read in __post_init__
        default=None,
        metadata={"help": "TRL's dataset mixture (trl grpo's `datasets:`): a list of mappings with datasets."
                          "load_dataset's path, name, data_dir, data_files, split, and columns and fraction, loaded "
                          "and concatenated by trl.get_dataset; used in place of dataset_name (a local file: path: "
                          "json, data_files: FILE). A flag takes YAML flow: '[{path: json, data_files: a.jsonl}]'."},
    )
    streaming: bool = field(default=False, metadata={"help": "Stream the `datasets:` mixture (TRL's key)."})
    test_split_size: float | None = field(
        default=None, metadata={"help": "Split the `datasets:` mixture into train and test (TRL's key: "
                                        "datasets.train_test_split's test_size)."})

    def __post_init__(self) -> None:
        if isinstance(self.dataset_name, str) and self.dataset_name.lstrip()[:1] in ("[", "{"):
            self.dataset_name = load_yaml_value(self.dataset_name, "dataset_name")
        funcs = self.reward_funcs
        if isinstance(funcs, list) and len(funcs) == 1 and isinstance(funcs[0], str) and funcs[0].lstrip()[:1] == "[":
            self.reward_funcs = load_yaml_value(funcs[0], "reward_funcs")  # a flag's '[a, b]', as dataset_name's
        for key in ("reward_funcs", "eval_datasets"):  # list[str] fields the type checks below skip
            value = getattr(self, key)
            if value is not None and (not isinstance(value, list) or not all(isinstance(v, str) for v in value)):
                raise ValueError(f"{key}: expected a list of names, got {quote(value)}")
        train = self.dataset_name
        if isinstance(train, dict):
            for name, weight in train.items():
                if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 < weight < math.inf:
                    raise ValueError(f"dataset_name.{name}: mixture weight must be a finite number > 0, got "
                                     f"{quote(weight)}")
        elif not isinstance(train, (str, list, type(None))) or not all(isinstance(n, str) for n in self.sources()):
            raise ValueError(f"dataset_name: expected a name, a list of names or a mapping name: weight, got "
                             f"{quote(train)}")
        self._read_mixture()
        check_fields(self, ScriptArguments, types=False)  # dataset_name takes a list or mapping too, read above
        if self.reward_funcs is not None and not self.reward_funcs:
            raise ValueError("reward_funcs: empty list; use null for the default ['verifiable']")

    def _read_mixture(self) -> None:
        """``datasets``: a flag's YAML flow read, each entry a mapping of TRL's ``DatasetConfig`` keys with a
        ``path``."""
        from trl.scripts.utils import DatasetConfig

        mixture = self.datasets
        if isinstance(mixture, str):
            mixture = self.datasets = load_yaml_value(mixture, "datasets")
        if mixture is None:
            return
        if not isinstance(mixture, list) or not mixture:
            raise ValueError("datasets: expected a list of mappings (path: ..., data_files: ...), got "
                             f"{quote(mixture)}")
        keys = [f.name for f in dataclasses.fields(DatasetConfig)]
        for i, entry in enumerate(mixture):
            if not isinstance(entry, dict):
                raise ValueError(f"datasets[{i}]: expected a mapping with path (and {', '.join(keys[1:])}), got "
                                 f"{quote(entry)}")
            unknown = [k for k in entry if k not in keys]
            if unknown:
                raise ValueError(f"datasets[{i}]: unknown key {quote(unknown[0])}; TRL's keys: {', '.join(keys)}"
                                 f"{did_you_mean(str(unknown[0]), keys)}")
            if not isinstance(entry.get("path"), str) or not entry["path"]:
                raise ValueError(f"datasets[{i}].path: required: a datasets.load_dataset path (json, parquet, csv with "
                                 "data_files; a folder; a hub id)")

    def sources(self) -> list[str]:
        """The training sources' names (a mixture's keys)."""
        return [self.dataset_name] if isinstance(self.dataset_name, str) else list(self.dataset_name or [])

    def reward_names(self) -> list[str]:
        """The reward functions' names the run builds: ``reward_funcs``, or its default ``['verifiable']``."""
        return list(self.reward_funcs or ["verifiable"])


@dataclass
class ModelConfig(trl.ModelConfig):
    """TRL's ``ModelConfig``, its LoRA values held to their ranges (``ictrl.engine.config_fields.RANGES``)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_fields(self, ModelConfig, inherited=RANGES)


@dataclass
class RunConfig:
    """A parsed run config: TRL's three argument dataclasses, the trainer's as the keys given (``trainer``:
    ``ICTGRPOConfig`` is built from them by :func:`ictrl.train_cli.trainer_inputs.build_trainer_args`, which needs the
    process count), and the keys set by command-line flags (``flags``: key -> the value read, as text), which errors
    blame."""

    script: ScriptArguments
    model: ModelConfig
    trainer: dict[str, Any] = field(default_factory=dict)
    flags: dict[str, str] = field(default_factory=dict, compare=False)
    method_from: str = field(default="file", compare=False)  # where token_selector came from: file, flag, default
    modes: frozenset[str] = field(default_factory=frozenset, compare=False)  # ictrl train's --overwrite, --allow-no-op

    @property
    def output_dir(self) -> str:
        return str(self.trainer["output_dir"])

    @property
    def seed(self) -> int:
        return int(self.trainer.get("seed", 42))  # TrainingArguments' default


# The nested spelling of earlier ictrl configs -> the key that replaced it.
OLD_KEYS = {"model.name_or_path": "model_name_or_path", "model.dtype": "dtype",
            "model.trust_remote_code": "trust_remote_code", "data.train": "dataset_name",
            "data.eval": "eval_datasets", "data.max_prompt_length": "max_prompt_length", "data.limit": "dataset_limit",
            "reward.names": "reward_funcs", "reward.overlong_buffer_length": "overlong_buffer_length",
            "reward.overlong_penalty_factor": "overlong_penalty_factor", "peft.r": "lora_r",
            "peft.lora_alpha": "lora_alpha", "peft.lora_dropout": "lora_dropout",
            "peft.target_modules": "lora_target_modules"}
SECTIONS = {"model": "model_name_or_path", "data": "dataset_name", "reward": "reward_funcs",
            "peft": "use_peft: true with lora_r, lora_alpha, lora_dropout, lora_target_modules"}
# trl grpo's fourth dataclass (DatasetMixtureConfig): hub datasets, which ictrl train does not load.
POINTERS: dict[str, str] = {  # keys since removed, and what took their place
    "selection_topk_source": "removed: the top-K of selection_topk now always comes from the LM head"}
# The method of a file that sets no token_selector. Such a file is a `trl grpo` file, and `ictrl train` runs it as
# TRL's GRPO (every response token, TRL's normaliser for loss_type): a TRL user's config never changes method
# silently. ICTGRPOConfig itself defaults to ict: the Python class is ICT's trainer by name.
DEFAULT_SELECTOR = "all"  # a value typed on a command line; argparse and the checks walk it
INIT_KWARGS = "model_init_kwargs"  # from_pretrained's keys: a mapping here (TRL takes JSON text too)


def _raise(message: str) -> None:
    raise ConfigError(message)


@functools.lru_cache(maxsize=1)
def parser() -> TrlParser:
    """TRL's parser of ``trl grpo``'s dataclasses, ictrl's in their place; errors raise instead of exiting."""
    from ictrl.engine.config import ICTGRPOConfig

    p = TrlParser((ScriptArguments, ICTGRPOConfig, ModelConfig), allow_abbrev=False)  # a typo is not a prefix
    p.error = _raise  # type: ignore[method-assign]  # argparse's documented hook for its error line
    return p


class _Given(argparse.Namespace):
    """A namespace that holds only the keys the flags gave, in their order: argparse fills in a field's default
    only where the namespace lacks the key, and this one lacks none."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # argparse's own attributes
            raise AttributeError(name)
        return None


@functools.lru_cache(maxsize=1)
def owners() -> dict[str, type]:
    """Each key -> the dataclass that owns it."""
    return {f.name: cls for cls in parser().dataclass_types for f in dataclasses.fields(cls) if f.init}


def _suggest(key: str) -> str:
    """The pointer for ``key``: its new name, TRL's key it stands for, or a near spelling (close enough not to be
    another field: ``use_peft`` is not ``use_cpu``)."""
    if len(key) > 100:
        return ""
    if key in OLD_KEYS or key in SECTIONS:
        return f"; it is now {OLD_KEYS.get(key) or SECTIONS[key]}"
    if key in POINTERS:
        return f"; {POINTERS[key]}"
    family = [k for k in owners() if k.split("_", 1)[0] == key.split("_", 1)[0]]  # lora_rank: the lora_ keys
    return did_you_mean(key, family) or did_you_mean(key, owners(), cutoff=0.9)


def _old_sections(data: dict[str, Any], source: str) -> None:
    for section, new in SECTIONS.items():
        if section in data:
            inner = data[section] if isinstance(data[section], dict) else {}
            old = next((f"{section}.{k}" for k in inner if f"{section}.{k}" in OLD_KEYS), None)
            said = f"{old} is now {OLD_KEYS[old]}" if old else f"the {section}: section is now {new}"
            raise ConfigError(f"{source}: {said} (a run config is flat, as trl grpo's: docs/trl-contract.md)")


def _as_text(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


# Keys whose dataclass reads more than their annotation says (the parser's type is its flag's): the type a file's
# value is checked against here.
FILE_TYPES: dict[str, Any] = {
    "dataset_name": str | list[Any] | dict[Any, Any] | None,  # a name, a list of names or a mixture
    "datasets": list[Any] | dict[Any, Any] | None,  # TRL's mixture: ScriptArguments names what an entry lacks
}


def _file_values(data: dict[str, Any], source: str) -> dict[str, Any]:
    """``data``'s values, each checked once against its field's declared type (``ictrl.validation.file_value``: the
    type as TRL's parser reads it, its choices, null where the field takes it) and returned as the field takes
    it."""
    values = {}
    for key, value in data.items():
        if key not in owners():
            raise ConfigError(f"{source}: unknown key {quote(key)}{_suggest(str(key))}")
        choices = _field(key).metadata.get("choices")
        try:
            values[key] = file_value(key, value, FILE_TYPES.get(key, _type_hints(owners()[key])[key]),
                                     tuple(choices) if choices is not None else None, _takes_null(key))
        except ValueError as exc:
            raise ConfigError(f"{source}: {shorten(str(exc), 300)}") from None
    return values


def _field(key: str) -> dataclasses.Field[Any]:
    return next(f for f in dataclasses.fields(owners()[key]) if f.name == key)


def _takes_null(key: str) -> bool:
    """Whether ``key``'s field admits None: its annotation says so, or None is its default."""
    annotation = type_text(_type_hints(owners()[key])[key])
    return _field(key).default is None or "None" in annotation or "Optional" in annotation


@functools.lru_cache(maxsize=None)
def _type_hints(cls: type) -> dict[str, Any]:
    """``cls``'s field types, as TRL's parser reads them (an ictrl field's range left out)."""
    import typing

    return typing.get_type_hints(cls)


def _argument_error(message: str, where: Any) -> ConfigError:
    """argparse's ``argument --KEY/--K-EY: why`` as one line naming ``where(key)`` and the key."""
    message = message.removeprefix("argument ")
    key = message.split(":", 1)[0].split("/")[0].lstrip("-").replace("-", "_")
    return ConfigError(f"{where(key)}: {key}:{shorten(message.split(':', 1)[-1], 300)}")


def _parse(argv: list[str], where: Any) -> dict[str, Any]:
    """``argv`` through TRL's parser -> key -> value; ``where(key)`` names the source in errors."""
    try:
        namespace, rest = parser().parse_known_args(argv, _Given())
    except (ConfigError, argparse.ArgumentError) as exc:
        raise _argument_error(str(exc), where) from None
    if rest:
        bad = next((r for r in rest if r.startswith("--")), rest[0])
        key = bad[2:].partition("=")[0].replace("-", "_")
        if not bad.startswith("--") or not key:
            raise ConfigError(f"override {quote(bad)}: expected --key=value or --key value")
        raise ConfigError(f"{where(key)}: unknown key {quote(key)}{_suggest(key)}")
    return vars(namespace)


def read_yaml(path: str | os.PathLike[str], _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """Read a config file, resolving ``base:`` (a path or list of paths, relative to the file) first."""
    path = Path(path).resolve()
    if path in _seen:
        raise ConfigError(f"{path}: base: inheritance cycle through {[str(p) for p in _seen]}")
    if not path.is_file():
        raise ConfigError(f"{path}: " + ("a directory, not a config file" if path.is_dir()
                                         else "config file not found"))
    size = path.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: {size} bytes, more than a run config's {MAX_CONFIG_BYTES}; is it the right file?")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not a text file (byte {exc.start} is not UTF-8); a run config is YAML") from None
    data = load_yaml(text, str(path)) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping of keys, got {type(data).__name__}")
    _old_sections(data, str(path))
    bases = data.pop("base", None) or []
    bases = [bases] if isinstance(bases, str) else bases
    if not isinstance(bases, list) or not all(isinstance(base, str) for base in bases):
        raise ConfigError(f"{path}: base: expected a config file or a list of them, got {quote(bases)}")
    env = data.pop("env", None) or {}
    if not isinstance(env, dict):
        raise ConfigError(f"{path}: env: expected a mapping of environment variables, got {quote(env)}")
    merged: dict[str, Any] = {}
    for base in bases:
        merged.update(read_yaml(path.parent / base, _seen + (path,)))
    env = {**merged.pop("env", {}), **env}
    return {**merged, **data, **({"env": env} if env else {})}


def config_from_dict(data: dict[str, Any], source: str = "<dict>", flags: list[str] | None = None) -> RunConfig:
    """Parse a merged mapping (:func:`read_yaml`'s, or a mapping of keys built in Python) and command-line
    ``flags`` (``['--learning_rate=1e-6']``, as ``ictrl.train_cli.cli.parse_argv`` read them) into a
    :class:`RunConfig`: every key through TRL's parser and its field's checks."""
    flags = list(flags or [])
    data = dict(data)  # the file's mapping, its old sections and env: checked by read_yaml
    env = data.pop("env", None) or {}
    values = _file_values(data, source)
    set_by_flag = _parse(flags, lambda key: f"override --{shorten(key, 100)}")
    values.update(set_by_flag)
    shown = {key: shorten(_as_text(value), QUOTE_LIMIT) for key, value in set_by_flag.items()}

    def where(key: str) -> str:
        return f"override --{shorten(key, 100)}={shown[key]}" if key in shown else source

    for key in PATH_KEYS & values.keys():  # ~ and $VAR as a shell expands them; a flag's $VARs the shell had
        try:
            values[key] = expand_paths(values[key], f"{where(key)}: {key}", variables=key not in set_by_flag)
        except UserError as exc:
            raise ConfigError(str(exc)) from None

    if values.get("output_dir") is None:  # TrainingArguments' default, which trl grpo writes to
        values["output_dir"] = "trainer_output"
        logging.getLogger("ictrl.train").info("output_dir: not set: trainer_output, as trl grpo (TRL's default)")
    parts: dict[type, dict[str, Any]] = {}
    for key, value in values.items():
        parts.setdefault(owners()[key], {})[key] = value
    missing = next((key for key in ("model_name_or_path", "output_dir") if not values.get(key)), None)
    if missing:
        raise ConfigError(f"{source}: missing required key {missing}")
    built = {}
    for cls in (ScriptArguments, ModelConfig):
        try:
            built[cls] = cls(**parts.get(cls, {}))
        except (ValueError, TypeError) as exc:
            message = str(exc)
            raise ConfigError(f"{where(message.split(':', 1)[0].split('.')[0])}: {shorten(message)}") from None
    os.environ.update({str(k): str(v) for k, v in env.items()})  # TrlParser's env:, once the file is valid
    trainer_cls = next(cls for cls in parser().dataclass_types if cls not in built)
    trainer = parts.get(trainer_cls, {})
    trainer = _mapping_init_kwargs(trainer, where(INIT_KWARGS))
    method_from = "flag" if "token_selector" in set_by_flag else "file" if "token_selector" in trainer else "default"
    if method_from == "default":  # a trl grpo file: TRL's GRPO, its loss included (docs/trl-contract.md)
        trainer = {**trainer, "token_selector": DEFAULT_SELECTOR}
    return RunConfig(script=built[ScriptArguments], model=built[ModelConfig], trainer=trainer, flags=shown,
                     method_from=method_from)


def _mapping_init_kwargs(trainer: dict[str, Any], where: str) -> dict[str, Any]:
    """``model_init_kwargs`` as the mapping every reader takes: GRPOConfig takes a JSON string too (TRL's command
    line, ``--model_init_kwargs='{"dtype": "bfloat16"}'``), read here, once, where the value enters; the saved
    config.yaml then holds it as a mapping, whose secret keys ``files.without_secrets`` leaves out (an older ictrl
    wrote the string there: ``exact_resume.check_unchanged`` reads it, JSON being YAML)."""
    import json

    raw = trainer.get(INIT_KWARGS)
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{where}: {INIT_KWARGS}: not a JSON object: {exc}") from None
    if raw is not None and not isinstance(raw, dict):
        raise ConfigError(f"{where}: {INIT_KWARGS}: expected a mapping of from_pretrained arguments, got {raw!r}")
    return trainer if raw is None else {**trainer, INIT_KWARGS: raw}


def load_config(path: str | os.PathLike[str], flags: list[str] | None = None) -> RunConfig:
    """Load ``path`` (with its ``base:`` files) and apply command-line ``flags``; check every key."""
    return config_from_dict(read_yaml(path), str(path), flags)


def field_default(f: dataclasses.Field[Any]) -> Any:
    """A dataclass field's default value (its factory's value for a factory)."""
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def _changed(obj: Any) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)
            if f.init and getattr(obj, f.name) != field_default(f)}


def config_to_dict(cfg: RunConfig) -> dict[str, Any]:
    """The flat YAML form: the model and script keys that differ from their defaults, then the trainer keys as
    given."""
    return {**_changed(cfg.model), **_changed(cfg.script), **cfg.trainer}


def config_record(cfg: RunConfig) -> dict[str, Any]:
    """What ``config.yaml`` holds of the run (:func:`save_config`), which ``--resume`` compares
    (``exact_resume.check_unchanged``): :func:`config_to_dict` less its secrets (``files.without_secrets``)."""
    values = config_to_dict(cfg)
    return without_secrets(values)


def save_config(cfg: RunConfig, path: str | os.PathLike[str]) -> None:
    """Write the resolved config as YAML (:func:`config_record`), atomically; a comment names the secrets left
    out (``hub_token``): a resume is given them again."""
    kept = config_record(cfg)
    dropped = sorted(key for key in config_to_dict(cfg) if key not in kept)
    note = f"# not written here (secrets; give them again to resume): {', '.join(dropped)}\n" if dropped else ""
    atomic_write_text(path, note + yaml.safe_dump(kept, sort_keys=False))


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
    keys: dict[str, Any] = {"token_selector": name if ":" in name else selector.spec, "run_name": selector.label,
                            "loss_normalization": selector.normalization}
    if warmup_steps is not None and selector.warmup_steps > 0:
        keys["selection_warmup_steps"] = warmup_steps
    return keys
