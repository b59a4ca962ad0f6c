"""``results.md``: an evaluation's summary (:func:`ictrl.eval.harness.summarize`) as a table in the paper's layout."""

from __future__ import annotations

import math
from typing import Any

# A benchmark's generation settings, in the order results.md shows them.
GENERATION_FIELDS = ("max_new_tokens", "temperature", "top_p")


def _cell(stat: dict[str, Any], seeds: int) -> str:
    text = f"{100 * stat['mean']:.2f}"
    if seeds > 1:
        std = stat["std"]
        text += f" ± {100 * std:.2f}" if std is not None and math.isfinite(std) else ""
    low, high = stat["ci"]
    return text + f" [{100 * low:.1f}, {100 * high:.1f}]"


def _generation_text(generation: dict[str, dict[str, Any]]) -> str:
    """``max_new_tokens=4096, temperature=0.6, top_p=0.95`` once when every benchmark shares it, else per benchmark."""
    def text(gen: dict[str, Any]) -> str:
        return ", ".join(f"{f}={gen[f]}" for f in GENERATION_FIELDS)

    distinct = {text(g) for g in generation.values()}
    if len(distinct) == 1:
        return distinct.pop()
    return "; ".join(f"{name}: {text(g)}" for name, g in generation.items())


def format_markdown(summary: dict[str, Any]) -> str:
    """The paper's layout: rows are benchmarks, columns P@k; then Avg and Total = mean of the Avg columns."""
    settings = summary["settings"]
    ks = [str(k) for k in settings["ks"]]
    seeds = len(settings["seeds"])
    spread = f"mean ± std over {seeds} seeds, " if seeds > 1 else ""
    run = "".join(f", {label}={settings[key]}" for key, label in (("method", "method"), ("train_seed", "train seed"))
                  if settings.get(key) is not None)
    lines = [
        f"Model `{settings['model']}`{run}: n={settings['n']}, seeds={list(settings['seeds'])}; "
        f"generation {_generation_text(settings['generation'])}.",
        f"Scores in %, {spread}[{100 * settings['ci']:.0f}% bootstrap CI over problems].",
        "",
        "| Benchmark | Problems | " + " | ".join(f"P@{k}" for k in ks) + " |",
        "|---|---:|" + "---:|" * len(ks),
    ]
    for name, bench in summary["benchmarks"].items():
        lines.append(f"| {name} | {bench['num_problems']} | "
                     + " | ".join(_cell(bench["pass_at_k"][k], seeds) for k in ks) + " |")
    avg = summary["average"]
    lines.append(f"| **Avg** | {avg['num_problems']} | "
                 + " | ".join(_cell(avg["pass_at_k"][k], seeds) for k in ks) + " |")
    total_label = " + ".join(f"avg P@{k}" for k in ks)
    lines.append(f"| **Total** = ({total_label}) / {len(ks)} | | {_cell(summary['total'], seeds)} |"
                 + " |" * (len(ks) - 1))
    return "\n".join(lines) + "\n"
