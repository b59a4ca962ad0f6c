"""selection_topk from the sampler: the top-K log-probs recorded at generation feed the ICT score.

Real transformers generation on the tiny Qwen2 (tests/conftest.py ``tiny_model_dir``); the vLLM path is driven by a
fake ``VLLMGeneration`` that samples with the same model and answers in vLLM's format (entries sorted by rank, the
sampled token appended when outside the top K), so TRL's own vLLM branch of ``_generate_single_turn`` runs.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

import mp_worker as w
from ictrl.core import reference as core_ref
from ictrl.engine.sampler_topk import pad_rows, split_vllm_logprobs
from ictrl.engine.trainer import ICTGRPOTrainer


def _load(model_dir: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), tokenizer


def _trainer(model_dir: Path, tmp_path: Path, **overrides: Any) -> ICTGRPOTrainer:
    model, tokenizer = _load(model_dir)
    return ICTGRPOTrainer(model=model, reward_funcs=w.digit_reward, args=w.make_config(tmp_path, **overrides),
                          train_dataset=w.make_dataset(), processing_class=tokenizer)


def _inputs(trainer: Any, n_prompts: int = 2) -> list[dict[str, str]]:
    return [{"prompt": p} for p in w.PROMPTS[:n_prompts] for _ in range(trainer.num_generations)]


def _capture_stats(trainer: Any) -> list[dict[str, Any]]:
    """Record the arguments and results of each statistics pass."""
    calls: list[dict[str, Any]] = []
    original = trainer._selection_stats

    def recording(batch: Any, mask: Any, group_ids: Any, sampler_topk: Any = None) -> Any:
        stats, js = original(batch, mask, group_ids, sampler_topk)
        calls.append({"batch": batch, "mask": mask, "sampler_topk": sampler_topk, "js": js})
        return stats, js

    trainer._selection_stats = recording
    return calls


@pytest.fixture
def no_head_topk(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the statistics pass's top-K sweeps over the LM head (there must be none with the sampler source)."""
    import ictrl.engine.stats_pass as stats_pass_module

    calls: list[int] = []
    original = stats_pass_module.topk_log_softmax

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(stats_pass_module, "topk_log_softmax", counting)
    return calls


def _full_logits(trainer: Any, batch: dict[str, Any]) -> torch.Tensor:
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    P, T = batch["prompt_ids"].size(1), batch["completion_ids"].size(1)
    with torch.no_grad():
        return trainer.model(input_ids=ids, attention_mask=attention).logits[:, P - 1:P + T - 1].double()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_generation_topk_at_k_equals_v_is_the_exact_ict_score(tiny_model_dir: Path, tmp_path: Path,
                                                              no_head_topk: list[int], temperature: float) -> None:
    V = 259  # the tiny model's vocabulary
    trainer = _trainer(tiny_model_dir, tmp_path, token_selector="ict", selection_topk=V,
                       selection_topk_source="sampler", temperature=temperature, top_p=0.9, top_k=50)
    assert trainer._sampler_topk == V
    calls = _capture_stats(trainer)
    trainer.model.train()
    trainer._generate_and_score_completions(_inputs(trainer))
    (call,) = calls
    assert no_head_topk == []  # the top-K came from generation, not from a second sweep over the head
    batch, mask = call["batch"], call["mask"]
    lp, ids = call["sampler_topk"]
    B, T = mask.shape
    assert lp.shape == (B, T, V) and ids.shape == (B, T, V)
    logits = _full_logits(trainer, batch)
    # What is recorded: log_softmax(logits / temperature) of the model, untruncated by top_p/top_k (the
    # statistics pass's distribution), equal to a float64 full forward within float tolerance.
    reference = torch.log_softmax(logits / temperature, -1).gather(-1, ids.long())
    assert torch.allclose(lp.double()[mask], reference[mask], atol=2e-5)
    groups = torch.arange(B) // trainer.num_generations
    exact = core_ref.group_js(logits, mask, groups, temperature)
    assert float(exact[mask].max()) > 1e-3  # groups whose responses differ
    torch.testing.assert_close(call["js"].double(), exact, atol=2e-6, rtol=1e-4)
    assert trainer._metrics["train"]["ictrl/topk_from_sampler"] == [1.0]


def test_small_k_from_generation_matches_head_topk(tiny_model_dir: Path, tmp_path: Path) -> None:
    """At K < V the sampler's top-K and the head's top-K of the same batch give the same ICT score."""
    trainer = _trainer(tiny_model_dir, tmp_path, token_selector="ict", selection_topk=8, temperature=0.8)
    assert trainer._sampler_topk == 8  # 'auto' takes the sampler with transformers generate
    calls = _capture_stats(trainer)
    trainer.model.train()
    trainer._generate_and_score_completions(_inputs(trainer))
    (call,) = calls
    groups = torch.arange(call["mask"].size(0)) // trainer.num_generations
    _, head_js = ICTGRPOTrainer._selection_stats(trainer, call["batch"], call["mask"], groups)  # head top-K
    torch.testing.assert_close(call["js"], head_js, atol=2e-5, rtol=1e-4)


def test_auto_falls_back_to_the_head_and_sampler_refuses(tiny_model_dir: Path, tmp_path: Path,
                                                         no_head_topk: list[int]) -> None:
    trainer = _trainer(tiny_model_dir, tmp_path, token_selector="ict", selection_topk=8, repetition_penalty=1.2)
    assert trainer._sampler_topk is None  # a repetition penalty changes the sampler's logits
    trainer.one_pass = False  # the statistics pass runs at generation (else in the loss, ictrl.engine.onepass)
    trainer.model.train()
    trainer._generate_and_score_completions(_inputs(trainer))
    assert no_head_topk and trainer._metrics["train"]["ictrl/topk_from_sampler"] == [0.0]
    with pytest.raises(ValueError, match="selection_topk_source='sampler': repetition_penalty"):
        _trainer(tiny_model_dir, tmp_path, token_selector="ict", selection_topk=8, repetition_penalty=1.2,
                 selection_topk_source="sampler")
    head = _trainer(tiny_model_dir, tmp_path, token_selector="ict", selection_topk=8, selection_topk_source="head")
    entropy = _trainer(tiny_model_dir, tmp_path, token_selector="entropy", selection_topk=8)
    assert head._sampler_topk is None and entropy._sampler_topk is None  # entropy needs no ICT score


def test_split_vllm_logprobs_picks_the_sampled_token() -> None:
    # position 0: sampled token 7 is the top-1; position 1: sampled 9 lies outside the top 2 and comes last
    logprobs = [[[-0.5, -2.5], [-0.25, -1.5, -4.0]], [[None, -0.75]]]
    token_ids = [[[7, 3], [2, 5, 9]], [[4, 1]]]
    sampled, rows = split_vllm_logprobs(logprobs, token_ids, [[7, 9], [1]], k=2)
    assert sampled == [[[-0.5], [-4.0]], [[-0.75]]]
    assert rows[0][0].tolist() == [[-0.5, -2.5], [-0.25, -1.5]] and rows[0][1].tolist() == [[7, 3], [2, 5]]
    assert rows[1][0][0, 0].item() == -math.inf  # unreported: probability 0
    lp, ids = pad_rows(rows, 3, torch.device("cpu"))
    assert lp.shape == (2, 3, 2) and ids[1, 0].tolist() == [4, 1] and lp[1, 1:].abs().sum() == 0
    with pytest.raises(RuntimeError, match="2 positions of a 1-token"):
        split_vllm_logprobs([[[-0.1], [-0.2]]], [[[1], [2]]], [[1]], k=1)


class FakeVLLM:
    """VLLMGeneration's generate() contract, sampling with the training model itself (CPU). Reports the top
    ``logprobs`` entries by rank plus the sampled token when outside them; ``shift`` + ``jitter`` · N(0, 1) is added
    to the sampled token's reported log-prob to mimic a sampler whose numerics differ from the trainer's."""

    def __init__(self, model: Any, tokenizer: Any, temperature: float, max_tokens: int, shift: float = 0.0,
                 jitter: float = 0.0) -> None:
        self.model, self.tokenizer, self.temperature, self.max_tokens = model, tokenizer, temperature, max_tokens
        self.shift, self.jitter = shift, jitter
        self.logprobs = 0
        self.synced = 0

    def sync_weights(self) -> None:
        self.synced += 1

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], images: Any, num_generations: int, profiler: Any = None) -> Any:
        g = torch.Generator().manual_seed(len(prompts) + self.synced)
        completions, logprobs, token_ids = [], [], []
        for prompt in prompts:
            ids, seq_lp, seq_ids = list(prompt), [], []
            for _ in range(self.max_tokens):
                logits = self.model(input_ids=torch.tensor([ids])).logits[0, -1].double()
                lp = torch.log_softmax(logits / self.temperature, -1)
                tok = int(torch.multinomial(lp.exp(), 1, generator=g))
                order = lp.argsort(descending=True)
                keep = order[:self.logprobs].tolist() if self.logprobs else []
                keep = keep + ([tok] if tok not in keep else [])
                seq_ids.append(keep)
                off = self.shift + self.jitter * float(torch.randn(1, generator=g))
                seq_lp.append([float(lp[i]) + (off if i == tok else 0.0) for i in keep])
                ids.append(tok)
                if tok == self.tokenizer.eos_token_id:
                    break
            completions.append(ids[len(prompt):])
            logprobs.append(seq_lp)
            token_ids.append(seq_ids)
        return prompts, completions, logprobs, token_ids


def _vllm_trainer(model_dir: Path, tmp_path: Path, shift: float = 0.0, jitter: float = 0.0,
                  **overrides: Any) -> ICTGRPOTrainer:
    """A trainer built without vLLM, then switched onto the fake engine as TRL's init would have done."""
    trainer = _trainer(model_dir, tmp_path, **overrides)
    trainer.use_vllm = trainer.args.use_vllm = True
    trainer._last_loaded_step = -1
    trainer.vllm_generation = FakeVLLM(trainer.model, trainer.processing_class, trainer.temperature,
                                       trainer.max_completion_length, shift, jitter)
    trainer._sampler_topk = trainer._resolve_topk_source()
    if trainer._sampler_topk is not None:
        trainer._install_vllm_topk()
    return trainer


def test_vllm_path_feeds_topk_and_the_sampled_logprob(tiny_model_dir: Path, tmp_path: Path,
                                                      no_head_topk: list[int]) -> None:
    trainer = _vllm_trainer(tiny_model_dir, tmp_path, token_selector="ict", selection_topk=4, temperature=0.9)
    assert trainer.vllm_generation.logprobs == 4
    calls = _capture_stats(trainer)
    trainer.model.train()
    batch = trainer._generate_and_score_completions(_inputs(trainer))
    (call,) = calls
    assert no_head_topk == []
    mask = call["mask"]
    lp, ids = call["sampler_topk"]
    logits = _full_logits(trainer, batch)
    reference = torch.log_softmax(logits / 0.9, -1)
    assert torch.equal(ids[mask], reference.topk(4, -1).indices[mask])
    assert torch.allclose(lp.double()[mask], reference.topk(4, -1).values[mask], atol=2e-5)
    # TRL received the sampled token's log-prob (not the top-1's): TIS sees a ratio of 1 here
    sampled = reference.gather(-1, batch["completion_ids"][..., None]).squeeze(-1)
    assert torch.allclose(batch["sampling_per_token_logps"].double()[mask], sampled[mask], atol=2e-5)
    assert not torch.allclose(sampled[mask], reference.max(-1).values[mask])


def test_vllm_sampler_conditions(tiny_model_dir: Path, tmp_path: Path) -> None:
    ok = _vllm_trainer(tiny_model_dir, tmp_path, token_selector="ict", selection_topk=4)
    assert ok._sampler_topk == 4
    for overrides, reason in [({"top_p": 0.9}, "top_p"), ({"selection_temperature": 0.5}, "selection_temperature"),
                              ({"selection_topk": 64}, "max_logprobs")]:
        with pytest.raises(ValueError, match=reason):
            _vllm_trainer(tiny_model_dir, tmp_path, token_selector="ict", selection_topk_source="sampler",
                          **{"selection_topk": 4, **overrides})


@pytest.mark.integration
def test_ictrl_train_takes_topk_from_generation(tiny_model_dir: Path, shared_data: Path, tmp_path: Path,
                                                no_head_topk: list[int]) -> None:
    """`ictrl train` with selection_topk on CPU: 2 ICT steps whose score came from generation."""
    from ictrl import cli
    from test_train_cli import CELL, read_metrics, tiny_overrides

    out = tmp_path / "out"
    assert cli.main(["train", str(CELL), *tiny_overrides(tiny_model_dir, out), "--selection_topk=16"]) == 0
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["ictrl/topk_from_sampler"] == 1.0 and r["ictrl/ict_score/all"] > 0 for r in rows)
    assert no_head_topk == []
    assert json.loads((out / "metrics.jsonl").read_text().splitlines()[0])["ictrl/selected_frac"] < 1
