"""One optimizer step at Qwen2.5-0.5B width on CPU: ICT vs `all` vs TRL's stock GRPOTrainer, time and peak RSS.

The model is ``ictrl.models.build_real_shape`` (random weights: hidden 896, 14 heads / 2 KV heads, MLP 4,864,
vocabulary 151,936, tied head) with --layers blocks (24 = the real depth). Every variant trains on the same fixed
completions (bench_train_step.py's ``--generation fixed``: deterministic ids, no EOS; 8 completions in groups of
4, --completion-len tokens, prompts of ~30 tokens) with a fixed reward, AdamW, fp32, 2 optimizer steps; the second
is measured (the first allocates AdamW's states and, for ict, loads the compiled group-JS kernel). Every run is a
fresh subprocess, so peaks do not mix: peak RSS is the process's ``VmHWM`` (bench_memory.py: reset at the end of
step 1, read at the end of step 2; "step peak" = that peak minus the RSS before step 2; "process peak" = the
largest over the whole process, model build included).

Parts (``--part``; each merges its key into bench/results/real_shape.json, written atomically):

    ratios   ict, ict+sparse, all, all:quiet (logging_steps 10: the measured step not logged), trl_q1.0
             (--variants) at --layers, --repeats rounds in rotated order: step time and its parts (statistics, loss
             forward+backward, optimizer), ratios within a round, peaks
    passes   the no-grad passes alone on one fixed batch: ictrl's statistics pass (``_selection_stats``: backbone
             + head sweep + token statistics + group JS) vs TRL's old-log-prob pass
             (``_get_per_token_logps_and_entropies``, what TRL runs when num_iterations > 1): time and peak extra
             memory (one warm-up call, high-water mark reset, measured call)
    full     ict and all at the published depth (24 layers for 0.5B): step time and peak RSS
    lengths  ict and all at --layers for completion lengths --lengths: step time and peak RSS
    plot     bench/results/real_shape_lengths.png from the JSON
    table    markdown tables of the JSON, with bench/memory_model.py's predicted peaks beside the measured ones

    OMP_NUM_THREADS=2 PYTHONPATH=src .venv/bin/python bench/bench_real_shape.py --part ratios --layers 4
    OMP_NUM_THREADS=2 PYTHONPATH=src .venv/bin/python bench/bench_real_shape.py --part passes --layers 4
    OMP_NUM_THREADS=2 PYTHONPATH=src .venv/bin/python bench/bench_real_shape.py --part full
    OMP_NUM_THREADS=2 PYTHONPATH=src .venv/bin/python bench/bench_real_shape.py --part lengths --layers 4
    PYTHONPATH=src .venv/bin/python bench/bench_real_shape.py --part plot
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_memory import _reset_peak, _status_kb, peak_probe  # noqa: E402
from bench_train_step import build_trainer, run_variant  # noqa: E402

from ictrl.files import atomic_write_json  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "real_shape.json"
# all:quiet: all with logging_steps 10, its measured step not logged (no selection metrics, no log Σp²)
VARIANTS = ["ict", "ict+sparse", "all", "all:quiet", "trl_q1.0"]
PAIRS = [("ict", "all"), ("ict+sparse", "all"), ("all", "trl_q1.0"), ("all:quiet", "trl_q1.0"), ("ict", "trl_q1.0"),
         ("ict+sparse", "trl_q1.0")]
PART_KEYS = ("step_s", "stats_s", "loss_s", "optimizer_s", "generate_s")


def warm_group_js(trainer: Any) -> None:
    """Run the statistics sweep once on 8 x 32 random hidden states (above
    ``ictrl.core.kernels.group_js.AUTO_MIN_LOGITS`` at this vocabulary), so the compiled group-JS kernel
    (``dynamic=True``) is loaded before the measured step, as it is in a run's second step."""
    import torch

    from ictrl.engine.heads import output_head
    from ictrl.engine.stats_source import Request, Sweep, hidden_stats

    args, B, T = trainer.args, trainer.args.per_device_train_batch_size, 32
    hidden = torch.randn(B, T, trainer.model.config.hidden_size)
    with torch.no_grad():
        hidden_stats(output_head(trainer.accelerator, trainer.model), hidden,
                     Request(torch.ones(B, T, dtype=torch.bool), torch.randint(3, 259, (B, T)),
                             torch.arange(B) // trainer.num_generations),
                     trainer.stats_source.sweep(trainer.model))


def step_case(variant: str, a: argparse.Namespace) -> dict[str, Any]:
    """(In a worker process.) ``a.steps`` optimizer steps of ``variant``; times of the last, and the peaks in MB.
    ict variants load the compiled group-JS kernel before training (:func:`warm_group_js`)."""
    marks: dict[str, int] = {}
    run = run_variant(variant, a, callbacks=(peak_probe(marks, measured_step=a.steps),),
                      setup=warm_group_js if variant.startswith("ict") else None)
    return run | {"step_peak_mb": (marks["peak_kb"] - marks["before_kb"]) / 1024,
                  "rss_before_step_mb": marks["before_kb"] / 1024,
                  "process_peak_mb": max(marks["peak_kb"], marks["first_step_peak_kb"]) / 1024}


def pass_case(case: str, a: argparse.Namespace) -> dict[str, Any]:
    """(In a worker process.) One no-grad pass over a fixed batch: ``stats`` (ictrl's statistics pass, ict with its
    group JS) or ``trl_old_logps`` (TRL's old-log-prob pass); seconds and peak extra MB of the measured call."""
    import gc
    import tempfile

    import torch

    B, G, P, T = a.batch, a.generations, 32, a.completion_len
    a.steps = 1
    with tempfile.TemporaryDirectory() as out_dir:
        trainer = build_trainer("ict" if case == "stats" else "trl_q1.0", a, out_dir)
    if a.stats_chunk_size:
        trainer.args.stats_chunk_size = a.stats_chunk_size
    trainer.model.train()
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, 259, (B // G, 1, P), generator=gen).expand(-1, G, -1).reshape(B, P)
    completion = torch.randint(3, 259, (B, T), generator=gen)
    batch = {"prompt_ids": prompt, "prompt_mask": torch.ones_like(prompt), "completion_ids": completion,
             "completion_mask": torch.ones_like(completion)}
    mask = torch.ones(B, T, dtype=torch.bool)

    def call() -> None:
        with torch.no_grad():
            if case == "stats":
                trainer._selection_stats(batch, mask, torch.arange(B) // G)
            else:
                trainer._get_per_token_logps_and_entropies(
                    trainer.model, torch.cat([prompt, completion], 1), torch.ones(B, P + T, dtype=torch.long), T,
                    batch_size=a.batch)

    call()  # warm-up: kernels paged in, the compiled group-JS kernel loaded
    gc.collect()
    before = _reset_peak()
    start = time.perf_counter()
    call()
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "peak_extra_mb": (_status_kb("VmHWM:") - before) / 1024,
            "rss_before_mb": before / 1024}


def run_worker(case: str, a: argparse.Namespace, **overrides: Any) -> dict[str, Any]:
    """``case`` in a fresh subprocess (``--worker``) with this run's settings, ``overrides`` applied."""
    settings = {k: getattr(a, k) for k in ("shape", "layers", "batch", "generations", "completion_len", "steps",
                                           "stats_chunk_size") if getattr(a, k) is not None}
    settings |= overrides
    argv = [f"--{k.replace('_', '-')}={v}" for k, v in settings.items()]
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, f"--worker={case}", *argv], capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"case {case} {settings} failed:\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["wall_s"] = time.perf_counter() - t0
    print(f"{case:12s} {settings}: " + ", ".join(f"{k} {v:.2f}" for k, v in out.items() if isinstance(v, float)),
          file=sys.stderr, flush=True)
    return out


def part_ratios(a: argparse.Namespace) -> dict[str, Any]:
    variants = a.variants.split(",")
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    for r in range(a.repeats):
        for v in variants[r % len(variants):] + variants[:r % len(variants)]:
            runs[v].append(run_worker(v, a))
    summary = {v: {k: statistics.median(run[k] for run in rs) for k in rs[0] if isinstance(rs[0][k], float)}
               for v, rs in runs.items()}
    ratios = {f"{x}/{y} {k[:-2]}": statistics.median(runs[x][i][k] / runs[y][i][k] for i in range(a.repeats))
              for x, y in PAIRS if x in runs and y in runs for k in ("step_s", "loss_s")}
    return {"layers": a.layers, "completion_len": a.completion_len, "repeats": a.repeats, "summary": summary,
            "ratios": ratios, "runs": runs}


def part_passes(a: argparse.Namespace) -> dict[str, Any]:
    out = {case: run_worker(f"pass:{case}", a) for case in ("trl_old_logps", "stats")}
    out["stats/trl_old_logps peak"] = out["stats"]["peak_extra_mb"] / out["trl_old_logps"]["peak_extra_mb"]
    out["stats/trl_old_logps time"] = out["stats"]["seconds"] / out["trl_old_logps"]["seconds"]
    return {"layers": a.layers, "completion_len": a.completion_len, **out}


def part_full(a: argparse.Namespace) -> dict[str, Any]:
    from ictrl.models import real_shape_config

    depth = real_shape_config(a.shape).num_hidden_layers
    return {"layers": depth, "completion_len": a.completion_len,
            "runs": {v: run_worker(v, a, layers=depth) for v in ("all", "ict")}}


def part_lengths(a: argparse.Namespace) -> dict[str, Any]:
    lengths = [int(x) for x in a.lengths.split(",")]
    return {"layers": a.layers, "runs": {f"{v}@{n}": run_worker(v, a, completion_len=n)
                                         for n in lengths for v in ("all", "ict")}}


def plot(result: dict[str, Any], path: Path) -> None:
    from matplotlib.figure import Figure

    runs = dict(result["lengths"]["runs"])
    ratios = result.get("ratios", {})
    if ratios.get("layers") == result["lengths"]["layers"] and ratios.get("steps", 2) == result["lengths"]["steps"]:
        for v in ("all", "ict"):  # the ratios part's runs are points of the same curve
            runs.setdefault(f"{v}@{ratios['completion_len']}", ratios["runs"][v][0])
    fig = Figure(figsize=(9, 3.6))
    axes = fig.subplots(1, 2)
    for v, marker, color in (("all", "o", "C0"), ("ict", "s", "C1")):
        pts = sorted((int(k.split("@")[1]), r) for k, r in runs.items() if k.split("@")[0] == v)
        xs = [n for n, _ in pts]
        axes[0].plot(xs, [r["step_s"] for _, r in pts], marker=marker, color=color, label=v)
        axes[1].plot(xs, [r["process_peak_mb"] / 1024 for _, r in pts], marker=marker, color=color,
                     label=f"{v}: process peak")
        axes[1].plot(xs, [r["step_peak_mb"] / 1024 for _, r in pts], marker=marker, color=color, linestyle="--",
                     label=f"{v}: measured step's growth")
    for ax, ylabel in zip(axes, ("step time, s", "peak RSS, GiB")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({int(k.split("@")[1]) for k in runs}), labels=None)
        ax.get_xaxis().set_major_formatter("{x:.0f}")
        ax.set_xlabel("completion length (8 completions)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"Qwen2.5-0.5B width, {result['lengths']['layers']} layers, V 151,936, CPU fp32 (2 threads)")
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    os.replace(tmp, path)
    print(f"wrote {path}")


def tables(result: dict[str, Any]) -> str:
    """Markdown tables of the parts in ``result``, with bench/memory_model.py's predicted peaks beside the
    measured ones."""
    import memory_model as mm

    lines = ["| part | run | layers | tokens | step s | statistics s | loss s | optimizer s | process peak GiB "
             "| predicted GiB | step peak extra GiB |", "|" + "---|" * 11]
    for part in ("ratios", "full", "lengths"):
        if part not in result:
            continue
        p = result[part]
        first = p.get("steps", 2) == 1  # a one-step run: AdamW's states are allocated inside the measured step
        for key, runs in p["runs"].items():
            variant, _, n = key.partition("@")
            length = int(n or p["completion_len"])
            for r in runs if isinstance(runs, list) else [runs]:
                lines.append(f"| {part} | {key} | {p['layers']} | {length} | {r['step_s']:.1f} | {r['stats_s']:.1f} | "
                             f"{r['loss_s']:.1f} | {r['optimizer_s']:.1f} | {r['process_peak_mb'] / 1024:.2f} | "
                             f"{mm.predicted_peak(variant, p['layers'], length, first, stats_chunk_size=mm.part_stats_chunk_size(p)):.2f} | {r['step_peak_mb'] / 1024:.2f} |")
    if "ratios" in result:
        lines += ["", "| ratio | value |", "|---|---|"]
        lines += [f"| {k} | {v:.3f} |" for k, v in result["ratios"]["ratios"].items()]
    for key in sorted(k for k in result if k.startswith("passes")):
        q = result[key]
        lines += ["", f"| no-grad pass ({key}) | s | peak extra MB |", "|---|---|---|"]
        lines += [f"| {c} | {q[c]['seconds']:.1f} | {q[c]['peak_extra_mb']:.0f} |" for c in ("trl_old_logps", "stats")]
        lines += [f"| statistics / TRL old log-probs | {q['stats/trl_old_logps time']:.2f} | "
                  f"{q['stats/trl_old_logps peak']:.2f} |"]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=("ratios", "passes", "full", "lengths", "plot", "table"), default="ratios")
    ap.add_argument("--shape", default="qwen2.5-0.5b")
    ap.add_argument("--layers", type=int, default=4, help="transformer blocks of the reduced-depth model")
    ap.add_argument("--batch", type=int, default=8, help="completions per optimizer step")
    ap.add_argument("--generations", type=int, default=4, help="num_generations (group size)")
    ap.add_argument("--completion-len", type=int, default=256)
    ap.add_argument("--lengths", default="128,256,512,1024")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--variants", default=",".join(VARIANTS), help="--part ratios: the variants, rotated per round")
    ap.add_argument("--steps", type=int, default=2, help="optimizer steps per run; the last is measured")
    ap.add_argument("--stats-chunk-size", type=int, default=None,
                    help="passes: ICTGRPOConfig.stats_chunk_size of the statistics pass (default: the config's); "
                         "the part is stored as passes_chunkN")
    ap.add_argument("--out", type=Path, default=RESULTS, help="result JSON (parts merged in, written atomically)")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    # bench_train_step's trainer settings that this benchmark does not vary.
    a.generation, a.hidden, a.vocab = "fixed", 0, 151_936
    if a.worker:
        import ictrl.engine.trainer  # noqa: F401  (the libraries, before the model: the process's base RSS)
        from ictrl.models import real_shape_config

        base_mb = _status_kb("VmRSS:") / 1024
        a.vocab = real_shape_config(a.shape).vocab_size
        case = a.worker
        result = pass_case(case[5:], a) if case.startswith("pass:") else step_case(case, a)
        result["base_rss_mb"] = base_mb
        print(json.dumps(result))
        return
    result = json.loads(a.out.read_text()) if a.out.exists() else {}
    if a.part == "plot":
        plot(result, a.out.with_name(a.out.stem + "_lengths.png"))
        return
    if a.part == "table":
        print(tables(result))
        return
    with open("/proc/loadavg") as f:
        load_before = f.read().split()[:3]
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    part = {"ratios": part_ratios, "passes": part_passes, "full": part_full, "lengths": part_lengths}[a.part](a)
    with open("/proc/loadavg") as f:
        load_after = f.read().split()[:3]
    part["steps"] = a.steps
    from ictrl.engine.config import ICTGRPOConfig

    part["stats_chunk_size"] = a.stats_chunk_size or ICTGRPOConfig.stats_chunk_size
    part["run"] = {"started": started, "finished": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                   "loadavg_before": load_before, "loadavg_after": load_after, "argv": sys.argv[1:],
                   "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}
    result = json.loads(a.out.read_text()) if a.out.exists() else {}  # another part may have finished meanwhile
    if a.part == "passes" and a.stats_chunk_size:
        a.part = f"passes_chunk{a.stats_chunk_size}"
    old = result.get(a.part, {})
    if a.part == "lengths" and old.get("layers") == part["layers"]:  # more lengths for the same model: merged
        part["runs"] = old["runs"] | part["runs"]
        part["run"] = {"earlier": old.get("run"), **part["run"]}
    result[a.part] = part
    atomic_write_json(a.out, result)
    print(json.dumps({k: v for k, v in part.items() if k not in ("runs",)}, indent=1, default=str))


if __name__ == "__main__":
    main()
