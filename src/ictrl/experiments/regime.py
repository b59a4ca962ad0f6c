"""``ictrl regime``: does ICT's token selection differ from a random one on this model and these prompts?

ICT's JS score is meant for groups whose responses are uncertain at aligned forks: there its top tokens sit at low
sampled-token probability π (the paper: 0.18 ± 0.09). Where the responses disagree confidently, its tokens sit at π
near 1, much like a random 10%'s. This command measures which of the two a model is in before any training: it
samples ``G`` responses to each prompt (HF ``generate``, plain sampling at ``--temperature``, so the sampler is the
policy whose logits are scored), once per sampling seed (``--seeds``, the same prompts each time), scores each
group with the trainer's own statistics (``ictrl.core.stats.token_stats`` with the group as one prompt label) and
selectors (``ictrl.core.selection.select``: ICT top-10% per response, random-10% per response, 20-Entropy's top 20%
of the group), averages each prompt's numbers over its seeds, and reports over prompts (mean and 95% t-interval, a
prompt being the unit):

- π and H1 at ICT's tokens against random-10%'s, 20-Entropy's and all tokens', and the paired per-prompt
  differences ICT − random-10% and ICT − 20-Entropy;
- the share of ICT's tokens that 20-Entropy also picks (and random-10%'s share, the chance level);
- the share of ICT's tokens at or before the group's first divergence (the first position where its responses
  differ; up to and including it every response has the same prefix, hence the same distribution, and u = 0);
- one verdict (:data:`VERDICT_RULE`), what to do about it, and where the evidence for that advice is
  (:data:`EVIDENCE`: the project's studies, in the docs, not here).

A group whose responses are all identical has u = 0 everywhere (ICT's pick is then arbitrary, and in training its
advantages are 0): it is counted and left out of the comparisons.

Prompt sources (``--prompts``): a task (``tinyarith``, or a task module as ``module`` or ``module:attribute``,
``ictrl.experiments.tasks.registry``; from a clone's root the studies' ``studies.tasks.paths`` and
``studies.tasks.countdown``: test-split questions as the warm start saw them), a benchmark or spec from the data
registry (``gsm8k``, ``math500``, ``math_train:levels=3,4,5``, ``jsonl:PATH``: the prompt the model is evaluated
with, through its chat template when the tokenizer has one), or a ``.jsonl``/``.json`` file (as ``jsonl:PATH``).
Outputs, written atomically to ``--output-dir``: ``regime.json`` (settings, summary, verdict, one record per prompt)
and ``regime.html``.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ictrl.errors import UserError, did_you_mean
from ictrl.experiments.sampling import check_sampling_flags
from ictrl.experiments.tasks.registry import CHOICES

REFERENCE = "ict"  # the selector under test, by registered name
CONTROLS = ("random", "entropy")  # what it is compared with: random-10% (chance) first, then 20-Entropy
PAPER_PI = 0.5  # π at ICT's tokens at most this: the paper's regime (its tokens: 0.18 ± 0.09), as the horizon report
# The smallest π difference from random-10% that counts as a different selection. Sampled-token probabilities move
# by a few hundredths between draws of the same model, so without a margin a selection that matches random's up to
# that noise would flip between "differs" and "does not" from one seed to the next.
MARGIN = 0.05
CONFIDENCE = 0.95
# Sampling a tiny model is many small matrix products, which extra threads slow down: torch's default (every core
# it sees) oversubscribes a shared machine.
DEFAULT_THREADS = 1
VERDICT_RULE = (
    f"Verdict rule, on the mean and {CONFIDENCE:.0%} t-interval over prompts of the per-prompt difference π(ICT) − "
    f"π(random-10%): ICT's selection differs from random when the interval excludes 0 and the mean is beyond "
    f"±{MARGIN:g}, in the paper's regime when the mean is below −{MARGIN:g} and the mean π at ICT's tokens is at most "
    f"{PAPER_PI:g} (uncertain tokens where a response departs from its group), else as confident disagreements; it "
    f"is like random when the whole interval lies within ±{MARGIN:g}; undecided otherwise."
)
# Where the project's studies in each regime are described, with their numbers and reports (kept out of the code,
# which cannot say when they were measured).
EVIDENCE_DOC = "docs/regime.md"
_CONFIDENT_EVIDENCE = (f"{EVIDENCE_DOC}#confident-disagreements-or-like-random", "in the project's long-horizon "
                      "studies on bases whose ICT tokens were confident, ICT trailed random-10% and GRPO on pass@k")
EVIDENCE = {
    "paper": (f"{EVIDENCE_DOC}#the-papers-regime", "in the project's long-horizon studies on bases with this "
              "verdict, ICT at each method's own tuned setting beat none of GRPO, STAPO and random-10% on pass@k"),
    "confident": _CONFIDENT_EVIDENCE,
    "random": _CONFIDENT_EVIDENCE,
}
_EXPECT_NO_MORE = ("expect no more from ICT than from random-10% (token_selector random, which needs no JS "
                   "score) or GRPO (all); train with those, or compare them on your task before choosing ICT.")
ACTION = {
    "paper": "ICT's tokens are the kind the method is meant for, which does not predict a gain: before adopting ICT, "
             "compare it with GRPO and random-10% at matched tuning on your task (`ictrl train` with token_selector "
             "all, random and ict, each at its own tuned learning rate, then `ictrl eval` and `ictrl table`).",
    "confident": "ICT's selection is not the paper's kind here: " + _EXPECT_NO_MORE,
    "random": "ICT's selection is, on π, a random 10% here: " + _EXPECT_NO_MORE,
    "undecided": "Sample more before deciding: raise --seeds or --num-prompts (the interval shrinks with the square "
                 "root of the prompts).",
    "unknown": "Sample more prompts, more seeds or at a higher --temperature, so that groups' responses differ.",
}


# ---------------------------------------------------------------------------------------------------- one group


def label(name: str) -> str:
    """A selector's method label (ict, random10, entropy20), the names records and the report use."""
    from ictrl.core.selection import get_selector

    return get_selector(name).label


def selection_labels() -> list[str]:
    """ICT's, the controls' labels and ``all`` (every response token), in the report's order."""
    return [label(REFERENCE), *(label(c) for c in CONTROLS), "all"]


def pairs() -> list[tuple[str, str]]:
    """The paired per-prompt differences: ICT − each control."""
    return [(label(REFERENCE), label(c)) for c in CONTROLS]


def first_divergence(tokens: Any, mask: Any) -> int | None:
    """The first position where the responses of a group differ (a token, or one ended and another did not);
    None when they are identical. tokens, mask: [G, T]."""
    same = ((tokens == tokens[:1]) | ~mask) & (mask == mask[:1])
    where = (~same.all(dim=0)).nonzero()
    return int(where[0, 0]) if where.numel() else None


def group_selections(logits: Any, tokens: Any, mask: Any, temperature: float = 1.0, seed: int = 0,
                     index: int = 0) -> tuple[Any, dict[str, Any]]:
    """The trainer's statistics of one group and each selection's [G, T] mask.

    logits [G, T, V] in the shifted layout (``logits[g, t]`` produced ``tokens[g, t]``), tokens [G, T], mask [G, T]
    bool. The random draw is seeded by (``seed``, ``index``), one draw per prompt. 20-Entropy's "batch" is the group:
    in training it is every prompt of the step, which this check, one prompt at a time, does not have."""
    import torch

    from ictrl.core.selection import SelectionInputs, get_selector, needed_stats
    from ictrl.core.stats import token_stats

    selectors = [get_selector(name) for name in (REFERENCE, *CONTROLS)]
    needs = frozenset().union(*(needed_stats(selector) for selector in selectors))
    group_ids = torch.zeros(tokens.shape[0], dtype=torch.long, device=tokens.device)
    stats = token_stats(logits, mask, tokens=tokens, temperature=temperature,
                        group_ids=group_ids if "ict_score" in needs else None)
    inputs = SelectionInputs.from_stats(mask, stats, needs, step=index, group_ids=group_ids)
    masks: dict[str, Any] = {}
    for selector in selectors:
        masks[selector.label] = selector(inputs, **({"seed": seed} if "seed" in selector.options else {}))
    masks["all"] = inputs.mask
    return stats, masks


def _mean_at(values: Any, where: Any) -> float | None:
    n = int(where.sum())
    return float(values.double()[where].sum()) / n if n else None


def group_record(stats: Any, masks: dict[str, Any], tokens: Any, mask: Any) -> dict[str, Any]:
    """One prompt's numbers: π and H1 averaged over each selection's tokens (pooled over the group), the paired
    differences, the overlaps with 20-Entropy, the first divergence and the share of ICT's tokens at or before it."""
    d = first_divergence(tokens, mask)
    rec: dict[str, Any] = {"responses": int(mask.shape[0]), "tokens": int(mask.sum()), "divergence": d}
    for name in selection_labels():
        rec[f"pi/{name}"] = _mean_at(stats.prob, masks[name])
        rec[f"h1/{name}"] = _mean_at(stats.entropy, masks[name])
    for a, b in pairs():
        for stat in ("pi", "h1"):
            x, y = rec[f"{stat}/{a}"], rec[f"{stat}/{b}"]
            rec[f"{stat}/{a}-{b}"] = None if x is None or y is None else x - y
    ict, rnd, ent = (label(n) for n in (REFERENCE, *CONTROLS))
    for name in (ict, rnd):
        n = int(masks[name].sum())
        rec[f"overlap/{name}&{ent}"] = int((masks[name] & masks[ent]).sum()) / n if n else None
        shared = masks[name][:, : mask.shape[1] if d is None else d + 1]
        rec[f"before/{name}"] = int(shared.sum()) / n if n else None
    return rec


# ---------------------------------------------------------------------------------------------------- over prompts


def mean_ci(values: Sequence[float], confidence: float = CONFIDENCE,
            bounds: tuple[float, float] | None = None) -> dict[str, Any]:
    """Mean with a two-sided t-interval over ``values`` (None edges for fewer than two values); ``bounds``: the
    range the quantity cannot leave (a share's [0, 1]), to which the interval's edges are clipped."""
    from scipy import stats

    n = len(values)
    if not n:
        return {"mean": None, "lo": None, "hi": None, "n": 0}
    m = math.fsum(values) / n
    if n < 2:
        return {"mean": m, "lo": None, "hi": None, "n": n}
    sd = math.sqrt(math.fsum((v - m) ** 2 for v in values) / (n - 1))
    half = float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * sd / math.sqrt(n)
    lo, hi = (m - half, m + half) if bounds is None else (max(bounds[0], m - half), min(bounds[1], m + half))
    return {"mean": m, "lo": lo, "hi": hi, "n": n}


def summarize_regime(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Every numeric field's mean and t-interval over the prompts whose groups diverged (one at least)."""
    diverged = [r for r in records if r["divergence"] is not None]
    keys = [k for k in records[0] if "/" in k] if records else []
    shares = ("overlap/", "before/")  # fractions of a selection: intervals clipped to [0, 1]
    out: dict[str, Any] = {k: mean_ci([r[k] for r in diverged if r[k] is not None],
                                      bounds=(0.0, 1.0) if k.startswith(shares) else None) for k in keys}
    out["prompts"] = len(records)
    # a record of one group (no "groups") is identical or not; a prompt's record counts its seeds' groups
    out["groups"] = sum(len(r.get("groups", [r])) for r in records)
    out["identical_groups"] = sum(r.get("identical_groups", int(r["divergence"] is None)) for r in records)
    out["divergence"] = mean_ci([float(r["divergence"]) for r in diverged])
    out["tokens_per_response"] = mean_ci([r["tokens"] / r["responses"] for r in records])
    return out


def verdict(summary: dict[str, Any]) -> dict[str, Any]:
    """The regime under :data:`VERDICT_RULE`: ``paper``, ``confident`` (differs from random, not the paper's
    regime), ``random`` (within the margin of random), ``undecided`` (neither) or
    ``unknown`` (fewer than two prompts whose groups diverged); its ``line`` with this run's numbers, the
    ``action`` to take and the ``evidence`` behind it (None where there is none to cite)."""
    a, b = pairs()[0]
    diff, ict, rnd = summary[f"pi/{a}-{b}"], summary[f"pi/{a}"], summary[f"pi/{b}"]
    if diff["lo"] is None:
        name = "unknown"
        line = f"Too few prompts whose responses differ ({diff['n']}) to tell."
    else:
        d = f"{diff['mean']:+.3f} [{diff['lo']:+.3f}, {diff['hi']:+.3f}]"
        pis = f"π at ICT's tokens {ict['mean']:.3f}, at random-10%'s {rnd['mean']:.3f}; difference {d}"
        differs = (diff["lo"] > 0 or diff["hi"] < 0) and abs(diff["mean"]) > MARGIN
        if differs and diff["mean"] < 0 and ict["mean"] <= PAPER_PI:
            name = "paper"
            line = (f"ICT's selection differs from random here, in the paper's regime: {pis}, below −{MARGIN:g}, and "
                    f"ICT's tokens at π ≤ {PAPER_PI:g}.")
        elif differs:
            name = "confident"
            line = (f"ICT's selection differs from random here, but not in the paper's regime: {pis}; ICT picks "
                    "confident disagreements.")
        elif -MARGIN <= diff["lo"] and diff["hi"] <= MARGIN:
            name = "random"
            line = f"ICT's selection does not differ from random here on π: {pis}, within ±{MARGIN:g}."
        else:
            name = "undecided"
            line = f"Undecided: {pis}; the interval is not within ±{MARGIN:g}, nor the mean beyond it with 0 outside."
    where, finding = EVIDENCE.get(name, (None, None))
    evidence = None if where is None else f"{finding[0].upper()}{finding[1:]} (see {where})."
    return {"regime": name, "line": line, "action": ACTION[name], "evidence": evidence}


def verdict_text(v: dict[str, Any]) -> str:
    """The verdict as the command prints it: the line, what to do, and the evidence."""
    return "\n".join([v["line"], f"What to do: {v['action']}",
                      *([f"Evidence: {v['evidence']}"] if v["evidence"] else [])])


# ---------------------------------------------------------------------------------------------------- sources


def load_prompts(source: str, n: int, seed: int = 0) -> tuple[list[Any], Any]:
    """(problems, how to build a prompt): ``n`` of an embedded task's test questions (drawn with ``seed``), or the
    first ``n`` problems of a benchmark or file with its prompt builder. A source that is no file and no benchmark is
    a task. Raises :class:`UserError` (one line naming ``--prompts``) for an unknown source."""
    from ictrl import option_checks
    from ictrl.data import BENCHMARKS, load_problems, parse_spec
    from ictrl.experiments.tasks.registry import CHOICES, TASKS, get_task

    is_file = Path(source).suffix in (".jsonl", ".json")
    spec = f"jsonl:{source}" if is_file else source
    head = spec.split(":", 1)[0]
    if head != "jsonl" and head not in BENCHMARKS:
        try:
            task = get_task(source, "--prompts")
        except UserError as err:
            if err.__cause__ is None:  # it imports but is not a task: that line says so
                raise
            # A dotted name was meant as a module path: why it did not import (for a bare word, only noise).
            why = f"; importing it: {err.__cause__}" if "." in source or ":" in source else ""
            known, hint = ", ".join(sorted(BENCHMARKS)), did_you_mean(head, [*TASKS, *BENCHMARKS])
            raise UserError(f"--prompts: unknown source {source!r}{hint} "
                            f"(a task: {CHOICES}; a benchmark: {known}; or a .jsonl file){why}") from None
        try:
            problems = task.generate_problems(n, "test", task.DEFAULT_DIFFICULTY, seed=seed)
        except ValueError as exc:
            raise UserError(f"--prompts {source}: {exc}") from None
        return problems, None
    if is_file:
        option_checks.check_file(source, "--prompts")
    option_checks.check_benchmarks([spec], option="--prompts")
    try:
        problems = load_problems(spec, limit=n)
    except ValueError as exc:
        raise UserError(f"--prompts: {exc}") from None
    if not problems:
        raise UserError(f"--prompts {source}: no problems")
    return problems, parse_spec(spec)[0]


# ---------------------------------------------------------------------------------------------------- sampling


def score_prompt(model: Any, tokenizer: Any, prompt: str, index: int, args: argparse.Namespace,
                 seed: int) -> dict[str, Any]:
    """Sample one group for ``prompt`` with sampling seed ``seed`` (``ictrl inspect``'s sampler), one no-grad forward
    over prompt + responses for the logits that produced them, then :func:`group_record`."""
    import torch

    from ictrl.experiments.sampling import generate_group

    prompt_ids, response, mask = generate_group(model, tokenizer, prompt, args.num_generations, args.max_new_tokens,
                                                args.temperature, seed=seed * 1_000_003 + index)
    g, p_len = response.shape[0], prompt_ids.shape[1]
    with torch.no_grad():
        logits = model(torch.cat([prompt_ids.expand(g, -1), response], dim=1)).logits[:, p_len - 1:-1].float()
        stats, masks = group_selections(logits, response, mask, args.temperature, seed, index)
    return group_record(stats, masks, response, mask)


def prompt_record(groups: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One prompt's numbers over its sampling seeds: each field's mean over the groups that diverged (a group of
    identical responses says nothing about ICT's pick), the divergence None when none did; ``tokens`` the mean
    response tokens of a group; ``groups`` every seed's own record."""
    diverged = [g for g in groups if g["divergence"] is not None]
    rec: dict[str, Any] = {"responses": groups[0]["responses"],
                           "tokens": math.fsum(g["tokens"] for g in groups) / len(groups),
                           "divergence": (math.fsum(g["divergence"] for g in diverged) / len(diverged)
                                          if diverged else None)}
    for key in (k for k in groups[0] if "/" in k):
        values = [g[key] for g in diverged if g[key] is not None]
        rec[key] = math.fsum(values) / len(values) if values else None
    rec["identical_groups"] = len(groups) - len(diverged)
    rec["groups"] = list(groups)
    return rec


# ---------------------------------------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # no prefixes: `--num-generation 8` must be an error, not --num-generations
    parser.allow_abbrev = False
    parser.add_argument("--model", required=True, help="model directory or hub id (loaded with from_pretrained)")
    parser.add_argument("--prompts", required=True, metavar="SOURCE",
                        help=f"a task ({CHOICES}), a benchmark or spec (gsm8k, math500, "
                             "math_train:levels=3,4,5, jsonl:PATH) or a .jsonl/.json file")
    parser.add_argument("--num-generations", type=int, default=8, help="G, responses per prompt (>= 2)")
    parser.add_argument("--num-prompts", type=int, default=64, help="prompts sampled (default: %(default)s)")
    parser.add_argument("--seeds", type=int, default=3,
                        help="sampling seeds SEED..SEED+N-1: one group per prompt and seed, a prompt's numbers "
                             "averaged over its seeds (default: %(default)s)")
    parser.add_argument("--max-new-tokens", type=int, default=None,
                        help="response budget (default: an embedded task's own, else 512)")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling and statistics temperature")
    parser.add_argument("--seed", type=int, default=0,
                        help="draws the embedded task's prompts and is the first sampling seed (default 0)")
    parser.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda if available, else cpu)")
    parser.add_argument("--threads", type=int, default=DEFAULT_THREADS,
                        help="CPU threads of torch (default: %(default)s; more than the cores, or than the cores "
                             "other jobs leave free, slows the small matrix products of sampling)")
    parser.add_argument("--output-dir", "--output_dir", type=Path, default=Path("runs/regime"),
                        help="where regime.json and regime.html go (default: %(default)s)")


def check_args(args: argparse.Namespace) -> None:
    """Flag values, before anything loads; one line naming the flag."""
    check_sampling_flags(args)
    if args.num_prompts < 2:
        raise UserError(f"--num-prompts must be at least 2 (the intervals are over prompts), got {args.num_prompts}")
    if args.seeds < 1:
        raise UserError(f"--seeds must be at least 1, got {args.seeds}")
    if args.seed < 0:
        raise UserError(f"--seed must be >= 0, got {args.seed}")
    if args.threads < 1:
        raise UserError(f"--threads must be at least 1, got {args.threads}")
    from ictrl.models import check_device

    check_device(args.device)


def run(args: argparse.Namespace) -> int:
    import torch
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from ictrl.experiments.reports import regime_report
    from ictrl.experiments.tasks.registry import get_task
    from ictrl.files import check_output_dir
    from ictrl.hub import check_model

    check_args(args)
    check_output_dir(args.output_dir)
    problems, bench = load_prompts(args.prompts, args.num_prompts, args.seed)
    if args.max_new_tokens is None:
        task = get_task(args.prompts) if bench is None else None  # bench None: the prompts are a task's
        args.max_new_tokens = int(task.max_new_tokens(task.DEFAULT_DIFFICULTY)) if task is not None else 512
    check_model(args.model)
    from ictrl.data import build_prompt
    from ictrl.models import load_model_and_tokenizer

    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    model, tokenizer = load_model_and_tokenizer(args.model, device=args.device)
    seeds = range(args.seed, args.seed + args.seeds)
    records = []
    columns = (TextColumn("regime check"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("groups", total=len(problems) * len(seeds))
        for i, problem in enumerate(problems):
            prompt = problem.question if bench is None else build_prompt(problem, bench, tokenizer)
            groups = []
            for seed in seeds:
                groups.append(score_prompt(model, tokenizer, prompt, i, args, seed))
                bar.advance(task)
            records.append({"id": problem.id, **prompt_record(groups)})
    summary = summarize_regime(records)
    result = {"settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
              "selections": selection_labels(), "pairs": pairs(), "summary": summary, "verdict": verdict(summary),
              "verdict_rule": VERDICT_RULE, "seconds": time.perf_counter() - start, "prompts": records}
    paths = regime_report.write_regime_report(args.output_dir, result)
    print(verdict_text(result["verdict"]))
    print(f"wrote {paths['json']} and {paths['html']} ({result['seconds']:.0f} s)")
    return 0
