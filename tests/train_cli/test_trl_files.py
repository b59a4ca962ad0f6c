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
                                                              capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from ictrl import cli, models

    def no_weights(*_: Any, **__: Any) -> None:
        raise AssertionError("the model's weights loaded before the rows were checked")

    monkeypatch.setattr(models, "load_model_and_tokenizer", no_weights)

    config = trl_file(in_tmp, short_model)
    data = in_tmp / "digits" / "train.jsonl"
    data.write_text(data.read_text() + json.dumps({"prompt": "9" * 300 + "=", "solution": "9"}) + "\n")
    assert cli.main(["train", str(config)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    line = next(line for line in err if "row 16" in line)
    assert f"{config}: dataset_name {in_tmp / 'digits'}: row 16 (id 16, " in line
    assert "longer than the 248 tokens the model's 256 positions leave beside max_completion_length 8" in line


def test_a_set_cap_past_the_context_is_still_refused_before_the_model_loads(short_model: Path, in_tmp: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    from ictrl import cli

    config = edit(trl_file(in_tmp, short_model), max_prompt_length=512)
    assert cli.main(["train", str(config)]) == 2
    assert ("max_prompt_length: 512 + max_completion_length 8 = 520 tokens, more than the 256 positions"
            in capsys.readouterr().err)


def resumable_file(tmp_path: Path, model_dir: Path, out: str, max_steps: int) -> Path:
    """The TRL file saving every step, on a constant learning rate (a resume may then change max_steps)."""
    return edit(trl_file(tmp_path, model_dir, max_steps=max_steps), output_dir=str(tmp_path / out),
                save_strategy="steps", save_steps=1, lr_scheduler_type="constant")


def test_resume_from_checkpoint_in_another_folder_continues_that_run_exactly(tiny_model_dir: Path, in_tmp: Path,
                                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """``--output_dir=B --resume_from_checkpoint=A/checkpoint-2`` starts at step 3 from A's checkpoint, and its
    step 4 weights are those of the straight 4-step run in A; so are those of ``resume_from_checkpoint: true``."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM

    from ictrl import cli

    config = resumable_file(in_tmp, tiny_model_dir, "a", max_steps=4)
    assert cli.main(["train", str(config)]) == 0
    code = cli.main(["train", str(config), f"--output_dir={in_tmp / 'b'}",
                     f"--resume_from_checkpoint={in_tmp / 'a' / 'checkpoint-2'}"])
    assert code == 0, capsys.readouterr().err[-3000:]
    steps = [json.loads(line)["step"] for line in (in_tmp / "b" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [3, 4]
    assert json.loads((in_tmp / "b" / "trainer_state.json").read_text())["global_step"] == 4
    assert sorted(p.name for p in (in_tmp / "b").glob("checkpoint-*")) == ["checkpoint-3", "checkpoint-4"]
    # true: TRL's "the last checkpoint in output_dir", here a copy of A's first two steps
    copy = in_tmp / "c"
    shutil.copytree(in_tmp / "a" / "checkpoint-2", copy / "checkpoint-2")
    for name in ("config.yaml", "run.json"):
        shutil.copy(in_tmp / "a" / name, copy / name)
    assert cli.main(["train", str(config), f"--output_dir={copy}", "--resume_from_checkpoint=true"]) == 0
    steps = [json.loads(line)["step"] for line in (copy / "metrics.jsonl").read_text().splitlines()]
    assert steps == [3, 4]
    straight = AutoModelForCausalLM.from_pretrained(in_tmp / "a").state_dict()
    for run in ("b", "c"):
        resumed = AutoModelForCausalLM.from_pretrained(in_tmp / run).state_dict()
        assert straight.keys() == resumed.keys() and all(torch.equal(straight[k], resumed[k]) for k in straight)


def fake_checkpoint(path: Path, step: int = 2) -> Path:
    from ictrl.files import claim_files

    path.mkdir(parents=True)
    claim_files(path.parent, [path.name])  # as ictrl lists the checkpoints it writes
    (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return path


@pytest.mark.parametrize("case", ["missing", "incomplete", "disagree", "true_without_checkpoint", "elsewhere_busy"])
def test_resume_from_checkpoint_that_cannot_resume_is_one_line(case: str, tiny_model_dir: Path, in_tmp: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    from ictrl import cli

    config = resumable_file(in_tmp, tiny_model_dir, "b", max_steps=4)
    other = in_tmp / "a" / "checkpoint-2"
    argv, expected = ["train", str(config), f"--resume_from_checkpoint={other}"], ""
    if case == "missing":
        expected = f"resume_from_checkpoint: {other}: does not exist; name a checkpoint folder"
    elif case == "incomplete":
        other.mkdir(parents=True)
        expected = f"resume_from_checkpoint: {other}: not a complete checkpoint (no readable trainer_state.json)"
    elif case == "disagree":
        fake_checkpoint(other)
        fake_checkpoint(in_tmp / "b" / "checkpoint-1", step=1)
        argv.append("--resume")
        expected = f"--resume continues the last checkpoint in output_dir {in_tmp / 'b'}, and resume_from_checkpoint"
    elif case == "true_without_checkpoint":
        argv[-1] = "--resume_from_checkpoint=true"
        expected = "resume_from_checkpoint: true resumes the last checkpoint in output_dir "
    else:
        fake_checkpoint(other)
        fake_checkpoint(in_tmp / "b" / "checkpoint-1", step=1)
        expected = f"output_dir: {in_tmp / 'b'} already holds checkpoint-1"
    assert cli.main(argv) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "rror" in line or expected in line]
    assert any(expected in line for line in err), err


def test_resume_from_checkpoint_true_is_the_last_checkpoint_in_output_dir(tmp_path: Path) -> None:
    from ictrl.train_cli.run_config import config_from_dict
    from ictrl.train_cli.output_dir import named_checkpoint

    base = {"model_name_or_path": "m", "output_dir": str(tmp_path), "dataset_name": "gsm8k_train"}
    fake_checkpoint(tmp_path / "checkpoint-1", step=1)
    for value in (True, "true", "True"):
        cfg = config_from_dict({**base, "resume_from_checkpoint": value})
        assert named_checkpoint(cfg, False) == (True, None)
        assert named_checkpoint(cfg, "auto") == ("auto", None)
    assert named_checkpoint(config_from_dict({**base, "resume_from_checkpoint": False}), False) == (False, None)
    inside = fake_checkpoint(tmp_path / "checkpoint-2")
    cfg = config_from_dict({**base, "resume_from_checkpoint": str(inside)})
    assert named_checkpoint(cfg, True) == (True, inside)  # --resume and the key agree: a checkpoint of output_dir


# --- data sets and rewards as trl grpo names them --------------------------------------------------------------


def hub_config(**values: Any) -> Any:
    from ictrl.train_cli.run_config import config_from_dict

    return config_from_dict({"model_name_or_path": "m", "output_dir": "o", **values})


def test_a_hub_id_reaches_load_dataset_with_trl_grpos_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    from ictrl.train_cli.run_inputs import check_sources, load_train_dataset

    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def load_dataset(*args: Any, **kwargs: Any) -> Any:
        calls.append((args, kwargs))
        rows = datasets.Dataset.from_dict({"prompt": ["1+1=", "2+2="], "solution": ["2", "4"]})
        return datasets.DatasetDict({"train": rows, "test": rows.select([0])})

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    cfg = hub_config(dataset_name="trl-lib/DeepMath-103K", dataset_config="main", dataset_train_split="test")
    check_sources(cfg)  # a hub id is not an unknown benchmark name, and takes dataset_config / dataset_train_split
    rows = load_train_dataset(cfg)
    # trl grpo: load_dataset(dataset_name, name=dataset_config, streaming=dataset_streaming)[dataset_train_split]
    assert calls == [(("trl-lib/DeepMath-103K",), {"name": "main", "streaming": False})]
    assert rows["prompt"] == ["1+1="]


@pytest.mark.parametrize("name", ["gsm8k_trian", "trl-lib/DeepMath-103K/extra"])
def test_a_name_of_neither_shape_keeps_the_known_names_line(name: str) -> None:
    from ictrl.train_cli.run_config import ConfigError
    from ictrl.train_cli.run_inputs import check_sources

    with pytest.raises(ConfigError, match=rf"dataset_name: '{name}': benchmark: unknown name"):
        check_sources(hub_config(dataset_name=name))


def test_a_missing_split_names_the_splits_there_are(tmp_path: Path) -> None:
    from ictrl.errors import DataError
    from ictrl.train_cli.run_inputs import load_train_dataset

    (tmp_path / "train.jsonl").write_text('{"prompt": "1+1=", "solution": "2"}\n')
    cfg = hub_config(dataset_name=str(tmp_path), dataset_train_split="validation")
    with pytest.raises(DataError) as raised:
        load_train_dataset(cfg)
    assert str(raised.value) == f"dataset_train_split: 'validation': {tmp_path} has no such split; its splits: train"


def offline_env(tmp_path: Path, cache: Path) -> dict[str, str]:
    import os

    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf_home"),
            "HF_DATASETS_CACHE": str(cache)}


def test_offline_without_a_cached_copy_is_one_line_before_the_model_loads(tiny_model_dir: Path,
                                                                          tmp_path: Path) -> None:
    import subprocess

    config = trl_file(tmp_path, tiny_model_dir)
    proc = subprocess.run([sys.executable, "-m", "ictrl", "train", str(config), "--dataset_name=fake-org/digits"],
                          cwd=tmp_path, env=offline_env(tmp_path, tmp_path / "empty_cache"), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert ("dataset_name: fake-org/digits: not in the local datasets cache, and HF_HUB_OFFLINE=1 keeps datasets "
            "off the hub") in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "out").exists()


def warm_cache(tmp_path: Path, data: Path, repo: str) -> Path:
    """A datasets cache holding ``repo`` (owner/name) as ``datasets`` keeps a downloaded hub data set: the arrow
    files and dataset_info.json of its builder under OWNER___NAME/default/0.0.0/HASH, which ``load_dataset(repo)``
    reads offline through its Cache builder. Built from ``data`` with the json builder, then laid out there."""
    import shutil

    import datasets

    cache = tmp_path / "warm_cache"
    datasets.load_dataset("json", data_files={"train": str(data)}, cache_dir=str(cache))
    built = next(cache.glob("json/*/0.0.0/*/dataset_info.json")).parent
    owner, name = repo.split("/")
    target = cache / f"{owner}___{name}" / "default" / "0.0.0" / built.name
    shutil.copytree(built, target)
    (target / "json-train.arrow").rename(target / f"{name}-train.arrow")
    info = json.loads((target / "dataset_info.json").read_text())
    info.update(config_name="default", dataset_name=name, builder_name="parquet")
    (target / "dataset_info.json").write_text(json.dumps(info))
    return cache


@pytest.mark.integration
def test_a_hub_id_in_a_warm_offline_cache_trains(tiny_model_dir: Path, tmp_path: Path) -> None:
    import os
    import subprocess

    config = trl_file(tmp_path, tiny_model_dir)
    cache = warm_cache(tmp_path, tmp_path / "digits" / "train.jsonl", "fake-org/digits")
    env = {**offline_env(tmp_path, cache), "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run([sys.executable, "-m", "ictrl", "train", str(config), "--dataset_name=fake-org/digits"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [json.loads(line)["step"] for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()] == [1]


def test_reward_funcs_takes_a_flags_yaml_list(tmp_path: Path) -> None:
    from ictrl.train_cli.run_config import ConfigError, load_config

    config = tmp_path / "c.yaml"
    config.write_text("model_name_or_path: m\noutput_dir: o\ndataset_name: gsm8k_train\n")
    assert load_config(config, ["--reward_funcs=[math, format]"]).script.reward_funcs == ["math", "format"]
    assert load_config(config, ["--reward_funcs", "math", "format"]).script.reward_funcs == ["math", "format"]
    with pytest.raises(ConfigError, match=r"reward_funcs: expected a list of names, got \['math', \['x'\]\]"):
        load_config(config, ["--reward_funcs=[math, [x]]"])


@pytest.mark.integration
def test_a_file_without_output_dir_writes_trainer_output_as_trl_grpo(tiny_model_dir: Path, in_tmp: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """No ``output_dir``: TRL's GRPOConfig makes it ``trainer_output`` (TrainingArguments' default), and
    ``ictrl train`` writes there too, the model ``trl grpo`` writes there from the same file."""
    import trl

    from ictrl import cli
    from tests.train_cli.test_trl_habits import run_trl_grpo, same_weights, state_dict

    config = trl_file(in_tmp, tiny_model_dir, max_steps=1)
    data = yaml.safe_load(config.read_text())
    del data["output_dir"]
    config.write_text(yaml.safe_dump(data))
    assert trl.GRPOConfig(use_cpu=True).output_dir == "trainer_output"
    assert cli.main(["train", str(config)]) == 0
    (in_tmp / "trl").mkdir()
    monkeypatch.chdir(in_tmp / "trl")
    run_trl_grpo(config)
    assert same_weights(state_dict(in_tmp / "trl" / "trainer_output"), state_dict(in_tmp / "trainer_output"))
