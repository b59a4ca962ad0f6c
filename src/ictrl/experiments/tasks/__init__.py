"""The embedded tasks (tinyarith, countdown, paths), their registry, and the tiny model warm-started on them."""
