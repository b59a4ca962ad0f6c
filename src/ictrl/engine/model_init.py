"""How ``ictrl train`` builds its model: TRL's ``model_init_kwargs`` and the run config's ``peft:`` section.

- ``model_init_kwargs`` (a trainer field) means what it means in TRL: keyword arguments of ``from_pretrained``
  (``dtype``, ``attn_implementation``, ``quantization_config``, ``device_map``, ``revision``, ...). ``ictrl train``
  loads the model itself (``ictrl.models.load_model_and_tokenizer``) with them, merged with the ``model:`` section
  (``model.dtype``, ``model.trust_remote_code``); a dtype given in both places must agree.
- ``peft:`` (LoRA ``r``, ``lora_alpha``, ``lora_dropout``, ``target_modules``) becomes the ``peft.LoraConfig``
  that TRL's ``GRPOTrainer`` takes as ``peft_config`` (it wraps the model with ``get_peft_model``).

Everything is checked before the weights load: the dtype names, the quantization method and the package it needs
(transformers' own check), the attention implementation and the LoRA target modules (both against the model built
from its config on the meta device, which allocates nothing). Each failure is one :class:`ConfigError` line naming
the key.
"""

from __future__ import annotations

import difflib
import importlib.util
import json
from typing import Any

from ictrl.engine.run_config import ConfigError, RunConfig

KEY = "model_init_kwargs"
# The dtype names TRL's create_model_from_path accepts (plus a torch.dtype, which YAML cannot write).
DTYPES = ("auto", "float32", "bfloat16", "float16")


def load_kwargs(cfg: RunConfig, source: str = "<config>") -> dict[str, Any]:
    """The ``from_pretrained`` keyword arguments of the run: ``model_init_kwargs`` merged with the ``model:``
    section, the quantization config turned into transformers' object. Raises :class:`ConfigError` naming the key."""
    raw = cfg.trainer.get(KEY)
    if isinstance(raw, str):  # GRPOConfig takes a JSON string too (TRL's command line)
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{source}: {KEY}: not a JSON object: {exc}") from None
    if raw is not None and not isinstance(raw, dict):
        raise ConfigError(f"{source}: {KEY}: expected a mapping of from_pretrained arguments, got {raw!r}")
    kwargs = dict(raw or {})
    if "torch_dtype" in kwargs:
        raise ConfigError(f"{source}: {KEY}.torch_dtype: transformers 5 calls it dtype; write {KEY}.dtype")
    dtype = kwargs.get("dtype", cfg.model.dtype)
    if dtype not in DTYPES:
        raise ConfigError(f"{source}: {KEY}.dtype: must be one of {list(DTYPES)}, got {dtype!r}")
    if cfg.model.dtype != "auto" and dtype != cfg.model.dtype:
        raise ConfigError(f"{source}: {KEY}.dtype: {dtype!r} contradicts model.dtype {cfg.model.dtype!r}; set one")
    kwargs["dtype"] = dtype
    trust = kwargs.get("trust_remote_code", False)
    if not isinstance(trust, bool):
        raise ConfigError(f"{source}: {KEY}.trust_remote_code: expected true/false, got {trust!r}")
    kwargs["trust_remote_code"] = trust or cfg.model.trust_remote_code or bool(cfg.trainer.get("trust_remote_code"))
    attn = kwargs.get("attn_implementation")
    if attn is not None and not isinstance(attn, str):
        raise ConfigError(f"{source}: {KEY}.attn_implementation: expected a string, got {attn!r}")
    if kwargs.get("quantization_config") is not None:
        kwargs["quantization_config"] = _quantization(kwargs["quantization_config"], source)
    return kwargs


def _quantization(value: Any, source: str) -> Any:
    """transformers' quantization config for ``value`` (a mapping as in a checkpoint's config.json; bitsandbytes'
    ``load_in_4bit``/``load_in_8bit`` need no ``quant_method``), its package checked by transformers' quantizer."""
    from transformers.quantizers.auto import AutoHfQuantizer, AutoQuantizationConfig

    key = f"{KEY}.quantization_config"
    if not isinstance(value, dict):
        raise ConfigError(f"{source}: {key}: expected a mapping (e.g. {{load_in_4bit: true}}), got {value!r}")
    try:
        config = AutoQuantizationConfig.from_dict(dict(value))
        AutoHfQuantizer.from_config(config).validate_environment(device_map=None)
    except (ImportError, ValueError, TypeError, RuntimeError) as exc:  # transformers names the missing package
        raise ConfigError(f"{source}: {key}: {_first_line(exc)}") from None
    return config


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def check_architecture(cfg: RunConfig, kwargs: dict[str, Any], source: str = "<config>") -> None:
    """Build the model from its config on the meta device (no memory, no weights read): transformers checks
    ``attn_implementation`` there (a missing flash-attn or kernels package, an unknown name), and the LoRA
    ``target_modules`` must name modules of it."""
    if kwargs.get("attn_implementation") is None and (cfg.peft is None or not cfg.peft.target_modules):
        return
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    trust = kwargs["trust_remote_code"]
    config = AutoConfig.from_pretrained(cfg.model.name_or_path, trust_remote_code=trust,
                                        revision=kwargs.get("revision"))
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust,
                                                     attn_implementation=kwargs.get("attn_implementation"))
    except (ImportError, ValueError) as exc:
        if kwargs.get("attn_implementation") is None:
            raise
        raise ConfigError(f"{source}: {KEY}.attn_implementation: {_first_line(exc)}") from None
    if cfg.peft is None or cfg.peft.target_modules in (None, ["all-linear"]):
        return
    names = sorted({name.rsplit(".", 1)[-1] for name, _ in model.named_modules() if name})
    for i, target in enumerate(cfg.peft.target_modules):
        if target not in names and not any(n.endswith(target) for n, _ in model.named_modules()):
            close = difflib.get_close_matches(target, names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{source}: peft.target_modules[{i}]: the model has no module {target!r}{hint}")


def peft_config(cfg: RunConfig, source: str = "<config>") -> Any:
    """The ``peft.LoraConfig`` for the ``peft:`` section (None without one). The package is checked here."""
    if cfg.peft is None:
        return None
    if importlib.util.find_spec("peft") is None:
        raise ConfigError(f"{source}: peft: LoRA needs the peft package: pip install 'ictrl[peft]'")
    from peft import LoraConfig

    targets = cfg.peft.target_modules
    if targets == ["all-linear"]:  # peft's keyword for every linear layer but the output head
        targets = "all-linear"
    return LoraConfig(task_type="CAUSAL_LM", r=cfg.peft.r, lora_alpha=cfg.peft.lora_alpha,
                      lora_dropout=cfg.peft.lora_dropout, target_modules=targets)
