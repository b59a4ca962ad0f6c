"""The page and JSON file of ``ictrl regime`` (``ictrl.experiments.regime``): the verdict line first, then π and H1
at each selection, the paired differences, the overlap with 20-Entropy and where ICT's tokens sit against the
group's first divergence. Both files are written atomically."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ictrl.experiments.reports import report
from ictrl.files import atomic_write_text

ALL = "all"  # the record's name for every response token


def name(label: str) -> str:
    return "all tokens" if label == ALL else label


def ci(cell: dict[str, Any], digits: int = 3) -> str:
    """'mean [lo, hi]' of a summary cell, '–' when it has no values."""
    if cell["mean"] is None:
        return "–"
    if cell["lo"] is None:
        return f"{cell['mean']:.{digits}f}"
    return f"{cell['mean']:.{digits}f} [{cell['lo']:.{digits}f}, {cell['hi']:.{digits}f}]"


def after(before: dict[str, Any]) -> dict[str, Any]:
    """The share after the first divergence: 1 − the share at or before it (its interval mirrored)."""
    if before["mean"] is None:
        return before
    flip = {"lo": None if before["hi"] is None else 1 - before["hi"],
            "hi": None if before["lo"] is None else 1 - before["lo"]}
    return {**before, "mean": 1 - before["mean"], **flip}


def tables(result: dict[str, Any]) -> list[tuple[str, str]]:
    """result: ``selections`` (ICT's label, the controls' (chance first), ``all``), ``pairs`` and ``summary``."""
    summary, labels = result["summary"], result["selections"]
    ict, chance, other = labels[0], labels[1], labels[2]
    sel = ["| tokens | π (sampled-token probability) | H1 (nats) |", "|---|---|---|"]
    sel += [f"| {name(s)} | {ci(summary[f'pi/{s}'])} | {ci(summary[f'h1/{s}'])} |" for s in labels]
    diff = ["| paired per prompt | π | H1 (nats) |", "|---|---|---|"]
    diff += [f"| {a} − {b} | {ci(summary[f'pi/{a}-{b}'])} | {ci(summary[f'h1/{a}-{b}'])} |" for a, b in result["pairs"]]
    where = [f"| tokens | share also picked by {other} | share at or before the first divergence | share after it |",
             "|---|---|---|---|"]
    where += [f"| {s} | {ci(summary[f'overlap/{s}&{other}'])} | {ci(summary[f'before/{s}'])} | "
              f"{ci(after(summary[f'before/{s}']))} |" for s in (ict, chance)]
    return [("π and H1 at each selection (mean [95% t-CI] over prompts)", "\n".join(sel)),
            ("Differences (mean [95% t-CI] of the per-prompt differences)", "\n".join(diff)),
            (f"Where {ict}'s tokens sit ({chance} for chance)", "\n".join(where))]


def notes(result: dict[str, Any]) -> str:
    s, summ = result["settings"], result["summary"]
    return "\n\n".join(part for part in [
        result["verdict_rule"],
        f"Model {s['model']}; prompts {s['prompts']} ({summ['prompts']} prompts, {s['num_generations']} responses "
        f"each, at most {s['max_new_tokens']} new tokens, temperature {s['temperature']:g}; {seeds(s)}); "
        f"{summ['identical_groups']} of {summ.get('groups', summ['prompts'])} groups had identical responses and "
        f"are left out (u = 0 everywhere). Mean response length {ci(summ['tokens_per_response'], 1)} tokens; first "
        f"divergence at position {ci(summ['divergence'], 1)}.",
        f"What to do: {result['verdict']['action']}" if result["verdict"].get("action") else "",
        f"Evidence: {result['verdict']['evidence']}" if result["verdict"].get("evidence") else "",
        "Statistics and selections are the trainer's (ictrl.core.stats.token_stats, ictrl.core.selection.select), "
        "one prompt's responses as one group: ICT the top 10% of each response by JS divergence to the group mean, "
        "random-10% as many per response drawn uniformly, 20-Entropy the top 20% of the group by entropy. A "
        "selection's π and H1 are averaged over its tokens in the group, then over the prompt's seeds, then over "
        "prompts. The first divergence is "
        "the first position where the group's responses differ; up to and including it they share their prefix, "
        "so their distributions agree and u = 0 there.",
        f"Time: {result['seconds']:.0f} s (model load, sampling and scoring"
        + (f", {s['threads']} CPU thread{'s' if s['threads'] != 1 else ''}" if s.get("threads") else "") + ").",
    ] if part)


def seeds(settings: dict[str, Any]) -> str:
    """'sampling seeds 0-2' (or 'seed 0'), with the prompts drawn by the first."""
    first, count = settings["seed"], settings.get("seeds", 1)
    return f"seed {first}" if count == 1 else f"sampling seeds {first}-{first + count - 1}, prompts drawn by {first}"


def _finite(value: Any) -> Any:
    """JSON without NaN/inf (strict parsers refuse them): non-finite floats become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def write_regime_report(out: str | Path, result: dict[str, Any]) -> dict[str, Path]:
    """``out/regime.json`` and ``out/regime.html`` for a :func:`ictrl.experiments.regime.run` result."""
    out = Path(out)
    path = atomic_write_text(out / "regime.json", json.dumps(_finite(result), indent=1, allow_nan=False) + "\n")
    page = report.render_report(
        f"Regime check: {result['settings']['model']} on {result['settings']['prompts']}", tables(result),
        [], notes(result), out / "regime.html", answer=result["verdict"]["line"],
        caveats=[f"{result['summary']['prompts']} prompts, {seeds(result['settings'])}; the verdict is about the "
                 "model before training, and a model's regime can move during RL"])
    return {"json": path, "html": page}
