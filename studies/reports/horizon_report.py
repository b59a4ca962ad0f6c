"""The long-horizon report (``python -m studies compare --horizon``): answer first, then collapse / explosion steps per
method, final pass@k with Welch intervals, the selected tokens' π and entropy against the paper's description, and
the curves with seed bands (H1, H2, purity of all and of selected tokens, reward, held-out pass@k, pass@16 − pass@1).

The collapse / explosion definitions are ``protocols.horizon.DEFINITIONS``; the report prints them with the commit that
fixed them (``DEFINITIONS_COMMIT``) and says so if the text no longer matches that commit's (``DEFINITIONS_SHA``).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from studies.protocols import horizon as hz
from ictrl.experiments.grid import runner as grid
from ictrl.experiments.reports import figures, report, stats_tests
from ictrl.files import atomic_write_bytes, atomic_write_text, load_metrics

DEFINITIONS_COMMIT = "41bd2877f7bfcf71cc5720a9a0d02d7b97a38828"
DEFINITIONS_SHA = "f79af8853dad29bf"  # sha256(DEFINITIONS)[:16] at that commit
PAPER = "the paper's ICT tokens: π 0.18 ± 0.09, about half at high-entropy positions"
GAP_KEY = "eval/avg/pass@16-1"  # derived: pass@16 − pass@1 at each evaluation
CURVES = {
    "reward": "reward",
    "H1 entropy, all tokens (nats)": "ictrl/h1/all",
    "H1 entropy, selected tokens (nats)": "ictrl/h1/selected",
    "H2 Renyi entropy, all tokens (nats)": "ictrl/h2/all",
    "H2 Renyi entropy, selected tokens (nats)": "ictrl/h2/selected",
    "purity beta, all tokens": "ictrl/purity/all",
    "purity beta, selected tokens": "ictrl/purity/selected",
    "pi of the selected tokens": "ictrl/prob/selected",
    "held-out pass@1": "eval/avg/pass@1",
    "held-out pass@16": "eval/avg/pass@16",
    "held-out pass@16 - pass@1 (diversity)": GAP_KEY,
}
SELECTED = {"π sel": "ictrl/prob/selected", "H1 sel": "ictrl/h1/selected",
            "high-H1 share": "ictrl/selected/high_entropy_frac", "H1 all": "ictrl/h1/all"}
# The entropy table beside H1: (column, key) for H1, H2 and purity of all and of the selected tokens.
ENTROPIES = {"H1 all": "ictrl/h1/all", "H2 all": "ictrl/h2/all", "purity all": "ictrl/purity/all",
             "H1 sel": "ictrl/h1/selected", "H2 sel": "ictrl/h2/selected", "purity sel": "ictrl/purity/selected"}


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values) if values else math.nan


def mean_ci(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float | None, float | None]:
    """Mean with a t-interval over seeds (None edges for fewer than two values)."""
    from scipy import stats

    sd = stats_tests.sample_std(list(values))
    m = _mean(values)
    if sd is None:
        return m, None, None
    half = float(stats.t.ppf(0.5 + confidence / 2, len(values) - 1)) * sd / math.sqrt(len(values))
    return m, m - half, m + half


def window(records: Sequence[dict[str, Any]], key: str, after: int, first: int | None = None,
           last: int | None = None) -> float:
    """Mean of ``key`` over the first ``first`` (or last ``last``) logged steps > ``after``."""
    values = [float(r[key]) for r in records if isinstance(r.get(key), (int, float)) and r.get("step", 0) > after]
    values = values[:first] if first is not None else values[-last:] if last is not None else values
    return _mean(values)


def run_summary(records: list[dict[str, Any]], result: dict[str, Any], theta: int) -> dict[str, Any]:
    out: dict[str, Any] = {"collapse": hz.collapse_step(records),
                           "explosion": hz.explosion_step(records, diverged=bool(result.get("diverged"))),
                           "steps": result.get("steps"), **{k: result.get(k) for k in ("p1", "p4", "p16")}}
    for label, key in {**SELECTED, **ENTROPIES}.items():
        out[f"{label} start"] = window(records, key, theta, first=hz.START_STEPS)
        out[f"{label} end"] = window(records, key, theta, last=hz.WINDOW)
    out["renyi2"] = hz.renyi2_control(records)
    return out


def ci_text(values: Sequence[float], digits: int = 0) -> str:
    m, lo, hi = mean_ci(values)
    return f"{m:.{digits}f}" + ("" if lo is None else f" [{lo:.{digits}f}, {hi:.{digits}f}]")


def event_text(steps: Sequence[int | None], n: int) -> str:
    """'none within N steps' or 'k/n seeds; mean step [95% CI] over those'."""
    hit = [s for s in steps if s is not None]
    if not hit:
        return f"none within {n} steps (0/{len(steps)} seeds)"
    rest = "" if len(hit) == len(steps) else f"; the other {len(steps) - len(hit)} none within {n} steps"
    return f"{len(hit)}/{len(steps)} seeds, step {ci_text(hit)}{rest}"


def _gap(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for r in records:
        if isinstance(r.get("eval/avg/pass@16"), (int, float)) and isinstance(r.get("eval/avg/pass@1"), (int, float)):
            r = {**r, GAP_KEY: r["eval/avg/pass@16"] - r["eval/avg/pass@1"]}
        out.append(r)
    return out


def _diff(a: Sequence[float], b: Sequence[float]) -> str:
    d = stats_tests.welch_diff([100 * x for x in a], [100 * x for x in b])
    return str(d) + ("" if d.p is None else f" (p = {d.p:.3f})")


VERDICT_RULE = (
    "Verdict rule (fixed with the report, before the full runs): a method collapses when most of its seeds do. "
    "Supported: GRPO collapses; ICT does not (or every ICT seed collapses later than every GRPO seed); no ICT seed "
    "explodes; and ICT's final pass@16 is not below GRPO's beyond seed noise (the Welch 95% interval of ict − grpo "
    "reaches 0). Random10 is the control: if it also avoids the collapse, sparsity rather than the JS score explains "
    "it. If GRPO does not collapse, the setting cannot show the claim."
)


def js_matters(lrs: dict[str, tuple[float, str]] | None) -> str:
    """The conclusion when random10 fails where ICT holds: the JS score matters, unless the two ran at different
    learning rates (each at its own tuned one), when the lr is an explanation as good."""
    ict, rand = (lrs or {}).get("ict", (None, ""))[0], (lrs or {}).get("random10", (None, ""))[0]
    if ict is None or rand is None or ict == rand:
        return "so the JS score matters here"
    return (f"but random10 ran at lr {rand:g} and ICT at {ict:g}, so the learning rate explains it as well as the "
            "JS score could")


def verdict(summ: dict[str, list[dict[str, Any]]], n: int, lrs: dict[str, tuple[float, str]] | None = None) -> str:
    """The answer to the paper's claim under ``VERDICT_RULE``; ``lrs``: each method's (lr, normaliser)."""
    def count(m: str, key: str) -> int:
        return sum(1 for r in summ.get(m, []) if r[key] is not None)

    def collapses(m: str) -> bool:
        return 2 * count(m, "collapse") > len(summ[m])

    seeds = len(summ["grpo"])
    if not collapses("grpo"):
        return (f"GRPO's entropy did not collapse within {n} steps in most seeds ({count('grpo', 'collapse')}/"
                f"{seeds}), so this setting cannot show ICT preventing a collapse.")
    ict_c, ict_e = count("ict", "collapse"), count("ict", "explosion")
    grpo_last = max(r["collapse"] or 0 for r in summ["grpo"])
    later = not collapses("ict") or all(r["collapse"] is not None and r["collapse"] > grpo_last for r in summ["ict"])
    p16 = stats_tests.welch_diff([r["p16"] for r in summ["ict"]], [r["p16"] for r in summ["grpo"]])
    keeps = p16.hi is None or p16.hi >= 0
    if later and ict_e == 0 and keeps:
        control = ("random10 avoided it as well, so sparsity, not the JS score, explains it"
                   if not collapses("random10") else f"random10 collapsed, {js_matters(lrs)}")
        return (f"Supported here: GRPO collapsed, ICT did not (or later than every GRPO seed) and did not explode, "
                f"and its pass@16 is not below GRPO's; {control}.")
    why = []
    if not later:
        why.append(f"ICT collapsed too ({ict_c}/{len(summ['ict'])} seeds, not later than GRPO)")
    if ict_e:
        why.append(f"ICT exploded in {ict_e}/{len(summ['ict'])} seeds")
    if not keeps:
        why.append("ICT's final pass@16 is below GRPO's beyond seed noise")
    return "Not supported here: " + "; ".join(why) + "."


def renyi2_verdict(summ: dict[str, list[dict[str, Any]]], lrs: dict[str, tuple[float, str]] | None = None) -> str:
    """The Rényi-2 half of the claim under ``protocols.horizon.RENYI2_DEFINITION``; ``lrs`` as for :func:`verdict`."""
    def count(m: str) -> int:
        return sum(1 for r in summ.get(m, []) if r["renyi2"]["controls"])

    def controls(m: str) -> bool:
        return 2 * count(m) > len(summ[m])

    seeds = ", ".join(f"{m} {count(m)}/{len(summ[m])}" for m in summ)
    if controls("ict") and not controls("grpo"):
        control = ("random10 controls it as well, so sparsity, not the JS score, explains it"
                   if controls("random10") else f"random10 does not, {js_matters(lrs)}")
        return f"Rényi-2 half: supported here (seeds that control Rényi-2: {seeds}); {control}."
    if not controls("ict"):
        held = sum(1 for r in summ["ict"] if r["renyi2"]["h2_held"])
        lowered = sum(1 for r in summ["ict"] if r["renyi2"]["h1_lowered"])
        return (f"Rényi-2 half: not supported here: ICT does not control Rényi-2 in most seeds (H1 lowered in "
                f"{lowered}/{len(summ['ict'])}, H2 held in {held}/{len(summ['ict'])}; seeds that control it: {seeds}).")
    return (f"Rényi-2 half: not shown here: GRPO controls Rényi-2 as well as ICT (seeds that control it: {seeds}), "
            "so this setting cannot separate them.")


def _renyi_table(summ: dict[str, list[dict[str, Any]]]) -> str:
    rows = ["| method | seeds that control Rényi-2 | H1 lowered | H2 held | last rolling H1 / start "
            "| lowest rolling H2 / start |", "|---|---|---|---|---|---|"]
    for m, rs in summ.items():
        rr = [r["renyi2"] for r in rs]
        n = len(rr)

        def ratio(key: str) -> str:
            values = [x[key] for x in rr if x[key] is not None]
            return ci_text(values, 2) if values else "–"

        rows.append(f"| {m} | {sum(1 for x in rr if x['controls'])}/{n} | {sum(1 for x in rr if x['h1_lowered'])}/{n}"
                    f" | {sum(1 for x in rr if x['h2_held'])}/{n} | {ratio('h1_end_ratio')} | {ratio('h2_min_ratio')} |")
    return "\n".join(rows)


def _entropy_table(summ: dict[str, list[dict[str, Any]]]) -> str:
    rows = ["| method | " + " | ".join(ENTROPIES) + " |", "|---|" + "---|" * len(ENTROPIES)]
    for m, rs in summ.items():
        rows.append(f"| {m} | " + " | ".join(
            f"{ci_text([r[f'{c} start'] for r in rs], 3)} → {ci_text([r[f'{c} end'] for r in rs], 3)}"
            for c in ENTROPIES) + " |")
    return "\n".join(rows)


COMPACT = "metrics.json.gz"  # what the report is rendered from, small enough to keep beside it
RECORD_KEYS = tuple(dict.fromkeys(("step", "loss", "reward", "eval/avg/pass@4", *CURVES.values(),
                                   *SELECTED.values(), *ENTROPIES.values(), hz.H1_KEY, hz.H2_KEY)))
DIGITS = 6  # significant digits kept per logged value: the report prints at most 3 decimals of quantities <= ~3


def _keep(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for r in records:
        row = {k: (float(f"{v:.{DIGITS}g}") if isinstance(v, float) else v) for k, v in r.items()
               if k in RECORD_KEYS and k != GAP_KEY}
        if len(row) > 1:
            out.append(row)
    return out


def compact(out: Path, name: str, setting: hz.Setting, specs: list[grid.RunSpec], results: dict[grid.RunSpec, Any],
            base: dict[str, Any], warm: dict[str, Any], stops: dict[int, int], n: int, rl: Any,
            plan: dict[str, Any], seconds: float, quick: bool = False) -> dict[str, Any]:
    """Everything :func:`render` reads, from a finished study's directory ``out``: each run's logged rows (the keys
    the report uses, ``DIGITS`` significant digits) and result, and the study's settings."""
    import dataclasses

    probe_extra = sum(float(json.loads((out / "probe" / s.relpath / grid.DONE_FILE).read_text())["seconds"])
                      for s in specs if s.method == hz.PROBE_METHOD and stops.get(s.seed) != n
                      and (out / "probe" / s.relpath / grid.DONE_FILE).exists())
    return {"name": name, "setting": dataclasses.asdict(setting), "base": base,
            "warm": {k: warm[k] for k in ("recipe", "best_step", "best_dev_pass1", "seconds")},
            "stops": {str(k): v for k, v in stops.items()}, "n": n,
            "rl": dataclasses.asdict(rl) if dataclasses.is_dataclass(rl) else dict(rl), "plan": plan,
            "seconds": seconds, "probe_extra_seconds": probe_extra, "quick": quick,
            "runs": [{"method": s.method, "seed": s.seed, "lr": s.lr, "norm": s.norm, "result": results[s],
                      "records": _keep(load_metrics(out / "runs" / s.relpath / "metrics.jsonl"))} for s in specs]}


def write(out: Path, name: str, setting: hz.Setting, specs: list[grid.RunSpec], results: dict[grid.RunSpec, Any],
          base: dict[str, Any], warm: dict[str, Any], stops: dict[int, int], n: int, rl: Any, plan: dict[str, Any],
          seconds: float, quick: bool = False) -> dict[str, Path]:
    """``COMPACT`` (:func:`compact`), then the report rendered from it (:func:`render`)."""
    import gzip

    data = compact(out, name, setting, specs, results, base, warm, stops, n, rl, plan, seconds, quick)
    blob = gzip.compress(json.dumps(data, separators=(",", ":"), default=str).encode(), mtime=0)
    atomic_write_bytes(out / COMPACT, blob)
    return render(out, data)


def render(out: Path, data: dict[str, Any]) -> dict[str, Path]:
    """``results.md``, ``results.json``, the curves and ``report.html`` in ``out`` from :func:`compact`'s data."""
    from types import SimpleNamespace

    name, base, warm, n, plan, quick = (data[k] for k in ("name", "base", "warm", "n", "plan", "quick"))
    setting = SimpleNamespace(**data["setting"])
    rl = SimpleNamespace(**data["rl"])
    stops = {int(k): int(v) for k, v in data["stops"].items()}
    theta = int(rl.selection_warmup or 0)
    runs = {m: [_gap(r["records"]) for r in data["runs"] if r["method"] == m] for m in hz.METHODS}
    summ = {m: [run_summary(r["records"], r["result"], theta) for r in data["runs"] if r["method"] == m]
            for m in hz.METHODS}
    lrs = {r["method"]: (r["lr"], r["norm"] or "default") for r in data["runs"]}
    answer, tables = _answer(name, setting, summ, stops, n, base, lrs), _tables(summ, lrs, n, base)
    tables.insert(1, ("Held-out pass@16 − pass@1 during training (percent points, mean over seeds; the first "
                      f"{plan['curve_problems']} test problems)", _over_time(runs)))
    images = figures.plot_curves(runs, CURVES, out_dir=out)
    defs_ok = hashlib.sha256(hz.DEFINITIONS.encode()).hexdigest()[:16] == DEFINITIONS_SHA
    run_seconds = sum(float(r["result"]["seconds"]) for r in data["runs"])
    probe_extra, seconds = float(data["probe_extra_seconds"]), float(data["seconds"])
    notes = [
        f"Definitions (fixed in commit {DEFINITIONS_COMMIT}"
        + ("" if defs_ok else "; WARNING: the text below differs from that commit's") + f"): {hz.DEFINITIONS}",
        BEATS_RULE,
        VERDICT_RULE,
        hz.RENYI2_DEFINITION,
        f"Setting {name}: {setting.why}. Base model: task {warm['recipe']['task']}, warm start stopped at step "
        f"{warm['best_step']} (best dev pass@1 {warm['best_dev_pass1']:.3f}), built in {warm['seconds']:.0f} s.",
        f"Protocol: seeds {sorted(stops)}; {rl.prompts_per_step} prompts x {rl.num_generations} samples per "
        f"generation batch, {rl.num_iterations} optimizer steps per batch, Θ = {theta}; each method at the tuned "
        f"setting ({setting.tuned_source or 'the setting file'}). Horizon N = {n} (GRPO seeds stopped at "
        f"{stops}; minimum {plan['min_steps']}, cap {plan['cap']}). Held-out pass@k "
        f"(k = {', '.join(map(str, hz.EVAL_KS))}) "
        f"every {plan['eval_every']} steps on the first {plan['curve_problems']} test problems x {hz.EVAL_N} samples "
        f"and at the end on {plan['eval_problems']} x {hz.EVAL_N}; temperature {rl.temperature:g}.",
        f"Time: training and evaluation summed over the runs {run_seconds:.0f} s (+ {probe_extra:.0f} s of GRPO "
        f"probe runs rerun to N); this invocation's wall time {seconds:.0f} s.",
        "Start / end of a selected-token column: mean over the first 5 steps after Θ / the last 10 steps. π is the "
        "sampled token's probability; high-H1 share: the selected tokens' share above the median H1 of all tokens.",
    ]
    if quick:
        notes.insert(0, "--quick: a tiny plumbing run, not a result.")
    head = ["QUICK RUN (--quick): NOT A RESULT"] if quick else []
    md = "\n\n".join(head + [f"# Long horizon: {name}", answer] + [f"## {h}\n\n{t}" for h, t in tables]
                     + ["## How the numbers were made"] + notes) + "\n"
    table_path = atomic_write_text(out / "results.md", md)
    atomic_write_text(out / "results.json", json.dumps(
        {"setting": name, "steps": n, "grpo_stop_steps": stops, "base": base, "summary": summ,
         "wall_seconds_this_invocation": seconds, "run_seconds": run_seconds, "definitions": hz.DEFINITIONS,
         "definitions_commit": DEFINITIONS_COMMIT, "renyi2_definition": hz.RENYI2_DEFINITION}, indent=1, default=str) + "\n")
    page = report.render_report(f"Long horizon: {name}", tables, images, "\n\n".join(notes), out / "report.html",
                                note=head[0] if head else "", answer=answer, caveats=[
                                    f"{len(stops)} seeds per method, a 140k-parameter model and a synthetic task",
                                    "collapse / explosion are the rules above, not the paper's own thresholds"])
    return {"table": table_path, "report": page}


def rerender(source: Path, out: Path) -> dict[str, Path]:
    """The report again from a kept ``COMPACT`` file, without the study's run directories."""
    import gzip

    out.mkdir(parents=True, exist_ok=True)
    return render(out, json.loads(gzip.decompress(source.read_bytes())))


BEATS_RULE = ("ICT beats a method on pass@k when the 95% Welch interval of ict − method over seeds (final "
              "held-out pass@k) lies above 0, trails it when the interval lies below 0, and is level otherwise.")


def beats(summ: dict[str, list[dict[str, Any]]], tuned_on: str | None = None, ks: Sequence[int] = (4, 16)) -> str:
    """Does ICT beat each other method on final pass@k (``BEATS_RULE``)? One clause per k. ``tuned_on``: where the
    settings were tuned, when that was not this setting's own task (the answer is then not at matched tuning)."""
    clauses = []
    for k in ks:
        parts = []
        ict = summ["ict"]
        for m, runs in summ.items():
            if runs is ict:
                continue
            d = stats_tests.welch_diff([100 * r[f"p{k}"] for r in ict], [100 * r[f"p{k}"] for r in runs])
            word = ("beats" if d.lo is not None and d.lo > 0 else
                    "trails" if d.hi is not None and d.hi < 0 else "is level with")
            parts.append(f"{word} {m} ({d})")
        clauses.append(f"pass@{k}: ICT " + ", ".join(parts))
    where = f" (tuned {tuned_on}, not on this task)" if tuned_on else ""
    return (f"At each method's tuned setting{where}, on final held-out " + "; ".join(clauses)
            + " (ict − method, points).")


def tuned_elsewhere(name: str, setting: Any) -> str | None:
    """The task a setting's methods were tuned on, when its tuned source names another task's tune report (a report
    is named by the setting or by the task module's last name: tune-countdown for studies.tasks.countdown)."""
    import re

    found = re.search(r"tune-([a-z0-9-]+?)-\d{4}-\d{2}-\d{2}", setting.tuned_source or "")
    task = re.split(r"[.:]", setting.task)[-1]
    return f"on {found.group(1)}" if found and found.group(1) not in (name, task) else None


def _answer(name: str, setting: Any, summ: dict[str, list[dict[str, Any]]], stops: dict[int, int], n: int,
            base: dict[str, Any], lrs: dict[str, tuple[float, str]]) -> str:
    lines = [f"**{beats(summ, tuned_elsewhere(name, setting))}**", f"**{verdict(summ, n, lrs)}**",
             f"**{renyi2_verdict(summ, lrs)}**"]
    lines.append("Collapse (all-token H1 at most 0.2 x its start): " + "; ".join(
        f"{m} {event_text([r['collapse'] for r in summ[m]], n)}" for m in hz.METHODS) + ".")
    lines.append("Explosion: " + "; ".join(
        f"{m} {event_text([r['explosion'] for r in summ[m]], n)}" for m in hz.METHODS) + ".")
    g = {m: [r["p16"] - r["p1"] for r in summ[m]] for m in hz.METHODS}
    lines.append(
        f"Final held-out pass@16 (base {100 * base['p16']:.1f}%): "
        + ", ".join(f"{m} {100 * _mean([r['p16'] for r in summ[m]]):.1f}%" for m in hz.METHODS)
        + f". ict − grpo on pass@16 {_diff([r['p16'] for r in summ['ict']], [r['p16'] for r in summ['grpo']])} "
        f"points, ict − random10 {_diff([r['p16'] for r in summ['ict']], [r['p16'] for r in summ['random10']])}; "
        f"pass@16 − pass@1 (base {100 * (base['p16'] - base['p1']):.1f}): ict − grpo {_diff(g['ict'], g['grpo'])}, "
        f"ict − random10 {_diff(g['ict'], g['random10'])} (95% Welch CIs over seeds).")
    ict = summ["ict"]
    pi0 = ci_text([r["π sel start"] for r in ict], 2)
    lines.append(
        f"ICT's selected tokens: π {pi0} at the start, {ci_text([r['π sel end'] for r in ict], 2)} at the end; "
        f"H1 {ci_text([r['H1 sel start'] for r in ict], 2)} → {ci_text([r['H1 sel end'] for r in ict], 2)} nats; "
        f"high-H1 share {ci_text([r['high-H1 share start'] for r in ict], 2)} → "
        f"{ci_text([r['high-H1 share end'] for r in ict], 2)} ({PAPER}). Mean π at the start "
        + ("≤ 0.5: the paper's regime." if _mean([r["π sel start"] for r in ict]) <= 0.5 else
           "> 0.5: not the paper's regime."))
    return "\n\n".join(lines)


def _over_time(runs: dict[str, list[list[dict[str, Any]]]]) -> str:
    """method x evaluation step table of the mean pass@16 − pass@1 over seeds."""
    per: dict[str, dict[int, list[float]]] = {m: {} for m in runs}
    for m, seeds in runs.items():
        for records in seeds:
            for r in records:
                if isinstance(r.get(GAP_KEY), (int, float)):
                    per[m].setdefault(int(r["step"]), []).append(100 * float(r[GAP_KEY]))
    steps = sorted({s for d in per.values() for s in d})
    lines = ["| method | " + " | ".join(f"step {s}" for s in steps) + " |", "|---|" + "---|" * len(steps)]
    for m, d in per.items():
        lines.append(f"| {m} | " + " | ".join(f"{_mean(d[s]):.1f}" if s in d else "" for s in steps) + " |")
    return "\n".join(lines)


def _tables(summ: dict[str, list[dict[str, Any]]], lrs: dict[str, tuple[float, str]], n: int,
            base: dict[str, Any]) -> list[tuple[str, str]]:
    rows = ["| method | lr | normaliser | collapse | explosion | H1 all start → end | P@1 | P@4 | P@16 "
            "| P@16 − P@1 |",
            "|---|---|---|---|---|---|---|---|---|---|",
            f"| base | | | | | | {100 * base['p1']:.1f} | {100 * base['p4']:.1f} | {100 * base['p16']:.1f} | "
            f"{100 * (base['p16'] - base['p1']):.1f} |"]
    for m, rs in summ.items():
        pct = {k: ci_text([100 * r[k] for r in rs], 1) for k in ("p1", "p4", "p16")}
        rows.append(f"| {m} | {lrs[m][0]:g} | {lrs[m][1]} | {event_text([r['collapse'] for r in rs], n)} | "
                    f"{event_text([r['explosion'] for r in rs], n)} | {ci_text([r['H1 all start'] for r in rs], 3)}"
                    f" → {ci_text([r['H1 all end'] for r in rs], 3)} | {pct['p1']} | {pct['p4']} | {pct['p16']} | "
                    f"{ci_text([100 * (r['p16'] - r['p1']) for r in rs], 1)} |")
    sel = ["| method | π sel start | π sel end | H1 sel start | H1 sel end | high-H1 share start "
           "| high-H1 share end |",
           "|---|---|---|---|---|---|---|"]
    for m, rs in summ.items():
        sel.append(f"| {m} | " + " | ".join(ci_text([r[f'{c} {w}'] for r in rs], 3) for c in
                                             ("π sel", "H1 sel", "high-H1 share") for w in ("start", "end")) + " |")
    sel.append("| paper (ICT) | 0.18 ± 0.09 | | | | ~0.5 | |")
    seeds = ["| method | run | steps | collapse step | explosion step | P@1 | P@16 |", "|---|---|---|---|---|---|---|"]
    for m, rs in summ.items():
        for i, r in enumerate(rs):
            seeds.append(f"| {m} | {i} | {r['steps']} | {r['collapse'] or '–'} | {r['explosion'] or '–'} | "
                         f"{100 * r['p1']:.1f} | {100 * r['p16']:.1f} |")
    return [("Per method (mean [95% t-CI] over seeds; pass@k in percent)", "\n".join(rows)),
            ("Selected tokens (mean [95% t-CI] over seeds)", "\n".join(sel)),
            ("H1, H2 and purity of all and of the selected tokens, start → end (mean [95% t-CI] over seeds; nats "
             "for H1 and H2)", _entropy_table(summ)),
            ("Rényi-2 (the definition below; ratios: mean [95% t-CI] over seeds)", _renyi_table(summ)),
            ("Per seed", "\n".join(seeds))]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m studies.reports.horizon_report metrics.json.gz OUT_DIR``: re-render a kept study."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("source", type=Path, help=f"a study's {COMPACT}")
    parser.add_argument("out", type=Path, help="where results.md, results.json, the curves and report.html go")
    args = parser.parse_args(argv)
    print(rerender(args.source, args.out)["table"].read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
