"""Peak memory (RSS) of one training step: ICT vs full-token GRPO vs sparse backward, at vocabulary 151,936.

Every case runs in a fresh subprocess. Peak = the process's ``VmHWM`` after the measured work minus its ``VmRSS``
just before, with the high-water mark reset (``/proc/self/clear_refs`` ← 5) at that point. Not ``ru_maxrss``:
Linux carries the parent's high-water mark across fork+exec, so a small child of a large parent reads the parent's
peak. Linux only.

Trainer cases (tiny Qwen2 from ``ictrl.models``, vocabulary padded to --vocab, real generation, fixed reward; the
measured step is the second optimizer step, so library pages and optimizer state allocated in step one are in the
baseline):

    trl_q1.0     TRL's stock GRPOTrainer, every token (its fused chunked LM head)
    all, ict     ICTGRPOTrainer, token_selector all / ict (warm-up 0); both run the statistics pass
    ict+sparse   ict with sparse_backward=True (only when ICTGRPOConfig has that field)

Loss-head cases (hidden [B, T, H] → [V, H] head → selected-token loss, forward+backward, 10% selected):

    head:dense   full logits → log_softmax → gather
    head:trl     TRL's chunked log-prob kernel over every row
    head:sparse  ictrl.core.logprobs.selected_token_logprobs over the selected rows

    .venv/bin/python bench/bench_memory.py
    .venv/bin/python bench/bench_memory.py --cases head:dense,head:sparse

Writes bench/results/memory.json atomically and prints MB and ratios.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_train_step import build_trainer  # noqa: E402

from ictrl.files import atomic_write_json  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "memory.json"


def _status_kb(key: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key))


def _reset_peak() -> int:
    """Reset VmHWM to the current RSS; return that RSS in kB."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status_kb("VmRSS:")


def peak_probe(marks: dict[str, int], measured_step: int = 2) -> Any:
    """A TrainerCallback that records into ``marks`` (kB), for optimizer step ``measured_step``: the process peak
    before it (``first_step_peak_kb``), the RSS as it begins (``before_kb``, where the high-water mark is reset) and
    the peak through its end (``peak_kb``)."""
    from transformers import TrainerCallback

    class PeakProbe(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step == measured_step - 1:
                marks["first_step_peak_kb"] = _status_kb("VmHWM:")
                marks["before_kb"] = _reset_peak()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step == measured_step:
                marks["peak_kb"] = _status_kb("VmHWM:")

    return PeakProbe()


def trainer_case(case: str, a: argparse.Namespace) -> dict[str, float]:
    import tempfile

    from transformers import PrinterCallback

    marks: dict[str, int] = {}
    a.steps = 2
    with tempfile.TemporaryDirectory() as out_dir:
        trainer = build_trainer(case, a, out_dir)
        trainer.remove_callback(PrinterCallback)
        trainer.add_callback(peak_probe(marks))
        trainer.train()
    return {"step_peak_mb": (marks["peak_kb"] - marks["before_kb"]) / 1024,
            "rss_before_step_mb": marks["before_kb"] / 1024, "process_peak_mb": max(marks["peak_kb"],
                                                                                  marks["first_step_peak_kb"]) / 1024}


def head_case(case: str, a: argparse.Namespace) -> dict[str, float]:
    import torch
    from trl.kernels.chunked_logprob import ChunkedLogProbFunction

    from ictrl.core.logprobs import selected_token_logprobs

    B, T, H = (int(x) for x in a.head_shape.split(","))
    torch.manual_seed(0)
    hidden = torch.randn(B, T, H, requires_grad=True)
    tokens = torch.randint(0, a.vocab, (B, T))
    selected = torch.rand(B, T) < 0.1

    def step(V: int) -> float:
        head = torch.nn.Linear(H, V, bias=False)
        tok = tokens % V
        if case == "head:dense":
            lp = torch.log_softmax(head(hidden), -1).gather(-1, tok.unsqueeze(-1)).squeeze(-1)
        elif case == "head:trl":
            lp = ChunkedLogProbFunction.apply(hidden.reshape(-1, H), head.weight, None, tok.reshape(-1), 1.0, 32768,
                                              None, 1.0, ("log_probs",))[0].view(B, T)
        else:
            lp = selected_token_logprobs(hidden, head, tok, selected)
        (lp * selected).sum().backward()
        hidden.grad = None
        return float(head.weight.grad.abs().sum())

    step(300)  # page in the kernels at a small vocabulary
    import gc
    gc.collect()
    # The head itself ([V, H] weight) is built inside the measured region in every case alike.
    before = _reset_peak()
    step(a.vocab)
    peak = _status_kb("VmHWM:")
    return {"step_peak_mb": (peak - before) / 1024, "rss_before_step_mb": before / 1024,
            "weight_mb": a.vocab * H * 4 / 2**20}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=151_936)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--generations", type=int, default=4)
    ap.add_argument("--completion-len", type=int, default=32)
    ap.add_argument("--generation", choices=("fixed", "real"), default="real",
                    help="real: TRL's sampling; fixed: bench_train_step.py's deterministic completions")
    ap.add_argument("--head-shape", default="8,128,64", help="B,T,H of the loss-head cases")
    ap.add_argument("--cases", default=None, help="comma-separated subset")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if not sys.platform.startswith("linux"):
        ap.error("reads /proc/self/status (Linux only)")
    if a.worker:
        fn = head_case if a.worker.startswith("head:") else trainer_case
        print(json.dumps(fn(a.worker, a)))
        return

    cases = ["head:dense", "head:trl", "head:sparse", "trl_q1.0", "all", "ict", "ict+sparse"]
    if a.cases:
        cases = a.cases.split(",")
    argv = [f"--vocab={a.vocab}", f"--hidden={a.hidden}", f"--layers={a.layers}", f"--batch={a.batch}",
            f"--generations={a.generations}", f"--completion-len={a.completion_len}", f"--generation={a.generation}", f"--head-shape={a.head_shape}"]
    out: dict[str, Any] = {"config": vars(a) | {"cases": cases}, "cases": {}}
    for case in cases:
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, __file__, f"--worker={case}", *argv], capture_output=True, text=True)
        if proc.returncode:
            raise SystemExit(f"case {case} failed:\n{proc.stderr[-3000:]}")
        out["cases"][case] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"{case:12s} peak +{out['cases'][case]['step_peak_mb']:8.1f} MB  ({time.perf_counter() - t0:.0f} s)",
              file=sys.stderr, flush=True)

    res = out["cases"]
    pairs = [("head:sparse", "head:dense"), ("head:sparse", "head:trl"), ("head:trl", "head:dense"),
             ("ict", "all"), ("ict", "trl_q1.0"), ("all", "trl_q1.0"), ("ict+sparse", "ict"),
             ("ict+sparse", "trl_q1.0")]
    out["ratios"] = {f"{x}/{y}": res[x]["step_peak_mb"] / res[y]["step_peak_mb"] for x, y in pairs
                     if x in res and y in res and res[y]["step_peak_mb"] > 0}
    print(f"\nPeak RSS growth of one step, V={a.vocab}; trainer: hidden {a.hidden}x{a.layers}, {a.batch} completions "
          f"x {a.completion_len} tokens; head: B,T,H = {a.head_shape}")
    print(f"{'case':12s} {'step peak MB':>13s} {'RSS before MB':>14s}")
    for case, r in res.items():
        print(f"{case:12s} {r['step_peak_mb']:13.1f} {r['rss_before_step_mb']:14.1f}")
    for k, v in out["ratios"].items():
        print(f"  ratio {k:24s} {v:.3f}")
    atomic_write_json(RESULTS, out)
    print(f"\nwrote {RESULTS}")


if __name__ == "__main__":
    main()
