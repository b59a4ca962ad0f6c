"""Evaluation: unbiased pass@k, generation backends, the resumable harness and ``ictrl eval``.

Heavy modules (transformers, vllm) load only when a backend is built.
"""

from ictrl.eval.harness import (
    EvalConfig,
    EvalResult,
    EvalTask,
    ResumeMismatchError,
    benchmark_tasks,
    evaluate,
    format_markdown,
    summarize,
)
from ictrl.eval.passk import bootstrap_ci, mean_std, pass_at_k

__all__ = [
    "EvalConfig",
    "EvalResult",
    "EvalTask",
    "ResumeMismatchError",
    "benchmark_tasks",
    "bootstrap_ci",
    "evaluate",
    "format_markdown",
    "mean_std",
    "pass_at_k",
    "summarize",
]
