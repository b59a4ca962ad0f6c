"""The ICT score from the sampler's top-K log-probs on the embedded task's real rollouts.

The warm-started tiny model (``ictrl.experiments.tasks.tinymodel``, the demo's base, byte vocabulary V = 259) samples real
completions of tiny-task prompts inside ``ICTGRPOTrainer._generate_and_score_completions``, with the generation
recorder on at K = V (``selection_topk_source="sampler"``): the recorded rows, sorted, hold every top-K prefix. Per
batch and K in --ks the score from the first K columns (``group_js_divergence_topk``) is compared with the exact
score of the same batch (``token_stats`` group JS over the statistics pass's full logits): precision of the
top-10%-per-response selection (equal counts, so also recall), Spearman correlation and mean |du| over active
tokens.

Time: on the same batches, the statistics pass with the top-K taken from the sampler (no top-K sweep over the LM
head) against the head top-K path (``topk_log_softmax`` on the head's logits), alternating, medians; and the cost of
recording during generation (``generate`` with and without the recorder, alternating).

    .venv/bin/python bench/bench_topk_rollouts.py            # 4 batches of 16 prompts x 8 completions

Writes bench/results/topk_rollouts.json atomically.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from ictrl.files import atomic_write_json

RESULTS = Path(__file__).resolve().parent / "results" / "topk_rollouts.json"


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    ra, rb = a.argsort().argsort().double(), b.argsort().argsort().double()
    ra, rb = ra - ra.mean(), rb - rb.mean()
    return float((ra * rb).sum() / (ra.norm() * rb.norm()).clamp(min=1e-300))


def select_top(score: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    from ictrl.core.selection import SelectionInputs, select

    return select("ict", SelectionInputs(mask=mask, step=100, ict_score=score), ratio=0.1, scope="response")


def rollouts(a: argparse.Namespace, out_dir: str) -> tuple[Any, list[dict[str, Any]], list[dict[str, Any]]]:
    """The trainer (recording at K = V) and its statistics-pass inputs for --batches real generation batches."""
    from ictrl.engine.config import ICTGRPOConfig
    from ictrl.engine.trainer import ICTGRPOTrainer
    from ictrl.experiments.tasks import tinytask
    from ictrl.experiments.tasks.tinymodel import TinyRecipe, build_tiny_base, load_tiny_base, max_new_tokens

    recipe = TinyRecipe()
    model, tokenizer = load_tiny_base(build_tiny_base(recipe))
    V = model.get_output_embeddings().weight.shape[0]
    dataset = tinytask.train_dataset(a.prompts, a.batches, recipe.difficulty, seed=1)
    args = ICTGRPOConfig(
        output_dir=out_dir, use_cpu=True, bf16=False, report_to="none", save_strategy="no", seed=0,
        per_device_train_batch_size=a.prompts * a.g, num_generations=a.g,
        max_completion_length=max_new_tokens(recipe.difficulty), temperature=1.0, top_k=0, top_p=1.0,
        token_selector="ict", selection_warmup_steps=0, selection_topk=V, selection_topk_source="sampler",
        disable_tqdm=True)
    trainer = ICTGRPOTrainer(model=model, reward_funcs=tinytask.tinyarith_reward, args=args, train_dataset=dataset,
                             processing_class=tokenizer)
    captured: list[dict[str, Any]] = []
    original = trainer._selection_stats

    def capture(batch: Any, mask: Any, group_ids: Any, sampler_topk: Any = None) -> Any:
        stats, js = original(batch, mask, group_ids, sampler_topk)
        captured.append({"batch": batch, "mask": mask, "groups": group_ids, "topk": sampler_topk, "js": js})
        return stats, js

    trainer._selection_stats = capture
    trainer.model.train()
    rows = dataset.to_list()
    for i in range(a.batches):
        trainer._generate_and_score_completions([r for r in rows[i * a.prompts:(i + 1) * a.prompts]
                                                 for _ in range(a.g)])
    trainer._selection_stats = original
    return trainer, captured, rows


def agreement(trainer: Any, captured: list[dict[str, Any]], ks: list[int]) -> tuple[dict[int, dict[str, float]],
                                                                                      float]:
    """Per K: mean over batches of precision, Spearman, mean |du| against the exact score; and the max |du| of the
    recorded K = V score."""
    from ictrl.core.stats import group_js_divergence_topk

    args, V = trainer.args, trainer.args.selection_topk
    per_k: dict[int, dict[str, list[float]]] = {k: {"precision": [], "spearman": [], "mad": []} for k in ks}
    full_diff = []
    for c in captured:
        mask, groups, (lp, ids) = c["mask"], c["groups"], c["topk"]
        args.selection_topk = None  # the exact score: token_stats' group JS over the head's logits
        _, exact = trainer._selection_stats(c["batch"], mask, groups)
        args.selection_topk = V
        full_diff.append(float((c["js"] - exact)[mask].abs().max()))
        sel_exact = select_top(exact, mask)
        for k in ks:
            u = group_js_divergence_topk(lp[..., :k].contiguous(), ids[..., :k].contiguous(), mask, groups)
            sel = select_top(u, mask)
            per_k[k]["precision"].append(float((sel & sel_exact).sum() / sel.sum().clamp(min=1)))
            per_k[k]["spearman"].append(spearman(u[mask].double(), exact[mask].double()))
            per_k[k]["mad"].append(float((u - exact)[mask].abs().mean()))
    return {k: {m: statistics.mean(v) for m, v in d.items()} for k, d in per_k.items()}, max(full_diff)


def timings(trainer: Any, captured: list[dict[str, Any]], rows: list[dict[str, Any]], a: argparse.Namespace,
            k: int) -> dict[str, list[float]]:
    """Alternating repeats: the statistics pass with the sampler's vs the head's top-K, and generate with vs
    without the recorder."""
    trainer.args.selection_topk = trainer._sampler_topk = k
    out: dict[str, list[float]] = {"sampler_topk": [], "head_topk": [], "with_recorder": [], "plain": []}
    for c in captured:
        topk = (c["topk"][0][..., :k].contiguous(), c["topk"][1][..., :k].contiguous())
        trainer._selection_stats(c["batch"], c["mask"], c["groups"], topk)  # warm-up
        trainer._selection_stats(c["batch"], c["mask"], c["groups"])
        for _ in range(a.repeats):
            t0 = time.perf_counter()
            trainer._selection_stats(c["batch"], c["mask"], c["groups"], topk)
            t1 = time.perf_counter()
            trainer._selection_stats(c["batch"], c["mask"], c["groups"])
            out["sampler_topk"].append(t1 - t0)
            out["head_topk"].append(time.perf_counter() - t1)
    tok = trainer.processing_class
    prompt_ids = [tok(r["prompt"])["input_ids"] for r in rows[:a.prompts] for _ in range(a.g)]
    for _ in range(a.repeats):
        t0 = time.perf_counter()
        trainer._generate_single_turn(prompt_ids, None, {}, a.g)  # records the top-K
        t1 = time.perf_counter()
        trainer._sampler_topk = None
        trainer._generate_single_turn(prompt_ids, None, {}, a.g)  # plain
        trainer._sampler_topk = k
        out["with_recorder"].append(t1 - t0)
        out["plain"].append(time.perf_counter() - t1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=16, help="prompts per batch")
    ap.add_argument("--g", type=int, default=8, help="completions per prompt")
    ap.add_argument("--ks", type=int, nargs="+", default=[8, 16, 32, 64, 128])
    ap.add_argument("--time-k", type=int, default=64, help="K of the timing comparison")
    ap.add_argument("--repeats", type=int, default=5, help="timing repeats per batch")
    ap.add_argument("--out", type=Path, default=RESULTS)
    a = ap.parse_args()

    with tempfile.TemporaryDirectory() as out_dir:
        trainer, captured, rows = rollouts(a, out_dir)
        V = trainer.args.selection_topk
        per_k, full_diff = agreement(trainer, captured, a.ks)
        t = timings(trainer, captured, rows, a, a.time_k)
    med = statistics.median
    result = {
        "vocab": V, "batches": a.batches, "responses_per_batch": a.prompts * a.g,
        "tokens": [int(c["mask"].sum()) for c in captured], "max_abs_diff_sampler_k_eq_v_vs_exact": full_diff,
        "agreement": per_k, "time_k": a.time_k,
        "stats_pass_s": {"sampler_topk": med(t["sampler_topk"]), "head_topk": med(t["head_topk"]),
                         "ratio": med(t["sampler_topk"]) / med(t["head_topk"])},
        "generate_s": {"with_recorder": med(t["with_recorder"]), "plain": med(t["plain"]),
                       "ratio": med(t["with_recorder"]) / med(t["plain"])},
    }
    atomic_write_json(a.out, result)
    print(f"V {V}, {a.batches} batches x {a.prompts * a.g} responses, active tokens {result['tokens']}")
    print(f"K = V: max |u_sampler - u_exact| = {full_diff:.2e}")
    print("| K | precision | Spearman | mean abs du |")
    print("|---|---|---|---|")
    for k, d in per_k.items():
        print(f"| {k} | {d['precision']:.3f} | {d['spearman']:.4f} | {d['mad']:.5f} |")
    s, g = result["stats_pass_s"], result["generate_s"]
    print(f"stats pass (K {a.time_k}): sampler {s['sampler_topk']:.4f} s, head {s['head_topk']:.4f} s, "
          f"ratio {s['ratio']:.3f}")
    print(f"generate: with recorder {g['with_recorder']:.3f} s, plain {g['plain']:.3f} s, ratio {g['ratio']:.3f}")


if __name__ == "__main__":
    sys.exit(main())
