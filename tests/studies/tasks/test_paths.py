"""The paths study task (studies/tasks/paths.py): the walk grader, counts against brute force, splits, the
demonstrations' error kinds, uniform valid walks, the TRL reward, and the regime it was built for (ICT's tokens at
low π, on an ideal base and through ``ictrl regime``). Through the registry by its module path: its own recipe, a
cached base found again from the recipe it recorded, and ``ictrl tiny-model --task studies.tasks.paths``."""

from __future__ import annotations

import collections
import collections.abc
import itertools
import json
import math
import random
from pathlib import Path
from typing import Any

import pytest
import torch

from ictrl.core.selection import SelectionInputs, select
from ictrl.core.stats import token_stats
from ictrl.experiments import regime
from ictrl.experiments.tasks.registry import get_task, task_recipe
from studies.tasks import paths


def brute_walks(start: str, target: str, length: int) -> list[str]:
    return ["".join(w) for w in itertools.product(paths.NODES, repeat=length)
            if paths.check_walk("".join(w), start, target, length)]


def test_graph_is_fixed_and_has_the_stated_degree() -> None:
    assert len(paths.GRAPH) == len(paths.NODES) == 26
    assert all(len(set(vs)) == paths.DEGREE and u not in vs for u, vs in paths.GRAPH.items())
    assert paths._graph() == paths.GRAPH  # drawn from a fixed seed, not the process's RNG


def test_grader_checks_every_edge_the_length_and_the_end() -> None:
    start, target, length = "a", paths.GRAPH[paths.GRAPH["a"][0]][0], 2
    walk = paths.GRAPH["a"][0] + target
    gold = paths.problem_key(start, target, length)
    assert paths.grade(walk, gold) == 1.0
    assert paths.grade(f" {walk}\n", gold) == 1.0
    assert paths.grade(walk + target, gold) == 0.0  # too long
    assert paths.grade(target, gold) == 0.0  # copying the target scores nothing
    missing = next(v for v in paths.NODES if v not in paths.GRAPH["a"])
    assert paths.grade(missing + target, gold) == 0.0  # an edge that does not exist
    assert paths.grade("", gold) == 0.0
    assert get_task("studies.tasks.paths").reward([""] * 2, [walk, "zz"], gold=[gold] * 2) == [1.0, 0.0]
    assert paths.DEFAULT_DIFFICULTY == (4, 5, 6)
    assert paths.grade("uozwf", "g>f/5") == 1.0  # the module docstring's example


@pytest.mark.parametrize("length", [2, 3])
def test_walk_counts_match_brute_force(length: int) -> None:
    for start, target in [("a", "b"), ("q", "q"), ("z", "k"), ("j", "m")]:
        assert paths.walks(start, target, length) == len(brute_walks(start, target, length))


def test_problems_are_reachable_split_disjoint_and_seeded() -> None:
    test = paths.generate_problems(200, "test", seed=0)
    dev = paths.generate_problems(200, "dev", seed=0)
    assert {p.gold for p in test}.isdisjoint({p.gold for p in dev})
    assert len({p.gold for p in test}) == 200
    assert [p.id for p in test] == [p.id for p in paths.generate_problems(200, "test", seed=0)]
    assert all(paths.split_of(p.gold) == "test" and p.meta["solutions"] >= 1 for p in test)
    assert all(paths.grade(paths.gold_solution(p), p.gold) == 1.0 for p in test)
    assert sum(p.meta["solutions"] > 1 for p in test) > 190  # nearly every problem has several valid walks
    with pytest.raises(ValueError, match="holds"):
        paths.generate_problems(10_000, "test")
    with pytest.raises(ValueError, match="walk lengths"):
        paths.generate_problems(1, "test", difficulty=(9,))
    s, t = next((s, t) for s in paths.NODES for t in paths.NODES if not paths.walks(s, t, 2))
    with pytest.raises(ValueError, match="unreachable"):
        paths.make_problem(s, t, 2)


def test_valid_walks_are_drawn_uniformly() -> None:
    start, target, length = "a", "b", 3
    valid = brute_walks(start, target, length)
    rng = random.Random(0)
    n = 400 * len(valid)
    counts = collections.Counter(paths.random_walk(start, length, rng, target) for _ in range(n))
    assert set(counts) == set(valid)
    # Each walk's share within 5 standard errors of uniform: a weighting bug moves shares by far more.
    p = 1 / len(valid)
    assert all(abs(c / n - p) < 5 * math.sqrt(p * (1 - p) / n) for c in counts.values())


def test_demonstrations_err_by_choice_along_valid_edges() -> None:
    problems = paths.generate_problems(200, "train", seed=1)
    rng = random.Random(0)
    for p in problems:
        start, target, length = p.meta["start"], p.meta["target"], p.meta["difficulty"]
        wrong = paths.demonstration(p, rng, order_error=1.0, digit_error=0.0)
        assert paths.grade(wrong, p.gold) == 0.0  # ends elsewhere ...
        assert paths.check_walk(wrong, start, wrong[-1], length)  # ... along edges that exist
        assert paths.grade(paths.demonstration(p, rng, 0.0, 0.0), p.gold) == 1.0
        seed = rng.random()  # the same draw twice: the slip is the only difference
        clean = paths.demonstration(p, random.Random(seed), 0.0, 0.0)
        slipped = paths.demonstration(p, random.Random(seed), 0.0, digit_error=1.0)
        assert len(slipped) == length and sum(a != b for a, b in zip(clean, slipped)) == 1


def ideal_next(start: str, target: str, length: int, prefix: str, error: float) -> dict[str, float]:
    """The exact next-letter distribution of the demonstration mixture (valid walks with weight 1 - error, walks
    that end elsewhere with weight ``error``, each uniform) after ``prefix``."""
    node = prefix[-1] if prefix else start
    left = length - len(prefix) - 1
    valid, every = paths.walks(start, target, length), paths.DEGREE ** length
    weight = {v: (1 - error) * paths.walks(v, target, left) / valid
              + error * (paths.DEGREE ** left - paths.walks(v, target, left)) / (every - valid)
              for v in paths.GRAPH[node]}
    total = sum(weight.values())
    return {v: w / total for v, w in weight.items()}


def test_an_ideal_base_puts_icts_tokens_at_low_probability() -> None:
    """The design claim of the task: where the responses of a group are position-aligned and the base is
    uncertain at every letter, ICT's top-10% tokens (JS against the group mean) are uncertain ones, π < 0.5, and
    less probable than the average token, the paper's regime. The other tasks' bases put them at 0.8-0.95."""
    rng = random.Random(0)
    vocab = paths.NODES + "$"  # "$": EOS
    G, problems = 8, paths.generate_problems(40, "train", seed=3)
    T = max(p.meta["difficulty"] for p in problems) + 1
    logits = torch.full((G * len(problems), T, len(vocab)), -math.inf, dtype=torch.float64)
    tokens = torch.zeros(G * len(problems), T, dtype=torch.long)
    mask = torch.zeros(G * len(problems), T, dtype=torch.bool)
    for i, p in enumerate(problems):
        start, target, length = p.meta["start"], p.meta["target"], p.meta["difficulty"]
        for g in range(G):
            row, walk = i * G + g, ""
            for t in range(length):
                dist = ideal_next(start, target, length, walk, error=0.5)
                for v, q in dist.items():
                    logits[row, t, vocab.index(v)] = math.log(q)
                walk += rng.choices(list(dist), weights=list(dist.values()))[0]
                tokens[row, t] = vocab.index(walk[-1])
            logits[row, length, vocab.index("$")] = 0.0
            tokens[row, length] = vocab.index("$")
            mask[row, : length + 1] = True
    group_ids = torch.arange(len(problems)).repeat_interleave(G)
    st = token_stats(logits, mask, tokens, group_ids=group_ids)
    chosen = select("ict", SelectionInputs(mask=mask, ict_score=st.ict_score, group_ids=group_ids))
    assert chosen.sum().item() == G * len(problems)  # ceil(10% of <= 7 tokens): one token per response
    pi_selected, pi_all = st.prob[chosen].mean().item(), st.prob[mask].mean().item()
    assert pi_selected < 0.45 and pi_selected < pi_all - 0.05, (pi_selected, pi_all)


# ---------------------------------------------------------------------------------------------------- ictrl regime


Next = collections.abc.Callable[[str], dict[str, float]]


def demonstrated_next(task: Any, problem: Any, rng: random.Random, order_error: float, digit_error: float,
                      draws: int = 2000) -> Next:
    """The next-character distribution of ``draws`` warm-start demonstrations of ``problem`` ("$": EOS). Exact
    enough for tinyarith, whose demonstrations take a few dozen forms; paths' take thousands (see ``paths_next``)."""
    counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for _ in range(draws):
        d = task.demonstration(problem, rng, order_error, digit_error) + "$"
        for t in range(len(d)):
            counts[d[:t]][d[t]] += 1
    return lambda prefix: {v: c / sum(counts[prefix].values()) for v, c in counts[prefix].items()}


def paths_next(problem: Any, error: float) -> Next:
    """The exact next-letter distribution of paths' demonstration mixture (``ideal_next``), then EOS."""
    start, target, length = problem.meta["start"], problem.meta["target"], problem.meta["difficulty"]

    def nxt(prefix: str) -> dict[str, float]:
        if len(prefix) == length:
            return {"$": 1.0}
        return {v: q for v, q in ideal_next(start, target, length, prefix, error).items() if q > 0}

    return nxt


def ideal_summary(task_name: str, order_error: float, digit_error: float, prompts: int = 24,
                  G: int = 8) -> dict[str, Any]:
    """The check on an ideal base of ``task_name`` (its warm-start data's exact conditional): each group's responses
    drawn from it, the logits its log-probabilities."""
    rng, records = random.Random(0), []
    vocab = sorted(set("abcdefghijklmnopqrstuvwxyz0123456789+*=;\\{}$boxed"))
    task = get_task(task_name)
    for i, p in enumerate(task.generate_problems(prompts, "test", task.DEFAULT_DIFFICULTY)):
        nxt = (paths_next(p, order_error) if task is paths
               else demonstrated_next(task, p, rng, order_error, digit_error))
        group = []
        for _ in range(G):
            r = ""
            while not r.endswith("$"):
                dist = nxt(r)
                r += rng.choices(list(dist), weights=list(dist.values()))[0]
            group.append(r)
        T = max(len(r) for r in group)
        logits = torch.full((G, T, len(vocab)), -math.inf)
        tokens = torch.zeros(G, T, dtype=torch.long)
        mask = torch.zeros(G, T, dtype=torch.bool)
        for g, r in enumerate(group):
            for t, ch in enumerate(r):
                for v, q in nxt(r[:t]).items():
                    logits[g, t, vocab.index(v)] = math.log(q)
                tokens[g, t], mask[g, t] = vocab.index(ch), True
        st, masks = regime.group_selections(logits, tokens, mask, index=i)
        records.append(regime.group_record(st, masks, tokens, mask))
    return regime.summarize_regime(records)


def test_the_check_tells_paths_from_tinyarith_on_ideal_bases() -> None:
    """paths was built for the paper's regime (ICT's tokens uncertain, below random's π); tinyarith's ICT tokens are
    confident disagreements (π near 1). Error rates: each task's warm-start recipe (paths' ``RECIPE``, its 10% letter
    slips left out of its exact conditional; tinyarith's TinyRecipe defaults)."""
    found = ideal_summary("studies.tasks.paths", order_error=0.5, digit_error=0.0)
    arith = ideal_summary("tinyarith", order_error=0.5, digit_error=0.5)
    assert regime.verdict(found)["regime"] == "paper", regime.verdict(found)["line"]
    assert found["pi/ict"]["mean"] < 0.45
    assert regime.verdict(arith)["regime"] != "paper", regime.verdict(arith)["line"]
    assert arith["pi/ict"]["mean"] > 0.8, regime.verdict(arith)["line"]


def test_regime_takes_the_task_by_its_module_path(tiny_model_dir: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from ictrl.cli import main

    out = tmp_path / "out"
    rc = main(["regime", "--model", str(tiny_model_dir), "--prompts", "studies.tasks.paths", "--num-prompts", "3",
               "--num-generations", "4", "--seeds", "2", "--threads", "1", "--output-dir", str(out)])
    assert rc == 0, capsys.readouterr().err
    result = json.loads((out / "regime.json").read_text())  # strict JSON: no NaN
    assert len(result["prompts"]) == 3 and result["settings"]["max_new_tokens"] == 10  # paths' own budget
    assert all(r["id"].startswith("paths-") for r in result["prompts"])  # the page and summary: test_regime
    assert regime.verdict_text(result["verdict"]) in capsys.readouterr().out


def test_a_misspelt_task_module_is_one_line_before_the_model_loads(tiny_model_dir: Path, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import ictrl.models
    from ictrl.cli import main

    def no_load(*_: Any, **__: Any) -> None:
        raise AssertionError("the model loaded before the check")

    monkeypatch.setattr(ictrl.models, "load_model_and_tokenizer", no_load)
    argv = ["regime", "--model", str(tiny_model_dir), "--prompts", "studies.tasks.pathz", "--output-dir",
            str(tmp_path / "out")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("ictrl regime: error: --prompts: unknown source "
                                                         "'studies.tasks.pathz'"), err
    assert "studies.tasks.paths" in err and "importing it: No module named 'studies.tasks.pathz'" in err


# ---------------------------------------------------------------------------------------------------- the registry


def test_the_registry_takes_paths_by_its_module_path_with_its_own_recipe() -> None:
    assert get_task("studies.tasks.paths") is paths and get_task("studies.tasks:paths") is paths
    assert paths.reward.__name__ == "paths_reward" and paths.reward.__module__ == "studies.tasks.paths"  # pickles
    assert task_recipe("studies.tasks.paths") == {
        "task": "studies.tasks.paths", "difficulty": (4, 5, 6), "order_error": 0.5, "digit_error": 0.1,
        "train_problems": 1400, "patience": 12, "max_steps": 4000}


def test_a_cached_paths_base_is_found_again_from_the_recipe_it_recorded(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The base's recipe names the task by the module path it was given, which is in its cache key (another task,
    another base) and resolves the task again for the runs on it (``tinyrun.base_task``)."""
    import dataclasses

    from ictrl.experiments.grid import tinyrun
    from ictrl.experiments.tasks import tinymodel

    tiny = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, train_problems=200, max_steps=4,
                eval_every=2, dev_problems=4, dev_samples=1, batch_size=8)
    recipe = tinymodel.TinyRecipe(**{**task_recipe("studies.tasks.paths"), **tiny})
    others = {dataclasses.replace(recipe, task=t).key() for t in ("tinyarith", "studies.tasks.countdown")}
    assert len(others | {recipe.key()}) == 3  # the task alone changes the key
    base = tinymodel.build_tiny_base(recipe, cache_dir=tmp_path, log=lambda _: None)
    recorded = json.loads((base / "warm_start.json").read_text())["recipe"]
    assert recorded["task"] == "studies.tasks.paths" and tinymodel.TinyRecipe(**recorded) == recipe

    def rebuild(*_: Any, **__: Any) -> None:
        raise AssertionError("the cached base was built again")

    monkeypatch.setattr(tinymodel, "warm_start", rebuild)
    assert tinymodel.build_tiny_base(tinymodel.TinyRecipe(**recorded), cache_dir=tmp_path) == base
    assert tinyrun.base_task(base) == "studies.tasks.paths" and get_task(tinyrun.base_task(base)) is paths
    (task,) = tinyrun.tiny_eval_tasks(tinyrun.TinyRL(eval_problems=5), base)
    assert task.name == "paths" and all(p.id.startswith("paths-") for p in task.problems)
    assert tinyrun._max_new(base) == 10  # the longest default walk's 6 letters, EOS and slack


def test_tiny_model_exports_paths_with_the_studys_recipe(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``ictrl tiny-model --task studies.tasks.paths``: the paths rows and budget (tests/studies/test_horizon.py
    checks its recipe is the long-horizon study's)."""
    from ictrl.cli import main

    argv = ["tiny-model", str(tmp_path / "m"), "--untrained", "--task", "studies.tasks.paths", "--problems", "5"]
    assert main(argv) == 0
    rows = [json.loads(line) for line in (tmp_path / "m" / "train.jsonl").read_text().splitlines()]
    assert len(rows) == 5 and all(r["id"].startswith("paths-") for r in rows)
    assert json.loads((tmp_path / "m" / "generation_config.json").read_text())["max_new_tokens"] == 10
    assert "configs/tiny/ict.yaml" not in capsys.readouterr().out  # that config grades the arithmetic task
