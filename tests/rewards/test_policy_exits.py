"""A reward or a selector that ends the process (``sys.exit``, any ``BaseException`` but Ctrl-C) stops the run
with an error naming it, on every path a reward call takes (the training thread, a deadline thread, async)."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import pytest
import torch

from ictrl.core.selection import SelectionInputs, SelectorExit, register_selector, select
from ictrl.engine.reward_policy import RewardError, RewardPolicy
from ictrl.rewards.trl_adapters import import_reward


class Custom(BaseException):
    pass


@pytest.mark.parametrize("raised, shown", [(SystemExit(0), "SystemExit: '0'"), (SystemExit(3), "SystemExit: '3'"),
                                           (Custom("gone"), "Custom: 'gone'")])
@pytest.mark.parametrize("timeout", [None, 30.0])
def test_a_reward_that_exits_is_a_reward_error(raised: BaseException, shown: str, timeout: float | None) -> None:
    def leaves(prompts: Any = None, completions: Any = None, **kw: Any) -> Any:
        raise raised

    wrapped = RewardPolicy(timeout=timeout, step=lambda: 2).wrap(leaves)
    with pytest.raises(RewardError, match=rf"^reward 'leaves' raised {shown} at step 2"):
        wrapped(prompts=["p"], completions=["c"])


def test_an_async_reward_that_exits_is_a_reward_error() -> None:
    async def leaves(prompts: Any = None, completions: Any = None, **kw: Any) -> Any:
        sys.exit(0)

    wrapped = RewardPolicy(step=lambda: 1).wrap(leaves)
    with pytest.raises(RewardError, match=r"^reward 'leaves' raised SystemExit: '0' at step 1"):
        asyncio.run(wrapped(prompts=["p"], completions=["c"]))


def test_ctrl_c_in_a_reward_stays_ctrl_c() -> None:
    def interrupted(prompts: Any = None, completions: Any = None, **kw: Any) -> Any:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        RewardPolicy().wrap(interrupted)(prompts=["p"], completions=["c"])


def test_a_selector_that_exits_is_named() -> None:
    @register_selector("test_exits")
    def test_exits(inputs: SelectionInputs, *, ratio: float = 0.1) -> torch.Tensor:
        sys.exit(0)

    inputs = SelectionInputs(mask=torch.ones(2, 3, dtype=torch.bool), step=4)
    with pytest.raises(SelectorExit, match=r"^selector \S*test_policy_exits.py:test_exits raised SystemExit: 0 "
                                          r"\(\S*test_policy_exits.py, line \d+\) at step 4$"):
        select("test_exits", inputs)


def test_import_reward_names_the_module_the_exception_and_its_line(tmp_path: Any,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from ictrl.errors import UserError

    (tmp_path / "reward_at_import.py").write_text("import os\n\nraise RuntimeError('no key\\nsecond line')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UserError) as err:
        import_reward("reward_at_import:f")
    assert str(err.value) == (f"cannot import 'reward_at_import:f': RuntimeError: no key "
                              f"({tmp_path / 'reward_at_import.py'}, line 3)")
    with pytest.raises(UserError, match=r"cannot import 'no_such_module_here:f': ModuleNotFoundError"):
        import_reward("no_such_module_here:f")
    with pytest.raises(UserError, match=r"'math.pi' is float 3.14.*, not a function"):
        import_reward("math.pi")
