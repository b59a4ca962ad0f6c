"""``CheckedRewardsMixin``: :class:`ictrl.rewards.policy.RewardPolicy` in a ``GRPOTrainer``'s reward path.

It hooks TRL 1.16's ``_calculate_rewards`` (the reward functions are wrapped on its first call, so TRL's names and
its sync/async split are those it made at init) and ``_generate_and_score_completions`` (the generation batch's
advantages, gathered from every process, counted for ``no_signal_steps``). The trainer's config fields
``reward_timeout`` and ``no_signal_steps`` set the policy.
"""

from __future__ import annotations

from typing import Any

from ictrl.rewards.policy import RewardPolicy


class CheckedRewardsMixin:
    """Mixed in front of ``GRPOTrainer`` (``ICTGRPOTrainer``)."""

    _reward_policy: RewardPolicy | None = None

    @property
    def reward_policy(self) -> RewardPolicy:
        if self._reward_policy is None:
            args = self.args  # type: ignore[attr-defined]
            per_batch = args.steps_per_generation * args.num_iterations // args.gradient_accumulation_steps
            self._reward_policy = RewardPolicy(getattr(args, "reward_timeout", None),
                                               getattr(args, "no_signal_steps", 0) or 0, per_batch,
                                               step=lambda: self.state.global_step)  # type: ignore[attr-defined]
        return self._reward_policy

    def _wrap_reward_funcs(self) -> None:
        import torch

        funcs, names = self.reward_funcs, self.reward_func_names  # type: ignore[attr-defined]
        for i, (fn, name) in enumerate(zip(funcs, names)):
            if not isinstance(fn, torch.nn.Module) and not getattr(fn, "ictrl_checked", False):
                funcs[i] = self.reward_policy.wrap(fn, name)

    def _calculate_rewards(self, inputs: Any, prompts: Any, completions: Any, completion_ids_list: Any) -> Any:
        self._wrap_reward_funcs()
        scores = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)  # type: ignore[misc]
        self.reward_policy.check_scores(scores, list(self.reward_func_names))  # type: ignore[attr-defined]
        return scores

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        batch = super()._generate_and_score_completions(inputs)  # type: ignore[misc]
        advantages = batch.get("advantages")
        if advantages is not None and self.model.training:  # type: ignore[attr-defined]
            nonzero = torch.tensor([float((advantages != 0).any())], device=advantages.device)
            nonzero = self.accelerator.gather(nonzero)  # type: ignore[attr-defined]
            self.reward_policy.observe_advantages(not bool(nonzero.any()))
        return batch
