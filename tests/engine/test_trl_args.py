"""A plain ``trl.GRPOConfig`` given to ``ICTGRPOTrainer`` becomes an ``ICTGRPOConfig`` with every field it set and
TRL's GRPO (token_selector 'all', TRL's normaliser), said in one log line; the trainer then steps as TRL's."""

from __future__ import annotations

import logging
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
import torch
from trl import GRPOConfig, GRPOTrainer

import mp_worker as w
from test_trainer import _load

COMMON = dict(use_cpu=True, bf16=False, report_to="none", save_strategy="no", num_generations=4,
              max_completion_length=12, optim="sgd", learning_rate=0.1, max_grad_norm=0.0, seed=0,
              disable_tqdm=True, dataloader_num_workers=0, per_device_train_batch_size=4,
              gradient_accumulation_steps=2, max_steps=1)


@pytest.mark.parametrize("extra", [{}, {"loss_type": "grpo", "beta": 0.1, "scale_rewards": False,
                                        "steps_per_generation": 4, "epsilon_high": 0.28}])
def test_converted_config_keeps_every_field_and_runs_trl_grpo(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                             extra: dict[str, Any]) -> None:
    from ictrl.engine.config import ICTGRPOConfig
    from ictrl.engine.trl_args import as_ict_config

    given = GRPOConfig(output_dir=str(tmp_path), **{**COMMON, **extra})
    with caplog.at_level(logging.WARNING, logger="ictrl"):
        converted = as_ict_config(given)
    assert isinstance(converted, ICTGRPOConfig)
    differ = [f.name for f in fields(given) if getattr(converted, f.name) != getattr(given, f.name)]
    assert differ == []
    reference = ICTGRPOConfig(output_dir=str(tmp_path), token_selector="all", **{**COMMON, **extra})
    assert converted.token_selector == "all" and converted.selector.trl_loss
    assert converted.loss_normalization == reference.loss_normalization
    lines = [r.getMessage() for r in caplog.records if "converted to ICTGRPOConfig" in r.getMessage()]
    assert len(lines) == 1, caplog.text
    assert "running TRL's GRPO (method grpo" in lines[0] and "token_selector 'all'" in lines[0]
    assert as_ict_config(converted) is converted  # an ICTGRPOConfig is taken as is


def test_trainer_given_a_trl_config_steps_as_trl(tiny_model_dir: Path, tmp_path: Path) -> None:
    """One SGD step (two micro-batches) of ICTGRPOTrainer given a plain GRPOConfig equals TRL's GRPOTrainer's."""

    StockStub = w.stock_stub_class()

    params = []
    for name, cls in (("trl", StockStub), ("ictrl", w.stub_trainer_class(one_pass=True))):
        model, tokenizer = _load(tiny_model_dir)
        trainer = cls(model=model, reward_funcs=w.digit_reward, args=GRPOConfig(output_dir=str(tmp_path / name),
                                                                                 **COMMON),
                      train_dataset=w.make_dataset(), processing_class=tokenizer)
        assert type(trainer.args).__name__ == ("GRPOConfig" if name == "trl" else "ICTGRPOConfig")
        trainer.train()
        params.append({k: v.detach().clone() for k, v in trainer.model.named_parameters()})
    start = dict(_load(tiny_model_dir)[0].named_parameters())
    assert max(float((params[0][k] - start[k]).abs().max()) for k in start) > 1e-4
    for k in start:
        torch.testing.assert_close(params[1][k], params[0][k], rtol=1e-4, atol=1e-7, msg=k)


def test_no_args_is_trls_quick_start(tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     caplog: pytest.LogCaptureFixture) -> None:
    """``ICTGRPOTrainer(model, reward_funcs, train_dataset=ds)``, TRL's quick start: the arguments TRL makes
    (``GRPOConfig("<model>-GRPO")``, every field), TRL's GRPO, said in one line."""
    from ictrl.engine.trainer import ICTGRPOTrainer

    import transformers.training_args

    monkeypatch.chdir(tmp_path)
    # TRL's defaults ask for bf16, which TrainingArguments refuses without a GPU unless use_cpu is set: this
    # machine passes for a bf16 GPU, so both trainers build from the defaults alone (neither trains here)
    monkeypatch.setattr(transformers.training_args, "is_torch_bf16_gpu_available", lambda: True)
    made = []
    for cls in (GRPOTrainer, ICTGRPOTrainer):
        model, tokenizer = _load(tiny_model_dir)
        with caplog.at_level(logging.WARNING):
            trainer = cls(model, w.digit_reward, train_dataset=w.make_dataset(), processing_class=tokenizer)
        made.append(trainer.args)
    theirs, ours = made
    assert theirs.output_dir == ours.output_dir == f"{tiny_model_dir.name}-GRPO"
    differ = {f.name for f in fields(GRPOConfig) if getattr(theirs, f.name) != getattr(ours, f.name)}
    assert differ <= {"generation_batch_size"} and theirs.generation_batch_size == ours.generation_batch_size
    assert ours.token_selector == "all"
    assert any("no args: TRL's GRPOConfig(" in r.getMessage() for r in caplog.records)


def test_no_learning_signal_stops_ictrls_methods_only_unless_set(tmp_path: Path) -> None:
    """TRL's GRPO has no stop for a run without learning signal: a converted TRL config and token_selector 'all'
    train on (no_signal_steps 0); ictrl's methods stop after 20 such steps; a value the user sets is kept."""
    from ictrl.engine.config import ICTGRPOConfig
    from ictrl.engine.trl_args import as_ict_config

    assert as_ict_config(GRPOConfig(output_dir=str(tmp_path), **COMMON)).no_signal_steps == 0
    assert ICTGRPOConfig(output_dir=str(tmp_path), token_selector="all", **COMMON).no_signal_steps == 0
    assert ICTGRPOConfig(output_dir=str(tmp_path), token_selector="ict", **COMMON).no_signal_steps == 20
    assert ICTGRPOConfig(output_dir=str(tmp_path), token_selector="entropy", **COMMON).no_signal_steps == 20
    assert ICTGRPOConfig(output_dir=str(tmp_path), token_selector="all", no_signal_steps=5,
                         **COMMON).no_signal_steps == 5
    assert ICTGRPOConfig(output_dir=str(tmp_path), token_selector="ict", no_signal_steps=0,
                         **COMMON).no_signal_steps == 0


def test_a_stretch_without_signal_is_one_line_and_the_run_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    from ictrl.engine.reward_policy import NO_SIGNAL_STEPS, RewardPolicy

    policy = RewardPolicy(no_signal_steps=0, steps_per_batch=2, step=lambda: 7)
    with caplog.at_level(logging.WARNING, logger="ictrl"):
        for zero in [True] * 30 + [False] + [True] * 9 + [False] + [True] * 3:
            policy.observe_advantages(zero)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("no learning signal")]
    # 30 batches of 2 steps: one line at 20 steps; after a batch with signal, 9 batches reach 18 < 20: no line
    assert len(lines) == 1 and f"for {NO_SIGNAL_STEPS} optimizer steps in a row" in lines[0], lines
    assert "training on" in lines[0] and "no_signal_steps" in lines[0]
    with caplog.at_level(logging.WARNING, logger="ictrl"):
        for _ in range(10):  # a second stretch: its own line
            policy.observe_advantages(True)
    assert len([r for r in caplog.records if r.getMessage().startswith("no learning signal")]) == 2


def test_a_trl_run_without_learning_signal_trains_on_as_in_trl(tiny_model_dir: Path, tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """A constant reward (every advantage 0) for 25 steps, then one step with signal, then 21 more: TRL trains all
    47 steps; so does ICTGRPOTrainer given TRL's config, saying so once per stretch of 20."""
    calls = []

    def flat_then_one_varied(completions: list[str], **kwargs: Any) -> list[float]:
        calls.append(1)
        varied = len(calls) == 26
        return [float(i % 2) if varied else 1.0 for i in range(len(completions))]

    args = GRPOConfig(output_dir=str(tmp_path), **{**COMMON, "gradient_accumulation_steps": 1, "max_steps": 47})
    model, tokenizer = _load(tiny_model_dir)
    trainer = w.stub_trainer_class(one_pass=True)(model=model, reward_funcs=flat_then_one_varied, args=args,
                                                  train_dataset=w.make_dataset(), processing_class=tokenizer)
    with caplog.at_level(logging.WARNING, logger="ictrl"):
        trainer.train()
    assert trainer.state.global_step == 47 and len(calls) == 47
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("no learning signal")]
    assert len(lines) == 2 and all("for 20 optimizer steps in a row" in line for line in lines), lines


@pytest.mark.parametrize("cls_name", ["GRPOTrainer", "ICTGRPOTrainer"])
def test_no_reward_source_is_trls_error(tiny_model_dir: Path, tmp_path: Path, cls_name: str) -> None:
    """TRL 1.16's signature: reward_funcs may be left out (an environment can own the reward); with no reward
    source at all, TRL's own ValueError."""
    import inspect

    from ictrl.engine.trainer import ICTGRPOTrainer

    cls = {"GRPOTrainer": GRPOTrainer, "ICTGRPOTrainer": ICTGRPOTrainer}[cls_name]
    ours, theirs = (inspect.signature(c.__init__).parameters for c in (ICTGRPOTrainer, GRPOTrainer))
    assert [ours[n].default for n in ("reward_funcs", "args")] == [theirs[n].default for n in ("reward_funcs", "args")]
    model, tokenizer = _load(tiny_model_dir)
    with pytest.raises(ValueError, match=r"^No reward source provided\. Pass `reward_funcs`"):
        cls(model, args=GRPOConfig(output_dir=str(tmp_path), **COMMON), train_dataset=w.make_dataset(),
            processing_class=tokenizer)


def test_trls_own_checks_come_before_ictrls_missing_package_check(tiny_model_dir: Path, tmp_path: Path) -> None:
    """With liger-kernel absent, a LoRA adapter on ``lm_head`` is TRL's ValueError, as with stock GRPOTrainer; with
    nothing TRL refuses, ictrl's one line naming the missing package, still before training starts."""
    import importlib.util

    from peft import LoraConfig

    from ictrl.engine.trainer import ICTGRPOTrainer
    from ictrl.errors import MissingExtraError

    if importlib.util.find_spec("liger_kernel") is not None:
        pytest.skip("liger-kernel is installed here")
    args = GRPOConfig(output_dir=str(tmp_path), **{**COMMON, "use_liger_kernel": True})
    lora = LoraConfig(r=4, target_modules=["q_proj", "lm_head"])
    messages = []
    for cls in (GRPOTrainer, ICTGRPOTrainer):
        model, tokenizer = _load(tiny_model_dir)
        with pytest.raises(ValueError) as caught:
            cls(model, w.digit_reward, args=args, train_dataset=w.make_dataset(), processing_class=tokenizer,
                peft_config=lora)
        messages.append((type(caught.value), str(caught.value)))
    assert messages[0] == messages[1] and "Applying a PEFT adapter to `lm_head`" in messages[0][1]
    model, tokenizer = _load(tiny_model_dir)
    with pytest.raises(MissingExtraError, match="use_liger_kernel: needs the liger-kernel package"):
        ICTGRPOTrainer(model, w.digit_reward, args=args, train_dataset=w.make_dataset(), processing_class=tokenizer)


def test_a_converted_config_leaves_the_tracker_check_to_trl(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A tracker whose package is missing: stock GRPOTrainer and ICTGRPOTrainer given TRL's config raise the same
    exception (transformers', when the Trainer builds its callbacks); ictrl's own config still says it first."""
    import importlib.util

    from ictrl.engine.config import ICTGRPOConfig
    from ictrl.engine.trainer import ICTGRPOTrainer
    from ictrl.errors import MissingExtraError

    if importlib.util.find_spec("wandb") is not None:
        pytest.skip("wandb is installed here")
    args = GRPOConfig(output_dir=str(tmp_path), **{**COMMON, "report_to": ["wandb"]})
    raised = []
    for cls in (GRPOTrainer, ICTGRPOTrainer):
        model, tokenizer = _load(tiny_model_dir)
        with pytest.raises(Exception) as caught:
            cls(model, w.digit_reward, args=args, train_dataset=w.make_dataset(), processing_class=tokenizer)
        raised.append((type(caught.value), str(caught.value)))
    assert raised[0] == raised[1] and raised[0][0] is RuntimeError, raised
    with pytest.raises(MissingExtraError, match="report_to: wandb needs the 'wandb' package"):
        ICTGRPOConfig(output_dir=str(tmp_path), token_selector="ict", **{**COMMON, "report_to": "wandb"})
