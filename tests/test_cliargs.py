"""``~`` and ``$VAR`` in paths: a config file's path keys are expanded as a shell would (in a ``jsonl:`` spec its
path only, never its options); a command-line value keeps the ``$`` the shell was told to keep."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from ictrl.cli import main
from ictrl.cliargs import expand_path
from ictrl.errors import UserError


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("ICTRL_TEST_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("n", "7")  # `Let $n$ be` would read `Let 7$ be` if the template were expanded
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text(json.dumps({"question": "1+1?", "answer": "2"}) + "\n")
    return tmp_path


def print_config(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict:
    assert main(["train", *argv, "--print-config"]) == 0, capsys.readouterr().err[-2000:]
    return yaml.safe_load(capsys.readouterr().out)


def test_a_jsonl_spec_expands_its_path_and_leaves_its_prompt_template_as_written(
        project: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    template = "Let $n$ be the answer to {question}, ~ $HOME"
    config = project / "run.yaml"
    config.write_text(yaml.safe_dump({
        "model_name_or_path": str(tiny_model_dir), "output_dir": "$ICTRL_TEST_DATA/../out", "use_vllm": False,
        "dataset_name": f"jsonl:$ICTRL_TEST_DATA/train.jsonl:prompt_template={template}"}))
    printed = print_config([str(config)], capsys)
    assert printed["dataset_name"] == f"jsonl:{project / 'data'}/train.jsonl:prompt_template={template}"
    assert printed["output_dir"] == f"{project / 'data'}/../out"


def test_a_command_line_value_keeps_the_dollar_the_shell_was_told_to_keep(
        project: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--output_dir='$ICTRL_TEST_DATA/x'``: the shell passed the text, single-quoted; ictrl does not expand it
    a second time. A leading ``~`` (which a shell leaves after ``--output_dir=``) is the home folder."""
    config = project / "run.yaml"
    config.write_text(yaml.safe_dump({"model_name_or_path": str(tiny_model_dir), "output_dir": "out",
                                      "use_vllm": False, "dataset_name": "jsonl:data/train.jsonl"}))
    printed = print_config([str(config), "--output_dir=$ICTRL_TEST_DATA/x"], capsys)
    assert printed["output_dir"] == "$ICTRL_TEST_DATA/x"
    printed = print_config([str(config), "--output_dir=~/x", "--dataset_name=jsonl:$ICTRL_TEST_DATA/t.jsonl"],
                           capsys)
    assert printed["output_dir"] == str(project / "home" / "x")


@pytest.mark.parametrize(("text", "variables", "expected"), [
    ("jsonl:$ICTRL_TEST_DATA/t.jsonl:prompt_template=$n {question}", True, "jsonl:{data}/t.jsonl:prompt_template=$n "
                                                                           "{question}"),
    ("jsonl:path=$ICTRL_TEST_DATA/a=b.jsonl:kind=gsm8k", True, "jsonl:path={data}/a=b.jsonl:kind=gsm8k"),
    ("jsonl:~/t.jsonl:prompt_template=~{question}", False, "jsonl:{home}/t.jsonl:prompt_template=~{question}"),
    ("$ICTRL_TEST_DATA/x", False, "$ICTRL_TEST_DATA/x"),
    ("~/$ICTRL_TEST_DATA", False, "{home}/$ICTRL_TEST_DATA"),
    ("${ICTRL_TEST_DATA}/x", True, "{data}/x"),
    ("price$5/x", True, "price$5/x"),
])
def test_expand_path(text: str, variables: bool, expected: str, project: Path) -> None:
    assert expand_path(text, "key", variables) == expected.replace("{data}", str(project / "data")).replace(
        "{home}", str(project / "home"))


def test_an_unset_variable_in_a_config_path_is_one_line(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ICTRL_TEST_UNSET", raising=False)
    with pytest.raises(UserError, match="key: 'jsonl:\\$ICTRL_TEST_UNSET/t.jsonl:prompt_template=.*ICTRL_TEST_UNSET "
                                        "is not set"):
        expand_path("jsonl:$ICTRL_TEST_UNSET/t.jsonl:prompt_template=$n{question}", "key")
    assert expand_path("jsonl:t.jsonl:prompt_template=$ICTRL_TEST_UNSET {question}", "key") == \
        "jsonl:t.jsonl:prompt_template=$ICTRL_TEST_UNSET {question}"
