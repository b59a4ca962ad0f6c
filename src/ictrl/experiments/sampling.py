"""The sampler ``ictrl inspect`` and ``ictrl regime`` share: G responses to one prompt by HF ``generate`` with plain
sampling (top-k and top-p off, so the sampler is the policy whose logits the commands score), and each response's
mask up to its first end token."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def eos_ids(model: Any, tokenizer: Any) -> list[int]:
    """The ids that end a response: the generation config's (an int or a list; what ``generate`` stops at) and the
    tokenizer's EOS. A chat model's config lists more than the tokenizer's one (Qwen2.5-Instruct: ``<|im_end|>`` and
    ``<|endoftext|>``); a row that stopped at the other is padded after it, and that padding is no response."""
    ids = getattr(model.generation_config, "eos_token_id", None)
    ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
    return sorted({*ids, *([tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else [])})


def until_end_mask(response: Any, eos: Sequence[int]) -> Any:
    """[G, T] bool: positions up to and including each row's first end token (all of a row that never ends)."""
    import torch

    is_eos = torch.isin(response, torch.tensor(list(eos), dtype=response.dtype, device=response.device)).long()
    return (is_eos.cumsum(1) - is_eos) == 0


def check_sampling_flags(args: Any) -> None:
    """``--num-generations``, ``--max-new-tokens`` (None: the command's default) and ``--temperature`` of the commands
    that sample a group, before anything loads: :func:`generate_group` takes them as checked."""
    from ictrl.errors import UserError

    if args.num_generations < 2:
        raise UserError(f"--num-generations must be at least 2 (ICT compares a response with its group), got "
                        f"{args.num_generations}")
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        raise UserError(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    if not args.temperature > 0:
        raise UserError(f"--temperature must be > 0, got {args.temperature}")


def generate_group(
    model: Any,
    tokenizer: Any,
    prompt: str,
    num_generations: int = 8,
    max_new_tokens: int = 64,
    temperature: float = 1.0,
    seed: int = 0,
) -> tuple[Any, Any, Any]:
    """Sample G responses to ``prompt`` (text used verbatim). Returns prompt_ids [1, P], response [G, T], mask [G, T].

    Plain sampling at ``temperature``: ``top_k=0, top_p=1`` switch off HF's default top-k=50 filter, so the sampler
    is exactly the policy whose logits ``score_group`` scores.
    """
    import torch

    device = next(model.parameters()).device
    prompt_ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"].to(device)
    if prompt_ids.shape[1] == 0:
        raise ValueError("prompt encodes to zero tokens")
    torch.manual_seed(seed)
    model.eval()
    with torch.no_grad():
        full = model.generate(
            prompt_ids,
            attention_mask=torch.ones_like(prompt_ids),
            do_sample=True,
            temperature=temperature,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_new_tokens,
            num_return_sequences=num_generations,
            pad_token_id=tokenizer.pad_token_id,
        )
    response = full[:, prompt_ids.shape[1] :]
    return prompt_ids, response, until_end_mask(response, eos_ids(model, tokenizer))
