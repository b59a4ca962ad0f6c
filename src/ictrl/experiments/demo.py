"""``ictrl demo``: build (or load) the tiny warm-started base, run ICT RLVR on the synthetic task, evaluate.

Everything runs on CPU in minutes: the base model is a ~140k-parameter Qwen2 (``tinymodel``), the task is
operator precedence with a boxed answer (``tinytask``), and RL runs through ``ICTGRPOTrainer`` (the trainer
``ictrl train`` uses) with a programmatic ``ICTGRPOConfig``. Pass@1 and pass@4 on the held-out test split come
from ``ictrl.eval``'s harness before and after; the H1 trajectory comes from the trainer's logged
``ictrl/h1/all``. A JSON summary is written atomically to ``OUTPUT_DIR/summary.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ictrl.data import Problem
from ictrl.errors import UserError
from ictrl.experiments.tasks import tinytask
from ictrl.experiments.tasks.tinymodel import (
    REPRODUCIBLE_THREADS,
    TinyRecipe,
    build_tiny_base,
    load_tiny_base,
    task_max_new_tokens,
)
from ictrl.core.selection import get_selector, method_names

REWARD_NAME = tinytask.tinyarith_reward.__name__

# The full plan (its measured numbers: README) and a tiny plan for tests. lr 1e-4: half the edge of ICT's stable
# range on this task (studies/README.md, "The demo's learning rate").
FULL = {"steps": 120, "lr": 1e-4, "prompts": 32, "generations": 8, "eval_problems": 200, "eval_samples": 8}
QUICK = {"steps": 4, "lr": 2e-4, "prompts": 4, "generations": 4, "eval_problems": 16, "eval_samples": 4}
# Torch threads of the whole demo (base build, RL, evaluation): float reductions round differently with another
# count, and sampling turns a rounding difference into another run, so a fixed count gives every machine the
# numbers in README (a machine's default count would give each core count its own). One thread: the tiny model
# gains little from more. The same count as `ictrl tiny-model`'s, so the two share one cached base.
DEMO_THREADS = REPRODUCIBLE_THREADS
QUICK_RECIPE = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "difficulty": (2,),
                "train_problems": 500, "max_steps": 20, "eval_every": 10, "dev_problems": 16, "dev_samples": 1,
                "batch_size": 16}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--selector", "--method", dest="method", default="ict", type=method_name,
                        metavar="SELECTOR", help=f"token selector or its method label: {', '.join(method_names())}, "
                                                 "or module:function (default: ict)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the base model recipe and of RL")
    parser.add_argument("--steps", type=int, default=None, help=f"RL optimizer steps (default {FULL['steps']})")
    parser.add_argument("--learning-rate", "--lr", dest="lr", type=float, default=None,
                        help=f"RL learning rate (default {FULL['lr']})")
    parser.add_argument("--output-dir", "--output_dir", default="runs/demo",
                        help="where the RL run, the trained model (model/) and summary.json go (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=DEMO_THREADS,
                        help="torch threads for the whole demo; the README's numbers are for the default, "
                             "%(default)s (another count rounds differently, and the run differs)")
    parser.add_argument("--cache-dir", default=None, help="base-model cache (default $ICTRL_CACHE_DIR or "
                        "~/.cache/ictrl)")
    parser.add_argument("--quick", action="store_true", help="a much smaller run (seconds; for tests)")


def method_name(name: str) -> str:
    """argparse type: a name the selector registry accepts (one clear line otherwise)."""
    try:
        get_selector(name)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return name


def _trainer_args(method: str, out: Path, seed: int, steps: int, lr: float, prompts: int, generations: int,
                  completion_len: int) -> Any:
    from ictrl.core.selection import get_selector
    from ictrl.engine.config import ICTGRPOConfig

    completions = prompts * generations
    return ICTGRPOConfig(
        output_dir=str(out), use_cpu=True, bf16=False, seed=seed, report_to="none", save_strategy="no",
        logging_steps=1, disable_tqdm=True, max_steps=steps, learning_rate=lr, lr_scheduler_type="constant",
        warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
        # One generation batch of `prompts` x `generations`, used for two optimizer steps (inner updates).
        per_device_train_batch_size=completions, gradient_accumulation_steps=1, steps_per_generation=1,
        num_iterations=2, num_generations=generations, max_completion_length=completion_len,
        temperature=1.0, top_k=0, top_p=1.0, beta=0.0, epsilon=0.2, epsilon_high=0.28,
        token_selector=method,  # ratio, scope, warm-up and normaliser: the selector's registered defaults
        loss_normalization=get_selector(method).normalization,  # also for grpo (all alone follows TRL's loss_type)
    )


def _evaluate(model: Any, tokenizer: Any, problems: list[Problem], n: int, seed: int) -> dict[str, float]:
    """Sampled pass@1 and pass@4 (unbiased estimator, n samples per problem, temperature 1)."""
    from ictrl.eval.generate import HFBackend
    from ictrl.eval.harness import EvalConfig, evaluate

    task = tinytask.eval_task(problems)
    difficulty = tuple({p.meta["difficulty"] for p in problems})
    config = EvalConfig(model="tiny", n=n, ks=(1, 4), max_new_tokens=task_max_new_tokens(difficulty), temperature=1.0,
                        top_p=1.0, seeds=(seed,), chunk_size=64, n_bootstrap=200)
    result = evaluate([task], HFBackend(model, tokenizer, batch_size=256), config, progress=False)
    stats = result.summary["benchmarks"][tinytask.TASK_NAME]["pass_at_k"]
    return {f"pass@{k}": float(stats[k]["mean"]) for k in ("1", "4")}


def _trajectory(log_history: list[dict[str, Any]]) -> list[dict[str, float]]:
    rows = []
    for entry in log_history:
        h1 = entry.get("ictrl/h1/all")  # the sampling policy's (TRL's "entropy" is the loss forward's)
        if h1 is None or "train_runtime" in entry:
            continue
        rows.append({"step": int(entry["step"]), "h1": float(h1), "reward": float(entry.get("reward", math.nan)),
                     "selected_frac": float(entry.get("ictrl/selected_frac", math.nan))})
    return rows


def run(args: argparse.Namespace) -> int:
    if args.steps is not None and args.steps < 1:
        raise UserError(f"--steps must be at least 1, got {args.steps}")
    if args.lr is not None and not args.lr > 0:
        raise UserError(f"--learning-rate must be positive, got {args.lr}")
    if args.threads < 1:
        raise UserError(f"--threads must be at least 1, got {args.threads}")
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        return _run(args)
    finally:  # in-process callers (tests) keep their own count
        torch.set_num_threads(threads)


def _make_trainer(args: argparse.Namespace, model: Any, tokenizer: Any, recipe: TinyRecipe, plan: dict[str, Any],
                  out: Path) -> Any:
    """The demo's ICTGRPOTrainer on the tiny task, logging metrics to ``out/metrics.jsonl`` and a rich progress bar
    instead of transformers' printer."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from ictrl.train_cli.callbacks import MetricsJSONL, RichProgress
    from ictrl.engine.trainer import ICTGRPOTrainer

    dataset = tinytask.train_dataset(plan["prompts"], plan["steps"], recipe.difficulty, seed=args.seed)
    trainer_args = _trainer_args(args.method, out / "rl", args.seed, plan["steps"], plan["lr"], plan["prompts"],
                                 plan["generations"], task_max_new_tokens(recipe.difficulty))
    tokenizer.padding_side = "left"
    trainer = ICTGRPOTrainer(model=model, reward_funcs=[tinytask.tinyarith_reward], args=trainer_args,
                             train_dataset=dataset, processing_class=tokenizer)
    for cb in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(cb)
    trainer.add_callback(MetricsJSONL(out / "metrics.jsonl", accuracy_reward=REWARD_NAME))
    trainer.add_callback(RichProgress(accuracy_reward=REWARD_NAME))
    return trainer


def _print_results(before: dict[str, float], after: dict[str, float], trajectory: list[dict[str, float]],
                   timings: dict[str, float]) -> None:
    """The pass@k table before and after RL, the entropy trajectory and the times."""
    print(f"\n{'':10}{'pass@1':>9}{'pass@4':>9}")
    for name, res in (("before", before), ("after", after)):
        print(f"{name:10}{res['pass@1']:9.3f}{res['pass@4']:9.3f}")
    print("H1 per step: " + " ".join(f"{r['h1']:.3f}" for r in trajectory))
    print(f"wall time {timings['total']:.0f}s (base model {timings['base_model']:.0f}s, RL {timings['rl']:.0f}s); "
          f"process CPU time {timings['process_cpu']:.0f}s")


def _run(args: argparse.Namespace) -> int:
    from ictrl.files import atomic_write_text

    plan = dict(QUICK if args.quick else FULL)
    plan.update({k: v for k, v in (("steps", args.steps), ("lr", args.lr)) if v is not None})
    recipe = TinyRecipe(seed=args.seed, threads=args.threads, **(QUICK_RECIPE if args.quick else {}))
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    t0, cpu0 = time.perf_counter(), time.process_time()

    base = build_tiny_base(recipe, cache_dir=args.cache_dir)
    model, tokenizer = load_tiny_base(base)
    timings["base_model"] = time.perf_counter() - t0
    print(f"base model: {base}")

    # The test set depends only on the task, so every seed and method is scored on the same problems.
    test = tinytask.generate_problems(plan["eval_problems"], "test", recipe.difficulty, seed=0)
    t = time.perf_counter()
    before = _evaluate(model, tokenizer, test, plan["eval_samples"], seed=args.seed)
    timings["eval_before"] = time.perf_counter() - t
    print(f"before RL: pass@1 {before['pass@1']:.3f}  pass@4 {before['pass@4']:.3f}")

    trainer = _make_trainer(args, model, tokenizer, recipe, plan, out)
    t = time.perf_counter()
    trainer.train()
    timings["rl"] = time.perf_counter() - t

    t = time.perf_counter()
    after = _evaluate(trainer.model, tokenizer, test, plan["eval_samples"], seed=args.seed)
    timings["eval_after"] = time.perf_counter() - t
    timings["total"] = time.perf_counter() - t0
    # On a shared machine wall time mostly measures the neighbours; this process's CPU time does not.
    timings["process_cpu"] = time.process_time() - cpu0
    trajectory = _trajectory(trainer.state.log_history)
    trainer.save_model(str(out / "model"))  # for ictrl inspect / ictrl eval
    tokenizer.save_pretrained(out / "model")

    _print_results(before, after, trajectory, timings)

    summary = {
        "method": args.method, "seed": args.seed, "quick": bool(args.quick), "threads": args.threads,
        "base_model": str(base), "model": str(out / "model"),
        "recipe": asdict(recipe), "plan": plan,
        "eval": {"split": "test", "problems": len(test), "samples_per_problem": plan["eval_samples"],
                 "temperature": 1.0},
        "before": before, "after": after,
        "improvement": {k: after[k] - before[k] for k in before},
        "entropy_trajectory": trajectory, "seconds": timings,
    }
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2, default=str) + "\n")
    print(f"summary: {out / 'summary.json'}")
    example = test[0]
    print(f"the trained model is in {out / 'model'}; see which tokens {args.method} trains on:\n  ictrl inspect "
          f"--model {out / 'model'} --prompt '{example.question}' --answer={example.gold} "
          f"--max-new-tokens {task_max_new_tokens(recipe.difficulty)} --selector {args.method}")
    return 0
