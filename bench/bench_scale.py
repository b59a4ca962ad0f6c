"""CPU cost of a 2-process FSDP2 optimizer step against a 2-process DDP step, side by side in one run.

Both engines run the same job through ``accelerate launch`` (2 CPU processes, gloo), alternating DDP and FSDP2
for --rounds rounds: the tiny Qwen2 of ``ictrl.models`` (hidden 64, 2 layers, vocabulary 259), the deterministic
generation stub of tests/engine/mp_worker.py, ICT selection with the sparse LM head, plain SGD; 2 prompts x 4
completions per step, per-device micro-batch 2, gradient accumulation 2. FSDP2 is accelerate's own
``fsdp2_prepare_model`` driven on CPU (mp_worker.cpu_fsdp2). Per round and engine: the median wall time of the
optimizer steps after the first (callback from step begin to step end, on rank 0); the reported ratio is the
median over rounds of FSDP2 / DDP within a round.

On CPU the ratio measures FSDP2's bookkeeping and gloo collectives (all-gather per unit in forward and backward,
reduce-scatter of gradients) on a model too small to gain anything from sharding: an upper bound on overhead, not a
GPU prediction.

    .venv/bin/python bench/bench_scale.py                 # 3 rounds x 6 steps
    .venv/bin/python bench/bench_scale.py --quick         # 1 round x 4 steps

Writes bench/results/scale.json atomically and prints a table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "engine"))

import mp_worker as w  # noqa: E402

from ictrl.files import atomic_write_json  # noqa: E402
from ictrl.models import save_tiny_model  # noqa: E402

ENGINES = ("ddp", "fsdp2")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6, help="optimizer steps per run (the first is dropped)")
    parser.add_argument("--quick", action="store_true", help="1 round x 4 steps")
    args = parser.parse_args()
    rounds, steps = (1, 4) if args.quick else (args.rounds, args.steps)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        root = Path(tmp)
        model = str(save_tiny_model(root / "model", seed=0))
        for r in range(rounds):
            medians = {}
            for engine in ENGINES if r % 2 == 0 else ENGINES[::-1]:
                out = root / f"round{r}"
                out.mkdir(exist_ok=True)
                proc = w.launch([str(Path(w.__file__)), str(out), model, engine, "bench", str(steps)], timeout=600)
                if proc.returncode != 0:
                    raise SystemExit(f"{engine} run failed:\n{proc.stderr[-3000:]}")
                times = torch.load(out / f"bench_{engine}.pt", weights_only=False)["step_times"][1:]
                medians[engine] = statistics.median(times)
            rows.append({"round": r, **{f"{e}_step_s": medians[e] for e in ENGINES},
                         "fsdp2_over_ddp": medians["fsdp2"] / medians["ddp"]})
            print(f"round {r}: ddp {medians['ddp']:.3f} s/step, fsdp2 {medians['fsdp2']:.3f} s/step, "
                  f"ratio {rows[-1]['fsdp2_over_ddp']:.2f}", flush=True)
    ratio = statistics.median(row["fsdp2_over_ddp"] for row in rows)
    result = {"rounds": rows, "steps_per_run": steps, "median_fsdp2_over_ddp": ratio,
              "setup": "2 CPU processes (gloo), tiny Qwen2 h64 L2 V259, ict + sparse head, 2x4 completions/step"}
    atomic_write_json(ROOT / "bench" / "results" / "scale.json", result)
    print(f"FSDP2 / DDP step time on 2 CPU processes: {ratio:.2f}x (median over {len(rows)} rounds)")


if __name__ == "__main__":
    main()
