"""An unchanged ``trl grpo`` file under ``ictrl train``: ictrl's own keys left unset do what TRL does (no prompt
cap: the context is checked on the data, naming a row that cannot fit), ``resume_from_checkpoint`` resumes as in
TRL, a hub dataset id goes to ``datasets.load_dataset`` with TRL's arguments. Tiny models, local files."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from tests.train_cli.test_trl_cli_parity import trl_file


@pytest.fixture(scope="module")
def short_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with 256 positions: a prompt cap of 512 could not fit it."""
    from ictrl.models import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("short_model"), seed=0, max_position_embeddings=256)


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


def test_a_file_without_max_prompt_length_has_no_prompt_cap() -> None:
    from ictrl.train_cli.run_config import config_from_dict

    cfg = config_from_dict({"model_name_or_path": "m", "output_dir": "o", "dataset_name": "gsm8k_train"})
    assert cfg.script.max_prompt_length is None


def test_an_unchanged_trl_file_trains_on_a_model_of_256_positions(short_model: Path, in_tmp: Path) -> None:
    from ictrl import cli

    config = trl_file(in_tmp, short_model)
    assert "max_prompt_length" not in config.read_text()
    assert cli.main(["train", str(config)]) == 0
    rows = [json.loads(line) for line in (in_tmp / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1]


def test_a_row_too_long_for_the_context_is_one_line_naming_it(short_model: Path, in_tmp: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    from ictrl import cli

    config = trl_file(in_tmp, short_model)
    data = in_tmp / "digits" / "train.jsonl"
    data.write_text(data.read_text() + json.dumps({"prompt": "9" * 300 + "=", "solution": "9"}) + "\n")
    assert cli.main(["train", str(config)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    line = next(line for line in err if "row 16" in line)
    assert f"{config}: dataset_name {in_tmp / 'digits'}: row 16 (id 16, " in line
    assert "longer than the 248 tokens the model's 256 positions leave beside max_completion_length 8" in line
    assert not (in_tmp / "out" / "model.safetensors").exists()


def test_a_set_cap_past_the_context_is_still_refused_before_the_model_loads(short_model: Path, in_tmp: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    from ictrl import cli

    config = edit(trl_file(in_tmp, short_model), max_prompt_length=512)
    assert cli.main(["train", str(config)]) == 2
    assert ("max_prompt_length: 512 + max_completion_length 8 = 520 tokens, more than the 256 positions"
            in capsys.readouterr().err)
