"""Statistics-pass time of ICTGRPOTrainer with the exact ICT score vs ``selection_topk``.

A tiny Qwen2 (``ictrl.models``) with its vocabulary padded to --vocab (151,936 as Qwen2.5) and a fixed random batch
of --groups x --g completions of --t tokens (every position active, prompts of 16 tokens). The same trainer calls
``_selection_stats`` on the same batch with ``selection_topk`` = None (token statistics + full-vocabulary group JS
in one sweep) and = --k (token statistics, then top-K log-probs and ``group_js_divergence_topk``), alternating,
--repeats times each after one untimed warm-up call of each. Reports the medians, their ratio, the median of the
per-repeat ratios, and how far the two scores and their top-10%-per-response selections differ on this (random,
near-uniform) model. A breakdown times the parts that differ on the same [B, T, V] logits (median of the same
repeats): token_stats alone, token_stats with the group JS, top-K log-probs, group_js_divergence_topk.

    .venv/bin/python bench/bench_topk_trainer.py     # V 151936, 2 groups x 8 x 128 tokens (2048 rows), K 64, 5 repeats

Writes bench/results/topk_trainer.json atomically.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from ictrl.files import atomic_write_json

RESULTS = Path(__file__).resolve().parent / "results" / "topk_trainer.json"
P = 16  # prompt tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--g", type=int, default=8, help="completions per prompt")
    ap.add_argument("--t", type=int, default=128, help="completion tokens")
    ap.add_argument("--k", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=RESULTS)
    a = ap.parse_args()

    from datasets import Dataset

    from ictrl.engine.config import ICTGRPOConfig
    from ictrl.engine.trainer import ICTGRPOTrainer
    from ictrl.core.stats import topk_log_softmax
    from ictrl.models import build_byte_tokenizer, build_tiny_qwen2
    from ictrl.core.selection import SelectionInputs, select
    from ictrl.core.stats import group_js_divergence_topk, token_stats

    tok = build_byte_tokenizer()
    model = build_tiny_qwen2(tok, vocab_size=a.vocab)
    B = a.groups * a.g
    with tempfile.TemporaryDirectory() as out_dir:
        args = ICTGRPOConfig(output_dir=out_dir, use_cpu=True, bf16=False, report_to="none", save_strategy="no",
                             per_device_train_batch_size=B, num_generations=a.g, max_completion_length=a.t,
                             token_selector="ict", selection_warmup_steps=0, disable_tqdm=True)
        trainer = ICTGRPOTrainer(model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                                 args=args, train_dataset=Dataset.from_dict({"prompt": ["x"] * B}),
                                 processing_class=tok)
    trainer.model.train()
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, len(tok), (a.groups, 1, P), generator=gen).expand(-1, a.g, -1).reshape(B, P)
    completion = torch.randint(0, len(tok), (B, a.t), generator=gen)
    batch = {"prompt_ids": prompt, "prompt_mask": torch.ones_like(prompt), "completion_ids": completion,
             "completion_mask": torch.ones_like(completion)}
    mask = torch.ones(B, a.t, dtype=torch.bool)
    group_ids = torch.arange(B) // a.g

    def run(k: int | None) -> tuple[float, torch.Tensor]:
        trainer.args.selection_topk = k
        start = time.perf_counter()
        _, js = trainer._selection_stats(batch, mask, group_ids)
        return time.perf_counter() - start, js

    _, js_exact = run(None)
    _, js_topk = run(a.k)
    times: dict[str, list[float]] = {"exact": [], "topk": []}
    for r in range(a.repeats):
        order = [("exact", None), ("topk", a.k)] if r % 2 == 0 else [("topk", a.k), ("exact", None)]
        for name, k in order:
            times[name].append(run(k)[0])
    ratios = [t / e for t, e in zip(times["topk"], times["exact"])]

    # The parts that differ, on the logits the statistics pass sees (one block: stats_chunk_size >= B * T here).
    with torch.no_grad():
        h = trainer.model.model(input_ids=torch.cat([prompt, completion], 1)).last_hidden_state[:, P - 1:-1]
        logits = trainer.model.get_output_embeddings()(h).float()
    tau = trainer.args.selection_temperature
    lp, ids = topk_log_softmax(logits.clone(), a.k, tau)
    parts = {
        "token_stats": lambda: token_stats(logits, mask, completion, tau),
        "token_stats+group_js": lambda: token_stats(logits, mask, completion, tau, group_ids=group_ids),
        "clone_logits": lambda: logits.clone(),  # subtract from the next one
        "clone+topk_logprobs": lambda: topk_log_softmax(logits.clone(), a.k, tau),
        "group_js_divergence_topk": lambda: group_js_divergence_topk(lp, ids, mask, group_ids),
    }
    part_times: dict[str, list[float]] = {n: [] for n in parts}
    for _ in range(a.repeats):
        for name, f in parts.items():
            start = time.perf_counter()
            f()
            part_times[name].append(time.perf_counter() - start)
    part_med = {n: statistics.median(v) for n, v in part_times.items()}

    def sel(u: torch.Tensor) -> torch.Tensor:
        return select("ict", SelectionInputs(mask=mask, ict_score=u, group_ids=group_ids), ratio=0.1,
                      scope="response")

    s_exact, s_topk = sel(js_exact), sel(js_topk)
    med = {n: statistics.median(v) for n, v in times.items()}
    result = {
        "argv": sys.argv[1:], "vocab": a.vocab, "B": B, "G": a.g, "T": a.t, "K": a.k, "repeats": a.repeats,
        "threads": torch.get_num_threads(), "loadavg": os.getloadavg(),
        "times_s": times, "median_s": med, "ratio_of_medians": med["topk"] / med["exact"],
        "median_ratio": statistics.median(ratios),
        "max_abs_diff_u": float((js_topk - js_exact).abs().max()), "mean_u_exact": float(js_exact.mean()),
        "selection_precision": float((s_exact & s_topk).sum() / s_topk.sum()),
        "part_times_s": part_times, "part_median_s": part_med,
    }
    atomic_write_json(a.out, result)
    print(f"V {a.vocab}, B {B} (groups of {a.g}), T {a.t}, K {a.k}, {a.repeats} repeats, load {os.getloadavg()[0]:.1f}")
    print(f"exact  median {med['exact']:.3f} s  {['%.3f' % t for t in times['exact']]}")
    print(f"top-{a.k} median {med['topk']:.3f} s  {['%.3f' % t for t in times['topk']]}")
    print(f"ratio topk/exact: of medians {result['ratio_of_medians']:.3f}, median per-repeat {result['median_ratio']:.3f}")
    print(f"max |u_topk - u_exact| {result['max_abs_diff_u']:.2e} (mean u {result['mean_u_exact']:.2e}); "
          f"top-10% precision {result['selection_precision']:.3f}")
    for name, t in part_med.items():
        print(f"  {name:26s} {t:.3f} s")
    assert math.isfinite(result["ratio_of_medians"])


if __name__ == "__main__":
    main()
