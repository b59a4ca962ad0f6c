"""The command line's failure lines: argparse errors, Ctrl-C and errors under a launcher are one line each, and
a command's mistakes are blamed on the flag that made them."""

from __future__ import annotations

import argparse
import os
import signal
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from ictrl import cli


@pytest.fixture(autouse=True)
def _sigint_restored() -> Iterator[None]:
    """``cli.entry`` ignores a second Ctrl-C once a run reports its stop; the tests after these keep their handler."""
    handler = signal.getsignal(signal.SIGINT)
    yield
    signal.signal(signal.SIGINT, handler)


def test_argparse_error_is_one_line_with_a_help_pointer(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["eval", "--model", "m", "--backend", "sglang"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("ictrl eval: error: argument --backend: invalid choice: 'sglang'")
    assert err[0].endswith("(see ictrl eval --help)")


def test_a_command_that_moved_to_the_studies_says_where(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["sweep", "--quick"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "python -m studies sweep" in err[0], err


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
    from ictrl.train_cli.run_guard import stopped as interrupted
    from ictrl.errors import Terminated

    command = "ictrl train configs/tiny/ict.yaml --resume"
    assert str(interrupted(tmp_path, 3, command)) == "interrupted at step 3; no checkpoint yet (save_steps)"
    for step in (10, 20):
        (tmp_path / f"checkpoint-{step}").mkdir()
        (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")
    (tmp_path / "checkpoint-30").mkdir()  # incomplete: no trainer state
    assert str(interrupted(tmp_path, 27, command)) == (
        f"interrupted at step 27; last complete checkpoint {tmp_path / 'checkpoint-20'}; resume with `{command}`")
    terminated = interrupted(tmp_path, 20, command, Terminated)
    assert isinstance(terminated, Terminated) and terminated.status == 143
    assert str(terminated) == (f"terminated (SIGTERM) at step 20; last complete checkpoint {tmp_path / 'checkpoint-20'}"
                               f"; resume with `{command}`")
    assert str(interrupted(tmp_path, None, command, Terminated)) == (  # outside the training loop
        f"terminated (SIGTERM); last complete checkpoint {tmp_path / 'checkpoint-20'}; resume with `{command}`")


def test_trl_flags_and_dashed_keys() -> None:
    from ictrl.train_cli.run_config import config_from_dict

    cfg = config_from_dict({}, flags=["--output-dir=runs/x", "--learning-rate", "1e-5", "--model_name_or_path=m",
                                      "--max-prompt-length=64", "--dataset_name=openai/gsm8k"])
    assert cfg.output_dir == "runs/x" and cfg.trainer["learning_rate"] == 1e-5
    assert (cfg.model.model_name_or_path, cfg.script.max_prompt_length) == ("m", 64)
    assert cfg.flags["max_prompt_length"] == "64" and cfg.script.dataset_name == "openai/gsm8k"


def test_train_help_lists_config_keys_with_their_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    out = capsys.readouterr().out
    assert "model_name_or_path" in out and "Model checkpoint for weights initialization" in out
    assert "token_selector" in out and "selection_ratio" in out and "learning_rate" in out
    assert "dataset_name" in out and "reward_funcs" in out and "use_peft" in out and "eval_datasets" in out


def test_train_help_lists_every_key_once_with_its_default_and_whole_help(capsys: pytest.CaptureFixture[str]) -> None:
    import dataclasses
    import re

    from ictrl.train_cli.run_config import owners

    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    out = capsys.readouterr().out
    listed = re.findall(r"^  --(\w+) \(default: (.*?)(?:; (.*))?\)$", out, flags=re.M)
    assert sorted(name for name, _, _ in listed) == sorted(owners())  # every accepted key, once
    defaults = {name: default for name, default, _ in listed}
    assert defaults["learning_rate"] == "1.0e-06" and defaults["beta"] == "0.0" and defaults["lora_r"] == "16"
    bounds = {name: bound for name, _, bound in listed if bound}  # a field's declared range or choices
    assert bounds["cpu_threads"] == ">= 1 and <= 4096" and bounds["learning_rate"] == ">= 0"
    assert bounds["max_prompt_length"] == ">= 1" and bounds["lora_dropout"] == ">= 0 and < 1"  # the script's, TRL's
    assert bounds["dtype"] == "one of 'auto', 'bfloat16', 'float16', 'float32'"
    assert defaults["token_selector"].startswith("'all' under ictrl train when the file sets none")
    fields = {f.name: f for cls in set(owners().values()) for f in dataclasses.fields(cls)}
    flat = " ".join(out.split())
    cut = [name for name in owners() if " ".join(str(fields[name].metadata.get("help", "")).split()) not in flat]
    assert cut == []  # every key's help whole, none shortened
    for group in ("ictrl's own keys", "trl grpo's script keys", "model keys", "GRPO keys", "training keys"):
        assert f"\n{group}" in out


def test_overrides_go_before_or_after_the_config_file() -> None:
    from ictrl.train_cli.cli import parse_argv

    for argv in (["--learning-rate=1e-5", "c.yaml"], ["--learning-rate", "1e-5", "c.yaml"],
                 ["c.yaml", "--learning-rate", "1e-5"], ["--config", "c.yaml", "--learning-rate=1e-5"]):
        parsed = parse_argv(argv)
        assert parsed.config == "c.yaml" and "c.yaml" not in parsed.overrides, argv
    assert parse_argv(["--use_peft", "c.yaml"]).config == "c.yaml"  # a bare boolean before the file


def test_argv_is_read_in_one_pass_help_winning_over_its_mistakes() -> None:
    from ictrl.train_cli.cli import MAX_FLAG_CHARS, parse_argv

    for argv in (["-h"], ["c.yaml", "--help"], ["--num-processes", "--help"], ["--num-processes=0", "-h"]):
        assert parse_argv(argv).help, argv
    parsed = parse_argv(["c.yaml", "--num-processes=2", "--seed", "3", "--resume"])
    assert (parsed.config, parsed.overrides, parsed.flags) == ("c.yaml", ["--seed", "3"], {"--resume"})
    assert parsed.child_argv == ["c.yaml", "--seed", "3", "--resume"] and parsed.launch.num_processes == 2
    assert parsed.argv == ["c.yaml", "--num-processes=2", "--seed", "3", "--resume"] and parsed.problem is None
    long = "x" * (MAX_FLAG_CHARS + 1)
    assert parse_argv(["c.yaml", f"--run_name={long}"]).problem == (
        f"override --run_name: a value of {MAX_FLAG_CHARS + 1} characters, more than {MAX_FLAG_CHARS}; put long "
        "values in the config file")
    assert parse_argv(["c.yaml", "--run_name", long]).problem.startswith("override xxxx")
    assert parse_argv(["--num-processes=0", "--config"]).problem == (  # the first of its three mistakes
        "--num-processes: expected a whole number >= 1, got '0'")


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


class _Exited(BaseException):
    """Raised by the fake ``os._exit``: the process would end here."""


def _record_exit(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Fakes the process-group leave, the atexit run and ``os._exit``; returns the events in order (the exit also
    records whether a process group was still initialised at that moment)."""
    import atexit
    import os

    import torch.distributed as dist

    from ictrl.train_cli import process_group

    events: list[str] = []
    real_leave = process_group.leave_process_group

    def leave(wait: bool = True) -> None:
        events.append(f"leave wait={wait}")
        real_leave(wait=wait)

    def exit_(code: int) -> None:
        events.append(f"exit {code} group={dist.is_initialized()}")
        raise _Exited

    monkeypatch.setattr(process_group, "leave_process_group", leave)
    monkeypatch.setattr(atexit, "_run_exitfuncs", lambda: events.append("atexit"))
    monkeypatch.setattr(os, "_exit", exit_)
    return events


def test_outside_a_launch_the_entry_exits_as_the_interpreter_does(monkeypatch: pytest.MonkeyPatch) -> None:
    events = _record_exit(monkeypatch)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setattr("sys.argv", ["ictrl", "fake"])
    _fake_command(monkeypatch, None)
    with pytest.raises(SystemExit) as exit_info:
        cli.entry()
    assert exit_info.value.code == 0
    _fake_command(monkeypatch, RuntimeError("boom"))
    with pytest.raises(RuntimeError, match="boom"):
        cli.entry()
    monkeypatch.setenv("WORLD_SIZE", "1")  # a one-process launch: no group, nothing to guard against
    with pytest.raises(RuntimeError, match="boom"):
        cli.entry()
    assert events == []


@pytest.mark.parametrize(("raise_", "code", "err"), [
    (None, 0, ""),
    ("user", 2, "ictrl fake: error: data.train: 'x': file not found\n"),
    (KeyboardInterrupt(), 130, "\nictrl fake: interrupted\n"),
    (SystemExit(2), 2, ""),
    (SystemExit("ictrl: gone"), 1, "ictrl: gone\n"),
    (RuntimeError("boom"), 1, "RuntimeError: boom\n"),
])
def test_a_launched_rank_leaves_its_group_then_exits_without_finalising(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], raise_: BaseException | str | None,
        code: int, err: str) -> None:
    from ictrl.errors import UserError

    events = _record_exit(monkeypatch)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr("sys.argv", ["ictrl", "fake"])
    _fake_command(monkeypatch, UserError("data.train: 'x': file not found") if raise_ == "user" else raise_)
    with pytest.raises(_Exited):
        cli.entry()
    assert events == ["leave wait=False", "atexit", f"exit {code} group=False"]
    stderr = capsys.readouterr().err
    assert stderr.endswith(err)
    if isinstance(raise_, RuntimeError):  # the traceback, printed before the exit, as the interpreter prints it
        assert stderr.startswith("Traceback (most recent call last):")


def test_a_process_group_alone_makes_a_launched_rank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed as dist

    events = _record_exit(monkeypatch)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setattr("sys.argv", ["ictrl", "fake"])
    _fake_command(monkeypatch, None)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    with pytest.raises(_Exited):
        cli.entry()
    assert events == ["leave wait=False", "atexit", "exit 0 group=False"]  # left for real before the exit


def test_debug_and_verbose_flags_do_not_outlive_the_command(monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("ICTRL_DEBUG", raising=False)
    monkeypatch.setenv("ICTRL_VERBOSE", "0")
    assert cli.main(["--debug", "--verbose", "--help"]) == 0
    capsys.readouterr()
    assert "ICTRL_DEBUG" not in os.environ and os.environ["ICTRL_VERBOSE"] == "0"
