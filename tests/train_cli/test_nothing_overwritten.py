"""``ictrl train`` as a user runs it, for what a run must never do silently: replace a file it reads or an earlier
run's results, train nothing, end early without a word, or fail with a traceback. Each case runs the command
in-process up to the model load (a stand-in loader marks that every check passed); the end-to-end runs are
integration tests."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from ictrl import cli


class Loaded(Exception):
    """Raised by the stand-in loader: every check before the model load passed."""


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    import ictrl.models

    calls: list[Any] = []

    def loader(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        raise Loaded

    monkeypatch.setattr(ictrl.models, "load_model_and_tokenizer", loader)
    return calls


ROWS = [{"question": f"What is {i}+1?", "answer": str(i + 1)} for i in range(8)]


def write_rows(path: Path, rows: list[dict[str, Any]] = ROWS) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def config(tmp_path: Path, model: Path, **keys: Any) -> Path:
    """A 2-step run of the tiny model on 8 local rows, ``keys`` over it."""
    data = tmp_path / "data" / "train.jsonl"
    if not data.exists():
        write_rows(data)
    cfg = {"model_name_or_path": str(model), "dataset_name": f"jsonl:{data}", "max_prompt_length": None,
           "token_selector": "ict", "selection_warmup_steps": 0, "prompts_per_step": 2, "num_generations": 4,
           "per_device_train_batch_size": 8, "max_completion_length": 8, "use_vllm": False, "cpu_threads": 1,
           "learning_rate": 1e-3, "max_steps": 2, "save_steps": 1, "report_to": "none", "disable_tqdm": True,
           "output_dir": str(tmp_path / "out"), **keys}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def train(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """``ictrl train ARGV``'s status and its error line ("" when it reached the model load or finished)."""
    try:
        code = cli.main(["train", *argv])
    except Loaded:
        code = 0
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    errors = [line for line in err.split("\n") if line.startswith("ictrl train: error:")]
    assert len(errors) == (code != 0), err
    return code, errors[0] if errors else ""


def digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != ".ictrl.lock"}


# --- output_dir aliasing what the run reads -------------------------------------------------------------------


def test_output_dir_equal_to_the_model_dir_is_refused(tiny_model_dir: Path, tmp_path: Path, loads: list[Any],
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    before = digest(tiny_model_dir)
    code, line = train([str(config(tmp_path, tiny_model_dir)), f"--output_dir={tiny_model_dir}"], capsys)
    assert code == 2 and loads == []
    assert f"override --output_dir={tiny_model_dir}: output_dir: {tiny_model_dir} is the model directory" in line
    assert digest(tiny_model_dir) == before
    code, line = train([str(config(tmp_path, tiny_model_dir)), f"--output_dir={tiny_model_dir}/./"], capsys)
    assert code == 2 and "is the model directory" in line  # the same folder written another way


def test_a_folder_inside_the_model_dir_is_allowed(tiny_model_dir: Path, tmp_path: Path, loads: list[Any],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tiny_model_dir / "runs" / "ict"
    assert train([str(config(tmp_path, tiny_model_dir)), f"--output_dir={out}"], capsys) == (0, "")
    assert len(loads) == 1


@pytest.mark.parametrize("where, what", [
    ("metrics.jsonl", "the data file of dataset_name"),
    ("checkpoint-1/train.jsonl", "the data file of dataset_name"),  # rotated away by save_total_limit
    ("config.yaml", "the config file"),
    ("checkpoint-2/my_reward.py", "the module of reward 'score'"),
])
def test_an_output_dir_that_would_replace_an_input_is_refused(where: str, what: str, tiny_model_dir: Path,
                                                              tmp_path: Path, loads: list[Any],
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    target = out / where
    keys: dict[str, Any] = {}
    if what.startswith("the data file"):
        keys["dataset_name"] = f"jsonl:{write_rows(target)}"
    elif what.startswith("the module"):
        target.parent.mkdir(parents=True)
        target.write_text("def score(prompts=None, completions=None, **kw):\n    return [0.0] * len(completions)\n")
        monkeypatch.syspath_prepend(str(target.parent))
        keys["reward_funcs"] = ["my_reward:score"]
    path = config(tmp_path, tiny_model_dir, **keys)
    if what == "the config file":
        target.parent.mkdir(parents=True)
        target.write_text(path.read_text())
        path = target
    before = target.read_bytes()
    code, line = train([str(path)], capsys)
    assert code == 2 and loads == [], line
    assert f"output_dir: {out}: the run writes {target}, which is {what}" in line, line
    assert target.read_bytes() == before
    # a data file beside the run's own files is not one of them
    assert train([str(config(tmp_path, tiny_model_dir, dataset_name=f"jsonl:{write_rows(out / 'rows.jsonl')}"))],
                 capsys)[0] in (0, 2)


# --- an earlier run in output_dir -----------------------------------------------------------------------------


# the run.json of an `ictrl train` run written before ictrl listed the files it writes
RUN_RECORD = '{"method": "ict", "method_from": "file", "seed": 0}\n'


def finished_run(out: Path, record_only: bool = False) -> dict[str, str]:
    """The files a finished run leaves with ``save_strategy: no`` (or its checkpoints deleted)."""
    out.mkdir(parents=True)
    (out / "run.json").write_text(RUN_RECORD)
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    if not record_only:
        for name in ("model.safetensors", "config.json", "manifest.json", "trainer_state.json"):
            (out / name).write_text(name)
    return digest(out)


def test_a_finished_run_without_checkpoints_is_not_replaced(tiny_model_dir: Path, tmp_path: Path,
                                                            loads: list[Any],
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    before = finished_run(out)
    cfg = str(config(tmp_path, tiny_model_dir))
    for flags in ([], ["--resume=auto"]):
        code, line = train([cfg, *flags], capsys)
        assert code == 2 and loads == [], line
        assert f"output_dir: {out} holds an earlier run (" in line and "pass --overwrite to replace it" in line
        assert digest(out) == before
    code, line = train([cfg, "--resume"], capsys)
    assert code == 2 and "holds no checkpoint" in line
    assert train([cfg, "--overwrite"], capsys) == (0, "")
    assert len(loads) == 1
    # the earlier model no longer marks the folder finished: a later --resume cannot take it for this run's
    assert not (out / "manifest.json").exists() and not (out / "trainer_state.json").exists()


def test_the_record_of_a_run_that_died_early_refuses_a_fresh_run_but_not_a_requeue(
        tiny_model_dir: Path, tmp_path: Path, loads: list[Any], capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    finished_run(out, record_only=True)
    cfg = str(config(tmp_path, tiny_model_dir))
    code, line = train([cfg], capsys)
    assert code == 2 and "holds an earlier run (metrics.jsonl, run.json)" in line
    assert train([cfg, "--resume=auto"], capsys) == (0, "")  # a requeued job script starts again from step 0


def test_the_runs_own_config_resumes(tiny_model_dir: Path, tmp_path: Path, loads: list[Any],
                                     capsys: pytest.CaptureFixture[str]) -> None:
    """``ictrl train OUT/config.yaml --resume``: the config the run wrote, written back as read."""
    out = tmp_path / "out"
    (out / "checkpoint-1").mkdir(parents=True)
    (out / "checkpoint-1" / "trainer_state.json").write_text('{"global_step": 1}')
    (out / "run.json").write_text(RUN_RECORD)
    own = out / "config.yaml"
    own.write_text(config(tmp_path, tiny_model_dir).read_text())
    code, line = train([str(own), "--resume"], capsys)
    assert "which is the config file" not in line


# --- files in output_dir that ictrl did not write -----------------------------------------------------------------


def project(folder: Path, tiny_model_dir: Path) -> Path:
    """A project folder: a git repository with its own README.md and config.yaml, and the run's train.yaml."""
    folder.mkdir()
    subprocess.run(["git", "init", "-q", str(folder)], check=True)
    (folder / "README.md").write_text("# my project\n")
    (folder / "config.yaml").write_text("project: mine\nlr: 3\n")
    (folder / "train.yaml").write_text(config(folder, tiny_model_dir).read_text())
    return folder / "train.yaml"


def test_output_dir_dot_in_a_project_folder_replaces_nothing(tiny_model_dir: Path, tmp_path: Path,
                                                             loads: list[Any], monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    cfg = project(tmp_path / "proj", tiny_model_dir)
    monkeypatch.chdir(cfg.parent)
    before = digest(cfg.parent)
    for flags in ([], ["--overwrite"], ["--resume=auto"]):
        code, line = train(["train.yaml", "--output-dir", ".", *flags], capsys)
        assert code == 2 and loads == [], line
        assert "output_dir: README.md (and config.yaml) was not written by ictrl and the command would replace " \
               "it; choose another output directory or move the file away (--overwrite replaces only files ictrl " \
               "wrote)" in line, line
        assert digest(cfg.parent) == before
    assert train(["train.yaml", "--output-dir", "runs/a"], capsys) == (0, "")  # a folder inside it is fine


@pytest.mark.parametrize("name", ["README.md", "config.yaml", "run.json", "metrics.jsonl", "config.json",
                                  "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                                  "generation_config.json", "chat_template.jinja", "adapter_config.json",
                                  "adapter", "trainer_state.json", "manifest.json"])
def test_a_foreign_file_under_a_name_the_run_writes_is_refused(name: str, tiny_model_dir: Path, tmp_path: Path,
                                                               loads: list[Any],
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    if name == "adapter":
        (out / name).mkdir()
        (out / name / "weights.bin").write_text("mine")
    else:
        (out / name).write_text("mine")
    before = digest(out)
    for flags in ([], ["--overwrite"]):
        code, line = train([str(config(tmp_path, tiny_model_dir)), *flags], capsys)
        assert code == 2 and loads == [], line
        assert f"output_dir: {out / name} was not written by ictrl" in line, line
        assert digest(out) == before


def test_files_ictrl_listed_are_its_own_and_overwrite_replaces_them(tiny_model_dir: Path, tmp_path: Path,
                                                                    loads: list[Any],
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    finished_run(out)
    (out / "run.json").write_text("{}")  # no record of its own: the list alone says whose the files are
    (out / "README.md").write_text("the model card")
    names = ["README.md", "run.json", "metrics.jsonl", "model.safetensors", "config.json", "manifest.json",
             "trainer_state.json"]
    (out / ".ictrl-files.json").write_text(json.dumps({"files": names}))
    cfg = str(config(tmp_path, tiny_model_dir))
    code, line = train([cfg], capsys)
    assert code == 2 and "holds an earlier run" in line, line
    (out / "tokenizer.json").write_text("a user's")
    code, line = train([cfg, "--overwrite"], capsys)
    assert code == 2 and f"{out / 'tokenizer.json'} was not written by ictrl" in line, line
    (out / "tokenizer.json").unlink()
    assert train([cfg, "--overwrite"], capsys) == (0, "")
    (out / ".ictrl-files.json").write_text('{"files": ["README.md", ')  # torn
    code, line = train([cfg, "--overwrite"], capsys)
    assert code == 2 and f"{out / '.ictrl-files.json'}: cannot read ictrl's list of the files it wrote" in line


# --- training nothing ------------------------------------------------------------------------------------------


def test_learning_rate_0_is_refused_unless_named(tiny_model_dir: Path, tmp_path: Path, loads: list[Any],
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    cfg = str(config(tmp_path, tiny_model_dir))
    code, line = train([cfg, "--learning_rate=0"], capsys)
    assert code == 2 and loads == []
    assert line.startswith("ictrl train: error: override --learning_rate=0.0: learning_rate: 0 trains nothing")
    assert "--allow-no-op" in line
    code, line = train([cfg, "--learning_rate=0", "--print-config"], capsys)
    assert code == 2 and "0 trains nothing" in line
    assert train([cfg, "--learning_rate=0", "--allow-no-op"], capsys) == (0, "")


# --- user modules ----------------------------------------------------------------------------------------------

MODULES = {
    "zero_division": ("x = 1\ny = x / 0\ndef f(**kw):\n    return []\n", "ZeroDivisionError: division by zero", 2),
    "syntax": ("def f(**kw):\n    return [\n", "SyntaxError: ", 2),
    "exits": ("import sys\nsys.exit(3)\n", "SystemExit: 3", 2),
    "not_callable": ("f = 3\n", "is int 3, not a function", None),
}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_a_reward_module_that_fails_is_one_line(name: str, tiny_model_dir: Path, tmp_path: Path, loads: list[Any],
                                                monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    text, says, line_no = MODULES[name]
    module = f"user_reward_{name}"
    (tmp_path / f"{module}.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    code, line = train([str(config(tmp_path, tiny_model_dir)), f"--reward_funcs={module}:f"], capsys)
    assert code == 2 and loads == [], line
    assert f"reward_funcs[0]: " in line and f"{module}:f" in line and says in line, line
    if line_no is not None:
        assert f"{tmp_path / module}.py, line {line_no}" in line, line


@pytest.mark.parametrize("name", ["zero_division", "syntax", "exits"])
def test_a_selector_module_that_fails_is_one_line(name: str, tiny_model_dir: Path, tmp_path: Path,
                                                  loads: list[Any], monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    text, says, line_no = MODULES[name]
    module = f"user_selector_{name}"
    (tmp_path / f"{module}.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    code, line = train([str(config(tmp_path, tiny_model_dir)), f"--token_selector={module}:f"], capsys)
    assert code == 2 and loads == [], line
    assert f"token_selector: selector '{module}:f': cannot import it: {says}" in line, line
    assert f"{tmp_path / module}.py, line {line_no}" in line, line


# --- rows ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("row, says", [
    ('{"question": "q", "answer": NaN}', "field 'answer': nan is not a gold answer"),
    ('{"question": "q", "answer": -Infinity}', "field 'answer': -inf is not a gold answer"),
    ('{"question": "q", "answer": " $ "}', "field 'answer': the gold answer is empty once normalised"),
    ('{"question": "q\\ud800", "answer": "1"}', "field 'question': a lone surrogate '\\ud800' at character 1"),
])
def test_a_row_no_completion_could_match_is_refused_naming_it(row: str, says: str, tiny_model_dir: Path,
                                                              tmp_path: Path, loads: list[Any],
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    data = write_rows(tmp_path / "rows.jsonl")
    data.write_text(data.read_text() + row + "\n")
    code, line = train([str(config(tmp_path, tiny_model_dir, dataset_name=f"jsonl:{data}"))], capsys)
    assert code == 2 and loads == [], line
    assert f"{data}: line 9: {says}" in line, line


def test_same_named_files_of_a_mixture_keep_their_own_template_and_kind(tiny_model_dir: Path, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The dataset ``ictrl train`` hands the trainer, from a mixture of a/train.jsonl and b/train.jsonl."""
    from ictrl.train_cli.trainer_inputs import build_trainer_inputs, check_inputs
    from ictrl.train_cli.run_config import load_config

    write_rows(tmp_path / "a" / "train.jsonl", [{"question": "Q:1+1=A:", "answer": "2"}] * 2)
    write_rows(tmp_path / "b" / "train.jsonl", [{"question": "Q:2+2=A:", "answer": "#### 4"}] * 2)
    mixture = {f"jsonl:{tmp_path}/a/train.jsonl:prompt_template=A {{question}}": 1,
               f"jsonl:{tmp_path}/b/train.jsonl:kind=gsm8k:prompt_template=B {{question}}": 1}
    cfg = load_config(str(config(tmp_path, tiny_model_dir, dataset_name=mixture)), [])
    dataset = check_inputs(cfg, build_trainer_inputs(cfg).init_kwargs)
    seen = {(r["prompt"][0]["content"], r["kind"], r["answer"]) for r in dataset}
    assert seen == {("A Q:1+1=A:", "math", "2"), ("B Q:2+2=A:", "gsm8k", "4")}


def test_a_path_with_an_equals_sign_is_written_as_path(tiny_model_dir: Path, tmp_path: Path, loads: list[Any],
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    data = write_rows(tmp_path / "run=3" / "train.jsonl")
    cfg = str(config(tmp_path, tiny_model_dir))
    code, line = train([cfg, f"--dataset_name=jsonl:{data}"], capsys)
    assert code == 2 and "'jsonl:' needs a path (one with '=' in it is written jsonl:path=PATH)" in line
    assert train([cfg, f"--dataset_name=jsonl:path={data}:kind=gsm8k"], capsys) == (0, "")


def test_a_config_path_that_is_a_directory_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, line = train([str(tmp_path)], capsys)
    assert code == 2 and line.endswith(f"{tmp_path}: a directory, not a config file")


# --- end to end ------------------------------------------------------------------------------------------------

RUN_MODULE = '''
import sys
def exits_at_step_1(prompts=None, completions=None, trainer_state=None, **kw):
    if trainer_state.global_step >= 1:
        sys.exit(0)
    return [0.0] * len(completions)
def quits(inputs, *, ratio=0.1):
    sys.exit(0)
'''


def run_cli(tmp_path: Path, cfg: Path, *flags: str) -> tuple[int, list[str], str]:
    (tmp_path / "ictrl_user_fns.py").write_text(RUN_MODULE)
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "ictrl.cli", "train", str(cfg), *flags], env=env,
                          capture_output=True, text=True, timeout=600)
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    return done.returncode, [line for line in done.stderr.split("\n") if line.startswith("ictrl train:")], done.stderr


@pytest.mark.integration
def test_sys_exit_in_a_reward_or_a_selector_ends_the_run_with_one_line(tiny_model_dir: Path,
                                                                       tmp_path: Path) -> None:
    cfg = config(tmp_path, tiny_model_dir, max_steps=4)
    code, lines, _ = run_cli(tmp_path, cfg, "--reward_funcs=ictrl_user_fns:exits_at_step_1")
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("ictrl train: error: reward 'exits_at_step_1' raised SystemExit: '0' at step 1")
    assert "last complete checkpoint" in lines[0] and lines[0].endswith("--resume`")
    code, lines, _ = run_cli(tmp_path, cfg, "--token_selector=ictrl_user_fns:quits", f"--output_dir={tmp_path}/q")
    rule = tmp_path / "ictrl_user_fns.py"  # the rule named by its file and function, and the line that exited
    assert code == 2 and lines == [f"ictrl train: error: selector {rule}:quits raised SystemExit: 0 ({rule}, line 8) "
                                   "at step 0; stopped at step 0; no checkpoint yet (save_steps)"], lines


@pytest.mark.integration
def test_divergence_is_one_line_naming_the_step_and_the_learning_rate(tiny_model_dir: Path, tmp_path: Path) -> None:
    code, lines, _ = run_cli(tmp_path, config(tmp_path, tiny_model_dir, max_steps=4), "--learning_rate=1e300")
    assert code == 2 and len(lines) == 1, lines
    assert "training diverged: loss/log-probs not finite at step " in lines[0], lines
    assert "lower learning_rate (now 1e+300)" in lines[0] and "a resume keeps learning_rate" in lines[0], lines


@pytest.mark.integration
def test_a_rerun_into_a_finished_run_without_checkpoints_changes_nothing(tiny_model_dir: Path,
                                                                          tmp_path: Path) -> None:
    cfg = config(tmp_path, tiny_model_dir, save_strategy="no", max_steps=1)
    code, lines, err = run_cli(tmp_path, cfg)
    assert code == 0 and "finished at step 1" in err, err[-2000:]
    out = tmp_path / "out"
    before = digest(out)
    code, lines, _ = run_cli(tmp_path, cfg, "--seed=3")
    assert code == 2 and "holds an earlier run" in lines[0] and digest(out) == before, lines
    code, lines, err = run_cli(tmp_path, cfg, "--seed=3", "--overwrite")
    assert code == 0 and "finished at step 1" in err, err[-2000:]
    assert json.loads((out / "run.json").read_text())["seed"] == 3
    listed = set(json.loads((out / ".ictrl-files.json").read_text())["files"])
    assert {"README.md", "config.yaml", "run.json", "metrics.jsonl", "config.json", "model.safetensors",
            "manifest.json", "tokenizer.json"} <= listed, listed
    (out / "notes.md").write_text("a user's notes beside the run")  # a name the run does not write: kept
    code, lines, err = run_cli(tmp_path, cfg, "--seed=4", "--overwrite")
    assert code == 0 and (out / "notes.md").read_text() == "a user's notes beside the run", err[-2000:]
