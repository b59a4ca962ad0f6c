"""The study tasks beside the library's tinyarith: ``countdown`` (reach a target from given numbers) and ``paths``
(a walk of a given length through a fixed graph). Each is a task module of ``ictrl.experiments.tasks.registry``,
given to a command by its module path from the clone's root: ``ictrl compare --task studies.tasks.paths``,
``ictrl regime --prompts studies.tasks.paths``, ``ictrl tiny-model --task studies.tasks.countdown``."""
