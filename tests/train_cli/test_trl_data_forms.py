"""TRL's data forms and habits under ``ictrl train``, beside ``trl grpo`` on the same file: a quiet run
(``disable_tqdm``) still reports each step; TRL's ``datasets:`` mixture and local data files as ``dataset_name``;
streamed data; chat prompts on a tokenizer without a chat template. Tiny models, local files."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from tests.train_cli.test_trl_cli_parity import trl_file


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    sys.modules.pop("parity_rewards", None)


def edit(config: Path, **values: Any) -> Path:
    data = yaml.safe_load(config.read_text())
    data.update(values)
    config.write_text(yaml.safe_dump(data))
    return config


def test_a_quiet_run_prints_one_line_per_logged_step(tiny_model_dir: Path, in_tmp: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """``disable_tqdm: true`` (the TRL file sets it): no bar, and each logged step is one line on the console."""
    from ictrl import cli

    config = trl_file(in_tmp, tiny_model_dir, max_steps=2)
    assert cli.main(["train", str(config)]) == 0
    err = capsys.readouterr().err
    steps = [line for line in err.splitlines() if line.startswith("step ")]
    assert [line.split("  ")[0] for line in steps] == ["step 1/2", "step 2/2"], err[-2000:]
    assert all(" reward " in line and " loss " in line for line in steps)
