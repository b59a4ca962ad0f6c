"""The model card says how the model was made: the ``ictrl train`` command, or ``ICTGRPOTrainer`` from Python, and
points to config.yaml / run.json only when they are beside it."""

from __future__ import annotations

from pathlib import Path

import mp_worker as w
from ictrl.engine.model_card import model_card


def test_card_from_python_names_the_class_and_no_missing_files(tmp_path: Path) -> None:
    args = w.make_config(tmp_path / "out", token_selector="ict")
    card = model_card("Qwen/Qwen2.5-0.5B", tmp_path / "out", args, None, step=2)
    assert "trained from Python with `ictrl.ICTGRPOTrainer`" in card and "method ict" in card
    assert "ictrl train" not in card and "config.yaml" not in card and "run.json" not in card


def test_card_of_ictrl_train_points_to_the_files_beside_it(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    args = w.make_config(out, token_selector="all")
    assert "run.json" not in model_card("Qwen/Qwen2.5-0.5B", out, args, "ictrl train grpo.yaml")
    (out / "config.yaml").write_text("token_selector: all\n")
    (out / "run.json").write_text("{}")
    card = model_card("Qwen/Qwen2.5-0.5B", out, args, "ictrl train grpo.yaml")
    assert "trained by `ictrl train`" in card and "ictrl train grpo.yaml" in card
    assert "`config.yaml` and `run.json` beside this file" in card and "from Python" not in card


def test_the_command_line_on_the_card_redacts_secrets(tmp_path: Path) -> None:
    """The card is the file ``push_to_hub`` publishes: a token given on the command line is not on it."""
    args = w.make_config(tmp_path / "out", token_selector="ict")
    line = "ictrl train grpo.yaml --hub_token=hf_abc123 --hub-token hf_def456 --learning_rate=1e-6 --run_name 'a b'"
    card = model_card("Qwen/Qwen2.5-0.5B", tmp_path / "out", args, line)
    assert "hf_abc123" not in card and "hf_def456" not in card
    assert "ictrl train grpo.yaml --hub_token=<redacted> --hub-token <redacted> --learning_rate=1e-6 --run_name " \
           "'a b'" in card
