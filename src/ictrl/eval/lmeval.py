"""``ictrl eval``'s scores in lm-evaluation-harness's results layout, so its readers and dashboards load them.

lm-evaluation-harness (``lm_eval --output_path DIR --log_samples``) writes, per run, into
``DIR/<model name sanitized>/`` (``EvaluationTracker.save_results_aggregated`` / ``save_results_samples``):

- ``results_<date id>.json``: ``results[task]["<metric>,<filter>"]`` and ``"<metric>_stderr,<filter>"`` beside
  ``alias``; ``group_subtasks``, ``configs``, ``versions``, ``n-shot``, ``higher_is_better``, ``n-samples``
  (``original`` / ``effective``), ``config`` (model and run settings), ``date``, ``model_name``,
  ``model_name_sanitized``, ``task_hashes``, ``total_evaluation_time_seconds``;
- ``samples_<task>_<date id>.jsonl``: one line per document with ``doc_id``, ``doc``, ``target``, ``arguments``
  (``{"gen_args_0": {"arg_0": prompt, "arg_1": generation kwargs}}``), ``resps`` (requests x repeats),
  ``filtered_resps``, ``filter``, ``metrics`` (names), ``doc_hash``, ``prompt_hash``, ``target_hash`` and each
  metric's value.

The date id is ``datetime.now().isoformat()`` with ``:`` as ``-``, shared by the results and samples files of one
evaluation; a reader takes the latest (``lm_eval.utils.get_latest_filename``). Here the metrics are ``pass@k`` for
each k, the n samples per problem are the task's ``repeats`` (as lm-evaluation-harness's own pass@k tasks, the
HumanEval family, record them), the filter is ``none`` (the benchmark's own answer extraction and grading), and a
metric's value is its mean over problems of the per-problem pass@k averaged over the evaluation seeds, with the
standard error of that mean over problems (lm-evaluation-harness's ``mean_stderr``: sample std / sqrt(problems)),
``"N/A"`` for one problem. A problem's samples line holds every seed's completions in seed order.
``n-samples``' ``original`` is the problems evaluated, as ``effective``: with ``--limit`` only the first problems
are loaded, and the rest are not counted.
ictrl's own run labels (method, training seed, the weights' sha256) sit in ``config``, where ``ictrl table`` reads
them.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from ictrl.eval.passk import mean_std
from ictrl.files import atomic_write_text

FILTER = "none"
RESULTS_GLOB = "results_*.json"


def hash_string(text: str) -> str:
    """lm-evaluation-harness's ``lm_eval.utils.hash_string``: sha256 of the UTF-8 text, hex."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def sanitize_model_name(name: str) -> str:
    """The directory name lm-evaluation-harness gives a model (``lm_eval.utils.sanitize_model_name``)."""
    return re.sub(r"[\"<>:/|\\?*\[\]]+", "__", name)


def sanitize_task_name(name: str) -> str:
    """A benchmark spec as a file-name part (``lm_eval.utils.sanitize_task_name``): ``math_train:levels=5`` ->
    ``math_train_levels_5``. Registry names (gsm8k, math500, aime24) stay as they are."""
    return re.sub(r"\W", "_", name)


def metric(k: int | str) -> str:
    return f"pass@{k}"


def _stderr(values: Sequence[float]) -> float | str:
    """lm-evaluation-harness's ``mean_stderr``: the sample std over problems / sqrt(problems)."""
    if len(values) < 2:
        return "N/A"
    return mean_std(values)[1] / math.sqrt(len(values))


def _gen_kwargs(generation: dict[str, Any]) -> dict[str, Any]:
    """ictrl's generation settings under lm-evaluation-harness's names (``generate_until``'s kwargs)."""
    return {"max_gen_toks": generation["max_new_tokens"], "temperature": generation["temperature"],
            "top_p": generation["top_p"], "do_sample": generation["temperature"] > 0}


def generation_of(gen_kwargs: dict[str, Any]) -> dict[str, Any]:
    """The inverse of :func:`_gen_kwargs`: ictrl's ``{max_new_tokens, temperature, top_p}``."""
    return {"max_new_tokens": gen_kwargs["max_gen_toks"], "temperature": gen_kwargs["temperature"],
            "top_p": gen_kwargs["top_p"]}


def _benchmark_samples(name: str, records: Sequence[dict[str, Any]], settings: dict[str, Any], ks: list[str],
                       seeds: list[Any]) -> tuple[list[dict[str, Any]], dict[str, list[float]]]:
    """One benchmark's sample lines (one per problem, every seed's completions in seed order) and, per k, its
    problems' pass@k averaged over the seeds."""
    mine = [r for r in records if r["benchmark"] == name]
    order = list(dict.fromkeys(r["problem_id"] for r in mine))
    by_problem = {pid: sorted((r for r in mine if r["problem_id"] == pid), key=lambda r: seeds.index(r["seed"]))
                  for pid in order}
    gen = _gen_kwargs(settings["generation"][name])
    lines: list[dict[str, Any]] = []
    scores: dict[str, list[float]] = {k: [] for k in ks}
    for doc_id, (pid, recs) in enumerate(by_problem.items()):
        values = {metric(k): math.fsum(float(r["pass_at_k"][k]) for r in recs) / len(recs) for k in ks}
        for k in ks:
            scores[k].append(values[metric(k)])
        doc = {"id": pid, "gold": recs[0]["gold"]}
        prompt, target = recs[0]["prompt"], str(recs[0]["gold"])
        line = {
            "doc_id": doc_id, "doc": doc, "target": target,
            "arguments": {"gen_args_0": {"arg_0": prompt, "arg_1": gen}},
            "resps": [[s["completion"] for r in recs for s in r["samples"]]],
            "filtered_resps": [[s["extracted"] for r in recs for s in r["samples"]]],
            "filter": FILTER, "metrics": list(values),
            "doc_hash": hash_string(json.dumps(doc, indent=2, ensure_ascii=False)),
            "prompt_hash": hash_string(prompt), "target_hash": hash_string(target),
            **values,
        }
        lines.append(line)
    return lines, scores


def layout(summary: dict[str, Any], records: Sequence[dict[str, Any]], seconds: float,
           version: str) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    """(results dict, {task: sample lines}) for one evaluation's ``summary`` and ``records`` (as
    :func:`ictrl.eval.harness.evaluate` builds them, each record with its ``pass_at_k``)."""
    settings = summary["settings"]
    ks, seeds = [str(k) for k in settings["ks"]], list(settings["seeds"])
    samples: dict[str, list[dict[str, Any]]] = {}
    per_problem: dict[str, dict[str, list[float]]] = {}
    for name in summary["benchmarks"]:
        samples[name], per_problem[name] = _benchmark_samples(name, records, settings, ks, seeds)

    model = str(settings["model"])
    results: dict[str, Any] = {
        "results": {name: {"alias": name, **{key: value for k in ks for key, value in (
            (f"{metric(k)},{FILTER}", math.fsum(per_problem[name][k]) / len(per_problem[name][k])),
            (f"{metric(k)}_stderr,{FILTER}", _stderr(per_problem[name][k])))}}
            for name in summary["benchmarks"]},
        "group_subtasks": {name: [] for name in summary["benchmarks"]},
        "configs": {name: {
            "task": name, "output_type": "generate_until", "repeats": settings["n"], "num_fewshot": 0,
            "generation_kwargs": _gen_kwargs(settings["generation"][name]),
            "metric_list": [{"metric": metric(k), "aggregation": "mean", "higher_is_better": True} for k in ks],
            "metadata": {"source": "ictrl eval", "evaluation_seeds": seeds},
        } for name in summary["benchmarks"]},
        "versions": {name: version for name in summary["benchmarks"]},
        "n-shot": {name: 0 for name in summary["benchmarks"]},
        "higher_is_better": {name: {metric(k): True for k in ks} for name in summary["benchmarks"]},
        "n-samples": {name: {"original": bench["num_problems"], "effective": bench["num_problems"]}
                      for name, bench in summary["benchmarks"].items()},
        "config": {
            "model": model, "model_args": f"pretrained={model}", "model_sha": settings.get("model_sha256"),
            "bootstrap_iters": settings["n_bootstrap"], "random_seed": seeds[0],
            "method": settings.get("method"), "train_seed": settings.get("train_seed"),
            "evaluation_seeds": seeds,
        },
        "date": datetime.now().timestamp(),
        "model_source": "ictrl", "model_name": model, "model_name_sanitized": sanitize_model_name(model),
        "task_hashes": {name: hash_string("".join(s["doc_hash"] + s["prompt_hash"] + s["target_hash"]
                                                  for s in lines)) for name, lines in samples.items()},
        "total_evaluation_time_seconds": str(seconds),
    }
    return results, samples


def write(output_dir: Path, summary: dict[str, Any], records: Sequence[dict[str, Any]], seconds: float,
          version: str) -> Path:
    """Write the results file and one samples file per benchmark under ``output_dir/<model sanitized>/``, each
    atomically; returns the results file's path."""
    results, samples = layout(summary, records, seconds, version)
    folder = output_dir / results["model_name_sanitized"]
    date_id = datetime.now().isoformat().replace(":", "-")
    for name, lines in samples.items():
        atomic_write_text(folder / f"samples_{sanitize_task_name(name)}_{date_id}.jsonl",
                          "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines))
    return atomic_write_text(folder / f"results_{date_id}.json", json.dumps(results, indent=2, ensure_ascii=False)
                             + "\n")
