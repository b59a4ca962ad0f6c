"""Peak memory of one GRPO optimizer step, item by item: the arithmetic docs/scale.md uses.

Checked against bench_real_shape.py's measured peaks (tests/test_memory_model.py): on CPU in fp32 every state is
fp32 and the loss head is TRL's chunked kernel (torch tiles) or ictrl's sparse head. The same items with bf16
weights and Adam states give docs/scale.md's GPU tables (:func:`gpu_states`).

Items (bytes):

- weights, gradients: parameters x dtype size; AdamW: two states per parameter.
- activations kept for backward, per token per decoder layer: ``9 h + 4 I + 3 kv`` values (h hidden, I the MLP
  width, kv = KV heads x head size): the two RMSNorm inputs and outputs, q before and after rotary, the attention
  output, the o-projection input, the residual; gate, up, silu(gate) and their product (SwiGLU: the 4 I); k, v and
  rotated k. torch's CPU attention (flash) keeps no [L, L] scores. Plus ``7 h`` per token outside the layers
  (embedding output, final norm, the hidden states handed to the head). For Qwen2.5-0.5B that is 124.6 B x h per
  token per layer in fp32, where a forward of 8 x 288 tokens measured 126 B x h (the difference of 1 and 3 layers).
- TRL's chunked log-prob head on CPU (``trl.kernels.chunked_logprob``, no Triton): every position of every row
  (prompt included) in tiles of [min(N, 4,096), min(V, 32,768)] fp32. Its backward tile function keeps 6 such
  arrays through its whole body (the tile, y, z, log p, p, the gradient), plus its fp32 weight gradient [V, h]
  and the hidden gradient [N, h]. (Counting also the two transients of its gradient update, 9 arrays,
  over-predicted every dense-head run of bench_real_shape.py by 13-28%.)
- ictrl's statistics sweep (selectors with statistics, e.g. ict; no grad, during the forward): the logits of
  ``min(stats_chunk_size, completion positions)`` rows at a time, fp32 (``ICTGRPOConfig.stats_chunk_size``,
  default None: 512 rows on CPU, 0.29 GiB at V = 151,936).
- ictrl's sparse head: the selected rows' logits with grad (x 3), plus the [V, h] weight gradient.
- the optimizer phase: all gradients, plus AdamW's per-parameter temporaries (torch's single-tensor AdamW on
  CPU: 2 arrays the size of the largest parameter, the embedding).

The step's peak is the largest of the forward's end (everything saved by the forward, plus the statistics
sweep), the backward's start (everything saved, plus the head's backward) and the optimizer phase. In a run's first step AdamW's states do not exist yet during backward; they are allocated at
the first ``optimizer.step``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

GB = 2**30
TRL_TOKEN_TILE, TRL_VOCAB_TILE, TRL_TILE_ARRAYS = 4096, 32768, 6
ACT_OUTSIDE_LAYERS = 7  # x h values per token
ADAM_TEMPS = 2  # arrays the size of the largest parameter


@dataclass(frozen=True)
class Shape:
    """A Qwen2 architecture: widths, depth, vocabulary, and whether the LM head is the embedding."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool

    @classmethod
    def qwen25(cls, name: str, layers: int | None = None) -> Shape:
        from ictrl.models import QWEN25_SHAPES

        s = QWEN25_SHAPES[name]
        return cls(s["hidden_size"], s["intermediate_size"], layers or s["num_hidden_layers"],
                   s["num_attention_heads"], s["num_key_value_heads"], s["vocab_size"], s["tie_word_embeddings"])

    @property
    def kv(self) -> int:
        return self.kv_heads * (self.hidden // self.heads)

    def layer_params(self) -> int:
        h, kv = self.hidden, self.kv
        attention = h * h + h + 2 * (h * kv + kv) + h * h  # q (bias), k, v (bias), o (no bias)
        return attention + 3 * h * self.intermediate + 2 * h  # SwiGLU MLP, two RMSNorms

    def params(self) -> int:
        embed = self.vocab * self.hidden
        return embed * (1 if self.tied else 2) + self.layers * self.layer_params() + self.hidden

    def act_values_per_token_layer(self) -> int:
        return 9 * self.hidden + 4 * self.intermediate + 3 * self.kv


def step_items(shape: Shape, rows: int, prompt_len: int, completion_len: int, head: str = "trl",
               selected_frac: float = 0.1, stats_chunk_size: int | None = None, base_gb: float = 0.0,
               dtype_bytes: int = 4) -> dict[str, float]:
    """Memory items (GiB) of one optimizer step on ``rows`` sequences of prompt + completion tokens, all states in
    one dtype (CPU fp32: 4). ``head``: "trl" (TRL's chunked head over every position) or "sparse" (ictrl's,
    ``selected_frac`` of the completion positions). ``stats_chunk_size``: the statistics sweep's row bound (None:
    no sweep, as for ``all`` and TRL). ``base_gb``: the process before the model (libraries)."""
    P, h, V = shape.params(), shape.hidden, shape.vocab
    tokens = rows * (prompt_len + completion_len)
    b = dtype_bytes
    items = {"base": base_gb, "weights": P * b / GB, "adam": 2 * P * b / GB, "gradients": P * b / GB,
             "activations": tokens * (shape.layers * shape.act_values_per_token_layer()
                                      + ACT_OUTSIDE_LAYERS * h) * b / GB}
    head_grad = (V * h + tokens * h) * 4 / GB
    if head == "trl":
        tile = min(tokens, TRL_TOKEN_TILE) * min(V, TRL_VOCAB_TILE) * 4
        items["head"] = TRL_TILE_ARRAYS * tile / GB + head_grad
    elif head == "sparse":
        items["head"] = 3 * int(rows * completion_len * selected_frac) * V * 4 / GB + head_grad
    else:
        raise ValueError(f"head must be 'trl' or 'sparse', got {head!r}")
    sweep_rows = 0 if stats_chunk_size is None else min(stats_chunk_size, rows * completion_len)
    items["statistics_sweep"] = sweep_rows * V * 4 / GB
    items["optimizer_temporaries"] = ADAM_TEMPS * V * h * b / GB
    return items


def step_peak(items: dict[str, float], first_step: bool = False) -> dict[str, float]:
    """Resident memory (GiB) before the step, the backward and optimizer phases, and the step's peak."""
    before = items["base"] + items["weights"] + (0.0 if first_step else items["adam"])
    forward = before + items["activations"] + items["statistics_sweep"]
    backward = before + items["activations"] + items["head"]
    optimizer = items["base"] + items["weights"] + items["adam"] + items["gradients"] + items["optimizer_temporaries"]
    return {"before": before, "forward": forward, "backward": backward, "optimizer": optimizer,
            "peak": max(forward, backward, optimizer)}


def gpu_states(shape: Shape, state_bytes: int, shards: int = 1) -> dict[str, float]:
    """Weights, gradients and AdamW's two states (GiB per device) with every state in ``state_bytes`` and sharded
    ``shards`` ways (FSDP / ZeRO-3; 1 for DDP)."""
    P = shape.params()
    return {"weights": P * state_bytes / shards / GB, "gradients": P * state_bytes / shards / GB,
            "adam": 2 * P * state_bytes / shards / GB}


def activations_gb(shape: Shape, tokens: int, dtype_bytes: int, checkpointed: bool = False) -> float:
    """Activations kept for backward (GiB) for ``tokens`` tokens per micro-batch. Checkpointed: each layer's input
    (h values per token) plus one layer recomputed in full."""
    per_layer = shape.act_values_per_token_layer()
    outside = ACT_OUTSIDE_LAYERS * shape.hidden
    if checkpointed:
        return tokens * (shape.layers * shape.hidden + per_layer + outside) * dtype_bytes / GB
    return tokens * (shape.layers * per_layer + outside) * dtype_bytes / GB


# The libraries a trainer process holds before any model (torch, transformers, trl, datasets, ictrl): VmRSS after
# importing ictrl.engine.trainer, measured on the project's CPU machine (bench_real_shape.py records it per run).
BASE_GB = 0.53


def doc_rows() -> dict[str, float]:
    """docs/scale.md's computed table cells (GiB per device), by the first cell of their row."""
    s15, s7 = Shape.qwen25("qwen2.5-1.5b"), Shape.qwen25("qwen2.5-7b")
    ddp = gpu_states(s15, state_bytes=2)  # bf16 weights; torch AdamW keeps its states in the parameters' dtype
    fsdp = gpu_states(s7, state_bytes=4, shards=16)  # FSDP2 keeps fp32 master weights, sharded over 16 GPUs
    return {
        "weights (bf16)": ddp["weights"],
        "gradients (bf16) + DDP buckets": 2 * ddp["gradients"],
        "Adam m, v (bf16)": ddp["adam"],
        "activations, micro-batch 4 x 1,536 tokens, no checkpointing": activations_gb(s15, 4 * 1536, 2),
        "weights (fp32, sharded /16)": fsdp["weights"],
        "gradients (fp32, sharded)": fsdp["gradients"],
        "Adam m, v (fp32, sharded)": fsdp["adam"],
        "activations, micro-batch 8 x 1,536 tokens, checkpointed": activations_gb(s7, 8 * 1536, 2, checkpointed=True),
    }


def part_stats_chunk_size(part: dict[str, Any]) -> int:
    """The statistics pass's ``stats_chunk_size`` of a part of bench_real_shape.py's results (parts stored before
    it was recorded ran at the then default, 2,048)."""
    return part.get("stats_chunk_size", 2048)


def predicted_peak(variant: str, layers: int, completion_len: int, first_step: bool, rows: int = 8,
                   prompt_len: int = 36, stats_chunk_size: int = 512) -> float:
    """Process peak (GiB) of a bench_real_shape.py run of ``variant`` (ict, ict+sparse, all, trl_q1.0) at
    Qwen2.5-0.5B width: fixed completions of ``completion_len`` tokens after prompts of 33-37 byte tokens."""
    items = step_items(Shape.qwen25("qwen2.5-0.5b", layers), rows=rows, prompt_len=prompt_len,
                       completion_len=completion_len, head="sparse" if "sparse" in variant else "trl",
                       stats_chunk_size=stats_chunk_size if variant.startswith("ict") else None, base_gb=BASE_GB)
    return step_peak(items, first_step=first_step)["peak"]
