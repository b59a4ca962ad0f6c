"""``ictrl table``: the paper's Table 1 from ``ictrl eval`` results of several methods x training seeds.

Each run is one ``results.json`` (what ``ictrl eval --output-dir`` writes) or one lm-evaluation-harness results file
(``results_<date>.json``, which ``ictrl eval`` writes beside it: ``ictrl.eval.lmeval``); its ``settings.method`` and
``settings.train_seed`` (read from the trained run's ``config.yaml`` or given by ``--method`` / ``--train-seed``)
place it in the table. A run's score on a benchmark is its pass@k averaged over its evaluation seeds.

Per method and column (each benchmark's P@k, Avg P@k over the benchmarks, Total = mean over k of Avg P@k, so
(Avg P@1 + Avg P@4) / 2 for k = 1, 4): mean ± sample std over training seeds. Then the paired difference of the
target method (ICT) against each other method: per training seed present in both, target − baseline, with a
two-sided CI from Student's t on n − 1 degrees of freedom (``scipy.stats.t``). A baseline with a single run and no
training seed (the base model) is paired with every target seed.

Example::

    ictrl table runs/eval/qwen2.5-1.5b/* --output-dir runs/table/qwen2.5-1.5b
"""

from __future__ import annotations

import argparse
import html
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ictrl.cliargs import CommaList, comma_list
from ictrl.errors import UserError
from ictrl.eval.harness import RESULTS_JSON, _json_safe
from ictrl.eval.lmeval import FILTER, RESULTS_GLOB, generation_of
from ictrl.files import atomic_write_text, check_output_dir, claim_files, reported_write

TABLE_MD, TABLE_JSON, TABLE_HTML = "table.md", "table.json", "table.html"


class TableError(UserError):
    """Bad or inconsistent inputs; the message names the file and field."""


@dataclass
class RunScores:
    """One evaluated model: ``scores[benchmark][k]`` = pass@k mean over its evaluation seeds (a fraction)."""

    path: Path
    method: str
    seed: int | None
    scores: dict[str, dict[str, float]]
    num_problems: dict[str, int]
    generation: dict[str, Any]
    samples: int | None = None  # samples per problem (``ictrl eval --n``)


def find_results(paths: Sequence[str | Path]) -> list[Path]:
    """Each argument is a results file (``results.json`` or lm-evaluation-harness's ``results_<date>.json``), a
    directory holding one, or a directory searched recursively. A directory's ``results.json`` stands for its
    evaluation: the harness files ``ictrl eval`` wrote beside it (one folder down) are the same scores and are
    skipped; of several harness files in one folder (reruns), the latest is taken, as lm-evaluation-harness's
    readers take it (``lm_eval.utils.get_latest_filename``)."""
    found: list[Path] = []
    for arg in paths:
        path = Path(arg)
        if path.is_file():
            found.append(path)
            continue
        if (path / RESULTS_JSON).is_file():
            found.append(path / RESULTS_JSON)
            continue
        own = sorted(path.rglob(RESULTS_JSON)) if path.is_dir() else []
        harness = [p for p in (sorted(path.rglob(RESULTS_GLOB)) if path.is_dir() else [])
                   if not (p.parent / RESULTS_JSON).is_file() and not (p.parent.parent / RESULTS_JSON).is_file()]
        latest = {p.parent: p for p in sorted(harness, key=lambda p: (p.parent, p.name))}
        if not own and not latest:
            raise TableError(f"{path}: no {RESULTS_JSON} (the file `ictrl eval --output-dir` writes) and no "
                             f"lm-evaluation-harness {RESULTS_GLOB}")
        found.extend(own + list(latest.values()))
    return list(dict.fromkeys(p.resolve() for p in found))


def load_run(path: Path) -> RunScores:
    """Read one ``results.json`` (or a harness results file: :func:`load_harness_run`); every missing or malformed
    field is named with the file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as err:  # torn JSON, bytes that are not UTF-8, nested too deep
        raise TableError(f"{path}: cannot read ({err})") from None
    if isinstance(data, dict) and "results" in data and "summary" not in data:
        return load_harness_run(path, data)
    try:
        summary = data["summary"]
        settings, benchmarks = summary["settings"], summary["benchmarks"]
    except (KeyError, TypeError):
        raise TableError(f"{path}: no summary.settings / summary.benchmarks (not an `ictrl eval` result)") from None
    method, seed = _method_and_seed(path, settings, "settings", "; set summary.settings.method in this file to the "
                                    "run's method (e.g. \"grpo\"), or rerun `ictrl eval` with --method NAME")
    scores: dict[str, dict[str, float]] = {}
    for name, bench in benchmarks.items():
        try:
            scores[name] = {str(k): float(v["mean"]) for k, v in bench["pass_at_k"].items()}
        except (KeyError, TypeError, ValueError):
            raise TableError(f"{path}: benchmarks.{name}.pass_at_k: expected {{k: {{mean: number}}}}") from None
        if not all(math.isfinite(v) for v in scores[name].values()):
            raise TableError(f"{path}: benchmarks.{name}.pass_at_k: a mean is not a finite number")
    num = {name: int(bench.get("num_problems", -1)) for name, bench in benchmarks.items()}
    gen = settings.get("generation") or {}
    n = settings.get("n")
    return RunScores(path, str(method), seed, scores, num, gen, n if isinstance(n, int) else None)


def _method_and_seed(path: Path, labels: dict[str, Any], where: str, hint: str) -> tuple[str, int | None]:
    """The training method (required: ``hint`` says how to get one) and seed (an integer or None) a result file
    records under ``where``."""
    method = labels.get("method")
    if not method:
        raise TableError(f"{path}: {where}.method is not set{hint}")
    seed = labels.get("train_seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise TableError(f"{path}: {where}.train_seed: expected an integer or null, got {seed!r}")
    return str(method), seed


def load_harness_run(path: Path, data: dict[str, Any]) -> RunScores:
    """One lm-evaluation-harness results file: ``results[task]["pass@k,none"]``, problems from ``n-samples``,
    generation settings from ``configs[task].generation_kwargs``, samples per problem from ``repeats``, and the
    method and training seed from ``config`` (where ``ictrl eval`` puts them; the harness itself has no method)."""
    config = data.get("config") if isinstance(data.get("config"), dict) else {}
    method, seed = _method_and_seed(path, config, "config", " (lm-evaluation-harness results name no training "
                                    "method; `ictrl eval --method NAME` writes one)")
    scores: dict[str, dict[str, float]] = {}
    num: dict[str, int] = {}
    gen: dict[str, Any] = {}
    repeats: set[Any] = set()
    if not isinstance(data["results"], dict) or not data["results"]:
        raise TableError(f"{path}: results: expected {{task: {{metric,filter: value}}}}")
    for task, metrics in data["results"].items():
        keys = {m.split(",", 1)[0][len("pass@"):]: v for m, v in (metrics or {}).items()
                if m.startswith("pass@") and m.endswith(f",{FILTER}") and "_stderr" not in m}
        if not keys or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in keys.values()):
            raise TableError(f"{path}: results.{task}: no finite pass@k,{FILTER} values")
        scores[task] = {k: float(v) for k, v in keys.items()}
        counts = (data.get("n-samples") or {}).get(task) or {}
        num[task] = int(counts.get("effective", -1))
        task_config = (data.get("configs") or {}).get(task) or {}
        try:
            gen[task] = generation_of(task_config["generation_kwargs"])
        except (KeyError, TypeError):
            gen[task] = None
        repeats.add(task_config.get("repeats"))
    n = repeats.pop() if len(repeats) == 1 else None
    return RunScores(path, str(method), seed, scores, num, gen, n if isinstance(n, int) else None)


def _check_runs(runs: list[RunScores], benchmarks: list[str], ks: list[str]) -> None:
    """Every run covers the same benchmarks (same problem counts, same generation settings) and ks."""
    ref = runs[0]
    seen: dict[tuple[str, int | None], Path] = {}
    for run in runs:
        key = (run.method, run.seed)
        if key in seen:
            label = f"train seed {run.seed}" if run.seed is not None else "no train seed"
            raise TableError(f"{run.path}: method {run.method!r} with {label} is also in {seen[key]}; give each "
                             "run its own --train-seed")
        seen[key] = run.path
        for name in benchmarks:
            if name not in run.scores:
                raise TableError(f"{run.path}: no benchmark {name!r} (it has {sorted(run.scores)}); choose common "
                                 "ones with --benchmarks")
            missing = [k for k in ks if k not in run.scores[name]]
            if missing:
                raise TableError(f"{run.path}: benchmarks.{name}: no pass@{missing[0]}; choose --k from what every "
                                 "run reports")
            if run.num_problems[name] != ref.num_problems[name]:
                raise TableError(f"{run.path}: benchmarks.{name}.num_problems is {run.num_problems[name]}, but "
                                 f"{ref.path} has {ref.num_problems[name]}: the runs evaluated different problems")
            if run.generation.get(name) != ref.generation.get(name):
                raise TableError(f"{run.path}: generation settings of {name} ({run.generation.get(name)}) differ "
                                 f"from {ref.path} ({ref.generation.get(name)})")


def _columns(benchmarks: list[str], ks: list[str]) -> list[dict[str, Any]]:
    cols = [{"key": f"{b}/P@{k}", "group": b, "label": f"P@{k}"} for b in benchmarks for k in ks]
    cols += [{"key": f"avg/P@{k}", "group": "Avg", "label": f"P@{k}"} for k in ks]
    return cols + [{"key": "total", "group": "Total",
                    "label": "(" + " + ".join(f"P@{k}" for k in ks) + f") / {len(ks)}"}]


def _row(run: RunScores, benchmarks: list[str], ks: list[str]) -> np.ndarray:
    """[columns] in the order of :func:`_columns`: per benchmark P@k, Avg P@k, Total."""
    per = np.array([[run.scores[b][k] for k in ks] for b in benchmarks], dtype=np.float64)  # [B, K]
    avg = per.mean(axis=0)
    return np.concatenate([per.reshape(-1), avg, [avg.mean()]])


def _spread(values: np.ndarray) -> dict[str, Any]:
    """values: [seeds, columns] -> per column mean and sample std (None with one seed)."""
    std = values.std(axis=0, ddof=1) if len(values) > 1 else np.full(values.shape[1], np.nan)
    return {"mean": values.mean(axis=0).tolist(), "std": std.tolist()}


def paired_difference(diffs: np.ndarray, ci: float) -> dict[str, Any]:
    """diffs: [pairs, columns] -> mean, std and the Student-t CI (None below two pairs) per column."""
    from scipy import stats

    n = len(diffs)
    mean = diffs.mean(axis=0)
    if n < 2:
        nan = np.full(diffs.shape[1], np.nan)
        return {"mean": mean.tolist(), "std": nan.tolist(), "ci_low": nan.tolist(), "ci_high": nan.tolist()}
    std = diffs.std(axis=0, ddof=1)
    half = stats.t.ppf(0.5 + ci / 2, df=n - 1) * std / math.sqrt(n)
    return {"mean": mean.tolist(), "std": std.tolist(), "ci_low": (mean - half).tolist(),
            "ci_high": (mean + half).tolist()}


def _order(methods: list[str], target: str, explicit: Sequence[str] | None) -> list[str]:
    if explicit:
        unknown = [m for m in explicit if m not in methods]
        if unknown:
            raise TableError(f"--methods: no runs of {unknown[0]!r}; the runs hold {methods}")
        return list(explicit)
    rest = [m for m in methods if m != target]
    rest.sort(key=lambda m: m != "base")  # the untrained model first, as in the paper; stable otherwise
    return rest + ([target] if target in methods else [])


def build_table(runs: list[RunScores], target: str = "ict", methods: Sequence[str] | None = None,
                benchmarks: Sequence[str] | None = None, ks: Sequence[str] | None = None,
                ci: float = 0.95) -> dict[str, Any]:
    """The table as a JSON-ready dict (scores as fractions; NaN where a statistic is undefined). ``runs`` is
    not empty: each RUN_DIR of ``ictrl table`` (one or more) yields a result file or a :class:`TableError`."""
    if not 0.0 < ci < 1.0:
        raise TableError(f"--ci must be in (0, 1), got {ci}")
    bench_list = list(benchmarks) if benchmarks else list(runs[0].scores)
    k_list = [str(k) for k in ks] if ks else list(next(iter(runs[0].scores.values())).keys())
    order = _order(list(dict.fromkeys(r.method for r in runs)), target, methods)
    runs = [r for r in runs if r.method in order]
    _check_runs(runs, bench_list, k_list)
    by_method = {m: sorted((r for r in runs if r.method == m), key=lambda r: (r.seed is None, r.seed or 0))
                 for m in order}
    rows = {m: {r.seed: _row(r, bench_list, k_list) for r in rs} for m, rs in by_method.items()}
    table: dict[str, Any] = {
        "columns": _columns(bench_list, k_list), "benchmarks": bench_list, "ks": k_list, "target": target, "ci": ci,
        "problems": {b: runs[0].num_problems.get(b, -1) for b in bench_list},
        "generation": {b: runs[0].generation.get(b) for b in bench_list}, "samples": runs[0].samples,
        "methods": [{"method": m, "seeds": [r.seed for r in by_method[m]], "runs": [str(r.path) for r in by_method[m]],
                     **_spread(np.stack(list(rows[m].values())))} for m in order],
        "differences": [],
    }
    if target not in rows:
        return table
    for base in (m for m in order if m != target):
        if list(rows[base]) == [None]:  # one untrained model: every target seed pairs with it
            pairs = [(s, rows[target][s] - rows[base][None]) for s in rows[target]]
        else:
            pairs = [(s, rows[target][s] - rows[base][s]) for s in rows[target] if s is not None and s in rows[base]]
        entry: dict[str, Any] = {"target": target, "baseline": base, "seeds": [s for s, _ in pairs]}
        if pairs:
            entry.update(paired_difference(np.stack([d for _, d in pairs]), ci))
        table["differences"].append(entry)
    return table


def _pct(x: float | None, signed: bool = False) -> str:
    if x is None or not math.isfinite(x):
        return "–"
    return f"{100 * x:+.2f}" if signed else f"{100 * x:.2f}"


def _cells(table: dict[str, Any]) -> tuple[list[list[str]], list[list[str]], list[list[bool]]]:
    """Text of the method rows and the difference rows, and which method cells hold a column's best mean."""
    means = np.array([m["mean"] for m in table["methods"]])
    # Bold marks the best mean of a column; where every method ties, nothing is best.
    tied = means.min(axis=0) == means.max(axis=0)
    best = ((means == means.max(axis=0)) & ~tied).tolist() if len(means) > 1 else [[False] * means.shape[1]]
    method_rows = []
    for m in table["methods"]:
        cells = [_pct(mu) + (f" ± {_pct(sd)}" if sd is not None and math.isfinite(sd) else "")
                 for mu, sd in zip(m["mean"], m["std"])]
        method_rows.append([m["method"], str(len(m["seeds"]))] + cells)
    diff_rows = []
    width = len(table["columns"])
    for d in table["differences"]:
        if not d["seeds"]:
            cells = ["no shared training seed"] + [""] * (width - 1)
        else:
            cells = [_pct(mu, signed=True) + (f" [{_pct(lo, True)}, {_pct(hi, True)}]" if math.isfinite(lo) else "")
                     for mu, lo, hi in zip(d["mean"], d["ci_low"], d["ci_high"])]
        diff_rows.append([f"{d['target']} − {d['baseline']}", str(len(d["seeds"]))] + cells)
    return method_rows, diff_rows, best


def _caption(table: dict[str, Any]) -> tuple[str, str]:
    ks = table["ks"]
    total = "(" + " + ".join(f"Avg P@{k}" for k in ks) + f") / {len(ks)}"
    main = (f"pass@k in %, mean ± std over training seeds (Seeds: runs per method); Avg: mean over the "
            f"{len(table['benchmarks'])} benchmarks; Total = {total}. Bold: best mean in the column (none where every "
            "method ties).")
    diff = (f"Paired difference {table['target']} − baseline in points, mean over the training seeds both have "
            f"(Pairs) [{100 * table['ci']:.0f}% CI, Student t with Pairs − 1 df]; a baseline evaluated once without a "
            "training seed (the base model) pairs with every seed.")
    return main, diff


def setup_lines(table: dict[str, Any]) -> list[str]:
    """One line per benchmark: the problems every run evaluated and the generation settings, so a table of a
    ``--limit 2`` evaluation does not pass for the full one."""
    samples = table.get("samples")
    lines = []
    for b in table["benchmarks"]:
        count = table.get("problems", {}).get(b, -1)
        gen = table.get("generation", {}).get(b) or {}
        settings = ", ".join(f"{k} {v}" for k, v in gen.items())
        lines.append(f"{b}: {count if count >= 0 else '?'} problems"
                     + (f", {samples} samples each" if samples else "") + (f"; {settings}" if settings else ""))
    return lines


def table_markdown(table: dict[str, Any]) -> str:
    method_rows, diff_rows, best = _cells(table)
    head = ["Method", "Seeds"] + [f"{c['group']} {c['label']}" if c["group"] != "Total" else "Total"
                                  for c in table["columns"]]
    sep = "|---|---:|" + "---:|" * len(table["columns"])
    main, diff = _caption(table)
    lines = [main, "", *(f"- {line}" for line in setup_lines(table)), "", "| " + " | ".join(head) + " |", sep]
    for row, flags in zip(method_rows, best):
        cells = row[:2] + [f"**{c}**" if f else c for c, f in zip(row[2:], flags)]
        lines.append("| " + " | ".join(cells) + " |")
    if diff_rows:
        lines += ["", diff, "", "| " + " | ".join(["Comparison", "Pairs"] + head[2:]) + " |", sep]
        lines += ["| " + " | ".join(row) + " |" for row in diff_rows]
    return "\n".join(lines) + "\n"


def format_html(table: dict[str, Any]) -> str:
    method_rows, diff_rows, best = _cells(table)
    groups: list[tuple[str, int]] = []
    for c in table["columns"]:
        if groups and groups[-1][0] == c["group"]:
            groups[-1] = (c["group"], groups[-1][1] + 1)
        else:
            groups.append((c["group"], 1))
    esc = html.escape

    def head(first: str, second: str) -> str:
        top = "".join(f'<th colspan="{n}">{esc(g)}</th>' for g, n in groups)
        sub = "".join(f"<th>{esc(c['label'])}</th>" for c in table["columns"])
        return (f'<thead><tr><th rowspan="2">{first}</th><th rowspan="2">{second}</th>{top}</tr>'
                f"<tr>{sub}</tr></thead>")

    def body(rows: list[list[str]], flags: list[list[bool]] | None = None) -> str:
        out = []
        for i, row in enumerate(rows):
            cells = [f"<th>{esc(row[0])}</th><td>{esc(row[1])}</td>"]
            for j, c in enumerate(row[2:]):
                cells.append(f"<td><b>{esc(c)}</b></td>" if flags and flags[i][j] else f"<td>{esc(c)}</td>")
            out.append("<tr>" + "".join(cells) + "</tr>")
        return "<tbody>" + "".join(out) + "</tbody>"

    main, diff = _caption(table)
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>ictrl table</title><style>",
        "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin:1em 0}"
        "th,td{border:1px solid #bbb;padding:3px 8px;text-align:right;white-space:nowrap}"
        "thead th{text-align:center;background:#f2f2f2}tbody th{text-align:left}caption{text-align:left;"
        "max-width:60em;margin-bottom:.4em}ul.setup{color:#333}</style></head><body>",
        f"<h1>ictrl table: pass@k per method over {len(table['benchmarks'])} benchmark"
        f"{'s' if len(table['benchmarks']) != 1 else ''}</h1>",
        "<ul class='setup'>" + "".join(f"<li>{esc(line)}</li>" for line in setup_lines(table)) + "</ul>",
        f"<table><caption>{esc(main)}</caption>{head('Method', 'Seeds')}{body(method_rows, best)}</table>",
    ]
    if diff_rows:
        parts.append(f"<table><caption>{esc(diff)}</caption>{head('Comparison', 'Pairs')}{body(diff_rows)}</table>")
    parts.append("</body></html>\n")
    return "".join(parts)


def write_table(table: dict[str, Any], output_dir: Path) -> list[Path]:
    """``table.md``, ``table.json`` and ``table.html`` in ``output_dir``, each written atomically."""
    output_dir.mkdir(parents=True, exist_ok=True)
    paths = [output_dir / TABLE_MD, output_dir / TABLE_JSON, output_dir / TABLE_HTML]
    atomic_write_text(paths[0], table_markdown(table))
    atomic_write_text(paths[1], json.dumps(_json_safe(table), indent=1, ensure_ascii=False) + "\n")
    atomic_write_text(paths[2], format_html(table))
    return paths


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR",
                        help="`ictrl eval` output directories (or results.json files, lm-evaluation-harness "
                             "results_<date>.json files, or folders searched for them)")
    parser.add_argument("--target", default="ict", help="method compared against every other one (default: ict)")
    parser.add_argument("--methods", nargs="+", type=comma_list(), action=CommaList, default=None,
                        help="methods to show, comma-separated, in this order (default: all, base first, the target "
                             "last)")
    parser.add_argument("--benchmarks", nargs="+", type=comma_list(), action=CommaList, default=None,
                        help="benchmark columns, comma-separated, in this order (default: the first run's)")
    parser.add_argument("--k", nargs="+", type=comma_list(int), action=CommaList, default=None,
                        help="k values, comma-separated (default: the first run's)")
    parser.add_argument("--ci", type=float, default=0.95, help="confidence level of the paired-difference CI")
    parser.add_argument("--output-dir", "--output_dir", type=Path, default=None,
                        help="write table.md, table.json and table.html here (default: only print the Markdown)")


def earlier_table(out: Path) -> bool:
    """Whether ``out`` holds the table.json of an ``ictrl table`` written before ictrl listed its files there."""
    from ictrl.files import holds_record

    return holds_record(out / TABLE_JSON, ("columns", "benchmarks", "ks", "target"))


def run(args: argparse.Namespace) -> int:
    """Bad inputs raise :class:`TableError` (a UserError: ``ictrl.cli`` prints one line, exit 2)."""
    names = (TABLE_MD, TABLE_JSON, TABLE_HTML)
    if args.output_dir is not None:  # a folder it cannot write, or a file there it would replace: before any read
        check_output_dir(args.output_dir, writes=names, legacy=earlier_table)
    runs = [load_run(p) for p in find_results(args.runs)]
    table = build_table(runs, target=args.target, methods=args.methods, benchmarks=args.benchmarks,
                        ks=[str(k) for k in args.k] if args.k else None, ci=args.ci)
    print(table_markdown(table), end="")
    if args.output_dir is not None:
        with reported_write(args.output_dir, "nothing else was written"):
            claim_files(args.output_dir, names)
            paths = write_table(table, args.output_dir)
        print("wrote " + ", ".join(str(p) for p in paths), file=sys.stderr)
    return 0
