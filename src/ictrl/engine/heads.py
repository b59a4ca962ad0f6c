"""The LM head as each engine holds it: the whole weight for a sparse or chunked sweep over hidden states.

The statistics pass and ``sparse_backward`` apply the head themselves, outside the model's forward, to a few
positions or blocks of positions. Under a sharded engine the head's weight is a shard, so they go through
:func:`call_head`, which gathers it the way that engine gathers it for its own forward, and applies the model's own
final-logit transform (:func:`logit_transform`) after it, as the model's forward does before the sampler sees them.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

_R = TypeVar("_R")


LogitTransform = Callable[[Tensor], Tensor]


def logit_transform(config: Any) -> LogitTransform | None:
    """What the model's forward does to its LM head's output before returning the logits the sampler draws from
    (None: nothing): a scale (Cohere's ``logit_scale``, ``output_multiplier``, Falcon-H1's ``lm_head_multiplier``,
    Granite's 1 / ``logits_scaling``, HyperCLOVA X's ``logits_scaling``), then Gemma's soft cap
    ``c · tanh(z / c)`` (``final_logit_softcapping``), read from the config in the order TRL's fused LM head reads
    them, so the statistics are of the distribution TRL's log-probs and the sampler use."""
    text = config.get_text_config()
    cap = getattr(text, "final_logit_softcapping", None)
    scale = getattr(text, "logit_scale", None)
    for name in ("output_multiplier", "lm_head_multiplier"):
        scale = getattr(text, name, None) if scale is None else scale
    scaling = getattr(text, "logits_scaling", None)
    if scale is None and scaling is not None:  # Granite, MiniCPM3 divide by it; HyperCLOVA X multiplies
        scale = scaling if getattr(text, "model_type", None) == "hyperclovax" else 1 / scaling
    scale = 1.0 if scale is None else float(scale)
    if scale == 1.0 and cap is None:
        return None
    return partial(_transformed, scale, None if cap is None else float(cap))


def _transformed(scale: float, cap: float | None, z: Tensor) -> Tensor:
    if scale != 1.0:
        z = z * scale
    return z if cap is None else torch.tanh(z / cap) * cap


class TransformedHead(nn.Module):
    """The head operand ``lm`` (a weight [V, H], or a module) followed by the model's final-logit transform: a
    module, so ``selected_token_logprobs`` and the statistics sweep call it as the model's head."""

    def __init__(self, lm: nn.Module | Tensor, transform: LogitTransform) -> None:
        super().__init__()
        object.__setattr__(self, "lm", lm)  # not a submodule: the engine's parameters stay registered once
        self.transform = transform
        self.out_features = int(lm.shape[0]) if isinstance(lm, Tensor) else getattr(lm, "out_features", None)

    def forward(self, x: Tensor) -> Tensor:
        lm = self.lm
        return self.transform(lm(x) if isinstance(lm, nn.Module) else F.linear(x.to(lm.dtype), lm))


def call_head(head: nn.Module, fn: Callable[..., _R], *inputs: Tensor, transform: LogitTransform | None = None) -> _R:
    """``fn(lm, *inputs)`` with ``lm`` the LM head's whole weight, gathered by the engine that shards it, followed
    by ``transform`` (the model's final-logit transform, :func:`logit_transform`) when one is given.

    ``lm`` is what ``selected_token_logprobs`` takes: the weight [V, H] of a bias-free linear head, an
    ``nn.Linear`` shell around the weight and bias, or (any other head, e.g. a PEFT-wrapped one) the head's own
    forward. Reading ``head.weight`` as it lies would see a shard under a sharded engine:

    - FSDP2 (``fully_shard``; accelerate puts the head in one unit with the final norm and the embedding, not
      resharded after forward): the unit is unsharded (``FSDPModule.unshard``, a no-op when the model's forward
      left it so) and ``lm`` is its unsharded parameter, so the gradient accumulates where FSDP2's post-backward
      reduce-scatters it. Calling the head module itself outside the root's forward crashes FSDP2's backward
      hooks on CPU (torch 2.13, SIGSEGV), hence the parameter.
    - ZeRO-3 (parameters carry ``ds_id``): ``fn`` runs as the head module's forward, so DeepSpeed's module hooks
      gather the weight for it and again for its backward, and reduce its gradient.
    - Otherwise (DDP, one process, ZeRO-1/2): the plain parameter.

    Called once per process per pass, so every rank makes the same collectives whatever its number of rows or
    selected positions.
    """
    def operand() -> nn.Module | Tensor:
        lm = _head_operand(head)
        return lm if transform is None else TransformedHead(lm, transform)

    if not hasattr(getattr(head, "weight", None), "ds_id"):
        return fn(operand(), *inputs)
    own = head.__dict__.get("forward")
    head.forward = lambda *args: fn(operand(), *args)
    try:
        return head(*inputs)
    finally:
        if own is None:
            del head.forward
        else:
            head.forward = own


def _head_operand(head: nn.Module) -> nn.Module | Tensor:
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(head, nn.Linear):
        return _Unhooked(head)
    if _is_dtensor(head.weight) and isinstance(head, FSDPModule):
        head.unshard()  # swaps the module's parameters for the unsharded ones (all-gather of this unit only)
    weight, bias = head.weight, head.bias
    if _is_dtensor(weight):
        if torch.is_grad_enabled():
            raise RuntimeError("the LM head's weight is a shard outside any FSDP unit that could unshard it, so its "
                               "gradient would skip the reduce-scatter; shard the model with accelerate's FSDP2 "
                               "preparation (fsdp2_prepare_model)")
        weight = weight.full_tensor()
        bias = bias.full_tensor() if _is_dtensor(bias) else bias
    return linear_head(weight, bias)


def _is_dtensor(x: Any) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(x, DTensor)


def linear_head(weight: Tensor, bias: Tensor | None) -> nn.Module | Tensor:
    """What ``selected_token_logprobs`` takes for ``F.linear(·, weight, bias)``: the weight itself, or an
    ``nn.Linear`` shell holding these very tensors (no copy) when there is a bias."""
    if bias is None:
        return weight
    shell = nn.Linear(1, 1, device="meta")
    del shell.weight, shell.bias  # plain attributes: the engine's gathered tensors need not be Parameters
    shell.weight, shell.bias = weight, bias
    shell.out_features, shell.in_features = weight.shape
    return shell


class _Unhooked(nn.Module):
    """``head``'s class forward, bypassing the instance forward that :func:`call_head` installs."""

    def __init__(self, head: nn.Module) -> None:
        super().__init__()
        object.__setattr__(self, "head", head)  # not a submodule: no second registration of its parameters

    def forward(self, x: Tensor) -> Tensor:
        return type(self.head).forward(self.head, x)


def _causal_lm(accelerator: Any, model: Any) -> nn.Module:
    """``model`` unwrapped from its engine, and from PEFT (whose adapters live inside the base model's modules)."""
    unwrapped = accelerator.unwrap_model(model)
    return unwrapped.get_base_model() if hasattr(unwrapped, "get_base_model") else unwrapped


def output_head(accelerator: Any, model: Any) -> nn.Module:
    """The LM head module of ``model`` as the engine wrapped it (PEFT: the base model's head, adapters inside)."""
    return _causal_lm(accelerator, model).get_output_embeddings()


def backbone(accelerator: Any, model: Any) -> nn.Module:
    """The decoder stack whose output (the final-norm hidden states) is the LM head's input."""
    return _causal_lm(accelerator, model).base_model
