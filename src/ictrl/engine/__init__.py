"""The TRL engine: ``ICTGRPOConfig`` / ``ICTGRPOTrainer`` (token-selective GRPO on top of ``trl.GRPOTrainer``).

Names load lazily so that ``import ictrl.train_cli.cli`` does not pay TRL's import time (~7 s) up front.
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
