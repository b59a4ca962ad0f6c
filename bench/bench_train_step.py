"""Time per optimizer step: ictrl's ICT vs GRPO, ictrl vs TRL's stock GRPOTrainer, sparse vs dense loss head.

Part 1 (trainer): a tiny Qwen2 (``ictrl.models``; vocabulary padded to --vocab, default 151,936 as Qwen2.5) trains
--steps optimizer steps per variant on CPU with real generation and a fixed deterministic reward. Variants:

    ict, all            ICTGRPOTrainer with token_selector ict (warm-up 0) / all
    ict+sparse, ...     the same with sparse_backward=True (only when ICTGRPOConfig has that field)
    trl_q0.2, trl_q1.0  TRL's stock GRPOTrainer with top_entropy_quantile 0.2 / 1.0

Each repeat runs every variant once, in a rotated order, on a freshly built model with the same seed; the first
step of each run is dropped (warm-up). Per variant: median wall time of an optimizer step (callback from step
begin to step end), of ``_generate_and_score_completions`` (generation, rewards, and for ictrl the statistics
pass), of the statistics pass alone (``ictrl/stats_time``), and the rest (loss forward+backward, optimizer).
Ratios are taken within a repeat and the median over repeats is reported (the machine is shared and noisy).

Part 2 (loss head alone): forward+backward of a selected-token policy loss from hidden states [B, T, H] through a
[V, H] head: dense (full logits → log_softmax → gather), TRL's chunked log-prob kernel over every row (what the
trainer uses), and ``ictrl.logprobs.selected_token_logprobs`` over the selected rows only.

    .venv/bin/python bench/bench_train_step.py                  # defaults below
    .venv/bin/python bench/bench_train_step.py --quick          # 1 repeat, 2 steps, smaller head bench

Writes bench/results/train_step.json atomically and prints tables.
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

RESULTS = Path(__file__).resolve().parent / "results" / "train_step.json"
PROMPTS = [f"Problem {i}: what is {i} + {2 * i + 1}? Answer:" for i in range(64)]


def fixed_reward(prompts: list[Any], completions: list[str], completion_ids: list[list[int]],
                 **kwargs: Any) -> list[float]:
    """Deterministic and varied within a group (non-zero advantages): parity of the sum of the completion's ids.

    Ids, not text: with the vocabulary padded past the tokenizer's 259 tokens most sampled ids decode to "".
    """
    return [float(sum(ids) % 2) for ids in completion_ids]


def build_trainer(variant: str, a: argparse.Namespace, out_dir: str) -> Any:
    """A trainer for one variant on a fresh tiny model (same seed for all variants)."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from ictrl.engine.config import ICTGRPOConfig
    from ictrl.engine.trainer import ICTGRPOTrainer
    from ictrl.models import build_byte_tokenizer, build_tiny_qwen2

    tokenizer = build_byte_tokenizer()
    tokenizer.padding_side = "left"
    model = build_tiny_qwen2(tokenizer, hidden_size=a.hidden, num_hidden_layers=a.layers, vocab_size=a.vocab, seed=0)
    common = dict(output_dir=out_dir, use_cpu=True, bf16=False, report_to="none", save_strategy="no",
                  logging_steps=1, max_steps=a.steps, per_device_train_batch_size=a.batch,
                  num_generations=a.generations, max_completion_length=a.completion_len, learning_rate=1e-5,
                  seed=0, disable_tqdm=True, dataloader_num_workers=0, temperature=1.0)
    if variant.startswith("trl_q"):
        cls, args = GRPOTrainer, GRPOConfig(**common, top_entropy_quantile=float(variant[5:]))
    else:
        selector, _, sparse = variant.partition("+")
        extra = {"sparse_backward": True} if sparse else {}
        cls, args = ICTGRPOTrainer, ICTGRPOConfig(**common, token_selector=selector, selection_warmup_steps=0,
                                                  **extra)
    return cls(model=model, reward_funcs=fixed_reward, args=args,
               train_dataset=Dataset.from_dict({"prompt": PROMPTS}), processing_class=tokenizer)


def run_variant(variant: str, a: argparse.Namespace) -> dict[str, float]:
    """Train a.steps steps; medians (seconds) over the steps after the first."""
    from transformers import PrinterCallback, TrainerCallback

    step_times: list[float] = []
    gen_times: list[float] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.t0 = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            step_times.append(time.perf_counter() - self.t0)

    with tempfile.TemporaryDirectory() as out_dir:
        trainer = build_trainer(variant, a, out_dir)
        trainer.add_callback(StepTimer())
        trainer.remove_callback(PrinterCallback)  # per-step log dicts would drown the table
        generate = trainer._generate_and_score_completions

        def timed_generate(inputs: Any) -> Any:
            t0 = time.perf_counter()
            out = generate(inputs)
            gen_times.append(time.perf_counter() - t0)
            return out

        trainer._generate_and_score_completions = timed_generate
        trainer.train()
        stats_times = [h["ictrl/stats_time"] for h in trainer.state.log_history if "ictrl/stats_time" in h]
    if len(step_times) != a.steps or len(gen_times) != a.steps:
        raise RuntimeError(f"{variant}: expected {a.steps} steps and generations, got {len(step_times)} and "
                           f"{len(gen_times)} (steps_per_generation must be 1 for this benchmark)")
    keep = slice(1, None) if a.steps > 1 else slice(None)
    step, gen = statistics.median(step_times[keep]), statistics.median(gen_times[keep])
    stats = statistics.median(stats_times[keep]) if stats_times else 0.0
    return {"step_s": step, "generate_s": gen - stats, "stats_s": stats, "loss_and_optimizer_s": step - gen}


def head_bench(B: int, T: int, H: int, V: int, ratio: float, repeats: int) -> dict[str, float]:
    """Median seconds of forward+backward of the loss head: dense, TRL's chunked kernel, ictrl sparse."""
    from trl.kernels.chunked_logprob import ChunkedLogProbFunction

    from ictrl.logprobs import selected_token_logprobs

    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(B, T, H, generator=g, requires_grad=True)
    head = torch.nn.Linear(H, V, bias=False)
    tokens = torch.randint(0, V, (B, T), generator=g)
    selected = torch.rand(B, T, generator=g) < ratio
    weights = selected / selected.sum().clamp(min=1)

    def dense() -> torch.Tensor:
        return torch.log_softmax(head(hidden), -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)

    def trl_chunked() -> torch.Tensor:
        lp = ChunkedLogProbFunction.apply(hidden.reshape(-1, H), head.weight, None, tokens.reshape(-1), 1.0, 32768,
                                          None, 1.0, ("log_probs",))[0]
        return lp.view(B, T)

    def sparse() -> torch.Tensor:
        return selected_token_logprobs(hidden, head, tokens, selected)

    methods = {"dense": dense, "trl_chunked": trl_chunked, "ictrl_sparse": sparse}
    times: dict[str, list[float]] = {k: [] for k in methods}
    grads = {}
    for r in range(repeats + 1):  # round 0 is a warm-up
        for name, fn in methods.items():
            hidden.grad, head.weight.grad = None, None
            t0 = time.perf_counter()
            (fn() * weights).sum().backward()
            if r:
                times[name].append(time.perf_counter() - t0)
            grads[name] = hidden.grad.clone()
    for name in ("trl_chunked", "ictrl_sparse"):  # same gradient, or the timing compares different work
        torch.testing.assert_close(grads[name], grads["dense"], rtol=1e-3, atol=1e-6)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=151_936)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8, help="completions per optimizer step")
    ap.add_argument("--generations", type=int, default=4, help="num_generations (group size)")
    ap.add_argument("--completion-len", type=int, default=32)
    ap.add_argument("--steps", type=int, default=3, help="optimizer steps per run (the first is dropped)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--variants", default=None, help="comma-separated subset of the variants")
    ap.add_argument("--head-shape", default="8,128,64", help="B,T,H of the loss-head bench (V = --vocab)")
    ap.add_argument("--skip-trainer", action="store_true")
    ap.add_argument("--quick", action="store_true", help="1 repeat, 2 steps")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    a = ap.parse_args()
    if a.quick:
        a.repeats, a.steps = 1, 2
    if a.batch % a.generations:
        ap.error("--batch must be a multiple of --generations (TRL's generation batch)")
    if a.threads:
        torch.set_num_threads(a.threads)

    variants = ["ict", "ict+sparse", "all", "all+sparse", "trl_q0.2", "trl_q1.0"]
    if a.variants:
        variants = a.variants.split(",")
    result: dict[str, Any] = {"config": {k: v for k, v in vars(a).items()}, "torch_threads": torch.get_num_threads()}

    if not a.skip_trainer:
        runs: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
        for r in range(a.repeats):
            order = variants[r % len(variants):] + variants[:r % len(variants)]
            for v in order:
                t0 = time.perf_counter()
                runs[v].append(run_variant(v, a))
                print(f"repeat {r} {v:12s} step {runs[v][-1]['step_s']:.3f} s  (run {time.perf_counter() - t0:.0f} s)",
                      file=sys.stderr, flush=True)
        summary = {v: {k: statistics.median(run[k] for run in runs[v]) for k in runs[v][0]} for v in variants}
        pairs = [("ict", "all"), ("all", "trl_q1.0"), ("all", "trl_q0.2"), ("trl_q0.2", "trl_q1.0"),
                 ("ict+sparse", "ict"), ("all+sparse", "all"), ("ict+sparse", "trl_q1.0")]
        ratios = {f"{x}/{y}": statistics.median(runs[x][i]["step_s"] / runs[y][i]["step_s"] for i in range(a.repeats))
                  for x, y in pairs if x in runs and y in runs}
        for v in variants:
            summary[v]["stats_share"] = summary[v]["stats_s"] / summary[v]["step_s"]
        result.update(trainer=summary, trainer_runs=runs, step_time_ratios=ratios)
        print(f"\nOptimizer step, V={a.vocab}, hidden {a.hidden}x{a.layers}, {a.batch} completions x "
              f"{a.completion_len} tokens, median of {a.repeats} repeats x {max(a.steps - 1, 1)} steps")
        print(f"{'variant':12s} {'step s':>8s} {'generate':>9s} {'stats':>8s} {'loss+opt':>9s} {'stats %':>8s}")
        for v, s in summary.items():
            print(f"{v:12s} {s['step_s']:8.3f} {s['generate_s']:9.3f} {s['stats_s']:8.3f} "
                  f"{s['loss_and_optimizer_s']:9.3f} {100 * s['stats_share']:7.1f}%")
        for k, v in ratios.items():
            print(f"  step ratio {k:22s} {v:.3f}")

    B, T, H = (int(x) for x in a.head_shape.split(","))
    if a.quick:
        B, T = max(2, B // 2), max(16, T // 2)
    head = head_bench(B, T, H, a.vocab, 0.1, a.repeats + 2)
    result["loss_head"] = {"shape": {"B": B, "T": T, "H": H, "V": a.vocab, "selected_frac": 0.1}, "seconds": head,
                           "ratio_sparse_to_trl": head["ictrl_sparse"] / head["trl_chunked"],
                           "ratio_sparse_to_dense": head["ictrl_sparse"] / head["dense"]}
    print(f"\nLoss head forward+backward, B={B} T={T} H={H} V={a.vocab}, 10% selected, median of {a.repeats + 2}")
    for k, v in head.items():
        print(f"  {k:14s} {v:8.3f} s")
    atomic_write_json(RESULTS, result)
    print(f"\nwrote {RESULTS}")


if __name__ == "__main__":
    main()
