"""One optimizer step on a GPU: TRL's stock GRPO vs ictrl's all / ict / ict+sparse, the group-JS sweep's bandwidth,
and the top kernels of one ict step. One command, a few minutes on one H100/H200:

    PYTHONPATH=src python bench/bench_gpu.py                      # 0.5B and 1.5B, bf16, 16 x 1024, groups of 8
    PYTHONPATH=src python bench/bench_gpu.py --tiny --device cpu  # the smoke run the test suite makes

Every variant trains on the same fixed completions (bench_train_step.py's deterministic ids, no EOS, fixed reward):
a random Qwen2.5-shaped model at full depth (``ictrl.models.build_real_shape``), cast to bf16 (the weights, as
``dtype: auto`` loads a bf16 checkpoint) with ``bf16=True``, --batch completions in groups of --generations,
--completion-len tokens, AdamW, --steps optimizer steps; selection warm-up 0 so ict selects from its first step.
Per run: every step's time (``torch.cuda.synchronize`` at step begin and end); the first --warmup steps are
measured and dropped (a first step compiles and autotunes, and a second can still be several times slower), the
rest kept; the peak allocated GPU memory is reset at the start of the first kept step, the same point for every
variant. Variants run in one process one after another, each on a freshly built model, in --rounds rounds of
rotated order. Per variant: the median of its kept steps over all rounds and their spread; per ratio (ict / all,
...): the median over rounds of each round's ratio of medians, with the smallest and largest round beside it.

Also: the group-JS sweep alone (``ictrl.core.stats.token_stats`` with group ids, as the statistics pass calls it)
on random bf16 logits at the trainer's call size (rows from ``sweep_rows``, i.e. the block the statistics pass
takes), its time (median of 5, synchronised) and achieved bandwidth (two reads of the logits), beside
``torch.log_softmax`` on the same logits (a read and a write: the same bytes); and ``torch.profiler``'s top kernels
by device time over one ict step.

Writes --out (JSON) and the same path with .md (tables), each atomically (tmp + os.replace). A variant that runs
out of memory is recorded as such and the run goes on.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_train_step import PROMPTS, fixed_reward, with_fixed_generation  # noqa: E402

from ictrl.files import atomic_write_json, atomic_write_text  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "gpu.json"
VARIANTS = ("trl", "all", "ict", "ict+sparse")


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def build(variant: str, a: argparse.Namespace, shape: str, out_dir: str) -> Any:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from ictrl.engine.config import ICTGRPOConfig
    from ictrl.engine.trainer import ICTGRPOTrainer
    from ictrl.models import build_byte_tokenizer, build_real_shape, build_tiny_qwen2

    if shape == "tiny":
        tokenizer = build_byte_tokenizer(pad_to=a.vocab)
        model = build_tiny_qwen2(tokenizer, hidden_size=64, num_hidden_layers=2, vocab_size=a.vocab, seed=0)
    else:
        model, tokenizer = build_real_shape(shape, seed=0, device=a.device)
    a.vocab = model.config.vocab_size
    cuda = a.device == "cuda"
    if cuda:
        model = model.to(torch.bfloat16)
    tokenizer.padding_side = "left"
    common = dict(output_dir=out_dir, use_cpu=not cuda, bf16=cuda, report_to="none", save_strategy="no",
                  logging_steps=1, max_steps=a.steps, per_device_train_batch_size=a.batch,
                  num_generations=a.generations, max_completion_length=a.completion_len, learning_rate=1e-6,
                  seed=0, disable_tqdm=True, dataloader_num_workers=0, temperature=1.0)
    if variant == "trl":
        cls, args = GRPOTrainer, GRPOConfig(**common)
    else:
        selector, _, sparse = variant.partition("+")
        cls, args = ICTGRPOTrainer, ICTGRPOConfig(**common, token_selector=selector, selection_warmup_steps=0,
                                                  sparse_backward=bool(sparse))
    cls = with_fixed_generation(cls, a)
    return cls(model=model, reward_funcs=fixed_reward, args=args,
               train_dataset=Dataset.from_dict({"prompt": PROMPTS}), processing_class=tokenizer)


def run_variant(variant: str, a: argparse.Namespace, shape: str, profile: bool) -> dict[str, Any]:
    """``a.steps`` steps of ``variant``: synchronised step times (all of them; :func:`kept` drops the warm-up),
    peak allocated memory from the start of the first kept step, and with ``profile`` the top kernels of the
    first kept step."""
    from transformers import PrinterCallback, TrainerCallback

    times: list[float] = []
    prof: dict[str, Any] = {}
    mem: dict[str, float] = {}
    device = a.device
    first_kept = min(a.warmup, a.steps - 1)  # index of the first kept step

    class Timer(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            _sync(device)
            if len(times) == first_kept:
                if device == "cuda":  # the same point for every variant: the start of its first kept step
                    torch.cuda.reset_peak_memory_stats()
                    mem["at_reset_gib"] = torch.cuda.memory_allocated() / 2**30
                if profile:
                    prof["p"] = torch.profiler.profile(activities=_activities(device))
                    prof["p"].__enter__()
            self.t0 = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            _sync(device)
            times.append(time.perf_counter() - self.t0)
            if "p" in prof and "table" not in prof:
                prof["p"].__exit__(None, None, None)
                prof["table"] = top_kernels(prof["p"], device, a.top)

    with tempfile.TemporaryDirectory() as out_dir:
        try:
            trainer = build(variant, a, shape, out_dir)
            trainer.remove_callback(PrinterCallback)
            trainer.add_callback(Timer())
            trainer.train()
        except torch.OutOfMemoryError as err:
            return {"error": f"out of memory: {str(err).splitlines()[0][:200]}"}
        finally:
            trainer = None
            gc.collect()
            if device == "cuda":
                torch.cuda.empty_cache()
    out: dict[str, Any] = {"step_times": times, "warmup": first_kept,
                           "step_s": statistics.median(kept(times, first_kept))}
    if device == "cuda":
        out["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        out |= mem
    if "table" in prof:
        out["top_kernels"] = prof["table"]
    return out


# ------------------------------------------------------------------ statistics of rounds (pure functions)


def kept(times: list[float], warmup: int) -> list[float]:
    """The steps after the first ``warmup`` (measured, then dropped); the last step if there are no more."""
    return times[warmup:] if len(times) > warmup else times[-1:]


def spread(values: list[float]) -> dict[str, float]:
    """Median, smallest and largest of ``values``, and the half-range relative to the median (0.05 = +-5%)."""
    med = statistics.median(values)
    lo, hi = min(values), max(values)
    return {"median": med, "min": lo, "max": hi, "rel_halfrange": (hi - lo) / 2 / med if med else 0.0, "n": len(values)}


def variant_summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One variant over its rounds (each a :func:`run_variant` result): the kept steps of every round pooled, the
    per-round medians, and the peak memory (largest over rounds)."""
    ok = [r for r in rounds if "step_times" in r]
    if not ok:
        return {"error": next((r["error"] for r in rounds if "error" in r), "no run")}
    steps = [t for r in ok for t in kept(r["step_times"], r["warmup"])]
    out: dict[str, Any] = {"step_s": statistics.median(steps), "steps": spread(steps),
                           "round_medians": [statistics.median(kept(r["step_times"], r["warmup"])) for r in ok]}
    peaks = [r["peak_gib"] for r in ok if "peak_gib" in r]
    if peaks:
        out["peak_gib"] = max(peaks)
    return out


def ratio_summary(x: list[dict[str, Any]], y: list[dict[str, Any]]) -> dict[str, float] | None:
    """x / y per round (ratio of the rounds' medians of kept steps, rounds paired by index), as :func:`spread`;
    None if no round has both."""
    pairs = [(a, b) for a, b in zip(x, y) if "step_times" in a and "step_times" in b]
    if not pairs:
        return None
    return spread([statistics.median(kept(a["step_times"], a["warmup"])) /
                   statistics.median(kept(b["step_times"], b["warmup"])) for a, b in pairs])


RATIOS = (("ict", "all"), ("ict+sparse", "all"), ("all", "trl"), ("ict", "trl"))


def _activities(device: str) -> list[Any]:
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    return acts


def top_kernels(p: Any, device: str, n: int) -> list[dict[str, Any]]:
    """The n ops/kernels with the most self device time (CPU: self CPU time), in ms, with their call counts."""
    key = "self_device_time_total" if device == "cuda" else "self_cpu_time_total"
    rows = sorted(p.key_averages(), key=lambda e: getattr(e, key, 0.0), reverse=True)[:n]
    return [{"name": e.key[:90], "self_ms": getattr(e, key, 0.0) / 1e3, "calls": e.count} for e in rows]


def _median_seconds(fn: Any, device: str, repeats: int = 5) -> float:
    fn()  # warm-up: compile, autotune
    times = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def sweep_bandwidth(a: argparse.Namespace, V: int) -> dict[str, Any]:
    """The group-JS sweep alone at the statistics pass's call size ([B, rows // B, V] logits in the compute dtype,
    called as the trainer calls it: with tokens and group_size), and torch.log_softmax over the same logits.
    Bytes moved: two reads of the logits for the sweep, a read and a write (same dtype) for log_softmax."""
    from ictrl.core.stats import sweep_rows, token_stats

    device = torch.device(a.device)
    dtype = torch.bfloat16 if a.device == "cuda" else torch.float32
    B, G = a.batch, a.generations
    T = min(a.completion_len, max(1, sweep_rows(None, V, device, torch.finfo(dtype).bits // 8) // B))
    g = torch.Generator(device=device).manual_seed(0)
    logits = (torch.randn(B, T, V, generator=g, device=device) * 3).to(dtype)
    mask = torch.ones(B, T, dtype=torch.bool, device=device)
    tokens = torch.randint(0, V, (B, T), generator=g, device=device)
    groups = torch.arange(B, device=device) // G
    seconds = _median_seconds(lambda: token_stats(logits, mask, tokens, group_ids=groups, group_size=G), a.device)
    lsm = _median_seconds(lambda: torch.log_softmax(logits, dim=-1), a.device)
    moved = 2 * logits.numel() * logits.element_size()
    return {"rows": B * T, "calls_per_step": -(-a.completion_len // T), "vocab": V, "dtype": str(dtype),
            "seconds": seconds, "bytes_read": moved, "tb_per_s": moved / seconds / 1e12,
            "log_softmax_s": lsm, "log_softmax_tb_per_s": moved / lsm / 1e12, "sweep_over_log_softmax": seconds / lsm}


def _gib(x: float | None) -> str:
    return f"{x:.2f}" if x else "-"


def _cell(r: dict[str, float] | None) -> str:
    return f"{r['median']:.3f} ({r['min']:.3f}-{r['max']:.3f})" if r else "-"


def markdown(res: dict[str, Any]) -> str:
    names = [f"{x} / {y}" for x, y in RATIOS]
    lines = [f"# bench_gpu ({res['device_name']}, torch {res['torch']})", "",
             f"{res['settings']}", "",
             "Step time: median of the kept steps of all rounds (+- half their range, relative). Ratios: median over "
             "rounds of each round's ratio, (smallest-largest round).", "",
             "| shape | " + " | ".join(VARIANTS) + " | " + " | ".join(names) + " | peak GiB all | peak GiB ict | "
             "peak ict / all |", "|---|" + "---|" * (len(VARIANTS) + len(names) + 3)]
    for shape, runs in res["shapes"].items():
        summ = runs.get("summary", {})

        def step(v: str) -> str:
            s = summ.get(v, {})
            return f"{s['step_s']:.3f} s +-{100 * s['steps']['rel_halfrange']:.0f}%" if "step_s" in s else \
                s.get("error", "-")[:30]

        peak = {v: summ.get(v, {}).get("peak_gib") for v in ("all", "ict")}
        ratio = f"{peak['ict'] / peak['all']:.3f}" if peak["ict"] and peak["all"] else "-"
        lines.append(f"| {shape} | " + " | ".join(step(v) for v in VARIANTS) + " | "
                     + " | ".join(_cell(runs.get("ratios", {}).get(n)) for n in names)
                     + f" | {_gib(peak['all'])} | {_gib(peak['ict'])} | {ratio} |")
        sw = runs.get("sweep")
        if sw:
            lines += ["", f"group-JS sweep at {shape}: {sw['rows']} rows x V {sw['vocab']} ({sw['dtype']}), "
                      f"{sw['calls_per_step']} call(s) per step: {sw['seconds'] * 1e3:.2f} ms, "
                      f"{sw['tb_per_s']:.2f} TB/s (two reads); torch.log_softmax on the same logits: "
                      f"{sw['log_softmax_s'] * 1e3:.2f} ms, {sw['log_softmax_tb_per_s']:.2f} TB/s (read + write); "
                      f"sweep / log_softmax {sw['sweep_over_log_softmax']:.2f}"]
        kernels = next((r.get("top_kernels") for r in runs.get("rounds", {}).get("ict", []) if r.get("top_kernels")),
                       None)
        if kernels:
            lines += ["", f"top kernels of one ict step at {shape}:", "", "| kernel | self ms | calls |", "|---|---|---|"]
            lines += [f"| `{k['name']}` | {k['self_ms']:.2f} | {k['calls']} |" for k in kernels]
        lines.append("")
    return "\n".join(lines) + "\n"


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="a 2-layer, width-64 model, 8 x 16 tokens: the smoke run")
    ap.add_argument("--shapes", default="qwen2.5-0.5b,qwen2.5-1.5b")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--generations", type=int, default=8)
    ap.add_argument("--completion-len", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=6, help="optimizer steps per run, warm-up included")
    ap.add_argument("--warmup", type=int, default=2, help="steps per run measured and dropped")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of every variant, in rotated order")
    ap.add_argument("--top", type=int, default=15, help="kernels listed from the profile of one ict step")
    ap.add_argument("--out", type=Path, default=RESULTS)
    return ap


def main() -> None:
    ap = parser()
    a = ap.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device here (use --device cpu --tiny for the smoke run)")
    if a.tiny:
        a.shapes, a.batch, a.generations, a.completion_len, a.steps, a.vocab = "tiny", 8, 4, 16, min(a.steps, 3), 512
        a.warmup = min(a.warmup, 1)
    if a.steps < 1 or a.warmup < 0 or a.rounds < 1:
        ap.error("--steps and --rounds must be >= 1 and --warmup >= 0")
    variants = [v for v in a.variants.split(",") if v]
    res: dict[str, Any] = {
        "device_name": torch.cuda.get_device_name() if a.device == "cuda" else "cpu", "torch": torch.__version__,
        "settings": f"batch {a.batch}, groups of {a.generations}, {a.completion_len} tokens, {a.steps} steps per "
                    f"run ({min(a.warmup, a.steps - 1)} warm-up dropped), {a.rounds} rotated round(s), "
                    f"{'bf16' if a.device == 'cuda' else 'fp32'}", "shapes": {}}
    started = time.perf_counter()
    for shape in a.shapes.split(","):
        rounds: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
        for r in range(a.rounds):
            for v in variants[r % len(variants):] + variants[:r % len(variants)]:
                out = run_variant(v, a, shape, profile=(v == "ict" and r == 0))
                rounds[v].append(out)
                print(f"{shape:14s} round {r} {v:12s} {out.get('step_s', out.get('error'))}", flush=True)
        runs: dict[str, Any] = {"rounds": rounds, "summary": {v: variant_summary(rs) for v, rs in rounds.items()},
                                "ratios": {f"{x} / {y}": ratio_summary(rounds[x], rounds[y])
                                           for x, y in RATIOS if x in rounds and y in rounds}}
        runs["sweep"] = sweep_bandwidth(a, a.vocab if shape == "tiny" else build_vocab(shape))
        res["shapes"][shape] = runs
        res["wall_s"] = time.perf_counter() - started
        atomic_write_json(a.out, res)  # after each shape: a run cut short keeps what it measured
        atomic_write_text(a.out.with_suffix(".md"), markdown(res))
    print(markdown(res))


def build_vocab(shape: str) -> int:
    from ictrl.models import real_shape_config

    return int(real_shape_config(shape).vocab_size)


if __name__ == "__main__":
    main()
