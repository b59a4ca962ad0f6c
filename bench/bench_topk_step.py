"""Does ``selection_topk`` still pay? ICT training steps with the top-K from the LM head and without top-K (the
exact, full-vocabulary ICT score), side by side in one process.

A tiny Qwen2 (``ictrl.models``; hidden --hidden x --layers, vocabulary padded to --vocab, 151,936 as Qwen2.5)
trains --steps optimizer steps per variant on CPU with TRL's own sampling through transformers ``generate`` (same seed, same model, so every
variant samples the same first batch: checked; later batches differ where the variants' selections, and so their
updates, differ) and a fixed reward (``bench_train_step.fixed_reward``). Variants:

    ict                     no top-K: the ICT score from the full distributions (one-pass path when it applies)
    ict+topkK               selection_topk K, its log-probs from the LM-head logits

Each repeat runs every variant once in a rotated order on a freshly built model. Per variant: the median wall time
of an optimizer step after the first (callback from step begin to step end) and of its generation, the backbone
forwards per optimizer step outside generation (a forward pre-hook on the backbone), the statistics path logged
(``ictrl/stats_path``: 0 separate, 2 the training forward) and the peak RSS of
the last step (``VmHWM`` reset through ``/proc/self/clear_refs`` as the step begins, minus the RSS then; as
``bench_memory.py``). Ratios are taken within a repeat, against ``ict``, and their median over repeats reported.

    PYTHONPATH=src .venv/bin/python bench/bench_topk_step.py --threads 1      # V 151936, K 64, 3 repeats

Writes bench/results/topk_step.json atomically and prints a table.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_memory import peak_probe  # noqa: E402
from bench_train_step import build_trainer  # noqa: E402

from ictrl.files import atomic_write_json  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "topk_step.json"


def run(variant: str, a: argparse.Namespace) -> dict[str, Any]:
    """Train a.steps steps of ``variant``; its step times, forwards, statistics paths, last-step peak."""
    from transformers import PrinterCallback, TrainerCallback

    steps: list[float] = []
    marks: dict[str, int] = {}

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.t0 = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            steps.append(time.perf_counter() - self.t0)

    with tempfile.TemporaryDirectory() as out_dir:
        trainer = build_trainer(variant, a, out_dir)
        trainer.remove_callback(PrinterCallback)
        trainer.add_callback(StepTimer())
        trainer.add_callback(peak_probe(marks, measured_step=a.steps))
        forwards, generating, gen_times, completions = [0], [False], [], hashlib.sha256()
        trainer.model.model.register_forward_pre_hook(
            lambda m, args: forwards.__setitem__(0, forwards[0] + (not generating[0])))
        rollout, score = trainer._generate_single_turn, trainer._generate_and_score_completions

        def flagged_rollout(*args: Any, **kwargs: Any) -> Any:
            generating[0] = True
            t0 = time.perf_counter()
            try:
                return rollout(*args, **kwargs)
            finally:
                generating[0] = False
                gen_times.append(time.perf_counter() - t0)

        def hashed_score(inputs: Any) -> Any:
            batch = score(inputs)
            if not trainer.state.global_step:  # the first batch, sampled before any update
                completions.update(batch["completion_ids"].numpy().tobytes())
            return batch

        trainer._generate_single_turn = flagged_rollout
        trainer._generate_and_score_completions = hashed_score
        trainer.train()
        paths = sorted({h["ictrl/stats_path"] for h in trainer.state.log_history if "ictrl/stats_path" in h})
        done = trainer.state.global_step
    keep = slice(1, None) if len(steps) > 1 else slice(None)
    return {"step_s": statistics.median(steps[keep]), "generate_s": statistics.median(gen_times[keep]),
            "forwards_per_step": forwards[0] / done, "stats_paths": paths,
            "step_peak_mb": (marks["peak_kb"] - marks["before_kb"]) / 1024,
            "first_completions": completions.hexdigest(),
            "step_times": steps}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--k", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8, help="completions per optimizer step")
    ap.add_argument("--generations", type=int, default=4, help="num_generations (group size)")
    ap.add_argument("--completion-len", type=int, default=32)
    ap.add_argument("--steps", type=int, default=3, help="optimizer steps per run (the first is not timed)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    a = ap.parse_args()
    a.generation, a.shape = "real", None
    if a.threads:
        torch.set_num_threads(a.threads)
    variants = ["ict", f"ict+topk{a.k}"]
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    for r in range(a.repeats):
        for v in variants[r % len(variants):] + variants[:r % len(variants)]:
            runs[v].append(run(v, a))
            x = runs[v][-1]
            print(f"repeat {r} {v:18s} step {x['step_s']:.3f} s (generate {x['generate_s']:.3f}), "
                  f"{x['forwards_per_step']:.1f} forwards/step, paths {x['stats_paths']}, "
                  f"peak {x['step_peak_mb']:.0f} MB", file=sys.stderr, flush=True)
    same = len({x["first_completions"] for rs in runs.values() for x in rs}) == 1
    summary: dict[str, Any] = {}
    for v, rs in runs.items():
        summary[v] = {k: statistics.median(x[k] for x in rs)
                      for k in ("step_s", "generate_s", "forwards_per_step", "step_peak_mb")}
        summary[v]["stats_paths"] = sorted({p for x in rs for p in x["stats_paths"]})
        if v != "ict":
            for k in ("step_s", "generate_s", "step_peak_mb"):
                summary[v][f"{k[:-2] if k.endswith('_s') else k}_ratio_to_ict"] = statistics.median(
                    x[k] / y[k] for x, y in zip(rs, runs["ict"]))
    print(f"\nV={a.vocab}, K={a.k}, hidden {a.hidden}x{a.layers}, {a.batch} completions x {a.completion_len} tokens, "
          f"median of {a.repeats} repeats; same first batch in every run: {same}")
    print(f"{'variant':20s} {'step s':>8s} {'/ict':>6s} {'gen s':>7s} {'fwd/step':>9s} {'path':>6s} "
          f"{'peak MB':>8s} {'/ict':>6s}")
    for v, s in summary.items():
        print(f"{v:20s} {s['step_s']:8.3f} {s.get('step_ratio_to_ict', 1.0):6.2f} {s['generate_s']:7.3f} "
              f"{s['forwards_per_step']:9.1f} {str(s['stats_paths']):>6s} {s['step_peak_mb']:8.0f} "
              f"{s.get('step_peak_mb_ratio_to_ict', 1.0):6.2f}")
    atomic_write_json(a.out, {"config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(a).items()},
                              "torch_threads": torch.get_num_threads(), "same_first_batch": same,
                              "summary": summary, "runs": runs})
    print(f"\nwrote {a.out}")


if __name__ == "__main__":
    main()
