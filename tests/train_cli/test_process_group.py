"""ictrl.train_cli.process_group: a process leaves the group it joined, after a barrier on success and at once on an
error (a failed peer would never reach the barrier), on one-process gloo groups; the 2-process launches
(test_engines, test_accelerate_launch) end through the same code. A question asked once per launch (or per node)
and its answer shared, on forked 2-process gloo groups."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch.distributed as dist

from ictrl.train_cli import process_group


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


def _ask(rank: int, store: str, out: str, per_node: bool, answers: list[str]) -> None:
    """One process of a 2-process gloo group: asks ``answers[rank]`` through answered_once, records whether it
    asked and what it got (or the error's message)."""
    import json

    from ictrl.errors import ConfigError

    os.environ["LOCAL_RANK"] = "0" if per_node else str(rank)  # per_node: each process a node of its own
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    asked: list[int] = []
    try:
        got = process_group.answered_once(lambda: (asked.append(rank), answers[rank])[1], "model_name_or_path",
                                          per_node=per_node)
    except ConfigError as exc:
        got = f"error: {exc}"
    finally:
        dist.destroy_process_group()
    Path(out, f"{rank}.json").write_text(json.dumps({"asked": asked, "got": got}))


def _ask_two(tmp_path: Path, per_node: bool, answers: list[str]) -> list[dict[str, object]]:
    import json

    import torch.multiprocessing as mp

    tmp_path.mkdir(exist_ok=True)
    mp.start_processes(_ask, args=(str(tmp_path / "store"), str(tmp_path), per_node, answers), nprocs=2,
                       start_method="fork")
    return [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in (0, 1)]


def test_one_process_asks_and_every_process_gets_its_answer(tmp_path: Path) -> None:
    ranks = _ask_two(tmp_path, per_node=False, answers=["rank 0's", "rank 1's"])
    assert ranks == [{"asked": [0], "got": "rank 0's"}, {"asked": [], "got": "rank 0's"}]


def test_per_node_each_node_asks_and_differing_copies_stop_every_process(tmp_path: Path) -> None:
    same = _ask_two(tmp_path / "same", per_node=True, answers=["whole", "whole"])
    assert same == [{"asked": [0], "got": "whole"}, {"asked": [1], "got": "whole"}]
    differ = _ask_two(tmp_path / "differ", per_node=True, answers=["whole", "damaged"])
    line = "error: model_name_or_path: the nodes' copies differ: rank 0 found 'whole', rank 1 found 'damaged'"
    assert differ == [{"asked": [0], "got": line}, {"asked": [1], "got": line}]


def test_without_a_group_the_question_is_simply_asked() -> None:
    assert process_group.answered_once(lambda: 7, "x", per_node=True) == 7
