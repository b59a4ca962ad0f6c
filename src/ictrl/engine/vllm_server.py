"""What ICTGRPOTrainer needs from a hand-started ``vllm serve`` (TRL's ``vllm_mode='server'``), read once at
start-up through TRL's client: ``VLLMClient.get_server_info()`` is the server's resolved ``VllmConfig`` (its
``/server_info`` endpoint, served with ``VLLM_SERVER_DEV_MODE=1``, which TRL's weight sync needs anyway).

- ``model_config.max_logprobs`` (vLLM's default 20; -1: no cap): a request for more top-K log-probs than that
  fails at the first rollout, so the sampler's top-K (``selection_topk``) must fit under it.
- ``model_config.logprobs_mode`` (vLLM's default ``raw_logprobs``, before temperature): the importance weight and
  the sampler's top-K must be the distribution that was sampled, ``processed_logprobs``. TRL only warns; with
  ``temperature != 1`` raw log-probs silently give another weight and another ICT score, so ictrl stops.

The full server command is in docs/vllm.md.
"""

from __future__ import annotations

from typing import Any

from ictrl.errors import UserError

SERVER_DOC = "docs/vllm.md"


def server_settings(trainer: Any) -> dict[str, Any] | None:
    """``{"max_logprobs": int, "logprobs_mode": str}`` of the trainer's vLLM server (None unless it generates
    with one), read by the main process (the only one with a client) and broadcast to the others."""
    from accelerate.utils import broadcast_object_list

    if not trainer.use_vllm or trainer.args.vllm_mode != "server":
        return None
    box: list[Any] = [None]
    if trainer.accelerator.is_main_process:
        model_config = trainer.vllm_generation.vllm_client.get_server_info()["model_config"]
        box = [{key: model_config.get(key) for key in ("max_logprobs", "logprobs_mode")}]
    broadcast_object_list(box, from_process=0)
    return box[0]


def topk_obstacle(settings: dict[str, Any], k: int) -> str | None:
    """Why the server cannot return ``k`` log-probs per position (None: it can)."""
    limit = settings.get("max_logprobs")
    if limit is None or limit == -1 or k <= limit:
        return None
    return (f"the vLLM server caps log-probs at max_logprobs={limit}, below selection_topk={k}; restart it with "
            f"--max-logprobs -1 ({SERVER_DOC})")


def check_logprobs_mode(settings: dict[str, Any] | None, args: Any, sampler_topk: int | None) -> None:
    """Stop when the server's log-probs are not the sampled distribution and something reads them: the
    importance weight (``vllm_importance_sampling_correction``) or the sampler's top-K (``sampler_topk``)."""
    if settings is None:
        return
    users = ["vllm_importance_sampling_correction"] * bool(args.vllm_importance_sampling_correction) + \
        ["the sampler's top-K (selection_topk_source)"] * (sampler_topk is not None)
    mode = settings.get("logprobs_mode")
    if users and mode != "processed_logprobs":
        raise UserError(f"vllm_mode='server': the vLLM server reports logprobs_mode={mode!r} (before temperature "
                        f"and top-p/top-k), but {' and '.join(users)} need the sampled distribution: restart it with "
                        f"--logprobs-mode processed_logprobs ({SERVER_DOC})")
