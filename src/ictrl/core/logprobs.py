"""Log-probabilities of the sampled tokens with the output layer applied only where the loss needs a gradient.

The Sparse-GRPO loss (docs/method.md §3) weights log π_θ(a_t) by M = selected & mask and gives every other position zero
weight, so the output layer (``[n, H] @ [H, V]``) and the softmax over V only have to carry autograd history at
the selected positions. :func:`selected_token_logprobs` gathers the backbone's hidden states at those positions and
runs the head + log-softmax over row chunks; backward recomputes each chunk's logits, so it holds one ``[chunk, V]``
buffer and one ``[V, H]`` weight-gradient accumulator instead of ``[B, T, V]`` logits with their graph (at
V = 151,936 and B·T = 8192 fp32, 5 GB per copy). Positions outside the selection get a log-prob without gradient
(``with_unselected``) or 0. A weight tensor or a plain ``nn.Linear`` head takes the fused path (a custom autograd
function, as TRL's chunked log-prob kernel but over the selected rows only); any other head module is called per
chunk under activation checkpointing (one ``[V, H]`` gradient per chunk is then summed by autograd).

Layout (docs/architecture.md, "Shifted layout"): ``hidden[b, t]`` is the backbone output that predicts
``tokens[b, t]``, i.e. ``last_hidden_state[:, prompt_len - 1:-1]``. The backbone's final norm is part of the
backbone (``model.base_model`` in transformers), so ``hidden`` is already normalised; the head is
``model.get_output_embeddings()`` (with tied embeddings this *is* the embedding matrix, and its gradient accumulates
into the shared parameter). Logit scaling or soft-capping that a model applies outside its head module is not
applied here.

Chunk size. ``chunk_size`` counts rows; ``None`` picks, on CPU, ``_CHUNK_BYTES // (4 * V)`` rows (at least 1): 55 rows
at V = 151,936, 256 at V = 32,768. The fused backward holds one fp32 ``[chunk, V]`` buffer per chunk (the checkpointed
path three or four); larger chunks amortise the reads of the ``[V, H]`` weight over more rows. On a GPU, ``None`` sizes
chunks from the device's free memory (:func:`_rows`) and the backward's GEMMs run in the compute dtype (bf16 tensor
cores).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from ictrl.core.checks import FLOAT, INT, MASK, check_tensor, require_on_device, to_bool_mask
from ictrl.core.stats_checks import check_temperature_chunk

__all__ = ["selected_token_logprobs"]

_CHUNK_BYTES = 32 * 2**20


def _vocab_size(lm_head: nn.Module | Tensor) -> int | None:
    """V of a weight tensor [V, H] or of a module exposing ``weight`` / ``out_features``; None if unknown."""
    if isinstance(lm_head, Tensor):
        return int(lm_head.shape[0])
    out = getattr(lm_head, "out_features", None)
    if isinstance(out, int):
        return out
    weight = getattr(lm_head, "weight", None)
    return int(weight.shape[0]) if isinstance(weight, Tensor) and weight.dim() == 2 else None


def _validate(
    hidden: Tensor,
    lm_head: nn.Module | Tensor,
    tokens: Tensor,
    selected: Tensor,
    mask: Tensor | None,
    temperature: float,
    chunk_size: int | None,
) -> None:
    """Check the arguments of :func:`selected_token_logprobs`; the value checks run on the device (no host read)."""
    check_tensor("hidden", hidden, ("B", "T", "H"), FLOAT)
    B, T, H = hidden.shape
    sel = check_tensor("selected", selected, (B, T), MASK).to(hidden.device)
    full = torch.ones_like(sel) if mask is None else check_tensor("mask", mask, (B, T), MASK).to(hidden.device)
    if isinstance(lm_head, Tensor) and (lm_head.dim() != 2 or lm_head.shape[1] != H or
                                        not lm_head.dtype.is_floating_point):
        raise ValueError(f"lm_head as a tensor must be a floating weight [V, H={H}], got {tuple(lm_head.shape)} "
                         f"{lm_head.dtype}")
    if not isinstance(lm_head, (Tensor, nn.Module)):
        raise ValueError(f"lm_head must be an nn.Module or a weight tensor [V, H], got {type(lm_head).__name__}")
    tok = check_tensor("tokens", tokens, (B, T), INT).to(hidden.device)
    check_temperature_chunk(temperature, chunk_size)
    if mask is not None:  # checked on the device: no host read in the training step
        require_on_device(~(sel & ~full).any(), "selected must be a subset of mask (a selected position lies "
                          "outside the mask)")
    V = _vocab_size(lm_head)
    if V is not None:  # without a mask only the selected positions are scored
        scored = sel if mask is None else full
        require_on_device(((tok >= 0) & (tok < V) | ~scored).all(), f"tokens at the positions scored must lie in "
                          f"[0, {V})")


def _rows(chunk_size: int | None, V: int, device: torch.device) -> int:
    """Rows per chunk: ``chunk_size``, or 32 MiB of fp32 logits on CPU (55 rows at V = 151,936); on a GPU the
    rows whose fp32 and half [rows, V] buffers fit in an eighth of the free memory (thousands at that V), so the
    weight-gradient GEMMs are large enough for the tensor cores and a backward is a few chunks. (A head module
    that exposes neither weight nor out_features is sized for a Qwen2.5-sized vocabulary.)"""
    if chunk_size is not None:
        return chunk_size
    rows = max(1, _CHUNK_BYTES // (4 * V))
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        rows = max(rows, free // 8 // (6 * V))
    return rows


def _head_logprobs(h: Tensor, tok: Tensor, lm_head: Any, temperature: float) -> Tensor:
    """log softmax(head(h) / temperature)[tok] for rows h [n, H], tok [n] → [n]; half precision is upcast to fp32."""
    logits = lm_head(h)
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    return logits.gather(1, tok.unsqueeze(1)).squeeze(1) - torch.logsumexp(logits, dim=1)


def _chunk_logits(h: Tensor, weight: Tensor, bias: Tensor | None, temperature: float) -> Tensor:
    """[n, V] logits / temperature in fp32 (or fp64 for fp64 inputs); a fresh tensor the caller may overwrite."""
    z = F.linear(h, weight, bias)
    if z.dtype in (torch.float16, torch.bfloat16):
        z = z.float()
    return z.div_(temperature) if temperature != 1.0 else z


class _LinearLogProb(torch.autograd.Function):
    """log softmax(h @ W.T + b) / tau)[tok] over row chunks; backward recomputes each chunk's logits.

    Saves only h [n, H], tok [n] and the log-partition [n]. Backward per chunk: one [rows, V] buffer that becomes
    dL/dz = g·(onehot(tok) − p)/tau in place, then grad_h = G @ W and grad_W += Gᵀ @ h in one fp32 (fp64 for fp64
    inputs) [V, H] accumulator, so a backward holds one [V, H] gradient rather than one per chunk.
    """

    @staticmethod
    def forward(ctx: Any, h: Tensor, weight: Tensor, bias: Tensor | None, tok: Tensor, temperature: float,
                rows: int) -> Tensor:
        acc = torch.float64 if h.dtype == torch.float64 else torch.float32
        target = torch.empty(h.shape[0], dtype=acc, device=h.device)
        log_z = torch.empty_like(target)
        for s in range(0, h.shape[0], rows):
            z = _chunk_logits(h[s:s + rows], weight, bias, temperature)
            target[s:s + rows] = z.gather(1, tok[s:s + rows].unsqueeze(1)).squeeze(1)
            log_z[s:s + rows] = torch.logsumexp(z, dim=1)
        ctx.save_for_backward(h, weight, bias, tok, log_z)
        ctx.temperature, ctx.rows = temperature, rows
        # Backward runs outside the caller's autocast; recompute the logits under the same autocast state so p
        # matches the forward's log-partition.
        device = h.device.type
        ctx.autocast = (device, torch.get_autocast_dtype(device), torch.is_autocast_enabled(device))
        return target - log_z

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        h, weight, bias, tok, log_z = ctx.saved_tensors
        tau, rows = ctx.temperature, ctx.rows
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        acc = log_z.dtype
        grad_h = torch.zeros_like(h) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_w else None
        grad_b = torch.zeros(weight.shape[0], dtype=acc, device=weight.device) if need_b else None
        device, dtype, enabled = ctx.autocast
        # On a GPU with half-precision compute, the two GEMMs take G and h in that dtype (tensor cores, fp32
        # accumulation inside torch.matmul) and each chunk's weight gradient is added to the fp32 accumulator:
        # one rounding per chunk, as the dense head's own bf16 backward has. CPU keeps fp32 GEMMs (exact as before).
        low = dtype if enabled else weight.dtype
        half = h.device.type == "cuda" and low in (torch.float16, torch.bfloat16)
        for s in range(0, h.shape[0], rows):
            hc, g = h[s:s + rows], grad_out[s:s + rows].to(acc) / tau
            with torch.autocast(device, dtype=dtype, enabled=enabled):
                z = _chunk_logits(hc, weight, bias, tau)
            G = z.to(acc).sub_(log_z[s:s + rows].unsqueeze(1)).exp_()  # p
            G.mul_(-g.unsqueeze(1)).scatter_add_(1, tok[s:s + rows].unsqueeze(1), g.unsqueeze(1))
            if half:
                Gh = G.to(low)
                if grad_h is not None:
                    grad_h[s:s + rows] = (Gh @ weight.to(low)).to(h.dtype)
                if grad_w is not None:
                    grad_w += Gh.t() @ hc.to(low)
                if grad_b is not None:
                    grad_b += G.sum(dim=0)
                continue
            if grad_h is not None:
                grad_h[s:s + rows] = (G.to(weight.dtype) @ weight).to(h.dtype)
            if grad_w is not None:
                grad_w.addmm_(G.t(), hc.to(acc))
            if grad_b is not None:
                grad_b += G.sum(dim=0)
        return (grad_h, grad_w.to(weight.dtype) if grad_w is not None else None,
                grad_b.to(bias.dtype) if grad_b is not None else None, None, None, None)


def _fill_unselected(base: Tensor, flat_h: Tensor, flat_tok: Tensor, rest: Tensor, head: Any, temperature: float,
                     rows: int) -> None:
    """Write into ``base`` the log-probs at the flat positions ``rest``, under ``no_grad``, ``rows`` at a time."""
    with torch.no_grad():
        for start in range(0, rest.numel(), rows):
            idx = rest[start:start + rows]
            base[idx] = _head_logprobs(flat_h[idx], flat_tok[idx], head, temperature).to(base.dtype)


def _checkpointed_logprobs(h_sel: Tensor, tok_sel: Tensor, lm_head: nn.Module, temperature: float,
                           rows: int) -> Tensor:
    """Log-probs of ``tok_sel`` through any head module, ``rows`` at a time."""
    # Any other head module (e.g. an adapter-wrapped layer): checkpoint each chunk, so backward recomputes its
    # [rows, V] logits instead of keeping them for all n_sel rows. At least one (possibly empty) chunk keeps
    # the output connected to the head when nothing is selected.
    grad = torch.is_grad_enabled()
    parts = [checkpoint(_head_logprobs, h_sel[s:s + rows], tok_sel[s:s + rows], lm_head, temperature,
                        use_reentrant=False) if grad else
             _head_logprobs(h_sel[s:s + rows], tok_sel[s:s + rows], lm_head, temperature)
             for s in range(0, max(h_sel.shape[0], 1), rows)]
    return torch.cat(parts)


def selected_token_logprobs(
    hidden: Tensor,
    lm_head: nn.Module | Tensor,
    tokens: Tensor,
    selected: Tensor,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    with_unselected: bool = False,
    mask: Tensor | None = None,
) -> Tensor:
    """log π(tokens) with autograd only at the selected positions.

    Args:
        hidden: [B, T, H] backbone output (after its final norm) in the shifted layout; carries the gradient.
        lm_head: the output layer, an ``nn.Module`` mapping [n, H] → [n, V] (e.g. ``model.get_output_embeddings()``,
            tied or not, with or without bias) or a weight tensor [V, H] (no bias).
        tokens: [B, T] integer sampled ids; only the positions scored are read (padding elsewhere may be anything).
        selected: [B, T] bool or 0/1: the positions that get a differentiable log-prob.
        temperature: > 0; the log-probs are of softmax(logits / temperature), as the sampler used.
        chunk_size: rows of [V] logits per chunk; None: about 32 MiB of fp32 logits per chunk.
        with_unselected: also fill ``mask & ~selected`` with log-probs computed under ``no_grad`` (for metrics
            or an importance ratio); False leaves them 0 and skips their head entirely.
        mask: [B, T] bool or 0/1, the positions scored when ``with_unselected`` (default: all); must contain
            ``selected``.

    Returns:
        [B, T] log-probs (fp32 for half-precision inputs, else hidden's dtype), 0 at positions not scored. It is
        connected to ``hidden`` and the head's weights even when nothing is selected (zero gradients, no NaN), so
        ``loss.backward()`` always works.
    """
    _validate(hidden, lm_head, tokens, selected, mask, temperature, chunk_size)
    return selected_token_logprobs_unchecked(hidden, lm_head, tokens, selected, temperature, chunk_size,
                                             with_unselected, mask)


def selected_token_logprobs_unchecked(
    hidden: Tensor,
    lm_head: nn.Module | Tensor,
    tokens: Tensor,
    selected: Tensor,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    with_unselected: bool = False,
    mask: Tensor | None = None,
) -> Tensor:
    """:func:`selected_token_logprobs` on arguments the caller built (the trainer's step): taken as they are,
    masks only converted to bool."""
    sel = to_bool_mask(selected).to(hidden.device)
    full = torch.ones_like(sel) if mask is None else to_bool_mask(mask).to(hidden.device)
    V = _vocab_size(lm_head)
    B, T, H = hidden.shape
    rows = _rows(chunk_size, V or 151_936, hidden.device)
    out_dtype = torch.float32 if hidden.dtype in (torch.float16, torch.bfloat16) else hidden.dtype
    tokens = tokens.to(hidden.device)
    flat_h = hidden.reshape(B * T, H)
    flat_tok = tokens.reshape(B * T)
    fused = isinstance(lm_head, Tensor) or type(lm_head) is nn.Linear
    if fused:
        weight = lm_head if isinstance(lm_head, Tensor) else lm_head.weight
        bias = None if isinstance(lm_head, Tensor) else lm_head.bias
        if not torch.is_autocast_enabled(hidden.device.type):
            # A head kept in fp32 under bf16 activations (TRL's cast_lm_head_to_fp32) takes fp32 inputs.
            flat_h = flat_h.to(weight.dtype)

    base = torch.zeros(B * T, dtype=out_dtype, device=hidden.device)
    if with_unselected:
        rest = (full & ~sel).reshape(-1).nonzero().squeeze(1)
        head = (lambda x: F.linear(x, weight, bias)) if fused else lm_head
        _fill_unselected(base, flat_h, flat_tok, rest, head, temperature, rows)

    idx = sel.reshape(-1).nonzero().squeeze(1)
    h_sel, tok_sel = flat_h.index_select(0, idx), flat_tok.index_select(0, idx)
    if fused:
        vals = _LinearLogProb.apply(h_sel, weight, bias, tok_sel, float(temperature), rows)
    else:
        vals = _checkpointed_logprobs(h_sel, tok_sel, lm_head, temperature, rows)
    return base.index_put((idx,), vals.to(out_dtype)).view(B, T)
