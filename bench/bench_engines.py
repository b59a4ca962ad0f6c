"""Every engine at Qwen2.5-0.5B width on 2 CPU processes: peak memory per process against one process, and a run
killed after its first checkpoint that resumes to the uninterrupted result. Plus the 2-node launch, simulated.

Engines part (``--part engines``): the 0.5B width (hidden 896, vocabulary 151,936, tied embedding, the published
heads) with ``--layers`` decoder layers and random weights (``ictrl.models.build_real_shape``), fp32, ICT with the
sparse head, SGD with momentum 0.9 (an optimizer state to shard and to restore), the deterministic generation stub
of tests/engine/mp_worker.py (2 prompts x 4 completions per step), 2 optimizer steps with a checkpoint after each.
For each of DDP, FSDP2, ZeRO-2 and ZeRO-3 (the engines as tests/engine/test_engines.py drives them on CPU): one
``accelerate launch`` on 2 processes, both killed with SIGKILL right after checkpoint-1 is complete, then a second
launch resuming from it to step 2. One plain process (no launcher, no process group) runs the same 2 steps
uninterrupted (micro-batch 2, accumulation 4: the micro-batch of each of the 2 processes, so activations match). Per process: peak RSS (``VmHWM``) of the
killed run and of the resumed run, and the RSS after training (``VmRSS``: the high-water mark includes loading the
whole model on every process before it is sharded). The resumed parameters are compared with one process's.

Multi-node part (``--part multinode``): two launchers with ``--num_machines 2 --machine_rank 0/1``, the main
process on 127.0.0.1, one process each, against one launcher with 2 processes: one ICT step (tiny model) under DDP
must be the same step, bitwise (batches, masks, losses, parameters).

    .venv/bin/python bench/bench_engines.py --part engines --layers 2    # about 10 min on 2 loaded cores, ~9 GB
    .venv/bin/python bench/bench_engines.py --part multinode             # about 2 min

Writes bench/results/engines.json / engines_multinode.json atomically and prints a table.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "engine"))

import mp_worker as w  # noqa: E402

ENGINES = ("ddp", "fsdp2", "zero2", "zero3")
SHAPE = "qwen2.5-0.5b"


def _memory() -> dict[str, float]:
    """This process's peak and current resident memory, GB (/proc/self/status)."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return {k: int(fields[f].split()[0]) / 2**20 for k, f in (("peak_gb", "VmHWM"), ("rss_gb", "VmRSS"))}


def _save(obj: Any, path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def worker(out: Path, model_dir: str, engine: str, phase: str) -> None:
    """One process of a run: ``kill`` (SIGKILL right after checkpoint-1), ``resume`` (to step 2) or ``single``."""
    from transformers import TrainerCallback

    run_dir = out / f"run_{engine}"
    if phase == "single":
        trainer = w.build_trainer(out / "single", model_dir, "ict", world=1, per_device=2, grad_accum=4,
                                  **{**w.RESUME_ARGS, "save_strategy": "no"})
        trainer.train()
    elif phase == "kill":
        class Kill(TrainerCallback):
            def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                if state.global_step == 1:  # checkpoint-1 is complete (renamed once every rank wrote)
                    _save(_memory(), out / f"{engine}_kill_rank{torch.distributed.get_rank()}.pt")
                    torch.distributed.barrier()  # both have written before the launcher tears the other down
                    os.kill(os.getpid(), signal.SIGKILL)

        trainer = w.build_trainer(run_dir, model_dir, "ict", engine, world=2, **w.RESUME_ARGS)
        trainer.add_callback(Kill())
        trainer.train()
        raise AssertionError("the run should have been killed after checkpoint-1")
    else:
        trainer = w.build_trainer(run_dir, model_dir, "ict", engine, world=2, **w.RESUME_ARGS)
        trainer.train(resume_from_checkpoint=str(run_dir / "checkpoint-1"))
    memory = _memory()  # before the parameters are gathered whole for the comparison
    params = w.full_params(trainer)
    rank = trainer.accelerator.process_index
    result = {**memory, "step": trainer.state.global_step, "engine": w.engine_name(trainer),
              "world": trainer.accelerator.num_processes}
    if rank == 0:
        result["params"] = params
    _save(result, out / f"{engine if phase == 'resume' else 'single'}_{phase}_rank{rank}.pt")


def _launch(args: list[str], processes: int, timeout: int = 1800) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
           str(ROOT / "configs" / "accelerate" / "ddp.yaml"), "--num_processes", str(processes),
           "--mixed_precision", "no", "--main_process_port", str(w.free_port()), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def engines_part(root: Path, layers: int) -> dict[str, Any]:
    from ictrl.models import build_real_shape

    model, tokenizer = build_real_shape(SHAPE, num_layers=layers, seed=0)
    model_dir = root / "model"
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    n_params = sum(p.numel() for p in model.parameters())
    del model
    me = [str(Path(__file__).resolve()), "--worker"]
    proc = subprocess.run([sys.executable, *me, str(root), str(model_dir), "ddp", "single"], capture_output=True,
                          text=True, timeout=1800, env={**os.environ, "OMP_NUM_THREADS": "1"})  # no process group
    if proc.returncode != 0:
        raise SystemExit(f"single run failed:\n{proc.stderr[-3000:]}")
    single = torch.load(root / "single_single_rank0.pt", weights_only=False)
    rows = [{"engine": "1 process", "kill_peak_gb": None, "resume_peak_gb": single["peak_gb"],
             "rss_after_gb": single["rss_gb"], "resume_max_abs_param_diff": 0.0}]
    print(f"1 process: peak {single['peak_gb']:.2f} GB, after training {single['rss_gb']:.2f} GB", flush=True)
    for engine in ENGINES:
        killed = _launch([*me, str(root), str(model_dir), engine, "kill"], processes=2)
        assert killed.returncode != 0, "the killed launch should fail"
        ckpt = sorted(p.name for p in (root / f"run_{engine}").iterdir())
        resumed = _launch([*me, str(root), str(model_dir), engine, "resume"], processes=2)
        if resumed.returncode != 0:
            raise SystemExit(f"{engine} resume failed:\n{resumed.stderr[-3000:]}")
        kill = [torch.load(root / f"{engine}_kill_rank{r}.pt", weights_only=False) for r in (0, 1)]
        res = [torch.load(root / f"{engine}_resume_rank{r}.pt", weights_only=False) for r in (0, 1)]
        assert [r["step"] for r in res] == [2, 2] and res[0]["world"] == 2, res
        diff = w.max_param_diff(res[0]["params"], single["params"])
        row = {"engine": res[0]["engine"], "kill_peak_gb": max(k["peak_gb"] for k in kill),
               "resume_peak_gb": max(r["peak_gb"] for r in res), "rss_after_gb": max(r["rss_gb"] for r in res),
               "resume_max_abs_param_diff": diff, "run_dir": ckpt}
        rows.append(row)
        print(f"{row['engine']}: peak/process killed run {row['kill_peak_gb']:.2f} GB, resumed run "
              f"{row['resume_peak_gb']:.2f} GB, after training {row['rss_after_gb']:.2f} GB; resumed vs 1 process "
              f"max abs param diff {diff:.2e}", flush=True)
        for p in root.glob(f"{engine}_*_rank*.pt"):
            p.unlink()
    return {"shape": SHAPE, "layers": layers, "parameters": n_params, "rows": rows,
            "setup": "2 CPU processes (gloo), fp32, ict + sparse head, SGD momentum 0.9, 2x4 completions/step, "
                     "micro-batch 2 per process, checkpoint every step"}


def multinode_part(root: Path) -> dict[str, Any]:
    from ictrl.models import save_tiny_model

    model = str(save_tiny_model(root / "model", seed=0))
    selectors = ("ict", "entropy")
    worker_args = [str(Path(w.__file__)), model, "ddp", "step", ",".join(selectors)]
    one = root / "one_node"
    one.mkdir()
    proc = _launch([worker_args[0], str(one), *worker_args[1:]], processes=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    two = root / "two_nodes"
    two.mkdir()
    port = str(w.free_port())
    base = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
            str(ROOT / "configs" / "accelerate" / "ddp.yaml"), "--num_machines", "2", "--num_processes", "2",
            "--main_process_ip", "127.0.0.1", "--main_process_port", port, "--mixed_precision", "no"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    nodes = [subprocess.Popen([*base, "--machine_rank", str(r), worker_args[0], str(two), *worker_args[1:]],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in (0, 1)]
    outputs = [n.communicate(timeout=900)[0] for n in nodes]
    assert all(n.returncode == 0 for n in nodes), "\n".join(o[-2000:] for o in outputs)
    rows = []
    for sel in selectors:
        for r in (0, 1):
            a = torch.load(one / f"ddp_{sel}_rank{r}.pt", weights_only=False)
            b = torch.load(two / f"ddp_{sel}_rank{r}.pt", weights_only=False)
            same = all(torch.equal(a["batches"][0][k], b["batches"][0][k])
                       for k in ("completion_ids", "advantages", "ictrl_selected"))
            rows.append({"selector": sel, "rank": r, "world": b["world"], "batches_equal": same,
                         "losses_equal": a["losses"] == b["losses"],
                         "max_abs_param_diff": w.max_param_diff(a["params"], b["params"])})
            print(rows[-1], flush=True)
    return {"rows": rows, "setup": "2 launchers x 1 process (--num_machines 2, 127.0.0.1) vs 1 launcher x 2 "
                                   "processes, DDP, tiny Qwen2, one step"}


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        from ictrl.train_cli.process_group import process_group_left

        with process_group_left():
            worker(Path(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("engines", "multinode"), required=True)
    parser.add_argument("--layers", type=int, default=2, help="decoder layers at 0.5B width (24 in the real model)")
    args = parser.parse_args()
    from ictrl.files import atomic_write_json

    with tempfile.TemporaryDirectory(prefix="bench-engines-") as tmp:
        if args.part == "engines":
            result = engines_part(Path(tmp), args.layers)
            name = "engines.json"
        else:
            result = multinode_part(Path(tmp))
            name = "engines_multinode.json"
    atomic_write_json(ROOT / "bench" / "results" / name, result)


if __name__ == "__main__":
    main()
