"""How ``ictrl train`` builds its model: as ``trl grpo`` does, from TRL's ``ModelConfig`` and ``model_init_kwargs``.

- The ``from_pretrained`` keyword arguments are ``trl grpo``'s: ``model_revision``, ``trust_remote_code``,
  ``attn_implementation`` and ``dtype`` (ModelConfig / GRPOConfig), updated by ``model_init_kwargs``; with
  ``load_in_4bit`` / ``load_in_8bit`` TRL's ``get_quantization_config`` gives the bitsandbytes config.
- ``use_peft`` with the ``lora_*`` keys becomes TRL's ``get_peft_config`` (a ``peft.LoraConfig``, DoRA and rsLoRA
  included), which ``GRPOTrainer`` takes as ``peft_config``.

Everything is checked before the weights load: the dtype names, the quantization method and the package it needs
(transformers' own check), the attention implementation and the LoRA target modules (both against the model built
from its config on the meta device, which allocates nothing). Each failure is one :class:`ConfigError` line naming
the key.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path
from typing import Any

from ictrl.errors import did_you_mean, shorten
from ictrl.train_cli.run_config import INIT_KWARGS, ConfigError, RunConfig

# The dtype names TRL's create_model_from_path accepts (plus a torch.dtype, which YAML cannot write).
DTYPES = ("auto", "float32", "bfloat16", "float16")


def load_kwargs(cfg: RunConfig, source: str = "<config>") -> dict[str, Any]:
    """The ``from_pretrained`` keyword arguments of the run, merged as ``trl grpo`` merges them, the quantization
    config made by TRL. Raises :class:`ConfigError` naming the key after ``source`` (the config file, or the flag
    that set :data:`INIT_KWARGS`: ``run_inputs.blame``)."""
    from trl import get_quantization_config

    raw = cfg.trainer.get(INIT_KWARGS)  # a mapping: run_config reads TRL's JSON-string form where the value enters
    model = cfg.model
    kwargs = {"revision": model.model_revision, "trust_remote_code": bool(cfg.trainer.get("trust_remote_code")),
              "attn_implementation": model.attn_implementation, "dtype": model.dtype, **(raw or {})}
    if "torch_dtype" in kwargs:
        raise ConfigError(f"{source}: {INIT_KWARGS}.torch_dtype: transformers 5 calls it dtype; write "
                          f"{INIT_KWARGS}.dtype")
    if kwargs["dtype"] not in DTYPES:
        raise ConfigError(f"{source}: {INIT_KWARGS}.dtype: must be one of {list(DTYPES)}, got {kwargs['dtype']!r}")
    if not isinstance(kwargs["trust_remote_code"], bool):
        raise ConfigError(f"{source}: {INIT_KWARGS}.trust_remote_code: expected true/false, got "
                          f"{kwargs['trust_remote_code']!r}")
    attn = kwargs["attn_implementation"]
    if attn is not None and not isinstance(attn, str):
        raise ConfigError(f"{source}: {INIT_KWARGS}.attn_implementation: expected a string, got {attn!r}")
    for flag in ("load_in_4bit", "load_in_8bit"):  # transformers 5 takes them only as a quantization_config
        if kwargs.pop(flag, False):
            raise ConfigError(f"{source}: {INIT_KWARGS}.{flag}: transformers 5 takes it as the ModelConfig key "
                              f"{flag}: true (or {INIT_KWARGS}.quantization_config)")
    try:  # bitsandbytes' compute dtype is ModelConfig's dtype, which 'auto' cannot be
        quantization = get_quantization_config(dataclasses.replace(model, dtype=None) if model.dtype == "auto"
                                               else model)
    except (ValueError, TypeError, AttributeError) as exc:
        which = "load_in_4bit" if model.load_in_4bit else "load_in_8bit" if model.load_in_8bit else "load_in_4bit/8bit"
        raise ConfigError(f"{source}: {which}: {_first_line(exc)}") from None
    if quantization is not None:
        kwargs["quantization_config"] = quantization
        kwargs["device_map"] = _kbit_device_map()
    if kwargs.get("quantization_config") is not None:
        kwargs["quantization_config"] = _quantization(kwargs["quantization_config"], source)
    return {k: v for k, v in kwargs.items() if v is not None and (k, v) != ("revision", "main")}


def _kbit_device_map() -> dict[str, int] | None:
    """A quantized model on this process's GPU (TRL's former ``get_kbit_device_map``, gone from TRL 1.16)."""
    import torch
    from accelerate import PartialState

    return {"": PartialState().local_process_index} if torch.cuda.is_available() else None


def _quantization(value: Any, source: str) -> Any:
    """transformers' quantization config for ``value`` (a mapping as in a checkpoint's config.json, or TRL's
    object), its package checked by transformers' quantizer."""
    from transformers.quantizers.auto import AutoHfQuantizer, AutoQuantizationConfig

    key = f"{INIT_KWARGS}.quantization_config" if isinstance(value, dict) else \
        "load_in_4bit" if getattr(value, "load_in_4bit", False) else "load_in_8bit"
    try:
        config = AutoQuantizationConfig.from_dict(dict(value)) if isinstance(value, dict) else value
        AutoHfQuantizer.from_config(config).validate_environment(device_map=None)
    except (ImportError, ValueError, TypeError, RuntimeError, AttributeError) as exc:
        raise ConfigError(f"{source}: {key}: {_first_line(exc)}") from None  # transformers names the package
    return config


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _targets(cfg: RunConfig) -> list[str]:
    targets = cfg.model.lora_target_modules if cfg.model.use_peft else None
    return [] if targets in (None, "all-linear") else [targets] if isinstance(targets, str) else list(targets)


def check_context(cfg: RunConfig, kwargs: dict[str, Any], source: str = "<config>") -> None:
    """``max_prompt_length + max_completion_length`` within the model's ``max_position_embeddings`` (its
    config.json, no weights read): past it a prompt and its completion do not fit, and transformers only prints a
    reminder. Without ``max_prompt_length`` (TRL's behaviour: no cap) each prompt is checked against the room left
    once it is tokenised, before the weights load (``ictrl.train_cli.run_inputs.drop_long_prompts``)."""
    from trl import GRPOConfig

    prompt = cfg.script.max_prompt_length
    if prompt is None:
        return
    completion = cfg.trainer.get("max_completion_length", GRPOConfig.max_completion_length)
    limit = getattr(_auto_config(cfg, kwargs).get_text_config(), "max_position_embeddings", None)
    if isinstance(limit, int) and isinstance(completion, int) and prompt + completion > limit:
        raise ConfigError(f"{source}: max_prompt_length: {prompt} + max_completion_length {completion} = "
                          f"{prompt + completion} tokens, more than the {limit} positions of "
                          f"{cfg.model.model_name_or_path} (max_position_embeddings); lower one of them")


def _auto_config(cfg: RunConfig, kwargs: dict[str, Any]) -> Any:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(cfg.model.model_name_or_path, trust_remote_code=kwargs["trust_remote_code"],
                                      revision=kwargs.get("revision"))


def tokenizer_and_config(cfg: RunConfig, kwargs: dict[str, Any], source: str = "<config>") -> tuple[Any, Any]:
    """The model's tokenizer and its text config (``max_position_embeddings``), without its weights: what the
    training rows are measured against before the model loads."""
    from transformers import AutoTokenizer

    revision = {"revision": kwargs["revision"]} if kwargs.get("revision") else {}
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.model_name_or_path,
                                              trust_remote_code=kwargs["trust_remote_code"], **revision)
    if cfg.script.chat_template_path:
        tokenizer.chat_template = chat_template(cfg.script.chat_template_path, source)
    return tokenizer, _auto_config(cfg, kwargs).get_text_config()


def chat_template(path: str, source: str = "<config>") -> str:
    """The template ``chat_template_path`` names: a Jinja file's text (.jinja, .j2), else the chat template of the
    tokenizer at that folder or hub id (TRL's SFT reading; its tokens are not added to the model's vocabulary)."""
    from transformers import AutoTokenizer

    local = Path(path).expanduser()
    if local.is_file() and local.suffix in (".jinja", ".j2"):
        return local.read_text(encoding="utf-8")
    try:
        template = AutoTokenizer.from_pretrained(path).chat_template
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{source}: chat_template_path: {path}: neither a .jinja file nor a tokenizer "
                          f"({shorten(str(exc).splitlines()[0], 200)})") from None
    if not template:
        raise ConfigError(f"{source}: chat_template_path: {path}: that tokenizer has no chat template either")
    return str(template)


def check_architecture(cfg: RunConfig, kwargs: dict[str, Any], source: str = "<config>") -> None:
    """Build the model from its config on the meta device (no memory, no weights read): transformers checks
    ``attn_implementation`` there (a missing flash-attn or kernels package, an unknown name), and the LoRA
    ``lora_target_modules`` must name modules of it. First the context (:func:`check_context`) and the
    ``model_init_kwargs`` keys (:func:`check_init_keys`)."""
    check_context(cfg, kwargs, source)
    check_init_keys(cfg, kwargs, source)
    if kwargs.get("attn_implementation") is None and not _targets(cfg):
        return
    import torch
    from transformers import AutoModelForCausalLM

    config = _auto_config(cfg, kwargs)
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=kwargs["trust_remote_code"],
                                                     attn_implementation=kwargs.get("attn_implementation"))
    except (ImportError, ValueError) as exc:
        if kwargs.get("attn_implementation") is None:
            raise
        raise ConfigError(f"{source}: attn_implementation: {_first_line(exc)}") from None
    names = sorted({name.rsplit(".", 1)[-1] for name, _ in model.named_modules() if name})
    for i, target in enumerate(_targets(cfg)):
        if target not in names and not any(n.endswith(target) for n, _ in model.named_modules()):
            raise ConfigError(f"{source}: lora_target_modules[{i}]: the model has no module {target!r}"
                              f"{did_you_mean(target, names)}")


def peft_config(cfg: RunConfig, source: str = "<config>") -> Any:
    """TRL's ``get_peft_config`` for the ``use_peft`` / ``lora_*`` keys (None without ``use_peft``)."""
    if not cfg.model.use_peft:
        return None
    if importlib.util.find_spec("peft") is None:
        raise ConfigError(f"{source}: use_peft: LoRA needs the peft package: pip install 'ictrl[peft]'")
    from trl import get_peft_config

    try:
        return get_peft_config(cfg.model)
    except (ValueError, TypeError) as exc:  # peft's LoraConfig checks its values (use_dora with ..., r >= 1)
        raise ConfigError(f"{source}: lora: {_first_line(exc)}") from None


def from_pretrained_keys() -> set[str]:
    """The keyword arguments ``from_pretrained`` takes itself: its signature and the keys its body pops from
    ``**kwargs`` (read from its source, so a transformers upgrade brings its own list)."""
    import inspect
    import re

    from transformers import PreTrainedModel

    method = PreTrainedModel.from_pretrained
    keys = set(inspect.signature(method).parameters) - {"pretrained_model_name_or_path", "model_args", "kwargs"}
    try:
        source = inspect.getsource(method)
    except (OSError, TypeError):  # no source (a frozen install): the signature alone
        return keys
    keys |= set(re.findall(r"kwargs\.pop\(\s*[\"'](\w+)[\"']", source))
    for names in re.findall(r"for name in \[([^\]]*)\]:\s*\n\s*(?:_ = )?kwargs\.pop\(name", source):  # dropped ones
        keys |= set(re.findall(r"[\"'](\w+)[\"']", names))
    return keys


def check_init_keys(cfg: RunConfig, kwargs: dict[str, Any], source: str = "<config>") -> None:
    """Each ``model_init_kwargs`` key is a ``from_pretrained`` argument or a key of the model's config (which
    ``from_pretrained`` passes on to it); anything else would be a TypeError from the model's ``__init__`` after
    the checkpoint is opened. One line naming the key, with the nearest valid name."""
    raw = cfg.trainer.get(INIT_KWARGS)
    if not raw:
        return
    known = from_pretrained_keys()
    unknown = [k for k in raw if k not in known]
    if not unknown:
        return
    config = _auto_config(cfg, kwargs)
    names = set(config.to_dict()) | set(vars(config))
    for key in unknown:
        if str(key) not in names:
            hint = did_you_mean(str(key), sorted(known - {"torch_dtype"}), cutoff=0.5)
            raise ConfigError(f"{source}: {INIT_KWARGS}.{key}: neither a from_pretrained argument nor a key of "
                              f"{cfg.model.model_name_or_path}'s config{hint}")
