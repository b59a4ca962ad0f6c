"""selection_topk from the sampler: the top-K log-probs recorded at generation feed the ICT score.

Real transformers generation on the tiny Qwen2 (tests/conftest.py ``tiny_model_dir``); the vLLM path runs TRL's own
``VLLMGeneration`` (colocate mode: weight sync, ``SamplingParams``, ``extract_logprobs``) over the fake vLLM 0.31
engine of tests/fixtures/fake_vllm.py, which samples with a copy of the model and answers ``RequestOutput``s.
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
from fixtures import fake_vllm
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


class _RecordingSource:
    """The trainer's statistics source, recording the arguments and results of each call."""

    def __init__(self, source: Any, calls: list[dict[str, Any]]) -> None:
        self.source, self.calls = source, calls

    def __getattr__(self, name: str) -> Any:
        return getattr(self.source, name)

    def __call__(self, model: Any, input_ids: Any, attention_mask: Any, mask: Any, group_ids: Any = None,
                 **kwargs: Any) -> Any:
        stats, js = self.source(model, input_ids, attention_mask, mask, group_ids, **kwargs)
        self.calls.append({"inputs": (input_ids, attention_mask), "mask": mask,
                           "sampler_topk": kwargs.get("sampler_topk"), "js": js})
        return stats, js


def _capture_stats(trainer: Any) -> list[dict[str, Any]]:
    """Record the arguments and results of each statistics pass."""
    calls: list[dict[str, Any]] = []
    trainer.stats_source = _RecordingSource(trainer.stats_source, calls)
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


def _full_logits(trainer: Any, inputs: tuple[torch.Tensor, torch.Tensor], T: int) -> torch.Tensor:
    ids, attention = inputs
    P = ids.size(1) - T
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
    mask = call["mask"]
    lp, ids = call["sampler_topk"]
    B, T = mask.shape
    assert lp.shape == (B, T, V) and ids.shape == (B, T, V)
    logits = _full_logits(trainer, call["inputs"], T)
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
    trainer = _trainer(tiny_model_dir, tmp_path, token_selector="ict", selection_topk=8, temperature=0.8,
                       selection_topk_source="sampler")
    assert trainer._sampler_topk == 8
    calls = _capture_stats(trainer)
    trainer.model.train()
    trainer._generate_and_score_completions(_inputs(trainer))
    (call,) = calls
    groups = torch.arange(call["mask"].size(0)) // trainer.num_generations
    _, head_js = trainer.stats_source.source(trainer.model, *call["inputs"], call["mask"], groups)  # head top-K
    torch.testing.assert_close(call["js"], head_js, atol=2e-5, rtol=1e-4)


# steps_per_generation 2 whose buffer TRL consumes whole (no old log-probs to share), each micro-batch a half: the
# statistics need a forward of their own
SEPARATE_ANYWAY = {"steps_per_generation": 2, "gradient_accumulation_steps": 2}


@pytest.mark.parametrize(("overrides", "path", "K"), [
    ({}, "training_forward", None),  # the statistics ride the loss's forward: the head's top-K is free there
    ({"num_iterations": 2}, "shared_old_logps", None),  # ... or TRL's old-log-prob forward
    (SEPARATE_ANYWAY, "separate", 8),
    ({"entropy_coef": 0.01}, "separate", 8),  # TRL's dense forward for its entropy bonus: no one-pass path
])
def test_auto_takes_the_sampler_only_where_the_statistics_pass_is_a_forward_of_its_own(
        tiny_model_dir: Path, tmp_path: Path, overrides: dict[str, Any], path: str, K: int | None) -> None:
    from ictrl.engine.stats_pass import STATS_PATHS

    trainer = _trainer(tiny_model_dir, tmp_path, token_selector="ict", selection_topk=8, **overrides)
    assert trainer._sampler_topk == K
    assert trainer.stats_source.paths["train"].code == STATS_PATHS[path]
    forced = _trainer(tiny_model_dir, tmp_path, token_selector="ict", selection_topk=8, selection_topk_source="sampler",
                      **overrides)
    assert forced._sampler_topk == 8 and forced.stats_source.paths["train"].code == STATS_PATHS["separate"]


def test_auto_falls_back_to_the_head_and_sampler_refuses(tiny_model_dir: Path, tmp_path: Path,
                                                         no_head_topk: list[int]) -> None:
    trainer = _trainer(tiny_model_dir, tmp_path, token_selector="ict", selection_topk=8, repetition_penalty=1.2,
                       **SEPARATE_ANYWAY)
    assert trainer._sampler_topk is None  # a repetition penalty changes the sampler's logits
    w.separate_pass(trainer)  # the statistics pass runs at generation (else in the loss, ictrl.engine.stats_pass)
    trainer.model.train()
    trainer._generate_and_score_completions(_inputs(trainer))
    assert no_head_topk and trainer._metrics["train"]["ictrl/topk_from_sampler"] == [0.0]
    with pytest.raises(ValueError, match="selection_topk_source='sampler': repetition_penalty"):
        _trainer(tiny_model_dir, tmp_path, token_selector="ict", selection_topk=8, repetition_penalty=1.2,
                 selection_topk_source="sampler")
    head = _trainer(tiny_model_dir, tmp_path, token_selector="ict", selection_topk=8, selection_topk_source="head")
    assert head._sampler_topk is None
    with pytest.raises(ValueError, match="selection_topk is not used by token_selector='entropy'"):
        _trainer(tiny_model_dir, tmp_path, token_selector="entropy", selection_topk=8)  # entropy needs no ICT score


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


def _vllm_trainer(monkeypatch: pytest.MonkeyPatch, model_dir: Path, tmp_path: Path, shift: float = 0.0,
                  jitter: float = 0.0, **overrides: Any) -> ICTGRPOTrainer:
    """A trainer with ``use_vllm=True`` (colocate): TRL builds its own ``VLLMGeneration``, over the fake vLLM 0.31
    engine of tests/fixtures/fake_vllm.py (its own copy of the checkpoint, TRL's weight sync, ``RequestOutput``s
    read by TRL's ``extract_logprobs``). ``shift``/``jitter``: the engine's reported log-prob error."""
    fake_vllm.install(monkeypatch)
    trainer = _trainer(model_dir, tmp_path, use_vllm=True, vllm_mode="colocate", **overrides)
    trainer.vllm_generation.llm.shift, trainer.vllm_generation.llm.jitter = shift, jitter
    return trainer


def test_vllm_path_feeds_topk_and_the_sampled_logprob(tiny_model_dir: Path, tmp_path: Path,
                                                      no_head_topk: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    trainer = _vllm_trainer(monkeypatch, tiny_model_dir, tmp_path, token_selector="ict", selection_topk=4,
                            temperature=0.9, selection_topk_source="sampler")
    assert trainer.vllm_generation.logprobs == 4
    llm = trainer.vllm_generation.llm
    assert llm.kwargs["logprobs_mode"] == "processed_logprobs"  # what TRL asks the colocated engine for
    calls = _capture_stats(trainer)
    trainer.model.train()
    batch = trainer._generate_and_score_completions(_inputs(trainer))
    (call,) = calls
    assert no_head_topk == []
    assert llm.weights.loaded == set(dict(llm.model.named_parameters()))  # TRL's weight sync reached the engine
    assert [(p.n, p.logprobs, p.temperature) for p in llm.calls] == [(1, 4, 0.9)]
    mask = call["mask"]
    lp, ids = call["sampler_topk"]
    logits = _full_logits(trainer, call["inputs"], mask.size(1))
    reference = torch.log_softmax(logits / 0.9, -1)
    assert torch.equal(ids[mask], reference.topk(4, -1).indices[mask])
    assert torch.allclose(lp.double()[mask], reference.topk(4, -1).values[mask], atol=2e-5)
    # TRL received the sampled token's log-prob (not the top-1's): TIS sees a ratio of 1 here
    sampled = reference.gather(-1, batch["completion_ids"][..., None]).squeeze(-1)
    assert torch.allclose(batch["sampling_per_token_logps"].double()[mask], sampled[mask], atol=2e-5)
    assert not torch.allclose(sampled[mask], reference.max(-1).values[mask])


def test_vllm_sampler_conditions(tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ok = _vllm_trainer(monkeypatch, tiny_model_dir, tmp_path, token_selector="ict", selection_topk=4,
                       vllm_importance_sampling_correction=False, **SEPARATE_ANYWAY)
    assert ok._sampler_topk == 4  # 'auto' takes vLLM's top-K where the statistics need their own pass
    shared = _vllm_trainer(monkeypatch, tiny_model_dir, tmp_path, token_selector="ict", selection_topk=4)
    assert shared._sampler_topk is None  # they ride TRL's old-log-prob forward for the importance weight
    for overrides, reason in [({"top_p": 0.9}, "top_p"), ({"selection_temperature": 0.5}, "selection_temperature")]:
        with pytest.raises(ValueError, match=reason):
            _vllm_trainer(monkeypatch, tiny_model_dir, tmp_path, token_selector="ict", selection_topk_source="sampler",
                          **{"selection_topk": 4, **overrides})
    # above vLLM's default cap of 20 log-probs, ictrl builds the colocated engine with enough, in the trainer's dtype
    wide = _vllm_trainer(monkeypatch, tiny_model_dir, tmp_path, token_selector="ict", selection_topk=64,
                         selection_topk_source="sampler")
    assert wide._sampler_topk == 64
    assert wide.vllm_generation.llm.kwargs["max_logprobs"] == 64 and wide.vllm_generation.llm.kwargs["dtype"] == "float32"


@pytest.mark.integration
def test_ictrl_train_takes_topk_from_generation(tiny_model_dir: Path, shared_data: Path, tmp_path: Path,
                                                no_head_topk: list[int]) -> None:
    """`ictrl train` with selection_topk on CPU: 2 ICT steps whose score came from generation."""
    from ictrl import cli
    from train_cli.test_train_cli import CELL, read_metrics, tiny_overrides

    out = tmp_path / "out"
    assert cli.main(["train", str(CELL), *tiny_overrides(tiny_model_dir, out), "--selection_topk=16",
                     "--selection_topk_source=sampler"]) == 0
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["ictrl/topk_from_sampler"] == 1.0 and r["ictrl/ict_score/all"] > 0 for r in rows)
    assert no_head_topk == []
    assert json.loads((out / "metrics.jsonl").read_text().splitlines()[0])["ictrl/selected_frac"] < 1


def test_recording_generate_puts_back_a_generate_the_caller_had_set_on_the_model() -> None:
    from ictrl.engine.sampler_topk import TopKRecorder, recording_generate

    class Model:
        def generate(self, **kwargs: object) -> str:
            return "class"

    plain, wrapped = Model(), Model()
    wrapped.generate = lambda **kwargs: ("instance", kwargs)  # type: ignore[method-assign]
    own = wrapped.generate
    for model in (plain, wrapped):
        with recording_generate(model, TopKRecorder(2, 1.0)):
            out = model.generate()
        assert (out == "class") if model is plain else (out[0] == "instance" and "logits_processor" in out[1])
    assert "generate" not in vars(plain) and plain.generate() == "class"
    assert wrapped.generate is own
