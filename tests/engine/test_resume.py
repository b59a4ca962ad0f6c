"""Kill -9 a training run after a checkpoint, resume it, and match an uninterrupted run step for step.

The run crosses epoch boundaries (4 prompts, 2 per step) and resumes in the middle of an epoch, so it checks
model/optimizer/scheduler restore, the RNG that drives sampling, the batches skipped in the resumed epoch and
the prompt order of later epochs (ictrl.engine.resumable.EpochRepeatSampler).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

CONFIGS = Path(__file__).resolve().parents[2] / "configs"

# A graded reward (fraction of letters in the completion), so advantages are non-zero and the updates matter.
# With ICTRL_TEST_BLOCK_AT=n set, the n-th call writes ICTRL_TEST_BLOCKED and hangs: the run is then killed
# in the middle of a step, after the checkpoints before it are complete.
REWARD_MODULE = '''
import os, time
from pathlib import Path
from ictrl.rewards import completion_text

_calls = 0

def letters(prompts=None, completions=None, **columns):
    global _calls
    _calls += 1
    if _calls == int(os.environ.get("ICTRL_TEST_BLOCK_AT", "0")):
        Path(os.environ["ICTRL_TEST_BLOCKED"]).write_text("blocked")
        time.sleep(600)
    texts = [completion_text(c) for c in completions]
    return [sum(ch.isalpha() for ch in t) / max(len(t), 1) for t in texts]
'''
TIMING_KEYS = {"step_time", "ictrl/stats_time", "epoch"}
STEPS, SAVE_STEPS, BLOCK_AT = 6, 3, 5


def command(model_dir: Path, out: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "ictrl.cli", "train", str(CONFIGS / "qwen2.5-0.5b" / "ict.yaml"),
        f"--model_name_or_path={model_dir}", f"--output_dir={out}", f"--max_steps={STEPS}",
        f"--save_steps={SAVE_STEPS}", "--learning_rate=1e-3", "--seed=7",
        "--prompts_per_step=2", "--per_device_train_batch_size=8", "--num_generations=4",
        "--max_completion_length=8",
        "--dataset_name=[gsm8k_train]", "--dataset_limit=4", "--max_prompt_length=null",
        "--selection_warmup_steps=0", "--reward_funcs=ictrl_resume_reward:letters", "--disable_tqdm=true",
        "--use_vllm=false",  # the tiny model's heads are below vLLM's CPU minimum
        *extra,
    ]


def rows(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.integration
def test_kill_and_resume_matches_uninterrupted_run(tiny_model_dir: Path, uninterrupted_reference: Path,
                                                   tmp_path: Path) -> None:
    (tmp_path / "ictrl_resume_reward.py").write_text(REWARD_MODULE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
           "ICTRL_TEST_BLOCKED": str(tmp_path / "blocked"), "OMP_NUM_THREADS": "1"}
    ref, run = uninterrupted_reference, tmp_path / "run"

    proc = subprocess.Popen(command(tiny_model_dir, run), env={**env, "ICTRL_TEST_BLOCK_AT": str(BLOCK_AT)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 600
    while not (tmp_path / "blocked").exists():
        assert proc.poll() is None, proc.stderr.read()[-3000:] if proc.stderr else "exited"
        assert time.monotonic() < deadline, "the run never reached the blocking step"
        time.sleep(0.05)
    assert (run / f"checkpoint-{SAVE_STEPS}").is_dir()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert not (run / "model.safetensors").exists()
    assert [r["step"] for r in rows(run)] == list(range(1, BLOCK_AT))  # step 4 logged after checkpoint-3

    done = subprocess.run(command(tiny_model_dir, run, "--resume"), env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resuming from" in done.stderr and f"checkpoint-{SAVE_STEPS}" in done.stderr

    expected, got = rows(ref), rows(run)
    assert [r["step"] for r in got] == [r["step"] for r in expected] == list(range(1, STEPS + 1))
    compared = 0
    for want, have in zip(expected, got):
        assert want.keys() == have.keys()
        for key, value in want.items():
            if key in TIMING_KEYS or not isinstance(value, (int, float)):
                continue
            assert math.isclose(have[key], value, rel_tol=1e-5, abs_tol=1e-7), (want["step"], key, value, have[key])
            compared += 1
    assert compared > 100
    # the runs really learned something and were not constant: grad norms and rewards vary across steps
    assert len({round(r["grad_norm"], 9) for r in expected}) == STEPS and any(r["grad_norm"] > 0 for r in expected)
    assert len({round(r["reward"], 9) for r in expected}) > 1

    from safetensors.torch import load_file

    final_ref, final_run = load_file(ref / "model.safetensors"), load_file(run / "model.safetensors")
    assert final_ref.keys() == final_run.keys()
    for name, tensor in final_ref.items():
        assert (tensor - final_run[name]).abs().max().item() <= 1e-6, name


# --- the pieces, without a training run ----------------------------------------------------------------------


class _FakeState:
    def __init__(self, step: int) -> None:
        self.global_step = step
        self.best_model_checkpoint = None


class _FakeArgs:
    should_save = True
    save_total_limit = 2


class _FakeAccelerator:
    def wait_for_everyone(self) -> None:
        pass


class _FakeTrainer:
    """Writes a checkpoint file by file like Trainer._save_checkpoint; ``fail_after`` files it dies."""

    def __init__(self, run_dir: Path, step: int, fail_after: int | None = None) -> None:
        self.run_dir, self.fail_after = run_dir, fail_after
        self.state, self.args, self.accelerator = _FakeState(step), _FakeArgs(), _FakeAccelerator()

    def _get_output_dir(self, trial: Any = None) -> str:
        return str(self.run_dir)

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        out = Path(self._get_output_dir(trial)) / f"checkpoint-{self.state.global_step}"
        out.mkdir(parents=True, exist_ok=True)
        for i, name in enumerate(("model.safetensors", "optimizer.pt", "rng_state.pth", "trainer_state.json")):
            if i == self.fail_after:
                raise KeyboardInterrupt("killed mid-save")
            if name.endswith((".pt", ".pth")):  # a real pickle: the resume loads it as the Trainer would
                torch.save({"name": name}, out / name)
            else:
                (out / name).write_text(name)


def test_checkpoints_appear_whole_or_not_at_all(tmp_path: Path) -> None:
    from ictrl.checkpoints import complete_checkpoints
    from ictrl.engine.resumable import Resumable
    from ictrl.train_cli.output_dir import prepare_output_dir
    from ictrl.train_cli.run_config import config_from_dict

    def save(*args: Any, **kwargs: Any) -> None:  # the fake Trainer's save through the trainer's checkpoint part
        trainer = _FakeTrainer(*args, **kwargs)
        Resumable(trainer).save_checkpoint(trainer._save_checkpoint, None, None)

    for step in (1, 2, 3):
        save(tmp_path, step)
    # save_total_limit=2 keeps the two newest; each is complete
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["checkpoint-2", "checkpoint-3"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".ictrl-files.json", "checkpoint-2", "checkpoint-3"]
    assert sorted(p.name for p in (tmp_path / "checkpoint-3").iterdir()) == [
        "manifest.json", "model.safetensors", "optimizer.pt", "rng_state.pth", "trainer_state.json"]

    with pytest.raises(KeyboardInterrupt):
        save(tmp_path, 4, fail_after=2)
    assert not (tmp_path / "checkpoint-4").exists()  # plain Trainer would leave a half-written checkpoint-4
    assert (tmp_path / ".staging-checkpoint-4" / "checkpoint-4" / "optimizer.pt").is_file()
    cfg = config_from_dict({"model_name_or_path": "m", "output_dir": str(tmp_path)})
    assert prepare_output_dir(cfg, resume=True) == tmp_path / "checkpoint-3"
    assert not (tmp_path / ".staging-checkpoint-4").exists()  # cleaned up on restart


def test_the_trainer_hooks_are_the_pinned_ones() -> None:
    """ICTGRPOTrainer hands these Trainer/TRL methods to its Resumable part, and the Trainer's on_train_begin and
    on_epoch_begin events: each epoch's sampler is set before the Trainer's _run_epoch iterates the dataloader."""
    import inspect

    from transformers import Trainer
    from trl import GRPOTrainer

    from ictrl.engine.trainer import ICTGRPOTrainer

    def params(name: str) -> list[str]:
        return list(inspect.signature(getattr(GRPOTrainer, name)).parameters)

    assert params("_save_checkpoint") == ["self", "model", "trial"]
    assert params("_get_train_sampler") == ["self", "dataset"]
    assert params("_get_output_dir") == ["self", "trial"]
    for name in ("_save_checkpoint", "_get_train_sampler"):
        assert getattr(ICTGRPOTrainer, name) is not getattr(GRPOTrainer, name)
    loop = inspect.getsource(Trainer._inner_training_loop)
    assert loop.index(".on_train_begin(") < loop.index(".on_epoch_begin(") < loop.index("self._run_epoch(")
    epoch = inspect.getsource(Trainer._run_epoch)
    assert "epoch_iterator = iter(train_dataloader)" in epoch
    assert epoch.index("epoch_iterator = iter(train_dataloader)") < epoch.index("self.training_step(")


def test_epoch_sampler_matches_trl_order_per_epoch() -> None:
    from trl.trainer.utils import RepeatSampler

    from ictrl.engine.resumable import EpochRepeatSampler

    def sampler() -> RepeatSampler:
        return RepeatSampler(list(range(10)), mini_repeat_count=2, batch_size=3, repeat_count=2, seed=5)

    trl_order = sampler()
    uninterrupted = [list(trl_order) for _ in range(4)]  # TRL: one generator advanced once per epoch
    assert len({tuple(o) for o in uninterrupted}) == 4
    for epoch in (3, 0, 2, 1):  # any epoch, from a fresh sampler (a resumed run), in any call order
        fresh = EpochRepeatSampler(sampler())
        fresh.set_epoch(epoch)
        assert list(fresh) == uninterrupted[epoch]
        assert list(fresh) == uninterrupted[epoch]  # re-iterating an epoch repeats it
    assert len(EpochRepeatSampler(sampler())) == len(sampler())


def test_each_epoch_begins_with_its_sampler_epoch_and_a_run_with_no_step_left_has_no_prompt() -> None:
    from types import SimpleNamespace

    from trl.trainer.utils import RepeatSampler

    from ictrl.engine.resumable import Resumable

    part = Resumable(trainer=None)
    sampler = part.train_sampler(RepeatSampler(list(range(6)), mini_repeat_count=2, batch_size=2, seed=5))
    control = SimpleNamespace(should_training_stop=False)
    part.train_begins(SimpleNamespace(max_steps=4, global_step=2), control)
    for done, epoch in ((0.0, 0), (1.5, 1), (2.0, 2)):  # a fresh run, resumed inside epoch 1, epoch 2 beginning
        part.epoch_begins(SimpleNamespace(epoch=done))
        assert sampler.epoch == epoch and len(list(sampler)) == 12
    assert not control.should_training_stop
    part.train_begins(SimpleNamespace(max_steps=4, global_step=4), control)  # resumed at max_steps
    part.epoch_begins(SimpleNamespace(epoch=1.5))
    assert control.should_training_stop and list(sampler) == []


# --- resuming a run that already reached max_steps ------------------------------------------------------------


def _write_state(directory: Path, step: int, max_steps: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "trainer_state.json").write_text(json.dumps({"global_step": step, "max_steps": max_steps}))


def test_finished_run_needs_max_steps_and_a_final_model_of_that_step(tmp_path: Path) -> None:
    from ictrl.checkpoints import checkpoint_state

    ckpt = tmp_path / "checkpoint-4"

    def finished_run(checkpoint: Path, max_steps: int) -> bool:  # the state as a resume reads it, each time afresh
        return checkpoint_state(checkpoint).finished(max_steps)

    _write_state(ckpt, 4, 4)
    assert not finished_run(ckpt, 4)  # no final model: killed after the last checkpoint, the model still to write
    _write_state(tmp_path, 2, 2)
    assert not finished_run(ckpt, 4)  # the final model of an earlier, shorter run
    _write_state(tmp_path, 4, 4)
    assert finished_run(ckpt, 4)
    assert finished_run(ckpt, 3)  # max_steps lowered below the checkpoint: nothing left either
    assert not finished_run(ckpt, 6)  # max_steps raised: the run continues
    assert finished_run(ckpt, -1)  # epoch-based: the max_steps the checkpoint recorded
    _write_state(ckpt, 4, 8)
    assert not finished_run(ckpt, -1)
    (ckpt / "trainer_state.json").write_text("{not json")
    with pytest.raises(ValueError, match="checkpoint-4/trainer_state.json"):
        finished_run(ckpt, 4)


@pytest.mark.integration
def test_resume_at_max_steps_trains_no_step(tiny_model_dir: Path, shared_data: Path, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """6 prompts, 2 per step: an epoch is 3 steps and max_steps=2 ends inside it. Trainer re-entered that epoch
    on resume and ran step 3 (at an epoch boundary its epoch loop is empty, which hid the bug)."""
    import torch
    from safetensors.torch import load_file

    import ictrl.models

    from ictrl.train_cli.run import train
    from ictrl.train_cli.run_config import load_config

    out = tmp_path / "out"
    cfg = load_config(CONFIGS / "qwen2.5-0.5b" / "ict.yaml", [
        f"--model_name_or_path={tiny_model_dir}", f"--output_dir={out}", "--max_steps=2", "--save_steps=1",
        "--prompts_per_step=2", "--per_device_train_batch_size=8", "--num_generations=4",
        "--max_completion_length=8", "--dataset_name=[gsm8k_train]", "--dataset_limit=6", "--max_prompt_length=null",
        "--selection_warmup_steps=0", "--disable_tqdm=true", "--use_vllm=false",
    ])
    assert train(cfg).global_step == 2
    metrics = (out / "metrics.jsonl").read_text()
    assert [json.loads(line)["step"] for line in metrics.splitlines()] == [1, 2]
    weights = load_file(out / "model.safetensors")

    def unchanged_run() -> None:
        assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]
        assert (out / "metrics.jsonl").read_text() == metrics
        assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 2
        again = load_file(out / "model.safetensors")
        assert again.keys() == weights.keys()
        for name, tensor in weights.items():
            assert torch.equal(again[name], tensor), name

    # complete (checkpoint-2 and the final model of step 2): reported, and the model is not even loaded
    real_loader = ictrl.models.load_model_and_tokenizer
    monkeypatch.setattr(ictrl.models, "load_model_and_tokenizer",
                        lambda *a, **k: pytest.fail("a complete run must not load the model"))
    with caplog.at_level("WARNING", logger="ictrl.train"):
        result = train(cfg, resume=True)
    assert (result.global_step, result.resumed_from, result.final_model) == (2, out / "checkpoint-2", out)
    assert "the run is complete: checkpoint-2 is at step 2" in caplog.text
    unchanged_run()

    # killed after checkpoint-2 but before the final model was published: it comes from checkpoint-2, no step is
    # trained
    monkeypatch.setattr(ictrl.models, "load_model_and_tokenizer", real_loader)
    for name in ("config.json", "trainer_state.json", "manifest.json"):  # what a kill mid-publish leaves
        (out / name).unlink(missing_ok=True)
    caplog.clear()
    with caplog.at_level("WARNING", logger="ictrl.train"):
        result = train(cfg, resume=True)
    assert result.global_step == 2
    assert "no step left to train" in caplog.text
    unchanged_run()


def test_a_checkpoint_without_its_training_state_names_what_it_lacks(tmp_path: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    """save_only_model (or lost files): refused in one line naming each missing part, unless the user accepts an
    inexact resume, when one line says what will differ."""
    import logging
    from types import SimpleNamespace

    from ictrl.checkpoints import CheckpointState
    from ictrl.train_cli.exact_resume import INEXACT_FLAG, NEW_SCHEDULE_FLAG, check_exact, missing_state
    from ictrl.errors import ConfigError
    from ictrl.train_cli.cli import RESUME_FLAGS

    assert RESUME_FLAGS == (INEXACT_FLAG, NEW_SCHEDULE_FLAG)  # the command's flags are the engine's names
    args = SimpleNamespace(world_size=1, save_only_model=True, lr_scheduler_type="linear")
    full = tmp_path / "checkpoint-2"
    full.mkdir()
    for name in ("model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json"):
        (full / name).write_text("x")
    assert missing_state(full, args) == []
    resumed = CheckpointState(full, step=2, recorded_max_steps=0, world_size=1)
    check_exact(resumed, args, accept=False)  # complete: nothing said
    (full / "optimizer.pt").unlink()
    (full / "rng_state.pth").unlink()
    with pytest.raises(ConfigError) as refused:
        check_exact(resumed, args, accept=False, source="run.yaml")
    line = str(refused.value)
    assert line.startswith(f"run.yaml: --resume: {full} has no optimizer state (optimizer.pt), no RNG state "
                           "(rng_state.pth) (save_only_model: true writes the weights alone)")
    assert INEXACT_FLAG in line and "\n" not in line
    assert missing_state(full, SimpleNamespace(world_size=2))[-1] == "RNG state (rng_state_0.pth, rng_state_1.pth)"
    with caplog.at_level(logging.WARNING, logger="ictrl.train"):
        check_exact(resumed, args, accept=True)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and said[0].startswith(f"{INEXACT_FLAG}: resuming from {full}")
    assert "the optimizer starts fresh" in said[0] and "sampling draws from the seed's start" in said[0]
    # scheduler.pt is there, but Trainer restores the optimizer and the scheduler together or neither
    assert "the linear learning-rate schedule starts again from its first step" in said[0]


def test_a_longer_run_on_a_decaying_schedule_resumes_when_asked_by_name(tmp_path: Path,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    import logging
    from types import SimpleNamespace

    import yaml

    from ictrl.train_cli.exact_resume import NEW_SCHEDULE_FLAG, check_unchanged
    from ictrl.errors import ConfigError

    args = SimpleNamespace(lr_scheduler_type="linear", warmup_steps=0)
    saved = tmp_path / "config.yaml"
    before = {"model_name_or_path": "m", "learning_rate": 2e-4, "max_steps": 3}
    saved.write_text(yaml.safe_dump(before))
    with pytest.raises(ConfigError, match=rf"max_steps: 3 -> 6 .*pass {NEW_SCHEDULE_FLAG} to resume on the new"):
        check_unchanged(saved, {**before, "max_steps": 6}, args)
    with caplog.at_level(logging.WARNING, logger="ictrl.train"):
        check_unchanged(saved, {**before, "max_steps": 6}, args, new_schedule=True)
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [NEW_SCHEDULE_FLAG]
    said = caplog.records[0].getMessage()
    assert "max_steps changed (3 -> 6): the steps taken followed the linear learning-rate schedule over the old " \
           "length; the first resumed step keeps the rate the old schedule set for it" in said
    with pytest.raises(ConfigError, match=r"learning_rate: 0.0002 -> 0.001") as other:  # the flag frees the length only
        check_unchanged(saved, {**before, "max_steps": 6, "learning_rate": 1e-3}, args, new_schedule=True)
    assert NEW_SCHEDULE_FLAG not in str(other.value)


def test_the_final_save_under_fsdp_writes_the_gathered_weights_whatever_the_plugins_type(
        tmp_path: Path, tiny_model_dir: Path) -> None:
    """``save_final`` under FSDP: every process gathers (accelerate's ``get_state_dict``, a collective, full
    whatever the plugin's state dict type; Trainer.save_model writes nothing under SHARDED_STATE_DICT) and only
    the main process writes: the gathered weights, the tokenizer and the training arguments, as save_model does."""
    from types import SimpleNamespace

    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerState

    from ictrl.engine.resumable import save_final

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    gathered = {k: v + 1.0 for k, v in model.state_dict().items()}  # stands for the weights gathered from shards
    gathers: list[int] = []

    def trainer(rank: int, model: Any = model, gathered: dict = gathered) -> SimpleNamespace:
        accelerator = SimpleNamespace(wait_for_everyone=lambda: None, unwrap_model=lambda m: m,
                                      get_state_dict=lambda m: gathers.append(rank) or gathered, state=None)
        return SimpleNamespace(is_fsdp_enabled=True, model=model, accelerator=accelerator, state=TrainerState(),
                               args=SimpleNamespace(should_save=rank == 0, device=None),
                               processing_class=AutoTokenizer.from_pretrained(tiny_model_dir),
                               save_model=lambda _: pytest.fail("save_model writes no weights when sharded"))

    _lora_adapter_is_saved_from_the_gathered_weights(trainer, tmp_path, tiny_model_dir)
    gathers.clear()
    out = tmp_path / "out"
    save_final(trainer(1), tmp_path / ".staging-final", out)
    assert gathers == [1] and not out.exists()  # the other process gathered and wrote nothing
    save_final(trainer(0), tmp_path / ".staging-final", out)
    assert gathers == [1, 0]
    names = {p.name for p in out.iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer_config.json", "training_args.bin",
            "trainer_state.json", "manifest.json"} <= names, names
    saved = AutoModelForCausalLM.from_pretrained(out).state_dict()
    assert saved.keys() == gathered.keys()
    assert all(torch.equal(saved[k], gathered[k]) for k in gathered)


def _lora_adapter_is_saved_from_the_gathered_weights(trainer: Any, tmp_path: Path, tiny_model_dir: Path) -> None:
    """A LoRA run under FSDP: the adapter (only) is written from the gathered state dict."""
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from ictrl.engine.resumable import save_final

    peft = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                          LoraConfig(task_type="CAUSAL_LM", r=4, target_modules=["q_proj"]))
    gathered = {k: v + 1.0 for k, v in peft.state_dict().items()}
    out = tmp_path / "lora"
    save_final(trainer(0, peft, gathered), tmp_path / ".staging-lora", out)
    saved = load_file(out / "adapter" / "adapter_model.safetensors")
    lora = {k for k in gathered if "lora_" in k}
    assert saved and len(saved) == len(lora)
    for name, tensor in saved.items():  # peft's names drop the adapter's name from the key
        (full,) = [k for k in lora if k.replace(".default", "") == name]
        assert torch.equal(tensor, gathered[full])
    assert not (out / "model.safetensors").exists()  # the weights are shards: no merged model


def test_rotation_deletes_only_checkpoints_ictrl_wrote(tmp_path: Path) -> None:
    """``save_total_limit`` counts and deletes the checkpoints ictrl listed in ``.ictrl-files.json``: a user's own
    ``checkpoint-N`` folders (one numbered past the run's) are neither deleted nor taken for the newest."""
    from ictrl.engine.resumable import Resumable

    for name in ("checkpoint-0", "checkpoint-100"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "notes.txt").write_text("a user's")
    for step in (1, 2, 3):
        trainer = _FakeTrainer(tmp_path, step)
        trainer.args.save_total_limit = 1
        Resumable(trainer).save_checkpoint(trainer._save_checkpoint, None, None)
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-0", "checkpoint-100", "checkpoint-3"]
    assert (tmp_path / "checkpoint-100" / "notes.txt").read_text() == "a user's"


def test_no_checkpoint_keeps_a_token_in_its_training_args(tmp_path: Path) -> None:
    """The Trainer pickles its arguments into every checkpoint, the final model and a hub push
    (``training_args.bin``): the pickle holds no ``hub_token`` (nor a ``token`` in ``model_init_kwargs``), which
    the trainer keeps in memory."""
    import mp_worker as w

    args = w.make_config(tmp_path / "out", token_selector="ict")
    args.hub_token, args.model_init_kwargs = "hf_secret_1", {"token": "hf_secret_2", "dtype": "float32"}
    torch.save(args, tmp_path / "training_args.bin")
    data = (tmp_path / "training_args.bin").read_bytes()
    assert b"hf_secret" not in data and b"float32" in data
    assert args.hub_token == "hf_secret_1" and args.model_init_kwargs["token"] == "hf_secret_2"
    saved = torch.load(tmp_path / "training_args.bin", weights_only=False)
    assert saved.hub_token is None and saved.model_init_kwargs == {"dtype": "float32"}
    assert saved.selector.name == args.selector.name  # the rest as pickled before
    assert "hf_secret" not in args.to_json_string()  # what trackers record (tensorboard, wandb)


def test_the_resumed_steps_rates_are_the_schedules(tmp_path: Path) -> None:
    """``resumed_rates`` against the linear schedule written out: restored, step k+1 keeps the saved last rate and
    step s > k+1 takes lr (T - (s - 1)) / T over the new length T; without the optimizer (nothing restored) step s
    takes lr (T - (s - k - 1)) / T; past four steps, the first three and the last."""
    import json
    from types import SimpleNamespace

    import torch

    from ictrl.checkpoints import checkpoint_state
    from ictrl.train_cli.exact_resume import resumed_rates

    checkpoint = tmp_path / "checkpoint-2"
    checkpoint.mkdir()
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 2, "log_history": []}))
    torch.save({"_last_lr": [0.000123]}, checkpoint / "scheduler.pt")
    (checkpoint / "optimizer.pt").write_text("x")
    args = SimpleNamespace(max_steps=10, learning_rate=1e-3, lr_scheduler_type="linear", lr_scheduler_kwargs=None,
                           get_warmup_steps=lambda steps: 0)

    def linear(n: int) -> str:
        return f"{1e-3 * (10 - n) / 10:.3g}"

    resumed = checkpoint_state(checkpoint)
    assert resumed_rates(resumed, args) == (f": step 3 at 0.000123, step 4 at {linear(3)}, step 5 at {linear(4)}, "
                                            f"..., step 10 at {linear(9)}")
    (checkpoint / "optimizer.pt").unlink()
    assert resumed_rates(resumed, args) == (f": step 3 at {linear(0)}, step 4 at {linear(1)}, step 5 at "
                                            f"{linear(2)}, ..., step 10 at {linear(7)}")
    assert resumed_rates(resumed, SimpleNamespace(**{**vars(args), "max_steps": -1})) == ""


def test_a_run_whose_config_yaml_holds_model_init_kwargs_as_json_text_resumes(tmp_path: Path) -> None:
    """An older ictrl wrote ``--model_init_kwargs='{...}'`` into config.yaml as TRL's JSON text (its token
    included); the run config now holds the mapping. The resume compares the two as one value: the same kwargs
    resume, other kwargs are named."""
    import json
    from types import SimpleNamespace

    import yaml

    from ictrl.errors import ConfigError
    from ictrl.train_cli.exact_resume import check_unchanged
    from ictrl.train_cli.run_config import config_from_dict, config_record

    given = {"dtype": "bfloat16", "token": "hf_secret_old"}
    saved = tmp_path / "config.yaml"
    saved.write_text(yaml.safe_dump({"model_name_or_path": "m", "output_dir": "o", "token_selector": "all",
                                     "model_init_kwargs": json.dumps(given)}))
    args = SimpleNamespace(lr_scheduler_type="linear", warmup_steps=0)

    def now(kwargs: dict[str, str]) -> dict[str, object]:
        return config_record(config_from_dict({"model_name_or_path": "m", "output_dir": "o"}, "run.yaml",
                                              [f"--model_init_kwargs={json.dumps(kwargs)}"]))

    check_unchanged(saved, now(given), args)
    with pytest.raises(ConfigError, match=r"model_init_kwargs.dtype: 'bfloat16' -> 'float32'"):
        check_unchanged(saved, now({**given, "dtype": "float32"}), args)
