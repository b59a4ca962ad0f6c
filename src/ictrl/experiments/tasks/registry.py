"""The embedded tasks: ``tinyarith`` (operator precedence, ``tinytask``, the demo's) by name, and any other task as
an importable module path, ``module`` or ``module:attribute`` (as selectors take ``module:function``).

A task is a module (or an object) with ``generate_problems``, ``demonstration``, ``grade``, ``reward`` (TRL
signature), ``train_dataset``, ``eval_task``, ``max_new_tokens`` and ``DEFAULT_DIFFICULTY`` (the levels a recipe
uses when it does not say), and optionally ``RECIPE``: its warm-start overrides of ``tinymodel.TinyRecipe``, whose
defaults are tinyarith's. The repository's studies add two, imported from a clone's root: ``studies.tasks.countdown``
and ``studies.tasks.paths``. The warm start (``tinymodel``) and the grid (``grid``) read the task from the base
model's recipe, which records it as given here. :func:`task_functions` builds the reward, the RL dataset and the
eval task of each alike."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from ictrl.data import Problem
from ictrl.errors import UserError, did_you_mean

TASKS = {"tinyarith": "ictrl.experiments.tasks.tinytask"}
TASK_API = ("generate_problems", "demonstration", "grade", "reward", "train_dataset", "eval_task", "max_new_tokens",
            "DEFAULT_DIFFICULTY")
CHOICES = (f"{', '.join(TASKS)} or an importable task module, as module or module:attribute (from a clone's root: "
           "studies.tasks.countdown, studies.tasks.paths)")


def get_task(name: str, option: str = "task") -> Any:
    """The task ``name``: a registered name (:data:`TASKS`) or an importable ``module`` / ``module:attribute``.
    Raises :class:`UserError`, one line naming ``option``, for one that does not import or is not a task."""
    if name in TASKS:
        return importlib.import_module(TASKS[name])
    module, _, attr = name.partition(":")
    try:
        task = importlib.import_module(module)
        task = getattr(task, attr) if attr else task
    except (ImportError, AttributeError, ValueError, TypeError) as exc:  # TypeError: a relative name (".x")
        raise UserError(f"{option}: unknown task {name!r}{did_you_mean(name, TASKS)}; choose {CHOICES}; importing "
                        f"it: {exc}") from exc
    missing = [a for a in TASK_API if not hasattr(task, a)]
    if missing:
        raise UserError(f"{option}: {name!r} is not a task: it has no {', '.join(missing)} (a task defines "
                        f"{', '.join(TASK_API)})")
    return task


def task_recipe(name: str, option: str = "task") -> dict[str, Any]:
    """The TinyRecipe overrides of ``name``'s warm-started base (the grid's and the long-horizon study's): the task
    (recorded as ``name``, which resolves it again), its default difficulty and its own ``RECIPE``."""
    task = get_task(name, option)
    if name == "tinyarith":
        return {}  # TinyRecipe's defaults: the key of the demo's cached base stays as it was
    return {"task": name, "difficulty": tuple(task.DEFAULT_DIFFICULTY), **getattr(task, "RECIPE", {})}


def task_functions(name: str, generate: Callable[..., list[Problem]], grade: Callable[[str, str], float],
                   extract: Callable[[str], str | None], available: Callable[[tuple[int, ...]], int]
                   ) -> tuple[Callable[..., list[float]], Callable[..., Any], Callable[[list[Problem]], Any]]:
    """``(reward, train_dataset, eval_task)`` of the embedded task ``name``, built alike from its own pieces.

    - ``reward(prompts, completions, gold)``: TRL's reward signature, named ``<name>_reward`` (the name TRL logs),
      ``grade`` of each completion's text against its ``gold`` column.
    - ``train_dataset(prompts_per_step, steps, difficulty, seed)``: a run's RL prompts as a ``datasets.Dataset``,
      ``generate``'s distinct train-split problems for the run's steps, at least 64 and at most
      ``available(levels)`` (TRL cycles if a run needs more), drawn with the run's seed. Columns ``prompt`` (the
      question as the model saw it in its warm start) and ``gold`` (what the reward reads).
    - ``eval_task(problems)``: an ``ictrl.eval`` task over ``problems``, the plain question as the prompt, graded
      by ``grade``.
    """

    def reward(prompts: list[Any], completions: list[Any], gold: list[str], **_: Any) -> list[float]:
        from ictrl.rewards import completion_text

        return [grade(completion_text(c), g) for c, g in zip(completions, gold)]

    # The task module's own attribute by this name, so that pickle and ``module:function`` find it.
    reward.__name__ = reward.__qualname__ = f"{name}_reward"
    reward.__module__ = generate.__module__

    def train_dataset(prompts_per_step: int, steps: int, difficulty: int | tuple[int, ...], seed: int) -> Any:
        import datasets

        levels = (difficulty,) if isinstance(difficulty, int) else tuple(difficulty)
        problems = generate(min(available(levels), max(64, prompts_per_step * steps)), "train", difficulty, seed=seed)
        return datasets.Dataset.from_dict({"prompt": [p.question for p in problems],
                                           "gold": [p.gold for p in problems]})

    def eval_task(problems: list[Problem]) -> Any:
        from ictrl.eval.harness import EvalTask

        return EvalTask(name, problems, prompt_fn=lambda p: p.question, reward_fn=grade, extract_fn=extract)

    return reward, train_dataset, eval_task
