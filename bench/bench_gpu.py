"""One optimizer step on a GPU: TRL's stock GRPO vs ictrl's all / ict / ict+sparse, the group-JS sweep's bandwidth,
and the top kernels of one ict step. One command, a few minutes on one H100/H200:

    PYTHONPATH=src python bench/bench_gpu.py                      # 0.5B and 1.5B, bf16, 16 x 1024, groups of 8
    PYTHONPATH=src python bench/bench_gpu.py --tiny --device cpu  # the smoke run the test suite makes

Every variant trains on the same fixed completions (bench_train_step.py's deterministic ids, no EOS, fixed reward):
a random Qwen2.5-shaped model at full depth (``ictrl.models.build_real_shape``), cast to bf16 (the weights, as
``dtype: auto`` loads a bf16 checkpoint) with ``bf16=True``, --batch completions in groups of --generations,
--completion-len tokens, AdamW, --steps optimizer steps; warm-up 0 so ict selects from its first step. Per
variant: step times (``torch.cuda.synchronize`` at step begin and end), the median of the steps after the first,
and the peak allocated GPU memory (reset after the first step). Variants run in one process one after another,
each on a freshly built model; ``--rounds`` repeats them in rotated order.

Also: the group-JS sweep alone (``ictrl.core.stats.token_stats`` with group ids, as the statistics pass calls it)
on random bf16 logits at the trainer's call size (rows from ``sweep_rows``, i.e. the block the statistics pass
takes), its time (CUDA events, median of 5) and effective bandwidth (two reads of the logits); and
``torch.profiler``'s top kernels by device time over one ict step.

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
    """``a.steps`` steps of ``variant``: synchronised step times, peak allocated memory after the first step, and
    with ``profile`` the top kernels of the second step."""
    from transformers import PrinterCallback, TrainerCallback

    times: list[float] = []
    prof: dict[str, Any] = {}
    device = a.device

    class Timer(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            _sync(device)
            if profile and len(times) == 1:
                prof["p"] = torch.profiler.profile(activities=_activities(device))
                prof["p"].__enter__()
            self.t0 = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            _sync(device)
            times.append(time.perf_counter() - self.t0)
            if "p" in prof and "table" not in prof:
                prof["p"].__exit__(None, None, None)
                prof["table"] = top_kernels(prof["p"], device, a.top)
            if len(times) == 1 and device == "cuda":
                torch.cuda.reset_peak_memory_stats()

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
    out: dict[str, Any] = {"step_s": statistics.median(times[1:] if len(times) > 1 else times), "step_times": times}
    if device == "cuda":
        out["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    if "table" in prof:
        out["top_kernels"] = prof["table"]
    return out


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


def sweep_bandwidth(a: argparse.Namespace, V: int) -> dict[str, Any]:
    """The group-JS sweep alone at the statistics pass's call size: [B, rows // B, V] logits in the compute dtype."""
    from ictrl.core.stats import sweep_rows, token_stats

    device = torch.device(a.device)
    dtype = torch.bfloat16 if a.device == "cuda" else torch.float32
    B, G = a.batch, a.generations
    T = min(a.completion_len, max(1, sweep_rows(None, V, device) // B))
    g = torch.Generator(device=device).manual_seed(0)
    logits = (torch.randn(B, T, V, generator=g, device=device) * 3).to(dtype)
    mask = torch.ones(B, T, dtype=torch.bool, device=device)
    tokens = torch.randint(0, V, (B, T), generator=g, device=device)
    groups = torch.arange(B, device=device) // G

    def call() -> None:
        token_stats(logits, mask, tokens, group_ids=groups, group_size=G)

    call()
    times = []
    for _ in range(5):
        _sync(a.device)
        t0 = time.perf_counter()
        call()
        _sync(a.device)
        times.append(time.perf_counter() - t0)
    seconds = statistics.median(times)
    read = 2 * logits.numel() * logits.element_size()
    return {"rows": B * T, "calls_per_step": -(-a.completion_len // T), "vocab": V, "dtype": str(dtype),
            "seconds": seconds, "bytes_read": read, "tb_per_s": read / seconds / 1e12}


def markdown(res: dict[str, Any]) -> str:
    lines = [f"# bench_gpu ({res['device_name']}, torch {res['torch']})", "",
             f"{res['settings']}", "",
             "| shape | " + " | ".join(VARIANTS) + " | ict / all | ict+sparse / all | all / trl | peak GiB (ict) |",
             "|---|" + "---|" * (len(VARIANTS) + 4)]
    for shape, runs in res["shapes"].items():
        med = {v: runs[v].get("step_s") for v in VARIANTS if v in runs}

        def ratio(x: str, y: str) -> str:
            return f"{med[x] / med[y]:.3f}" if med.get(x) and med.get(y) else "-"

        cells = [f"{med[v]:.3f} s" if med.get(v) else runs.get(v, {}).get("error", "-")[:30] for v in VARIANTS]
        peak = runs.get("ict", {}).get("peak_gib")
        lines.append(f"| {shape} | " + " | ".join(cells) + f" | {ratio('ict', 'all')} | {ratio('ict+sparse', 'all')}"
                     f" | {ratio('all', 'trl')} | {f'{peak:.1f}' if peak else '-'} |")
        sw = runs.get("sweep")
        if sw:
            lines += ["", f"group-JS sweep at {shape}: {sw['rows']} rows x V {sw['vocab']} ({sw['dtype']}), "
                      f"{sw['calls_per_step']} call(s) per step: {sw['seconds'] * 1e3:.2f} ms, "
                      f"{sw['tb_per_s']:.2f} TB/s (two reads)"]
        kernels = runs.get("ict", {}).get("top_kernels")
        if kernels:
            lines += ["", f"top kernels of one ict step at {shape}:", "", "| kernel | self ms | calls |", "|---|---|---|"]
            lines += [f"| `{k['name']}` | {k['self_ms']:.2f} | {k['calls']} |" for k in kernels]
        lines.append("")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="a 2-layer, width-64 model, 8 x 16 tokens: the smoke run")
    ap.add_argument("--shapes", default="qwen2.5-0.5b,qwen2.5-1.5b")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--generations", type=int, default=8)
    ap.add_argument("--completion-len", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=4, help="optimizer steps per variant; the first is not timed")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--top", type=int, default=15, help="kernels listed from the profile of one ict step")
    ap.add_argument("--out", type=Path, default=RESULTS)
    a = ap.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device here (use --device cpu --tiny for the smoke run)")
    if a.tiny:
        a.shapes, a.batch, a.generations, a.completion_len, a.steps, a.vocab = "tiny", 8, 4, 16, min(a.steps, 3), 512
    variants = [v for v in a.variants.split(",") if v]
    res: dict[str, Any] = {
        "device_name": torch.cuda.get_device_name() if a.device == "cuda" else "cpu", "torch": torch.__version__,
        "settings": f"batch {a.batch}, groups of {a.generations}, {a.completion_len} tokens, {a.steps} steps "
                    f"(median of all but the first), {a.rounds} round(s), "
                    f"{'bf16' if a.device == 'cuda' else 'fp32'}", "shapes": {}}
    started = time.perf_counter()
    for shape in a.shapes.split(","):
        runs: dict[str, Any] = {}
        for r in range(a.rounds):
            order = variants[r % len(variants):] + variants[:r % len(variants)]
            for v in order:
                out = run_variant(v, a, shape, profile=(v == "ict" and r == 0))
                prev = runs.get(v)
                if prev and "step_s" in prev and "step_s" in out:
                    out["step_times"] = prev["step_times"] + out["step_times"][1:]
                    out["step_s"] = statistics.median(out["step_times"][1:])
                runs[v] = {**(prev or {}), **out}
                print(f"{shape:14s} {v:12s} {runs[v].get('step_s', runs[v].get('error'))}", flush=True)
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
