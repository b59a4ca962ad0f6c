"""A user's selection rule held to ictrl's standard at its boundary (ictrl.core.rule_checks): every way its output
can be wrong is one ``SelectorError`` naming the rule as file:function, the step and what it returned or raised;
reading an undeclared input names the ``needs`` entry; options are typed by their defaults; NaN or inf scores are
refused by name; randomness comes from a generator seeded by (seed, step); a rule loads from path/to/file.py:NAME."""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from ictrl.core.checks import OptionError
from ictrl.core.selection import (
    SelectionInputs, SelectorError, get_selector, register_selector, selector_identity, top_fraction,
)

B, T = 4, 6
MASK = torch.arange(T)[None, :] < torch.tensor([6, 4, 1, 5])[:, None]
HERE = Path(__file__).name


def _inputs(step: int = 0, **stats: torch.Tensor) -> SelectionInputs:
    return SelectionInputs(mask=MASK, step=step, group_ids=torch.tensor([0, 0, 1, 1]), **stats)


def _rule(returns: Any, name: str = "test_returns") -> Any:
    @register_selector(name)
    def rule(inputs: SelectionInputs) -> Any:
        return returns(inputs)

    return get_selector(name)


WRONG = [  # what a rule returned, and what the one line must say of it
    (lambda i: None, r"returned None"),
    (lambda i: i.mask.float(), r"returned a torch.float32 tensor of shape \[4, 6\] on cpu .* a score is not a mask"),
    (lambda i: i.mask.long(), r"returned a torch.int64 tensor .* made one with `!= 0`"),
    (lambda i: i.mask.numpy(), r"returned numpy.ndarray of shape \(4, 6\), dtype bool .* torch.as_tensor"),
    (lambda i: i.mask[:, :1], r"returned a torch.bool tensor of shape \[4, 1\] .* not broadcast to whole responses"),
    (lambda i: i.mask[:3], r"returned a torch.bool tensor of shape \[3, 6\]"),
    (lambda i: i.mask.to("meta"), r"returned a torch.bool tensor of shape \[4, 6\] on meta .* inputs.mask.device"),
    (lambda i: [[True] * T] * B, r"returned list \["),
]


@pytest.mark.parametrize(("returns", "said"), WRONG, ids=["none", "float", "int", "numpy", "b1", "rows", "device",
                                                         "list"])
def test_what_is_not_a_mask_is_one_line_naming_the_rule_the_step_and_what_came_back(returns: Any, said: str) -> None:
    selector = _rule(returns)
    with pytest.raises(SelectorError) as err:
        selector.apply(_inputs(step=3), 0, {})
    message = str(err.value)
    assert "\n" not in message
    assert re.match(rf"selector \S*{HERE}:rule returned ", message), message
    assert " at step 3: a rule returns a torch.bool tensor of the mask's shape [4, 6] on cpu" in message
    assert re.search(said, message), message


def test_a_bool_mask_passes_and_padding_is_kept_by_choose_and_dropped_by_apply() -> None:
    selector = _rule(lambda i: torch.ones_like(i.mask))
    chosen = selector.choose(_inputs(), 0, {})
    assert chosen.all() and torch.equal(selector.apply(_inputs(), 0, {}), MASK)


@pytest.mark.parametrize("step", [0, 2])
def test_a_rule_that_raises_is_named_with_its_own_line_and_the_step(step: int) -> None:
    @register_selector("test_raises")
    def raises_late(inputs: SelectionInputs) -> torch.Tensor:
        if inputs.step >= step:
            return inputs.mask.float().mean(dim=2)  # an IndexError inside torch, from the rule's line
        return inputs.mask

    selector = get_selector("test_raises")
    if step:
        assert torch.equal(selector.apply(_inputs(step=0), 0, {}), MASK)
    with pytest.raises(SelectorError) as err:
        selector.apply(_inputs(step=step), 0, {})
    line = raises_late.__code__.co_firstlineno + 3
    assert re.fullmatch(
        rf"selector \S*{HERE}:raises_late raised IndexError: .* \(\S*{HERE}, line {line}\) at step {step}",
        str(err.value)), str(err.value)


@pytest.mark.parametrize("field", ["entropy", "mask", "advantages"])
def test_a_rule_that_writes_its_inputs_in_place_is_named(field: str) -> None:
    """The inputs are the tensors the run's metrics and the loss read afterwards: a write through them, or through
    a view of them, is refused; the same rule computing on a copy passes."""
    @register_selector("test_in_place", needs=("entropy", "advantages"))
    def in_place(inputs: SelectionInputs, *, copy: bool = False) -> torch.Tensor:
        value = getattr(inputs, field)
        value = value.clone() if copy else value
        value[:1].zero_()  # through a view of the first row
        return inputs.mask.clone()

    def fresh() -> SelectionInputs:  # the rule may write them: never the module's MASK
        return SelectionInputs(mask=MASK.clone(), step=2, entropy=torch.rand(B, T), advantages=torch.randn(B))

    selector = get_selector("test_in_place")
    with pytest.raises(SelectorError, match=rf"^selector \S*{HERE}:in_place wrote SelectionInputs.{field} in place "
                                            rf"at step 2: .*\(inputs.{field}.clone\(\)\)"):
        selector.apply(fresh(), 0, {})
    assert torch.equal(selector.apply(fresh(), 0, {"copy": True}), MASK)


def test_reading_an_undeclared_statistic_names_the_needs_entry() -> None:
    @register_selector("test_undeclared", needs=("entropy",))
    def undeclared(inputs: SelectionInputs) -> torch.Tensor:
        return top_fraction(inputs.renyi2, inputs, 0.5)

    stats = {name: torch.rand(B, T) for name in ("entropy", "renyi2")}
    with pytest.raises(SelectorError, match=r"undeclared reads inputs.renyi2 at step 1, which its needs does not "
                                            r"declare: .* needs=\(\.\.\., 'renyi2'\)"):
        get_selector("test_undeclared").apply(_inputs(step=1, **stats), 0, {})  # given, but not declared: refused
    # a per-response field the rule does not declare is refused only where it is None
    seen: list[Any] = []
    register_selector("test_groups")(lambda inputs: seen.append(inputs.group_ids) or inputs.mask)
    get_selector("test_groups").apply(_inputs(), 0, {})
    assert seen[0] is not None
    register_selector("test_advantages")(lambda inputs: inputs.advantages > 0)
    with pytest.raises(SelectorError, match=r"inputs.advantages .* needs=\(\.\.\., 'advantages'\)"):
        get_selector("test_advantages").apply(_inputs(), 0, {})


def test_options_are_keyword_only_with_defaults_and_typed_by_them() -> None:
    with pytest.raises(ValueError, match=r"option 'ratio' must be keyword-only .* def test_positional\(inputs, \*"):
        register_selector("test_positional")(lambda inputs, ratio=0.1: inputs.mask)
    with pytest.raises(ValueError, match=r"takes \*\*kw: name each option keyword-only"):
        register_selector("test_kwargs")(lambda inputs, **kw: inputs.mask)
    with pytest.raises(ValueError, match=r"option 'count' has no default"):
        register_selector("test_no_default")(lambda inputs, *, count: inputs.mask)
    with pytest.raises(ValueError, match=r"no positional parameter for its inputs"):
        register_selector("test_no_inputs")(lambda *, count=1: None)

    @register_selector("test_typed")
    def typed(inputs: SelectionInputs, *, count: int = 1, tau: float = 0.5, name: str = "a", flag: bool = False,
              steps: tuple = (1, 2), anything: Any = None) -> torch.Tensor:
        return inputs.mask

    selector = get_selector("test_typed")
    assert selector.resolve_options({"tau": 1, "steps": [3], "anything": {"x": 1}}) == {
        "count": 1, "tau": 1.0, "name": "a", "flag": False, "steps": (3,), "anything": {"x": 1}}
    for key, value, said in (("count", "abc", "count must be an int (its default is 1), got str 'abc'"),
                             ("count", 2.5, "count must be an int"), ("count", True, "count must be an int"),
                             ("tau", "0.3", "tau must be a number"), ("flag", 1, "flag must be true or false"),
                             ("name", 3, "name must be a string"), ("steps", 3, "steps must be a list")):
        with pytest.raises(OptionError) as err:
            selector.resolve_options({key: value})
        assert str(err.value).startswith(said) and err.value.field == key


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_top_fraction_over_a_score_that_is_not_finite_is_an_error_naming_it(bad: float) -> None:
    renyi2 = torch.rand(B, T)
    renyi2[1, 2] = bad
    if math.isnan(bad):  # a statistic that holds NaN is refused where the inputs are built
        with pytest.raises(ValueError, match="renyi2 holds NaN at active positions"):
            _inputs(renyi2=renyi2)
    else:
        with pytest.raises(ValueError, match=r"top_fraction's score \(inputs.renyi2\) is NaN or infinite at an "
                                             r"active position"):
            top_fraction(_inputs(renyi2=renyi2).renyi2, _inputs(renyi2=renyi2), 0.5)
    ratio = torch.rand(B, T)
    ratio[1, 2] = bad
    with pytest.raises(ValueError, match=r"top_fraction's score \(computed by the rule, not one of the inputs as "
                                         r"given\) is NaN or infinite"):
        top_fraction(ratio, _inputs(), 0.5)
    ratio[1, 5] = bad  # padding (row 1 has 4 tokens): may hold anything
    ratio[1, 2] = 0.0
    assert top_fraction(ratio, _inputs(), 0.5).sum() == 3 + 2 + 1 + 3
    entropy = torch.rand(B, T)
    entropy[0, 0] = math.inf
    with pytest.raises(ValueError, match=r"20-Entropy's score \(inputs.entropy\) is NaN or infinite"):
        get_selector("entropy")(_inputs(entropy=entropy))


def test_a_check_deferred_to_the_next_rollout_names_the_rule_and_the_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU the not-finite check is raised at the next rollout, outside the rule's call, so its own message
    names the rule and the step; a check raised at once (CPU) is named by the rule's error instead."""
    from ictrl.core import selection

    @register_selector("test_nan_rule", needs=("renyi2",))
    def nan_rule(inputs: SelectionInputs) -> torch.Tensor:
        return top_fraction(inputs.renyi2 * math.inf, inputs, 0.5)

    said: list[str] = []
    monkeypatch.setattr(selection, "require_on_device", lambda ok, message: said.append(message))
    monkeypatch.setattr(selection, "defers_on", lambda device: True)
    get_selector("test_nan_rule").apply(_inputs(step=7, renyi2=torch.rand(B, T)), 0, {})
    assert said and re.match(rf"selector \S*{HERE}:nan_rule at step 7: top_fraction's score \(computed by the "
                             r"rule, not one of the inputs as given\) is NaN or infinite", said[0]), said
    monkeypatch.setattr(selection, "defers_on", lambda device: False)
    said.clear()
    get_selector("test_nan_rule").apply(_inputs(step=7, renyi2=torch.rand(B, T)), 0, {})
    assert said[0].startswith("top_fraction's score"), said


def test_top_fraction_refuses_a_score_of_another_shape() -> None:
    with pytest.raises(ValueError, match=r"score must be a tensor of the mask's shape \[4, 6\], got a torch.float32 "
                                         r"tensor of shape \[4, 1\]"):
        top_fraction(torch.rand(B, 1), _inputs(), 0.5)


def test_the_generator_is_seeded_by_seed_and_step_and_metrics_reach_the_sink() -> None:
    logged: list[tuple[str, float]] = []

    @register_selector("test_draws")
    def draws(inputs: SelectionInputs, *, ratio: float = 0.5) -> torch.Tensor:
        inputs.log_metric("drawn", torch.tensor(2.0))
        inputs.log_metric("ratio", ratio)
        return top_fraction(torch.rand(inputs.mask.shape, generator=inputs.generator), inputs, ratio)

    def run(seed: int, step: int) -> torch.Tensor:
        inputs = SelectionInputs(mask=MASK, step=step, seed=seed, metric_sink=lambda n, v: logged.append((n, v)))
        return get_selector("test_draws").apply(inputs, 0, {"ratio": 0.5})

    torch.manual_seed(1)
    first = run(0, 5)
    torch.manual_seed(2)  # torch's global generator plays no part
    assert torch.equal(first, run(0, 5))
    assert any(not torch.equal(first, run(0, s)) for s in range(6, 12))
    assert any(not torch.equal(first, run(s, 5)) for s in range(1, 7))
    assert logged[:2] == [("drawn", 2.0), ("ratio", 0.5)]
    SelectionInputs(mask=MASK).log_metric("dropped", 1.0)  # no sink: nothing to receive it, no error
    with pytest.raises(TypeError, match=r"log_metric\('x'\) takes a number, got str"):
        SelectionInputs(mask=MASK).log_metric("x", "1.0")


RULE_FILE = '''
from ictrl.core.selection import register_selector, top_fraction

@register_selector("file_h2", needs=("renyi2",))
def top_h2(inputs, *, ratio=0.25):
    return top_fraction(inputs.renyi2, inputs, ratio)

def plain(inputs):
    return inputs.mask
'''


def test_a_rule_from_its_file_by_path_and_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rules = tmp_path / "sub" / "my_rules.py"
    rules.parent.mkdir()
    rules.write_text(RULE_FILE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # a rule file's folder: this test's only
    try:
        selector = get_selector("sub/my_rules.py:top_h2")
        assert selector.name == "file_h2" and selector.spec == f"{rules.resolve()}:top_h2"
        assert get_selector(selector.spec) is selector  # another process finds it by its spec
        plain = get_selector("sub/my_rules.py:plain")  # undecorated: registered by the spec as given
        assert plain.name == "sub/my_rules.py:plain" and plain.spec == f"{rules.resolve()}:plain"
        assert get_selector(plain.spec) is plain
        identity = selector_identity(selector, {"ratio": 0.5})
        assert identity["file"] == str(rules.resolve()) and identity["options"] == {"ratio": 0.5}
        assert selector.rule == "sub/my_rules.py:top_h2"
        with pytest.raises(ValueError, match=r"^selector 'sub/nope.py:f': no file sub/nope.py"):
            get_selector("sub/nope.py:f")
        with pytest.raises(ValueError, match=r"^selector 'sub/my_rules.py:missing': sub/my_rules.py defines no "
                                             r"'missing'$"):
            get_selector("sub/my_rules.py:missing")
        (tmp_path / "broken.py").write_text("import torch\n\n1 / 0\n")
        with pytest.raises(ValueError, match=r"^selector 'broken.py:f': cannot import it: ZeroDivisionError: "
                                             r"division by zero \(.*broken.py, line 3\)$"):
            get_selector("broken.py:f")
    finally:
        for name in [m for m in sys.modules if m.startswith("ictrl_rules_")]:
            sys.modules.pop(name)


def test_identity_of_a_users_rule_is_its_file_hash_and_options(h2rule: Path) -> None:
    selector = get_selector("h2rule:top_h2")
    assert selector.rule == "h2rule.py:top_h2"  # relative to the working directory
    with pytest.raises(OptionError, match="ratio must be"):
        selector_identity(selector, {"ratio": 2.0})
    assert np.isclose(selector_identity(selector, {"ratio": 0.3})["options"]["ratio"], 0.3)


def test_a_rule_file_edited_and_loaded_again_replaces_its_rule(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    rules = tmp_path / "my_rules.py"
    rules.write_text(RULE_FILE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # a rule file's folder: this test's only
    try:
        before = get_selector("my_rules.py:top_h2")
        old_hash = selector_identity(before, {})["sha256"]
        rules.write_text(RULE_FILE.replace("ratio=0.25", "ratio=0.5"))
        for name in [m for m in sys.modules if m.startswith("ictrl_rules_")]:
            sys.modules.pop(name)
        after = get_selector("my_rules.py:top_h2")  # the same file, loaded again in the same process
        assert after is not before and after.options == {"ratio": 0.5} and get_selector("file_h2") is after
        assert selector_identity(after, {})["sha256"] != old_hash
    finally:
        for name in [m for m in sys.modules if m.startswith("ictrl_rules_")]:
            sys.modules.pop(name)


def test_a_mistake_at_registration_names_the_users_line_not_ictrls(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "clash.py").write_text("from ictrl.core.selection import register_selector\n\n\n"
                                       "@register_selector('ict')\ndef mine(inputs):\n    return inputs.mask\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # a rule file's folder: this test's only
    with pytest.raises(ValueError) as err:
        get_selector("clash.py:mine")
    assert str(err.value) == (f"selector 'clash.py:mine': cannot import it: ValueError: selector 'ict' is already "
                              f"registered ({(tmp_path / 'clash.py').resolve()}, line 4)")


def test_a_rule_file_imports_the_modules_beside_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    (folder / "rule_helpers_beside.py").write_text("RATIO = 0.5\n")
    (folder / "uses_helper.py").write_text("from rule_helpers_beside import RATIO\n\n"
                                           "def half(inputs, *, ratio=RATIO):\n    return inputs.mask\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the folder appended for this test only
    try:
        assert get_selector("elsewhere/uses_helper.py:half").options == {"ratio": 0.5}
        assert sys.path[-1] == str(folder.resolve())
    finally:
        for name in [m for m in sys.modules if m.startswith("ictrl_rules_") or m == "rule_helpers_beside"]:
            sys.modules.pop(name)


def test_method_md_states_a_custom_rules_true_defaults() -> None:
    """docs/method.md's "Write your own rule" says what a rule registered without method defaults gets: no warm-up
    (ICT's Θ is its own registration's) and ICT's normaliser."""
    text = " ".join((Path(__file__).resolve().parents[2] / "docs" / "method.md").read_text().split())
    register_selector("test_plain_defaults")(lambda inputs: inputs.mask)
    plain, ict = get_selector("test_plain_defaults"), get_selector("ict")
    assert plain.warmup_steps == 0 and ict.warmup_steps == 10 and plain.normalization == ict.normalization
    assert (f"Its defaults are no warm-up (ICT's Θ is {ict.warmup_steps}) and ICT's `{ict.normalization}` "
            "normaliser of §5") in text
