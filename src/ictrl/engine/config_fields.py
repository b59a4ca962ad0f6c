"""The fields of ``ICTGRPOConfig``: the bounds of the fields it inherits (its own declare theirs in their
annotation; both checked by :func:`ictrl.validation.check_fields`), the rules of a run that trains something and
of installed trackers, and what each of TRL's fields means under ``ICTGRPOTrainer`` (docs/architecture.md, "Module
notes")."""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Sequence
from typing import Any

from annotated_types import Ge, Interval

from ictrl.errors import MissingExtraError, UserError, did_you_mean, quote
from ictrl.validation import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, SEED, UNIT, Bound, declared

# The inherited fields (TRL's GRPOConfig, transformers' TrainingArguments) -> the range their value must lie in:
# ictrl cannot annotate another package's fields. ictrl's own fields declare theirs in their annotation.
# None values are skipped: they mean "the default". The loss's values (epsilon, epsilon_high, beta, the
# vllm_importance_sampling_* options, ...) are checked by the LossSpec the config builds (ictrl.core.loss), the
# selector's (selection_ratio, selection_seed, ...) by its registration (ictrl.core.selection).
RANGES: dict[str, Bound] = {
    "learning_rate": NON_NEGATIVE,
    "weight_decay": NON_NEGATIVE,
    "adam_beta1": Interval(ge=0, lt=1),
    "adam_beta2": Interval(ge=0, lt=1),
    "adam_epsilon": NON_NEGATIVE,
    "max_grad_norm": NON_NEGATIVE,
    "warmup_ratio": UNIT,
    "warmup_steps": NON_NEGATIVE,
    "seed": SEED,
    "data_seed": SEED,
    "per_device_train_batch_size": AT_LEAST_ONE,
    "gradient_accumulation_steps": AT_LEAST_ONE,
    "num_generations": Ge(2),
    "max_completion_length": AT_LEAST_ONE,
    "num_iterations": AT_LEAST_ONE,
    "steps_per_generation": AT_LEAST_ONE,
    "generation_batch_size": AT_LEAST_ONE,  # 0: TRL's __post_init__ divides by it
    "temperature": POSITIVE,
    "top_p": Interval(gt=0, le=1),
    "top_k": NON_NEGATIVE,
    "min_p": UNIT,
    "repetition_penalty": POSITIVE,
    "logging_steps": POSITIVE,
    "save_steps": POSITIVE,
    "lora_r": AT_LEAST_ONE,  # TRL's ModelConfig: peft takes r=0 or a dropout of 1.5 and fails after the model loads
    "lora_alpha": POSITIVE,
    "lora_dropout": Interval(ge=0, lt=1),
    "top_entropy_quantile": Interval(gt=0, le=1),
}


# Fields TRL 1.16 annotates `int | None` but computes with (GRPOConfig.__post_init__ divides by num_generations;
# the completion length sizes every batch): None is no default there.
NOT_NULL = ("num_generations", "max_completion_length")


@functools.lru_cache(maxsize=None)
def ranged(cls: type) -> frozenset[str]:
    """The fields of ``cls`` (an ictrl config class) with a bound: declared in their annotation, or in RANGES."""
    return frozenset({name for name, (_, bound) in declared(cls).items() if bound is not None} | set(RANGES))


def check_trains_something(args: Any) -> None:
    """``max_steps`` >= 1, or -1 (transformers' "train num_train_epochs epochs") with epochs > 0."""
    steps, epochs = args.max_steps, args.num_train_epochs
    if steps == 0 or steps < -1:
        raise ValueError(f"max_steps: must be >= 1, or -1 to train num_train_epochs epochs; got "
                          f"{quote(steps)}, which trains nothing")
    if steps == -1 and not epochs > 0:
        raise ValueError(f"num_train_epochs: must be > 0 when max_steps is -1 (unset), got "
                          f"{quote(epochs)}, which trains nothing")


# tracker name (as transformers' report_to spells it) -> (module that must import, pip install hint)
TRACKERS: dict[str, tuple[str, str]] = {
    "tensorboard": ("tensorboard", "pip install 'ictrl[tensorboard]'"),
    "wandb": ("wandb", "pip install wandb"),
    "trackio": ("trackio", "pip install trackio"),
    "mlflow": ("mlflow", "pip install mlflow"),
    "comet_ml": ("comet_ml", "pip install comet_ml"),
    "clearml": ("clearml", "pip install clearml"),
    "dvclive": ("dvclive", "pip install dvclive"),
    "swanlab": ("swanlab", "pip install swanlab"),
}


def report_to_list(value: str | Sequence[str] | None) -> list[str]:
    """transformers' ``report_to`` as a list: a list, a comma-separated string, "none"/None -> [], "all" kept."""
    if value is None:
        return []
    items = value.split(",") if isinstance(value, str) else list(value)
    return [n for n in (str(v).strip() for v in items) if n and n != "none"]


def check_trackers(value: str | Sequence[str] | None, option: str = "report_to") -> list[str]:
    """Each tracker known and its package importable; returns the list. A missing package names the install
    command (the ``tensorboard`` extra for TensorBoard)."""
    names = report_to_list(value)
    for name in names:
        if name == "all":
            continue
        if name not in TRACKERS:
            raise UserError(f"{option}: unknown tracker {name!r}{did_you_mean(name, TRACKERS)} "
                            f"(choose from none, all, {', '.join(TRACKERS)})")
        module, hint = TRACKERS[name]
        if importlib.util.find_spec(module) is None:
            raise MissingExtraError(f"{option}: {name} needs the {module!r} package, which is not installed: {hint}")
    return names


def check_liger(enabled: bool, option: str = "use_liger_kernel") -> None:
    """``use_liger_kernel`` in TRL 1.16's GRPOTrainer swaps in Liger's layer kernels (RMSNorm, RoPE, SwiGLU; its
    fused cross-entropy is refused by TRL), the same step up to kernel numerics; transformers imports the package
    only when training starts, after the model loaded. Checked here instead."""
    if enabled and importlib.util.find_spec("liger_kernel") is None:
        raise MissingExtraError(f"{option}: needs the liger-kernel package, which is not installed: "
                                "pip install liger-kernel (or trl's liger extra)")


# --- the TRL contract -----------------------------------------------------------------------------------------------

HONOURED, SELECTION, REFUSED = "honoured", "selection", "refused"

_GEN = "TRL's generation, which ictrl keeps"
_VLLM = "TRL's vLLM generation (docs/vllm.md)"
_LOG = "TRL's completion logging"
_ADAPTIVE = ("only read by use_adaptive_entropy, whose controller lives in TRL's loss, which ICTGRPOTrainer "
             "replaces; set a fixed entropy_coef")

GRPO_FIELDS: dict[str, tuple[str, str]] = {
    "model_init_kwargs": (HONOURED, "TRL's model loading (a model id), and ictrl train's model loading"),
    "trust_remote_code": (HONOURED, "TRL's model loading"),
    "router_aux_loss_coef": (HONOURED, "MoE router loss added as TRL does (TRL's dense forward; refused with "
                             "sparse_backward)"),
    "disable_dropout": (HONOURED, "TRL's model set-up"),
    "cast_lm_head_to_fp32": (HONOURED, "TRL's model set-up; the statistics pass reads the same head"),
    "num_generations": (HONOURED, "TRL's group size; ict and frequent keep each group on one process"),
    "num_generations_eval": (HONOURED, _GEN),
    "max_completion_length": (HONOURED, _GEN + "; also dr_grpo's constant"),
    "ds3_gather_for_generation": (HONOURED, _GEN),
    "shuffle_dataset": (HONOURED, "TRL's sampler"),
    "pad_to_multiple_of": (HONOURED, _GEN),
    "generation_batch_size": (HONOURED, "TRL's generation batch (the selection's batch scope)"),
    "steps_per_generation": (HONOURED, "TRL's buffer; the normalisers count each optimizer step's micro-batches"),
    "temperature": (HONOURED, _GEN + "; also the default selection_temperature"),
    "top_p": (HONOURED, _GEN),
    "top_k": (HONOURED, _GEN),
    "min_p": (HONOURED, _GEN),
    "generation_kwargs": (HONOURED, _GEN),
    "chat_template_kwargs": (HONOURED, _GEN),
    "repetition_penalty": (HONOURED, _GEN),
    "cache_implementation": (HONOURED, _GEN),
    "use_vllm": (HONOURED, _VLLM),
    "vllm_mode": (HONOURED, _VLLM),
    "vllm_model_impl": (HONOURED, _VLLM),
    "vllm_enable_sleep_mode": (HONOURED, _VLLM),
    "vllm_structured_outputs_regex": (HONOURED, _VLLM),
    "vllm_server_base_url": (HONOURED, _VLLM),
    "vllm_server_host": (HONOURED, _VLLM),
    "vllm_server_port": (HONOURED, _VLLM),
    "vllm_server_timeout": (HONOURED, _VLLM),
    "vllm_group_port": (HONOURED, _VLLM),
    "vllm_gpu_memory_utilization": (HONOURED, _VLLM),
    "vllm_max_model_length": (HONOURED, _VLLM),
    "vllm_tensor_parallel_size": (HONOURED, _VLLM),
    "beta": (SELECTION, "k3 KL as TRL; over the selected tokens or every response token: kl_scope"),
    "num_iterations": (HONOURED, "TRL's μ updates per generation batch; the selection is kept for all of them"),
    "epsilon": (HONOURED, "the clip range as TRL"),
    "delta": (HONOURED, "two-sided clipping as TRL"),
    "epsilon_high": (HONOURED, "the clip range as TRL (cispo: the ratio cap)"),
    "sapo_temperature_neg": (HONOURED, "loss_type='sapo' as TRL"),
    "sapo_temperature_pos": (HONOURED, "loss_type='sapo' as TRL"),
    "vespo_k_pos": (HONOURED, "loss_type='vespo' as TRL"),
    "vespo_lambda_pos": (HONOURED, "loss_type='vespo' as TRL"),
    "vespo_k_neg": (HONOURED, "loss_type='vespo' as TRL"),
    "vespo_lambda_neg": (HONOURED, "loss_type='vespo' as TRL"),
    "importance_sampling_level": (SELECTION, "'sequence' (GSPO): one ratio per response, the mean log-ratio over "
                                  "its selected tokens (docs/method.md §7)"),
    "reward_weights": (HONOURED, "TRL's rewards"),
    "multi_objective_aggregation": (HONOURED, "TRL's rewards"),
    "scale_rewards": (HONOURED, "TRL's advantages"),
    "loss_type": (SELECTION, "the per-token policy term as TRL; with 'all' also TRL's normaliser, with a sparse "
                  "method its registered normaliser (loss_normalization; vespo refused: whole-response weight)"),
    "mask_truncated_completions": (HONOURED, "TRL's completion mask, which every selection lies within"),
    "sync_ref_model": (HONOURED, "TRL's reference-model callback"),
    "ref_model_mixup_alpha": (HONOURED, "TRL's reference-model callback"),
    "ref_model_sync_steps": (HONOURED, "TRL's reference-model callback"),
    "top_entropy_quantile": (SELECTION, "TRL's per-micro-batch entropy mask, made as TRL does; only with "
                             "token_selector 'all' (else two selections), KL over all tokens as TRL"),
    "entropy_coef": (SELECTION, "TRL's bonus, the micro-batch's mean entropy over the selected tokens (TRL: over "
                     "its entropy mask); refused with sparse_backward"),
    "use_adaptive_entropy": (REFUSED, "its controller lives in TRL's loss, which ICTGRPOTrainer replaces; set a "
                             "fixed entropy_coef"),
    "entropy_coef_min": (REFUSED, _ADAPTIVE),
    "entropy_coef_max": (REFUSED, _ADAPTIVE),
    "entropy_coef_delta": (REFUSED, _ADAPTIVE),
    "entropy_target": (REFUSED, _ADAPTIVE),
    "max_tool_calling_iterations": (HONOURED, "TRL's tool loop; tool outputs leave the mask as in TRL, and every "
                                              "token selection"),
    "vllm_importance_sampling_correction": (SELECTION, "TRL's weight on the policy term (not the KL term), at the "
                                            "selected tokens; also for a rollout_func that reports log-probs"),
    "vllm_importance_sampling_mode": (SELECTION, "as TRL; a sequence weight spans every response token"),
    "vllm_importance_sampling_clip_max": (HONOURED, "as TRL"),
    "vllm_importance_sampling_clip_min": (HONOURED, "as TRL"),
    "off_policy_mask_threshold": (SELECTION, "as TRL; the mean gap spans every response token"),
    "use_bias_correction_kl": (HONOURED, "KL times the ratio as TRL"),
    "log_completions": (HONOURED, _LOG),
    "log_multimodal": (HONOURED, _LOG),
    "num_completions_to_print": (HONOURED, _LOG),
    "log_unique_prompts": (HONOURED, _LOG),
    "log_completions_hub_repo": (HONOURED, _LOG),
    "use_transformers_continuous_batching": (HONOURED, _GEN),
    "transformers_continuous_batching_config": (HONOURED, _GEN),
    "use_transformers_paged": (HONOURED, "TRL's deprecated alias of use_transformers_continuous_batching"),
    "vllm_importance_sampling_cap": (HONOURED, "TRL's deprecated alias of vllm_importance_sampling_clip_max"),
    "use_liger_kernel": (HONOURED, "TRL 1.16 patches the model with Liger's kernels (no fused loss)"),
    "liger_kernel_config": (HONOURED, "as use_liger_kernel"),
}

# transformers.TrainingArguments' fields: its Trainer runs them (optimizer, schedule, precision, checkpoints,
# logging, distribution), and ICTGRPOTrainer replaces none of that.
TRAINING_ARGUMENTS = tuple("""
output_dir per_device_train_batch_size num_train_epochs max_steps learning_rate lr_scheduler_type
lr_scheduler_kwargs warmup_steps optim optim_args weight_decay adam_beta1 adam_beta2 adam_epsilon
optim_target_modules gradient_accumulation_steps average_tokens_across_devices max_grad_norm
label_smoothing_factor bf16 fp16 bf16_full_eval fp16_full_eval tf32 gradient_checkpointing
gradient_checkpointing_kwargs torch_compile torch_compile_backend torch_compile_mode use_cache neftune_noise_alpha
torch_empty_cache_steps auto_find_batch_size logging_strategy logging_steps logging_first_step log_on_each_node
logging_nan_inf_filter include_num_input_tokens_seen log_level log_level_replica disable_tqdm report_to run_name
project trackio_space_id trackio_bucket_id trackio_static_space_id eval_strategy eval_steps eval_delay
per_device_eval_batch_size prediction_loss_only eval_on_start eval_do_concat_batches eval_use_gather_object
eval_accumulation_steps include_for_metrics batch_eval_metrics save_only_model save_strategy save_steps
save_on_each_node save_total_limit enable_jit_checkpoint push_to_hub hub_token hub_private_repo hub_model_id
hub_strategy hub_always_push hub_revision load_best_model_at_end metric_for_best_model greater_is_better
ignore_data_skip restore_callback_states_from_checkpoint full_determinism seed data_seed use_cpu
accelerator_config parallelism_config dataloader_drop_last dataloader_num_workers dataloader_pin_memory
dataloader_persistent_workers dataloader_prefetch_factor dataloader_multiprocessing_context dataloader_in_order
remove_unused_columns label_names train_sampling_strategy length_column_name ddp_find_unused_parameters
ddp_bucket_cap_mb ddp_broadcast_buffers ddp_static_graph ddp_backend ddp_timeout fsdp fsdp_config deepspeed debug
skip_memory_metrics do_train do_eval do_predict resume_from_checkpoint local_rank
""".split())

TABLE_START, TABLE_END = "<!-- grpo-config-table: start -->", "<!-- grpo-config-table: end -->"


def refused_field_errors(config: object, defaults: dict[str, object]) -> list[str]:
    """One line per refused field of ``config`` set to a value other than TRL's default ``defaults[name]``."""
    return [f"{name}={getattr(config, name)!r} is not supported by ICTGRPOTrainer: {note}"
            for name, (status, note) in GRPO_FIELDS.items()
            if status == REFUSED and getattr(config, name) != defaults[name]]
