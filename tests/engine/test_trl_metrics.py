"""ICTGRPOTrainer logs every metric TRL's GRPOTrainer logs for the same options, under TRL's names, with ``ictrl/*``
beside them, and TRL's loss metrics carry TRL's values."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from trl import GRPOConfig

import mp_worker as w
from test_trainer import _load

COMMON = dict(use_cpu=True, bf16=False, report_to="none", save_strategy="no", num_generations=4,
              max_completion_length=12, learning_rate=0.1, seed=0, disable_tqdm=True, dataloader_num_workers=0,
              per_device_train_batch_size=8, max_steps=2, logging_steps=1)


_StockStub = w.stock_stub_class()


def _logs(cls: type, args: Any, tiny_model_dir: Path) -> list[dict[str, float]]:
    model, tokenizer = _load(tiny_model_dir)
    trainer = cls(model=model, reward_funcs=w.digit_reward, args=args, train_dataset=w.make_dataset(),
                  processing_class=tokenizer)
    trainer.train()
    return [h for h in trainer.state.log_history if "loss" in h]


@pytest.mark.parametrize("options", [{}, {"beta": 0.1, "loss_type": "grpo", "importance_sampling_level": "sequence"},
                                     {"loss_type": "cispo", "epsilon_high": 5.0}, {"loss_type": "vespo"}])
def test_ictrl_logs_every_key_trl_logs(tiny_model_dir: Path, tmp_path: Path, options: dict[str, Any]) -> None:
    stock = _logs(_StockStub, GRPOConfig(output_dir=str(tmp_path / "trl"), **COMMON, **options), tiny_model_dir)
    ours = _logs(w.stub_trainer_class(one_pass=True),
                 w.make_config(tmp_path / "ictrl", token_selector="all", **COMMON, **options), tiny_model_dir)
    assert len(stock) == len(ours) == 2
    for theirs, mine in zip(stock, ours):
        missing = set(theirs) - set(mine)
        assert not missing, sorted(missing)
        assert any(k.startswith("ictrl/") for k in mine)
        # the same batch and weights at the first step: TRL's loss metrics agree
        for key in ("entropy", "kl", "clip_ratio/region_mean", "cispo_clip_ratio", "vespo/phi_seq_mean"):
            if key in theirs and theirs is stock[0]:
                assert mine[key] == pytest.approx(theirs[key], rel=1e-4, abs=1e-6), key
