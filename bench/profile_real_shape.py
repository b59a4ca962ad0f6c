"""Where ictrl's ``all`` spends time that TRL's stock GRPOTrainer step does not, at Qwen2.5-0.5B width.

A step ratio from two runs made one after the other on a shared machine moves with the load, so the variants run
side by side in one process: ``--rounds`` rounds, each training every variant for 2 optimizer steps in rotated
order, the second step measured: wall time, the process's CPU time (the work done, which a busy machine
stretches less than the wall time; with one thread it is the step's work) and torch's profiler (each operator's
time in the calling thread).
Variants: ``bench_train_step.build_trainer``'s names (``all``, ``ict``, ``trl_q1.0``, ...), and ``NAME:quiet``
for NAME trained with ``logging_steps`` 10, so its measured step is not logged (ictrl computes its selection
metrics and log Σp² only on logged steps; TRL computes its own metrics every step).

    OMP_NUM_THREADS=1 PYTHONPATH=src python bench/profile_real_shape.py --layers 1 --completion-len 128 \
        --variants all,all:quiet,ict,trl_q1.0

    OMP_NUM_THREADS=1 PYTHONPATH=src python bench/profile_real_shape.py --head --completion-len 128 --rounds 6
    OMP_NUM_THREADS=2 PYTHONPATH=src python bench/profile_real_shape.py --count-ops --completion-len 64 --rounds 1

Prints each run's measured step, the wall and CPU ratios to the last variant within each round, and the
operators whose summed self time differs most between the variants (mean over the rounds); with ``--count-ops``
the operators' calls and output elements instead (the times then include the counter's own overhead).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))


def op_counter() -> Any:
    """A dispatch mode counting each aten operator's calls and output elements: the work, whatever the load."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class OpCounter(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.calls: dict[str, int] = defaultdict(int)
            self.elements: dict[str, int] = defaultdict(int)

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            name = func.overloadpacket.__name__
            self.calls[name] += 1
            outs = out if isinstance(out, (tuple, list)) else (out,)
            self.elements[name] += sum(o.numel() for o in outs if isinstance(o, torch.Tensor))
            return out

    return OpCounter()


def measure(variant: str, spec: argparse.Namespace, count_ops: bool = False
            ) -> tuple[float, float, dict[str, float]]:
    """Wall and process CPU seconds of the second optimizer step of ``variant``, and its operators' self
    seconds."""
    import torch
    from transformers import PrinterCallback, TrainerCallback

    import bench_train_step as bts

    prof = op_counter() if count_ops else torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    wall: list[float] = []
    cpu: list[float] = []

    class ProfileSecondStep(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step == 1:  # the first step allocates AdamW's states
                prof.__enter__()
                self.t0, self.c0 = time.perf_counter(), time.process_time()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step == 2:
                prof.__exit__(None, None, None)
                wall.append(time.perf_counter() - self.t0)
                cpu.append(time.process_time() - self.c0)

    with tempfile.TemporaryDirectory() as out_dir:
        trainer = bts.build_trainer(variant, spec, out_dir)
        trainer.remove_callback(PrinterCallback)
        trainer.add_callback(ProfileSecondStep())
        trainer.train()
    del trainer
    gc.collect()
    if count_ops:  # "name calls" and "name Melem" as the keys
        ops = {**{f"{k} calls": float(v) for k, v in prof.calls.items()},
               **{f"{k} Melem": v / 1e6 for k, v in prof.elements.items()}}
    else:
        ops = {e.key: e.self_cpu_time_total / 1e6 for e in prof.key_averages()}
    return wall[0], cpu[0], ops


def head_cost(a: argparse.Namespace) -> None:
    """TRL's fused head alone (forward and backward over 8 x (35 + completion) rows at 0.5B width), with and
    without log Σp², alternating ``--rounds`` times on one fixed batch: the cost ``all`` saves off logged steps."""
    import torch
    from trl.kernels import ChunkedLogProbFunction
    from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE as vocab_chunk

    gen = torch.Generator().manual_seed(0)
    rows, hidden_size, vocab = 8 * (35 + a.completion_len), 896, 151_936
    hidden = (torch.randn(rows, hidden_size, generator=gen) * 0.5).requires_grad_()
    weight = (torch.randn(vocab, hidden_size, generator=gen) * 0.02).requires_grad_()
    targets = torch.randint(0, vocab, (rows,), generator=gen)
    plain, with_sq = "log-probs + entropy (TRL)", "+ log Σp² (ictrl's metrics)"
    cases = {plain: ("log_probs", "entropy"), with_sq: ("log_probs", "entropy", "log_sum_sq_probs")}
    seconds: dict[str, list[float]] = defaultdict(list)
    for r in range(a.rounds + 1):  # round 0 warms up
        for name, outputs in (cases.items() if r % 2 else reversed(cases.items())):
            hidden.grad = weight.grad = None  # as the optimizer's zero_grad leaves them
            start = time.process_time()
            logps = ChunkedLogProbFunction.apply(hidden, weight, None, targets, 1.0, vocab_chunk, None, 1.0,
                                                 outputs)[0]
            logps.sum().backward()
            if r:
                seconds[name].append(time.process_time() - start)
    for name, s in seconds.items():
        print(f"{name}: median {statistics.median(s):.2f} s process CPU over {len(s)} rounds")
    extra = statistics.median(seconds[with_sq]) / statistics.median(seconds[plain]) - 1
    print(f"log Σp² adds {extra:.1%} to the head's forward and backward")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", default="all,all:quiet,trl_q1.0",
                    help="comma-separated; ratios are to the last one")
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--completion-len", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--rows", type=int, default=12, help="operators to print")
    ap.add_argument("--head", action="store_true", help="only TRL's fused head with and without log Σp²")
    ap.add_argument("--count-ops", action="store_true",
                    help="count each operator's calls and output elements (Melem) instead of profiling times")
    a = ap.parse_args()
    if a.head:
        head_cost(a)
        return

    spec = argparse.Namespace(shape="qwen2.5-0.5b", layers=a.layers, batch=8, generations=4,
                              completion_len=a.completion_len, steps=2, generation="fixed", hidden=0,
                              vocab=151_936, stats_chunk_size=None)
    variants = a.variants.split(",")
    base = variants[-1]
    times: dict[str, dict[str, list[float]]] = {"wall": defaultdict(list), "cpu": defaultdict(list)}
    ops: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in range(a.rounds):
        for v in variants[r % len(variants):] + variants[:r % len(variants)]:
            wall, cpu, op_times = measure(v, spec, a.count_ops)
            times["wall"][v].append(wall)
            times["cpu"][v].append(cpu)
            for key, seconds in op_times.items():
                ops[v][key].append(seconds)
            print(f"round {r} {v}: step {wall:.2f} s wall, {cpu:.2f} s process CPU", file=sys.stderr, flush=True)
    for kind, per in times.items():
        for r in range(a.rounds):
            print(f"round {r} {kind} ratios to {base}: " + ", ".join(
                f"{v} {per[v][r] / per[base][r]:.3f}" for v in variants[:-1]))
        print(f"median {kind} s: " + ", ".join(f"{v} {statistics.median(per[v]):.2f}" for v in variants))
        print(f"median of the rounds' {kind} ratios to {base}: " + ", ".join(
            f"{v} {statistics.median(w / b for w, b in zip(per[v], per[base])):.3f}" for v in variants[:-1]))
    mean = {v: {k: statistics.fmean(s) for k, s in per.items()} for v, per in ops.items()}
    keys = set().union(*mean.values())
    spread = {k: max(m.get(k, 0.0) for m in mean.values()) - min(m.get(k, 0.0) for m in mean.values())
              for k in keys}
    unit = "calls / million output elements" if a.count_ops else "self s"
    print(f"\n{f'operator ({unit}, mean over rounds)':48s}" + "".join(f"{v:>14s}" for v in variants))
    for k in sorted(keys, key=lambda k: -spread[k])[:a.rows]:
        print(f"{k[:48]:48s}" + "".join(f"{mean[v].get(k, 0.0):14.2f}" for v in variants))


if __name__ == "__main__":
    main()
