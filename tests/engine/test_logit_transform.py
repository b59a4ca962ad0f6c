"""Models whose forward transforms the LM head's output (Gemma2's ``final_logit_softcapping``, Cohere2's
``logit_scale``, Granite's ``logits_scaling``): under ``token_selector: all`` they train as stock TRL trains them;
under ICT the statistics are those of the transformed logits, the distribution the model samples from, against a
float64 reference computed from the model's own logits. Tiny models built from config, a byte-level tokenizer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from trl import GRPOConfig

import mp_worker as w
from ictrl.core import reference as core_ref
from ictrl.engine.heads import call_head, logit_transform
from ictrl.engine.loss_inputs import model_inputs
from test_trainer import _generation_inputs, _load, _response_mask, _trainer


def _config(kind: str, tokenizer: Any) -> Any:
    from transformers import Cohere2Config, Gemma2Config, GraniteConfig

    ids = dict(vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
               bos_token_id=None, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
               num_key_value_heads=1, max_position_embeddings=512, initializer_range=0.5)
    # initializer_range 0.5: logits of a few units, which the cap and the scales change visibly
    if kind == "gemma2":
        return Gemma2Config(**ids, head_dim=16, final_logit_softcapping=2.0)
    if kind == "cohere2":
        return Cohere2Config(**ids, logit_scale=8.0)
    return GraniteConfig(**ids, logits_scaling=0.125)


@pytest.fixture(scope="module", params=["gemma2", "cohere2", "granite"])
def transformed_model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import AutoModelForCausalLM

    from ictrl.models import build_byte_tokenizer

    tokenizer = build_byte_tokenizer()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(_config(request.param, tokenizer))
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_the_transform_is_the_models_own(transformed_model_dir: Path) -> None:
    """The head's output through :func:`logit_transform` is the model's own logits, and the transform bites."""
    model, _ = _load(transformed_model_dir)
    transform = logit_transform(model.config)
    assert transform is not None
    ids = torch.tensor([[5, 40, 77, 120, 3, 9]])
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True)
        raw = model.get_output_embeddings()(out.hidden_states[-1])
        ours = call_head(model.get_output_embeddings(), lambda lm, h: lm(h), out.hidden_states[-1],
                         transform=transform)
    torch.testing.assert_close(ours, out.logits, atol=1e-5, rtol=1e-5)
    assert float((raw - out.logits).abs().max()) > 1e-2


def test_ict_statistics_are_the_transformed_distributions(transformed_model_dir: Path, tmp_path: Path) -> None:
    """The separate pass's statistics and group JS, TRL's fused log-probs and the sparse head's log-probs equal the
    float64 reference on the model's own (transformed) logits, at temperature 0.8, over blocks of 2 positions."""
    trainer = _trainer(transformed_model_dir, tmp_path, w.stub_trainer_class(), token_selector="ict",
                       temperature=0.8, stats_chunk_size=16)
    trainer.model.train()
    batch = trainer._generate_and_score_completions(_generation_inputs(trainer))
    w.select_now(trainer, batch)
    mask = _response_mask(batch)
    group_ids = torch.arange(mask.size(0)) // trainer.num_generations
    stats, js = trainer.stats_source(trainer.model, *model_inputs(batch), mask, group_ids)

    ids, attention = model_inputs(batch)
    P, T = batch["prompt_ids"].size(1), batch["completion_ids"].size(1)
    with torch.no_grad():
        out = trainer.model(input_ids=ids, attention_mask=attention, output_hidden_states=True)
    logits = out.logits[:, P - 1:P + T - 1]
    ref = w.naive_stats(logits, batch["completion_ids"], mask, 0.8)
    for name, value in ref.items():
        torch.testing.assert_close(getattr(stats, name).double(), value, atol=2e-5, rtol=1e-5, msg=name)
    torch.testing.assert_close(js.double(), core_ref.group_js(logits, mask, group_ids, 0.8), atol=1e-6, rtol=1e-4)
    head = trainer.model.get_output_embeddings()
    raw = w.naive_stats(head(out.hidden_states[-1][:, P - 1:P + T - 1]), batch["completion_ids"], mask, 0.8)
    assert float((raw["entropy"] - ref["entropy"]).abs().max()) > 1e-3  # the untransformed head would differ

    fused, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, attention, T)
    torch.testing.assert_close(torch.where(mask, fused, 0.0).double(), ref["logprob"], atol=2e-5, rtol=1e-5)
    selected = batch["ictrl_selected"].bool()
    sparse = trainer.inputs_builder._sparse_head(trainer.model, out.hidden_states[-1][:, P - 1:P + T - 1],
                                                 batch["completion_ids"], selected)
    torch.testing.assert_close(torch.where(selected, sparse, 0.0).double(),
                               torch.where(selected, ref["logprob"], 0.0), atol=2e-5, rtol=1e-5)


def test_all_trains_as_stock_trl(transformed_model_dir: Path, tmp_path: Path) -> None:
    """Two SGD steps with stock GRPOTrainer and with ICTGRPOTrainer given the same GRPOConfig: the same weights."""

    StockStub = w.stock_stub_class()

    args = dict(use_cpu=True, bf16=False, report_to="none", save_strategy="no", num_generations=4,
                max_completion_length=12, optim="sgd", learning_rate=0.1, max_grad_norm=0.0, seed=0,
                disable_tqdm=True, dataloader_num_workers=0, per_device_train_batch_size=4, max_steps=2)
    params = []
    for name, cls in (("trl", StockStub), ("ictrl", w.stub_trainer_class(one_pass=True))):
        model, tokenizer = _load(transformed_model_dir)
        trainer = cls(model=model, reward_funcs=w.digit_reward, args=GRPOConfig(str(tmp_path / name), **args),
                      train_dataset=w.make_dataset(), processing_class=tokenizer)
        trainer.train()
        params.append({k: v.detach().clone() for k, v in trainer.model.named_parameters()})
    start = dict(_load(transformed_model_dir)[0].named_parameters())
    assert max(float((params[0][k] - start[k]).abs().max()) for k in start) > 1e-4
    for k in start:
        torch.testing.assert_close(params[1][k], params[0][k], rtol=1e-4, atol=1e-7, msg=k)
