"""``ICTGRPOTrainer``: TRL's ``GRPOTrainer`` training on the tokens a selector chooses, with ictrl's normalised
loss (docs/architecture.md, "One training step")."""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import replace
from functools import partial
from typing import Any

import torch
from torch import Tensor
from transformers import TrainerCallback
from trl import GRPOTrainer

from ictrl.core.checks import debug_checks
from ictrl.core.loss import LOSS_TYPES, LossExtras, policy_loss, policy_loss_unchecked
from ictrl.core.metrics import nan_extreme, trl_loss_metrics
from ictrl.core.selection import needed_stats
from ictrl.engine import vllm_engine
from ictrl.engine.config import ICTGRPOConfig
from ictrl.engine.config_fields import check_liger
from ictrl.engine.dynamic_sampling import DynamicSampling
from ictrl.engine.heads import backbone, logit_transform, output_head
from ictrl.engine.model_card import write_model_card
from ictrl.engine.resumable import Resumable
from ictrl.engine.rollout_ids import check_vocab, checked_rollout_func, raise_deferred_checks
from ictrl.engine.loss_inputs import (
    NORMALISERS, ROW, SELECTED, LossInputs, LossInputsBuilder, SelectionWatch, metrics_logged, model_inputs,
)
from ictrl.engine.stats_source import LossForward, StatsSource, StepContext, fused_head_stats, fused_head_with_sum_sq
from ictrl.engine.stats_paths import PathFacts, StatsPath, describe_statistics, plan_path
from ictrl.engine.reward_policy import RewardPolicy


class ICTGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer(model, reward_funcs=None, args=None, train_dataset, eval_dataset, processing_class, ...)`` with
    ``args`` an :class:`ICTGRPOConfig`. Logs ``ictrl/*`` metrics next to TRL's."""

    #: False: always the separate statistics pass (the reference the one-pass paths are tested against); read when
    #: the trainer is built, which decides the statistics path of each mode (``stats_paths``).
    one_pass: bool = True
    #: the command line that trained the model, for its card (``ictrl train`` sets it; None from Python)
    command: str | None = None

    def __init__(self, model: Any, reward_funcs: Any = None, args: ICTGRPOConfig | None = None, *pos: Any,
                 **kwargs: Any) -> None:
        from ictrl.engine.trl_args import as_ict_config, default_config  # a plain trl.GRPOConfig runs TRL's GRPO

        args = as_ict_config(args) if args is not None else default_config(model)  # none: TRL's GRPOConfig
        if not isinstance(args, ICTGRPOConfig):
            raise ValueError(f"args must be an ICTGRPOConfig, got {type(args).__name__}")
        if isinstance(model, str):  # offline, an uncached hub id is one error now, not a minute of hub retries
            from ictrl.hub import check_model

            check_model(model, "model", bool((args.model_init_kwargs or {}).get("trust_remote_code")))
        self.base_model = model if isinstance(model, str) else getattr(model.config, "_name_or_path", None) or "?"
        self.batch_filter, self.resumable = DynamicSampling(self), Resumable(self)  # parts, not mixins, as is:
        self.reward_policy = RewardPolicy.from_args(args, step=lambda: self.state.global_step)
        engine = vllm_engine.building_engine(model, args) if args.use_vllm else contextlib.nullcontext()
        if kwargs.get("rollout_func") is not None:  # its ids checked on the host, not a device-side assert
            kwargs["rollout_func"] = checked_rollout_func(kwargs["rollout_func"], lambda: self.vocab_sizes)
        with fused_head_with_sum_sq(), engine:
            super().__init__(model, reward_funcs, args, *pos, **kwargs)
        if args.use_vllm:
            vllm_engine.engine_built(self)
        self.add_callback(_ResumableEvents(self.resumable))
        # TRL's switch for its entropy bonus, from the public attributes TRL's __init__ derives it from (an adaptive
        # coefficient that starts at 0 still turns it on); it does not change during a run
        self.entropy_bonus = bool(self.entropy_coef != 0.0 or self.use_adaptive_entropy)
        # ids checked on the host at their boundary, not a device-side assert (ictrl.engine.rollout_ids): the
        # tokenizer's against the model's rows now; a user's rollout_func's each time it returns
        self.vocab_sizes = check_vocab(self.accelerator.unwrap_model(self.model), self.processing_class)
        needs = needed_stats(args.selector)  # selector, options, loss spec: resolved by the config
        self._vllm_server_settings = vllm_engine.server_settings(self)  # None unless vllm_mode='server'
        self._loss_spec = args.loss_spec
        if args.sparse_backward and self.aux_loss_enabled:
            raise ValueError("router_aux_loss_coef: the MoE router loss comes with TRL's dense forward, which "
                             "sparse_backward replaces; set router_aux_loss_coef=0 or turn sparse_backward off")
        self.inputs_builder = LossInputsBuilder(
            self.accelerator, args.selector, args.selector_options, args.selection_warmup_steps,
            count_selected=args.loss_normalization == "token_mean_selected",
            buffer_mean=args.selector.trl_loss and LOSS_TYPES[args.loss_type].buffer_mean,
            source=self._build_stats_source(needs), temperature=self.temperature, local_tokens=args.loss_type == "bnpo",
            seed=args.selection_seed,
            watch=SelectionWatch(args.no_signal_steps or 0, self.reward_policy.steps_per_batch))
        # each mode's statistics path, decided here once (docs/architecture.md, "Which statistics path a run takes")
        self.stats_paths: dict[str, StatsPath] = {
            mode: plan_path(self._path_facts(needs, mode == "train")) for mode in ("train", "eval")}
        logging.getLogger(__name__).info(describe_statistics(args.selector.rule, needs, self.stats_paths,
                                                             args.selection_warmup_steps, args.eval_strategy != "no"))
        vllm_engine.check_logprobs_mode(self._vllm_server_settings, args)
        check_liger(args.use_liger_kernel)  # after TRL's own checks, whose errors a TRL user catches

    def create_model_card(self, *args: Any, **kwargs: Any) -> None:
        """ictrl's card wherever TRL writes its own (``ictrl.engine.model_card``: TRL's names no local base model
        and no token selection)."""
        write_model_card(self, self.base_model, self.command)

    def _path_facts(self, needs: frozenset[str], training: bool) -> PathFacts:
        """What decides the statistics path of one mode (``ictrl.engine.stats_paths.plan_path``)."""
        args = self.args
        generate_every = args.steps_per_generation * self.num_iterations
        return PathFacts(
            one_pass=self.one_pass and not self._dense_trl_forward(),
            dynamic_sampling=bool(getattr(args, "dynamic_sampling", False)), stat_free=not needs,
            same_temperature=args.selection_temperature == self.temperature, training=training,
            trl_computes_old_logps=args.gradient_accumulation_steps % generate_every != 0 or bool(
                self.use_vllm and args.vllm_importance_sampling_correction),
            importance_correction=bool(args.vllm_importance_sampling_correction and (
                self.use_vllm or self.rollout_func is not None)),
            on_policy_single_micro_batch=self.num_iterations == 1 and args.steps_per_generation == 1)

    def _build_stats_source(self, needs: frozenset[str]) -> StatsSource:
        """The run's statistics source for a selector that reads the statistics ``needs``."""
        args = self.args
        return StatsSource(
            needs=needs, fused_stats=fused_head_stats(),
            same_temperature=args.selection_temperature == self.temperature,
            temperature=args.selection_temperature, topk=args.selection_topk, chunk_size=args.stats_chunk_size,
            vocab=int(self.model.config.get_text_config().vocab_size),
            rows={"train": args.per_device_train_batch_size, "eval": args.per_device_eval_batch_size},
            group_size={"train": self.num_generations, "eval": self.num_generations_eval},
            autocast=self.accelerator.autocast, head=partial(output_head, self.accelerator),
            backbone=partial(backbone, self.accelerator), transform=logit_transform(self.model.config),
            check=debug_checks())

    @property
    def stats_source(self) -> StatsSource:
        """The run's statistics source, as the loss-inputs builder holds it (settable: the builder is rebuilt with
        it)."""
        return self.inputs_builder.source

    @stats_source.setter
    def stats_source(self, source: StatsSource) -> None:
        self.inputs_builder = replace(self.inputs_builder, source=source)

    def _mode(self) -> str:
        return "train" if self.model.training else "eval"

    def _step_context(self) -> StepContext:
        """The step in progress as the paths and the builder read it (TRL's switches are read here, at every step)."""
        args, mode, training = self.args, self._mode(), self.model.training
        step = int(self.state.global_step)
        return StepContext(
            mode, self.num_generations if training else self.num_generations_eval, step,
            needed_stats(self.args.selector, self.inputs_builder.in_warmup(step)), self._metrics[mode],
            # set by the Trainer's loop (its last window may be shorter); outside it, the configured value
            accumulation=getattr(self, "current_gradient_accumulation_steps", args.gradient_accumulation_steps)
            if training else 1, window=args.gradient_accumulation_steps,
            logged=metrics_logged(args, self.state, self.is_in_train and training),
            dense=self._dense_trl_forward(), sparse=bool(args.sparse_backward),
            entropy_quantile=self.top_entropy_quantile, router_loss=bool(self.aux_loss_enabled))

    # ------------------------------------------------------------------------------------- generation

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        raise_deferred_checks()  # a failed device-side check of an earlier step: one line, before generating
        step = self._step_context()
        batch = self.batch_filter.generate(super()._generate_and_score_completions, inputs)  # rounds under DAPO
        if step.mode == "train":
            self.reward_policy.observe_batch(batch, self.accelerator.gather)
        if "pixel_values" in batch:
            raise ValueError("ICTGRPOTrainer supports text-only models (its statistics pass has no image inputs)")
        start = time.perf_counter()
        code = self.stats_paths[step.mode].at_generation(self.inputs_builder, self.model, batch, step)
        if code is not None:  # else the statistics come with the loss's forward
            step.metrics["ictrl/stats_path"].append(code)
            step.metrics["ictrl/stats_time"].append(time.perf_counter() - start)
        self._ensure_old_logps(batch)
        return batch

    # ------------------------------------------- the composed parts' hooks: dynamic sampling, exact resume

    def _calculate_rewards(self, *args: Any, **kwargs: Any) -> Tensor:
        scores = self.reward_policy.score(super()._calculate_rewards, self.reward_funcs, self.reward_func_names,
                                          *args, **kwargs)
        return self.batch_filter.keep_rewards(scores)

    def _get_train_sampler(self, dataset: Any = None) -> Any:
        return self.resumable.train_sampler(super()._get_train_sampler(dataset))

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        self.resumable.save_checkpoint(super()._save_checkpoint, model, trial)

    # ------------------------------------------------------------------------------------------ selection

    def _select(self, inputs: dict[str, Any], step: StepContext, path: StatsPath, out: LossForward | None) -> None:
        """The one selection of the generation batch the micro-batch ``inputs`` came from, and its normalisers.

        Made the first time the loss sees a micro-batch of a generation batch TRL has buffered, for the whole
        buffer at once (its statistics: ``path.statistics``; ``out``, the loss's forward of ``inputs``): every
        process reaches that micro-batch at the same step, so the collectives run at the same point on each, and the
        mask and normalisers ride in the buffered micro-batches to the later loss calls. In evaluation, or for a
        batch TRL did not buffer (a direct call), the batch is selected alone and is its own window."""
        buffered = (self._buffered_inputs or []) if self.model.training else []
        # TRL's buffered micro-batch, or a shallow copy of it (the same tensors)
        row = inputs.get(ROW)
        match = next((b for b in buffered if b is inputs or (row is not None and b.get(ROW) is row)), None)
        held = inputs if match is None else match
        if SELECTED not in held:
            batches, window = ([inputs], 1) if match is None else (buffered, self.args.gradient_accumulation_steps)
            self.inputs_builder.select_batches(batches, step, path.statistics(self.inputs_builder, batches, out),
                                              window)
        inputs.update({key: held[key] for key in (SELECTED, *NORMALISERS)})

    # -------------------------------------------------------------------------------------------- loss

    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> Tensor:
        step = self._step_context()
        correct = self._importance_correction(inputs)
        path = self.stats_paths[step.mode]
        out = path.loss_forward(self.inputs_builder, model, inputs, step)
        self._select(inputs, step, path, out)
        # log-probs, mask, selection, normalisers
        chosen = self.inputs_builder.for_loss(model, inputs, step, out)
        old = inputs.get("old_per_token_logps")
        old = chosen.logps.detach() if old is None else old
        ref = inputs.get("ref_per_token_logps") if self.beta != 0.0 else None
        sampler = inputs.get("sampling_per_token_logps")
        extras = LossExtras(ref_logprobs=ref, sampler_logprobs=sampler if correct else None,
                            behaviour_logprobs=sampler, **chosen.norm)
        # the step's own tensors: the unchecked body, unless ICTRL_DEBUG_CHECKS chose the checked face for the run
        loss_of = policy_loss if self.stats_source.check else policy_loss_unchecked
        loss, m = loss_of(chosen.logps, old, inputs["advantages"], chosen.mask, chosen.selected, self._loss_spec,
                          extras)
        policy = loss.detach()
        if self.entropy_bonus and chosen.entropy is not None:
            # TRL's bonus: the micro-batch's mean entropy over the tokens that carry the loss
            where = (chosen.selected & chosen.mask).to(chosen.entropy.dtype)
            loss = loss - self.entropy_coef * (chosen.entropy * where).sum() / where.sum().clamp(min=1.0) \
                / step.accumulation
        if chosen.aux is not None:
            loss = loss + self.router_aux_loss_coef * chosen.aux / step.accumulation
        # TRL's over the response tokens; under the sparse head, whose log-probs are the selected tokens' only, those
        trl = trl_loss_metrics(chosen.logps, old, inputs["advantages"],
                               chosen.mask if chosen.dense else chosen.mask & chosen.selected, self._loss_spec, ref,
                               chosen.entropy)
        self._log_loss_metrics(step, chosen, m, trl, policy)
        return loss

    def _dense_trl_forward(self) -> bool:
        return bool(self.entropy_bonus or self.aux_loss_enabled or self.top_entropy_quantile < 1.0)

    def _log_loss_metrics(self, step: StepContext, chosen: LossInputs, m: dict[str, Tensor],
                          trl: tuple[dict[str, tuple[Tensor, Tensor]], dict[str, Tensor]], policy: Tensor) -> None:
        """ictrl's loss metrics (token-weighted means over all processes) and TRL's own, as TRL computes them, read
        from the device in one transfer."""
        acc, metrics = self.accelerator, step.metrics
        active = (chosen.selected & chosen.mask).sum().float()
        keys = [k for k in ("clip_frac", "clip_frac_low", "clip_frac_high", "kl", "mean_prob_selected",
                            "is_ratio_mean", "is_clipped_frac") if k in m]
        total = acc.reduce(torch.stack([m[k].float() * active for k in keys] + [active]), reduction="sum")
        means, extremes = trl
        trl_total = acc.reduce(torch.stack([torch.stack([s.double(), n.double()]) for s, n in means.values()]),
                               reduction="sum") if means else total.new_zeros((0, 2)).double()
        names = [f"ictrl/{k}" for k in keys] + list(means) + list(extremes)
        values = [(total[:-1] / total[-1].clamp(min=1.0)).double(), trl_total[:, 0] / trl_total[:, 1].clamp(min=1.0)]
        values += [nan_extreme(acc.gather(x), key.endswith("_min")).double().reshape(1) for key, x in extremes.items()]
        if self.entropy_bonus:  # TRL's policy term before its accumulation scaling
            scale = 1 if LOSS_TYPES[self._loss_spec.loss_type].buffer_mean else step.accumulation
            names.append("policy_loss")
            values.append(acc.gather((policy * scale).reshape(1)).nanmean().double().reshape(1))
        if chosen.aux is not None:
            names.append("aux_loss")
            values.append(acc.gather_for_metrics(chosen.aux.detach()).mean().double().reshape(1))
        for name, value in zip(names, torch.cat(values).tolist()):
            metrics[name].append(value)
        if self.entropy_bonus and step.mode == "train" and acc.sync_gradients:
            metrics["entropy_coef"].append(self.entropy_coef)

    # ---------------------------------------------------------------------------------- importance weights

    def _importance_correction(self, batch: dict[str, Any]) -> bool:
        return bool(self.args.vllm_importance_sampling_correction) and "sampling_per_token_logps" in batch

    @torch.no_grad()
    def _ensure_old_logps(self, batch: dict[str, Any]) -> None:
        """The importance weight compares the sampler with the trainer's π_old at every response token; TRL
        computes ``old_per_token_logps`` itself for vLLM, not for a ``rollout_func`` that reports log-probs."""
        if not self._importance_correction(batch) or "old_per_token_logps" in batch:
            return
        input_ids, attention_mask = model_inputs(batch)
        batch["old_per_token_logps"], _, _ = self._get_per_token_logps_and_entropies(
            self.model, input_ids, attention_mask, batch["completion_ids"].size(1),
            batch_size=self.stats_source.rows[self._mode()])


class _ResumableEvents(TrainerCallback):
    """The Trainer's events the trainer's ``resumable`` part acts on: the sampler's epoch as each epoch begins, and
    no step for a run resumed at max_steps."""

    def __init__(self, resumable: Resumable) -> None:
        self.resumable = resumable

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.resumable.train_begins(state, control)

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.resumable.epoch_begins(state)
