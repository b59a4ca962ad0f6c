"""``ictrl train``'s files stay where it locked them and hold no secret, its rotation deletes only checkpoints
ictrl wrote, and ``--resume`` notices a changed model or reward code. The checks run the command in-process up to
the model load (``loads``: a stand-in loader); one end-to-end run, then resumes up to the model load, is
integration."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ictrl import cli
from tests.train_cli.test_nothing_overwritten import Loaded, config, digest, loads, train  # noqa: F401 - a fixture


def test_output_dir_is_absolute_before_the_lock_and_trl(tiny_model_dir: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """A relative output_dir is resolved once, as the lock is taken: TRL's ``args.output_dir`` (every checkpoint,
    the model, its card) is that absolute folder whatever the working directory is later."""
    import ictrl.train_cli.run as run

    seen: dict[str, Any] = {}

    def locked(cfg: Any, checked: Any, *args: Any, **kwargs: Any) -> Any:
        seen["output_dir"] = checked.args.output_dir
        seen["lock"] = sorted(p.name for p in (tmp_path / "proj" / "runs" / "a").iterdir())
        raise Loaded

    monkeypatch.setattr(run, "_train_locked", locked)
    (tmp_path / "proj").mkdir()
    monkeypatch.chdir(tmp_path / "proj")
    assert train([str(config(tmp_path, tiny_model_dir)), "--output_dir=runs/a"], capsys) == (0, "")
    assert seen == {"output_dir": str(tmp_path / "proj" / "runs" / "a"), "lock": [".ictrl.lock"]}


@pytest.mark.parametrize("listed", [False, True])
def test_a_checkpoint_folder_ictrl_did_not_write_is_refused_before_the_model_loads(
        listed: bool, tiny_model_dir: Path, tmp_path: Path, loads: list[Any],
        capsys: pytest.CaptureFixture[str]) -> None:
    """A user's ``checkpoint-100`` (a folder of their own, an HF checkpoint) would be resumed from as the newest and
    deleted by rotation: one line, the folder as it was, with or without ictrl's list of its files there."""
    out = tmp_path / "out"
    (out / "checkpoint-100").mkdir(parents=True)
    (out / "checkpoint-100" / "trainer_state.json").write_text('{"global_step": 100}')
    (out / "checkpoint-100" / "notes.txt").write_text("mine")
    if listed:
        (out / ".ictrl-files.json").write_text(json.dumps({"files": ["run.json", "checkpoint-1"]}))
    before = digest(out)
    for flags in ([], ["--resume"], ["--resume=auto"], ["--overwrite"]):
        code, line = train([str(config(tmp_path, tiny_model_dir)), *flags], capsys)
        assert code == 2 and loads == [], line
        assert f"output_dir: {out / 'checkpoint-100'} was not written by ictrl (not in its .ictrl-files.json): a " \
               "run would resume from it or delete it in rotation (save_total_limit)" in line, line
        assert digest(out) == before


# --- one run end to end ------------------------------------------------------------------------------------------

TOKEN = "hf_c1SecretTokenNeverOnDisk42"
REWARD = '''
import os
from sandbox_helper import GRADE


def chdir_score(prompts=None, completions=None, **kw):
    os.chdir(os.environ["SANDBOX_DIR"])  # as a code-execution sandbox does
    return [GRADE] * len(completions)
'''


def _run(tmp_path: Path, cfg: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "SANDBOX_DIR": str(tmp_path / "sandbox"),
           "PYTHONPATH": os.pathsep.join([str(tmp_path / "code"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "ictrl.cli", "train", str(cfg), *flags], env=env,
                          cwd=tmp_path / "proj", capture_output=True, text=True, timeout=600)


def _perturbed(model: Path) -> None:
    """The model's weights changed in place, every tensor keeping its shape: the file's size and header stay."""
    from safetensors.torch import load_file, save_file

    weights = load_file(model / "model.safetensors")
    save_file({name: tensor + 1e-3 for name, tensor in weights.items()}, model / "model.safetensors",
              metadata={"format": "pt"})


@pytest.mark.integration
def test_a_sandboxed_reward_moves_nothing_no_token_is_written_and_resume_sees_changed_inputs(
        tiny_model_dir: Path, tmp_path: Path, loads: list[Any], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    for folder in ("proj", "sandbox", "code"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "README.md").write_text(f"# a user's {folder}\n")
    (tmp_path / "code" / "sandbox_reward.py").write_text(REWARD)
    (tmp_path / "code" / "sandbox_helper.py").write_text("GRADE = 1.0\n")
    cfg = config(tmp_path, model, output_dir="runs/a", max_steps=3, save_total_limit=1,
                 lr_scheduler_type="constant", reward_funcs=["sandbox_reward:chdir_score"])
    theirs = {folder: digest(tmp_path / folder) for folder in ("proj", "sandbox")}
    done = _run(tmp_path, cfg, f"--hub_token={TOKEN}")
    assert done.returncode == 0, done.stderr[-3000:]
    moved = [line for line in done.stderr.splitlines() if "changed the working directory" in line]
    assert len(moved) == 1 and "reward 'chdir_score'" in moved[0], done.stderr[-3000:]
    out = tmp_path / "proj" / "runs" / "a"
    # nothing written in the folder the reward moved to, nothing of the project's replaced
    assert digest(tmp_path / "sandbox") == theirs["sandbox"]
    assert {k: v for k, v in digest(tmp_path / "proj").items() if not k.startswith("runs/")} == theirs["proj"]
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-3"]  # rotated, in the locked folder
    assert {"checkpoint-3", "README.md", "model.safetensors"} <= set(json.loads(
        (out / ".ictrl-files.json").read_text())["files"])
    card = (out / "README.md").read_text()
    assert "--hub_token=<redacted>" in card
    written = [p for p in out.rglob("*") if p.is_file()]
    assert {"config.yaml", "run.json", "training_args.bin"} <= {p.name for p in written}
    assert [p for p in written if TOKEN.encode() in p.read_bytes()] == []

    # --resume, up to the model load, after the base model's weights or a module the reward imports changed
    monkeypatch.chdir(tmp_path / "proj")
    monkeypatch.syspath_prepend(str(tmp_path / "code"))
    monkeypatch.setenv("SANDBOX_DIR", str(tmp_path / "sandbox"))
    _perturbed(model)
    again = [str(cfg), "--resume", "--max_steps=4"]
    code, line = train(again, capsys)
    assert code == 2 and loads == [] and "--resume: the model of model_name_or_path (its files: the base and " \
        "reference model) changed since the run started" in line, line
    code, line = train([*again, "--resume-inexact"], capsys)
    assert code == 0 and len(loads) == 1, line
    shutil.copy(tiny_model_dir / "model.safetensors", model / "model.safetensors")
    (tmp_path / "code" / "sandbox_helper.py").write_text("GRADE = 0.5\n")
    code, line = train(again, capsys)
    assert code == 2 and "the source of module sandbox_helper (imported by reward chdir_score) changed" in line, line
    (tmp_path / "code" / "sandbox_helper.py").write_text("GRADE = 1.0\n")
    assert train(again, capsys) == (0, "")
    for name in ("sandbox_reward", "sandbox_helper"):
        monkeypatch.delitem(sys.modules, name, raising=False)


# --- no secret in a printed command line ------------------------------------------------------------------------

def test_the_commands_a_run_prints_and_records_hide_the_token(tiny_model_dir: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """The resume line a stop prints and the line the model card records are built from the command as typed:
    a ``--hub_token`` (either spelling) is ``<redacted>`` in both; ``--print-config`` leaves it out, as config.yaml
    does."""
    import ictrl.train_cli.run as run

    seen: dict[str, Any] = {}

    def stand_in(cfg: Any, **kwargs: Any) -> Any:
        seen.update(kwargs)
        raise Loaded

    monkeypatch.setattr(run, "train", stand_in)
    cfg = str(config(tmp_path, tiny_model_dir))
    assert train([cfg, f"--hub_token={TOKEN}", "--hub-token", TOKEN], capsys) == (0, "")
    for line in (seen["resume_command"], seen["command"]):
        assert TOKEN not in line and line.count("<redacted>") == 2, line
    assert seen["resume_command"].endswith(" --resume")
    assert cli.main(["train", cfg, f"--hub_token={TOKEN}", "--print-config"]) == 0
    printed = capsys.readouterr().out
    assert "learning_rate:" in printed and TOKEN not in printed, printed


FAILING_REWARD = '''
def fails_at_step_2(completions=None, trainer_state=None, **kw):
    if trainer_state.global_step >= 1:
        raise RuntimeError("grader down")
    return [float(len(str(c)) % 3) for c in completions]
'''


@pytest.mark.integration
def test_a_run_stopped_by_a_failing_reward_prints_no_token(tiny_model_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "proj").mkdir()
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "failing_reward.py").write_text(FAILING_REWARD)
    cfg = config(tmp_path, tiny_model_dir, max_steps=3, reward_funcs=["failing_reward:fails_at_step_2"])
    done = _run(tmp_path, cfg, f"--hub_token={TOKEN}")
    last = done.stderr.strip().split("\n")[-1]
    assert done.returncode != 0 and "grader down" in last and "resume with `ictrl train" in last, done.stderr[-3000:]
    assert "--hub_token=<redacted>" in last, last
    assert TOKEN not in done.stderr + done.stdout


# --- one line for a stretch without learning signal --------------------------------------------------------------

def test_a_run_without_learning_signal_says_so_once_per_stretch_as_from_python(
        tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A constant reward under ``token_selector: all`` (TRL's GRPO: it trains on) for 21 steps: ``ictrl train``
    says "no learning signal" in the one line the trainer gives each stretch of 20 such steps, as from Python."""
    from ictrl.engine.reward_policy import NO_SIGNAL_STEPS

    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "flat_reward.py").write_text(
        "def flat(completions=None, **kw):\n    return [1.0] * len(completions)\n")
    monkeypatch.syspath_prepend(str(tmp_path / "code"))
    cfg = config(tmp_path, tiny_model_dir, token_selector="all", max_steps=NO_SIGNAL_STEPS + 1, save_strategy="no",
                 max_completion_length=2, num_iterations=1, reward_funcs=["flat_reward:flat"])
    try:
        assert cli.main(["train", str(cfg)]) == 0
    finally:
        monkeypatch.delitem(sys.modules, "flat_reward", raising=False)
    said = [line for line in capsys.readouterr().err.splitlines() if "no learning signal" in line]
    assert len(said) == 1 and f"every advantage was 0 for {NO_SIGNAL_STEPS} optimizer steps in a row" in said[0], said
