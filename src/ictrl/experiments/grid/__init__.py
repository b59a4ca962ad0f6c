"""Grids of runs (method x seed x learning rate): specs, the resumable worker pool, and the tuned protocol."""
