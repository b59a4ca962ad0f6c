"""``ictrl train CONFIG --num-processes N``: the parent checks the config for N processes before it starts any (a
mistake is one line, exit status 2, nothing launched), launches through accelerate's ``launch_command``, and
exits with a failed process's status without torchrun's traceback."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from collections.abc import Callable
from typing import Any

import pytest

import mp_worker as w
from ictrl import cli
from ictrl.files import claim_files

TINY = str(w.REPO_ROOT / "configs" / "tiny" / "ict.yaml")
# the tiny config cut to one small step (as tests/engine/test_accelerate_launch.py)
ONE_STEP = ["--max_steps=1", "--save_strategy=no", "--prompts_per_step=4", "--num_generations=4",
            "--per_device_train_batch_size=8", "--max_completion_length=16", "--num_iterations=1"]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A working directory holding ``runs/tiny-model`` (random weights), where configs/tiny/ict.yaml finds it."""
    root = tmp_path_factory.mktemp("launch")
    assert cli.main(["tiny-model", str(root / "runs" / "tiny-model"), "--untrained", "--problems", "16"]) == 0
    return root


class Launches:
    """accelerate's launch_command replaced: records its arguments, starts nothing, raises ``fail()`` if set."""

    def __init__(self) -> None:
        self.calls: list[Any] = []
        self.fail: Callable[[], None] | None = None
        self.launch_argv = ""

    def __call__(self, args: Any) -> None:
        from ictrl.train_cli.cli import LAUNCH_ARGV_ENV

        self.calls.append(args)
        self.launch_argv = os.environ[LAUNCH_ARGV_ENV]  # what the processes' Ctrl-C line offers to resume
        if self.fail is not None:
            self.fail()


@pytest.fixture
def launches(tiny_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Launches:
    """The recorder in place of accelerate's launch_command, run from ``tiny_dir``."""
    import accelerate.commands.launch

    recorder = Launches()
    monkeypatch.setattr(accelerate.commands.launch, "launch_command", recorder)
    monkeypatch.chdir(tiny_dir)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    return recorder


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("--learning_rate=-1", "learning_rate: must be >= 0, got -1"),
        # valid on one process (3 x 8 completions), not on the two requested: the parent checks for two
        ("--prompts_per_step=3", "must be a multiple of the number of processes (2)"),
        ("--dataset_name=[jsonl:missing.jsonl]", "missing.jsonl': file not found"),
        ("--model_name_or_path=runs/nowhere", "runs/nowhere"),
        ("--max_prompt_length=1", None),  # a mistake only the processes see: launched (below)
    ],
)
def test_config_error_is_one_line_before_any_process_starts(override: str, message: str | None,
                                                            launches: Launches,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["train", TINY, "--num-processes", "2", *ONE_STEP[1:], override])
    err = capsys.readouterr().err
    if message is None:
        assert code == 0 and len(launches.calls) == 1, err
        return
    assert code == 2, err
    assert err.startswith("ictrl train: error:") and err.count("\n") == 1 and message in err, err
    assert launches.calls == []


def test_existing_checkpoints_refused_in_the_parent(tiny_dir: Path, launches: Launches,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    out = tiny_dir / "runs" / "done"
    (out / "checkpoint-3").mkdir(parents=True)
    (out / "checkpoint-3" / "trainer_state.json").write_text("{}")
    claim_files(out, ["checkpoint-3"])  # an earlier run's, as ictrl lists its checkpoints
    assert cli.main(["train", TINY, f"--output-dir={out}", "--num_processes=2"]) == 2
    assert "already holds checkpoint-3; pass --resume" in capsys.readouterr().err and launches.calls == []


def test_sigterm_during_the_checks_is_one_line_and_starts_nothing(launches: Launches,
                                                                  monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    import signal

    import ictrl.train_cli.trainer_inputs

    real = ictrl.train_cli.trainer_inputs.check_before_launch

    def checks_then_sigterm(*args: Any, **kwargs: Any) -> None:
        real(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)  # a scheduler's, while the parent still reads the inputs

    monkeypatch.setattr(ictrl.train_cli.trainer_inputs, "check_before_launch", checks_then_sigterm)
    before = signal.getsignal(signal.SIGTERM)
    assert cli.main(["train", TINY, "--num-processes", "2", *ONE_STEP[1:]]) == 143
    assert capsys.readouterr().err == ("\nictrl train: terminated (SIGTERM) during the checks before the launch; no "
                                       "process was started\n")
    assert launches.calls == [] and signal.getsignal(signal.SIGTERM) == before


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--num-processes"], "--num-processes needs a value"),
        (["--num-processes", "--seed=1"], "--num-processes needs a value"),
        (["--num-processes=0"], "--num-processes: expected a whole number >= 1, got '0'"),
        (["--num_processes", "two"], "--num-processes: expected a whole number >= 1, got 'two'"),
        (["--accelerate-config", "nowhere.yaml"], "--accelerate-config nowhere.yaml: file not found"),
        (["--num-processes=2", "--main-process-port=port"], "--main-process-port: expected a whole number"),
    ],
)
def test_bad_launch_flag_is_one_line(argv: list[str], message: str, launches: Launches,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["train", TINY, *argv]) == 2
    err = capsys.readouterr().err
    assert err == f"ictrl train: error: {message}\n" or (err.count("\n") == 1 and message in err), err
    assert launches.calls == []


@pytest.mark.parametrize("value", ["two", "0", "null"])
def test_a_bad_num_processes_in_the_accelerate_config_is_one_line(value: str, launches: Launches, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "acc.yaml"
    config.write_text(f"distributed_type: MULTI_GPU\nnum_processes: {value}\n")
    assert cli.main(["train", TINY, f"--accelerate-config={config}"]) == 2
    shown = {"two": "'two'", "0": "0", "null": "None"}[value]
    assert capsys.readouterr().err == (f"ictrl train: error: --accelerate-config {config}: num_processes: expected a "
                                       f"whole number >= 1, got {shown}; or give --num-processes N\n")
    assert launches.calls == []


def test_refused_inside_a_launched_process(launches: Launches, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    assert cli.main(["train", TINY, "--num-processes", "2"]) == 2
    assert "already started by a launcher" in capsys.readouterr().err and launches.calls == []


def test_launch_arguments(launches: Launches, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import accelerate.commands.config

    monkeypatch.setattr(accelerate.commands.config, "default_config_file", str(tmp_path / "none.yaml"))
    assert cli.main(["train", TINY, "--num-processes", "2", "--seed=3", "--main-process-port=29123"]) == 0
    args = launches.calls[-1]
    assert args.num_processes == 2 and args.multi_gpu and args.main_process_port == 29123
    assert args.mixed_precision == "no" and args.num_machines == 1  # spelt out: accelerate does not warn
    assert args.module and args.training_script == "ictrl" and args.training_script_args == ["train", TINY, "--seed=3"]
    assert launches.launch_argv == f"{TINY} --num-processes 2 --seed=3 --main-process-port=29123"

    ddp = str(w.REPO_ROOT / "configs" / "accelerate" / "ddp.yaml")
    assert cli.main(["train", TINY, f"--accelerate_config={ddp}", "--num-processes=2"]) == 0
    args = launches.calls[-1]
    assert args.config_file == ddp and args.num_processes == 2 and not args.multi_gpu  # accelerate reads the file
    # without --num-processes the accelerate config's count (8) is the one the parent checks the config for
    assert cli.main(["train", TINY, f"--accelerate-config={ddp}", "--prompts_per_step=4"]) == 2


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the CPU fallback of the launch")
def test_cpu_launch_turns_mixed_precision_off_and_says_fsdp_does_not_shard(
        launches: Launches, capsys: pytest.CaptureFixture[str]) -> None:
    """The shipped ZeRO configs ask for bf16, which would reach DeepSpeed's own config and disagree with the
    trainer's fp32 CPU fallback after the model loads; accelerate runs FSDP on GPUs only."""
    for name in ("zero2", "zero3", "fsdp2", "ddp"):
        config = str(w.REPO_ROOT / "configs" / "accelerate" / f"{name}.yaml")
        assert cli.main(["train", TINY, f"--accelerate-config={config}", "--num-processes=2"]) == 0
        assert launches.calls[-1].mixed_precision == "no", name
        said = [line for line in capsys.readouterr().err.splitlines() if "shards with FSDP on GPUs only" in line]
        assert len(said) == (name == "fsdp2"), (name, said)


@pytest.mark.integration
@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="needs deepspeed")
def test_zero3_launch_of_ictrl_train_matches_ddp(tiny_model_dir: Path, shared_data: Path, tmp_path: Path) -> None:
    """``ictrl train --num-processes 2 --accelerate-config configs/accelerate/zero3.yaml`` (the shipped file, on
    CPU) trains, checkpoints DeepSpeed's partitioned states and gathers the final model, with the metrics and
    weights of the same run launched as plain data parallel."""
    from safetensors.torch import load_file

    from test_resume import REWARD_MODULE, STEPS, TIMING_KEYS, command, rows

    (tmp_path / "ictrl_resume_reward.py").write_text(REWARD_MODULE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("WORLD_SIZE", None)

    def train(out: Path, *extra: str) -> str:
        cmd = command(tiny_model_dir, out, "--num-processes=2", f"--main-process-port={w.free_port()}", *extra)
        done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stderr

    train(tmp_path / "ddp")
    err = train(tmp_path / "zero3", f"--accelerate-config={w.REPO_ROOT / 'configs' / 'accelerate' / 'zero3.yaml'}")
    # the launcher's OMP_NUM_THREADS note and the ranks' deprecation warnings stay out (--verbose keeps them)
    assert "Setting OMP_NUM_THREADS" not in err and "FutureWarning" not in err and "mismatch" not in err, err[-3000:]
    assert list((tmp_path / "zero3").glob("checkpoint-*/global_step*"))  # DeepSpeed's engine wrote the states
    assert not list((tmp_path / "ddp").glob("checkpoint-*/global_step*"))
    expected, got = rows(tmp_path / "ddp"), rows(tmp_path / "zero3")
    assert [r["step"] for r in got] == [r["step"] for r in expected] == list(range(1, STEPS + 1))
    mismatches = [(want["step"], key, value, have.get(key)) for want, have in zip(expected, got)
                  for key, value in want.items() if key not in TIMING_KEYS and isinstance(value, (int, float))
                  and not math.isclose(have.get(key, math.nan), value, rel_tol=1e-4, abs_tol=1e-6)]
    ref, run = (load_file(tmp_path / d / "model.safetensors") for d in ("ddp", "zero3"))
    moved = max((ref[name] - load_file(tiny_model_dir / "model.safetensors")[name]).abs().max().item()
                for name in ref)
    assert moved > 1e-4  # the runs trained
    mismatches += [(STEPS, name, 0.0, (tensor - run[name]).abs().max().item()) for name, tensor in ref.items()
                   if (tensor - run[name]).abs().max().item() > 1e-5]
    assert not mismatches, mismatches[:5]


def _child_failed(rank: int, exitcode: int) -> Exception:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    return ChildFailedError("ictrl", {rank: ProcessFailure(local_rank=rank, pid=1, exitcode=exitcode,
                                                           error_file="")})


@pytest.mark.parametrize(
    ("rank", "exitcode", "reported", "status", "line"),
    [
        (1, 2, "2", 2, None),  # rank 0 printed the config error: nothing more, whichever rank the launcher saw first
        (0, 130, "130", 130, None),  # Ctrl-C: rank 0 printed where it stopped
        (0, 1, None, 1, "process 0 of 2 exited with status 1; its output is above"),  # a traceback in the process
        (1, -9, None, 137, "process 1 of 2 was killed by SIGKILL (out of memory?); its output is above"),
        # rank 0 was stopped before it could say why
        (1, 2, None, 2, "process 1 of 2 exited with status 2; its output is above"),
    ],
)
def test_failed_process_status_without_launcher_traceback(rank: int, exitcode: int, reported: str | None,
                                                          status: int, line: str | None, launches: Launches,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    from ictrl.errors import REPORTED_FILE_ENV

    def fail() -> None:
        if reported is not None:  # what ictrl.cli does in rank 0 after its one line
            Path(os.environ[REPORTED_FILE_ENV]).write_text(reported)
        raise _child_failed(rank, exitcode)

    launches.fail = fail
    assert cli.main(["train", TINY, "--num-processes", "2"]) == status
    err = capsys.readouterr().err
    assert "Traceback" not in err and "ChildFailedError" not in err
    assert err == ("" if line is None else f"ictrl train: error: {line} (--debug adds the launcher's traceback)\n")
    assert REPORTED_FILE_ENV not in os.environ and "ICTRL_LAUNCH_ARGV" not in os.environ


@pytest.mark.parametrize(("raised", "status", "err"), [
    (ValueError("num_processes must be even\nmore"), 2, "ictrl train: error: accelerate launch: num_processes must be "
                                                      "even\n"),
    (subprocess.CalledProcessError(3, ["python"]), 3, "ictrl train: error: process 0 of 2 exited with status 3; its "
                                                     "output is above (--debug adds the launcher's traceback)\n"),
    (KeyboardInterrupt(), 130, "\nictrl train: interrupted\n"),
])
def test_the_launchers_other_endings_and_debug(raised: BaseException, status: int, err: str, launches: Launches,
                                               monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """accelerate's own refusal is one line (exit 2), its single-process launcher's failure is that process's status,
    Ctrl-C in the parent is 130; under --debug each propagates as it was raised."""
    from ictrl.train_cli.cli import LAUNCH_ARGV_ENV
    from ictrl.train_cli.launch import Launch, run_launch

    def fail() -> None:
        raise raised

    launches.fail = fail
    assert cli.main(["train", TINY, "--num-processes", "2"]) == status
    assert capsys.readouterr().err == err
    monkeypatch.setenv("ICTRL_DEBUG", "1")
    monkeypatch.setenv(LAUNCH_ARGV_ENV, TINY)  # which ictrl train sets for the processes
    with pytest.raises(type(raised)):
        run_launch(Launch(num_processes=2), [TINY])


@pytest.mark.integration
def test_two_process_cpu_launch_through_the_flag(tmp_path: Path) -> None:
    assert cli.main(["tiny-model", str(tmp_path / "runs" / "tiny-model"), "--untrained", "--problems", "16"]) == 0
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("WORLD_SIZE", None)

    def train(*extra: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "ictrl", "train", TINY, "--num-processes", "2", "--main-process-port",
               str(w.free_port()), *ONE_STEP, *extra]
        return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)

    proc = train()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count("no CUDA device: training on CPU") == 1  # two processes ran; rank 0 logs
    run = tmp_path / "runs" / "tiny" / "ict"
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1]
    assert (run / "model.safetensors").is_file()

    # a mistake the processes find after the parent's checks (every prompt longer than 1 token): rank 0's line
    proc = train("--max_prompt_length=1", "--output-dir=runs/tiny/short")
    errors = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert errors == ["ictrl train: error: " + TINY + ": dataset_name: no training rows left (check dataset_limit and "
                      "max_prompt_length)"], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "ChildFailedError" not in proc.stderr


def test_print_config_checks_for_the_requested_processes(launches: Launches,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["train", TINY, "--print-config", "--prompts_per_step=3"]) == 0  # one process: 3 x 8 is fine
    assert cli.main(["train", TINY, "--print-config", "--prompts_per_step=3", "--num-processes=2"]) == 2
    assert "multiple of the number of processes (2)" in capsys.readouterr().err and launches.calls == []
