"""The pure core: token statistics, selection, the loss and its metrics, in torch alone with no trainer state.

Read ICT in one sitting in :mod:`ictrl.core.reference` (the plain float64 forms the tests check against), then
the fast forms: :mod:`ictrl.core.stats` (group JS score), :mod:`ictrl.core.selection` (top-k per unit) and
:mod:`ictrl.core.loss` (the Sparse-GRPO normaliser).
"""
