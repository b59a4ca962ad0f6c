"""The precision line names what the Trainer's Accelerator really gets: the run config's bf16/fp16 when true, else
accelerate launch's mixed_precision (ACCELERATE_MIXED_PRECISION, from its config file or flag), else fp32."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CELL = REPO / "configs" / "qwen2.5-0.5b" / "ict.yaml"


def test_run_precision_follows_transformers_rule() -> None:
    from ictrl.engine.trl_args import run_precision

    # TrainingArguments: mixed_precision = env, then fp16/bf16 when true
    assert run_precision(SimpleNamespace(bf16=False, fp16=False, mixed_precision="bf16"), {})[0] == "bf16"
    precision, why = run_precision(SimpleNamespace(bf16=False, fp16=False, mixed_precision=None),
                                   {"ACCELERATE_MIXED_PRECISION": "bf16"})
    assert precision == "bf16" and "ACCELERATE_MIXED_PRECISION" in why
    assert run_precision(SimpleNamespace(bf16=True, fp16=False, mixed_precision="bf16"), {}) == (
        "bf16", "the run config's bf16: true")
    assert run_precision(SimpleNamespace(bf16=False, fp16=False, mixed_precision="no"), {})[0] == "fp32"


def _build(tmp_path: Path, *overrides: str) -> object:
    from ictrl.train_cli.trainer_inputs import _note_cpu, build_trainer_args
    from ictrl.train_cli.run_config import load_config

    _note_cpu.cache_clear()  # said once per process
    cfg = load_config(CELL, [f"--output_dir={tmp_path / 'out'}", *overrides])
    return build_trainer_args(cfg, "test", cpu=True)


@pytest.fixture(autouse=True)
def no_accelerate_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No default accelerate config file (``accelerate config``), whatever this machine has; not launched."""
    from accelerate.commands import config

    monkeypatch.setattr(config, "default_config_file", str(tmp_path / "no-accelerate-config.yaml"))
    for key in ("ACCELERATE_DYNAMO_BACKEND", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)


@pytest.mark.parametrize(("env", "overrides", "said"), [
    # a shell's variable, not a launcher's: trl grpo's accelerate launch replaces it with its config's (none: no)
    ("bf16", [], "training on CPU in fp32 (accelerate's mixed_precision as trl grpo's accelerate launch sets it: no "
                 "default accelerate config file, so accelerate launch's default no; ACCELERATE_MIXED_PRECISION=bf16 "
                 "in the environment is replaced"),
    (None, [], "training on CPU in fp32 (the run config's bf16 and fp16 are false and accelerate's mixed_precision "
               "is no)"),
    (None, ["--bf16=false"], "training on CPU in fp32 (the run config's bf16 and fp16 are false and"),
    (None, ["--bf16=true"], "training on CPU in bf16 (the run config's bf16: true)"),
    ("no", ["--bf16=true"], "training on CPU in bf16 (the run config's bf16: true)"),
])
def test_cpu_precision_line_from_accelerate_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  caplog: pytest.LogCaptureFixture, env: str | None,
                                                  overrides: list[str], said: str) -> None:
    if env is None:
        monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    else:
        monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", env)
    with caplog.at_level(logging.WARNING, logger="ictrl"):
        args = _build(tmp_path, *overrides)
    assert said in caplog.text, caplog.text
    assert args.mixed_precision == said.split(" in ")[1].split(" ")[0].replace("fp32", "no")


def test_shipped_ddp_file_leaves_the_precision_to_the_run_config() -> None:
    data = yaml.safe_load((REPO / "configs" / "accelerate" / "ddp.yaml").read_text())
    assert data["mixed_precision"] == "no"


def test_under_a_launcher_or_with_an_accelerate_config_its_mixed_precision_is_used(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """ACCELERATE_MIXED_PRECISION set by accelerate launch (its ACCELERATE_DYNAMO_BACKEND beside it) stands; unlaunched,
    the default accelerate config's mixed_precision is what trl grpo's accelerate launch would set."""
    from accelerate.commands import config

    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "NO")
    with caplog.at_level(logging.WARNING, logger="ictrl"):
        assert _build(tmp_path).mixed_precision == "bf16"
    assert "training on CPU in bf16 (accelerate's mixed_precision (ACCELERATE_MIXED_PRECISION" in caplog.text
    monkeypatch.delenv("ACCELERATE_DYNAMO_BACKEND")
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION")
    Path(config.default_config_file).write_text("distributed_type: 'NO'\nmixed_precision: bf16\nnum_processes: 1\n")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ictrl"):
        assert _build(tmp_path).mixed_precision == "bf16"
    assert f"training on CPU in bf16 (accelerate's mixed_precision as trl grpo's accelerate launch sets it: the " \
           f"default accelerate config {config.default_config_file})" in caplog.text, caplog.text


@pytest.mark.parametrize(("overrides", "said"), [
    (['--model_init_kwargs={"dtype": "bfloat16"}'], "in bf16 (the model's weights load in bfloat16 "
                                                    "(model_init_kwargs.dtype); the run config's bf16 and fp16"),
    (["--dtype=float16"], "in fp16 (the model's weights load in float16 (dtype); the run config's"),
    (["--dtype=auto"], "in fp32 (the run config's bf16 and fp16 are false"),
])
def test_the_precision_line_names_the_weights_dtype(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   caplog: pytest.LogCaptureFixture, overrides: list[str],
                                                   said: str) -> None:
    """Without mixed precision the weights' own dtype is the precision: a model loaded in bf16 through
    model_init_kwargs trains in bf16 and is said to."""
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    with caplog.at_level(logging.WARNING, logger="ictrl"):
        _build(tmp_path, "--bf16=false", *overrides)
    assert f"training on CPU {said}" in caplog.text, caplog.text


@pytest.mark.integration
def test_accelerate_launch_flag_precision_is_logged(tiny_model_dir: Path, tmp_path: Path) -> None:
    """``accelerate launch --mixed_precision bf16`` on CPU trains in bf16, and the log says so and why."""
    sys.path.insert(0, str(REPO / "tests" / "engine"))
    import mp_worker as w

    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
           str(REPO / "configs" / "accelerate" / "ddp.yaml"), "--num_processes", "1", "--mixed_precision", "bf16",
           "--main_process_port", str(w.free_port()), "-m", "ictrl", "train", str(CELL),
           f"--model_name_or_path={tiny_model_dir}", f"--output_dir={tmp_path / 'out'}", "--max_steps=1",
           "--prompts_per_step=2", "--per_device_train_batch_size=8", "--num_generations=4",
           "--max_completion_length=8", "--dataset_name=[gsm8k_train]", "--dataset_limit=4",
           "--max_prompt_length=null", "--selection_warmup_steps=0", "--save_strategy=no", "--disable_tqdm=true",
           "--dynamic_sampling=false", "--use_vllm=false"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "training on CPU in bf16 (accelerate's mixed_precision" in proc.stderr, proc.stderr[-3000:]


def test_the_first_lines_say_how_many_processes_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    """One line with the process count; under accelerate's simple launcher (no config file: one process whatever
    --num_processes says) it says so and how to start several."""
    from ictrl.train_cli.trainer_inputs import _note_processes

    from ictrl.errors import REPORTED_FILE_ENV

    monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv(REPORTED_FILE_ENV, raising=False)
    _note_processes.cache_clear()
    with caplog.at_level(logging.INFO, logger="ictrl"):
        _build(tmp_path)
    assert [r.getMessage() for r in caplog.records if "process" in r.getMessage()] == ["1 process"]
    caplog.clear()
    _note_processes.cache_clear()
    monkeypatch.setenv("ACCELERATE_USE_CPU", "True")  # what `accelerate launch --num_processes 2 x.py` leaves
    with caplog.at_level(logging.INFO, logger="ictrl"):
        _build(tmp_path)
    said = [r.getMessage() for r in caplog.records if "process" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("1 process: accelerate launch without a config file")
    assert "ictrl train --num-processes N" in said[0]
    caplog.clear()
    _note_processes.cache_clear()
    monkeypatch.setenv(REPORTED_FILE_ENV, str(tmp_path / "reported"))  # ictrl train --num-processes 1's process
    with caplog.at_level(logging.INFO, logger="ictrl"):
        _build(tmp_path)
    assert [r.getMessage() for r in caplog.records if "process" in r.getMessage()] == ["1 process"]
    _note_processes.cache_clear()
    with caplog.at_level(logging.INFO, logger="ictrl"):
        _note_processes(2, False)
    assert caplog.records[-1].getMessage() == "2 processes (data parallel)"


@pytest.mark.integration
def test_a_shells_mixed_precision_trains_as_the_trl_grpo_command(tiny_model_dir: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """ACCELERATE_MIXED_PRECISION=bf16 in the shell, no accelerate config: the ``trl grpo`` command (which starts its
    script through accelerate launch, which sets the variable to no) and ``ictrl train`` end with the same weights;
    both run torch on one thread (accelerate launch's OMP_NUM_THREADS, ictrl's default), as the reward sees."""
    import os

    from ictrl import cli
    from tests.train_cli.test_trl_cli_parity import REWARD, trl_file
    from tests.train_cli.test_trl_habits import same_weights, state_dict

    config = trl_file(tmp_path, tiny_model_dir, max_steps=2)
    seen = tmp_path / "threads.txt"
    (tmp_path / "parity_rewards.py").write_text(  # the same reward, noting torch's threads at each call
        f"import torch\n{REWARD}_plain = length_reward\n\ndef length_reward(completions, **kwargs):\n"
        f"    with open({str(seen)!r}, 'a') as fh:\n        fh.write(f'{{torch.get_num_threads()}}\\n')\n"
        "    return _plain(completions, **kwargs)\n")
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    env.update({"ACCELERATE_MIXED_PRECISION": "bf16", "HF_HOME": str(tmp_path / "hf")})
    proc = subprocess.run([str(Path(sys.executable).parent / "trl"), "grpo", "--config", str(config), "--output_dir",
                           str(tmp_path / "trl")], capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cli.main(["train", str(config)]) == 0
    sys.modules.pop("parity_rewards", None)
    assert same_weights(state_dict(tmp_path / "trl"), state_dict(tmp_path / "out"))
    assert seen.read_text().split() == ["1"] * 4  # two steps of each tool


def test_a_cpu_run_uses_one_thread_unless_told_and_says_so(monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    """``cpu_threads``, else OMP_NUM_THREADS, else 1 (trl grpo's accelerate launch default), in one line; the
    caller's own count comes back after the run."""
    import torch

    from ictrl.train_cli.run import cpu_threads

    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    for cpu, omp, expected, said in ((None, None, 1, "CPU threads: 1 (as trl grpo, whose accelerate launch sets "
                                                     "OMP_NUM_THREADS=1; cpu_threads or OMP_NUM_THREADS sets more"),
                                     (2, "3", 2, "CPU threads: 2 (cpu_threads;"),
                                     (None, "3", 3, "CPU threads: 3 (OMP_NUM_THREADS;")):
        if omp is not None:
            monkeypatch.setenv("OMP_NUM_THREADS", omp)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="ictrl.train"), \
                cpu_threads(SimpleNamespace(cpu_threads=cpu, use_cpu=True)):
            assert torch.get_num_threads() == expected
        assert said in caplog.text, caplog.text
        assert torch.get_num_threads() == before


def test_trl_115_on_cpu_without_its_kernel_is_one_line_before_the_model_loads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """TRL 1.15 runs its fused LM head as a Triton kernel on every device: on CPU without triton (the CPU torch
    wheel's install) stock TRL fails mid-step ('NoneType' object has no attribute 'apply'), and without
    TRITON_INTERPRET=1 Triton finds no driver; each is one line saying how to run it. TRL 1.16 needs neither."""
    import trl

    from ictrl.train_cli.run_config import ConfigError

    monkeypatch.setattr(trl, "__version__", "1.15.0")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` raises ImportError, as when not installed
    with pytest.raises(ConfigError, match=r"^test: trl 1.15.0 computes log-probs with a Triton kernel on every "
                                          r"device, and triton is not installed .*pip install -c constraints.txt "
                                          r"triton and set TRITON_INTERPRET=1 .*or use trl 1.16"):
        _build(tmp_path)
    monkeypatch.delitem(sys.modules, "triton")
    with pytest.raises(ConfigError, match=r"without CUDA runs only under Triton's interpreter: set TRITON_INTERPRET=1"):
        _build(tmp_path)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    _build(tmp_path)
    monkeypatch.setattr(trl, "__version__", "1.16.0")
    monkeypatch.delenv("TRITON_INTERPRET")
    _build(tmp_path)


def test_a_torn_default_accelerate_config_is_one_line_naming_it(tmp_path: Path) -> None:
    """The default accelerate config is read by accelerate's own loader (as trl grpo's accelerate launch reads it):
    a file that is not YAML is one line naming it, not the parser's traceback."""
    from accelerate.commands import config

    from ictrl.errors import ConfigError

    Path(config.default_config_file).write_text("mixed_precision: [bf16\n")
    with pytest.raises(ConfigError, match=rf"the default accelerate config {config.default_config_file} cannot be read"):
        _build(tmp_path)


@pytest.mark.parametrize("override", ['--model_init_kwargs={"dtype": "auto"}', "--dtype=auto"])
def test_dtype_auto_on_cpu_loads_the_checkpoints_dtype_as_trl_grpo(tiny_model_dir: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   caplog: pytest.LogCaptureFixture,
                                                                   override: str) -> None:
    """A checkpoint saved in bf16, ``dtype: auto`` on CPU: ``ictrl train``'s model loading (its from_pretrained
    arguments, its loader) gives the dtype ``trl grpo``'s gives (its model_init_kwargs into TRL's
    create_model_from_path): the checkpoint's, bf16, and the precision line says so."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM
    from trl import ModelConfig
    from trl.trainer.utils import create_model_from_path

    from ictrl.train_cli import model_init
    from ictrl.train_cli.run import _model_and_tokenizer
    from ictrl.train_cli.run_config import load_config

    saved = tmp_path / "bf16"
    AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16).save_pretrained(saved)
    for name in tiny_model_dir.iterdir():
        if name.is_file() and not (saved / name.name).exists():  # the tokenizer's files
            shutil.copy(name, saved / name.name)
    cfg = load_config(CELL, [f"--output_dir={tmp_path / 'out'}", f"--model_name_or_path={saved}", override])
    ours, _ = _model_and_tokenizer(cfg, model_init.load_kwargs(cfg), None)
    # trl grpo (trl/scripts/grpo.py): ModelConfig's dtype, then model_init_kwargs over it
    model_args = ModelConfig(model_name_or_path=str(saved), dtype="auto" if override == "--dtype=auto" else "float32")
    kwargs = {"revision": model_args.model_revision, "trust_remote_code": False,
              "attn_implementation": model_args.attn_implementation, "dtype": model_args.dtype,
              **({"dtype": "auto"} if override.startswith("--model_init_kwargs") else {})}
    theirs = create_model_from_path(str(saved), **kwargs)
    assert theirs.dtype == torch.bfloat16
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    assert {p.dtype for p in ours.parameters()} == {theirs.dtype}
    # the precision line, before the load, reads it where from_pretrained does: the checkpoint's config.json
    key = "model_init_kwargs.dtype" if override.startswith("--model_init_kwargs") else "dtype"
    with caplog.at_level(logging.WARNING, logger="ictrl"):
        _build(tmp_path, "--bf16=false", f"--model_name_or_path={saved}", override)
    assert f"training on CPU in bf16 (the model's weights load in bfloat16 ({key}: auto, the checkpoint's)" \
        in caplog.text, caplog.text
