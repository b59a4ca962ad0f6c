"""Selectors against plain-Python references (float64, explicit loops)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from ictrl.core.reference import ceil_count
from ictrl.core.reference import top_k_per_unit as naive_top_k
from ictrl.core.selection import SELECTORS, SelectionInputs, get_selector, register_selector, select


def ragged_batch(seed: int = 0, B: int = 6, T: int = 13) -> SelectionInputs:
    g = torch.Generator().manual_seed(seed)
    lengths = [13, 7, 0, 1, 10, 4][:B]  # includes an all-masked row and a single-token row
    mask = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
    # coarse scores so that ties occur
    score = torch.randint(0, 4, (B, T), generator=g).double() / 4
    entropy = torch.rand(B, T, generator=g, dtype=torch.float64)
    return SelectionInputs(
        mask=mask,
        ict_score=score,
        entropy=entropy,
        prob=torch.rand(B, T, generator=g, dtype=torch.float64),
        advantages=torch.tensor([1.0, -1.0, 0.5, 2.0, 0.0, 1.0][:B]),
        group_ids=torch.tensor([7, 3, 7, 3, 9, 7][:B]),  # non-adjacent groups
    )


def test_registry_lists_six_selectors() -> None:
    assert set(SELECTORS) == {"all", "ict", "entropy", "stapo", "random", "frequent"}
    assert get_selector("ict").needs == frozenset({"ict_score"})
    assert get_selector("stapo").needs == frozenset({"entropy", "prob", "advantages"})
    assert get_selector("all").needs == frozenset()


def test_all_is_mask() -> None:
    inputs = ragged_batch()
    assert torch.equal(select("all", inputs), inputs.mask)


@pytest.mark.parametrize("scope", ["response", "group", "batch"])
@pytest.mark.parametrize("ratio", [0.1, 0.25, 0.5, 1.0])
def test_ict_matches_naive_reference(scope: str, ratio: float) -> None:
    inputs = ragged_batch()
    got = select("ict", inputs, ratio=ratio, scope=scope)
    unit = {"response": list(range(6)), "group": inputs.group_ids.tolist(), "batch": [0] * 6}[scope]
    assert torch.equal(got, naive_top_k(inputs.ict_score, inputs.mask, unit, ratio))
    assert not bool((got & ~inputs.mask).any())
    if scope == "response":
        for b in range(6):
            n = int(inputs.mask[b].sum())
            assert int(got[b].sum()) == ceil_count(ratio, n)


def test_counts_use_ceil_without_float_overshoot() -> None:
    # 0.07 * 100 == 7.000000000000001 in binary floating point; a plain ceil would give 8.
    for ratio, n in [(0.07, 100), (0.1, 1), (0.1, 9), (0.1, 10), (0.1, 11), (0.29, 100), (0.2, 3)]:
        inputs = SelectionInputs(mask=torch.ones(1, n, dtype=torch.bool), ict_score=torch.rand(1, n))
        assert int(select("ict", inputs, ratio=ratio).sum()) == ceil_count(ratio, n), (ratio, n)


def test_ties_prefer_earlier_positions() -> None:
    mask = torch.ones(3, 8, dtype=torch.bool)
    mask[0, :2] = False
    inputs = SelectionInputs(mask=mask, ict_score=torch.zeros(3, 8), entropy=torch.ones(3, 8))
    per_row = select("ict", inputs, ratio=0.25)
    assert per_row[0].nonzero().flatten().tolist() == [2, 3]
    assert per_row[1].nonzero().flatten().tolist() == [0, 1]
    # batch scope: ceil(0.25 * 22) = 6 -> the six lowest flat indices among active positions
    batch = select("entropy", inputs, ratio=0.25, scope="batch")
    assert batch.flatten().nonzero().flatten().tolist() == [2, 3, 4, 5, 6, 7]


def test_masked_positions_never_count() -> None:
    mask = torch.tensor([[True, True, False, False]])
    score = torch.tensor([[0.1, 0.2, 9.0, 9.0]])
    got = select("ict", SelectionInputs(mask=mask, ict_score=score), ratio=0.5)
    assert got.tolist() == [[False, True, False, False]]


def test_group_scope_ranks_across_non_adjacent_rows() -> None:
    mask = torch.ones(4, 2, dtype=torch.bool)
    # group 5 = rows 0 and 2; group 1 = rows 1 and 3. Row 0 holds all of group 5's best scores.
    score = torch.tensor([[0.9, 0.8], [0.1, 0.2], [0.3, 0.4], [0.6, 0.5]])
    inputs = SelectionInputs(mask=mask, ict_score=score, group_ids=torch.tensor([5, 1, 5, 1]))
    got = select("ict", inputs, ratio=0.5, scope="group")  # k = 2 of 4 per group
    assert got.tolist() == [[True, True], [False, False], [False, False], [True, True]]
    per_response = select("ict", inputs, ratio=0.5, scope="response")
    assert per_response.sum(dim=1).tolist() == [1, 1, 1, 1]


def test_warmup_returns_whole_mask() -> None:
    base = ragged_batch()
    for step, warming_up in [(0, True), (4, True), (5, False), (9, False)]:
        inputs = SelectionInputs(mask=base.mask, step=step, ict_score=base.ict_score)
        ict = select("ict", inputs, warmup_steps=5)
        freq = select("frequent", inputs, warmup_steps=5)
        if warming_up:
            assert torch.equal(ict, base.mask) and torch.equal(freq, base.mask)
        else:
            assert int(ict.sum()) < int(base.mask.sum())
            assert torch.equal(freq, base.mask & ~ict)


def test_entropy_batch_vs_response_scope() -> None:
    mask = torch.ones(2, 10, dtype=torch.bool)
    entropy = torch.cat([torch.linspace(2.0, 3.0, 10)[None], torch.linspace(0.0, 1.0, 10)[None]])
    inputs = SelectionInputs(mask=mask, entropy=entropy)
    batch = select("entropy", inputs)  # default ratio 0.2, scope batch: 4 tokens, all in row 0
    assert batch.sum(dim=1).tolist() == [4, 0]
    assert batch[0].nonzero().flatten().tolist() == [6, 7, 8, 9]
    response = select("entropy", inputs, scope="response")
    assert response.sum(dim=1).tolist() == [2, 2]
    assert response[1].nonzero().flatten().tolist() == [8, 9]


@pytest.mark.parametrize("scope", ["batch", "response"])
def test_entropy_ties_include_equals_trl_quantile_rule(scope: str) -> None:
    """ties='include' keeps every token whose entropy reaches the k-th highest of its unit, k = ceil(0.2 n): for
    the batch scope TRL's rule, entropy >= torch.quantile(entropies, 0.8); 'position' keeps exactly k."""
    g = torch.Generator().manual_seed(5)
    entropy = torch.randint(0, 4, (4, 9), generator=g).double() / 4  # four values only: ties everywhere
    mask = torch.rand(4, 9, generator=g) < 0.8
    mask[3] = False  # an empty response
    inputs = SelectionInputs(mask=mask, entropy=entropy)
    got = select("entropy", inputs, scope=scope, ties="include")
    exact = select("entropy", inputs, scope=scope)
    units = [list(range(4))] if scope == "batch" else [[b] for b in range(4)]
    for rows in units:
        values = sorted((float(entropy[b, t]) for b in rows for t in range(9) if mask[b, t]), reverse=True)
        k = ceil_count(0.2, len(values))
        for b in rows:
            for t in range(9):
                assert bool(got[b, t]) == bool(mask[b, t] and k and entropy[b, t] >= values[k - 1])
        assert int(exact[rows].sum()) == k
        if scope == "batch":  # TRL's top_entropy_quantile=0.2 rule on the same tokens
            assert torch.equal(got, mask & (entropy >= torch.quantile(entropy[mask], 0.8)))
    assert int(got.sum()) > int(exact.sum())  # this batch has ties at the cut
    with pytest.raises(ValueError, match="ties"):
        select("entropy", inputs, ties="all")


def naive_stapo(inputs: SelectionInputs, tau_p: float, q: float) -> torch.Tensor:
    B, T = inputs.mask.shape
    candidates = [
        (float(inputs.entropy[b, t]), b * T + t)
        for b in range(B)
        for t in range(T)
        if inputs.mask[b, t] and float(inputs.advantages[b]) > 0 and float(inputs.prob[b, t]) < tau_p
    ]
    kept = inputs.mask.clone().flatten()
    for _, flat in sorted(candidates)[: ceil_count(q, len(candidates))]:
        kept[flat] = False
    return kept.view(B, T)


def test_stapo_each_condition_is_required() -> None:
    tau = 0.002
    # row 0: A > 0; row 1: A < 0; row 2: A == 0 (not positive); row 3: A > 0 but its tokens are masked.
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 1, 1, 1]], dtype=torch.bool)
    prob = torch.tensor([
        [0.001, 0.001, 0.5, 0.001, 0.001],   # pos 2 fails prob (prob >= tau) despite the lowest entropy
        [0.001, 0.001, 0.001, 0.001, 0.001],  # advantage < 0: nothing silenced
        [0.001, 0.001, 0.001, 0.001, 0.001],  # advantage == 0: nothing silenced
        [0.001, 0.001, 0.9, 0.9, 0.9],        # masked low-prob tokens must not enter the quantile
    ])
    entropy = torch.tensor([
        [0.1, 0.2, 0.0, 0.3, 5.0],            # pos 4: candidate but high entropy -> kept
        [0.0, 0.0, 0.0, 0.0, 0.0],
        [0.0, 0.0, 0.0, 0.0, 0.0],
        [0.0, 0.0, 0.0, 0.0, 0.0],
    ])
    inputs = SelectionInputs(mask=mask, entropy=entropy, prob=prob, advantages=torch.tensor([1.0, -1.0, 0.0, 3.0]))
    kept = select("stapo", inputs, tau_p=tau, q=0.75)
    # candidates: row 0 positions 0, 1, 3, 4 (n = 4) -> ceil(0.75 * 4) = 3 lowest entropies: 0, 1, 3
    expected = mask.clone()
    expected[0, [0, 1, 3]] = False
    assert torch.equal(kept, expected)
    assert torch.equal(kept, naive_stapo(inputs, tau, 0.75))


def test_stapo_matches_naive_reference_on_random_batch() -> None:
    g = torch.Generator().manual_seed(3)
    B, T = 8, 40
    mask = torch.rand(B, T, generator=g) < 0.8
    inputs = SelectionInputs(
        mask=mask,
        entropy=torch.randint(0, 5, (B, T), generator=g).double(),  # ties
        prob=torch.rand(B, T, generator=g, dtype=torch.float64) * 0.01,
        advantages=torch.randn(B, generator=g),
    )
    for tau, q in [(0.002, 0.75), (0.005, 0.8), (0.01, 1.0), (0.003, 0.01)]:
        assert torch.equal(select("stapo", inputs, tau_p=tau, q=q), naive_stapo(inputs, tau, q))


def test_stapo_without_candidates_keeps_mask() -> None:
    inputs = SelectionInputs(mask=torch.ones(2, 3, dtype=torch.bool), entropy=torch.zeros(2, 3),
                             prob=torch.full((2, 3), 0.5), advantages=torch.tensor([1.0, 1.0]))
    assert torch.equal(select("stapo", inputs), inputs.mask)


def test_random_reproducible_and_counts_match_ict() -> None:
    base = ragged_batch()
    rng_before = torch.get_rng_state()

    def draw(step: int, seed: int, scope: str = "response") -> torch.Tensor:
        inputs = SelectionInputs(mask=base.mask, step=step, ict_score=base.ict_score, group_ids=base.group_ids)
        return select("random", inputs, ratio=0.3, scope=scope, seed=seed)

    assert torch.equal(draw(3, 1), draw(3, 1))
    assert not torch.equal(draw(3, 1), draw(4, 1))
    assert not torch.equal(draw(3, 1), draw(3, 2))
    assert torch.equal(torch.get_rng_state(), rng_before)  # global RNG untouched
    for scope in ("response", "group", "batch"):
        inputs = SelectionInputs(mask=base.mask, ict_score=base.ict_score, group_ids=base.group_ids)
        ict = select("ict", inputs, ratio=0.3, scope=scope)
        rnd = draw(0, 0, scope)
        assert not bool((rnd & ~base.mask).any())
        unit = {"response": range(6), "group": base.group_ids.tolist(), "batch": [0] * 6}[scope]
        for u in set(unit):
            rows = [b for b, v in enumerate(unit) if v == u]
            assert int(rnd[rows].sum()) == int(ict[rows].sum())


def test_random_is_uniform() -> None:
    # One row of 10 active tokens, ratio 0.1 -> one pick per step. Over 2000 steps each position is hit
    # Binomial(2000, 0.1) times: mean 200, sd 13.4; 150..250 is beyond 3.7 sd.
    mask = torch.ones(1, 10, dtype=torch.bool)
    hits = torch.zeros(10)
    for step in range(2000):
        hits += select("random", SelectionInputs(mask=mask, step=step)).double().flatten()
    assert int(hits.sum()) == 2000
    assert bool((hits > 150).all() and (hits < 250).all()), hits.tolist()


@pytest.mark.parametrize("scope", ["response", "group", "batch"])
def test_frequent_is_complement_of_ict(scope: str) -> None:
    inputs = ragged_batch()
    ict = select("ict", inputs, scope=scope)
    freq = select("frequent", inputs, scope=scope)
    assert not bool((ict & freq).any())
    assert torch.equal(ict | freq, inputs.mask)


def test_errors_name_the_problem() -> None:
    inputs = ragged_batch()
    with pytest.raises(ValueError, match="unknown selector 'nope'"):
        select("nope", inputs)
    with pytest.raises(ValueError, match="rato"):
        select("ict", inputs, rato=0.1)
    with pytest.raises(ValueError, match="ict_score"):
        select("ict", SelectionInputs(mask=inputs.mask))
    with pytest.raises(ValueError, match="advantages"):
        select("stapo", SelectionInputs(mask=inputs.mask, entropy=inputs.entropy, prob=inputs.prob))
    for bad in (0.0, 1.5, -0.1, "0.1", True):
        with pytest.raises(ValueError, match="ratio"):
            select("ict", inputs, ratio=bad)
    with pytest.raises(ValueError, match="scope"):
        select("ict", inputs, scope="prompt")
    with pytest.raises(ValueError, match="scope"):
        select("entropy", inputs, scope="group")
    with pytest.raises(ValueError, match="group_ids"):
        select("ict", SelectionInputs(mask=inputs.mask, ict_score=inputs.ict_score), scope="group")
    with pytest.raises(ValueError, match="q"):
        select("stapo", inputs, q=0.0)
    with pytest.raises(ValueError, match="tau_p"):
        select("stapo", inputs, tau_p=-1.0)
    with pytest.raises(ValueError, match="warmup_steps"):
        select("ict", inputs, warmup_steps=-1)
    with pytest.raises(ValueError, match="mask"):
        SelectionInputs(mask=torch.tensor([[0, 2]]))
    with pytest.raises(ValueError, match="ict_score"):
        SelectionInputs(mask=torch.ones(2, 3, dtype=torch.bool), ict_score=torch.zeros(2, 4))
    with pytest.raises(ValueError, match="group_ids"):
        SelectionInputs(mask=torch.ones(2, 3, dtype=torch.bool), group_ids=torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="already registered"):
        register_selector("ict")(lambda inputs: inputs.mask)


def test_zero_one_mask_is_accepted() -> None:
    inputs = SelectionInputs(mask=torch.tensor([[1, 1, 0]]), ict_score=torch.tensor([[0.0, 1.0, 5.0]]))
    assert inputs.mask.dtype == torch.bool
    assert select("ict", inputs, ratio=0.5).tolist() == [[False, True, False]]


@pytest.mark.gpu
def test_random_same_on_cuda_as_cpu() -> None:
    base = ragged_batch()
    cpu = select("random", SelectionInputs(mask=base.mask, step=7), seed=3)
    gpu = select("random", SelectionInputs(mask=base.mask.cuda(), step=7), seed=3)
    assert gpu.device.type == "cuda"
    assert torch.equal(cpu, gpu.cpu())
    inputs = SelectionInputs(mask=base.mask.cuda(), ict_score=base.ict_score.cuda(), group_ids=base.group_ids.cuda())
    for scope in ("response", "group", "batch"):
        unit = {"response": list(range(6)), "group": base.group_ids.tolist(), "batch": [0] * 6}[scope]
        assert torch.equal(select("ict", inputs, scope=scope).cpu(), naive_top_k(base.ict_score, base.mask, unit, 0.1))


# ------------------------------------------------------------------------ one place for methods

_REPO = Path(__file__).resolve().parents[2]
_SRC = _REPO / "src" / "ictrl"
_DEFAULT_KEYS = {"ratio", "selection_ratio", "scope", "selection_scope", "selection_warmup_steps", "selection_warmup",
                 "tau_p", "q", "normalization", "loss_normalization", "stapo_tau_p", "stapo_q"}
# A plan's setting, not a method default: --quick trains 2 steps, so Θ = 0 lets selection run at all.
_DEFAULT_ALLOWED = {("experiments/grid/cli.py", "selection_warmup"), ("studies/horizoncli.py", "selection_warmup")}
# Recorded results, not method definitions: the tuned study's chosen lr and normaliser per method.
_NAMES_ALLOWED = {"studies/protocols/horizon.py"}


def _sources() -> list[tuple[str, Path]]:
    """The package's modules (named relative to src/ictrl) and the studies' (named from the repository root): the
    studies read methods from the registry as the package does."""
    package = [(p.relative_to(_SRC).as_posix(), p) for p in sorted(_SRC.rglob("*.py"))]
    studies = [(p.relative_to(_REPO).as_posix(), p) for p in sorted((_REPO / "studies").rglob("*.py"))]
    assert studies, "the studies' modules are scanned too"
    return package + studies


def _method_names() -> set[str]:
    from ictrl.core.selection import method_names

    return set(method_names())


def _literal_strings(node: ast.AST) -> list[str]:
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        items = node.elts
    elif isinstance(node, ast.Dict):
        items = [k for k in node.keys if k is not None]
    elif isinstance(node, ast.Compare):
        items = node.comparators
    else:
        return []
    return [e.value for e in items if isinstance(e, ast.Constant) and isinstance(e.value, str)]


def test_selector_names_are_listed_only_by_the_registry() -> None:
    """No module but selection.py writes a list of methods (three or more names in one literal; a pair such as
    the report's ICT − random10 row, or statistic fields named entropy/ict, is not a list) or branches on a
    method name: everything else reads the registry (a new selector is one decorated function)."""
    names = _method_names()
    bad = []
    for rel, path in _sources():
        if rel == "core/selection.py" or rel in _NAMES_ALLOWED:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            hits = frozenset(s for s in _literal_strings(node) if s in names)
            compared = isinstance(node, ast.Compare) and hits and rel != "engine/config_fields.py"  # report_to: "all"
            if len(hits) >= 3 or compared:
                bad.append(f"{rel}:{node.lineno}: {sorted(hits)}")
    assert not bad, "\n".join(bad)


def test_method_defaults_are_set_only_by_the_registry() -> None:
    """No module but selection.py gives a selection option a default value (ratio, scope, Θ, normaliser, STAPO's
    τ_p / q): None ("the selector's default") is the only default allowed elsewhere."""
    bad = []
    for rel, path in _sources():
        if rel == "core/selection.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            pairs: list[tuple[str, ast.AST]] = []
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                value = node.value
                if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "field":
                    value = next((k.value for k in value.keywords if k.arg == "default"), ast.Constant(None))
                pairs.append((node.target.id, value))
            elif isinstance(node, ast.arguments):
                args = node.args[len(node.args) - len(node.defaults):] if node.defaults else []
                pairs += list(zip((a.arg for a in args), node.defaults))
                pairs += [(a.arg, d) for a, d in zip(node.kwonlyargs, node.kw_defaults) if d is not None]
            elif isinstance(node, ast.keyword) and node.arg is not None:
                pairs.append((node.arg, node.value))
            for name, value in pairs:
                if name in _DEFAULT_KEYS and isinstance(value, ast.Constant) and value.value is not None \
                        and (rel, name) not in _DEFAULT_ALLOWED:
                    bad.append(f"{rel}:{getattr(node, 'lineno', '?')}: {name}={value.value!r}")
    assert not bad, "\n".join(bad)


def test_registry_records_each_method_once() -> None:
    from ictrl.core.selection import SELECTORS, method_names

    assert len(method_names()) == len(set(method_names()))
    labels = {s.label: s.name for s in SELECTORS.values()}
    assert labels == {"grpo": "all", "entropy20": "entropy", "stapo": "stapo", "ict": "ict", "random10": "random",
                      "frequent90": "frequent"}
    for selector in SELECTORS.values():
        assert get_selector(selector.label) is selector and selector.help
        assert selector.resolve_options() == selector.options


def test_warmup_is_resolved_once_from_the_registration() -> None:
    ict = get_selector("ict")
    assert ict.resolve_warmup() == ict.warmup_steps == 10 and ict.resolve_warmup(0) == 0
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(ValueError, match="warmup_steps must be an int >= 0"):
            ict.resolve_warmup(bad)
    with pytest.raises(ValueError, match="normalization must be one of"):
        register_selector("test_bad_norm", normalization="mean")(lambda inputs: inputs.mask)
    with pytest.raises(ValueError, match="warmup_steps"):
        register_selector("test_bad_warmup", warmup_steps=-2)(lambda inputs: inputs.mask)
    assert "test_bad_norm" not in SELECTORS and "test_bad_warmup" not in SELECTORS


def test_option_errors_carry_the_option_name() -> None:
    from ictrl.core.checks import OptionError

    for selector, given, field in [("ict", {"ratio": 0.0}, "ratio"), ("ict", {"scope": "prompt"}, "scope"),
                                   ("random", {"seed": -1}, "seed"), ("stapo", {"tau_p": 2.0}, "tau_p"),
                                   ("entropy", {"ties": "all"}, "ties")]:
        with pytest.raises(OptionError) as err:
            get_selector(selector).resolve_options(given)
        assert err.value.field == field and str(err.value).startswith(f"{field} must be")


def test_a_rule_may_read_every_token_statistic_under_its_own_name() -> None:
    """needs accepts each field of TokenStats (the list is TokenStats's own), and SelectionInputs.from_stats hands
    a rule the fields asked for, each under its name."""
    import dataclasses

    from ictrl.core.selection import STAT_FIELDS, get_selector, needed_stats, register_selector, top_fraction
    from ictrl.core.stats import TokenStats

    assert STAT_FIELDS == tuple(f.name for f in dataclasses.fields(TokenStats))
    g = torch.Generator().manual_seed(5)
    mask = torch.rand(3, 9, generator=g) < 0.7
    stats = TokenStats(**{f: torch.rand(3, 9, generator=g) for f in STAT_FIELDS})
    for field in STAT_FIELDS:
        register_selector(f"test_top_{field}", needs=(field,))(
            lambda inputs, *, ratio=0.3, field=field: top_fraction(getattr(inputs, field), inputs, ratio))
        selector = get_selector(f"test_top_{field}")
        assert needed_stats(selector) == {field} and needed_stats(selector, warming_up=True) == set()
        inputs = SelectionInputs.from_stats(mask, stats, needed_stats(selector))
        assert all((getattr(inputs, f) is None) == (f != field) for f in STAT_FIELDS)
        want = naive_top_k(getattr(stats, field).double(), mask, list(range(3)), 0.3)
        assert torch.equal(selector(inputs), want)
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['h3'\]"):
        register_selector("test_h3", needs=("h3",))
    register_selector("test_one_string", needs="renyi2")(lambda inputs: inputs.mask)  # one name, not its letters
    assert get_selector("test_one_string").needs == {"renyi2"}
