"""What accelerate's DeepSpeed check costs a run that uses no DeepSpeed: the first save of a process.

accelerate's ``extract_model_from_parallel`` (TRL calls it when the trainer starts and on every save) imports
DeepSpeed whenever it is installed, to ask whether the model is a ``DeepSpeedEngine``. This times, in fresh
interpreters that have imported what a run imports (TRL's GRPOTrainer, ictrl's trainer), one save as a run makes
it (``extract_model_from_parallel``, then ``save_pretrained`` of a tiny Qwen2) twice: the first save of the process
and the next. Mode ``plain`` leaves accelerate's check as it is (DeepSpeed imported on the first save); mode
``sys-modules`` answers the check from ``sys.modules`` (DeepSpeed not imported). The modes alternate, --repeats
processes each. Also records whether DeepSpeed ended up imported and what its import printed.

    PYTHONPATH=src .venv/bin/python bench/bench_deepspeed_import.py --repeats 5

Writes bench/results/deepspeed_import.json atomically.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from ictrl.files import atomic_write_json

RESULTS = Path(__file__).resolve().parent / "results" / "deepspeed_import.json"
MODES = ("plain", "sys-modules")

WORKER = r"""
import json, sys, tempfile, time
t_start = time.perf_counter()
import accelerate.utils.other as other
from accelerate.utils import extract_model_from_parallel
from trl import GRPOTrainer  # noqa: F401  (what a run has imported before its first save)
from ictrl.engine.trainer import ICTGRPOTrainer  # noqa: F401
from ictrl.models import build_byte_tokenizer, build_tiny_qwen2
if sys.argv[1] == "sys-modules":
    other.is_deepspeed_available = lambda: "deepspeed" in sys.modules
model = build_tiny_qwen2(build_byte_tokenizer())
t_imported = time.perf_counter()
saves = []
with tempfile.TemporaryDirectory() as out:
    for i in range(2):
        t0 = time.perf_counter()
        extract_model_from_parallel(model).save_pretrained(f"{out}/{i}")
        saves.append(time.perf_counter() - t0)
print("RESULT " + json.dumps({"saves": saves, "imports": t_imported - t_start,
                              "deepspeed_imported": "deepspeed" in sys.modules}))
"""


def run_once(mode: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", WORKER, mode], capture_output=True, text=True, env=env,
                          timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"{mode}: worker failed\n{done.stderr[-3000:]}")
    lines = (done.stdout + done.stderr).splitlines()
    (result,) = [json.loads(x[len("RESULT "):]) for x in lines if x.startswith("RESULT ")]
    result["other_output"] = [x for x in lines if not x.startswith("RESULT ")][-20:]
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=RESULTS)
    a = ap.parse_args()
    runs: dict[str, list[dict]] = {m: [] for m in MODES}
    for r in range(a.repeats):
        for mode in (MODES if r % 2 == 0 else MODES[::-1]):
            runs[mode].append(run_once(mode))
            first, second = runs[mode][-1]["saves"]
            print(f"repeat {r} {mode:12s} first save {first:.3f} s, second {second:.3f} s", flush=True)
    summary = {}
    for mode, rs in runs.items():
        summary[mode] = {"first_save_median_s": statistics.median(x["saves"][0] for x in rs),
                         "second_save_median_s": statistics.median(x["saves"][1] for x in rs),
                         "deepspeed_imported": sorted({x["deepspeed_imported"] for x in rs}),
                         "output_of_one_process": rs[0]["other_output"]}
    extra = [p["saves"][0] - s["saves"][0] for p, s in zip(runs["plain"], runs["sys-modules"])]
    summary["first_save_extra_s_per_repeat"] = extra
    summary["first_save_extra_median_s"] = statistics.median(extra)
    print(json.dumps({k: v for k, v in summary.items()}, indent=1))
    atomic_write_json(a.out, {"repeats": a.repeats, "runs": runs, "summary": summary})


if __name__ == "__main__":
    main()
