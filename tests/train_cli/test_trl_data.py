"""TRL's ``datasets:`` mixture with ``test_split_size`` under ``ictrl train``: one split of the mixture, made by
the ``train_test_split`` TRL calls, its eval rows never training rows, the same split on a resume. Tiny models,
local files. Its checks before the data loads: a ``data_files`` pattern that matches no
file, fractions that sum to 0, a row nested past the JSON parser, a null prompt, each one line naming it."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from ictrl.cli import main
from tests.train_cli.test_trl_files import edit, in_tmp  # noqa: F401 - in_tmp is a fixture
from tests.train_cli.test_trl_habits import mixture_file, same_weights, state_dict


def rows_file(path: Path, count: int) -> Path:
    path.write_text("".join(json.dumps({"prompt": f"{i}+1=", "solution": str(i + 1)}) + "\n" for i in range(count)))
    return path


def test_a_mixtures_test_split_is_one_split_drawn_from_the_seed(tmp_path: Path) -> None:
    """The training rows and the eval rows of one run are the two parts of one ``train_test_split`` (TRL's call,
    its seed the run's ``seed``): no eval row is a training row, together they are the mixture, and reading the
    data again (a resume) gives the same rows and the same input hash."""
    from trl import DatasetMixtureConfig, get_dataset
    from trl.scripts.utils import DatasetConfig

    from ictrl.train_cli.run_config import config_from_dict
    from ictrl.train_cli.run_inputs import eval_rows, input_hashes, load_train_dataset

    entries = [{"path": "json", "data_files": str(rows_file(tmp_path / "rows.jsonl", 64))}]
    values = {"model_name_or_path": "m", "output_dir": "o", "datasets": entries, "test_split_size": 0.5, "seed": 3}
    cfg = config_from_dict(values)
    train = load_train_dataset(cfg)
    test = eval_rows(cfg, SimpleNamespace(eval_strategy="steps"))
    assert len(train) == len(test) == 32
    assert not set(train["prompt"]) & set(test["prompt"])
    assert sorted([*train["prompt"], *test["prompt"]]) == sorted(f"{i}+1=" for i in range(64))
    mixture = get_dataset(DatasetMixtureConfig(datasets=[DatasetConfig(**e) for e in entries]))["train"]
    theirs = mixture.train_test_split(test_size=0.5, seed=3)
    assert train[:] == theirs["train"][:] and test[:] == theirs["test"][:]
    assert input_hashes(load_train_dataset(cfg), []) == input_hashes(train, [])
    other = load_train_dataset(config_from_dict({**values, "seed": 4}))
    assert set(other["prompt"]) != set(train["prompt"])


@pytest.mark.integration
def test_a_run_on_a_split_mixture_with_eval_resumes_exactly(tiny_model_dir: Path, in_tmp: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """``datasets:`` with ``test_split_size`` and ``eval_strategy: steps``: resuming its step-1 checkpoint in
    another folder is accepted (the training data is the same) and ends with the straight run's weights."""
    from ictrl import cli

    config = edit(mixture_file(in_tmp, tiny_model_dir, max_steps=2), test_split_size=0.25, eval_strategy="steps",
                  eval_steps=1, per_device_eval_batch_size=4, output_dir=str(in_tmp / "a"), save_strategy="steps",
                  save_steps=1, lr_scheduler_type="constant")
    assert cli.main(["train", str(config)]) == 0, capsys.readouterr().err[-2000:]
    capsys.readouterr()
    assert cli.main(["train", str(config), f"--output_dir={in_tmp / 'b'}",
                     f"--resume_from_checkpoint={in_tmp / 'a' / 'checkpoint-1'}"]) == 0, capsys.readouterr().err[-3000:]
    rows: list[dict[str, Any]] = [json.loads(line) for line in (in_tmp / "b" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [2] and any("eval_reward" in r for r in rows)
    assert same_weights(state_dict(in_tmp / "a"), state_dict(in_tmp / "b"))


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text("".join(json.dumps({"prompt": f"{i}+1=", "solution": str(i + 1)})
                                                           + "\n" for i in range(4)))
    return tmp_path


@pytest.mark.parametrize(("entries", "says"), [
    ([{"path": "json", "data_files": "nomatch/*.jsonl"}], "datasets[0] (json): data_files 'nomatch/*.jsonl' (train) "
                                                          "matches no file under {root}"),
    ([{"path": "json", "data_files": "data/*.jsonl"}, {"path": "json", "data_files": {"train": ["data/*.csv"]}}],
     "datasets[1] (json): data_files 'data/*.csv' (train) matches no file"),
    ([{"path": "json", "data_dir": "data", "data_files": "*.parquet"}], "data_files '*.parquet' (train) matches no "
                                                                        "file under {root}/data"),
    ([{"path": "data", "data_files": "sub/**/*.jsonl"}], "datasets[0] (data): data_files 'sub/**/*.jsonl'"),
])
def test_a_datasets_glob_that_matches_nothing_is_one_line(entries: list[dict[str, Any]], says: str, project: Path,
                                                          tiny_model_dir: Path, loader_calls: list,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    (project / "run.yaml").write_text(yaml.safe_dump({"model_name_or_path": str(tiny_model_dir), "output_dir": "out",
                                                      "use_vllm": False, "report_to": "none",
                                                      "datasets": entries}))
    assert main(["train", "run.yaml"]) == 2
    err = capsys.readouterr().err
    last = err.strip().split("\n")[-1]
    assert "Traceback" not in err and last.startswith("ictrl train: error: datasets[") and \
        says.format(root=project) in last, err[-2000:]
    assert not loader_calls


def test_a_glob_that_matches_is_read(project: Path) -> None:
    from trl.scripts.utils import DatasetConfig

    from ictrl.train_cli.trl_data import check_data_files

    check_data_files([DatasetConfig(path="json", data_files="data/*.jsonl"),
                      DatasetConfig(path="data", data_files={"train": "*.jsonl"}),
                      DatasetConfig(path="trl-lib/a-hub-id", data_files="anything/*.jsonl"),
                      DatasetConfig(path="json", data_files="hf://datasets/x/y/*.jsonl")])


@pytest.mark.parametrize("how", ["dataset_name", "datasets"])
def test_a_row_nested_past_the_parsers_recursion_is_one_line_before_datasets_reads_it(
        how: str, project: Path, tiny_model_dir: Path, loader_calls: list, capsys: pytest.CaptureFixture[str]) -> None:
    """200,000 nested lists in a row of a local .jsonl file: datasets' json builder crashes the process on it (a
    segmentation fault); ictrl names the file and the line first."""
    deep = "[" * 200_000 + "]" * 200_000
    path = project / "data" / "deep.jsonl"
    path.write_text(json.dumps({"prompt": "1=", "solution": "1"}) + "\n"
                    + f'{{"prompt": "2=", "solution": "2", "extra": {deep}}}\n')
    source = {"dataset_name": "data/deep.jsonl"} if how == "dataset_name" else \
        {"datasets": [{"path": "json", "data_files": "data/deep*.jsonl"}]}
    (project / "run.yaml").write_text(yaml.safe_dump({"model_name_or_path": str(tiny_model_dir), "output_dir": "out",
                                                      "use_vllm": False, "report_to": "none", **source}))
    assert main(["train", "run.yaml"]) == 2
    err = capsys.readouterr().err
    last = err.strip().split("\n")[-1]
    assert "Traceback" not in err and last.startswith("ictrl train: error:"), err[-2000:]
    assert "deep.jsonl: line 2: the row nests lists or objects deeper" in last, last
    assert not loader_calls


@pytest.mark.parametrize(("entries", "rows", "says"), [
    ([{"path": "json", "data_files": "data/train.jsonl", "fraction": 0.0},
      {"path": "json", "data_files": "data/train.jsonl", "fraction": 0.0}], None,
     "datasets: the fractions [0.0, 0.0] sum to 0.0; give a source a positive share"),
    ([{"path": "json", "data_files": "data/nulls.jsonl"}], [{"prompt": "1+1=", "solution": "2"},
                                                           {"prompt": None, "solution": "3"}],
     "dataset_name: row 1: prompt: expected text or a list of chat messages, got None"),
])
def test_a_mixture_trl_would_divide_by_zero_on_or_a_null_prompt_is_one_line(
        entries: list[dict[str, Any]], rows: Any, says: str, project: Path, tiny_model_dir: Path,
        loader_calls: list, capsys: pytest.CaptureFixture[str]) -> None:
    if rows is not None:
        (project / "data" / "nulls.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (project / "run.yaml").write_text(yaml.safe_dump({
        "model_name_or_path": str(tiny_model_dir), "output_dir": "out", "use_vllm": False, "report_to": "none",
        "datasets": entries, "num_generations": 2, "per_device_train_batch_size": 2}))
    assert main(["train", "run.yaml"]) == 2
    err = capsys.readouterr().err
    last = err.strip().split("\n")[-1]
    assert "Traceback" not in err and last.startswith("ictrl train: error:") and says in last, err[-2000:]
    assert not loader_calls
