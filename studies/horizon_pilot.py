"""Pilot for the long-horizon settings: the mean π (sampled token's probability) at ICT's selected tokens at the
start of training, the number a setting must bring to <= 0.5 to sit in the paper's regime.

One ICT run (seed 999, not a study seed) at the setting's tuned ICT lr and normaliser, Θ = 2, for Θ + 5 steps;
prints the per-step mean π at the selected tokens after Θ, all-token H1, the selected tokens' high-H1 share and the
reward as one JSON line. With ``--base-eval N`` it first measures the base's held-out pass@1/4/16 on the first N
test problems x 16 samples (a harder setting must leave pass@16 well below its ceiling). Usage (a cached base is
reused, a missing one is built first):

    OMP_NUM_THREADS=1 python -m studies.horizon_pilot countdown-lesstrained --temperature 1.0 --out /tmp/pilot
    OMP_NUM_THREADS=1 python -m studies.horizon_pilot studies/horizon/paths-hard.json --base-eval 100 --out /tmp/p
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from studies.protocols import horizon as hz
from ictrl.experiments.grid import runner as grid
from ictrl.experiments.grid import tinyrun
from studies.horizoncli import base_recipe
from ictrl.experiments.tasks.tinymodel import TinyRecipe, build_tiny_base
from ictrl.files import load_metrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("setting", help="a setting file or the name of one in studies/horizon/")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--out", type=Path, required=True, help="a new directory for the pilot run")
    parser.add_argument("--base-eval", type=int, default=0, metavar="N",
                        help="also the base's pass@1/4/16 on N test problems x 16 samples (default: skip)")
    args = parser.parse_args()
    setting = hz.load_setting(args.setting)
    base = build_tiny_base(TinyRecipe(**base_recipe(setting, False)))
    lr, norm = setting.tuned["ict"]
    rl = tinyrun.TinyRL(temperature=args.temperature, steps=hz.SELECTION_WARMUP + hz.START_STEPS,
                        prompts_per_step=hz.PROMPTS_PER_STEP, num_generations=8,
                        selection_warmup=hz.SELECTION_WARMUP, eval_problems=8, eval_n=16, eval_ks=hz.EVAL_KS)
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    base_passk = None
    if args.base_eval:
        probe = tinyrun.TinyRL(temperature=args.temperature, eval_problems=args.base_eval, eval_n=hz.EVAL_N,
                               eval_ks=hz.EVAL_KS)
        result = tinyrun.eval_tiny_base(probe, base, args.out / "base")
        base_passk = {f"p{k}": result.get(f"p{k}") for k in hz.EVAL_KS}
    tinyrun.train_tiny(rl, base, grid.RunSpec("ict", 999, lr, norm=norm), args.out)
    rec = load_metrics(args.out / "metrics.jsonl")
    after = [r for r in rec if r.get("step", 0) > hz.SELECTION_WARMUP]
    pis = [r["ictrl/prob/selected"] for r in after if "ictrl/prob/selected" in r]
    print(json.dumps({"setting": setting.name, "temperature": args.temperature, "base": base.name,
                      "base_passk": base_passk, "pi_selected": pis, "mean_pi_selected": sum(pis) / len(pis),
                      "h1_all": [r["ictrl/h1/all"] for r in rec if "ictrl/h1/all" in r],
                      "high_h1_share_selected": [r["ictrl/selected/high_entropy_frac"] for r in after
                                                 if "ictrl/selected/high_entropy_frac" in r],
                      "reward": [r["reward"] for r in rec if isinstance(r.get("reward"), float)],
                      "seconds": time.perf_counter() - start}))


if __name__ == "__main__":
    main()
