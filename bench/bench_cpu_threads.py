"""CPU threads for ``ictrl train`` on CPU: the step time of the same run with torch on 1 thread and on all cores.

``trl grpo`` starts its script through ``accelerate launch``, which sets ``OMP_NUM_THREADS`` to 1 unless it is set
(its ``--num_cpu_threads_per_process`` default), so TRL's CPU runs use one thread; ``ictrl train`` sets torch's
threads from ``cpu_threads``. This bench runs ``ictrl train`` in a fresh subprocess per run, alternating the thread
counts round by round, on two shapes:

    tiny   the tests' tiny Qwen2 (hidden 64, 2 layers, byte vocabulary), 4 completions of 8 tokens
    real   Qwen2.5-0.5B's width and vocabulary (hidden 896, vocabulary 151,936; random weights) with --layers
           blocks, 4 completions of 16 tokens

Per run: the median ``step_time`` TRL logs over the steps after the first, and the subprocess's CPU time (user +
system, model loading included). The machine's load average is recorded before and after: on a shared machine
the ratios within a round are what to read.

    PYTHONPATH=src .venv/bin/python bench/bench_cpu_threads.py --rounds 2

Writes bench/results/cpu_threads.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

RESULTS = Path(__file__).resolve().parent / "results" / "cpu_threads.json"
REWARD = "def length_reward(completions, **kwargs):\n    return [float(len(str(c))) for c in completions]\n"


def build(root: Path, shape: str, layers: int) -> Path:
    """The model folder and the TRL file of ``shape``; returns the file."""
    from ictrl.models import build_real_shape, save_tiny_model

    model = root / f"model-{shape}"
    if shape == "tiny":
        save_tiny_model(model, seed=0)
        generations, length = 4, 8
    else:
        net, tokenizer = build_real_shape("qwen2.5-0.5b", num_layers=layers, seed=0)
        net.save_pretrained(model)
        tokenizer.save_pretrained(model)
        generations, length = 4, 16
    data = root / "digits"
    data.mkdir(exist_ok=True)
    rows = [{"prompt": f"{a}+{b}=", "solution": str(a + b)} for a in range(4) for b in range(4)]
    (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "bench_rewards.py").write_text(REWARD)
    config = root / f"{shape}.yaml"
    config.write_text(yaml.safe_dump({
        "model_name_or_path": str(model), "dtype": "float32", "dataset_name": str(data),
        "dataset_train_split": "train", "reward_funcs": ["bench_rewards.length_reward"],
        "per_device_train_batch_size": generations, "num_generations": 4, "max_completion_length": length,
        "learning_rate": 1e-5, "seed": 7, "logging_steps": 1, "use_cpu": True, "bf16": False, "report_to": "none",
        "save_strategy": "no", "disable_tqdm": True}))
    return config


def run(config: Path, threads: int, steps: int, out: Path) -> dict[str, Any]:
    """``ictrl train config`` with ``--cpu_threads=threads`` in a fresh subprocess: its median step time after the
    first step and its CPU time."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(config.parent), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "ictrl", "train", str(config), f"--cpu_threads={threads}",
                           f"--max_steps={steps}", f"--output_dir={out}"], capture_output=True, text=True,
                          cwd=config.parent, env=env, timeout=300)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        raise RuntimeError(proc.stderr[-2000:])
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    times = [r["step_time"] for r in rows if "step_time" in r][1:]
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"threads": threads, "step_s": statistics.median(times), "cpu_s": cpu}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4, help="optimizer steps per run (the first is not counted)")
    ap.add_argument("--layers", type=int, default=1, help="blocks of the real-width model")
    ap.add_argument("--shapes", default="tiny,real")
    a = ap.parse_args()
    cores = os.cpu_count() or 1
    result: dict[str, Any] = {"cores": cores, "load_before": os.getloadavg(), "shapes": {}}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for shape in a.shapes.split(","):
            config = build(root, shape, a.layers)
            rounds = []
            for i in range(a.rounds):  # rotated order: a load change hits both counts alike
                order = [1, cores] if i % 2 == 0 else [cores, 1]
                runs = {n: run(config, n, a.steps, root / f"out-{shape}-{i}-{n}") for n in order}
                rounds.append({"one": runs[1], "all": runs[cores],
                               "step_ratio_all_over_one": runs[cores]["step_s"] / runs[1]["step_s"],
                               "cpu_ratio_all_over_one": runs[cores]["cpu_s"] / runs[1]["cpu_s"]})
            result["shapes"][shape] = rounds
    result["load_after"] = os.getloadavg()
    RESULTS.parent.mkdir(exist_ok=True)
    saved = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
    runs = {**saved.get("runs", {}), **{shape: {**result, "shapes": None, "rounds": rounds}
                                        for shape, rounds in result["shapes"].items()}}
    tmp_path = RESULTS.with_suffix(".tmp")  # each shape's latest run kept: a shape at a time stays under minutes
    tmp_path.write_text(json.dumps({"runs": runs}, indent=1) + "\n")
    tmp_path.replace(RESULTS)
    print(f"{cores} cores; load average before {result['load_before'][0]:.1f}, after {result['load_after'][0]:.1f}")
    print("| shape | round | step s, 1 thread | step s, all | all / 1 | CPU s, 1 | CPU s, all | all / 1 |")
    print("|---|---|---|---|---|---|---|---|")
    for shape, rounds in result["shapes"].items():
        for i, r in enumerate(rounds):
            print(f"| {shape} | {i + 1} | {r['one']['step_s']:.3f} | {r['all']['step_s']:.3f} | "
                  f"{r['step_ratio_all_over_one']:.2f} | {r['one']['cpu_s']:.1f} | {r['all']['cpu_s']:.1f} | "
                  f"{r['cpu_ratio_all_over_one']:.2f} |")


if __name__ == "__main__":
    main()
