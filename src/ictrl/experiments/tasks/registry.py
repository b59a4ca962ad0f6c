"""The embedded tasks by name: ``tinyarith`` (operator precedence, ``tinytask``), ``countdown`` (reach a target
from given numbers, ``countdown``) and ``paths`` (a walk of a given length through a fixed graph, ``paths``).

Each module offers the same functions: ``generate_problems``, ``demonstration``, ``grade``, ``reward`` (TRL
signature), ``train_dataset``, ``eval_task`` and ``max_new_tokens``; the warm start (``tinymodel``) and the grid
(``grid``) read the task from the base model's recipe. :func:`task_functions` builds the reward, the RL dataset
and the eval task of each alike."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

from ictrl.data import Problem

TASKS = {"tinyarith": "ictrl.experiments.tasks.tinytask", "countdown": "ictrl.experiments.tasks.countdown",
         "paths": "ictrl.experiments.tasks.paths"}
# The difficulty when a recipe does not say (tinyarith: operators; countdown: numbers; paths: walk lengths).
DEFAULT_DIFFICULTY = {"tinyarith": (2,), "countdown": (4,), "paths": (4, 5, 6)}
# Warm-start noise per task beyond the shared recipe (TinyRecipe's defaults are tinyarith's): countdown's
# demonstrations err mostly by choice (a correct chain to another value), rarely by an arithmetic slip. Its longer
# chains stay at 0% dev pass@1 for the first ~1,000 steps: more patience than tinyarith's 6 evaluations. Paths has
# the same kinds of error (a walk to another node; a missing edge), over its whole train split.
TASK_RECIPES: dict[str, dict[str, Any]] = {"countdown": {"order_error": 0.5, "digit_error": 0.1,
                                                           "train_problems": 1300, "patience": 12,
                                                           "max_steps": 4000},
                                           "paths": {"order_error": 0.5, "digit_error": 0.1, "train_problems": 1400,
                                                     "patience": 12, "max_steps": 4000}}


def task_recipe(name: str) -> dict[str, Any]:
    """The TinyRecipe overrides of ``name``'s warm-started base (the grid's and the long-horizon study's)."""
    get_task(name)
    if name == "tinyarith":
        return {}
    return {"task": name, "difficulty": DEFAULT_DIFFICULTY[name], **TASK_RECIPES.get(name, {})}


def get_task(name: str) -> ModuleType:
    if name not in TASKS:
        raise ValueError(f"task: unknown task {name!r}; choose from {', '.join(TASKS)}")
    return importlib.import_module(TASKS[name])


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
