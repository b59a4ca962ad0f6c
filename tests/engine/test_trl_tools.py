"""TRL's ``tools`` and ``environment_factory`` under ``ICTGRPOTrainer``: with ``token_selector: all`` the weights
after training equal stock ``trl.GRPOTrainer``'s (one environment and several, an environment that owns the reward
through ``get_reward`` or the data through ``reset``, malformed tool calls); under ICT the tool and environment
tokens (TRL's ``tool_mask`` 0) stay outside the selection.

The model is a tiny Qwen2 built from config; its byte-level tokenizer carries TRL's own Qwen3 chat template, which
TRL knows how to parse tool calls from. Generation is a deterministic stand-in that writes a tool call (a valid one,
one TRL cannot parse, one naming no tool, one whose arguments fail) on the first turn and a plain answer after a tool
result, the same for both trainer classes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from trl import GRPOConfig, GRPOTrainer

import mp_worker as w

COMMON = dict(use_cpu=True, bf16=False, report_to="none", save_strategy="no", num_generations=4,
              max_completion_length=192, optim="sgd", learning_rate=0.1, max_grad_norm=0.0, seed=0,
              disable_tqdm=True, dataloader_num_workers=0, per_device_train_batch_size=4, max_steps=2,
              logging_steps=1)


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a * b


class Counter:
    """An environment whose tool counts its calls and that owns the reward: the number of calls."""

    def reset(self, **kwargs: Any) -> str | None:
        self.calls = 0
        return None

    def multiply(self, a: int, b: int) -> int:
        """Multiply two integers.

        Args:
            a: The first integer.
            b: The second integer.
        """
        self.calls += 1
        return a * b

    def get_reward(self) -> float:
        return float(self.calls)


class Adder:
    """A second environment, with another tool and no reward of its own."""

    def reset(self, **kwargs: Any) -> str | None:
        return None

    def add(self, a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first integer.
            b: The second integer.
        """
        return a + b


class Asker(Counter):
    """An environment that owns the data: its reset gives the prompt (no train_dataset)."""

    def reset(self, **kwargs: Any) -> str | None:
        self.calls = 0
        return "What is 3 times 4?"


# The first turn of completion j of a group: a valid call, one TRL cannot parse, a call to a tool nobody offers, a
# call whose arguments the tool refuses; after a tool result, an answer.
FIRST_TURNS = (
    '<tool_call>\n{"name": "%s", "arguments": {"a": 3, "b": 4}}\n</tool_call><|im_end|>',
    '<tool_call>\n{"name": "%s", "arguments": {"a": 3,\n</tool_call><|im_end|>',
    '<tool_call>\n{"name": "divide", "arguments": {"a": 3, "b": 4}}\n</tool_call><|im_end|>',
    '<tool_call>\n{"name": "%s", "arguments": {"c": 1}}\n</tool_call><|im_end|>',
)


def tool_turns(tokenizer: Any, prompt_ids: list[list[int]], num_generations: int) -> list[list[int]]:
    out = []
    for i, ids in enumerate(prompt_ids):
        text = tokenizer.decode(ids)
        if "<tool_response>" in text:
            out.append(tokenizer.encode(f"The answer is {len(ids) % 10}.<|im_end|>"))
            continue
        template = FIRST_TURNS[i % num_generations % len(FIRST_TURNS)]
        tool = "add" if '"name": "add"' in text else "multiply"
        out.append(tokenizer.encode(template % tool if "%s" in template else template))
    return out


def _stub(base: type) -> type:
    class ToolStub(base):  # type: ignore[misc, valid-type]
        recorded: list[dict[str, Any]]

        def _generate_single_turn(self, prompt_ids: Any, images: Any, multimodal_fields: Any, num_generations: int,
                                  has_tool_images: bool = False) -> Any:
            return tool_turns(self.processing_class, prompt_ids, num_generations), None

        def _generate_and_score_completions(self, inputs: Any) -> Any:
            batch = super()._generate_and_score_completions(inputs)
            self.recorded = [*getattr(self, "recorded", []), {k: v for k, v in batch.items()}]
            return batch

    return ToolStub


@pytest.fixture(scope="module")
def tool_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trl.chat_template_utils import qwen3_chat_template

    from ictrl.models import build_byte_tokenizer, build_tiny_qwen2

    tokenizer = build_byte_tokenizer(chat_template=qwen3_chat_template)
    path = tmp_path_factory.mktemp("tool_model")
    build_tiny_qwen2(tokenizer, hidden_size=32, num_hidden_layers=1, max_position_embeddings=2048).save_pretrained(
        path)
    tokenizer.save_pretrained(path)
    return path


def _load(model_dir: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), tokenizer


def _chat_dataset(environments: list[str] | None = None) -> Any:
    from datasets import Dataset

    prompts = [[{"role": "user", "content": f"What is {i} times {i + 1}?"}] for i in range(8)]
    columns: dict[str, Any] = {"prompt": prompts}
    if environments is not None:
        columns["environment"] = [environments[i % len(environments)] for i in range(8)]
    return Dataset.from_dict(columns)


def called(completions: list[Any], **kwargs: Any) -> list[float]:
    """A reward that differs within each group: the length of the rollout's messages, modulo 7."""
    return [float(len(json.dumps(c)) % 7) for c in completions]


CASES = {
    "tools": dict(reward_funcs=called, tools=[multiply]),
    "environment": dict(reward_funcs=called, environment_factory=Counter),
    "environment_reward_only": dict(environment_factory=Counter),
    "environments": dict(reward_funcs=called, environment_factory={"count": Counter, "add": Adder}),
    "environment_data": dict(environment_factory=Asker),
}


def _train(model_dir: Path, out: Path, cls: type, args: Any, case: str) -> Any:
    model, tokenizer = _load(model_dir)
    kwargs = dict(CASES[case])
    if case == "environments":
        kwargs["train_dataset"] = _chat_dataset(["count", "add"])
    elif case != "environment_data":
        kwargs["train_dataset"] = _chat_dataset()
    trainer = cls(model=model, args=args, processing_class=tokenizer, **kwargs)
    trainer.train()
    return trainer


@pytest.mark.parametrize("case", list(CASES))
def test_tools_and_environments_train_as_trl(tool_model_dir: Path, tmp_path: Path, case: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from ictrl.engine.trainer import ICTGRPOTrainer

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    params, trainers = [], []
    for name, base in (("trl", GRPOTrainer), ("ictrl", ICTGRPOTrainer)):
        trainer = _train(tool_model_dir, tmp_path / name, _stub(base), GRPOConfig(str(tmp_path / name), **COMMON),
                         case)
        trainers.append(trainer)
        params.append({k: v.detach().clone() for k, v in trainer.model.named_parameters()})
    theirs, ours = trainers
    assert type(ours.args).__name__ == "ICTGRPOConfig" and ours.args.token_selector == "all"
    for batch in theirs.recorded:  # the stand-in's tool calls reached TRL's loop: tool output is masked out
        assert bool((batch["tool_mask"] == 0).any())
    start = dict(_load(tool_model_dir)[0].named_parameters())
    assert max(float((params[0][k] - start[k]).abs().max()) for k in start) > 1e-4
    for k in start:
        torch.testing.assert_close(params[1][k], params[0][k], rtol=1e-4, atol=1e-7, msg=k)
    assert ours.state.log_history[0]["tools/call_frequency"] == theirs.state.log_history[0]["tools/call_frequency"]
    assert ours.state.log_history[0]["tools/failure_frequency"] > 0  # the malformed calls reached TRL's count


@pytest.mark.parametrize("case", ["tools", "environments", "environment_data"])
def test_ict_selects_no_tool_or_environment_token(tool_model_dir: Path, tmp_path: Path, case: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from ictrl.engine.trainer import ICTGRPOTrainer

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    ict = {**COMMON, "token_selector": "ict", "selection_warmup_steps": 0, "selection_ratio": 0.5,
           "selection_scope": "response"}
    cls = _stub(ICTGRPOTrainer)
    cls.one_pass = False  # the separate statistics pass: each recorded batch carries its statistics
    trainer = _train(tool_model_dir, tmp_path, cls, w.make_config(tmp_path, **ict), case)
    assert trainer.recorded
    for batch in trainer.recorded:
        tool = (batch["tool_mask"] == 0) & batch["completion_mask"].bool()
        selected = w.select_now(trainer, batch).bool()
        assert bool(tool.any()) and bool(selected.any())
        assert not bool((selected & tool).any())
        # ratio 0.5 of each response's own tokens: the tool output is not counted among them
        own = (batch["completion_mask"].bool() & ~tool).sum(1)
        assert torch.equal(selected.sum(1), torch.ceil(0.5 * own).long())
