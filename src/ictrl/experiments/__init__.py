"""Experiments on the engine: the commands (demo, compare, sweep, inspect, ``compare --tune``) on top of three rooms.

- :mod:`ictrl.experiments.tasks`: the embedded tasks (tinyarith, countdown, paths) and the tiny model they warm-start.
- :mod:`ictrl.experiments.grid`: method x seed x lr grids of runs, resumable, in worker processes.
- :mod:`ictrl.experiments.reports`: tables, figures, statistical tests and the HTML report pages.
"""
