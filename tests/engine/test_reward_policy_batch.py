"""Each reward call gets its own copy of the batch (what one reward does to its inputs reaches no other reward and
not TRL's lists), and a call still running is named on the console each period, on every path a call takes (the
training thread, a deadline thread, async)."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from ictrl.engine import reward_policy as policy
from ictrl.engine.reward_policy import RewardPolicy


def _batch() -> dict[str, Any]:
    return {"prompts": [[{"role": "user", "content": f"q{i}"}] for i in range(4)],
            "completions": [[{"role": "assistant", "content": f"c{i}"}] for i in range(4)],
            "completion_ids": [[1, 2, i] for i in range(4)], "answer": ["1", "2", "3", "4"],
            "trainer_state": object(), "log_metric": print, "environments": [object() for _ in range(4)]}


def _vandal(prompts: Any = None, completions: Any = None, completion_ids: Any = None, answer: Any = None,
            **kw: Any) -> list[float]:
    """Rewrites every completion to its gold answer in place, then clears every list it was given."""
    n = len(completions)
    for completion, gold in zip(completions, answer):
        completion[-1]["content"] = f"\\boxed{{{gold}}}"
    completions.append("extra")
    for column in (prompts, completions, completion_ids, answer):
        column.clear()
    return [0.0] * n


async def _async_vandal(**kw: Any) -> list[float]:
    return _vandal(**kw)


@pytest.mark.parametrize("timeout", [None, 30.0])
@pytest.mark.parametrize("fn", [_vandal, _async_vandal])
def test_a_reward_that_edits_or_clears_its_inputs_changes_nothing_outside_its_call(fn: Any,
                                                                                  timeout: float | None) -> None:
    batch = _batch()
    shared = {k: batch[k] for k in ("trainer_state", "log_metric", "environments")}
    before = {k: repr(v) for k, v in batch.items()}
    seen: dict[str, Any] = {}

    def grader(**kw: Any) -> list[float]:
        seen.update(kw)
        return [float(c[-1]["content"] == f"\\boxed{{{g}}}") for c, g in zip(kw["completions"], kw["answer"])]

    checked = RewardPolicy(timeout=timeout, step=lambda: 1)
    out = checked.wrap(fn)(**batch)
    out = asyncio.run(out) if asyncio.iscoroutine(out) else out
    assert out == [0.0] * 4  # one value per completion TRL holds, though the reward's own lists are empty now
    assert {k: repr(v) for k, v in batch.items()} == before
    assert checked.wrap(grader)(**batch) == [0.0] * 4
    assert all(seen[k] is v for k, v in shared.items())  # the trainer's objects, not the batch: shared


def test_the_copy_is_deep_and_made_per_call() -> None:
    calls: list[Any] = []

    def keeps(completions: Any = None, **kw: Any) -> list[float]:
        calls.append(completions)
        return [0.0] * len(completions)

    batch = {"prompts": ["p"], "completions": [[{"content": "c"}]]}
    wrapped = RewardPolicy().wrap(keeps)
    wrapped(**batch)
    wrapped(**batch)
    assert calls[0] == calls[1] == batch["completions"]
    assert calls[0] is not calls[1] and calls[0][0][0] is not batch["completions"][0][0]


@pytest.mark.parametrize("timeout", [None, 30.0])
@pytest.mark.parametrize("is_async", [False, True])
def test_a_reward_still_running_is_named_each_period_with_its_step(timeout: float | None, is_async: bool,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(policy, "STILL_RUNNING_NOTE_S", 0.1)

    def slow_judge(completions: Any = None, **kw: Any) -> list[float]:
        time.sleep(0.55)
        return [1.0] * len(completions)

    async def slow_async_judge(completions: Any = None, **kw: Any) -> list[float]:
        await asyncio.sleep(0.55)
        return [1.0] * len(completions)

    wrapped = RewardPolicy(timeout=timeout, step=lambda: 7).wrap(slow_async_judge if is_async else slow_judge)
    with caplog.at_level(logging.WARNING, logger="ictrl.train"):
        out = wrapped(prompts=["p"], completions=["c"])
        assert (asyncio.run(out) if is_async else out) == [1.0]
        time.sleep(0.3)  # the notes stop with the call
    notes = [r.getMessage() for r in caplog.records if "still running" in r.getMessage()]
    name = "slow_async_judge" if is_async else "slow_judge"
    assert 3 <= len(notes) <= 6, notes
    assert all(n.startswith(f"reward {name!r} is still running after ") and n.endswith(" at step 7") for n in notes)


def test_a_quick_reward_is_not_named_and_the_default_period_is_a_minute(caplog: pytest.LogCaptureFixture) -> None:
    assert policy.STILL_RUNNING_NOTE_S == 60.0
    with caplog.at_level(logging.WARNING, logger="ictrl.train"):
        RewardPolicy().wrap(lambda completions=None, **kw: [0.0])(prompts=["p"], completions=["c"])
    assert not caplog.records


@pytest.mark.parametrize("timeout", [None, 30.0])
@pytest.mark.parametrize("removed", [False, True])
def test_a_reward_that_changes_the_working_directory_is_named_once_and_undone(
        timeout: float | None, removed: bool, tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """A code sandbox's ``os.chdir`` (into a folder it may remove after) is undone after each call, so the run's
    relative paths and the next call find the run's directory; one warning names the reward."""
    import os
    import shutil

    monkeypatch.chdir(tmp_path)
    run_dir = os.getcwd()

    def sandboxed(prompts: Any = None, completions: Any = None, **kw: Any) -> list[float]:
        box = tmp_path / f"box-{len(os.listdir(tmp_path))}"
        box.mkdir()
        os.chdir(box)
        if removed:
            shutil.rmtree(box)
        return [1.0] * len(completions)

    wrapped = RewardPolicy(timeout=timeout, step=lambda: 2).wrap(sandboxed)
    with caplog.at_level(logging.WARNING, logger="ictrl.train"):
        for _ in range(3):
            assert wrapped(**_batch()) == [1.0] * 4
            assert os.getcwd() == run_dir
    named = [r.getMessage() for r in caplog.records if "working directory" in r.getMessage()]
    assert len(named) == 1 and named[0].startswith("reward 'sandboxed' changed the working directory") and \
        f"the run restores {run_dir} after each of its calls" in named[0], named


def test_a_reward_that_replaces_the_runs_signal_handler_is_named_once_and_undone(
        caplog: pytest.LogCaptureFixture) -> None:
    """A library's own SIGTERM handler installed in a reward call would lose the run's stop with a checkpoint: the
    run's handlers are put back after each call, and the reward named once."""
    import signal

    def mine(signum: int, frame: Any) -> None:
        pass

    def installs(prompts: Any = None, completions: Any = None, **kw: Any) -> list[float]:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        return [0.0] * len(completions)

    previous = signal.signal(signal.SIGTERM, mine)
    try:
        wrapped = RewardPolicy(step=lambda: 5).wrap(installs)
        with caplog.at_level(logging.WARNING, logger="ictrl.train"):
            for _ in range(2):
                wrapped(**_batch())
                assert signal.getsignal(signal.SIGTERM) is mine
                assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGTERM, previous)
    named = [r.getMessage() for r in caplog.records if "handler" in r.getMessage()]
    assert named == ["reward 'installs' replaced the run's SIGTERM / SIGINT handler at step 5; the run restores its "
                     "own after each of its calls"]


# --- a NaN under TRL's loss ---------------------------------------------------------------------------------------

def _nan_every_third(prompts: Any = None, completions: Any = None, **kw: Any) -> list[float]:
    """A digit reward that has no score (NaN) for every third completion."""
    return [float("nan") if i % 3 == 0 else float(any(ch.isdigit() for ch in c)) for i, c in enumerate(completions)]


def _length_reward(prompts: Any = None, completions: Any = None, **kw: Any) -> list[float]:
    return [len(c) / 10 for c in completions]


@pytest.mark.parametrize("rewards", [[_nan_every_third], [_nan_every_third, _length_reward]],
                         ids=["alone", "beside_another"])
def test_a_nan_reward_under_all_trains_as_trl_and_is_named_once(tmp_path: Path, tiny_model_dir: Path,
                                                                 rewards: list[Any],
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """TRL takes a reward's NaN as its None (``nansum`` over the rewards; a completion no reward scores has no
    advantage): ``token_selector: all`` trains to TRL's weights, saying once which reward returned it."""
    import torch
    from trl import GRPOConfig

    import mp_worker as w
    from test_trainer import _load

    StockStub = w.stock_stub_class()

    common = dict(use_cpu=True, bf16=False, report_to="none", save_strategy="no", num_generations=4,
                  max_completion_length=12, optim="sgd", learning_rate=0.1, max_grad_norm=0.0, seed=0,
                  disable_tqdm=True, dataloader_num_workers=0, per_device_train_batch_size=8, max_steps=2)
    params = []
    for cls, args in ((StockStub, GRPOConfig(output_dir=str(tmp_path / "trl"), **common)),
                      (w.stub_trainer_class(one_pass=True),
                       w.make_config(tmp_path / "ictrl", **common, token_selector="all"))):
        model, tokenizer = _load(tiny_model_dir)
        trainer = cls(model=model, reward_funcs=list(rewards), args=args, train_dataset=w.make_dataset(),
                      processing_class=tokenizer)
        with caplog.at_level(logging.WARNING, logger="ictrl"):
            trainer.train()
        assert trainer.state.global_step == 2
        params.append({k: v.detach().clone() for k, v in trainer.model.named_parameters()})
    start = dict(_load(tiny_model_dir)[0].named_parameters())
    assert max(float((params[0][k] - start[k]).abs().max()) for k in start) > 1e-4
    for k in start:
        torch.testing.assert_close(params[1][k], params[0][k], rtol=1e-4, atol=1e-7, msg=k)
    said = [r.getMessage() for r in caplog.records if "returned NaN" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("reward '_nan_every_third' returned NaN for row 0") \
        and "taken as None" in said[0], said


def test_under_all_inf_still_stops_and_ictrls_methods_still_stop_on_nan() -> None:
    """What TRL would train on as garbage (``inf``: the group's advantages NaN, then 0) or fail on (a string)
    stops the run under every selector; a NaN stops ictrl's own methods."""
    batch = {"completions": ["a", "b"]}
    trl_loss = RewardPolicy(nan_is_none=True)
    assert trl_loss.check("r", [float("nan"), 1.0], batch)[1] == 1.0
    for bad in ([float("inf"), 1.0], ["x", 1.0], [1.0]):
        with pytest.raises(policy.RewardError, match="reward 'r' returned"):
            trl_loss.check("r", bad, batch)
    with pytest.raises(policy.RewardError, match="NaN; return None"):
        RewardPolicy().check("r", [float("nan"), 1.0], batch)
