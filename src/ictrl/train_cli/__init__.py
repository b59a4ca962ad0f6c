"""``ictrl train``: the command that runs the library (:mod:`ictrl.engine`) from a YAML run config.

It owns what only a command needs: argv and the YAML file (``run_config``, ``config_yaml``, ``cli``), the
launch of several processes (``launch``, ``process_group``), the checks of files, output directory, memory and
model before anything heavy loads (``value_checks``, ``run_inputs``, ``ictrl.preflight``), the run's lock and
signals (``run_guard``), the model load (``model_init``), what a run writes beside its checkpoints
(``callbacks``: metrics.jsonl and the progress bar; ``eval_callback``: pass@k during training) and the run
itself (``run.train``). It trains :class:`ictrl.engine.ICTGRPOTrainer`, the class a Python user imports; the
library imports nothing from here.
"""
