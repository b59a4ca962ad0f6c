"""``ICTGRPOTrainer``: TRL's ``GRPOTrainer`` with a token-selection mask and ictrl's normalised loss.

Override points (all checked against trl 1.16.0 by ``tests/engine/test_trainer.py``):

- ``_generate_and_score_completions``: after TRL builds a generation batch, one no-grad pass over the
  sampling-policy logits gives the per-token statistics (``ictrl.stats``; group JS only for ict/frequent, from
  each position's top-K log-probs when ``selection_topk`` is set), the selection runs (``ictrl.selection.select``)
  on the whole generation batch gathered from all processes, and the local rows of the bool mask are attached as
  ``batch["ictrl_selected"]`` [B, T]. TRL's shuffle/split across ``steps_per_generation`` then carries it with the
  other [B, ...] tensors.
- ``_prepare_inputs``: when TRL has just buffered a new generation batch, attach the global normalisers of each
  optimizer step (responses, tokens summed over its micro-batches and all processes) as 0-d tensors.
- ``_compute_loss``: TRL's fused per-token log-probs (or, with ``sparse_backward``, the LM head over the selected
  positions only: ``ictrl.logprobs``), then ``ictrl.loss.policy_loss`` with the mask, the chosen
  normalisation and the global normalisers divided by the process count (DDP averages gradients), so any split
  of one optimizer batch over micro-batches and processes gives the one-big-batch gradient.

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
from torch import Tensor
from trl import GRPOTrainer

from ictrl.engine.config import ICTGRPOConfig
from ictrl.engine.dynamic_sampling import DynamicSamplingMixin
from ictrl.logprobs import selected_token_logprobs
from ictrl.loss import policy_loss
from ictrl.metrics import step_metrics
from ictrl.selection import SelectionInputs, get_selector, select
from ictrl.stats import TokenStats, group_js_divergence_topk, token_stats, topk_log_softmax

_STAT_FIELDS = ("entropy", "renyi2", "purity", "logprob", "prob")


class ICTGRPOTrainer(DynamicSamplingMixin, GRPOTrainer):
    """``GRPOTrainer(model, reward_funcs, args, train_dataset, eval_dataset, processing_class, ...)`` with
    ``args`` an :class:`ICTGRPOConfig`. Logs ``ictrl/*`` metrics next to TRL's."""

    def __init__(self, model: Any, reward_funcs: Any, args: ICTGRPOConfig | None = None, *pos: Any,
                 **kwargs: Any) -> None:
        if not isinstance(args, ICTGRPOConfig):
            raise ValueError(f"args must be an ICTGRPOConfig, got {type(args).__name__}")
        super().__init__(model, reward_funcs, args, *pos, **kwargs)
        per_process = args.per_device_train_batch_size * args.steps_per_generation
        self._needs_js = "ict_score" in get_selector(args.token_selector).needs
        if self._needs_js and per_process % self.num_generations != 0:
            raise ValueError(
                f"token_selector={args.token_selector!r} computes group JS on each process, so each prompt's "
                f"num_generations={self.num_generations} completions must sit on one process: "
                f"per_device_train_batch_size * steps_per_generation = {per_process} must be a multiple of it"
            )
        text_config = self.model.config.get_text_config()
        for attr in ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier"):
            if getattr(text_config, attr, None) not in (None, 1, 1.0):
                raise ValueError(f"model config sets {attr}; the statistics pass reads raw LM-head logits and "
                                 "does not apply it")

    # ------------------------------------------------------------------------------------- statistics pass

    @torch.no_grad()
    def _selection_stats(self, batch: dict[str, Any], mask: Tensor, group_ids: Tensor | None
                         ) -> tuple[TokenStats, Tensor | None]:
        """Statistics of the sampling policy at every completion position, from one no-grad pass.

        The backbone runs once over prompt+completion in row chunks; the LM head then runs over blocks of
        positions so at most ``stats_chunk_size`` rows of [V] logits exist at once, with every group intact
        (JS at position t needs only the group's distributions at t). With ``selection_topk`` = K the group JS
        comes from each position's top-K log-probs (``group_js_divergence_topk``) instead of the full sweep.

        Returns TokenStats with [B, T] fields and the [B, T] group JS (None when ``group_ids`` is None).
        """
        args = self.args
        model = self.accelerator.unwrap_model(self.model)
        if hasattr(model, "get_base_model"):  # PEFT: adapters live inside the base model's modules
            model = model.get_base_model()
        backbone, head = model.base_model, model.get_output_embeddings()
        prompt_ids, completion_ids = batch["prompt_ids"], batch["completion_ids"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        P, T = prompt_ids.size(1), completion_ids.size(1)
        B = input_ids.size(0)
        rows = args.per_device_train_batch_size if model.training else args.per_device_eval_batch_size
        hidden = []
        for r0 in range(0, B, rows):
            with self.accelerator.autocast():
                out = backbone(input_ids=input_ids[r0:r0 + rows], attention_mask=attention_mask[r0:r0 + rows])
            hidden.append(out.last_hidden_state[:, P - 1:P + T - 1])  # position P-1+t predicts completion token t
        hidden_all = torch.cat(hidden)
        tau = args.selection_temperature
        topk = args.selection_topk if group_ids is not None else None
        block = max(1, args.stats_chunk_size // B)
        parts: list[TokenStats] = []
        js_parts: list[Tensor] = []
        topk_lp: list[Tensor] = []
        topk_ids: list[Tensor] = []
        for t0 in range(0, T, block):
            # Under bf16 the head's output is bf16 unless TRL's cast_lm_head_to_fp32=True made the head fp32.
            logits = head(hidden_all[:, t0:t0 + block]).float()
            m = mask[:, t0:t0 + block]
            # One sweep gives the token statistics and, with group_ids (exact score), the group JS; its internal
            # chunking is left at ictrl.stats' cache-sized default.
            st = token_stats(logits, m, tokens=completion_ids[:, t0:t0 + block], temperature=tau,
                             group_ids=group_ids if topk is None else None)
            parts.append(st)
            if st.ict_score is not None:
                js_parts.append(st.ict_score)
            if topk is not None:
                lp, ids = topk_log_softmax(logits, topk, tau)
                topk_lp.append(lp)
                topk_ids.append(ids)
            del logits
        stats = TokenStats(**{f: torch.cat([getattr(p, f) for p in parts], dim=1) for f in _STAT_FIELDS})
        if group_ids is None:
            return stats, None
        if topk is not None:
            # The hook for a rollout engine that returns top-K log-probs at sampling time (vLLM's `logprobs=K`):
            # its [B, T, K] log-probs and ids would go here directly, and the head sweep above would only be
            # needed for the token statistics. Not wired up yet.
            js = group_js_divergence_topk(torch.cat(topk_lp, dim=1), torch.cat(topk_ids, dim=1), mask, group_ids)
            return stats, js
        return stats, torch.cat(js_parts, dim=1)

    def _gather_rows(self, x: Tensor, pad: float | int = 0) -> Tensor:
        """[B_local, T_local] → [B_global, T_max]: the generation batch of all processes, in TRL's row order."""
        x = self.accelerator.pad_across_processes(x, dim=1, pad_index=pad)
        return self.accelerator.gather(x)

    def _check_local_groups(self, batch: dict[str, Any], G: int) -> None:
        B = batch["prompt_ids"].size(0)
        if B % G != 0:
            raise RuntimeError(f"group JS needs whole groups on each process, but this process holds {B} "
                               f"completions, not a multiple of num_generations={G}")
        ids = torch.where(batch["prompt_mask"].bool(), batch["prompt_ids"], -1).view(B // G, G, -1)
        if not bool((ids == ids[:, :1]).all()):
            raise RuntimeError("the completions in a block of num_generations rows on this process do not share "
                               "one prompt: TRL's sampler layout changed, so groups cannot be kept local")

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        batch = super()._generate_and_score_completions(inputs)
        if "pixel_values" in batch:
            raise ValueError("ICTGRPOTrainer supports text-only models (its statistics pass has no image inputs)")
        args = self.args
        mode = "train" if self.model.training else "eval"
        G = self.num_generations if mode == "train" else self.num_generations_eval
        start = time.perf_counter()
        mask = batch["completion_mask"].bool()
        if "tool_mask" in batch:
            mask = mask & batch["tool_mask"].bool()
        B, T = mask.shape
        rank = self.accelerator.process_index
        step = int(self.state.global_step)
        warm = step < args.selection_warmup_steps
        need_js = self._needs_js and not warm
        local_groups = None
        if need_js:
            self._check_local_groups(batch, G)
            local_groups = (rank * B + torch.arange(B, device=mask.device)) // G
        stats, js = self._selection_stats(batch, mask, local_groups)

        # Selection on the global generation batch: identical on every process and to a single-process run.
        g_mask = self._gather_rows(mask.to(torch.uint8)).bool()
        g_stats = TokenStats(**{f: self._gather_rows(getattr(stats, f)) for f in _STAT_FIELDS})
        g_js = self._gather_rows(js) if js is not None else None
        if warm:
            g_selected = g_mask.clone()
        else:
            g_adv = self.accelerator.gather(batch["advantages"].float())
            g_groups = torch.arange(g_mask.size(0), device=g_mask.device) // G
            sel_inputs = SelectionInputs(mask=g_mask, step=step, ict_score=g_js, entropy=g_stats.entropy,
                                         prob=g_stats.prob, advantages=g_adv, group_ids=g_groups)
            g_selected = select(args.token_selector, sel_inputs, **self._selector_options())
        batch["ictrl_selected"] = g_selected[rank * B:(rank + 1) * B, :T].contiguous()

        metrics = self._metrics[mode]
        for key, value in step_metrics(g_stats, g_mask, g_selected).items():
            metrics[f"ictrl/{key}"].append(value)
        if g_js is not None:
            for name, where in (("all", g_mask), ("selected", g_selected & g_mask)):
                if bool(where.any()):
                    metrics[f"ictrl/ict_score/{name}"].append(float(g_js[where].double().mean()))
        metrics["ictrl/warmup"].append(float(warm))
        metrics["ictrl/stats_time"].append(time.perf_counter() - start)
        return batch

    def _selector_options(self) -> dict[str, Any]:
        args = self.args
        name = args.token_selector
        if args.selection_options is not None:
            return dict(args.selection_options)
        if name == "all":
            return {}
        if name == "stapo":
            return {"tau_p": args.stapo_tau_p, "q": args.stapo_q}
        options: dict[str, Any] = {"ratio": args.selection_ratio, "scope": args.selection_scope}
        if name == "random":
            options["seed"] = args.selection_seed
        return options

    # --------------------------------------------------------------------------------- global normalisers

    def _prepare_inputs(self, generation_batch: Any) -> dict[str, Any]:
        previous = self._buffered_inputs
        inputs = super()._prepare_inputs(generation_batch)
        if not self.model.training:
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
        'dapo' normaliser does.
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
        if n % accumulation == 0:
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

    # -------------------------------------------------------------------------------------------- loss

    def _selected_logps(self, model: Any, input_ids: Tensor, attention_mask: Tensor, completion_ids: Tensor,
                        selected: Tensor) -> Tensor:
        """[B, T] log π_θ of the completion tokens with the LM head applied only where ``selected`` (0 elsewhere).

        The call goes through ``model`` (possibly DDP-wrapped) so gradient-sync hooks run; ``logits_to_keep=1``
        limits the model's own head to one position, and ``hidden_states[-1]`` is the final-norm output (the LM
        head's input). ``sparse_backward`` docs: ICTGRPOConfig.
        """
        T = completion_ids.size(1)
        with self.accelerator.autocast():
            out = model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True,
                        logits_to_keep=1, use_cache=False)
        hidden = out.hidden_states[-1][:, -T - 1:-1]  # position P-1+t predicts completion token t
        unwrapped = self.accelerator.unwrap_model(model)
        if hasattr(unwrapped, "get_base_model"):  # PEFT
            unwrapped = unwrapped.get_base_model()
        return selected_token_logprobs(hidden, unwrapped.get_output_embeddings(), completion_ids, selected,
                                       temperature=self.temperature)

    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> Tensor:
        prompt_ids, completion_ids = inputs["prompt_ids"], inputs["completion_ids"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        mask = inputs["completion_mask"].bool()
        if "tool_mask" in inputs:
            mask = mask & inputs["tool_mask"].bool()
        if self.args.sparse_backward:
            logps = self._selected_logps(model, input_ids, attention_mask, completion_ids,
                                         inputs["ictrl_selected"] & mask)
        else:
            logps, _, _ = self._get_per_token_logps_and_entropies(model, input_ids, attention_mask,
                                                                  completion_ids.size(1))
        old = inputs.get("old_per_token_logps")
        old = logps.detach() if old is None else old
        ref = inputs.get("ref_per_token_logps") if self.beta != 0.0 else None
        # DDP averages the processes' gradients, so each process divides by (global count / processes).
        world = self.accelerator.num_processes
        loss, m = policy_loss(
            logps, old, inputs["advantages"], mask, inputs["ictrl_selected"],
            eps_low=self.epsilon_low, eps_high=self.epsilon_high, norm=self.args.loss_normalization,
            ref_logprobs=ref, kl_coef=self.beta,
            num_responses=inputs["ictrl_num_responses"] / world, num_tokens=inputs["ictrl_num_tokens"] / world,
        )
        mode = "train" if self.model.training else "eval"
        active = (inputs["ictrl_selected"] & mask).sum().float()
        keys = [k for k in ("clip_frac", "clip_frac_low", "clip_frac_high", "kl", "mean_prob_selected") if k in m]
        local = torch.stack([m[k].float() * active for k in keys] + [active])
        total = self.accelerator.reduce(local, reduction="sum")  # token-weighted means over all processes
        for k, v in zip(keys, total[:-1]):
            self._metrics[mode][f"ictrl/{k}"].append(float(v / total[-1].clamp(min=1.0)))
        return loss
