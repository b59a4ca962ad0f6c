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
from tests.train_cli.test_trl_files import edit, in_tmp  # noqa: F401 - in_tmp is a fixture




@pytest.mark.integration
def test_a_quiet_run_prints_one_line_per_logged_step(tiny_model_dir: Path, in_tmp: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """``disable_tqdm: true`` (the TRL file sets it): no bar, and each logged step is one line on the console."""
    from ictrl import cli
    from ictrl.train_cli import trainer_inputs

    trainer_inputs._note_processes.cache_clear()  # said once per process: an earlier run in this process said it

    config = trl_file(in_tmp, tiny_model_dir, max_steps=2)
    assert cli.main(["train", str(config)]) == 0
    err = capsys.readouterr().err
    steps = [line for line in err.splitlines() if line.startswith("step ")]
    assert [line.split("  ")[0] for line in steps] == ["step 1/2", "step 2/2"], err[-2000:]
    assert all(" reward " in line and " loss " in line for line in steps)
    assert "INFO ictrl.train: 1 process\n" in err  # the first lines say how many processes run


def state_dict(path: Path) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path).state_dict()


def same_weights(a: dict[str, Any], b: dict[str, Any]) -> bool:
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.integration
def test_a_weights_only_checkpoint_resumes_only_when_asked_by_name(tiny_model_dir: Path, in_tmp: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """``save_only_model: true``: ``--resume`` and ``resume_from_checkpoint`` are refused in one line naming the
    missing optimizer, scheduler and RNG state; ``--resume-inexact`` resumes, says what differs, and ends with the
    weights ``trl grpo`` gives when it resumes the same checkpoint."""
    from trl.scripts import grpo

    from ictrl import cli
    from tests.train_cli.test_trl_files import resumable_file

    config = edit(resumable_file(in_tmp, tiny_model_dir, "a", max_steps=2), save_only_model=True,
                  lr_scheduler_type="linear", max_steps=3)
    assert cli.main(["train", str(config), "--max_steps=2", "--resume-new-schedule"]) == 0
    capsys.readouterr()
    lacks = "has no optimizer state (optimizer.pt), no learning-rate scheduler state (scheduler.pt), no RNG state " \
            "(rng_state.pth) (save_only_model: true writes the weights alone)"
    checkpoint = in_tmp / "a" / "checkpoint-2"
    for extra in (["--resume"], [f"--resume_from_checkpoint={checkpoint}", f"--output_dir={in_tmp / 'b'}"]):
        assert cli.main(["train", str(config), "--resume-new-schedule", *extra]) == 2
        err = capsys.readouterr().err
        assert f"--resume: {checkpoint} {lacks}" in err and "--resume-inexact" in err, err[-2000:]
    assert cli.main(["train", str(config), "--resume", "--resume-inexact", "--resume-new-schedule"]) == 0
    err = capsys.readouterr().err
    said = next(line for line in err.splitlines() if "--resume-inexact: resuming from" in line)
    assert "the optimizer starts fresh" in said and "schedule starts again from its first step" in said
    assert [json.loads(line)["step"] for line in (in_tmp / "a" / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
    parser = grpo.make_parser()
    script, args, model, mixture = parser.parse_args_and_config(
        ["--config", str(config), "--output_dir", str(in_tmp / "trl"), f"--resume_from_checkpoint={checkpoint}"],
        fail_with_unknown_args=False)
    grpo.main(script, args, model, mixture)
    assert same_weights(state_dict(in_tmp / "trl"), state_dict(in_tmp / "a"))


@pytest.fixture(scope="module")
def base_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with a tokenizer that has no chat template, as a base model's."""
    from ictrl.models import build_byte_tokenizer, build_tiny_qwen2

    path = tmp_path_factory.mktemp("base_model")
    tokenizer = build_byte_tokenizer(chat_template=None)
    build_tiny_qwen2(tokenizer, seed=0).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def chat_file(tmp_path: Path, model_dir: Path, **values: Any) -> Path:
    """The TRL file with its prompts as chat messages (TRL's conversational form)."""
    config = trl_file(tmp_path, model_dir)
    data = tmp_path / "digits" / "train.jsonl"
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    data.write_text("".join(json.dumps({**r, "prompt": [{"role": "user", "content": r["prompt"]}]}) + "\n"
                            for r in rows))
    return edit(config, **values)


def test_chat_prompts_without_a_chat_template_are_one_line_before_the_model_loads(
        base_model: Path, in_tmp: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from ictrl import cli, models

    def no_weights(*_: Any, **__: Any) -> None:
        raise AssertionError("the model's weights loaded before the chat template was checked")

    monkeypatch.setattr(models, "load_model_and_tokenizer", no_weights)
    config = chat_file(in_tmp, base_model)
    assert cli.main(["train", str(config)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line.lower()]
    assert len(err) == 1 and f"{config}: dataset_name {in_tmp / 'digits'}: row 0: the prompt is a list of chat " \
                              "messages" in err[0], err
    assert f"the tokenizer of {base_model} has no chat template" in err[0] and "set chat_template_path" in err[0]
    missing = in_tmp / "none.jinja"
    assert cli.main(["train", str(config), f"--chat_template_path={missing}"]) == 2
    assert f"{config}: chat_template_path: {missing}: neither a .jinja file nor a tokenizer" in capsys.readouterr().err


@pytest.mark.integration
def test_chat_template_path_gives_a_base_model_its_template(base_model: Path, in_tmp: Path) -> None:
    """A .jinja file as chat_template_path: the run trains, and the saved tokenizer carries the template."""
    from transformers import AutoTokenizer

    from ictrl import cli
    from ictrl.models import CHAT_TEMPLATE

    template = in_tmp / "chat.jinja"
    template.write_text(CHAT_TEMPLATE)
    config = chat_file(in_tmp, base_model, chat_template_path=str(template))
    assert cli.main(["train", str(config)]) == 0
    assert AutoTokenizer.from_pretrained(in_tmp / "out").chat_template == CHAT_TEMPLATE


def mixture_file(tmp_path: Path, model_dir: Path, max_steps: int = 2, **values: Any) -> Path:
    """The TRL file reading its data through TRL's ``datasets:`` mixture (a local jsonl file), no dataset_name."""
    config = trl_file(tmp_path, model_dir, max_steps=max_steps)
    data = yaml.safe_load(config.read_text())
    del data["dataset_name"], data["dataset_train_split"]
    data["datasets"] = [{"path": "json", "data_files": str(tmp_path / "digits" / "train.jsonl"),
                         "columns": ["prompt", "solution"]}]
    config.write_text(yaml.safe_dump({**data, **values}))
    return config


def run_trl_grpo(config: Path, *flags: str) -> None:
    from trl.scripts import grpo

    parser = grpo.make_parser()
    script, args, model, mixture = parser.parse_args_and_config(["--config", str(config), *flags],
                                                                fail_with_unknown_args=False)
    grpo.main(script, args, model, mixture)


@pytest.mark.integration
def test_trls_datasets_mixture_and_a_parquet_file_train_as_trl_grpo(tiny_model_dir: Path, in_tmp: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """TRL's ``datasets:`` key (a local jsonl through datasets' json builder) under trl grpo and ictrl train: the
    same weights, bit for bit; the same rows as a .parquet file named by dataset_name (which trl grpo cannot read)
    give them too."""
    from datasets import load_dataset

    from ictrl import cli

    config = mixture_file(in_tmp, tiny_model_dir)
    run_trl_grpo(config, "--output_dir", str(in_tmp / "trl"))
    assert cli.main(["train", str(config)]) == 0, capsys.readouterr().err[-2000:]
    parquet = in_tmp / "digits.parquet"
    load_dataset("json", data_files=str(in_tmp / "digits" / "train.jsonl"), split="train").to_parquet(parquet)
    assert cli.main(["train", str(config), f"--dataset_name={parquet}", "--datasets=null",
                     f"--output_dir={in_tmp / 'parquet'}"]) == 0, capsys.readouterr().err[-2000:]
    theirs = state_dict(in_tmp / "trl")
    assert same_weights(theirs, state_dict(in_tmp / "out")) and same_weights(theirs, state_dict(in_tmp / "parquet"))
    assert not same_weights(theirs, state_dict(tiny_model_dir))


def test_the_datasets_mixture_reads_as_trls_get_dataset(tmp_path: Path) -> None:
    """Each of TRL's DatasetConfig keys (path, name, data_dir, data_files, split, columns, fraction) and
    test_split_size: the rows ictrl reads are trl.get_dataset's."""
    from trl import DatasetMixtureConfig, get_dataset
    from trl.scripts.utils import DatasetConfig

    from ictrl.train_cli.run_inputs import load_train_dataset
    from ictrl.train_cli.run_config import config_from_dict

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "train.jsonl").write_text("".join(json.dumps({"prompt": f"{i}=", "x": i}) + "\n"
                                                        for i in range(6)))
    (tmp_path / "b.jsonl").write_text("".join(json.dumps({"prompt": f"{i}+1=", "x": i}) + "\n" for i in range(4)))
    entries = [{"path": "json", "data_dir": str(tmp_path / "a"), "split": "train", "columns": ["prompt"],
                "fraction": 0.5},
               {"path": "json", "data_files": [str(tmp_path / "b.jsonl")], "columns": ["prompt"], "fraction": 0.5}]
    base = {"model_name_or_path": "m", "output_dir": "o", "datasets": entries}
    ours = load_train_dataset(config_from_dict(base))
    theirs = get_dataset(DatasetMixtureConfig(datasets=[DatasetConfig(**e) for e in entries]))["train"]
    assert ours.column_names == theirs.column_names == ["prompt"]
    assert ours[:] == theirs[:] and len(ours) == 8  # 4 rows of each: the fractions capped by the smaller source
    split = load_train_dataset(config_from_dict({**base, "test_split_size": 0.25}))  # train_test_split's train part
    assert len(split) == 6 and set(split["prompt"]) <= set(theirs["prompt"])


@pytest.mark.parametrize(("entries", "said"), [
    ([{"path": "json", "data_files": "missing.jsonl"}], "datasets[0] (json): data_files 'missing.jsonl' (train) "
                                                        "matches no file under {tmp}"),
    ([{"path": "json", "data_fils": "a.jsonl"}], "datasets[0]: unknown key 'data_fils'"),
    ([{"data_files": "a.jsonl"}], "datasets[0].path: required"),
])
def test_a_bad_mixture_entry_is_one_line_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   entries: list[dict[str, Any]], said: str) -> None:
    from ictrl.errors import UserError
    from ictrl.train_cli.run_config import config_from_dict
    from ictrl.train_cli.run_inputs import load_train_dataset

    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError) as raised:
        load_train_dataset(config_from_dict({"model_name_or_path": "m", "output_dir": "o", "datasets": entries},
                                            "f.yaml"))
    assert said.format(tmp=tmp_path) in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl", ".json", ".csv", "/"])
def test_a_local_data_file_or_folder_loads_through_datasets_builders(tmp_path: Path, suffix: str) -> None:
    from datasets import Dataset

    from ictrl.train_cli.run_config import config_from_dict
    from ictrl.train_cli.run_inputs import check_sources, load_train_dataset

    rows = Dataset.from_dict({"prompt": ["1+1=", "2+2="], "solution": ["2", "4"]})
    if suffix == "/":
        (tmp_path / "data").mkdir()
        rows.to_parquet(tmp_path / "data" / "part-0.parquet")
        rows.to_parquet(tmp_path / "data" / "part-1.parquet")
        path, expected = tmp_path / "data", list(rows["prompt"]) * 2
    else:
        path, expected = tmp_path / f"rows{suffix}", rows["prompt"]
        if suffix == ".json":  # a JSON array of rows
            path.write_text(json.dumps(rows.to_list()))
        else:
            {".parquet": rows.to_parquet, ".csv": rows.to_csv, ".jsonl": rows.to_json}[suffix](path)
    cfg = config_from_dict({"model_name_or_path": "m", "output_dir": "o", "dataset_name": str(path)})
    check_sources(cfg)
    assert list(load_train_dataset(cfg)["prompt"]) == list(expected)


def test_an_unknown_dataset_name_says_what_was_tried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ictrl.train_cli.run_config import ConfigError, config_from_dict
    from ictrl.train_cli.run_inputs import check_sources

    monkeypatch.chdir(tmp_path)
    (tmp_path / "rows.xlsx").write_text("x")
    for name, tried in (("rows.parquet", f"no file or folder at {tmp_path / 'rows.parquet'}"),
                        ("rows.xlsx", "a .xlsx file, which datasets has no builder for")):
        cfg = config_from_dict({"model_name_or_path": "m", "output_dir": "o", "dataset_name": name}, "f.yaml")
        with pytest.raises(ConfigError) as raised:
            check_sources(cfg, "f.yaml")
        line = str(raised.value)
        assert line.startswith(f"f.yaml: dataset_name: '{name}': benchmark: unknown name"), line
        assert f"tried as a local path ({tried}" in line and "as a hub id (not owner/name)" in line


def test_a_missing_dataset_config_is_reported_under_dataset_config(monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    from ictrl.errors import DataError
    from ictrl.train_cli.run_config import config_from_dict
    from ictrl.train_cli.run_inputs import load_train_dataset

    def needs_config(*_: Any, **__: Any) -> None:  # datasets' words for a hub data set with several configs
        raise ValueError("Config name is missing.\nPlease pick one among the available configs: ['main', 'socratic']")

    monkeypatch.setattr(datasets, "load_dataset", needs_config)
    cfg = config_from_dict({"model_name_or_path": "m", "output_dir": "o", "dataset_name": "openai/gsm8k"})
    with pytest.raises(DataError, match=r"^dataset_config: None for openai/gsm8k: Config name is missing"):
        load_train_dataset(cfg)


@pytest.mark.integration
def test_eval_strategy_with_dataset_test_split_evaluates_as_trl_grpo(tiny_model_dir: Path, in_tmp: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """``eval_strategy: steps`` on a dataset directory with a test split: trl grpo and ictrl train evaluate on it
    with the same eval_* values, and end with the same weights."""
    import ast

    from ictrl import cli

    config = edit(trl_file(in_tmp, tiny_model_dir, max_steps=2), eval_strategy="steps", eval_steps=1,
                  per_device_eval_batch_size=4, dataset_test_split="test")
    test = [{"prompt": f"{a}*{b}=", "solution": str(a * b)} for a in range(2) for b in range(2)]
    (in_tmp / "digits" / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in test))
    run_trl_grpo(config, "--output_dir", str(in_tmp / "trl"))
    printed = [ast.literal_eval(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{'eval_")]
    assert cli.main(["train", str(config)]) == 0, capsys.readouterr().err[-2000:]
    rows = [json.loads(line) for line in (in_tmp / "out" / "metrics.jsonl").read_text().splitlines()]
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("eval at step")]
    assert [line.split("  reward ")[0] for line in said] == ["eval at step 1/2", "eval at step 2/2"], said
    assert [f"reward {r['eval_reward']:.3f}" in line for r, line in zip([r for r in rows if "eval_reward" in r], said)
            ] == [True, True]
    ours = [{k: v for k, v in r.items() if k.startswith("eval_") and not k.startswith("eval_ictrl/")}
            for r in rows if "eval_reward" in r]  # ictrl's own statistics beside TRL's
    theirs = [{k: v for k, v in r.items() if k.startswith("eval_")} for r in printed]
    assert len(ours) == len(theirs) == 2
    timing = ("eval_runtime", "eval_samples_per_second", "eval_steps_per_second")
    for a, b in zip(ours, theirs):  # TRL's printer shows 4 significant digits
        assert a.keys() == b.keys()
        assert {k: f"{v:.4g}" for k, v in a.items() if k not in timing} == {
            k: f"{float(v):.4g}" for k, v in b.items() if k not in timing}
    assert same_weights(state_dict(in_tmp / "trl"), state_dict(in_tmp / "out"))


@pytest.mark.integration
def test_dataset_streaming_trains_as_trl_grpo(tiny_model_dir: Path, in_tmp: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """``dataset_streaming: true`` with max_steps: trl grpo and ictrl train (each row checked as it streams) end
    with the same weights; without max_steps it is one line before the model loads, as TRL requires it."""
    from ictrl import cli

    config = edit(trl_file(in_tmp, tiny_model_dir, max_steps=2), dataset_streaming=True)
    run_trl_grpo(config, "--output_dir", str(in_tmp / "trl"))
    assert cli.main(["train", str(config)]) == 0, capsys.readouterr().err[-2000:]
    err = capsys.readouterr().err
    assert "streams: each row is checked as it is read" in err
    assert same_weights(state_dict(in_tmp / "trl"), state_dict(in_tmp / "out"))
    assert cli.main(["train", str(config), "--max_steps=-1", f"--output_dir={in_tmp / 'b'}"]) == 2
    assert "max_steps: a streamed dataset has no length" in capsys.readouterr().err


@pytest.mark.integration
def test_a_bad_streamed_row_stops_the_run_naming_its_position(tiny_model_dir: Path, in_tmp: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    from ictrl import cli

    config = edit(trl_file(in_tmp, tiny_model_dir, max_steps=2), dataset_streaming=True)
    data = in_tmp / "digits" / "train.jsonl"
    lines = data.read_text().splitlines()
    lines[5] = json.dumps({"prompt": 7, "solution": "1"})
    data.write_text("\n".join(lines) + "\n")
    assert cli.main(["train", str(config)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "streamed row" in line]
    assert len(err) == 1 and f"dataset_name {in_tmp / 'digits'}: streamed row 5: prompt: expected text or a list of " \
                              "chat messages, got 7 (the run stops at a bad streamed row)" in err[0], err


def test_streamed_rows_are_checked_one_by_one(caplog: pytest.LogCaptureFixture) -> None:
    """A prompt over max_prompt_length is skipped with a line naming its position; without the cap, one that cannot
    fit the model's positions stops the run, as does a prompt that is not text or messages."""
    import logging

    from datasets import Dataset

    from ictrl.errors import DataError
    from ictrl.models import build_byte_tokenizer
    from ictrl.train_cli.trl_data import check_stream

    rows = Dataset.from_dict({"prompt": ["1+1=", "9" * 40, "2+2="]}).to_iterable_dataset()
    tokenizer = build_byte_tokenizer()
    with caplog.at_level(logging.INFO, logger="ictrl.train"):
        kept = list(check_stream(rows, tokenizer, "f.yaml: dataset_name d", 10, 256, 8))
    assert [r["prompt"] for r in kept] == ["1+1=", "2+2="]
    said = [r.getMessage() for r in caplog.records]
    assert "longer than max_prompt_length=10 is skipped with a line" in said[0]
    assert said[1].startswith("f.yaml: dataset_name d: streamed row 1: 40 tokens, longer than max_prompt_length=10: "
                              "skipped")
    with pytest.raises(DataError, match=r"streamed row 1: 40 tokens, longer than the 24 the model's positions"):
        list(check_stream(rows, tokenizer, "f.yaml: dataset_name d", None, 32, 8))
    chat = Dataset.from_dict({"prompt": [[{"role": "user", "content": "1+1="}]]}).to_iterable_dataset()
    with pytest.raises(DataError, match=r"streamed row 0: the prompt is a list of chat messages and the tokenizer has"):
        list(check_stream(chat, build_byte_tokenizer(chat_template=None), "d", None, 32, 8))


def test_streaming_an_ictrl_source_or_with_the_wrong_key_is_one_line(tmp_path: Path) -> None:
    from ictrl.train_cli.trainer_inputs import check_trainer_inputs
    from ictrl.train_cli.run_config import ConfigError, config_from_dict

    (tmp_path / "rows.jsonl").write_text('{"prompt": "1+1="}\n')
    base = {"model_name_or_path": "m", "output_dir": "o", "max_steps": 2}
    for values, said in (({"dataset_name": "gsm8k_train", "dataset_streaming": True},
                          "f.yaml: dataset_streaming: streams data trl grpo reads"),
                         ({"dataset_name": str(tmp_path / "rows.jsonl"), "streaming": True},
                          "f.yaml: streaming: does not apply to dataset_name; use dataset_streaming")):
        cfg = config_from_dict({**base, **values}, "f.yaml")
        with pytest.raises(ConfigError, match=said):
            check_trainer_inputs(type("Args", (), {"eval_strategy": "no", "max_steps": 2, "push_to_hub": False, "eval_benchmarks": None})(),
                                 "f.yaml", None, cfg)


def linear_run(tmp_path: Path, model_dir: Path) -> Path:
    """Three steps on a linear schedule from 1e-3 (1e-3, 6.7e-4, 3.3e-4), a checkpoint at each, in ``a``."""
    from ictrl import cli
    from tests.train_cli.test_trl_files import resumable_file

    config = edit(resumable_file(tmp_path, model_dir, "a", max_steps=3), lr_scheduler_type="linear",
                  learning_rate=1e-3)
    assert cli.main(["train", str(config)]) == 0
    return config


def logged_rates(out: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["learning_rate"] for r in rows if "learning_rate" in r}


@pytest.mark.integration
def test_a_checkpoint_that_lost_its_optimizer_resumes_inexactly_as_trl_grpo(tiny_model_dir: Path, in_tmp: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """``optimizer.pt`` deleted from a checkpoint (its manifest still lists it): refused in one line naming it and
    ``--resume-inexact``; with the flag it resumes, the line says the optimizer and the schedule both start again
    (Trainer restores them together) and the rates the steps get, which are the rates logged, and the weights are
    those of ``trl grpo`` resuming the same checkpoint."""
    from ictrl import cli

    config = linear_run(in_tmp, tiny_model_dir)
    checkpoint = in_tmp / "a" / "checkpoint-2"
    (checkpoint / "optimizer.pt").unlink()
    capsys.readouterr()
    resume = [f"--output_dir={in_tmp / 'b'}", f"--resume_from_checkpoint={checkpoint}"]
    assert cli.main(["train", str(config), *resume]) == 2
    err = capsys.readouterr().err
    assert f"{checkpoint} has no optimizer state (optimizer.pt), so a resumed run" in err and "--resume-inexact" in err
    assert cli.main(["train", str(config), *resume, "--resume-inexact"]) == 0, capsys.readouterr().err[-2000:]
    said = next(line for line in capsys.readouterr().err.splitlines() if "--resume-inexact: resuming from" in line)
    assert "the optimizer starts fresh" in said and "linear learning-rate schedule starts again from its first " \
                                                   "step" in said and ": step 3 at 0.001" in said, said
    assert logged_rates(in_tmp / "b") == {3: pytest.approx(1e-3)}
    run_trl_grpo(config, "--output_dir", str(in_tmp / "trl"), f"--resume_from_checkpoint={checkpoint}")
    assert same_weights(state_dict(in_tmp / "trl"), state_dict(in_tmp / "b"))


@pytest.mark.integration
def test_the_new_schedule_line_says_the_rates_the_resumed_steps_get(tiny_model_dir: Path, in_tmp: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """``--resume-new-schedule`` from step 2 of 3 to max_steps 6: step 3 keeps the old schedule's rate (the
    optimizer's, restored), steps 4-6 follow the schedule over 6 steps; the line says so with the rates, and they
    are the rates logged."""
    import re

    from ictrl import cli

    config = linear_run(in_tmp, tiny_model_dir)
    capsys.readouterr()
    assert cli.main(["train", str(config), "--max_steps=6", f"--output_dir={in_tmp / 'b'}", "--resume-new-schedule",
                     f"--resume_from_checkpoint={in_tmp / 'a' / 'checkpoint-2'}"]) == 0
    said = next(line for line in capsys.readouterr().err.splitlines() if "--resume-new-schedule:" in line)
    assert "the first resumed step keeps the rate the old schedule set for it" in said, said
    stated = {int(step): float(rate) for step, rate in re.findall(r"step (\d+) at ([\d.e-]+)", said)}
    logged = logged_rates(in_tmp / "b")
    assert stated == pytest.approx(logged, rel=1e-2) and sorted(logged) == [3, 4, 5, 6]
    assert logged == pytest.approx({3: 1e-3 / 3, 4: 1e-3 / 2, 5: 1e-3 / 3, 6: 1e-3 / 6})
