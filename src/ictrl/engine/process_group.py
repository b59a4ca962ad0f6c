"""Leaving the torch.distributed process group before the interpreter exits.

A process that exits with its gloo process group still alive can abort after its work is done ("terminate called
without an active exception"): gloo's worker thread releases a finished collective's Python objects, needs the
GIL, is stopped by the finalising interpreter, and ``std::terminate`` follows. Destroying the group first joins
those threads while the interpreter is whole.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch.distributed as dist


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
