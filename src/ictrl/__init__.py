"""ictrl: reinforcement learning with verifiable rewards, with ICT token selection.

Layers import only downward:

- core (pure torch): :mod:`ictrl.core.stats`, :mod:`ictrl.core.selection`, :mod:`ictrl.core.loss`, :mod:`ictrl.core.metrics`
- tasks: :mod:`ictrl.rewards`, :mod:`ictrl.data`, :mod:`ictrl.models`, :mod:`ictrl.eval`
- the library: :mod:`ictrl.engine` (``ICTGRPOConfig``, ``ICTGRPOTrainer`` and the parts composed into it)
- the ``ictrl train`` command: :mod:`ictrl.train_cli` (run config, launch, guards; it trains ``ICTGRPOTrainer``)
- experiments and CLI: :mod:`ictrl.experiments`, :mod:`ictrl.cli`

Heavy libraries are not imported here, so ``import ictrl`` is cheap.
"""

__version__ = "0.1.0"
