"""DAPO dynamic sampling (ictrl.engine.dynamic_sampling) on CPU with the tiny Qwen2."""

from __future__ import annotations

import math
import re
import statistics
from pathlib import Path
from typing import Any

import pytest
import torch

import mp_worker as w
from ictrl.engine.dynamic_sampling import draw_prompts, informative_groups, take_rows

G = 4


def naive_informative(rewards: list[float]) -> list[bool]:
    out = []
    for g in range(0, len(rewards), G):
        vals = [r for r in rewards[g:g + G] if not math.isnan(r)]
        out.append(len(vals) >= 2 and not math.isclose(statistics.stdev(vals), 0.0, abs_tol=1e-8))
    return out


def test_informative_groups_match_a_naive_reference() -> None:
    nan = float("nan")
    rewards = [1, 1, 1, 1,  0, 1, 0, 0,  0.5, 0.5, nan, 0.5,  nan, nan, nan, 2,  0.1, 0.2, nan, nan,
               0.3, 0.3, 0.3, 0.3 + 1e-12]
    got = informative_groups(torch.tensor(rewards, dtype=torch.float32), G).tolist()
    assert got == naive_informative(rewards) == [False, True, False, False, True, False]


def test_draw_is_a_function_of_seed_step_and_round() -> None:
    a = draw_prompts(16, 6, seed=0, step=3, round_index=1)
    assert a == draw_prompts(16, 6, seed=0, step=3, round_index=1)
    assert len(set(a)) == 6 and all(0 <= i < 16 for i in a)  # without replacement
    assert a != draw_prompts(16, 6, seed=0, step=3, round_index=2)
    assert a != draw_prompts(16, 6, seed=0, step=4, round_index=1)
    assert a != draw_prompts(16, 6, seed=1, step=3, round_index=1)
    big = draw_prompts(3, 10, seed=0, step=0, round_index=1)
    assert len(big) == 10 and set(big) <= {0, 1, 2}


def test_take_rows_repads_prompts_left_and_completions_right() -> None:
    pad = 99
    a = {"prompt_ids": torch.tensor([[pad, 1, 2], [3, 4, 5]]), "prompt_mask": torch.tensor([[0, 1, 1], [1, 1, 1]]),
         "completion_ids": torch.tensor([[7, 8], [9, pad]]), "completion_mask": torch.tensor([[1, 1], [1, 0]]),
         "advantages": torch.tensor([0.5, -0.5]), "old_per_token_logps": torch.tensor([[-1.0, -2.0], [-3.0, 0.0]]),
         "num_items_in_batch": torch.tensor(3)}
    b = {"prompt_ids": torch.tensor([[6], [6]]), "prompt_mask": torch.tensor([[1], [1]]),
         "completion_ids": torch.tensor([[1, 2, 3, pad], [4, pad, pad, pad]]),
         "completion_mask": torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]]), "advantages": torch.tensor([1.0, 2.0]),
         "old_per_token_logps": torch.tensor([[-4.0, -5.0, -6.0, 0.0], [-7.0, 0, 0, 0]]),
         "num_items_in_batch": torch.tensor(4)}
    out = take_rows([(a, torch.tensor([0])), (b, torch.tensor([1, 0]))], pad_token_id=pad)
    # a's row 0 has two prompt tokens, b's rows one: left-padded to two; the column of padding only is cut
    assert out["prompt_ids"].tolist() == [[1, 2], [pad, 6], [pad, 6]]
    assert out["prompt_mask"].tolist() == [[1, 1], [0, 1], [0, 1]]
    # completions padded right to the widest kept row (3 tokens); the all-padding 4th column is cut
    assert out["completion_ids"].tolist() == [[7, 8, pad], [4, pad, pad], [1, 2, 3]]
    assert out["completion_mask"].tolist() == [[1, 1, 0], [1, 0, 0], [1, 1, 1]]
    assert out["old_per_token_logps"].tolist() == [[-1.0, -2.0, 0.0], [-7.0, 0.0, 0.0], [-4.0, -5.0, -6.0]]
    assert out["advantages"].tolist() == [0.5, 2.0, 1.0]
    assert "num_items_in_batch" not in out
    with pytest.raises(ValueError, match="cannot merge the generation-batch field 'pixel_values'"):
        take_rows([({**a, "pixel_values": [1]}, torch.tensor([0]))], pad_token_id=pad)


def test_config_validates_the_fields(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="^dynamic_sampling_max_rounds: must be >= 0, got -1$"):
        w.make_config(tmp_path, dynamic_sampling=True, dynamic_sampling_max_rounds=-1)
    with pytest.raises(ValueError, match="^dynamic_sampling_max_rounds: expected int, got 1.5$"):
        w.make_config(tmp_path, dynamic_sampling=True, dynamic_sampling_max_rounds=1.5)
    with pytest.raises(ValueError, match="^dynamic_sampling: expected bool, got 'yes'$"):
        w.make_config(tmp_path, dynamic_sampling="yes")


# ------------------------------------------------------------------------------------------------ trainer


def prompt_index(prompt: Any) -> int:
    text = prompt if isinstance(prompt, str) else prompt[-1]["content"]
    return int(re.match(r"Q(\d+):", text).group(1))


def half_uniform_reward(prompts: list[Any], completions: list[str], **kwargs: Any) -> list[float]:
    """Prompts Q0, Q2, ... get 1.0 whatever the completion (a uniform group); odd ones the digit reward (the stub
    puts digits in completions 0 and 2 of each group, so those groups are informative)."""
    digit = w.digit_reward(prompts, completions)
    return [1.0 if prompt_index(p) % 2 == 0 else d for p, d in zip(prompts, digit)]


def constant_reward(prompts: list[Any], completions: list[str], **kwargs: Any) -> list[float]:
    return [0.5] * len(completions)


def _stub_trainer(model_dir: Path, out: Path, reward: Any, **overrides: Any) -> Any:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    args = w.make_config(out, **{"token_selector": "ict", "dynamic_sampling": True, **overrides})
    return w.stub_trainer_class()(model=model, reward_funcs=reward, args=args, train_dataset=w.make_dataset(),
                                  processing_class=tokenizer)


def _group_prompts(batch: dict[str, Any], tokenizer: Any) -> list[int]:
    texts = [tokenizer.decode(ids[m.bool()]) for ids, m in zip(batch["prompt_ids"], batch["prompt_mask"])]
    groups = [texts[i:i + G] for i in range(0, len(texts), G)]
    assert all(len(set(g)) == 1 for g in groups), "a group's rows must share one prompt"
    return [prompt_index(g[0]) for g in groups]


def test_every_step_has_its_full_count_of_informative_groups(tiny_model_dir: Path, tmp_path: Path) -> None:
    # 16 prompts per generation batch (per_device 16, G 4 -> 4 groups), 3 optimizer steps
    trainer = _stub_trainer(tiny_model_dir, tmp_path, half_uniform_reward, per_device_train_batch_size=16, max_steps=3)
    trainer.train()
    batches = trainer.recorded  # the final generation batches, after dynamic sampling and selection
    assert len(batches) == 3
    for batch in batches:
        prompts = _group_prompts(batch, trainer.processing_class)
        assert len(prompts) == 4 and all(p % 2 == 1 for p in prompts), prompts  # only informative groups
        adv = batch["advantages"].view(-1, G)
        assert bool((adv.std(dim=1) > 0).all())
        assert batch["ictrl_selected"].shape == batch["completion_mask"].shape
    logs = [row for row in trainer.state.log_history if "ictrl/informative_groups" in row]
    assert [row["ictrl/informative_groups"] for row in logs] == [4.0, 4.0, 4.0]
    # half of the data's groups are uniform, so the first round alone never fills a batch of 4
    assert all(row["ictrl/dynamic_sampling_rounds"] >= 1 for row in logs)
    assert all(row["ictrl/informative_groups_first_round"] < 4 for row in logs)


def test_the_cap_fills_with_uniform_groups_and_training_goes_on(tiny_model_dir: Path, tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    trainer = _stub_trainer(tiny_model_dir, tmp_path, constant_reward, per_device_train_batch_size=8, max_steps=1,
                            dynamic_sampling_max_rounds=2)
    with caplog.at_level("WARNING", logger="ictrl.engine.dynamic_sampling"):
        trainer.train()
    (batch,) = trainer.recorded
    assert batch["completion_ids"].size(0) == 8 and bool((batch["advantages"] == 0).all())
    row = next(r for r in trainer.state.log_history if "ictrl/informative_groups" in r)
    assert (row["ictrl/dynamic_sampling_rounds"], row["ictrl/informative_groups"]) == (2.0, 0.0)
    assert "0 of 2 groups informative after 2 extra rounds" in caplog.text


def test_off_is_the_plain_trainer(tiny_model_dir: Path, tmp_path: Path) -> None:
    trainer = _stub_trainer(tiny_model_dir, tmp_path, half_uniform_reward, per_device_train_batch_size=16,
                            max_steps=1, dynamic_sampling=False)
    trainer.train()
    assert not any("ictrl/informative_groups" in r for r in trainer.state.log_history)
    assert any(p % 2 == 0 for p in _group_prompts(trainer.recorded[0], trainer.processing_class))


def letters_or_uniform(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
    """Real sampled completions: even prompts uniform (1.0), odd ones the graded fraction of letters."""
    from ictrl.rewards import completion_text

    out = []
    for p, c in zip(prompts, completions):
        text = completion_text(c)
        out.append(1.0 if prompt_index(p) % 2 == 0 else sum(ch.isalpha() for ch in text) / max(len(text), 1))
    return out


TIMING = {"step_time", "ictrl/stats_time", "epoch", "train_runtime", "train_samples_per_second",
          "train_steps_per_second", "train_loss", "total_flos"}


@pytest.mark.integration
def test_resume_mid_run_reproduces_the_metrics(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Real sampling: 4 steps saving at 2, then a fresh trainer resumed from checkpoint-2 matches steps 3-4."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ictrl.engine.trainer import ICTGRPOTrainer

    def run(out: Path, resume: Path | None) -> list[dict[str, Any]]:
        tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
        args = w.make_config(out, token_selector="ict", dynamic_sampling=True, per_device_train_batch_size=8,
                             max_steps=4, save_strategy="steps", save_steps=2, learning_rate=1e-3, seed=3)
        trainer = ICTGRPOTrainer(model=model, reward_funcs=letters_or_uniform, args=args,
                                 train_dataset=w.make_dataset(6), processing_class=tokenizer)
        trainer.train(resume_from_checkpoint=str(resume) if resume else None)
        return [{k: v for k, v in r.items() if k not in TIMING} for r in trainer.state.log_history]

    full = run(tmp_path / "full", None)
    resumed = run(tmp_path / "resumed", tmp_path / "full" / "checkpoint-2")
    by_step = {r["step"]: r for r in full if "loss" in r}
    again = {r["step"]: r for r in resumed if "loss" in r and r["step"] > 2}
    assert sorted(again) == [3, 4]
    for step, row in again.items():
        assert row == pytest.approx(by_step[step], rel=1e-6, abs=1e-9), step
    assert all(r["ictrl/informative_groups"] == 2.0 for r in by_step.values())
    assert any(r["ictrl/dynamic_sampling_rounds"] > 0 for r in by_step.values())


def test_the_trl_hook_is_the_pinned_one() -> None:
    """Dynamic sampling reads the gathered rewards TRL's _calculate_rewards returns."""
    import inspect

    from trl import GRPOTrainer

    from ictrl.engine.trainer import ICTGRPOTrainer

    assert list(inspect.signature(GRPOTrainer._calculate_rewards).parameters) == [
        "self", "inputs", "prompts", "completions", "completion_ids_list"]
    assert "rewards_per_func = gather(rewards_per_func)" in inspect.getsource(GRPOTrainer._calculate_rewards)
    assert ICTGRPOTrainer.__mro__ == (ICTGRPOTrainer, *GRPOTrainer.__mro__)  # a part composed in, not a mixin
    source = inspect.getsource(ICTGRPOTrainer._generate_and_score_completions)
    assert "self.batch_filter.generate(super()._generate_and_score_completions, inputs)" in source


@pytest.mark.integration
def test_two_processes_keep_whole_informative_groups(tiny_model_dir: Path, tmp_path: Path) -> None:
    """torchrun, 2 CPU processes (gloo): each process's final batch is 2 whole groups, all informative; both
    processes run the same rounds and log the same global counts."""
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    worker = Path(__file__).with_name("ds_worker.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(port), str(worker), str(tmp_path), str(tiny_model_dir)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    assert [r["world"] for r in ranks] == [2, 2]
    for r in ranks:
        assert len(r["batches"]) == 2
        for batch in r["batches"]:
            prompts = _group_prompts(batch, tokenizer)
            assert len(prompts) == 2 and all(p % 2 == 1 for p in prompts), prompts
            assert bool((batch["advantages"].view(-1, G).std(dim=1) > 0).all())
    logs = [[row for row in r["log"] if "ictrl/informative_groups" in row] for r in ranks]
    for key in ("ictrl/informative_groups", "ictrl/dynamic_sampling_rounds", "ictrl/informative_groups_first_round"):
        assert [row[key] for row in logs[0]] == [row[key] for row in logs[1]], key
    assert [row["ictrl/informative_groups"] for row in logs[0]] == [4.0, 4.0]
