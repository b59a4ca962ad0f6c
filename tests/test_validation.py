"""A value entering ictrl is checked one way: a dataclass field declares its bound in its type (annotated-types),
and ``ictrl.validation.check_fields`` holds the instance to it with pydantic; a file's value is read by the same
module. The public core functions keep ``ictrl.core.checks`` for their own arguments. The census below counts the
mechanisms, so another one cannot come back unnoticed."""

from __future__ import annotations

import ast
import importlib
import math
from pathlib import Path
from typing import Any

import pytest
from annotated_types import Ge, Gt, Interval, MinLen

from ictrl import validation
from ictrl.validation import bound_text, declared, ends, field_error, type_text

SRC = Path(__file__).resolve().parents[1] / "src" / "ictrl"
CORE_CHECKS = ("check_number", "check_tensor")
PRIVATE_ARGPARSE = ("_actions", "_get_values", "_get_value", "_option_string_actions")
BOUND_NAMES = {"AT_LEAST_ONE", "POSITIVE", "NON_NEGATIVE", "UNIT", "SEED", "NUCLEUS", "Ge", "Gt", "Le", "Lt",
               "Interval", "MinLen"}

# The bodies of __post_init__ that still raise, and why each rule is code and not a declaration (the count of
# raise statements in the method itself).
POST_INIT_RAISES = {
    "ictrl.core.loss.LossSpec": (2, "the core's public API: its numbers go through check_number"),
    "ictrl.data.registry.Benchmark": (2, "between fields: a hub_id or a local_path; a choice benchmark's choices"),
    "ictrl.eval.harness.EvalConfig": (4, "ks against n (between fields); ks and seeds distinct and non-empty"),
    "ictrl.experiments.grid.tinyrun.TinyRL": (1, "between fields: eval_ks within eval_n"),
    "ictrl.experiments.tasks.tinymodel.TinyRecipe": (1, "between fields: hidden_size divides by the heads"),
    "ictrl.experiments.rollouts.Rollout": (7, "a saved row's shape: every list as long as its tokens, per item"),
    "ictrl.rewards.extraction.MathExtractor": (1, "order: a tuple of known steps, named as a list"),
    "ictrl.train_cli.run_config.ScriptArguments": (4, "values read from a flag's YAML text first: names, weights"),
}


def _modules() -> list[tuple[str, ast.Module]]:
    out = []
    for path in sorted(SRC.rglob("*.py")):
        parts = [p for p in path.relative_to(SRC).with_suffix("").parts if p != "__init__"]
        out.append((".".join(["ictrl", *parts]), ast.parse(path.read_text(encoding="utf-8"))))
    return out


MODULES = _modules()


def _imported_names(tree: ast.Module) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return names


def _mechanisms() -> dict[str, str]:
    """Each module that checks values by a mechanism of its own -> which: pydantic, or the core's checks."""
    found = {}
    for name, tree in MODULES:
        imported = _imported_names(tree)
        if any(i.split(".")[0] == "pydantic" for i in imported):
            found[name] = "pydantic"
        defined = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        if defined & set(CORE_CHECKS):
            found[name] = "core checks"
    return found


def test_two_mechanisms_check_values() -> None:
    assert _mechanisms() == {"ictrl.validation": "pydantic", "ictrl.core.checks": "core checks"}


def test_only_the_core_uses_the_core_checks() -> None:
    outside = sorted(f"{name} imports {i}" for name, tree in MODULES if not name.startswith("ictrl.core")
                     for i in _imported_names(tree) if i.rsplit(".", 1)[-1] in CORE_CHECKS)
    assert outside == []


def test_no_range_class_and_no_private_argparse() -> None:
    classes = [f"{name}.{n.name}" for name, tree in MODULES for n in ast.walk(tree)
               if isinstance(n, ast.ClassDef) and n.name in ("Range", "Bound")]
    assert classes == []
    private = sorted(f"{name}: {n.attr}" for name, tree in MODULES for n in ast.walk(tree)
                     if isinstance(n, ast.Attribute) and n.attr in PRIVATE_ARGPARSE)
    assert private == []


def _bounded_classes() -> dict[str, ast.ClassDef]:
    """Every class whose fields declare a bound in their annotation (``Annotated[..., AT_LEAST_ONE]``)."""
    out = {}
    for name, tree in MODULES:
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            for stmt in cls.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.annotation, ast.Subscript) and any(
                        isinstance(n, (ast.Name, ast.Attribute)) and getattr(n, "id", getattr(n, "attr", "")) in
                        BOUND_NAMES for n in ast.walk(stmt.annotation)):
                    out[f"{name}.{cls.name}"] = cls
    return out


BOUNDED = _bounded_classes()


def _post_init(cls: ast.ClassDef) -> ast.FunctionDef | None:
    return next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__post_init__"), None)


def test_every_class_that_declares_a_bound_checks_it_in_post_init() -> None:
    assert len(BOUNDED) >= 8  # the walk finds the config classes, the eval, data and task settings
    unchecked = [name for name, cls in BOUNDED.items() if (init := _post_init(cls)) is None or not any(
        isinstance(n, ast.Call) and getattr(n.func, "id", getattr(n.func, "attr", "")) == "check_fields"
        for n in ast.walk(init))]
    assert unchecked == []


def test_the_raises_left_in_post_init_are_tabled() -> None:
    found = {}
    for name, tree in MODULES:
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            init = _post_init(cls)
            count = sum(isinstance(n, ast.Raise) for n in ast.walk(init)) if init is not None else 0
            if count:
                found[f"{name}.{cls.name}"] = count
    assert found == {name: count for name, (count, _) in POST_INIT_RAISES.items()}


def _outside(bound: Any) -> Any:
    edges = ends(bound)
    if "gt" in edges or "ge" in edges:
        return edges["gt"] if "gt" in edges else edges["ge"] - 1
    return edges["lt"] if "lt" in edges else edges["le"] + 1


def _declarations() -> list[tuple[str, str, Any, Any]]:
    out = []
    for qualname in sorted(BOUNDED):
        module, cls = qualname.rsplit(".", 1)
        for field, (hint, bound) in declared(getattr(importlib.import_module(module), cls)).items():
            if bound is not None:
                out.append((qualname, field, hint, bound))
    return out


@pytest.mark.parametrize(("owner", "field", "hint", "bound"), _declarations(),
                         ids=lambda v: v if isinstance(v, str) else "")
def test_every_declared_bound_is_reported_with_its_field(owner: str, field: str, hint: Any, bound: Any) -> None:
    bad = _outside(bound)
    bad = float(bad) if "float" in type_text(hint) and "int" not in type_text(hint) else bad
    line = field_error(field, bad, hint, bound)
    assert line == f"{field}: must be {bound_text(bound)}, got {bad}", owner
    assert field_error(field, bad, hint, bound, sentence=True).startswith(f"{field} must be "), owner
    edges = list(ends(bound).values())
    number = float if "float" in type_text(hint) else int
    inside = [number(v) for v in (*edges, edges[0] + 1, edges[-1] - 1, sum(edges) / len(edges))
              if number is float or float(v).is_integer()]
    assert any(field_error(field, v, hint, bound) is None for v in inside), owner  # some value inside passes


@pytest.mark.parametrize(("value", "hint", "bound", "line"), [
    (math.nan, float, Gt(0), "x: must be finite, got nan"),
    (-math.inf, float | None, Ge(0), "x: must be finite, got -inf"),
    (True, int | None, Ge(1), "x: expected int | None, got True"),  # a bool is no number
    (True, None, Ge(2), "x: expected a number >= 2, got true"),  # another package's field: its bound alone
    (2.5, int, Ge(1), "x: expected int, got 2.5"),
    (10**400, int, Ge(1), "x: must fit in 64 bits, got " + validation.quote(10**400)),
    (-(10**400), int, Interval(ge=0, lt=1 << 32), "x: must be >= 0 and < 4294967296, got "
     + validation.quote(-(10**400))),
    ([], list[str] | None, None, None),  # no bound, no length declared
    ((1, 4), list[int], None, None),  # a Python caller's tuple for a list
    ([1, "4"], list[int], None, "x: expected list[int], got [1, '4']"),
])
def test_the_lines_of_the_one_check(value: Any, hint: Any, bound: Any, line: str | None) -> None:
    assert field_error("x", value, hint, bound) == line


def test_a_length_and_a_literal_are_declarations_too() -> None:
    from typing import Annotated, Literal

    from ictrl.data.registry import Benchmark
    from ictrl.eval.harness import EvalConfig, EvalTask

    assert field_error("x", [], Annotated[list[str] | None, MinLen(1)], None) == "x: must be non-empty, got []"
    assert field_error("x", "c", Literal["a", "b"], None, ("a", "b")) == "x: must be one of 'a', 'b', got 'c'"
    with pytest.raises(ValueError, match=r"^benchmark 'b': kind must be one of 'math', 'gsm8k', 'choice'"):
        Benchmark(name="b", kind="essay", hub_id="x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^ci must be in \(0, 1\), got 1.0$"):
        EvalConfig(model="m", ci=1.0)
    with pytest.raises(ValueError, match=r"^task 't': temperature must be >= 0, got -0.5$"):
        EvalTask("t", [], str, lambda c, g: 0.0, temperature=-0.5)
