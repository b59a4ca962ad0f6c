"""Experiments built on the engine: the embedded demo and its synthetic task (more commands to come)."""
