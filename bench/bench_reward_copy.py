"""The cost of giving each reward call its own copy of the batch, at ``ictrl demo``'s batch, in one run.

    .venv/bin/python bench/bench_reward_copy.py [--repeats 300] [--out bench/results/reward_copy.json]

One generation batch of the demo (32 prompts x 8 completions of up to 44 tokens, its reward ``tinyarith_reward``,
the keywords TRL passes: prompts, completions, completion_ids, the ``gold`` column, trainer_state and the logging
hooks) is scored by the bare reward and by the reward as the trainer calls it (``RewardPolicy.wrap``: the copy,
the result check and the still-running watch), call by call in a shuffled order so both see the same machine
load. It
reports each median, their ratio, the copy alone, and the added time against a demo step (ictrl demo: a generation
batch is two optimizer steps of ~0.8 CPU s each, configs/tiny/ict.yaml). Results go to ``--out`` atomically.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path
from typing import Any

from ictrl.experiments.demo import FULL
from ictrl.experiments.tasks import tinytask
from ictrl.files import atomic_write_json
from ictrl.models import build_byte_tokenizer
from ictrl.engine.reward_policy import RewardPolicy, own_copy

RESULTS = Path(__file__).resolve().parent / "results"
DEMO_STEP_S = 0.8  # CPU seconds per optimizer step of the demo's batch (configs/tiny/ict.yaml's measurement)


def demo_batch(seed: int = 0) -> dict[str, Any]:
    """The keywords TRL's ``_calculate_rewards`` passes for one demo generation batch; completions are worked
    chains ending in a boxed answer, right for half of them."""
    rng = random.Random(seed)
    rows = tinytask.train_dataset(FULL["prompts"], FULL["steps"], (2,), seed=seed)[: FULL["prompts"]]
    prompts = [p for p in rows["prompt"] for _ in range(FULL["generations"])]
    golds = [g for g in rows["gold"] for _ in range(FULL["generations"])]
    completions = [f"{p[2:-3]}={rng.randint(0, 99)}+{rng.randint(0, 9)} \\boxed{{{g if rng.random() < 0.5 else '7'}}}"
                   for p, g in zip(prompts, golds)]
    tokenizer = build_byte_tokenizer()
    ids = [tokenizer(c, add_special_tokens=False)["input_ids"][:44] for c in completions]
    return {"prompts": prompts, "completions": completions, "completion_ids": ids, "gold": golds,
            "trainer_state": object(), "log_extra": lambda *a, **k: None, "log_metric": lambda *a, **k: None}


def measure(repeats: int) -> dict[str, Any]:
    batch = demo_batch()
    bare = tinytask.tinyarith_reward
    wrapped = RewardPolicy().wrap(bare)
    assert wrapped(**batch) == bare(**batch)
    calls = [("bare", lambda: bare(**batch)), ("wrapped", lambda: wrapped(**batch)),
             ("copy", lambda: own_copy((), batch))]
    times: dict[str, list[float]] = {name: [] for name, _ in calls}
    order = random.Random(1)
    for _ in range(repeats):
        order.shuffle(calls)  # no call always first after the others
        for name, call in calls:
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    med = {name: statistics.median(values) for name, values in times.items()}
    added = med["wrapped"] - med["bare"]
    return {"completions": len(batch["completions"]), "repeats": repeats,
            "median_ms": {name: round(value * 1e3, 4) for name, value in med.items()},
            "wrapped_over_bare": round(med["wrapped"] / med["bare"], 4),
            "added_ms_per_generation_batch": round(added * 1e3, 4),
            "added_fraction_of_a_demo_generation_batch": added / (2 * DEMO_STEP_S)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=300)
    parser.add_argument("--out", type=Path, default=RESULTS / "reward_copy.json")
    args = parser.parse_args()
    result = measure(args.repeats)
    atomic_write_json(args.out, result)
    med = result["median_ms"]
    print(f"{result['completions']} completions, {args.repeats} calls each, medians: bare {med['bare']:.3f} ms, "
          f"wrapped {med['wrapped']:.3f} ms (x{result['wrapped_over_bare']:.3f}), copy alone {med['copy']:.3f} ms; "
          f"added {result['added_ms_per_generation_batch']:.3f} ms per generation batch = "
          f"{100 * result['added_fraction_of_a_demo_generation_batch']:.3f}% of its two demo steps")


if __name__ == "__main__":
    main()
