"""Time per optimizer step: ictrl's ICT vs GRPO, ictrl vs TRL's stock GRPOTrainer, sparse vs dense loss head.

Part 1 (trainer): a tiny Qwen2 (``ictrl.models``; vocabulary padded to each of --vocabs, default 151,936 as
Qwen2.5 and 259, the byte tokenizer's own) trains --steps optimizer steps per variant on CPU with a fixed
deterministic reward, on the same batch for every variant (``--generation fixed``: deterministic completions of
--completion-len ids; ``real``: TRL's sampling). Variants:

    ict, entropy, all       ICTGRPOTrainer with that token_selector (warm-up 0), statistics by the one-pass path
    ict+sparse              the same with sparse_backward=True
    ict@separate, ...       one_pass = False: the separate statistics pass (the only path before the one-pass paths)
    trl_q1.0                TRL's stock GRPOTrainer (top_entropy_quantile 1.0: plain GRPO)

Each repeat runs every variant once, in a rotated order, on a freshly built model with the same seed; the first
step of each run is dropped (warm-up). Per variant: median wall time of an optimizer step (callback from step
begin to step end), of ``_generate_and_score_completions`` (generation, rewards, and for the separate/shared paths
the statistics pass), of the statistics pass alone (``ictrl/stats_time``), the rest (loss forward+backward,
optimizer; for the one-pass path the statistics too), and ``train`` = step − generation − rewards. Ratios are
taken within a repeat and the median over repeats is reported (the machine is shared and noisy).

Part 3 (forward passes): backbone calls outside generation per optimizer step (a forward pre-hook on the
backbone), per selector and num_iterations 1 and 2, one pass vs the separate pass, and the ``ictrl/stats_path``
logged (0 separate, 1 shared with TRL's old log-probs, 2 training forward).

Part 2 (loss head alone): forward+backward of a selected-token policy loss from hidden states [B, T, H] through a
[V, H] head: dense (full logits → log_softmax → gather), TRL's chunked log-prob kernel over every row (what the
trainer uses), and ``ictrl.core.logprobs.selected_token_logprobs`` over the selected rows only.

    .venv/bin/python bench/bench_train_step.py                  # defaults below
    .venv/bin/python bench/bench_train_step.py --quick          # 1 repeat, 2 steps, smaller head bench
    .venv/bin/python bench/bench_train_step.py --skip-head --steps 2 --repeats 2   # what bench/README.md reports

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


def fixed_completions(prompt_ids: list[list[int]], num_generations: int, length: int, vocab: int) -> list[list[int]]:
    """Completion j of a prompt: ``length`` ids drawn from a generator seeded by (prompt, j), no EOS, so every
    variant trains on the same batch whatever its weights."""
    out = []
    for i, p in enumerate(prompt_ids):
        g = torch.Generator().manual_seed(hash((tuple(p), i % num_generations)) & ((1 << 62) - 1))
        out.append(torch.randint(3, min(vocab, 259), (length,), generator=g).tolist())
    return out


def with_fixed_generation(cls: type, a: argparse.Namespace) -> type:
    """``cls`` whose rollout returns :func:`fixed_completions` (``--generation fixed``)."""

    class Fixed(cls):  # type: ignore[misc, valid-type]
        def _generate_single_turn(self, prompt_ids: list[list[int]], *args: Any, **kwargs: Any) -> tuple[list, None]:
            return fixed_completions(prompt_ids, a.generations, a.completion_len, a.vocab), None

    return Fixed


def build_trainer(variant: str, a: argparse.Namespace, out_dir: str, num_iterations: int = 1) -> Any:
    """A trainer for one variant on a fresh tiny model (same seed for all variants).

    Variant names: ``SELECTOR[+sparse][+topkK][+ds][+accN][@separate][:quiet]`` (ICTGRPOTrainer;
    ``+topkK``: ``selection_topk`` K; ``+ds``: ``dynamic_sampling``;
    ``+accN``: the step's --batch completions in N micro-batches; ``@separate`` forces the separate statistics pass,
    ``one_pass = False``; ``:quiet``: ``logging_steps`` 10), ``trl_qQ`` (TRL's stock GRPOTrainer with
    top_entropy_quantile Q).
    """
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from ictrl.engine.config import ICTGRPOConfig
    from ictrl.engine.trainer import ICTGRPOTrainer
    from ictrl.models import build_byte_tokenizer, build_real_shape, build_tiny_qwen2

    if getattr(a, "shape", None):  # a Qwen2.5 architecture (bench_real_shape.py), a.layers deep
        model, tokenizer = build_real_shape(a.shape, num_layers=a.layers, seed=0)
    else:
        tokenizer = build_byte_tokenizer()
        model = build_tiny_qwen2(tokenizer, hidden_size=a.hidden, num_hidden_layers=a.layers, vocab_size=a.vocab,
                                 seed=0)
    tokenizer.padding_side = "left"
    common = dict(output_dir=out_dir, use_cpu=True, bf16=False, report_to="none", save_strategy="no",
                  logging_steps=1, max_steps=a.steps, per_device_train_batch_size=a.batch,
                  num_generations=a.generations, max_completion_length=a.completion_len, learning_rate=1e-5,
                  seed=0, disable_tqdm=True, dataloader_num_workers=0, temperature=1.0,
                  num_iterations=num_iterations)
    # NAME:quiet: logging_steps 10, so a 2-step run's measured step is not logged (ictrl computes its selection
    # metrics and log Σp² only on logged steps; TRL computes its own metrics on every step)
    variant, quiet = variant.removesuffix(":quiet"), variant.endswith(":quiet")
    common["logging_steps"] = 10 if quiet else 1
    name, _, mode = variant.partition("@")
    if name.startswith("trl_q"):
        cls, args = GRPOTrainer, GRPOConfig(**common, top_entropy_quantile=float(name[5:]))
    else:
        selector, *flags = name.split("+")
        extra: dict[str, Any] = {}
        for flag in flags:
            if flag == "sparse":
                extra["sparse_backward"] = True
            elif flag.startswith("topk"):  # topkK: selection_topk K
                extra.update(selection_topk=int(flag[len("topk"):]))
            elif flag == "ds":  # the paper grid's DAPO dynamic sampling
                extra["dynamic_sampling"] = True
            elif flag.startswith("acc"):  # accN: the step's completions in N micro-batches (the grid's shape)
                n = int(flag[len("acc"):])
                common.update(gradient_accumulation_steps=n, per_device_train_batch_size=a.batch // n)
            else:
                raise ValueError(f"variant {variant!r}: unknown flag {flag!r}")
        cls, args = ICTGRPOTrainer, ICTGRPOConfig(**common, token_selector=selector, selection_warmup_steps=0,
                                                  **extra)
    if a.generation == "fixed":
        cls = with_fixed_generation(cls, a)
    if mode == "separate":
        cls = type("SeparatePass", (cls,), {"one_pass": False})
    return cls(model=model, reward_funcs=fixed_reward, args=args,
               train_dataset=Dataset.from_dict({"prompt": PROMPTS}), processing_class=tokenizer)


def count_forwards(variant: str, a: argparse.Namespace, num_iterations: int) -> dict[str, float]:
    """Backbone calls outside generation per optimizer step (a forward pre-hook on the backbone), and the
    ``ictrl/stats_path`` codes logged."""
    from transformers import PrinterCallback

    with tempfile.TemporaryDirectory() as out_dir:
        trainer = build_trainer(variant, a, out_dir, num_iterations)
        trainer.remove_callback(PrinterCallback)
        model = trainer.model
        calls, generating = [0], [False]
        model.model.register_forward_pre_hook(lambda m, args: calls.__setitem__(0, calls[0] + (not generating[0])))
        generate = model.generate

        def flagged_generate(*args: Any, **kwargs: Any) -> Any:
            generating[0] = True
            try:
                return generate(*args, **kwargs)
            finally:
                generating[0] = False

        model.generate = flagged_generate
        trainer.train()
        paths = sorted({h["ictrl/stats_path"] for h in trainer.state.log_history if "ictrl/stats_path" in h})
        path = type(trainer.stats_paths["train"]).__name__ if hasattr(trainer, "stats_paths") else None
        return {"forwards_per_step": calls[0] / trainer.state.global_step, "stats_paths": paths, "path": path}


def run_variant(variant: str, a: argparse.Namespace, callbacks: tuple[Any, ...] = (),
                setup: Any = None) -> dict[str, Any]:
    """Train a.steps steps; medians (seconds) over the steps after the first, and every step's times."""
    from transformers import PrinterCallback, TrainerCallback

    step_times: list[float] = []
    gen_times: list[float] = []
    opt_times: list[float] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.t0 = time.perf_counter()

        def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.t_opt = time.perf_counter()

        def on_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            opt_times.append(time.perf_counter() - self.t_opt)

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            step_times.append(time.perf_counter() - self.t0)

    with tempfile.TemporaryDirectory() as out_dir:
        trainer = build_trainer(variant, a, out_dir)
        trainer.add_callback(StepTimer())
        for callback in callbacks:
            trainer.add_callback(callback)
        if setup is not None:
            setup(trainer)
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
        paths = {h["ictrl/stats_path"] for h in trainer.state.log_history if "ictrl/stats_path" in h}
    if len(step_times) != a.steps or len(gen_times) != a.steps:
        raise RuntimeError(f"{variant}: expected {a.steps} steps and generations, got {len(step_times)} and "
                           f"{len(gen_times)} (steps_per_generation must be 1 for this benchmark)")
    keep = slice(1, None) if a.steps > 1 else slice(None)
    step, gen = statistics.median(step_times[keep]), statistics.median(gen_times[keep])
    stats = statistics.median(stats_times[keep]) if stats_times else 0.0
    opt = statistics.median(opt_times[keep])
    # On the training-forward path (2) the statistics run inside the loss, not inside generation.
    in_generation = bool(paths) and paths != {2.0}
    return {"step_s": step, "generate_s": gen - stats if in_generation else gen, "stats_s": stats,
            "loss_and_optimizer_s": step - gen, "optimizer_s": opt,
            "loss_s": step - gen - opt - (0.0 if in_generation else stats),
            "step_times": step_times, "stats_paths": sorted(paths)}


def head_bench(B: int, T: int, H: int, V: int, ratio: float, repeats: int) -> dict[str, float]:
    """Median seconds of forward+backward of the loss head: dense, TRL's chunked kernel, ictrl sparse."""
    from trl.kernels.chunked_logprob import ChunkedLogProbFunction

    from ictrl.core.logprobs import selected_token_logprobs

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
    ap.add_argument("--vocabs", default="151936,259", help="comma-separated vocabulary sizes, each timed in turn")
    ap.add_argument("--generation", choices=("fixed", "real"), default="fixed",
                    help="fixed: every variant trains on the same deterministic completions; real: TRL's sampling")
    ap.add_argument("--skip-counts", action="store_true")
    ap.add_argument("--paths", action="store_true", help="count forwards per statistics path (PATH_CONFIGS)")
    ap.add_argument("--out", type=Path, default=RESULTS, help="result JSON (written atomically)")
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
    ap.add_argument("--skip-head", action="store_true")
    ap.add_argument("--quick", action="store_true", help="1 repeat, 2 steps")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    a = ap.parse_args()
    a.vocab = 0
    if a.quick:
        a.repeats, a.steps = 1, 2
    if a.batch % a.generations:
        ap.error("--batch must be a multiple of --generations (TRL's generation batch)")
    if a.threads:
        torch.set_num_threads(a.threads)
    variants = a.variants.split(",") if a.variants else VARIANTS
    result: dict[str, Any] = {"config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(a).items()},
                              "torch_threads": torch.get_num_threads(),
                              "by_vocab": {}}
    for vocab in (int(v) for v in a.vocabs.split(",")):
        a.vocab = vocab
        part: dict[str, Any] = {}
        if not a.skip_trainer:
            part.update(time_variants(variants, a))
        if not a.skip_head:
            part["loss_head"] = run_head_bench(a)
        result["by_vocab"][str(vocab)] = part
    if not a.skip_counts:
        result["forward_counts"] = forward_counts(a)
    if a.paths:
        result["path_counts"] = path_counts(a)
    atomic_write_json(a.out, result)
    print(f"\nwrote {a.out}")


VARIANTS = ["ict", "ict+sparse", "entropy", "all", "ict@separate", "all@separate", "trl_q1.0"]
PAIRS = [("ict", "all"), ("ict+sparse", "all"), ("entropy", "all"), ("all", "trl_q1.0"),
         ("ict@separate", "all"), ("all@separate", "all"), ("ict@separate", "ict")]


def time_variants(variants: list[str], a: argparse.Namespace) -> dict[str, Any]:
    """Every variant once per repeat in rotated order; medians and within-repeat ratios (step, and the training
    part of the step: statistics + loss + optimizer, generation and rewards excluded)."""
    runs: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    for r in range(a.repeats):
        for v in variants[r % len(variants):] + variants[:r % len(variants)]:
            t0 = time.perf_counter()
            run = {k: x for k, x in run_variant(v, a).items() if isinstance(x, float)}
            run["train_s"] = run["step_s"] - run["generate_s"]
            runs[v].append(run)
            print(f"V={a.vocab} repeat {r} {v:14s} step {run['step_s']:.3f} s  train {run['train_s']:.3f} s  "
                  f"(run {time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    summary = {v: {k: statistics.median(run[k] for run in runs[v]) for k in runs[v][0]} for v in variants}
    ratios = {}
    for x, y in PAIRS:
        if x in runs and y in runs:
            for key in ("step_s", "train_s"):
                ratios[f"{x}/{y} {key[:-2]}"] = statistics.median(runs[x][i][key] / runs[y][i][key]
                                                                   for i in range(a.repeats))
    print(f"\nOptimizer step, V={a.vocab}, hidden {a.hidden}x{a.layers}, {a.batch} completions x "
          f"{a.completion_len} tokens, {a.generation} generation, median of {a.repeats} repeats x "
          f"{max(a.steps - 1, 1)} steps")
    print(f"{'variant':14s} {'step s':>8s} {'generate':>9s} {'stats':>8s} {'loss+opt':>9s} {'train':>8s}")
    for v, s in summary.items():
        print(f"{v:14s} {s['step_s']:8.3f} {s['generate_s']:9.3f} {s['stats_s']:8.3f} "
              f"{s['loss_and_optimizer_s']:9.3f} {s['train_s']:8.3f}")
    for k, v in ratios.items():
        print(f"  ratio {k:28s} {v:.3f}")
    return {"trainer": summary, "trainer_runs": runs, "ratios": ratios}


def run_head_bench(a: argparse.Namespace) -> dict[str, Any]:
    B, T, H = (int(x) for x in a.head_shape.split(","))
    if a.quick:
        B, T = max(2, B // 2), max(16, T // 2)
    head = head_bench(B, T, H, a.vocab, 0.1, a.repeats + 2)
    print(f"\nLoss head forward+backward, B={B} T={T} H={H} V={a.vocab}, 10% selected, median of {a.repeats + 2}")
    for k, v in head.items():
        print(f"  {k:14s} {v:8.3f} s")
    return {"shape": {"B": B, "T": T, "H": H, "V": a.vocab, "selected_frac": 0.1}, "seconds": head,
            "ratio_sparse_to_trl": head["ictrl_sparse"] / head["trl_chunked"],
            "ratio_sparse_to_dense": head["ictrl_sparse"] / head["dense"]}


def forward_counts(a: argparse.Namespace) -> dict[str, Any]:
    """Backbone passes per optimizer step, per selector and num_iterations, one pass vs the separate pass
    (2 optimizer steps at V = 259: the count does not depend on V)."""
    a.vocab, a.steps = 259, 2
    out: dict[str, Any] = {}
    print("\nBackbone passes per optimizer step (outside generation), one pass / separate pass")
    for v in ("all", "entropy", "ict", "ict+sparse", "trl_q1.0"):
        for mu in (1, 2):
            one = count_forwards(v, a, mu)
            sep = count_forwards(f"{v}@separate", a, mu) if not v.startswith("trl") else None
            out[f"{v} mu={mu}"] = {"one_pass": one, "separate": sep}
            print(f"  {v:12s} num_iterations={mu}: {one['forwards_per_step']:.1f} (path {one['stats_paths']})"
                  + (f" / {sep['forwards_per_step']:.1f}" if sep else ""))
    return out


# Which statistics path a run takes, and what it saves: (name, variant, num_iterations). The paper's grid
# (configs/base/train.yaml: dynamic_sampling, a step in several micro-batches, num_iterations 1) and the library's
# defaults (ICTGRPOConfig: no dynamic sampling, one micro-batch, num_iterations 1), and the settings each fused
# path needs; each also counted with the separate pass forced (@separate): the forward it would otherwise pay.
PATH_CONFIGS = [
    ("grid", "ict+ds+acc4", 1),
    ("grid without dynamic sampling", "ict+acc4", 1),
    ("defaults", "ict", 1),
    ("defaults, num_iterations 2", "ict", 2),
    ("defaults, head top-K", "ict+topk4", 1),
]


def path_counts(a: argparse.Namespace, configs: list[tuple[str, str, int]] = PATH_CONFIGS) -> dict[str, Any]:
    """Backbone forwards per optimizer step (outside generation) of each of ``configs``, on its planned path and
    with the separate pass forced (2 optimizer steps at V = 259: the count does not depend on V)."""
    a.vocab, a.steps = 259, 2
    out: dict[str, Any] = {}
    print("\nStatistics path and backbone forwards per optimizer step (planned / separate pass forced)")
    for name, variant, mu in configs:
        # the sampler's top-K is recorded by TRL's sampling, which the fixed completions skip
        run = argparse.Namespace(**{**vars(a), "generation": "real"}) if "=sampler" in variant else a
        planned, forced = count_forwards(variant, run, mu), count_forwards(f"{variant}@separate", run, mu)
        out[name] = {"variant": variant, "num_iterations": mu, "planned": planned, "separate": forced}
        print(f"  {name:28s} {variant:20s} {planned['path']}: {planned['forwards_per_step']:.1f} / "
              f"{forced['forwards_per_step']:.1f}")
    return out


if __name__ == "__main__":
    main()
