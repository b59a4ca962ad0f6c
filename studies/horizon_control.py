"""A control beside a finished long-horizon study: one method at another (lr, normaliser), on the study's seeds,
horizon N, plan and base model, compared with the study's runs of a method (ICT by default).

The protocol runs each method at its own tuned learning rate, so two methods can differ by their lr as well as by
their tokens; this script runs, say, random10 at ICT's lr to separate the two. It is an analysis added beside a
study, not part of the protocol fixed before it. Resumable like the study (``done.json`` per run); writes
``control.md`` to ``--out``. Usage:

    OMP_NUM_THREADS=1 python -m studies.horizon_control paths --study runs/horizon-paths \\
        --method random10 --lr 2e-4 --norm per_response_all --jobs 2 --out runs/horizon-paths-random10-lr2e-4
"""

from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path

from studies.protocols import horizon as hz
from ictrl.experiments.grid import runner as grid
from ictrl.experiments.grid import tinyrun
from studies.horizoncli import base_recipe, plan, rl_settings
from studies.reports import horizon_report as hr
from ictrl.experiments.reports import stats_tests
from ictrl.experiments.tasks.tinymodel import TinyRecipe, build_tiny_base
from ictrl.files import atomic_write_text, load_metrics

ROWS = (("P@1", "p1", 100, 1), ("P@4", "p4", 100, 1), ("P@16", "p16", 100, 1), ("H1 all start", "H1 all start", 1, 3),
        ("H1 all end", "H1 all end", 1, 3), ("π sel start", "π sel start", 1, 3), ("π sel end", "π sel end", 1, 3))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("setting", help="a setting file or the name of one in studies/horizon/")
    parser.add_argument("--study", type=Path, required=True, help="the finished study's --output-dir")
    parser.add_argument("--method", required=True, choices=hz.METHODS)
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--norm", default=None, help="loss normaliser (default: the method's own)")
    parser.add_argument("--against", default="ict", choices=hz.METHODS, help="the study's method to compare with")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="beside a --quick study (tests)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    summary_path = args.study / "results.json"
    if not summary_path.is_file():
        parser.error(f"--study {args.study}: no results.json; finish the study first "
                     "(python -m studies compare --horizon)")
    study = json.loads(summary_path.read_text())
    setting = hz.load_setting(args.setting)
    if study["setting"] != setting.name:
        parser.error(f"--study {args.study} is setting {study['setting']!r}, not {setting.name!r}")
    p, n = plan(args.quick, setting), int(study["steps"])
    if sorted(int(seed) for seed in study["grpo_stop_steps"]) != sorted(p["seeds"]):
        parser.error(f"--study {args.study} ran seeds {sorted(study['grpo_stop_steps'])}, this plan "
                     f"{list(p['seeds'])}: give --quick exactly when the study had it")
    base = build_tiny_base(TinyRecipe(**base_recipe(setting, args.quick)))
    specs = [grid.RunSpec(args.method, seed, args.lr, norm=args.norm) for seed in p["seeds"]]
    results = grid.run_grid(specs, args.out, functools.partial(tinyrun.train_tiny, rl_settings(p, n), base),
                            jobs=args.jobs)
    theta = int(p["rl"]["selection_warmup"] or 0)
    mine = [hr.run_summary(load_metrics(args.out / s.relpath / "metrics.jsonl"), results[s], theta) for s in specs]
    theirs = study["summary"][args.against]
    label = f"{args.method} at lr {args.lr:g} ({args.norm or 'default'})"
    lines = [f"# Control on {setting.name}: {label} against the study's {args.against}", "",
             f"Seeds {list(p['seeds'])}, N = {n} steps, the study's plan and base; mean [95% t-CI] over seeds, "
             f"pass@k in percent ({p['eval_problems']} held-out problems x {hz.EVAL_N} samples). Difference: "
             f"{args.against} − control, 95% Welch CI.", "",
             f"| | {args.against} (study) | {label} | {args.against} − control |", "|---|---|---|---|"]
    for name, key, scale, digits in ROWS:
        a, b = [scale * r[key] for r in theirs], [scale * r[key] for r in mine]
        d = stats_tests.welch_diff(a, b)
        lines.append(f"| {name} | {hr.ci_text(a, digits)} | {hr.ci_text(b, digits)} | {d} |")
    lines += ["", f"Collapse: control {hr.event_text([r['collapse'] for r in mine], n)}; explosion: "
              f"{hr.event_text([r['explosion'] for r in mine], n)}. Run seconds: "
              f"{sum(float(results[s]['seconds']) for s in specs):.0f} summed."]
    text = "\n".join(lines) + "\n"
    atomic_write_text(args.out / "control.md", text)
    print(text)


if __name__ == "__main__":
    main()
