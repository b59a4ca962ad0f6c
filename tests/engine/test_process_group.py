"""ictrl.engine.process_group: a process leaves the group it joined, after a barrier on success and at once on an
error (a failed peer would never reach the barrier). One-process gloo groups here; the 2-process launches
(test_engines, test_accelerate_launch) end through the same code."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch.distributed as dist

from ictrl.engine import process_group


def _join(tmp_path: Path) -> None:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)


def test_leaves_after_a_barrier_on_success(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    barriers: list[int] = []
    real_barrier = dist.barrier
    monkeypatch.setattr(dist, "barrier", lambda *a, **k: (barriers.append(1), real_barrier(*a, **k))[1])
    _join(tmp_path)
    with process_group.process_group_left():
        out = [None]
        dist.all_gather_object(out, {"rank": 0})
    assert not dist.is_initialized() and barriers == [1] and out == [{"rank": 0}]


def test_leaves_without_a_barrier_on_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dist, "barrier", lambda *a, **k: pytest.fail("barrier on the error path"))
    _join(tmp_path)
    with pytest.raises(RuntimeError, match="boom"), process_group.process_group_left():
        raise RuntimeError("boom")
    assert not dist.is_initialized()


def test_nothing_to_leave_is_a_no_op() -> None:
    assert not dist.is_initialized()
    with process_group.process_group_left():
        pass
    process_group.leave_process_group(wait=True)
    assert not dist.is_initialized()
