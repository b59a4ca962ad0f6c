"""`python -m ictrl ...` is the `ictrl` command; `accelerate launch ... -m ictrl train CONFIG.yaml` uses it."""

from ictrl.cli import entry

entry()
