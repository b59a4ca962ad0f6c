"""Time ``ictrl.rewards.math_reward`` per call on typical and adversarial inputs.

    .venv/bin/python bench/bench_grader.py [--repeats 3] [--timeout 3] [--out results.json]

Sections: (1) typical completions built from MATH-500 golds (right and wrong answer), guarded by the worker
process and inline, to price the guard; (2) adversarial inputs (deep nesting, 100k-character answers,
unbalanced LaTeX, binary junk, power towers), with the result cache off so every repeat is graded afresh.
Prints p50/p99/max milliseconds per call; ``--out`` writes the same numbers as JSON (atomically).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from ictrl import rewards
from ictrl.files import atomic_write_json

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "fixtures"))
from grader_adversarial import adversarial_cases  # noqa: E402  (the corpus the tests use)
from ictrl.data import load_problems


def time_calls(pairs: list[tuple[str, str]], repeats: int) -> dict[str, float]:
    times = []
    for _ in range(repeats):
        for completion, gold in pairs:
            t = time.perf_counter()
            r = rewards.math_reward(completion, gold)
            times.append(time.perf_counter() - t)
            assert r in (0.0, 1.0)
    times.sort()
    return {
        "calls": len(times),
        "p50_ms": 1e3 * statistics.median(times),
        "p99_ms": 1e3 * times[min(len(times) - 1, int(0.99 * len(times)))],
        "max_ms": 1e3 * times[-1],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=3.0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    results: dict[str, object] = {}

    problems = load_problems("math500")
    right = [(f"The answer is \\boxed{{{p.gold}}}.", p.gold) for p in problems]
    nxt = [problems[(i + 1) % len(problems)] for i in range(len(problems))]
    wrong = [(f"The answer is \\boxed{{{q.gold}}}.", p.gold) for p, q in zip(problems, nxt)]
    for guard in ("process", "inline"):
        rewards.configure(guard=guard, timeout=args.timeout, cache_size=0)
        rewards.math_reward("\\boxed{x+1}", "x+2")  # start the worker outside the timing
        rewards.reset_reward_stats()
        results[f"math500_right/{guard}"] = time_calls(right, 1)
        results[f"math500_wrong/{guard}"] = time_calls(wrong, 1)
        results[f"math500/{guard}/stats"] = rewards.reward_stats()

    rewards.configure(guard="process", timeout=args.timeout, cache_size=0)
    rewards.math_reward("\\boxed{x+1}", "x+2")
    time.sleep(3)  # let the spare worker finish its imports
    for name, completion in adversarial_cases().items():
        rewards.reset_reward_stats()
        timing = time_calls([(completion, "\\frac{1}{2}")], args.repeats)
        counts = {k: v for k, v in rewards.reward_stats().items() if k in ("rejected", "timeouts", "verify_calls")}
        results[f"adversarial/{name}"] = {**timing, **counts}
    all_adv = [(c, "\\frac{1}{2}") for c in adversarial_cases().values()]
    results["adversarial/all"] = time_calls(all_adv, args.repeats)

    print(f"{'case':42s} {'calls':>6s} {'p50 ms':>9s} {'p99 ms':>9s} {'max ms':>9s}  notes")
    for name, r in results.items():
        if name.endswith("/stats"):
            print(f"{name:42s} {r}")
            continue
        notes = {k: r[k] for k in ("rejected", "timeouts", "verify_calls") if k in r}
        print(f"{name:42s} {r['calls']:6d} {r['p50_ms']:9.3f} {r['p99_ms']:9.3f} {r['max_ms']:9.1f}  {notes or ''}")
    if args.out:
        atomic_write_json(args.out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
