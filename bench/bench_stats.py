"""Time and peak extra memory of ictrl.core.stats against one torch.log_softmax pass over the same logits.

Group JS backends side by side (ictrl.core.kernels.group_js): ``group_js`` / ``stats_and_js`` run the default
(``auto``); ``:plain`` and ``:compiled`` force one path; ``group_js:compiled_cold`` runs the compiled path with an
empty inductor cache (a fresh TORCHINDUCTOR_CACHE_DIR), so its ``first_s`` (the warm-up call) is the cold compile,
while ``group_js:compiled``'s ``first_s`` is a new process's cost with the machine's cache already filled.

Each (case, method) runs in a fresh subprocess so its peak RSS growth (VmHWM after - before, baseline taken
once the logits exist; not ru_maxrss, which a child inherits from its parent) is that method's own peak extra memory. Times are the median of --repeats runs after a
warm-up on a small slice. The batch is B = 16 responses in groups of 8, T = N / 16 positions, every position
active (no row is skipped, so all methods do the same work).

    .venv/bin/python bench/bench_stats.py            # full grid: N {512, 2048} x V {32768, 151936} x {fp32, bf16}
    .venv/bin/python bench/bench_stats.py --quick    # headline only: N 2048, V 151936, fp32
    .venv/bin/python bench/bench_stats.py --quick --baseline /tmp/stats_old.py --rounds 3
        # also time another copy of ictrl/core/stats.py (methods "base:..."), interleaved with the current one
    python bench/bench_stats.py --device cuda --dtype bf16 --v 151936 --n 0 16384 \
        --methods log_softmax stats_and_js group_js
        # on a GPU: the sweep (as the trainer calls it, with group_size) against torch.log_softmax on the same bf16
        # logits, achieved TB/s; N 0 = the trainer's call size (the statistics pass's block: ``sweep_rows``)

Bandwidth (``tb_per_s``): bytes moved / median time, counting two reads of the logits for the sweep (its least
traffic) and a read and a write (same dtype) for log_softmax: the same bytes, so the TB/s compare directly.

Writes bench/results/stats.json (atomically) and prints a table with ratios to log_softmax.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ictrl.files import atomic_write_json  # no torch: the parent stays small

METHODS = ("log_softmax", "token_stats", "group_js:plain", "group_js:compiled_cold", "group_js:compiled",
           "group_js", "stats_and_js:plain", "stats_and_js")
GROUP = 8
RESPONSES = 16


def _peak_rss_bytes() -> int:
    """This process's peak resident set (VmHWM), which starts fresh at exec, unlike the inherited ru_maxrss."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def _load_stats_module(baseline: Path | None):
    """ictrl.core.stats, or the module at ``baseline`` (a saved copy of stats.py) when given."""
    if baseline is None:
        import ictrl.core.stats as mod
        return mod
    import importlib.util
    spec = importlib.util.spec_from_file_location("stats_baseline", baseline)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def worker(n: int, v: int, dtype: str, method: str, repeats: int, chunk_size: int | None,
           baseline: Path | None = None, device: str = "cpu") -> dict:
    import torch

    use_base = method.startswith("base:")
    mod = _load_stats_module(baseline if use_base else None)
    group_js_divergence, token_stats = mod.group_js_divergence, mod.token_stats
    kind = method.removeprefix("base:")

    torch.manual_seed(0)
    if n == 0:  # the trainer's call size: the statistics pass's block of rows at this vocabulary and dtype
        itemsize = {"fp32": 4, "bf16": 2}[dtype]
        n = max(RESPONSES, mod.sweep_rows(None, v, torch.device(device), itemsize) // RESPONSES * RESPONSES)
    T = n // RESPONSES
    # Filled 4 rows at a time: a temporary raises the peak RSS before the baseline and would hide that much of a
    # method's extra memory, so it must stay far below the chunk buffers being measured (4 rows: 2.4 MB at V=151936).
    logits = torch.empty(RESPONSES, T, v, dtype={"fp32": torch.float32, "bf16": torch.bfloat16}[dtype])
    for b in range(RESPONSES):
        for t in range(0, T, 4):
            logits[b, t:t + 4] = torch.randn(min(4, T - t), v).mul_(2.0)
    mask = torch.ones(RESPONSES, T, dtype=torch.bool)
    tokens = torch.randint(0, v, (RESPONSES, T))
    groups = torch.arange(RESPONSES) // GROUP
    cuda = device == "cuda"
    if cuda:  # on the GPU, memory is the allocator's peak and times wait for the kernels
        logits, mask, tokens, groups = (x.cuda() for x in (logits, mask, tokens, groups))

    kind, _, backend = kind.partition(":")
    backend = {"": "auto", "compiled_cold": "compiled"}.get(backend, backend)
    # A baseline stats.py predates backends and group_size; the current one is called as the trainer calls it.
    bk = {} if use_base else {"backend": backend, "group_size": GROUP}

    def run(lg, mk, tk, bk=bk):
        if kind == "log_softmax":
            return torch.log_softmax(lg, dim=-1)
        if kind == "token_stats":
            return token_stats(lg, mk, tk, chunk_size=chunk_size)
        if kind == "group_js":
            return group_js_divergence(lg, mk, groups, chunk_size=chunk_size, **bk)
        return token_stats(lg, mk, tk, chunk_size=chunk_size, group_ids=groups, **bk)

    ran = "-" if kind in ("log_softmax", "token_stats") else backend
    if ran == "auto" and not use_base:
        from ictrl.core.kernels.group_js import resolve_backend

        # Warm up (and, for a fused path, compile) on the path the full-size call will take; a 2-position slice
        # alone would stay under auto's size threshold and leave the compile inside the timed runs.
        ran = resolve_backend("auto", logits.device, int(mask.sum()) * v)[0]
    t0 = time.perf_counter()
    run(logits[:, :2], mask[:, :2], tokens[:, :2], bk | {"backend": ran} if bk else {})  # warm-up: kernels, compile
    first_s = time.perf_counter() - t0
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.max_memory_allocated() if cuda else _peak_rss_bytes()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = run(logits, mask, tokens)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        del out
    after = torch.cuda.max_memory_allocated() if cuda else _peak_rss_bytes()
    return {
        "n": n, "v": v, "dtype": dtype, "method": method, "chunk_size": chunk_size, "path": ran,
        "first_s": first_s, "times_s": times, "median_s": statistics.median(times),
        "peak_extra_gb": (after - before) / 1e9, "logits_gb": logits.numel() * logits.element_size() / 1e9,
        "threads": torch.get_num_threads(), "load1": os.getloadavg()[0], "device": device,
        # The fused kernels' least traffic is two reads of the logits; log_softmax's is a read and a write.
        "gb_per_s": 2 * logits.numel() * logits.element_size() / 1e9 / statistics.median(times),
        "tb_per_s": 2 * logits.numel() * logits.element_size() / 1e12 / statistics.median(times),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="headline case only (N 2048, V 151936, fp32)")
    ap.add_argument("--n", type=int, nargs="+", default=[512, 2048],
                    help="rows (positions) N, a multiple of 16; 0: the trainer's call size (sweep_rows)")
    ap.add_argument("--v", type=int, nargs="+", default=[32768, 151936], help="vocabulary sizes")
    ap.add_argument("--dtype", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per worker (median taken)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run every method's worker this many times, interleaved (times pooled, peak = max): "
                         "spreads load drift on a shared machine over all methods")
    ap.add_argument("--baseline", type=Path, default=None,
                    help="a saved copy of stats.py to time side by side (methods prefixed 'base:')")
    ap.add_argument("--chunk-size", type=int, default=None, help="rows per chunk (default: the module's budget)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                    help="cuda: the Triton path; add --methods log_softmax group_js stats_and_js")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "stats.json")
    ap.add_argument("--worker", nargs=4, metavar=("N", "V", "DTYPE", "METHOD"), help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.worker:
        n, v, dtype, method = args.worker
        print(json.dumps(worker(int(n), int(v), dtype, method, args.repeats, args.chunk_size, args.baseline,
                                args.device)))
        return
    if args.quick:
        args.n, args.v, args.dtype = [2048], [151936], ["fp32"]
    methods = list(args.methods)
    if args.baseline is not None:
        methods += [f"base:{m}" for m in args.methods if m != "log_softmax"]

    results = []
    for n in args.n:
        for v in args.v:
            for dtype in args.dtype:
                pooled: dict[str, dict] = {}
                for _ in range(args.rounds):
                    for method in methods:
                        cmd = [sys.executable, __file__, "--worker", str(n), str(v), dtype, method,
                               "--repeats", str(args.repeats)]
                        if args.chunk_size is not None:
                            cmd += ["--chunk-size", str(args.chunk_size)]
                        cmd += ["--device", args.device]
                        if args.baseline is not None:
                            cmd += ["--baseline", str(args.baseline)]
                        env = None
                        if method.endswith(":compiled_cold"):  # an empty inductor cache: the compile is paid here
                            env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=tempfile.mkdtemp(prefix="ictrl_cold_"))
                        res = subprocess.run(cmd, capture_output=True, text=True, env=env)
                        if env is not None:
                            shutil.rmtree(env["TORCHINDUCTOR_CACHE_DIR"], ignore_errors=True)
                        if res.returncode != 0:
                            sys.exit(f"worker failed for {n} {v} {dtype} {method}:\n{res.stderr}")
                        r = json.loads(res.stdout.strip().splitlines()[-1])
                        print(f"  done N={n} V={v} {dtype} {method}: {r['median_s']:.3f} s (load {r['load1']:.1f})",
                              file=sys.stderr)
                        if method in pooled:
                            p = pooled[method]
                            p["times_s"] += r["times_s"]
                            p["first_s"] = max(p["first_s"], r["first_s"])
                            p["peak_extra_gb"] = max(p["peak_extra_gb"], r["peak_extra_gb"])
                        else:
                            pooled[method] = r
                for r in pooled.values():
                    r["median_s"] = statistics.median(r["times_s"])
                    results.append(r)

    atomic_write_json(args.out, {"argv": sys.argv[1:], "results": results})
    print(f"{'N':>5} {'V':>7} {'dtype':>5} {'method':>24} {'path':>8} {'median s':>9} {'x log_softmax':>13} "
          f"{'TB/s':>6} {'extra GB':>9} {'first s':>8}")
    base = {(r["n"], r["v"], r["dtype"]): r["median_s"] for r in results if r["method"] == "log_softmax"}
    for r in results:
        b = base.get((r["n"], r["v"], r["dtype"]))
        ratio = f"{r['median_s'] / b:.2f}" if b else "-"
        print(f"{r['n']:>5} {r['v']:>7} {r['dtype']:>5} {r['method']:>24} {r['path']:>8} {r['median_s']:>9.3f} "
              f"{ratio:>13} {r['tb_per_s']:>6.3f} {r['peak_extra_gb']:>9.3f} {r['first_s']:>8.1f}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
