"""``ICTGRPOConfig``: TRL's ``GRPOConfig`` plus the token-selection options of docs/method.md §3–5.

Per-method defaults (ratio, scope, warm-up, normaliser, options) are not written here: ``None`` fields resolve
to the selected method's registration in :mod:`ictrl.core.selection`. On CPU pass ``use_cpu=True, bf16=False``:
TRL's default ``bf16=True`` fails there. Run configs (``ictrl train``) map onto these fields by name.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from typing import Annotated, Any

from annotated_types import Interval, MinLen
from trl import GRPOConfig

from ictrl.core.checks import OptionError
from ictrl.core.loss import LOSS_TYPES, RANGED, LossSpec
from ictrl.core.selection import SELECTORS, Selector, get_selector
from ictrl.engine import config_fields
from ictrl.engine.config_fields import refused_field_errors
from ictrl.engine.reward_policy import NO_SIGNAL_STEPS
from ictrl.files import without_field_secrets
from ictrl.validation import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, SEED, check_fields, check_finite

# Selector options that have their own config field (the rest go through ``selection_options``).
SCALE_REWARDS = ("group", "batch", "none")  # TRL's advantage scalings
OPTION_FIELDS = {"ratio": "selection_ratio", "scope": "selection_scope", "seed": "selection_seed"}
# LossSpec's fields and the config field each is read from: the spec checks every value once, and its error is
# re-worded to name the config's field.
LOSS_FIELDS = {
    "loss_type": "loss_type", "level": "importance_sampling_level", "eps_low": "epsilon", "eps_high": "epsilon_high",
    "delta": "delta", "sapo_temperature_pos": "sapo_temperature_pos", "sapo_temperature_neg": "sapo_temperature_neg",
    "vespo_k_pos": "vespo_k_pos", "vespo_lambda_pos": "vespo_lambda_pos", "vespo_k_neg": "vespo_k_neg",
    "vespo_lambda_neg": "vespo_lambda_neg", "off_policy_threshold": "off_policy_mask_threshold",
    "is_mode": "vllm_importance_sampling_mode", "is_clip_min": "vllm_importance_sampling_clip_min",
    "is_clip_max": "vllm_importance_sampling_clip_max", "kl_coef": "beta", "kl_scope": "kl_scope",
    "bias_correction_kl": "use_bias_correction_kl", "norm": "loss_normalization",
    "max_completion_length": "max_completion_length",
}
# the numbers the loss spec and the selector's registered options hold to their ranges (finite included)
RANGED_ELSEWHERE = frozenset({LOSS_FIELDS[k] for k in RANGED} | {"selection_ratio", "selection_seed"})
logger = logging.getLogger(__name__)
_METHODS_HELP = "; ".join(f"'{s.name}'" + (f" (= {s.label})" if s.label != s.name else "") + f": {s.help}"
                          for s in SELECTORS.values())
# the registrations' defaults, as the help states them
_WARMUP_HELP = ", ".join(f"{s.name} {s.warmup_steps}" for s in SELECTORS.values())
_TRL_NORM_HELP = "; ".join(f"{name}: {kind.trl_norm}" for name, kind in LOSS_TYPES.items())


_PLANNED: list[int] = []


@contextlib.contextmanager
def planned_processes(processes: int) -> Iterator[None]:
    """Inside the block :func:`process_count` is ``processes``: the parent of a launch checks the config of the
    run it is about to start (``ictrl.train_cli.launch``) from its own single process."""
    _PLANNED.append(processes)
    try:
        yield
    finally:
        _PLANNED.pop()


def process_count() -> int:
    """Processes of the run: the planned count inside :func:`planned_processes`, else accelerate's when its state
    is initialised, else ``WORLD_SIZE`` (set by ``accelerate launch`` / ``torchrun`` before the script starts),
    else 1."""
    from accelerate import PartialState

    if _PLANNED:
        return _PLANNED[-1]
    if PartialState._shared_state:  # initialised: never start a process group from a config
        return PartialState().num_processes
    return int(os.environ.get("WORLD_SIZE", "1"))


def step_shape(prompts_per_step: int, num_generations: int, processes: int, max_micro_batch: int) -> tuple[int, int]:
    """(per-device micro-batch, gradient accumulation steps) giving ``prompts_per_step x num_generations``
    completions per optimizer step over ``processes`` processes, whole prompt groups on each process.

    The micro-batch is ``min(max_micro_batch, completions per process)`` and must divide the completions per
    process; raises ``ValueError`` naming the numbers otherwise. Each number is an int >= 1 (the config's field
    checks hold them so).
    """
    if prompts_per_step % processes:
        raise ValueError(f"prompts_per_step={prompts_per_step} must be a multiple of the number of processes "
                         f"({processes}): each prompt's num_generations={num_generations} completions stay on one "
                         "process")
    per_process = prompts_per_step // processes * num_generations
    micro = min(max_micro_batch, per_process)
    if per_process % micro:
        raise ValueError(f"per_device_train_batch_size={max_micro_batch} must divide the {per_process} completions "
                         f"each of the {processes} process(es) trains on per optimizer step (prompts_per_step="
                         f"{prompts_per_step} x num_generations={num_generations} / {processes})")
    return micro, per_process // micro


@dataclass
class ICTGRPOConfig(GRPOConfig):
    """``GRPOConfig`` with ICT / baseline token selection. ``None`` fields resolve to per-selector defaults in
    ``__post_init__`` (the resolved values are what the trainer reads)."""

    token_selector: str = field(
        default="ict",
        metadata={"help": "Which response tokens carry the policy gradient: a registered selector (or its method "
                  "label), or 'module:function' naming one. " + _METHODS_HELP + "."},
    )
    selection_ratio: float | None = field(
        default=None,
        metadata={"help": "Fraction of tokens selected per scope unit (ceil(ratio * n)), for selectors with a "
                  "ratio option. None: the selector's default (ictrl.core.selection)."},
    )
    selection_scope: str | None = field(
        default=None,
        metadata={"help": "Unit within which the top ratio is taken: 'response', 'group' (the G responses of a "
                  "prompt) or 'batch' (the whole generation batch across all processes), for selectors with a "
                  "scope option. None: the selector's default."},
    )
    selection_warmup_steps: int | None = field(
        default=None,
        metadata={"help": "Θ: for the first Θ optimizer steps every response token is selected. None: the "
                  "selector's registered default (" + _WARMUP_HELP + ")."},
    )
    loss_normalization: str | None = field(
        default=None,
        metadata={"help": "Loss normaliser, one of 'per_response_selected' (Sparse-GRPO), "
                  "'token_mean_selected' (80/20, STAPO), 'token_mean_all' (TRL's top_entropy_quantile), "
                  "'per_response_all' (original GRPO), 'dr_grpo' (Dr.GRPO: sum over the selected tokens / (responses "
                  "* max_completion_length)), 'sequence_sum' (each response's sum, then the mean over responses: "
                  "TRL's luspo). None: for token_selector 'all' the normaliser TRL uses for loss_type ("
                  + _TRL_NORM_HELP + "), so a TRL config gives TRL's step; for the other selectors their registered "
                  "normaliser "
                  "('dr_grpo' when loss_type='dr_grpo'). Denominators are global over the optimizer step (all "
                  "micro-batches and processes), except loss_type='bnpo', whose token mean is local to each "
                  "micro-batch as in TRL."},
    )
    kl_scope: str | None = field(
        default=None,
        metadata={"help": "Tokens the KL penalty (beta > 0) covers under a token selector: 'selected' (the tokens "
                  "that carry the policy gradient, the Sparse-GRPO objective of docs/method.md §3) or 'all_tokens' "
                  "(every response token, as TRL's top_entropy_quantile). None: 'all_tokens' with "
                  "top_entropy_quantile < 1 (as TRL), else 'selected' (docs/method-choices.md). The same for "
                  "token_selector 'all'."},
    )
    selection_options: dict | str | None = field(
        default=None,
        metadata={"help": "Further keyword options of the selector, checked against its signature: STAPO's "
                  "{tau_p: 0.002, q: 0.75}, or a custom selector's own. None: its defaults."},
    )
    prompts_per_step: Annotated[int | None, AT_LEAST_ONE] = field(
        default=None,
        metadata={"help": "Prompts per optimizer step over all processes (each with num_generations completions). When "
                          "set, the per-device micro-batch and gradient_accumulation_steps are derived from the number "
                          "of processes, so the same config trains on the same completions per step on 1 or 8 GPUs; "
                          "per_device_train_batch_size is then the largest micro-batch a device runs. None: TRL's "
                          "per-device batch arithmetic."},
    )
    selection_temperature: Annotated[float | None, POSITIVE] = field(
        default=None,
        metadata={"help": "Temperature applied to the sampling-policy logits for the selection statistics. None: the "
                          "sampling temperature (`temperature`)."},
    )
    stats_chunk_size: Annotated[int | None, AT_LEAST_ONE] = field(
        default=None,
        metadata={"help": "Most (response, position) rows of full-vocabulary logits materialised at once by the "
                          "statistics pass (memory bound: rows × vocab × 4 bytes; 512 rows at V = 151,936 is 311 MB). "
                          "Measured at Qwen2.5-0.5B width (bench/bench_real_shape.py --part passes, bench/README.md): "
                          "512 rows used 0.24× the extra memory of TRL's old-log-prob pass at 0.76× its time; 2,048 "
                          "rows used 1.07× at 0.66×. None: 512 rows on CPU; on a GPU the rows whose logits fit in "
                          "256 MiB (ictrl.core.stats.SWEEP_BYTES: 883 rows of bf16 logits at V = 151,936)."},
    )
    cpu_threads: Annotated[int | None, Interval(ge=1, le=4096)] = field(
        default=None,
        metadata={"help": "torch's intra-op threads in each process when `ictrl train` trains on CPU "
                          "(torch.set_num_threads; ignored on GPU). None: OMP_NUM_THREADS, else 1, as trl grpo's "
                          "accelerate launch sets it (one thread measured faster at the tiny and the 0.5B width on a "
                          "loaded 2-core machine: bench/README.md)."},
    )
    selection_topk: Annotated[int | None, AT_LEAST_ONE] = field(
        default=None,
        metadata={"help": "ICT score from each position's top-K sampling-policy log-probs instead of the full "
                          "distributions (ictrl.core.stats.group_js_divergence_topk; only for selectors that need the "
                          "ICT score). Each response becomes its top-K probabilities plus one tail bucket of the "
                          "remaining mass; the approximation treats the tail buckets of different responses as one "
                          "bucket (a response puts 0 on group ids outside its own top-K). Exact at K >= vocabulary "
                          "size (K is capped there). Measured agreement with the exact top-10%-per-response selection "
                          "(bench/bench_topk_agreement.py, V 32,768, synthetic logits): precision 0.88-0.90 on "
                          "Zipf-like rows (entropy ~2.5 nats), ~0.98 on Student-t rows (~0.6 nats), flat over K = "
                          "8..128; on the embedded task's real rollouts 0.97 at K = 8 and >= 0.997 from K = 16 "
                          "(bench/README.md, bench_topk_rollouts.py). Saves the full-vocabulary JS sweep; the top-K "
                          "come from the LM head. None: the exact score."},
    )
    sparse_backward: bool = field(
        default=False,
        metadata={"help": "Apply the LM head (and its backward) only at the selected tokens: the backbone runs as "
                  "usual, then ictrl.core.logprobs.selected_token_logprobs projects the selected positions' hidden "
                  "states to the vocabulary in row chunks. Same loss and gradient as the dense path, without the "
                  "head's [tokens, V] work at the unselected positions (~90% of them for ict). Log-probs at "
                  "unselected positions are not computed (they carry zero loss weight). Off by default: on a GPU it "
                  "measured slower than dense (H200, 0.5B, bf16: 0.421 s vs 0.400 s per step); on CPU it measured "
                  "0.3x `all`'s head time, so turn it on there (bench/README.md, 'GPU')."},
    )
    selection_seed: int | None = field(
        default=None,
        metadata={"help": "Seed of the random selector (combined with the optimizer step). None: `seed`."},
    )
    dynamic_sampling: bool = field(
        default=False,
        metadata={"help": "DAPO dynamic sampling: drop groups whose rewards are all equal (zero advantage, no "
                  "gradient) and generate for more prompts until every optimizer step again has its full count of "
                  "groups (generation_batch_size / num_generations), all informative. Extra prompts are drawn with a "
                  "seed of (seed, step, round), so the data order and resume stay exact (ictrl.engine."
                  "dynamic_sampling)."},
    )
    eval_benchmarks: Annotated[list[str] | None, MinLen(1)] = field(
        default=None,
        metadata={"help": "Benchmarks (ictrl.data specs, e.g. ['math500', 'gsm8k']) evaluated with pass@k every "
                  "eval_steps optimizer steps during training, on fixed problems with a fixed sampling seed; logged "
                  "as eval/<benchmark>/pass@k, eval/avg/pass@k and eval/total beside the training metrics. "
                  "metric_for_best_model='eval/total' (or another of these keys) keeps the best checkpoint. None: "
                  "no evaluation during training. The trainer runs none itself: ``ictrl train`` resolves the names "
                  "and adds ictrl.train_cli.eval_callback.PassAtKCallback; from Python, pass "
                  "callbacks=[PassAtKCallback.from_args(args, tokenizer)]."},
    )
    eval_limit: Annotated[int | None, AT_LEAST_ONE] = field(
        default=None,
        metadata={"help": "Evaluate the first eval_limit problems of each benchmark; None: all."},
    )
    eval_num_samples: Annotated[int, AT_LEAST_ONE] = field(
        default=4,
        metadata={"help": "Samples per problem for pass@k (>= max eval_ks)."},
    )
    eval_ks: list[int] = field(default_factory=lambda: [1, 4], metadata={"help": "k values of pass@k."})
    eval_seed: Annotated[int, SEED] = field(
        default=0,
        metadata={"help": "Sampling seed of every evaluation during training."},
    )
    eval_max_new_tokens: Annotated[int | None, AT_LEAST_ONE] = field(
        default=None,
        metadata={"help": "Generation budget of the evaluation; None: each benchmark's default (ictrl.data registry: "
                          "4096 for MATH-500/AIME, 1024 for GSM8K)."},
    )
    eval_temperature: Annotated[float | None, NON_NEGATIVE] = field(
        default=None,
        metadata={"help": "Evaluation sampling temperature (0: greedy); None: each benchmark's default (0.6)."},
    )
    dynamic_sampling_max_rounds: Annotated[int, NON_NEGATIVE] = field(
        default=9,
        metadata={"help": "Most extra generation rounds per generation batch under dynamic_sampling (9: at most 10 "
                          "generation batches, DAPO's max_num_gen_batches). A batch still short afterwards is filled "
                          "with uniform groups and a warning is logged."},
    )

    reward_timeout: Annotated[float | None, POSITIVE] = field(
        default=None,
        metadata={"help": "Seconds one call of a reward function may take; past it the run stops at that step with one "
                          "line naming the reward. None: no deadline (the built-in graders keep their own timeout)."},
    )
    no_signal_steps: Annotated[int | None, NON_NEGATIVE] = field(
        default=None,
        metadata={"help": "Stop the run (exit status 2, with the checkpoint and resume line) after this many optimizer "
                          "steps in a row in which every advantage was 0 (equal rewards in every group, or rewards TRL "
                          "could not use), whatever the cause. 0: train on. None: 20 for ictrl's selectors, 0 for "
                          "'all' (TRL's GRPO trains on, saying so once per stretch of 20 such steps)."},
    )

    def __post_init__(self) -> None:
        # first: each field's own declaration names its bound (a seed's), the generic check only int64
        check_fields(self, ICTGRPOConfig, inherited=config_fields.RANGES, not_null=config_fields.NOT_NULL)
        skip = config_fields.ranged(ICTGRPOConfig) | RANGED_ELSEWHERE  # a range's check holds it finite
        check_finite({f.name: getattr(self, f.name) for f in fields(self)
                      if f.init and f.name not in skip})
        config_fields.check_trains_something(self)
        # several trackers as TRL users write them (a list, or "tensorboard,wandb"); a missing package is one
        # line naming what to install, here rather than when the trainer builds its callbacks after the model loads
        self.report_to = config_fields.check_trackers(self.report_to, "report_to") or "none"
        self._read_scale_rewards()
        if self.prompts_per_step is not None:
            self._derive_step_shape()
        super().__post_init__()
        self._resolve_selector()
        if self.no_signal_steps is None:  # TRL's GRPO has no such stop; ictrl's methods stop a run that cannot learn
            self.no_signal_steps = 0 if self.selector.trl_loss else NO_SIGNAL_STEPS
        if self.selection_temperature is None:
            self.selection_temperature = self.temperature
        self._check_eval_during_training()
        self._check_scheduler()
        self._resolve_loss()

    def _check_scheduler(self) -> None:
        """Build the schedule transformers' Trainer will build, on a one-parameter optimizer (no model needed), so
        a schedule that lacks its kwargs (``cosine_with_min_lr`` without ``min_lr``) fails here, not after the
        model loads."""
        import torch
        from transformers import get_scheduler

        steps = self.max_steps if self.max_steps > 0 else 1
        optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
        try:
            get_scheduler(self.lr_scheduler_type, optimizer, num_warmup_steps=self.get_warmup_steps(steps),
                          num_training_steps=steps, scheduler_specific_kwargs=self.lr_scheduler_kwargs or {})
        except (ValueError, TypeError, KeyError) as exc:
            name = getattr(self.lr_scheduler_type, "value", self.lr_scheduler_type)
            raise ValueError(f"lr_scheduler_type: {name!r} with lr_scheduler_kwargs={self.lr_scheduler_kwargs or {}}:"
                             f" {str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}"
                             ) from None

    def _read_scale_rewards(self) -> None:
        """TRL documents ``scale_rewards`` as a str or a bool (true: 'group', false: 'none'); a flag's text is read as
        TRL reads a boolean flag, so ``--scale_rewards=false`` is the YAML ``false``."""
        from argparse import ArgumentTypeError

        from transformers.hf_argparser import string_to_bool

        value = self.scale_rewards
        if isinstance(value, str) and value.lower() not in SCALE_REWARDS:
            try:
                value = string_to_bool(value)
            except ArgumentTypeError:
                raise ValueError(f"scale_rewards: must be one of {list(SCALE_REWARDS)} or a boolean, got "
                                 f"{value!r}") from None
        self.scale_rewards = {True: "group", False: "none"}.get(value, value)  # type: ignore[arg-type]

    def _resolve_loss(self) -> None:
        """The run's ``loss_spec`` (:class:`ictrl.core.loss.LossSpec`, an attribute like ``selector``): the one
        check of every loss value, its error naming this config's field; then TRL's loss options, each honoured as
        TRL does or refused here with one line saying why."""
        refused = refused_field_errors(self, {f.name: f.default for f in fields(GRPOConfig)})
        if refused:
            raise ValueError(refused[0])
        dense = self.selector.trl_loss
        if self.kl_scope is None:  # TRL's entropy mask leaves the KL term on every token
            self.kl_scope = "all_tokens" if self.top_entropy_quantile < 1.0 else "selected"
        if self.loss_normalization is None:
            self.loss_normalization = self._default_normaliser(self.selector)
        values = {spec: getattr(self, name) for spec, name in LOSS_FIELDS.items()}
        if self.epsilon_high is None:  # TRL clips symmetrically at epsilon
            values["eps_high"] = self.epsilon
        values["bias_correction_kl"] = bool(self.use_bias_correction_kl)
        try:
            self.loss_spec: LossSpec = LossSpec(**values)
        except OptionError as err:
            raise ValueError(f"{LOSS_FIELDS[err.field]} {err.reason}") from None
        if self.loss_type == "dr_grpo" and self.loss_normalization != "dr_grpo":
            raise ValueError(f"loss_type='dr_grpo' asks for Dr.GRPO's constant normaliser, but loss_normalization="
                             f"{self.loss_normalization!r}: leave loss_normalization unset or set it to 'dr_grpo'")
        if self.top_entropy_quantile < 1.0:
            self._check_top_entropy_quantile(dense)
        if not dense and LOSS_TYPES[self.loss_type].whole_response:
            raise ValueError(f"loss_type={self.loss_type!r} does not combine with token_selector="
                             f"{self.token_selector!r}: its weight is a function of the whole response's ratio, not "
                             "of selected tokens")
        if self.sparse_backward and self.entropy_coef != 0.0:
            raise ValueError("entropy_coef needs the entropy at every selected position with gradient, which "
                             "sparse_backward does not compute; turn one of them off")
        if self.sparse_backward and self.kl_scope == "all_tokens" and self.beta != 0.0:
            raise ValueError("kl_scope='all_tokens' needs log-probs at every response token, which sparse_backward "
                             "computes only at the selected ones; use kl_scope='selected' or turn sparse_backward off")

    def _check_top_entropy_quantile(self, dense: bool) -> None:
        q = self.top_entropy_quantile
        if not dense:
            raise ValueError(f"top_entropy_quantile={q} is TRL's own token selection; with token_selector="
                             f"{self.token_selector!r} there would be two: use token_selector='all' for TRL's "
                             "entropy mask, or 'entropy' for 20-Entropy (docs/method-choices.md)")
        if self.importance_sampling_level == "sequence":
            raise ValueError("importance_sampling_level='sequence' with top_entropy_quantile: TRL's sequence ratio "
                             "spans every response token, ictrl's the selected ones; use one of them")
        if self.sparse_backward:
            raise ValueError("top_entropy_quantile needs the entropy of every response token from the loss's "
                             "forward, which sparse_backward skips; turn sparse_backward off")
        if self.loss_normalization == "token_mean_selected":
            raise ValueError("loss_normalization='token_mean_selected' with top_entropy_quantile: TRL's entropy mask "
                             "is made per micro-batch, after the optimizer step's token count; use token_mean_all")

    def _check_eval_during_training(self) -> None:
        if self.eval_benchmarks is None:
            return
        steps = self.eval_steps
        if steps is None or isinstance(steps, bool) or float(steps) != int(steps) or int(steps) < 1:
            raise ValueError(f"eval_benchmarks needs eval_steps, an int >= 1 (optimizer steps between evaluations), "
                             f"got {steps!r}")
        self.eval_steps = int(steps)
        buffer = self.steps_per_generation * self.num_iterations
        if (self.eval_steps * self.gradient_accumulation_steps) % buffer:
            raise ValueError(f"eval_steps={self.eval_steps} x gradient_accumulation_steps="
                             f"{self.gradient_accumulation_steps} must be a multiple of steps_per_generation="
                             f"{self.steps_per_generation} x num_iterations={self.num_iterations}: a best checkpoint "
                             "inside a generation buffer could not resume exactly")
        if not self.eval_ks or max(self.eval_ks) > self.eval_num_samples or min(self.eval_ks) < 1:
            raise ValueError(f"eval_ks={self.eval_ks} must be non-empty ints in [1, eval_num_samples="
                             f"{self.eval_num_samples}]")
    def _derive_step_shape(self) -> None:
        if self.gradient_accumulation_steps != 1 or self.generation_batch_size is not None:
            raise ValueError("prompts_per_step derives gradient_accumulation_steps from the number of processes; "
                             "leave gradient_accumulation_steps and generation_batch_size unset")
        self.per_device_train_batch_size, self.gradient_accumulation_steps = step_shape(
            self.prompts_per_step, self.num_generations, process_count(), self.per_device_train_batch_size)

    def _resolve_selector(self) -> None:
        """Look ``token_selector`` up once: ``selector`` and its checked ``selector_options`` are what the trainer
        and the run read. Attributes, not fields: ``asdict``, TRL's ``to_dict`` and the printed config hold the
        fields as given, and a pickled config carries the name and looks it up again (:meth:`__setstate__`)."""
        try:
            self.selector: Selector = get_selector(self.token_selector)
        except ValueError as exc:
            raise ValueError(f"token_selector: {exc}") from None
        self.selector_options: dict[str, Any] = self._resolve_method(self.selector)

    def __getstate__(self) -> dict[str, Any]:
        """The pickled config (``training_args.bin``: the model, each checkpoint, a hub push) holds no secret."""
        state = without_field_secrets(self.__dict__)
        return {key: value for key, value in state.items() if key not in ("selector", "selector_options")}

    def to_dict(self) -> dict[str, Any]:
        """transformers' record for trackers (tensorboard, wandb), without a secret inside a mapping either."""
        return without_field_secrets(super().to_dict())

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._resolve_selector()  # the fields are resolved already: this only looks the selector up again

    def _resolve_method(self, selector: Selector) -> dict[str, Any]:
        """Fill the ``None`` method fields from the selector's registration and check every option once; returns
        the selector's resolved options."""
        if self.selection_seed is None:
            self.selection_seed = self.seed
        for option, name in OPTION_FIELDS.items():
            if getattr(self, name) is not None and option not in selector.options and option != "seed":
                raise ValueError(f"{name} is not used by token_selector={self.token_selector!r}; leave it None")
        if self.selection_topk is not None and "ict_score" not in selector.needs:  # it approximates only that score
            raise ValueError(f"selection_topk is not used by token_selector={self.token_selector!r}; leave it None")
        if isinstance(self.selection_options, str):  # a flag's JSON, as TrainingArguments reads its dict fields
            try:
                self.selection_options = json.loads(self.selection_options)
            except json.JSONDecodeError as exc:
                raise ValueError(f"selection_options: not a JSON object: {exc}") from None
        if self.selection_options is not None and not isinstance(self.selection_options, dict):
            raise ValueError(f"selection_options must be a mapping, got {type(self.selection_options).__name__}")
        extra = dict(self.selection_options or {})
        dedicated = sorted(set(extra) & set(OPTION_FIELDS))
        if dedicated:
            raise ValueError(f"selection_options: set {dedicated[0]!r} with {OPTION_FIELDS[dedicated[0]]}")
        given = {o: getattr(self, f) for o, f in OPTION_FIELDS.items() if o in selector.options
                 and getattr(self, f) is not None}
        try:
            options = selector.resolve_options({**given, **extra})
        except OptionError as err:  # an option's own value: named by its config field
            raise ValueError(f"{OPTION_FIELDS.get(err.field, 'selection_options')}: {err}") from None
        except ValueError as exc:
            raise ValueError(f"selection_options: {exc}") from None
        if "ratio" in options:
            self.selection_ratio = options["ratio"]
        if "scope" in options:
            self.selection_scope = options["scope"]
        try:
            self.selection_warmup_steps = selector.resolve_warmup(self.selection_warmup_steps)
        except ValueError as exc:
            raise ValueError(f"selection_warmup_steps: {exc}") from None
        per_process = self.per_device_train_batch_size * self.steps_per_generation
        if "ict_score" in selector.needs and per_process % self.num_generations:
            raise ValueError(
                f"token_selector={self.token_selector!r} computes group JS on each process, so each prompt's "
                f"num_generations={self.num_generations} completions must sit on one process: "
                f"per_device_train_batch_size * steps_per_generation = {per_process} must be a multiple of it")
        return options

    def _default_normaliser(self, selector: Selector) -> str:
        """TRL's normaliser for ``loss_type`` under ``all``; a sparse method's registered one otherwise."""
        kind = LOSS_TYPES.get(self.loss_type)  # None: refused by the LossSpec built next, which lists the choices
        if selector.trl_loss and kind is not None:
            return kind.trl_norm
        if self.loss_type == "dr_grpo":
            return "dr_grpo"
        if self.loss_type != "dapo" and kind is not None:  # TRL's default carries no choice; any other is said once
            logger.warning("loss_type=%r sets the per-token policy term; token_selector=%r normalises it with its "
                           "registered %r (set loss_normalization to change it)", self.loss_type,
                           self.token_selector, selector.normalization)
        return selector.normalization
