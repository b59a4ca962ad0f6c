"""The embedded tasks (tinyarith, countdown), their registry, and the tiny model warm-started on them."""
