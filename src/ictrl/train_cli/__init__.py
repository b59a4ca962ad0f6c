"""``ictrl train``: the command that runs the library (:mod:`ictrl.engine`) from a YAML run config.

It owns what only a command needs: argv, read once (``cli``), and the YAML file (``run_config``, ``config_yaml``),
the launch of several processes (``launch``, ``process_group``), what the trainer is built from, checked before
anything heavy loads (``trainer_inputs``: files, processes, memory and model, with the data and reward checks of
``run_inputs``, the model's of ``model_init``, ``output_dir``'s one check of ``output_dir`` and the commands' shared
``ictrl.option_checks``), a resume that continues the same run (``exact_resume``), the run's lock and signals
(``run_guard``), the model load (``model_init``), what a run writes beside its checkpoints (``callbacks``:
metrics.jsonl and the progress bar; ``eval_callback``: pass@k during training) and the run itself (``run.train``).
Each value's own type and range are its field's to check, once. It trains :class:`ictrl.engine.ICTGRPOTrainer`, the
class a Python user imports; the library imports nothing from here.
"""
