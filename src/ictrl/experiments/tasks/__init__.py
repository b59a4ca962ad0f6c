"""The embedded task (tinyarith, the demo's), the registry that also takes any task module by its path (the
repository's study tasks: ``studies.tasks.countdown``, ``studies.tasks.paths``), and the tiny model warm-started on
a task."""
