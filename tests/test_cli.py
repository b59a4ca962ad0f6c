"""The command line's failure lines: argparse errors, Ctrl-C and errors under a launcher are one line each, and
a command's mistakes are blamed on the flag that made them."""

from __future__ import annotations

import argparse
import types
from pathlib import Path

import pytest

from ictrl import cli


def test_argparse_error_is_one_line_with_a_help_pointer(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["eval", "--model", "m", "--backend", "sglang"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("ictrl eval: error: argument --backend: invalid choice: 'sglang'")
    assert err[0].endswith("(see ictrl eval --help)")


def _fake_command(monkeypatch: pytest.MonkeyPatch, raise_: BaseException | None) -> None:
    module = types.ModuleType("fake_command")

    def run(args: argparse.Namespace) -> int:
        if raise_ is not None:
            raise raise_
        return 0

    module.add_arguments = lambda parser: None  # type: ignore[attr-defined]
    module.run = run  # type: ignore[attr-defined]
    monkeypatch.setitem(__import__("sys").modules, "fake_command", module)
    monkeypatch.setitem(cli.COMMANDS, "fake", ("fake_command", "a test command"))


def test_ctrl_c_is_one_line_and_exit_130(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from ictrl.errors import Interrupted

    _fake_command(monkeypatch, KeyboardInterrupt())
    assert cli.main(["fake"]) == 130
    assert capsys.readouterr().err.strip() == "ictrl fake: interrupted"
    _fake_command(monkeypatch, Interrupted("interrupted at step 7; resume with `ictrl train c.yaml --resume`"))
    assert cli.main(["fake"]) == 130
    assert capsys.readouterr().err.strip() == ("ictrl fake: interrupted at step 7; resume with "
                                               "`ictrl train c.yaml --resume`")


def test_user_error_is_printed_by_rank_zero_only(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from ictrl.errors import UserError

    _fake_command(monkeypatch, UserError("data.train: 'x': file not found"))
    monkeypatch.setenv("RANK", "1")
    assert cli.main(["fake"]) == 2
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("RANK", "0")
    assert cli.main(["fake"]) == 2
    assert capsys.readouterr().err.strip() == "ictrl fake: error: data.train: 'x': file not found"


def test_interrupted_names_the_step_checkpoint_and_resume_command(tmp_path: Path) -> None:
    from ictrl.engine.run import interrupted

    command = "ictrl train configs/tiny/ict.yaml --resume"
    assert str(interrupted(tmp_path, 3, command)) == "interrupted at step 3; no checkpoint yet (save_steps)"
    for step in (10, 20):
        (tmp_path / f"checkpoint-{step}").mkdir()
        (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")
    (tmp_path / "checkpoint-30").mkdir()  # incomplete: no trainer state
    assert str(interrupted(tmp_path, 27, command)) == (
        f"interrupted at step 27; last complete checkpoint {tmp_path / 'checkpoint-20'}; resume with `{command}`")


def test_trl_flags_and_dashed_keys(capsys: pytest.CaptureFixture[str]) -> None:
    from ictrl.engine.cli import UsageError, normalize_overrides

    assert normalize_overrides(["--output-dir=runs/x", "--learning-rate", "1e-5", "--model_name_or_path=m",
                                "--data.max-prompt-length=64", "value"]) == [
        "--output_dir=runs/x", "--learning_rate", "1e-5", "--model.name_or_path=m", "--data.max_prompt_length=64",
        "value"]
    with pytest.raises(UsageError, match="--dataset_name is a flag of TRL's scripts; in ictrl the data is data.train"):
        normalize_overrides(["--dataset_name=openai/gsm8k"])


def test_train_help_lists_config_keys_with_their_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    out = capsys.readouterr().out
    assert "model.name_or_path" in out and "Hub id (needs network) or local directory" in out
    assert "token_selector" in out and "selection_ratio" in out and "learning_rate" in out
    assert "data.train" in out and "reward.names" in out


def test_module_function_imports_from_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    (tmp_path / "mysel_wd.py").write_text(
        "import torch\nfrom ictrl.core.selection import register_selector\n\n"
        "@register_selector('first_wd')\ndef first_wd(inputs):\n    return inputs.mask\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    from ictrl.core.selection import get_selector

    with pytest.raises(ValueError, match="cannot import"):  # as a library call: not on the path
        get_selector("mysel_wd:first_wd")
    _fake_command(monkeypatch, None)
    assert cli.main(["fake"]) == 0  # any command puts the working directory on the path, last
    assert sys.path[-1] == str(tmp_path)
    assert get_selector("mysel_wd:first_wd").name == "first_wd"
