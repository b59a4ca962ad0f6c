"""Operator CPU time of one training step at Qwen2.5-0.5B width: ictrl's ``all`` against TRL's stock GRPOTrainer.

A step ratio from two runs made one after the other on a shared machine moves with the load; this prints where
the two variants' work differs (torch's profiler: each operator's time in the calling thread). Run the variants
alternately, more than once. Usage (one variant per process):

    OMP_NUM_THREADS=2 PYTHONPATH=src python bench/profile_real_shape.py all --layers 1
    OMP_NUM_THREADS=2 PYTHONPATH=src python bench/profile_real_shape.py trl_q1.0 --layers 1

Prints the measured (second) step's wall time, its operators' summed self time and the top operators.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("variant", help="bench_train_step.build_trainer's variant name (all, ict, trl_q1.0, ...)")
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--completion-len", type=int, default=256)
    ap.add_argument("--rows", type=int, default=18, help="operators to print")
    a = ap.parse_args()

    import torch
    from transformers import TrainerCallback

    import bench_train_step as bts

    spec = argparse.Namespace(shape="qwen2.5-0.5b", layers=a.layers, batch=8, generations=4,
                              completion_len=a.completion_len, steps=2, generation="fixed", hidden=0,
                              vocab=151_936, stats_chunk_size=None)
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    wall: list[float] = []

    class ProfileSecondStep(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step == 1:  # the first step allocates AdamW's states
                prof.__enter__()
                self.t0 = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step == 2:
                prof.__exit__(None, None, None)
                wall.append(time.perf_counter() - self.t0)

    with tempfile.TemporaryDirectory() as out_dir:
        trainer = bts.build_trainer(a.variant, spec, out_dir)
        trainer.add_callback(ProfileSecondStep())
        trainer.train()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events) / 1e6
    print(f"{a.variant}: step {wall[0]:.1f} s wall, operators' summed self time {total:.2f} s")
    print(events.table(sort_by="self_cpu_time_total", row_limit=a.rows))


if __name__ == "__main__":
    main()
