"""The library: ``ICTGRPOConfig`` / ``ICTGRPOTrainer`` (token-selective GRPO on top of ``trl.GRPOTrainer``) and the
parts the trainer is made of. The ``ictrl train`` command (:mod:`ictrl.train_cli`) builds on it; nothing here
imports the command.

Names load lazily so that importing one module of the package (the command imports ``resumable``'s resume checks
at start-up) does not pay TRL's import time (~7 s) up front.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ICTGRPOConfig", "ICTGRPOTrainer"]


def __getattr__(name: str) -> Any:
    if name == "ICTGRPOConfig":
        from ictrl.engine.config import ICTGRPOConfig

        return ICTGRPOConfig
    if name == "ICTGRPOTrainer":
        from ictrl.engine.trainer import ICTGRPOTrainer

        return ICTGRPOTrainer
    raise AttributeError(f"module 'ictrl.engine' has no attribute {name!r}")
