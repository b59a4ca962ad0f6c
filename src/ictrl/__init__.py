"""ictrl: reinforcement learning with verifiable rewards, with ICT token selection.

Layers import only downward:

- core (pure torch): :mod:`ictrl.core.stats`, :mod:`ictrl.core.selection`, :mod:`ictrl.core.loss`,
  :mod:`ictrl.core.metrics`
- tasks: :mod:`ictrl.rewards`, :mod:`ictrl.data`, :mod:`ictrl.models`, :mod:`ictrl.eval`
- the library: :mod:`ictrl.engine` (``ICTGRPOConfig``, ``ICTGRPOTrainer`` and the parts composed into it)
- the ``ictrl train`` command: :mod:`ictrl.train_cli` (run config, launch, guards; it trains ``ICTGRPOTrainer``)
- experiments and CLI: :mod:`ictrl.experiments`, :mod:`ictrl.cli`

Heavy libraries are not imported here, so ``import ictrl`` is cheap; ``from ictrl import ICTGRPOConfig,
ICTGRPOTrainer`` imports the library (and TRL) on first use.
"""

__version__ = "0.1.0"

# The library's two classes, re-exported lazily (PEP 562): ``from ictrl import ICTGRPOTrainer`` imports TRL then,
# plain ``import ictrl`` imports none of torch, transformers or TRL.
_LAZY = {"ICTGRPOConfig": "ictrl.engine.config", "ICTGRPOTrainer": "ictrl.engine.trainer"}

__all__ = ["ICTGRPOConfig", "ICTGRPOTrainer", "__version__"]


def __getattr__(name: str) -> object:
    """``ICTGRPOConfig`` and ``ICTGRPOTrainer`` from :mod:`ictrl.engine`, imported on first use."""
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'ictrl' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
