"""DAPO overlong shaping on CPU: the soft overlong penalty (TRL's get_soft_overlong_punishment, weighted by the
penalty factor, added after the verifier reward) and truncation masking, with exact expected values."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import mp_worker as w

MAX_LEN, BUFFER, FACTOR = 8, 4, 0.5
# completion j of every group: its tokens before EOS and whether it ends with EOS
SHAPES = [(2, True), (5, True), (6, True), (MAX_LEN, False)]  # lengths with EOS: 3, 6, 7; the last one truncated


def expected_penalty(length: int) -> float:
    """DAPO Eq. 13 by hand: 0 up to L_max - cache, then linear down to -1 at L_max, -1 beyond."""
    if length <= MAX_LEN - BUFFER:
        return 0.0
    if length <= MAX_LEN:
        return (MAX_LEN - BUFFER - length) / BUFFER
    return -1.0


def shaped_trainer_class() -> type:
    from ictrl.engine.trainer import ICTGRPOTrainer

    class Shaped(ICTGRPOTrainer):
        recorded: list[dict[str, Any]]

        def _generate_single_turn(self, prompt_ids: list[list[int]], images: Any, multimodal_fields: Any,
                                  num_generations: int, has_tool_images: bool = False) -> tuple[list, None]:
            eos = self.eos_token_ids[0]
            out = []
            for i, _ in enumerate(prompt_ids):
                n, ends = SHAPES[i % num_generations]
                digit = ord("0") + (i // num_generations) % 10
                ids = [digit if i % 2 == 0 else ord("a")] + [ord("b")] * (n - 1)
                out.append(ids + [eos] if ends else ids)
            return out, None

        def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
            batch = super()._generate_and_score_completions(inputs)
            self.recorded = [*getattr(self, "recorded", []), {k: v for k, v in batch.items()}]
            return batch

    return Shaped


def test_penalty_values_are_dapo_eq_13() -> None:
    from trl.rewards import get_soft_overlong_punishment

    fn = get_soft_overlong_punishment(max_completion_len=MAX_LEN, soft_punish_cache=BUFFER)
    lengths = [1, 4, 5, 6, 7, 8, 9]
    assert fn([[0] * n for n in lengths]) == [expected_penalty(n) for n in lengths] == [
        0.0, 0.0, -0.25, -0.5, -0.75, -1.0, -1.0]


def trl_step(model_dir: Path, tmp_path: Path, reward_funcs: list[Any], **overrides: Any) -> Any:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    args = w.make_config(tmp_path, token_selector="all", max_steps=1, max_completion_length=MAX_LEN, **overrides)
    trainer = shaped_trainer_class()(model=model, reward_funcs=reward_funcs, args=args,
                                     train_dataset=w.make_dataset(), processing_class=tokenizer)
    trainer.train()
    return trainer


def check_shaped_batch(trainer: Any, masked: bool) -> None:
    """Rewards = digit reward + FACTOR x penalty per completion; advantages and masks recomputed in float64."""
    (batch,) = trainer.recorded
    G = trainer.num_generations
    lengths = [n + 1 if ends else n for n, ends in SHAPES]
    total = []
    for i in range(batch["completion_ids"].size(0)):
        verifier = 1.0 if i % 2 == 0 else 0.0  # completions 0, 2 of each group start with a digit
        total.append(verifier + FACTOR * expected_penalty(lengths[i % G]))
    r = torch.tensor(total, dtype=torch.float64).view(-1, G)
    adv = ((r - r.mean(dim=1, keepdim=True)) / (r.std(dim=1, keepdim=True) + 1e-4)).flatten()
    torch.testing.assert_close(batch["advantages"].double(), adv, atol=1e-5, rtol=1e-5)
    log = next(row for row in trainer.state.log_history if "reward" in row)
    assert log["reward"] == pytest.approx(sum(total) / len(total), abs=1e-6)
    rows_ok = batch["completion_mask"].sum(dim=1).tolist()
    truncated = [i % G == G - 1 for i in range(len(rows_ok))]
    for count, cut, i in zip(rows_ok, truncated, range(len(rows_ok))):
        assert count == (0 if (masked and cut) else lengths[i % G]), (i, count)


@pytest.mark.parametrize("masked", [False, True])
def test_trl_pieces_give_the_exact_shaped_rewards(tiny_model_dir: Path, tmp_path: Path, masked: bool) -> None:
    from trl.rewards import get_soft_overlong_punishment

    penalty = get_soft_overlong_punishment(max_completion_len=MAX_LEN, soft_punish_cache=BUFFER)
    trainer = trl_step(tiny_model_dir, tmp_path, [w.digit_reward, penalty], reward_weights=[1.0, FACTOR],
                       mask_truncated_completions=masked)
    check_shaped_batch(trainer, masked)


# ------------------------------------------------------------------------------------------ from the run config


def run_config(tmp_path: Path, *overrides: str) -> Any:
    from ictrl.train_cli.run_config import load_config

    cell = Path(__file__).resolve().parents[2] / "configs" / "qwen2.5-0.5b" / "ict.yaml"
    return load_config(cell, [f"--output_dir={tmp_path / 'out'}", f"--max_completion_length={MAX_LEN}",
                              "--reward_funcs=mp_worker:digit_reward", *overrides])


def built(tmp_path: Path, *overrides: str) -> tuple[Any, list[Any]]:
    from ictrl.train_cli.trainer_inputs import build_trainer_args
    from ictrl.train_cli.run_inputs import add_overlong_penalty, build_rewards

    cfg = run_config(tmp_path, *overrides)
    args = build_trainer_args(cfg, "test", cpu=True)
    funcs = build_rewards(cfg, "test")
    add_overlong_penalty(cfg, args, funcs, "test")
    return args, funcs


def test_the_reward_section_builds_trls_penalty_after_the_verifier(tmp_path: Path) -> None:
    args, funcs = built(tmp_path, f"--overlong_buffer_length={BUFFER}", f"--overlong_penalty_factor={FACTOR}")
    assert [f.__name__ for f in funcs] == ["digit_reward", "soft_overlong_punishment_reward"]
    assert (funcs[1].max_completion_len, funcs[1].soft_punish_cache) == (MAX_LEN, BUFFER)
    assert args.reward_weights == [1.0, FACTOR]
    args, funcs = built(tmp_path, f"--overlong_buffer_length={BUFFER}", "--reward_weights=2.0")
    assert args.reward_weights == [2.0, 1.0]
    args, funcs = built(tmp_path, "--overlong_buffer_length=null")  # off: nothing added
    assert len(funcs) == 1 and args.reward_weights is None


def test_a_buffer_as_long_as_the_completions_is_said(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="ictrl.train"):
        args, funcs = built(tmp_path, f"--overlong_buffer_length={MAX_LEN}")
    assert "overlong_buffer_length=8 >= max_completion_length=8: every completion gets an overlong penalty" in caplog.text
    assert funcs[-1]([[0] * 3]) == [pytest.approx((MAX_LEN - MAX_LEN - 3) / MAX_LEN)]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("--overlong_buffer_length=0", "overlong_buffer_length: must be >= 1, got 0"),
        ("--overlong_penalty_factor=-1", "overlong_penalty_factor: must be >= 0, got -1.0"),
    ],
)
def test_bad_overlong_settings_are_named(tmp_path: Path, override: str, message: str) -> None:
    from ictrl.train_cli.run_config import ConfigError

    with pytest.raises(ConfigError, match=message):
        built(tmp_path, override)


@pytest.mark.parametrize("masked", [False, True])
def test_config_built_shaping_gives_the_exact_rewards(tiny_model_dir: Path, tmp_path: Path, masked: bool) -> None:
    args, funcs = built(tmp_path, f"--overlong_buffer_length={BUFFER}",
                        f"--overlong_penalty_factor={FACTOR}", f"--mask_truncated_completions={masked}")
    assert args.mask_truncated_completions is masked
    trainer = trl_step(tiny_model_dir, tmp_path, funcs, reward_weights=args.reward_weights,
                       mask_truncated_completions=args.mask_truncated_completions)
    check_shaped_batch(trainer, masked)
