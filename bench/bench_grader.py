"""The grader corpus: 10k+ adversarial gradings at idle and under a concurrent CPU hog, in one run.

    .venv/bin/python bench/bench_grader.py [--timeout 3] [--hogs 2] [--sample N] [--out bench/results/grader.json]

The corpus is ``tests/fixtures/grader_adversarial.grader_corpus`` over the MATH-500 golds (right answers in every
written form, wrong answers, refused boxes, truncation, random bytes, power towers, choice letters in 50k-space
boxes). Each pass grades every case once with the result cache off (timeouts are still remembered within a pass,
as in training) and reports crashes (exceptions), p50/p99/max latency, timeouts, stalls, peak memory of this
process and of the workers, verdicts that differ from the expected ones, and orphans (workers alive after the pool
shut down). The last 40 cases are ``EXACT_CASES`` (decimals decided exactly, bold wrappers, exponents of any
length). The hog pass runs ``--hogs`` busy-loop processes beside the grader. Then the verdicts of the two passes
are compared, and a child process is killed with SIGKILL while its worker is busy (its workers must not outlive it).
Results go to ``--out`` (JSON, written atomically) and a table on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from ictrl import rewards
from ictrl.data import load_problems
from ictrl.files import atomic_write_json
from ictrl.rewards.verify import _get_pool

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "fixtures"))
from grader_adversarial import Case, grade, grader_corpus  # noqa: E402  (the corpus the tests sample)
from procs import pid_alive  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def _status_kb(pid: int | str, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


class _Watcher:
    """Samples the workers every 0.2 s: every pid seen, and the peak resident memory among them."""

    def __init__(self) -> None:
        self.pids: set[int] = set()
        self.peak_kb = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            try:
                pids = _get_pool().pids()
            except Exception:  # the pool is being replaced
                continue
            self.pids.update(pids)
            self.peak_kb = max([self.peak_kb] + [_status_kb(p, "VmHWM") for p in pids])

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _percentile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def run_pass(cases: list[Case], timeout: float) -> dict[str, Any]:
    rewards.configure(guard="process", timeout=timeout, cache_size=0)  # also forgets earlier timeouts
    rewards.math_reward("\\boxed{x^2+2x+1}", "(x+1)^2")  # start the worker outside the measurement
    time.sleep(2)  # and let the spare finish its imports
    rewards.reset_reward_stats()
    watcher = _Watcher()
    verdicts: list[float | None] = []
    times: list[float] = []
    crashes: list[str] = []
    t_start = time.perf_counter()
    for case in cases:
        t0 = time.perf_counter()
        try:
            verdicts.append(grade(case))
        except Exception as e:  # a crash is a finding, not the end of the run
            verdicts.append(None)
            crashes.append(f"{case.family}: {type(e).__name__}: {e}"[:200])
        times.append(time.perf_counter() - t0)
    wall = time.perf_counter() - t_start
    watcher.stop()
    stats = rewards.reward_stats()
    rewards.shutdown_workers()
    time.sleep(2)
    orphans = [p for p in watcher.pids if pid_alive(p)]
    times_sorted = sorted(times)
    mismatch = Counter(c.family for c, v in zip(cases, verdicts) if c.expected is not None and v != c.expected)
    slowest = sorted(range(len(cases)), key=times.__getitem__)[-5:]
    return {
        "cases": len(cases), "wall_s": wall, "load_avg_1m": os.getloadavg()[0],
        "crashes": len(crashes), "crash_examples": crashes[:10],
        "p50_ms": 1e3 * statistics.median(times), "p99_ms": 1e3 * _percentile(times_sorted, 0.99),
        "max_ms": 1e3 * times_sorted[-1],
        "slowest": [(cases[i].family, round(times[i], 3)) for i in reversed(slowest)],
        "timeouts": stats["timeouts"], "cached_timeouts": stats["cached_timeouts"], "stalls": stats["stalls"],
        "errors": stats["errors"], "verify_calls": stats["verify_calls"], "fast_path": stats["fast_path"],
        "worker_starts": stats["worker_starts"], "workers_seen": len(watcher.pids),
        "worker_peak_rss_mb": watcher.peak_kb / 1024, "self_peak_rss_mb": _status_kb("self", "VmHWM") / 1024,
        "orphans": len(orphans),
        "expected_verdicts": sum(c.expected is not None for c in cases),
        "mismatches_by_family": dict(mismatch),
        "verdicts": verdicts,
    }


_ORPHAN_CHILD = """
import json, time
from ictrl import rewards
from ictrl.rewards.verify import _get_pool
rewards.configure(timeout=600.0, cache_size=0)
rewards.math_reward("\\\\boxed{x^2+2x+1}", "(x+1)^2")
while _get_pool().spare is None:
    time.sleep(0.05)
print(json.dumps(_get_pool().pids()), flush=True)
rewards.math_reward("\\\\boxed{(9^9)^{(9^9)}}", "5")
"""


def kill_parent_check(wait_s: float = 5.0) -> dict[str, Any]:
    """SIGKILL a grading process while its worker is inside a bomb; count its workers alive ``wait_s`` later."""
    child = subprocess.Popen([sys.executable, "-c", _ORPHAN_CHILD], stdout=subprocess.PIPE, text=True)
    pids = json.loads(child.stdout.readline())  # type: ignore[union-attr]
    time.sleep(1.0)
    child.kill()
    child.wait()
    t0 = time.monotonic()
    while any(pid_alive(p) for p in pids) and time.monotonic() - t0 < wait_s:
        time.sleep(0.05)
    survivors = [p for p in pids if pid_alive(p)]
    gone_after = time.monotonic() - t0
    for p in survivors:
        os.kill(p, 9)
    return {"workers": len(pids), "survivors": len(survivors), "gone_after_s": round(gone_after, 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--timeout", type=float, default=3.0, help="CPU seconds per math-verify call")
    ap.add_argument("--hogs", type=int, default=os.cpu_count() or 2, help="busy-loop processes in the hog pass")
    ap.add_argument("--sample", type=int, default=None, help="grade every k-th case only (a quick look)")
    ap.add_argument("--out", type=Path, default=RESULTS / "grader.json")
    args = ap.parse_args()

    golds = [p.gold for p in load_problems("math500")]
    cases = grader_corpus(golds)
    if args.sample:
        cases = cases[:: args.sample]
    print(f"{len(cases)} cases; families: {dict(Counter(c.family.split('/')[0] for c in cases))}", flush=True)
    results: dict[str, Any] = {"timeout_cpu_s": args.timeout, "hogs": args.hogs, "cpus": os.cpu_count()}
    results["idle"] = run_pass(cases, args.timeout)
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.hogs)]
    try:
        time.sleep(1)
        results["hog"] = run_pass(cases, args.timeout)
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    idle_v, hog_v = results["idle"].pop("verdicts"), results["hog"].pop("verdicts")
    results["verdicts_idle"] = idle_v  # per case, in corpus order: a later run's decisions compare case by case
    differ = [i for i, (a, b) in enumerate(zip(idle_v, hog_v)) if a != b]
    results["verdicts_identical"] = not differ
    results["verdict_differences"] = [(cases[i].family, idle_v[i], hog_v[i]) for i in differ[:20]]
    results["kill_parent"] = kill_parent_check()
    atomic_write_json(args.out, results)

    rows = ["cases", "wall_s", "load_avg_1m", "crashes", "p50_ms", "p99_ms", "max_ms", "timeouts", "cached_timeouts",
            "stalls", "errors", "verify_calls", "worker_starts", "worker_peak_rss_mb", "self_peak_rss_mb", "orphans"]
    print(f"| {'':20s} | {'idle':>10s} | {'hog':>10s} |")
    print(f"|{'-' * 22}|{'-' * 12}|{'-' * 12}|")
    for r in rows:
        a, b = results["idle"][r], results["hog"][r]
        fmt = (lambda x: f"{x:10.1f}") if isinstance(a, float) else (lambda x: f"{x:10d}")
        print(f"| {r:20s} | {fmt(a)} | {fmt(b)} |")
    print(f"expected verdicts: {results['idle']['expected_verdicts']}; mismatches idle "
          f"{results['idle']['mismatches_by_family']}, hog {results['hog']['mismatches_by_family']}")
    print(f"verdicts identical idle vs hog: {results['verdicts_identical']} {results['verdict_differences']}")
    print(f"kill -9 of a grading parent: {results['kill_parent']}")
    print(f"slowest idle: {results['idle']['slowest']}\nslowest hog: {results['hog']['slowest']}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
