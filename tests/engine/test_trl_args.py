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

    class StockStub(GRPOTrainer):
        def _generate_single_turn(self, prompt_ids: Any, images: Any, multimodal_fields: Any, num_generations: int,
                                  has_tool_images: bool = False) -> Any:
            return [w.stub_completion(p, i % num_generations) for i, p in enumerate(prompt_ids)], None

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
