"""Leaving the torch.distributed process group before the interpreter exits.

A process that exits with its gloo process group still alive can abort after its work is done ("terminate called
without an active exception"): gloo's worker thread releases a finished collective's Python objects, needs the
GIL, is stopped by the finalising interpreter, and ``std::terminate`` follows. Destroying the group first joins
those threads while the interpreter is whole.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch.distributed as dist

T = TypeVar("T")


def leave_process_group(wait: bool = True) -> None:
    """Destroy the default process group if this process joined one (a no-op otherwise).

    ``wait``: barrier first, so no process tears down while another still needs a collective (the final save
    under ZeRO-3 / FSDP gathers). Off on the error path: a peer that failed would never reach the barrier, and
    destroying is local (a peer still in a collective gets a connection error, as it would when this process exits).
    """
    from ictrl.vllm_env import shutdown_engines

    shutdown_engines()  # a colocated vLLM engine's groups hang off the default group: they go first
    if not (dist.is_available() and dist.is_initialized()):
        return
    if wait:
        dist.barrier()
    dist.destroy_process_group()


@contextlib.contextmanager
def process_group_left() -> Iterator[None]:
    """Run the block, then :func:`leave_process_group` (with the barrier only when the block succeeded)."""
    ok = False
    try:
        yield
        ok = True
    finally:
        leave_process_group(wait=ok)


def answered_once(question: Callable[[], T], what: str, per_node: bool = False) -> T:
    """``question()`` asked by one process of the launch and its answer shared with all (a plain call without a
    process group). For checks that read every byte of a directory (a checkpoint's or a model's sha256), which N
    processes would otherwise read N times: rank 0 asks, or with ``per_node`` each node's local rank 0 (a directory
    on node-local disk, as ``save_on_each_node`` writes it). When the nodes' answers differ, every process raises
    the same :class:`ictrl.errors.ConfigError` naming ``what``, rather than the nodes going on from different states."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return question()
    from ictrl.errors import ConfigError

    rank = dist.get_rank()
    asker = rank - int(os.environ.get("LOCAL_RANK", "0")) if per_node else 0
    answers: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(answers, (rank, question()) if rank == asker else None)
    asked = [answer for answer in answers if answer is not None]
    differing = [(r, answer) for r, answer in asked if answer != asked[0][1]]
    if differing:
        raise ConfigError(f"{what}: the nodes' copies differ: rank {asked[0][0]} found {asked[0][1]!r}, rank "
                          f"{differing[0][0]} found {differing[0][1]!r}")
    return answers[asker][1]
