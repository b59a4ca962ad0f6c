"""Hostile run-config values: each is one line on stderr, exit status 2, before the model loads, nothing written."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from ictrl import cli
from ictrl.train_cli import trainer_inputs
from ictrl.errors import quote

TINY = Path(__file__).resolve().parents[2] / "configs" / "tiny" / "ict.yaml"
BIG = "x" * 10_000_000
LONG = "x" * 50_000


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run ``ictrl train ARGV``; check exit 2 and exactly one short error line; return that line."""
    code = cli.main(["train", *argv])
    err = capsys.readouterr().err
    assert code == 2, err[-2000:]
    errors = [line for line in err.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith("ictrl train: error:"), err[-2000:]
    assert len(errors[0]) < 1000, errors[0][:2000]
    return errors[0]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--learning_rate=-1"], "learning_rate: must be >= 0, got -1"),
        (["--learning_rate=nan"], "learning_rate: must be finite, got nan"),
        (["--learning_rate=inf"], "learning_rate: must be finite, got inf"),
        (["--learning_rate=1e999"], "learning_rate: must be finite, got inf"),
        (["--seed=99999999999999999999"], "seed: must be >= 0 and < 4294967296, got 99999999999999999999"),
        ([f"--eval_num_samples={10**400}"], "eval_num_samples: must fit in 64 bits, got 1000000"),
        ([f"--seed=-{10**400}"], "seed: must be >= 0 and < 4294967296, got -1000000"),
        (["--vllm_structured_outputs_regex=''", "--pad_to_multiple_of=''"],
         "override --pad_to_multiple_of='': pad_to_multiple_of: invalid literal for int()"),
        (["--num_generations=1000000000"], "generation batch too large: 32000000000 completions per process"),
        (["--num_generations=1000000", "--per_device_train_batch_size=1000000"],
         "generation batch too large: 32000000 completions per process"),
        (["--max_completion_length=1000000"], "+ max_completion_length 1000000) tokens = "),
        (["--max_steps=-5", "--num_train_epochs=0"], "max_steps: must be >= 1, or -1 to train num_train_epochs"),
        (["--max_steps=0"], "max_steps: must be >= 1"),
        (["--max_steps=-1", "--num_train_epochs=0"], "num_train_epochs: must be > 0 when max_steps is -1"),
        (["--max_steps=-1", "--num_train_epochs=nan"], "num_train_epochs: must be finite, got nan"),
        (["--temperature=0"], ": temperature: must be > 0, got 0.0"),
        (["--top_p=1.5"], "top_p: must be > 0 and <= 1, got 1.5"),
        (["--dataset_name={gsm8k_train: .inf}"], "dataset_name.gsm8k_train: mixture weight must be a finite number > 0, got inf"),
        (["--overlong_penalty_factor=nan"], "overlong_penalty_factor: must be finite, got nan"),
        ([f"--learning_rate={BIG}"], "override --learning_rate: a value of 10000000 characters, more than 65536"),
        ([f"--learning_rate={LONG}"], "learning_rate: invalid float value: 'xxxx"),
        ([f"--dataset_name=[{LONG}]"], "dataset_name: 'xxxx"),
        ([f"--token_selector={LONG}"], "token_selector"),
        ([f"--{BIG}=1"], "unknown key 'xxxx"),
    ],
    ids=lambda v: v[0][:40] if isinstance(v, list) else None,
)
def test_hostile_flag_is_one_line_before_the_model(flags: list[str], message: str, loader_calls: list[Any],
                                                   tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    line = refused([str(TINY), f"--output_dir={out}", *flags], capsys)
    assert message in line
    if message.startswith(("learning_rate:", "seed:", "max_steps:", "top_p:")):  # a flag's value: the flag named
        assert line.startswith(f"ictrl train: error: override --{message.split(':')[0]}"), line
    assert loader_calls == [] and not out.exists()


@pytest.mark.parametrize("penalty", [[], ["--overlong_buffer_length=4"]])
def test_reward_weights_not_one_per_reward(penalty: list[str], loader_calls: list[Any], tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """TRL's trainer counts them only after the model loaded; the penalty's own weight is not one of them."""
    line = refused([str(TINY), f"--output_dir={tmp_path / 'out'}", "--reward_weights", "1", "2", *penalty], capsys)
    assert line.startswith("ictrl train: error: override --reward_weights=[1.0, 2.0]: reward_weights: 2 weights "
                           "for 1 rewards (reward_funcs)"), line
    assert line.endswith("the overlong penalty's weight is overlong_penalty_factor") == bool(penalty), line
    assert loader_calls == [] and not (tmp_path / "out").exists()


@pytest.mark.parametrize("target", ["file", "/dev/null", "under_a_file"])
def test_output_dir_that_cannot_be_a_directory(target: str, loader_calls: list[Any], tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    afile = tmp_path / "afile"
    afile.write_text("keep")
    out = {"file": str(afile), "/dev/null": "/dev/null", "under_a_file": str(afile / "run")}[target]
    line = refused([str(TINY), f"--output_dir={out}", "--dataset_name=[gsm8k_train]"], capsys)
    assert "output_dir:" in line and ("is a file" in line or "not a directory" in line)
    assert line.startswith("ictrl train: error: override --output_dir="), line  # the flag set it
    assert afile.read_text() == "keep" and loader_calls == []


def test_output_dir_not_writable(loader_calls: list[Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import os

    locked = tmp_path / "ro"
    locked.mkdir(mode=0o500)
    if os.access(locked, os.W_OK):
        pytest.skip("running as a user who can write anywhere (root)")
    line = refused([str(TINY), f"--output_dir={locked / 'run'}", "--dataset_name=[gsm8k_train]"], capsys)
    assert "output_dir:" in line and "not writable" in line


@pytest.mark.parametrize("key", ["eval_datasets", "reward_funcs"])
def test_a_list_of_names_holding_lists_is_one_line(key: str, loader_calls: list[Any], tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Aliases expand as YAML says (the file is the user's own); a name list holding lists, a recursive one too,
    is refused naming the key."""
    for value in ("[[a, b]]", "&a [*a]"):
        path = tmp_path / "nested.yaml"
        path.write_text(f"model_name_or_path: m\noutput_dir: out\ndataset_name: gsm8k_train\n{key}: {value}\n")
        line = refused([str(path)], capsys)
        assert f"{path}: {key}: expected a list of names, got [[" in line, line
    assert not (tmp_path / "out").exists() and loader_calls == []


def test_yaml_python_tags_are_refused(loader_calls: list[Any], tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "tagged.yaml"
    flag = tmp_path / "ran"
    path.write_text(f"model_name_or_path: !!python/object/apply:os.system ['touch {flag}']\noutput_dir: out\n")
    line = refused([str(path)], capsys)
    assert f"{path}: not valid YAML: could not determine a constructor for the tag" in line, line
    assert not flag.exists() and loader_calls == []


def test_binary_and_oversized_config_files(loader_calls: list[Any], tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    binary = tmp_path / "model.safetensors"
    binary.write_bytes(bytes(range(256)) * 64)
    assert "not a text file (byte 128 is not UTF-8)" in refused([str(binary)], capsys)
    huge = tmp_path / "huge.yaml"
    huge.write_text("# " + "x" * (2 << 20) + "\n")
    assert "bytes, more than a run config's" in refused([str(huge)], capsys)
    control = tmp_path / "control.yaml"
    control.write_text("model_name_or_path: m\x07\n")
    assert "not valid YAML" in refused([str(control)], capsys)


def test_yaml_nested_past_the_recursion_limit_is_one_line(loader_calls: list[Any], tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    deep = tmp_path / "deep.yaml"
    deep.write_text("model_name_or_path: m\noutput_dir: out\nlearning_rate: " + "[" * 5000 + "]" * 5000 + "\n")
    assert refused([str(deep)], capsys).endswith(f"{deep}: YAML nested too deeply")
    assert refused([str(TINY), f"--accelerate-config={deep}"], capsys).endswith(
        f"--accelerate-config {deep}: YAML nested too deeply")
    assert loader_calls == [] and not (tmp_path / "out").exists()


def test_output_dir_leaving_the_working_directory_warns_once(loader_calls: list[Any], tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    for out, warned in (("../../x", 1), ("sub/../inside", 0)):
        cli.main(["train", str(TINY), f"--output_dir={out}", f"--model_name_or_path={tmp_path / 'none'}",
                  "--dataset_name=[gsm8k_train]"])
        err = capsys.readouterr().err
        warnings = [line for line in err.splitlines() if "leaves the working directory" in line]
        assert len(warnings) == warned, err
        assert "model_name_or_path" in err  # stopped later, at the model check
    assert str(tmp_path / "x") in warnings[0] if warned else True
    assert not (tmp_path / "x").exists()  # the refused run left no directory behind


def test_range_table_and_the_memory_bound() -> None:
    from annotated_types import Interval

    from ictrl.validation import bound_text, field_error

    rng = Interval(gt=0, le=1)
    inside = [value for value in (0.5, 1, 0, 1.01) if field_error("x", value, None, rng) is None]
    assert inside == [0.5, 1] and bound_text(rng) == "> 0 and <= 1"
    assert quote("y" * 10_000).endswith("...") and len(quote("y" * 10_000)) < 300
    nested: Any = ["x"]
    for _ in range(40):
        nested = [nested] * 9
    assert len(quote(nested)) < 300  # bounded work: 9**40 leaves are never visited
    assert trainer_inputs.max_batch_tokens() == trainer_inputs.MAX_BATCH_TOKENS


@pytest.mark.parametrize(("values", "message"), [
    ({"learning_rate": -1}, "learning_rate: must be >= 0, got -1"),
    ({"learning_rate": float("nan")}, "learning_rate: must be finite, got nan"),
    ({"seed": 1 << 40}, "seed: must be >= 0 and < 4294967296"),
    ({"top_p": 1.5}, "top_p: must be > 0 and <= 1, got 1.5"),
    ({"max_steps": 0}, "max_steps: must be >= 1"),
    ({"reward_weights": [1.0, float("inf")]}, "reward_weights[1]: must be finite, got inf"),
])
def test_python_users_get_the_same_lines(values: dict[str, Any], message: str, tmp_path: Path) -> None:
    """The bounds live in ICTGRPOConfig: constructing it from Python stops with the line ictrl train prints."""
    from ictrl.engine.config import ICTGRPOConfig

    with pytest.raises(ValueError, match=f"^{re.escape(message)}"):
        ICTGRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, **values)


def test_a_megabyte_training_prompt_is_dropped_without_tokenising_it(caplog: pytest.LogCaptureFixture) -> None:
    import time

    import datasets

    from ictrl.train_cli.run_inputs import drop_long_prompts
    from ictrl.models import build_byte_tokenizer

    tok = build_byte_tokenizer()
    ds = datasets.Dataset.from_dict({"prompt": ["short", "z" * 2_000_000, "y" * 20], "id": ["a", "b", "c"]})
    calls: list[int] = []
    tokenize = type(tok).__call__

    def counting(self: Any, text: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(len(text))
        return tokenize(self, text, *args, **kwargs)

    start = time.process_time()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(type(tok), "__call__", counting)
        kept = drop_long_prompts(ds, tok, limit=50)
    assert kept["id"] == ["a", "c"] and max(calls) < 100  # the long row never reached the tokenizer
    assert "row 1 (id b, at least " in caplog.text
    assert time.process_time() - start < 20
