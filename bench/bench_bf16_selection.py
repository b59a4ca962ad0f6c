"""Does bf16 change which tokens ICT picks? fp32 against bf16 statistics on the same rollouts, at Qwen2.5-0.5B width.

The model is ``ictrl.models.build_real_shape("qwen2.5-0.5b", num_layers=2)`` (hidden 896, vocabulary 151,936, tied
head, random weights). Both passes run the trainer's own statistics pass, ``ictrl.engine.stats_source.model_stats``
(the model's forward for the final-norm hidden states, then the no-grad head sweep into ``token_stats`` with the
group JS), on the same fixed batch: once with no autocast (fp32), once under ``torch.autocast("cpu",
dtype=torch.bfloat16)``, which is what ``accelerator.autocast()`` is on a bf16 run (the layers' matmuls and the
LM head run in bf16, the head's logits come out bf16 and are upcast before the statistics). Then the ICT top-10%
per response (``select("ict", ...)``) and the 20-Entropy top-20% of the batch from each.

Realistic peakedness. A random model at this width is near-uniform over 151,936 tokens (mean entropy 11.75 nats,
top-1 probability 8e-5): every JS score is tiny and noise decides the top 10%. The final RMSNorm's weight is
multiplied by ``--scale`` (the logits scale with it; with a tied head this is the only knob that leaves the
embedding alone), so the mean entropy and top-1 probability are in the range of a trained LM's sampled tokens; both
are reported with the agreement, with the mean max logit, because bf16's rounding error grows with |logit| (ulp
0.125 at 16-32, 0.25 at 32-64).

Rollouts. ``--groups`` prompts (32 random byte tokens each), G = 8 completions of ``--tokens`` tokens each, no EOS.
Each group has a base completion; each member copies it and replaces every token with a random byte token with
probability ``--substitute`` (0.25), so members share most tokens and their contexts partly diverge, as sampled
responses of one prompt do. Same batch for both precisions.

    OMP_NUM_THREADS=2 PYTHONPATH=src .venv/bin/python bench/bench_bf16_selection.py --scales 10,15,20,25

Output: bench/results/bf16_selection.json (written atomically) and a table.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ictrl.core.selection import SelectionInputs, select
from ictrl.engine.loss_inputs import model_inputs
from ictrl.engine.stats_source import Request, Sweep, model_stats
from ictrl.files import atomic_write_json
from ictrl.models import build_real_shape

G = 8
RESULTS = Path(__file__).resolve().parent / "results" / "bf16_selection.json"


def make_batch(n_groups: int, T: int, prompt_len: int, substitute: float, seed: int) -> dict[str, Tensor]:
    """Prompt and completion tensors in TRL's layout: [n_groups * G, ...], members of a group adjacent."""
    gen = torch.Generator().manual_seed(seed)
    prompts = torch.randint(0, 256, (n_groups, 1, prompt_len), generator=gen).expand(-1, G, -1)
    base = torch.randint(0, 256, (n_groups, 1, T), generator=gen).expand(-1, G, -1)
    other = torch.randint(0, 256, (n_groups, G, T), generator=gen)
    swap = torch.rand(n_groups, G, T, generator=gen) < substitute
    completions = torch.where(swap, other, base)
    B = n_groups * G
    return {
        "prompt_ids": prompts.reshape(B, prompt_len).clone(),
        "prompt_mask": torch.ones(B, prompt_len, dtype=torch.long),
        "completion_ids": completions.reshape(B, T).clone(),
        "completion_mask": torch.ones(B, T, dtype=torch.long),
    }


def spearman(a: Tensor, b: Tensor) -> float:
    ra = a.flatten().argsort().argsort().double()
    rb = b.flatten().argsort().argsort().double()
    ra, rb = ra - ra.mean(), rb - rb.mean()
    return float((ra * rb).sum() / (ra.norm() * rb.norm()))


def overlap(a: Tensor, b: Tensor) -> float:
    """|a & b| / |a|: with equal counts (both selections keep ceil(ratio * n) per unit) it is symmetric."""
    return float((a & b).sum()) / max(1, int(a.sum()))


@torch.no_grad()
def head_summary(model: Any, batch: dict[str, Tensor], rows: int) -> dict[str, float]:
    """Mean top-1 probability and max logit of the fp32 completion distributions, and the RMS and max of the
    logit error of the bf16 pass (its layers and head under autocast) against them; streamed over positions."""
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    T = batch["completion_ids"].shape[1]
    top1 = zmax = sq = 0.0
    dz_max, n = 0.0, 0
    for r0 in range(0, ids.shape[0], rows):
        h32 = model.model(input_ids=ids[r0:r0 + rows]).last_hidden_state[:, -T - 1:-1]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h16 = model.model(input_ids=ids[r0:r0 + rows]).last_hidden_state[:, -T - 1:-1]
        for t0 in range(0, T, 16):
            z = model.lm_head(h32[:, t0:t0 + 16])
            with torch.autocast("cpu", dtype=torch.bfloat16):
                dz = model.lm_head(h16[:, t0:t0 + 16]).float().sub_(z)
            zmax += float(z.amax(-1).sum())
            top1 += float(z.softmax(-1).amax(-1).sum())
            sq += float(dz.square().mean(-1).sum())
            dz_max = max(dz_max, float(dz.abs().max()))
            n += z.shape[0] * z.shape[1]
    return {"mean_top1_prob": top1 / n, "mean_max_logit": zmax / n, "logit_error_rms": (sq / n) ** 0.5,
            "logit_error_max": dz_max}


def run_scale(model: Any, scale: float, batch: dict[str, Tensor], chunk_size: int) -> dict[str, Any]:
    norm = model.model.norm.weight
    original = norm.detach().clone()
    norm.data.mul_(scale)
    try:
        B, T = batch["completion_ids"].shape
        mask = batch["completion_mask"].bool()
        groups = torch.arange(B) // G
        passes: dict[str, tuple[Any, Tensor]] = {}
        seconds: dict[str, float] = {}
        autocasts = {"fp32": contextlib.nullcontext, "bf16": lambda: torch.autocast("cpu", dtype=torch.bfloat16)}
        for name, autocast in autocasts.items():
            t0 = time.perf_counter()
            stats, u = model_stats(model, model.lm_head, *model_inputs(batch),
                                   Request(mask, batch["completion_ids"], groups),
                                   Sweep(1.0, None, chunk_size, autocast, model.lm_head.out_features, rows=B))
            seconds[name] = time.perf_counter() - t0
            assert u is not None
            passes[name] = (stats, u)
        summary = head_summary(model, batch, rows=B)
    finally:
        norm.data.copy_(original)
    (s32, u32), (s16, u16) = passes["fp32"], passes["bf16"]
    ict = {k: select("ict", SelectionInputs(mask=mask, ict_score=u)) for k, u in (("fp32", u32), ("bf16", u16))}
    ent = {k: select("entropy", SelectionInputs(mask=mask, entropy=s.entropy))
           for k, s in (("fp32", s32), ("bf16", s16))}
    du = (u16 - u32)[mask].abs()
    dh = (s16.entropy - s32.entropy)[mask].abs()
    # Within-response spread of u: what a score error has to be compared with to flip a selection.
    u_std = float(u32.std(dim=1).mean())
    return {
        "scale": scale,
        "mean_entropy": float(s32.entropy[mask].mean()),
        "median_entropy": float(s32.entropy[mask].median()),
        **summary,
        "ict_agreement": overlap(ict["fp32"], ict["bf16"]),
        "ict_selected": int(ict["fp32"].sum()),
        "u_spearman": spearman(u32[mask], u16[mask]),
        "u_max_abs_diff": float(du.max()),
        "u_mean_abs_diff": float(du.mean()),
        "u_mean": float(u32[mask].mean()),
        "u_within_response_std": u_std,
        "entropy20_agreement": overlap(ent["fp32"], ent["bf16"]),
        "entropy_spearman": spearman(s32.entropy[mask], s16.entropy[mask]),
        "entropy_max_abs_diff": float(dh.max()),
        "entropy_mean_abs_diff": float(dh.mean()),
        "seconds_fp32_pass": seconds["fp32"],
        "seconds_bf16_pass": seconds["bf16"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scales", default="15,20,25", help="comma list of final-norm weight multipliers")
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--substitute", type=float, default=0.25)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--chunk-size", type=int, default=512, help="stats_chunk_size (the trainer's default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    # Both precisions go through the same backend; plain avoids the compiled kernel's first-call compile.
    os.environ.setdefault("ICTRL_STATS_BACKEND", "plain")
    start = time.perf_counter()
    model, _ = build_real_shape("qwen2.5-0.5b", num_layers=args.layers, seed=args.seed)
    model.eval()
    batch = make_batch(args.groups, args.tokens, args.prompt_len, args.substitute, args.seed)
    rows = []
    for scale in (float(s) for s in args.scales.split(",")):
        rows.append(run_scale(model, scale, batch, args.chunk_size))
        r = rows[-1]
        print(f"scale {scale:g}: H {r['mean_entropy']:.3f} (median {r['median_entropy']:.3f}), top-1 "
              f"{r['mean_top1_prob']:.3f}, max logit {r['mean_max_logit']:.1f}, bf16 logit error rms "
              f"{r['logit_error_rms']:.3f} max {r['logit_error_max']:.2f} | ICT agreement "
              f"{r['ict_agreement']:.4f} ({r['ict_selected']} tokens), Spearman u {r['u_spearman']:.5f}, max|du| "
              f"{r['u_max_abs_diff']:.2e}, mean|du| {r['u_mean_abs_diff']:.2e} (u mean {r['u_mean']:.3f}, within-"
              f"response std {r['u_within_response_std']:.3f}) | entropy20 agreement {r['entropy20_agreement']:.4f},"
              f" Spearman H {r['entropy_spearman']:.5f}, max|dH| {r['entropy_max_abs_diff']:.2e} | passes "
              f"{r['seconds_fp32_pass']:.1f} s fp32, {r['seconds_bf16_pass']:.1f} s bf16", flush=True)
    result = {
        "model": f"build_real_shape('qwen2.5-0.5b', num_layers={args.layers}, seed={args.seed})",
        "vocab": model.config.vocab_size,
        "groups": args.groups, "G": G, "tokens": args.tokens, "prompt_len": args.prompt_len,
        "substitute": args.substitute, "chunk_size": args.chunk_size, "threads": args.threads,
        "backend": os.environ["ICTRL_STATS_BACKEND"], "torch": torch.__version__, "machine": platform.machine(),
        "total_seconds": time.perf_counter() - start,
        "rows": rows,
    }
    atomic_write_json(args.output, result)
    print(f"total {result['total_seconds']:.0f} s -> {args.output}")


if __name__ == "__main__":
    main()
