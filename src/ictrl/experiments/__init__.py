"""Experiments on the engine: the commands (demo, compare, inspect, regime, tiny-model) on top of three packages.

- :mod:`ictrl.experiments.tasks`: the embedded task (tinyarith), the registry that also takes a task module by its
  path (the studies' ``studies.tasks.countdown`` and ``studies.tasks.paths``), and the tiny model they warm-start.
- :mod:`ictrl.experiments.grid`: method x seed x lr grids of runs, resumable, in worker processes.
- :mod:`ictrl.experiments.reports`: tables, curves, statistical tests and the HTML report pages.

The project's own studies (the tuned comparison, the long horizon, the lr sweep) are not here: they live in the
repository's ``studies/`` and import this package.
"""
