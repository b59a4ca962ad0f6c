"""The task registry: tinyarith by name, any other task by its module path (``module`` or ``module:attribute``) with
its own default difficulty and warm-start recipe, and a bad name as one line naming the option, before any model."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from ictrl.errors import UserError
from ictrl.experiments.tasks import tinytask
from ictrl.experiments.tasks.registry import TASK_API, get_task, task_recipe
from ictrl.experiments.tasks.tinymodel import TinyRecipe

MODULE = "ictrl_test_registry_task"  # a task module of the test's own, on a temporary path


@pytest.fixture
def own_task(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A task module (tinyarith's functions, its own difficulty and recipe) plus the same task as an attribute."""
    (tmp_path / f"{MODULE}.py").write_text(textwrap.dedent(f"""
        from types import SimpleNamespace

        from ictrl.experiments.tasks.tinytask import ({", ".join(a for a in TASK_API if a != "DEFAULT_DIFFICULTY")})

        DEFAULT_DIFFICULTY = (3,)
        RECIPE = {{"patience": 2, "digit_error": 0.25}}
        AS_OBJECT = SimpleNamespace(**{{name: globals()[name] for name in {list(TASK_API)!r}}})
        NOT_A_TASK = 3
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield MODULE
    sys.modules.pop(MODULE, None)


def test_tinyarith_by_name_or_module_path_and_its_recipe_keeps_the_demos_base() -> None:
    assert get_task("tinyarith") is tinytask is get_task("ictrl.experiments.tasks.tinytask")
    assert tinytask.DEFAULT_DIFFICULTY == TinyRecipe().difficulty == (2,)
    assert task_recipe("tinyarith") == {}
    # The keys of the bases `ictrl demo` and `ictrl demo --quick` built before tasks could be module paths: their
    # cached bases stay valid (the task field is left out of tinyarith's key).
    from ictrl.experiments import demo

    assert TinyRecipe(threads=1).key() == "0dfdbc58dd273752"
    assert TinyRecipe(threads=1, **demo.QUICK_RECIPE).key() == "67399f4b4ac78a1e"


def test_a_task_module_by_path_brings_its_own_difficulty_and_recipe(own_task: str) -> None:
    task = get_task(own_task)
    assert task.__name__ == own_task and task.grade is tinytask.grade
    assert task_recipe(own_task) == {"task": own_task, "difficulty": (3,), "patience": 2, "digit_error": 0.25}
    recipe = TinyRecipe(**task_recipe(own_task))
    assert recipe.patience == 2 and recipe.max_steps == TinyRecipe().max_steps  # the rest: TinyRecipe's defaults
    assert recipe.key() != TinyRecipe(difficulty=(3,), patience=2, digit_error=0.25).key()  # its task is in the key
    namespaced = get_task(f"{own_task}:AS_OBJECT")
    assert namespaced.generate_problems is tinytask.generate_problems
    assert task_recipe(f"{own_task}:AS_OBJECT") == {"task": f"{own_task}:AS_OBJECT", "difficulty": (3,)}  # no RECIPE


@pytest.mark.parametrize("name, message", [
    ("nope", "--task: unknown task 'nope'; choose tinyarith or an importable task module, as module or "
             "module:attribute (from a clone's root: studies.tasks.countdown, studies.tasks.paths); importing it: "
             "No module named 'nope'"),
    ("tinyarth", "--task: unknown task 'tinyarth'; did you mean 'tinyarith'?; choose tinyarith"),
    ("nopkg.tasks.x", "importing it: No module named 'nopkg'"),
    ("ictrl.experiments.tasks.tinytask:nope", "unknown task 'ictrl.experiments.tasks.tinytask:nope'; choose "),
    (".tinytask", "--task: unknown task '.tinytask'; choose"),
    ("", "--task: unknown task ''; choose"),
    ("json", "--task: 'json' is not a task: it has no generate_problems, demonstration, grade, reward, "
             "train_dataset, eval_task, max_new_tokens, DEFAULT_DIFFICULTY (a task defines generate_problems, "),
])
def test_a_bad_task_is_one_line_naming_the_option(name: str, message: str) -> None:
    with pytest.raises(UserError) as caught:
        get_task(name, "--task")
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_module_attribute_that_is_no_task_names_what_it_lacks(own_task: str) -> None:
    with pytest.raises(UserError, match=f"^task: '{own_task}:NOT_A_TASK' is not a task: it has no generate_problems"):
        get_task(f"{own_task}:NOT_A_TASK")
    with pytest.raises(UserError, match="^task: unknown task"):  # the recipe's own field check
        TinyRecipe(task="nope")


@pytest.mark.parametrize("argv", [
    ["compare", "--quick", "--seeds", "1", "--methods", "grpo", "--task", "nope"],
    ["tiny-model", "--untrained", "--task", "nope"],
])
def test_a_bad_task_on_the_command_line_is_exit_2_before_any_model(argv: list[str], tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from ictrl.cli import main
    from ictrl.experiments.tasks import tinymodel

    def no_build(*_: object, **__: object) -> None:
        raise AssertionError("a model was built before the check")

    monkeypatch.setattr(tinymodel, "build_tiny_base", no_build)
    monkeypatch.setattr(tinymodel, "build_tiny_qwen2", no_build)
    out = tmp_path / "out"
    assert main([*argv, "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"ictrl {argv[0]}: error: --task: unknown task 'nope'; choose tinyarith or"), err
    assert not out.exists() or not any(out.iterdir())


def test_a_task_with_a_config_is_refused_not_ignored(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """compare --config trains on the config's data: another --task beside it is a mistake, said in one line."""
    from ictrl.cli import main

    config = tmp_path / "c.yaml"
    config.write_text("model_name_or_path: x\noutput_dir: y\n")
    out = tmp_path / "out"
    argv = ["compare", "--config", str(config), "--seeds", "1", "--methods", "grpo", "--task", "studies.tasks.paths",
            "--output-dir", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("ictrl compare: error: --task studies.tasks.paths: the embedded task's option; with --config the "
                   "runs train on the config's dataset_name"), err
