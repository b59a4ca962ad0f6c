"""Glue around TRL's vLLM engine: its precision, the CPU build, the weight sync and a server's settings
(docs/architecture.md, "Module notes")."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from ictrl import vllm_env
from ictrl.errors import UserError

log = logging.getLogger(__name__)


def engine_dtype(args: Any) -> str:
    """The dtype the trainer computes in, for the engine: bf16/fp16 under mixed precision, else float32."""
    return "bfloat16" if getattr(args, "bf16", False) else "float16" if getattr(args, "fp16", False) else "float32"


@contextlib.contextmanager
def building_engine(model: Any, args: Any) -> Iterator[None]:
    """Around ``GRPOTrainer.__init__``: vLLM importable, the CPU build's settings and head size checked, then TRL's
    colocated ``LLM(...)`` gets the trainer's dtype, and, for a trainer without CUDA, TRL's server client skips its NCCL
    communicator (which refuses any other device): the weights then travel through :func:`reload_sync`."""
    vllm_env.require_installed("use_vllm")
    if args.vllm_mode == "colocate" and vllm_env.on_cpu():  # a server is its own process, with its own settings
        chosen = vllm_env.cpu_environment(args.cpu_threads)
        log.info("vLLM on CPU in %s%s", engine_dtype(args), "".join(f", {k}={v}" for k, v in chosen.items()))
        if not isinstance(model, str):
            vllm_env.check_cpu_head_dim(model.config, "use_vllm")
    from trl.generation import vllm_generation
    from trl.generation.vllm_client import VLLMClient

    original_llm, original_init = vllm_generation.LLM, VLLMClient.init_communicator
    extra: dict[str, Any] = {"dtype": engine_dtype(args), "use_tqdm_on_load": False}

    def llm(*a: Any, **kwargs: Any) -> Any:
        return original_llm(*a, **{**kwargs, **extra})

    def no_communicator(self: Any, device: Any = 0) -> None:
        log.info("vLLM server: no NCCL communicator for a trainer on %s; weights sync through reload_weights", device)

    vllm_generation.LLM = llm
    if args.vllm_mode == "server" and not torch.cuda.is_available():
        VLLMClient.init_communicator = no_communicator
    try:
        yield
    finally:
        vllm_generation.LLM, VLLMClient.init_communicator = original_llm, original_init


def needs_reload_sync(generation: Any) -> bool:
    """Whether TRL's per-parameter sync cannot reach this engine's weights (see the module docstring)."""
    if generation.mode == "server":
        return not torch.cuda.is_available()
    return vllm_env.on_cpu()


def full_state_dict(generation: Any) -> dict[str, torch.Tensor]:
    """Every weight the engine loads, under vLLM's names, copied out of the training model: TRL's walk
    (``_iter_named_params``: DeepSpeed/FSDP gathers, LoRA merged) plus the tied head it yields once as the embedding.
    Copies, because TRL unmerges LoRA weights in place when its walk ends."""
    weights = {name: tensor.detach().clone() for name, tensor in generation._iter_named_params()}
    model = generation.accelerator.unwrap_model(generation.model)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    text = base.config.get_text_config()
    if getattr(text, "tie_word_embeddings", False) and "lm_head.weight" not in weights:
        embedding = base.get_input_embeddings().weight
        name = next((n for n, p in base.named_parameters() if p is embedding), None)
        if name is None or name not in weights:
            raise RuntimeError("vLLM weight sync: the tied head's embedding was not found among the weights")
        weights["lm_head.weight"] = weights[name]
    return weights


def reload_sync(generation: Any, output_dir: str) -> None:
    """``VLLMGeneration.sync_weights`` for an engine TRL cannot write into: the whole state dict reloaded by vLLM."""
    weights = full_state_dict(generation)  # a collective under ZeRO-3/FSDP: every process walks it
    if generation.mode == "colocate":
        runner = generation.llm.llm_engine.model_executor.driver_worker.model_runner
        runner.reload_weights(weights_iterator=iter(weights.items()))
        generation.llm.reset_prefix_cache()
        return
    if not generation.accelerator.is_main_process:
        return
    from safetensors.torch import save

    from ictrl.files import atomic_write_bytes

    folder = Path(output_dir).resolve() / ".vllm-weights"  # the server reads it: one filesystem for both
    tensors, seen = {}, set()
    for name, tensor in weights.items():  # safetensors stores no shared storage: a tied head is written twice
        tensors[name] = tensor.clone() if tensor.data_ptr() in seen else tensor.contiguous()
        seen.add(tensor.data_ptr())
    atomic_write_bytes(folder / "model.safetensors", save(tensors))
    client = generation.vllm_client
    response = client.session.post(f"{client.base_url}/collective_rpc",
                                   json={"method": "reload_weights", "kwargs": {"weights_path": str(folder)}})
    if response.status_code != 200:
        raise RuntimeError(f"vLLM server: reload_weights from {folder} failed: {response.status_code} "
                           f"{response.text[:200]}")
    client.reset_prefix_cache()


def engine_built(trainer: Any) -> None:
    """After TRL built the engine: the weight sync routed through :func:`reload_sync` where TRL's cannot reach the
    engine, and a colocated engine shut down before the process leaves its process group."""
    generation = trainer.vllm_generation
    if needs_reload_sync(generation):
        generation.sync_weights = lambda: reload_sync(generation, trainer.args.output_dir)
    if generation.mode == "colocate":
        vllm_env.shutdown_before_exit(generation.llm)


# --- a hand-started vLLM server (vllm_mode='server') ------------------------------------------------------------

SERVER_DOC = "docs/vllm.md"


def server_settings(trainer: Any) -> dict[str, Any] | None:
    """``{"logprobs_mode": str}`` of the trainer's vLLM server (None unless it generates with one), read by the
    main process (the only one with a client) and broadcast to the others: what :func:`check_logprobs_mode` reads."""
    from accelerate.utils import broadcast_object_list

    if not trainer.use_vllm or trainer.args.vllm_mode != "server":
        return None
    box: list[Any] = [None]
    if trainer.accelerator.is_main_process:
        model_config = trainer.vllm_generation.vllm_client.get_server_info()["model_config"]
        box = [{"logprobs_mode": model_config.get("logprobs_mode")}]
    broadcast_object_list(box, from_process=0)
    return box[0]


def check_logprobs_mode(settings: dict[str, Any] | None, args: Any) -> None:
    """Stop when the server's log-probs are not the sampled distribution and the importance weight
    (``vllm_importance_sampling_correction``) reads them."""
    if settings is None:
        return
    users = ["vllm_importance_sampling_correction"] * bool(args.vllm_importance_sampling_correction)
    mode = settings.get("logprobs_mode")
    if users and mode != "processed_logprobs":
        raise UserError(f"vllm_mode='server': the vLLM server reports logprobs_mode={mode!r} (before temperature "
                        f"and top-p/top-k), but {' and '.join(users)} need the sampled distribution: restart it with "
                        f"--logprobs-mode processed_logprobs ({SERVER_DOC})")
