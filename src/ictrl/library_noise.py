"""The libraries' noise an ``ictrl`` command turns off (``--verbose`` keeps it): :func:`quiet`.

Each filter here is process-global (a logger's filter, a warnings filter, an environment default): they are in
docs/architecture.md's table of global hooks, with the tests that pin them.
"""

from __future__ import annotations

import logging
import os
import warnings


def _not_cpu_accelerator_note(record: logging.LogRecord) -> bool:
    return "Setting accelerator to CPU" not in record.getMessage()


def _not_accumulation_note(record: logging.LogRecord) -> bool:
    # Under DeepSpeed the Trainer accumulates through DeepSpeed's engine, whose count it fills from the trainer's
    # gradient_accumulation_steps; accelerate's own plugin keeps 1 and calls the difference a mismatch. The ZeRO
    # launch test matches a DDP run's metrics and weights, so the note warns of nothing.
    return "Gradient accumulation steps mismatch" not in record.getMessage()


def quiet() -> None:
    """The libraries' noise off (``--verbose`` keeps it): the weight loading / shard writing bars of transformers
    and huggingface_hub (read from the environment when they are first imported), and DeepSpeed's "Setting
    accelerator to CPU" warning, which it logs whenever it is imported on a machine without a GPU (accelerate
    imports it, when installed, on a run's first save: ``extract_model_from_parallel``), accelerate's note on
    the gradient accumulation count under DeepSpeed, the deprecation warnings of ZeRO's collectives, and vLLM's
    info and warning lines (its logger is configured when TRL imports it)."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    logging.getLogger("vllm").setLevel(logging.ERROR)
    logging.getLogger("DeepSpeed").addFilter(_not_cpu_accelerator_note)
    logging.getLogger("accelerate.accelerator").addFilter(_not_accumulation_note)
    # DeepSpeed's ZeRO calls torch collectives that torch has deprecated (all_gather_into_tensor,
    # reduce_scatter_tensor): a warning per process and per call site, nothing for the user to change
    warnings.filterwarnings("ignore", message=r"`torch\.distributed\.\w+` is deprecated", category=FutureWarning)
