"""The embedded tasks by name: ``tinyarith`` (operator precedence, ``tinytask``), ``countdown`` (reach a target
from given numbers, ``countdown``) and ``paths`` (a walk of a given length through a fixed graph, ``paths``). Each module offers the same functions: ``generate_problems``,
``demonstration``, ``grade``, ``reward`` (TRL signature), ``train_dataset``, ``eval_task`` and
``max_new_tokens``; the warm start (``tinymodel``) and the grid (``grid``) read the task from the base model's
recipe."""

from __future__ import annotations

import importlib
from types import ModuleType

TASKS = {"tinyarith": "ictrl.experiments.tasks.tinytask", "countdown": "ictrl.experiments.tasks.countdown",
         "paths": "ictrl.experiments.tasks.paths"}
# The difficulty when a recipe does not say (tinyarith: operators; countdown: numbers; paths: walk lengths).
DEFAULT_DIFFICULTY = {"tinyarith": (2,), "countdown": (4,), "paths": (4, 5, 6)}


def get_task(name: str) -> ModuleType:
    if name not in TASKS:
        raise ValueError(f"task: unknown task {name!r}; choose from {', '.join(TASKS)}")
    return importlib.import_module(TASKS[name])
