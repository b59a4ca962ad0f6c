"""Every user mistake is one line on stderr and exit status 2, before a model loads.

The commands run in-process through ``ictrl.cli.main``; loading a model is patched to fail the test, so a check
that came too late shows up as that failure rather than as a slow pass.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ictrl import hub, option_checks
from ictrl.engine import config_fields
from ictrl.cli import main
from ictrl.errors import MissingExtraError, ModelNotFoundError, UserError, one_line


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No hub: offline mode on and an empty hub cache."""
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))


@pytest.fixture
def no_model_load(monkeypatch: pytest.MonkeyPatch) -> None:
    import ictrl.eval.generate as generate
    import ictrl.models as models

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a model started to load before the mistake was reported")

    monkeypatch.setattr(models, "load_model_and_tokenizer", refuse)
    monkeypatch.setattr(generate, "build_backend", refuse)


def one_error_line(capsys: pytest.CaptureFixture[str], command: str) -> str:
    """The error line; besides it stderr may hold only log lines (``WARNING name: ...``), never a traceback."""
    err = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in err if not line.startswith(("WARNING ", "INFO "))]
    assert len(errors) == 1 and "Traceback" not in "\n".join(err), err
    assert errors[0].startswith(f"ictrl {command}: error: "), errors[0]
    return errors[0]


def test_eval_missing_local_model_path(capsys: pytest.CaptureFixture[str], no_model_load: None, tmp_path: Path) -> None:
    missing = tmp_path / "runs" / "nope" / "final"
    assert main(["eval", "--model", str(missing), "--benchmarks", "gsm8k"]) == 2
    assert one_error_line(capsys, "eval") == f"ictrl eval: error: --model: {missing}: no such directory"


def test_eval_hub_id_offline_without_a_cached_copy(
    capsys: pytest.CaptureFixture[str], offline: None, no_model_load: None, shared_data: Path
) -> None:
    assert main(["eval", "--model", "Qwen/Qwen2.5-0.5B", "--benchmarks", "gsm8k"]) == 2
    line = one_error_line(capsys, "eval")
    assert line.endswith("--model: Qwen/Qwen2.5-0.5B: no local directory or hub-cache copy, and HF_HUB_OFFLINE is set")


def test_hub_id_in_the_cache_passes_offline(monkeypatch: pytest.MonkeyPatch, offline: None, tmp_path: Path) -> None:
    from huggingface_hub import constants

    (Path(constants.HF_HUB_CACHE) / "models--Qwen--Qwen2.5-0.5B" / "snapshots" / "abc").mkdir(parents=True)
    hub.check_model("Qwen/Qwen2.5-0.5B")
    with pytest.raises(ModelNotFoundError, match="unreachable"):
        monkeypatch.delenv("HF_HUB_OFFLINE")
        monkeypatch.setattr(hub, "hub_reachable", lambda timeout=3.0: False)
        hub.check_model("Qwen/Qwen2.5-1.5B")


def test_a_directory_that_is_not_a_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match=r"has no config.json, so it is not a model checkpoint"):
        hub.check_model(str(tmp_path))
    (tmp_path / "w.bin").write_bytes(b"")
    with pytest.raises(ModelNotFoundError, match=r"is a file, not a model directory"):
        hub.check_model(str(tmp_path / "w.bin"))


def test_eval_unknown_benchmark_suggests_the_closest(
    capsys: pytest.CaptureFixture[str], no_model_load: None, tiny_model_dir: Path
) -> None:
    assert main(["eval", "--model", str(tiny_model_dir), "--benchmarks", "gsmk8"]) == 2
    line = one_error_line(capsys, "eval")
    assert "--benchmarks: unknown benchmark 'gsmk8'; did you mean 'gsm8k'?" in line


@pytest.mark.parametrize("name", ["amc23", "minerva_math", "olympiadbench", "gpqa_diamond"])
def test_eval_benchmark_without_local_copy_offline(
    name: str, capsys: pytest.CaptureFixture[str], offline: None, no_model_load: None, tiny_model_dir: Path
) -> None:
    assert main(["eval", "--model", str(tiny_model_dir), "--benchmarks", "gsm8k", name]) == 2
    line = one_error_line(capsys, "eval")
    assert f"--benchmarks: {name}: no local copy" in line and "HF_HUB_OFFLINE is set" in line


def test_eval_missing_jsonl_file(capsys: pytest.CaptureFixture[str], no_model_load: None, tiny_model_dir: Path,
                                 tmp_path: Path) -> None:
    missing = tmp_path / "mine.jsonl"
    assert main(["eval", "--model", str(tiny_model_dir), "--benchmarks", f"jsonl:{missing}"]) == 2
    assert one_error_line(capsys, "eval").endswith(f"--benchmarks: 'jsonl:{missing}': {missing}: no such file")


def test_eval_missing_data_root(capsys: pytest.CaptureFixture[str], no_model_load: None, tmp_path: Path) -> None:
    assert main(["eval", "--model", "m", "--data-root", str(tmp_path / "nodata")]) == 2
    assert one_error_line(capsys, "eval").endswith(f"--data-root: {tmp_path / 'nodata'}: no such directory")


def test_inspect_missing_model_and_rollouts(capsys: pytest.CaptureFixture[str], no_model_load: None,
                                            tmp_path: Path) -> None:
    assert main(["inspect", "--model", "./checkpoints/final", "--prompt", "Q:1+2=A:"]) == 2
    assert one_error_line(capsys, "inspect") == "ictrl inspect: error: --model: ./checkpoints/final: no such directory"
    assert main(["inspect", "--rollouts", str(tmp_path / "r.jsonl")]) == 2
    assert one_error_line(capsys, "inspect").endswith(f"--rollouts: {tmp_path / 'r.jsonl'}: no such file")


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="no such directory"):
        main(["eval", "--debug", "--model", str(tmp_path / "nope")])


def test_one_line_folds_newlines() -> None:
    assert one_line("a\n\n  b \nc") == "a; b; c"
    assert one_line(UserError("")) == "UserError"


def test_trackers_list_comma_string_and_missing_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    assert config_fields.report_to_list("tensorboard, wandb") == ["tensorboard", "wandb"]
    assert config_fields.report_to_list(["tensorboard"]) == ["tensorboard"]
    assert config_fields.report_to_list("none") == [] and config_fields.report_to_list(None) == []
    assert config_fields.check_trackers("tensorboard") == ["tensorboard"]  # installed in dev
    monkeypatch.setitem(config_fields.TRACKERS, "tensorboard", ("ictrl_no_such_package", "pip install 'ictrl[tensorboard]'"))
    with pytest.raises(MissingExtraError, match=r"logging.report_to: tensorboard needs the 'ictrl_no_such_package' "
                                                r"package, which is not installed: pip install 'ictrl\[tensorboard\]'"):
        config_fields.check_trackers("none,tensorboard", "logging.report_to")
    with pytest.raises(UserError, match=r"unknown tracker 'tensorbord'; did you mean 'tensorboard'\?"):
        config_fields.check_trackers(["tensorbord"])


def test_check_file_and_data_errors_are_user_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"--x: .*: not a file"):
        option_checks.check_file(tmp_path, "--x")
    bad = tmp_path / "rows.jsonl"
    bad.write_text(json.dumps({"problem": "a"}) + "\n")
    from ictrl.data import load_problems

    with pytest.raises(UserError, match=r"rows\.jsonl: line 1: field 'answer' missing"):
        load_problems("math500", path=bad)


def test_eval_model_that_fails_to_load_is_one_line(monkeypatch: pytest.MonkeyPatch, tiny_model_dir: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    import ictrl.eval.generate as generate

    def gated(*args: object, **kwargs: object) -> None:
        raise OSError("You are trying to access a gated repo.\nMake sure to have access to it at https://...")

    monkeypatch.setattr(generate, "build_backend", gated)
    assert main(["eval", "--model", str(tiny_model_dir), "--benchmarks", "gsm8k"]) == 2
    assert one_error_line(capsys, "eval").endswith("cannot load: You are trying to access a gated repo.")
def train_config(tmp_path: Path, model: str, rows: bytes | None) -> Path:
    data = tmp_path / "train.jsonl"
    if rows is not None:
        data.write_bytes(rows)
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"model_name_or_path: {model}\ndataset_name: 'jsonl:{data}'\n"
                   f"output_dir: {tmp_path / 'out'}\n")
    return cfg


GOOD_ROW = json.dumps({"problem": "1+1?", "answer": "2"}).encode() + b"\n"


@pytest.mark.parametrize("rows, expected", [
    (GOOD_ROW + json.dumps({"problem": "2+2?"}).encode() + b"\n", r"train\.jsonl: line 2: field 'answer' missing"),
    (GOOD_ROW + b'{"problem": "caf\xe9", "answer": "1"}\n', r"train\.jsonl: line 2: byte 0xe9 at column 17 is not UTF-8"),
    (b"", r"train\.jsonl: no rows \(the file is empty\)"),
    (GOOD_ROW + b'{"problem": "x", "answer": \n', r"train\.jsonl: line 2, column \d+: invalid JSON"),
])
def test_train_bad_data_is_one_line_before_the_model(rows: bytes, expected: str, tmp_path: Path, tiny_model_dir: Path,
                                                     no_model_load: None, capsys: pytest.CaptureFixture[str]) -> None:
    import re

    assert main(["train", str(train_config(tmp_path, str(tiny_model_dir), rows))]) == 2
    line = one_error_line(capsys, "train")
    assert re.search(expected, line), line


def test_train_missing_model_path_and_offline_hub_id(tmp_path: Path, offline: None, no_model_load: None,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "ckpt" / "final"
    assert main(["train", str(train_config(tmp_path, str(missing), GOOD_ROW))]) == 2
    assert one_error_line(capsys, "train").endswith(f"model_name_or_path: {missing}: no such directory")
    assert main(["train", str(train_config(tmp_path, "Qwen/Qwen2.5-0.5B", GOOD_ROW))]) == 2
    assert one_error_line(capsys, "train").endswith("no local directory or hub-cache copy, and HF_HUB_OFFLINE is set")


def test_long_prompts_are_named(tiny_model_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    import datasets

    from ictrl.train_cli.run_inputs import check_enough_rows, drop_long_prompts
    from ictrl.errors import DataError
    from ictrl.models import build_byte_tokenizer

    tok = build_byte_tokenizer()
    ds = datasets.Dataset.from_dict({"prompt": ["short", "x" * 300, "y" * 20], "id": ["a", "b", "c"]})
    kept = drop_long_prompts(ds, tok, limit=50)
    assert kept["id"] == ["a", "c"]
    assert "max_prompt_length=50: dropping 1 of 3 prompts longer than that: row 1 (id b, 300 tokens)" in caplog.text
    with pytest.raises(DataError, match=r"row 1 \(id b, 300 tokens\): longer than the 200 tokens the model's 264 "
                                        r"positions leave beside max_completion_length 64"):
        drop_long_prompts(ds, tok, limit=None, max_positions=264, completion_length=64)
    args = type("Args", (), {"generation_batch_size": 16, "num_generations": 4})()
    with pytest.raises(DataError, match=r"2 prompts, fewer than the 4 of one generation batch"):
        check_enough_rows(kept, args)
