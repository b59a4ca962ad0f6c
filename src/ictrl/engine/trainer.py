"""``ICTGRPOTrainer``: TRL's ``GRPOTrainer`` with a token-selection mask and ictrl's normalised loss.

Override points (all checked against trl 1.16.0 by ``tests/engine/test_trainer.py``):

- ``_generate_and_score_completions``: after TRL builds a generation batch, one no-grad pass over the
  sampling-policy logits gives the per-token statistics (``ictrl.core.stats``; group JS only for ict/frequent, from
  each position's top-K log-probs when ``selection_topk`` is set), the selection runs (``ictrl.core.selection.select``)
  on the whole generation batch gathered from all processes, and the local rows of the bool mask are attached as
  ``batch["ictrl_selected"]`` [B, T]. TRL's shuffle/split across ``steps_per_generation`` then carries it with the
  other [B, ...] tensors.
- Where the statistics come from (``ictrl.engine.onepass``, logged as ``ictrl/stats_path``): on-policy with one
  micro-batch per generation batch they come from the loss's own forward (the selection is then made in
  ``_compute_loss`` and ``ictrl_selected`` is attached there); when TRL computes old log-probs its no-grad pass is
  the statistics pass (``_get_per_token_logps_and_entropies``); ``all`` and the selectors without group JS read
  TRL's fused head. Otherwise the separate pass above runs (``one_pass = False`` forces it).
- ``_prepare_inputs``: when TRL has just buffered a new generation batch, attach the global normalisers of each
  optimizer step (responses, tokens summed over its micro-batches and all processes) as 0-d tensors.
- ``_generate_single_turn`` (only with ``selection_topk`` taken from the sampler, ``ictrl.engine.sampler_topk``):
  transformers ``generate`` runs with a logits processor that records each step's top-K log-probs; with vLLM the
  rollout asks for ``logprobs=K`` and the sampled token's own log-prob is handed on to TRL. The statistics pass then
  skips its top-K sweep over the LM head.
- ``_compute_loss``: TRL's fused per-token log-probs (or, with ``sparse_backward``, the LM head over the selected
  positions only: ``ictrl.core.logprobs``), then ``ictrl.core.loss.policy_loss`` with the mask, the chosen
  normalisation, TRL's per-token objective (``loss_type``, ``importance_sampling_level``, ``delta``, KL options,
  ``off_policy_mask_threshold``: ``ICTGRPOConfig.loss_objective``) and the global normalisers divided by the process
  count (DDP averages gradients), so any split of one optimizer batch over micro-batches and processes gives the
  one-big-batch gradient. TRL's entropy bonus, its ``top_entropy_quantile`` mask and a MoE model's router loss come
  from TRL's own dense forward, as in TRL. When the rollout engine reported its own log-probs
  (``sampling_per_token_logps``: vLLM, or a ``rollout_func``) and ``vllm_importance_sampling_correction`` is on,
  the policy term carries TRL's sampler/trainer importance weight (``vllm_importance_sampling_mode`` /
  ``_clip_min`` / ``_clip_max``), with every selector and normaliser. docs/trl-contract.md lists every
  ``GRPOConfig`` field.

Groups and processes: TRL's sampler places each prompt's G completions contiguously in the global generation
batch, and process p holds rows [p·n, (p+1)·n). Group JS needs each group's full distributions, so for ict and
frequent we require n (= per_device_train_batch_size · steps_per_generation) to be a multiple of G, checked at
init and, at run time, by checking that the prompts within each local block of G rows are identical. Everything
else (selection in every scope, metrics) works on [B, T] tensors gathered from all processes, so every process
computes the same global mask as a single process would.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from trl import GRPOTrainer

from ictrl.engine.config import ICTGRPOConfig
from ictrl.engine.dynamic_sampling import DynamicSamplingMixin
from ictrl.engine.head import call_head
from ictrl.engine.onepass import STATS_PATHS, OnePassMixin, fused_head_with_sum_sq
from ictrl.engine.sampler_topk import TopKRecorder, TopKRows, recording_generate, split_vllm_logprobs
from ictrl.core.logprobs import selected_token_logprobs
from ictrl.core.loss import TRL_BUFFER_MEAN, policy_loss
from ictrl.core.selection import get_selector, in_warmup
from ictrl.core.stats import TokenStats, group_js_divergence_topk, token_stats, topk_log_softmax

_STAT_FIELDS = ("entropy", "renyi2", "purity", "logprob", "prob")


class ICTGRPOTrainer(OnePassMixin, DynamicSamplingMixin, GRPOTrainer):
    """``GRPOTrainer(model, reward_funcs, args, train_dataset, eval_dataset, processing_class, ...)`` with
    ``args`` an :class:`ICTGRPOConfig`. Logs ``ictrl/*`` metrics next to TRL's."""

    def __init__(self, model: Any, reward_funcs: Any, args: ICTGRPOConfig | None = None, *pos: Any,
                 **kwargs: Any) -> None:
        if not isinstance(args, ICTGRPOConfig):
            raise ValueError(f"args must be an ICTGRPOConfig, got {type(args).__name__}")
        with fused_head_with_sum_sq():
            super().__init__(model, reward_funcs, args, *pos, **kwargs)
        per_process = args.per_device_train_batch_size * args.steps_per_generation
        self._needs_js = "ict_score" in get_selector(args.token_selector).needs
        if self._needs_js and per_process % self.num_generations != 0:
            raise ValueError(
                f"token_selector={args.token_selector!r} computes group JS on each process, so each prompt's "
                f"num_generations={self.num_generations} completions must sit on one process: "
                f"per_device_train_batch_size * steps_per_generation = {per_process} must be a multiple of it"
            )
        self._objective = args.loss_objective()
        if args.sparse_backward and self.aux_loss_enabled:
            raise ValueError("router_aux_loss_coef: the MoE router loss comes with TRL's dense forward, which "
                             "sparse_backward replaces; set router_aux_loss_coef=0 or turn sparse_backward off")
        self._sampler_topk = self._resolve_topk_source()
        self._rollout_topk: TopKRows | None = None
        self._rollout_calls = 0
        if self._sampler_topk is not None and self.use_vllm:
            self._install_vllm_topk()
        text_config = self.model.config.get_text_config()
        for attr in ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier"):
            if getattr(text_config, attr, None) not in (None, 1, 1.0):
                raise ValueError(f"model config sets {attr}; the statistics pass reads raw LM-head logits and "
                                 "does not apply it")

    # ------------------------------------------------------------------------------------- statistics pass

    @torch.no_grad()
    def _selection_stats(self, batch: dict[str, Any], mask: Tensor, group_ids: Tensor | None,
                         sampler_topk: tuple[Tensor, Tensor] | None = None) -> tuple[TokenStats, Tensor | None]:
        """Statistics of the sampling policy at every completion position, from one no-grad pass.

        The model runs through its engine (``self.model``: FSDP2 / ZeRO-3 hooks gather each layer) over
        prompt+completion in row chunks, keeping the final-norm hidden states; the LM head then sweeps blocks of
        positions with the head's whole weight, gathered once by the engine (:func:`call_head`), so at most ``stats_chunk_size`` rows of [V] logits exist at once, with every group intact (JS at
        position t needs only the group's distributions at t). With ``selection_topk`` = K the group JS comes
        from each position's top-K log-probs (``group_js_divergence_topk``) instead of the full sweep:
        ``sampler_topk`` ([B, T, K] log-probs and ids recorded at generation) when given, else the head's logits.

        Returns TokenStats with [B, T] fields and the [B, T] group JS (None when ``group_ids`` is None).
        """
        args = self.args
        prompt_ids, completion_ids = batch["prompt_ids"], batch["completion_ids"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        T = completion_ids.size(1)
        B = input_ids.size(0)
        # B is the same on every process, so every process makes the same number of (collective) forwards.
        rows = args.per_device_train_batch_size if self.model.training else args.per_device_eval_batch_size
        hidden = [self._final_hidden(self.model, input_ids[r0:r0 + rows], attention_mask[r0:r0 + rows], T)
                  for r0 in range(0, B, rows)]
        return self._hidden_stats(torch.cat(hidden), mask, completion_ids, group_ids, sampler_topk)

    @torch.no_grad()
    def _hidden_stats(self, hidden: Tensor, mask: Tensor, completion_ids: Tensor, group_ids: Tensor | None,
                      sampler_topk: tuple[Tensor, Tensor] | None = None) -> tuple[TokenStats, Tensor | None]:
        """The statistics sweep of :meth:`_selection_stats` over [B, T, H] final-norm hidden states (no grad)."""
        args = self.args
        B, T = mask.shape
        tau = args.selection_temperature
        topk = args.selection_topk if group_ids is not None else None
        head_topk = topk is not None and sampler_topk is None
        block = max(1, args.stats_chunk_size // B)

        def sweep(lm: nn.Module | Tensor, hidden_all: Tensor) -> tuple[list[TokenStats], list[tuple[Tensor, Tensor]]]:
            parts: list[TokenStats] = []
            topk_parts: list[tuple[Tensor, Tensor]] = []
            for t0 in range(0, T, block):
                h = hidden_all[:, t0:t0 + block]
                # Under bf16 the head's output is bf16 unless TRL's cast_lm_head_to_fp32=True made the head fp32.
                logits = (lm(h) if isinstance(lm, nn.Module) else F.linear(h.to(lm.dtype), lm)).float()
                m = mask[:, t0:t0 + block]
                # One sweep gives the token statistics and, with group_ids (exact score), the group JS; its
                # internal chunking is left at ictrl.core.stats' cache-sized default.
                parts.append(token_stats(logits, m, tokens=completion_ids[:, t0:t0 + block], temperature=tau,
                                         group_ids=group_ids if topk is None else None))
                if head_topk:
                    topk_parts.append(topk_log_softmax(logits, topk, tau))
                del logits
            return parts, topk_parts

        with self.accelerator.autocast():
            parts, topk_parts = call_head(self._output_head(self.model), sweep, hidden)
        stats = TokenStats(**{f: torch.cat([getattr(p, f) for p in parts], dim=1) for f in _STAT_FIELDS})
        if group_ids is None:
            return stats, None
        if topk is not None:
            if sampler_topk is None:
                sampler_topk = (torch.cat([lp for lp, _ in topk_parts], dim=1),
                                torch.cat([ids for _, ids in topk_parts], dim=1))
            return stats, group_js_divergence_topk(*sampler_topk, mask, group_ids)
        return stats, torch.cat([p.ict_score for p in parts], dim=1)

    def _final_hidden(self, model: Any, input_ids: Tensor, attention_mask: Tensor, T: int) -> Tensor:
        """[B, T, H] final-norm hidden states that predict the last T tokens (the LM head's input), from the
        model's own forward (engine hooks run; ``logits_to_keep=1`` keeps its head to one position)."""
        with self.accelerator.autocast():
            out = model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True,
                        logits_to_keep=1, use_cache=False)
        return out.hidden_states[-1][:, -T - 1:-1]  # position P-1+t predicts completion token t

    def _output_head(self, model: Any) -> nn.Module:
        unwrapped = self.accelerator.unwrap_model(model)
        if hasattr(unwrapped, "get_base_model"):  # PEFT: adapters live inside the base model's modules
            unwrapped = unwrapped.get_base_model()
        return unwrapped.get_output_embeddings()

    def _gather_rows(self, x: Tensor, pad: float | int = 0) -> Tensor:
        """[B_local, T_local] → [B_global, T_max]: the generation batch of all processes, in TRL's row order."""
        x = self.accelerator.pad_across_processes(x, dim=1, pad_index=pad)
        return self.accelerator.gather(x)

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        self._rollout_topk, self._rollout_calls = None, 0
        args = self.args
        mode = "train" if self.model.training else "eval"
        G = self.num_generations if mode == "train" else self.num_generations_eval
        warm = in_warmup(int(self.state.global_step), args.selection_warmup_steps)
        need_js = self._needs_js and not warm
        path = self._plan_stats_path(need_js)
        request = {"need_js": need_js, "G": G} if path == "shared_old_logps" else None
        with self._serving_old_logps(request):
            batch = super()._generate_and_score_completions(inputs)
        rollout_topk, self._rollout_topk = self._rollout_topk, None
        if "pixel_values" in batch:
            raise ValueError("ICTGRPOTrainer supports text-only models (its statistics pass has no image inputs)")
        start = time.perf_counter()
        mask = batch["completion_mask"].bool()
        if "tool_mask" in batch:
            mask = mask & batch["tool_mask"].bool()
        B, T = mask.shape
        rank = self.accelerator.process_index
        metrics = self._metrics[mode]
        if path == "training_forward" and self._importance_correction(batch):
            path = "separate"  # the sampler's log-probs need π_old at generation (_ensure_old_logps)
        if path == "training_forward":  # statistics and selection come with the loss's forward
            batch["ictrl_row"] = rank * B + torch.arange(B, device=mask.device)
            if self._stat_free():
                batch["ictrl_selected"] = self._select_and_log(mask, None, None, batch["advantages"], G, warm, mode)
            return batch
        shared = self._shared_stats
        self._shared_stats = None
        if path == "shared_old_logps" and shared is not None and shared[0] == B and "tool_mask" not in batch:
            _, stats, js = shared
        else:
            path = "separate"
            local_groups = None
            if need_js:
                self._check_local_groups(batch, G)
                local_groups = (rank * B + torch.arange(B, device=mask.device)) // G
            sampler_topk = self._recorded_topk(rollout_topk, B, T, mask.device) if need_js else None
            stats, js = self._selection_stats(batch, mask, local_groups, sampler_topk)
            metrics["ictrl/topk_from_sampler"].append(float(sampler_topk is not None))
        self._ensure_old_logps(batch)
        batch["ictrl_selected"] = self._select_and_log(mask, stats, js, batch["advantages"], G, warm, mode)
        metrics["ictrl/stats_path"].append(STATS_PATHS[path])
        metrics["ictrl/stats_time"].append(time.perf_counter() - start)
        return batch

    # --------------------------------------------------------------------------------- global normalisers

    def _prepare_inputs(self, generation_batch: Any) -> dict[str, Any]:
        previous = self._buffered_inputs
        inputs = super()._prepare_inputs(generation_batch)
        if "ictrl_selected" not in inputs:
            pass  # path training_forward: the selection, and so the normalisers, come with the loss's forward
        elif not self.model.training:
            self._attach_normalisers([inputs], accumulation=1)
        elif self._buffered_inputs is not previous:
            self._attach_normalisers(self._buffered_inputs, self.args.gradient_accumulation_steps)
        return inputs

    def _attach_normalisers(self, batches: list[dict[str, Any]], accumulation: int) -> None:
        """Attach ``ictrl_num_responses`` / ``ictrl_num_tokens`` (0-d): totals over each optimizer step's
        micro-batches on all processes.

        Exact when the buffered micro-batches split into whole optimizer steps (steps_per_generation a multiple
        of gradient_accumulation_steps, TRL's default); otherwise an optimizer step spans several generation
        batches not yet generated, and the buffer's totals are scaled by accumulation / len(batches), as TRL's
        'dapo' normaliser does. TRL's own token-mean loss types (dapo, cispo, vespo under ``all``) always take that
        buffer average, as TRL does.
        """
        counts = []
        for b in batches:
            mask = b["completion_mask"].bool()
            if "tool_mask" in b:
                mask = mask & b["tool_mask"].bool()
            selected = b["ictrl_selected"] & mask
            counts.append(torch.stack([torch.tensor(float(mask.size(0))), selected.sum().double().cpu(),
                                       mask.sum().double().cpu()]))
        local = torch.stack(counts).double()  # [n, 3]
        n = local.size(0)
        trl_average = get_selector(self.args.token_selector).trl_loss and self.args.loss_type in TRL_BUFFER_MEAN
        if n % accumulation == 0 and not trl_average:
            windows = local.view(n // accumulation, accumulation, 3).sum(dim=1)
            index = [i // accumulation for i in range(n)]
        else:
            windows = local.sum(dim=0, keepdim=True) * (accumulation / n)
            index = [0] * n
        device = self.accelerator.device
        windows = self.accelerator.reduce(windows.to(device), reduction="sum")
        token_col = 1 if self.args.loss_normalization == "token_mean_selected" else 2
        for b, w in zip(batches, index):
            b["ictrl_num_responses"] = windows[w, 0].clone()
            b["ictrl_num_tokens"] = windows[w, token_col].clone()
            b["ictrl_num_mask_tokens"] = windows[w, 2].clone()

    # -------------------------------------------------------------------------------------------- loss

    def _selected_logps(self, model: Any, input_ids: Tensor, attention_mask: Tensor, completion_ids: Tensor,
                        selected: Tensor) -> Tensor:
        """[B, T] log π_θ of the completion tokens with the LM head applied only where ``selected`` (0 elsewhere).

        The backbone runs through ``model`` (DDP / FSDP2 / ZeRO-3 hooks run); ``hidden_states[-1]`` is the
        final-norm output (the LM head's input). The sparse head then gets the head's whole weight from
        :func:`call_head`, so a sharded engine gathers it and reduces its gradient as for the model's own head. ``sparse_backward`` docs: ICTGRPOConfig.
        """
        hidden = self._final_hidden(model, input_ids, attention_mask, completion_ids.size(1))
        return self._sparse_head(model, hidden, completion_ids, selected)

    def _sparse_head(self, model: Any, hidden: Tensor, completion_ids: Tensor, selected: Tensor) -> Tensor:
        """[B, T] log π_θ from [B, T, H] hidden states, the head with grad on ``selected`` only (0 elsewhere)."""

        def sparse_head(lm: nn.Module | Tensor, h: Tensor) -> Tensor:
            return selected_token_logprobs(h, lm, completion_ids, selected, temperature=self.temperature)

        with self.accelerator.autocast():
            return call_head(self._output_head(model), sparse_head, hidden)

    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> Tensor:
        prompt_ids, completion_ids = inputs["prompt_ids"], inputs["completion_ids"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        mask = inputs["completion_mask"].bool()
        if "tool_mask" in inputs:
            mask = mask & inputs["tool_mask"].bool()
        entropy = aux = None
        quantile = self.top_entropy_quantile < 1.0
        if self._dense_trl_forward():  # entropy mask, entropy bonus, MoE router loss: TRL's own forward
            logps, entropy, aux = self._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, completion_ids.size(1),
                compute_entropy=self._entropy_bonus_enabled or quantile, compute_aux_loss=self.aux_loss_enabled)
            if quantile:  # TRL's own mask over this micro-batch on all processes
                inputs = {**inputs, "ictrl_selected": inputs["ictrl_selected"] & self.get_high_entropy_mask(
                    entropy, mask, 1.0 - self.top_entropy_quantile)}
        elif "ictrl_row" in inputs:
            logps = self._training_forward_logps(model, inputs, input_ids, attention_mask, mask)
        elif self.args.sparse_backward:
            logps = self._selected_logps(model, input_ids, attention_mask, completion_ids,
                                         inputs["ictrl_selected"] & mask)
        else:
            logps, _, _ = self._get_per_token_logps_and_entropies(model, input_ids, attention_mask,
                                                                  completion_ids.size(1))
        old = inputs.get("old_per_token_logps")
        old = logps.detach() if old is None else old
        ref = inputs.get("ref_per_token_logps") if self.beta != 0.0 else None
        args = self.args
        selected = inputs["ictrl_selected"]  # on the training_forward path, made by its forward above
        training = self.model.training
        # set by the Trainer's loop (its last window may be shorter); outside it, the configured value
        accumulation = getattr(self, "current_gradient_accumulation_steps", args.gradient_accumulation_steps) \
            if training else 1
        # DDP averages the processes' gradients, so each process divides by (global count / processes); TRL's
        # bnpo token mean is the micro-batch's own count, scaled for accumulation only.
        world = self.accelerator.num_processes
        num_tokens = inputs["ictrl_num_tokens"] / world
        if args.loss_type == "bnpo":
            count = selected & mask if args.loss_normalization == "token_mean_selected" else mask
            num_tokens = count.sum().to(logps.dtype) * accumulation
        loss, m = policy_loss(
            logps, old, inputs["advantages"], mask, selected,
            eps_low=self.epsilon_low, eps_high=self.epsilon_high, norm=args.loss_normalization,
            ref_logprobs=ref, kl_coef=self.beta,
            num_responses=inputs["ictrl_num_responses"] / world, num_tokens=num_tokens,
            num_mask_tokens=inputs["ictrl_num_mask_tokens"] / world,
            max_completion_length=args.max_completion_length,
            sampler_logprobs=inputs.get("sampling_per_token_logps") if self._importance_correction(inputs) else None,
            is_mode=args.vllm_importance_sampling_mode, is_clip_min=args.vllm_importance_sampling_clip_min,
            is_clip_max=args.vllm_importance_sampling_clip_max, objective=self._objective,
            behaviour_logprobs=inputs.get("sampling_per_token_logps"),
        )
        if self._entropy_bonus_enabled and entropy is not None:
            # TRL's bonus: the micro-batch's mean entropy over the tokens that carry the loss
            where = (selected & mask).to(entropy.dtype)
            loss = loss - self.entropy_coef * (entropy * where).sum() / where.sum().clamp(min=1.0) / accumulation
        if aux is not None:
            loss = loss + self.router_aux_loss_coef * aux / accumulation
        self._log_loss_metrics(m, (selected & mask).sum().float())
        return loss

    def _dense_trl_forward(self) -> bool:
        return bool(self._entropy_bonus_enabled or self.aux_loss_enabled or self.top_entropy_quantile < 1.0)

    def _log_loss_metrics(self, m: dict[str, Tensor], active: Tensor) -> None:
        mode = "train" if self.model.training else "eval"
        keys = [k for k in ("clip_frac", "clip_frac_low", "clip_frac_high", "kl", "mean_prob_selected",
                            "is_ratio_mean", "is_clipped_frac") if k in m]
        local = torch.stack([m[k].float() * active for k in keys] + [active])
        total = self.accelerator.reduce(local, reduction="sum")  # token-weighted means over all processes
        for k, v in zip(keys, total[:-1]):
            self._metrics[mode][f"ictrl/{k}"].append(float(v / total[-1].clamp(min=1.0)))

    # ------------------------------------------------------------------ sampler top-K and importance weights

    def _resolve_topk_source(self) -> int | None:
        """K when the ICT score's top-K log-probs are recorded by the sampler, else None (the head's logits)."""
        args = self.args
        if args.selection_topk is None or not self._needs_js or args.selection_topk_source == "head":
            return None
        why = self._sampler_topk_obstacle()
        if why is None:
            return args.selection_topk
        if args.selection_topk_source == "sampler":
            raise ValueError(f"selection_topk_source='sampler': {why}; use 'auto' or 'head' to score from the LM head")
        return None

    def _sampler_topk_obstacle(self) -> str | None:
        """Why the sampler cannot record the distribution the statistics pass scores (None: it can)."""
        args = self.args
        if self.rollout_func is not None or self.tools or self.use_transformers_continuous_batching:
            return "a rollout_func, tools or continuous batching generate outside the hooked call"
        if getattr(args, "dynamic_sampling", False):
            return "dynamic sampling regenerates and regroups rows after the hooked call"
        if self.repetition_penalty != 1.0 or args.generation_kwargs:
            return "repetition_penalty != 1 or generation_kwargs change the sampler's logits"
        if not self.use_vllm:
            return None
        if args.selection_temperature != self.temperature:
            return "vLLM reports log-probs at the sampling temperature, and selection_temperature differs"
        if self.top_p != 1.0 or self.top_k not in (None, 0, -1) or self.min_p not in (None, 0.0):
            return "vLLM reports log-probs after top_p/top_k/min_p truncation, which the statistics pass does not apply"
        if args.vllm_mode == "colocate" and args.selection_topk > 20:
            return "colocated vLLM caps logprobs at its default max_logprobs=20 (server mode lifts it)"
        return None

    def _generate_single_turn(self, prompt_ids: Any, images: Any, multimodal_fields: Any, num_generations: int,
                              has_tool_images: bool = False) -> Any:
        self._rollout_calls += 1
        K = self._sampler_topk
        if K is None or self.use_vllm:  # vLLM records through _vllm_generate_recording_topk
            return super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations,
                                                 has_tool_images)
        recorder = TopKRecorder(K, self.args.selection_temperature)
        with recording_generate(self.accelerator.unwrap_model(self.model_wrapped), recorder):
            out = super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations,
                                                has_tool_images)
        self._rollout_topk = recorder.rows()
        return out

    def _install_vllm_topk(self) -> None:
        """Ask vLLM for K log-probs per position and route its answers through _vllm_generate_recording_topk."""
        self.vllm_generation.logprobs = self._sampler_topk
        self._vllm_generate = self.vllm_generation.generate
        self.vllm_generation.generate = self._vllm_generate_recording_topk

    def _vllm_generate_recording_topk(self, *args: Any, **kwargs: Any) -> Any:
        """``VLLMGeneration.generate`` with logprobs=K: keep the top-K, hand TRL the sampled tokens' log-probs."""
        prompt_ids, completion_ids, logprobs, token_ids = self._vllm_generate(*args, **kwargs)
        if logprobs is None or token_ids is None:
            raise RuntimeError("vLLM returned no top-K log-probs (selection_topk_source)")
        sampled, self._rollout_topk = split_vllm_logprobs(logprobs, token_ids, completion_ids, self._sampler_topk)
        return prompt_ids, completion_ids, sampled, None

    def _importance_correction(self, batch: dict[str, Any]) -> bool:
        return bool(self.args.vllm_importance_sampling_correction) and "sampling_per_token_logps" in batch

    @torch.no_grad()
    def _ensure_old_logps(self, batch: dict[str, Any]) -> None:
        """The importance weight compares the sampler with the trainer's π_old at every response token; TRL
        computes ``old_per_token_logps`` itself for vLLM, not for a ``rollout_func`` that reports log-probs."""
        if not self._importance_correction(batch) or "old_per_token_logps" in batch:
            return
        input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        rows = self.args.per_device_train_batch_size if self.model.training else self.args.per_device_eval_batch_size
        batch["old_per_token_logps"], _, _ = self._get_per_token_logps_and_entropies(
            self.model, input_ids, attention_mask, batch["completion_ids"].size(1), batch_size=rows)
