"""``ictrl train``'s ``output_dir``: one function checks it (``output_dir.checked_output_dir``), called once where
the command's checks run, and it hands the run the absolute path every later step writes to."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

TRAIN_CLI = Path(__file__).resolve().parents[2] / "src" / "ictrl" / "train_cli"
# what checks an output folder: the files' checks, and the command's own
OUTPUT_CHECKS = {"check_output_dir", "check_own_files", "foreign_checkpoints", "checked_output_dir"}


def _called(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            func = node.func
            names.append(func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", ""))
    return names


def test_no_other_module_of_the_command_checks_output_dir() -> None:
    """Outside ``output_dir.py`` the command calls no check of an output folder but ``checked_output_dir``, once."""
    calls = {path.name: [n for n in _called(path) if n in OUTPUT_CHECKS]
             for path in sorted(TRAIN_CLI.glob("*.py")) if path.name != "output_dir.py"}
    assert {name: found for name, found in calls.items() if found} == {"trainer_inputs.py": ["checked_output_dir"]}
    assert _called(TRAIN_CLI / "output_dir.py").count("check_output_dir") == 1  # the files' writable check


def test_output_dir_is_checked_once_and_made_absolute(tiny_model_dir: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from ictrl.train_cli import output_dir, trainer_inputs
    from ictrl.train_cli.run_config import load_config

    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"question": f"{i}+1?", "answer": str(i + 1)}) + "\n" for i in range(8)))
    run = {"model_name_or_path": str(tiny_model_dir), "dataset_name": f"jsonl:{data}", "num_generations": 4,
           "prompts_per_step": 2, "per_device_train_batch_size": 8, "max_completion_length": 8, "max_steps": 2,
           "save_steps": 1, "report_to": "none", "use_vllm": False, "output_dir": "runs/out"}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(run))
    calls: list[Any] = []

    def counted(*args: Any, **kwargs: Any) -> Path:
        calls.append(args)
        return output_dir.checked_output_dir(*args, **kwargs)

    monkeypatch.setattr(trainer_inputs, "checked_output_dir", counted)
    monkeypatch.chdir(tmp_path)
    built = trainer_inputs.build_trainer_inputs(load_config("run.yaml", []), "run.yaml")
    assert len(calls) == 1
    assert built.args.output_dir == str(tmp_path / "runs" / "out")  # absolute, before the lock is taken
    assert not (tmp_path / "runs").exists()  # checked, not made: the run makes it under its lock
