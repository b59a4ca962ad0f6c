"""Helpers for the engine tests, and the worker script of the 2-process run.

As a script (``torchrun --nproc_per_node 2 tests/engine/mp_worker.py OUT MODEL SELECTORS PER_DEVICE GRAD_ACCUM``,
SELECTORS comma-separated) it trains, for each selector, one optimizer step with deterministic generations and
writes, per rank, ``{selector}_rank{r}.pt`` holding the generation batches it built (rows, masks), the micro-batch
losses and the parameters after the step. (``accelerate launch --cpu --num_processes 2`` started one process here,
so the test uses torchrun; accelerate picks up its environment and uses gloo on CPU.)

Generation is replaced by a deterministic stub (``StubGenerationTrainer``): a completion is a function of its prompt
and its index within the prompt's group, so a 1-process and a 2-process run see the same data whatever the
per-process sampling RNG would do. Everything after generation (rewards, advantages, statistics, selection, loss,
optimizer) is the real code path.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path
from typing import Any

import torch

PROMPTS = [f"Q{i}: add {i} and {i + 3}. A:" for i in range(16)]


def digit_reward(prompts: list[Any], completions: list[str], **kwargs: Any) -> list[float]:
    """A verifiable reward: 1 if the completion contains a digit."""
    return [1.0 if any(c.isdigit() for c in completion) else 0.0 for completion in completions]


def make_dataset(n: int = 16) -> Any:
    from datasets import Dataset

    return Dataset.from_dict({"prompt": PROMPTS[:n]})


def stub_completion(prompt_ids: list[int], j: int) -> list[int]:
    """Deterministic completion j of a prompt: 4–11 bytes of lowercase letters, digits in about half of them."""
    digest = hashlib.blake2b(bytes(str((list(prompt_ids), j)), "utf8"), digest_size=8).digest()
    g = torch.Generator().manual_seed(int.from_bytes(digest, "little") & ((1 << 62) - 1))
    length = 4 + int(torch.randint(0, 8, (1,), generator=g))
    ids = torch.randint(ord("a"), ord("z") + 1, (length,), generator=g)
    if j % 2 == 0:
        ids[int(torch.randint(0, length, (1,), generator=g))] = ord("0") + j
    return ids.tolist()


def stub_trainer_class() -> type:
    from ictrl.engine.trainer import ICTGRPOTrainer

    class StubGenerationTrainer(ICTGRPOTrainer):
        """Records every generation batch in ``self.recorded`` and generates deterministically."""

        recorded: list[dict[str, Any]]

        def _generate_single_turn(self, prompt_ids: list[list[int]], images: Any, multimodal_fields: Any,
                                  num_generations: int, has_tool_images: bool = False) -> tuple[list, None]:
            # Rows of one group are adjacent and aligned on every process (checked by the trainer for ict).
            return [stub_completion(p, i % num_generations) for i, p in enumerate(prompt_ids)], None

        def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
            batch = super()._generate_and_score_completions(inputs)
            if not hasattr(self, "recorded"):
                self.recorded = []
            self.recorded.append({k: (v.detach().clone() if isinstance(v, torch.Tensor) else v)
                                  for k, v in batch.items()})
            return batch

    return StubGenerationTrainer


def make_config(output_dir: str | os.PathLike[str], **overrides: Any) -> Any:
    from ictrl.engine.config import ICTGRPOConfig

    kwargs: dict[str, Any] = dict(
        output_dir=str(output_dir), use_cpu=True, bf16=False, report_to="none", save_strategy="no",
        logging_steps=1, max_steps=2, per_device_train_batch_size=8, num_generations=4, max_completion_length=12,
        learning_rate=1e-2, seed=0, disable_tqdm=True, dataloader_num_workers=0, selection_warmup_steps=0,
    )
    kwargs.update(overrides)
    return ICTGRPOConfig(**kwargs)


# ------------------------------------------------------------------- naive float64 references (test oracle)


def naive_stats(logits: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor, temperature: float
                ) -> dict[str, torch.Tensor]:
    """[B, T, V] logits → float64 [B, T] entropy, renyi2, purity, logprob, prob (0 where mask is False)."""
    logp = torch.log_softmax(logits.double() / temperature, dim=-1)
    p = logp.exp()
    purity = (p * p).sum(-1)
    out = {
        "entropy": -(p * logp).sum(-1),
        "renyi2": -torch.log(purity),
        "purity": purity,
        "logprob": logp.gather(-1, tokens[..., None]).squeeze(-1),
    }
    out["prob"] = out["logprob"].exp()
    return {k: torch.where(mask, v, 0.0) for k, v in out.items()}


def naive_group_js(logits: torch.Tensor, mask: torch.Tensor, group_ids: torch.Tensor, temperature: float
                   ) -> torch.Tensor:
    """float64 [B, T]: JS(p_bt ‖ mean of p_jt over active j of b's group), loops for clarity."""
    p = torch.softmax(logits.double() / temperature, dim=-1)
    B, T, _ = p.shape
    out = torch.zeros(B, T, dtype=torch.float64)

    def kl(a: torch.Tensor, b: torch.Tensor) -> float:
        nz = a > 0
        return float((a[nz] * (a[nz].log() - b[nz].log())).sum())

    for b in range(B):
        for t in range(T):
            if not mask[b, t]:
                continue
            members = [j for j in range(B) if group_ids[j] == group_ids[b] and mask[j, t]]
            mean = p[members, t].mean(0)
            m = 0.5 * (p[b, t] + mean)
            out[b, t] = 0.5 * kl(p[b, t], m) + 0.5 * kl(mean, m)
    return out


# -------------------------------------------------------------------------------------- 2-process worker


def run_one_step(out_dir: Path, model_dir: str, selector: str, per_device: int, grad_accum: int = 1,
                 **overrides: Any) -> dict[str, Any]:
    """Train one optimizer step with the stub trainer; return what the comparison needs."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    # Plain SGD without clipping: the parameter change is lr × gradient, so a gradient scale error shows (Adam's
    # first step and norm clipping would hide it).
    config = make_config(out_dir, token_selector=selector, per_device_train_batch_size=per_device,
                         gradient_accumulation_steps=grad_accum, max_steps=1, optim="sgd", learning_rate=0.1,
                         max_grad_norm=0.0, **overrides)
    trainer = stub_trainer_class()(model=model, reward_funcs=digit_reward, args=config,
                                   train_dataset=make_dataset(), processing_class=tokenizer)
    losses: list[float] = []
    original = trainer._compute_loss

    def recording_loss(model: Any, inputs: dict[str, Any]) -> torch.Tensor:
        loss = original(model, inputs)
        losses.append(float(loss.detach()))
        return loss

    trainer._compute_loss = recording_loss  # type: ignore[method-assign]
    trainer.train()
    params = {k: v.detach().clone() for k, v in trainer.accelerator.unwrap_model(trainer.model).named_parameters()}
    return {"batches": trainer.recorded, "losses": losses, "params": params,
            "rank": trainer.accelerator.process_index, "world": trainer.accelerator.num_processes}


def main(argv: list[str]) -> None:
    out, model_dir, selectors, per_device, grad_accum = Path(argv[0]), argv[1], argv[2], int(argv[3]), int(argv[4])
    for selector in selectors.split(","):
        result = run_one_step(out / f"trainer_{selector}", model_dir, selector, per_device, grad_accum)
        path = out / f"{selector}_rank{result['rank']}.pt"
        tmp = path.with_suffix(".tmp")
        torch.save(result, tmp)
        os.replace(tmp, path)


if __name__ == "__main__":
    main(sys.argv[1:])
