"""``ICTGRPOConfig``: TRL's ``GRPOConfig`` plus the token-selection options of method.md §3–5.

On CPU pass ``use_cpu=True, bf16=False``: TRL's default ``bf16=True`` fails on CPU (environment.md, "Traps").
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trl import GRPOConfig

from ictrl.loss import IS_MODES, NORM_MODES
from ictrl.selection import SCOPES, SELECTORS

BUILTIN_SELECTORS = ("all", "ict", "entropy", "stapo", "random", "frequent")

# Per-selector defaults (method.md §3–5). Random and frequent are ICT ablations, so they share ICT's ratio,
# scope, warm-up and Sparse-GRPO normaliser; 20-Entropy and STAPO follow their own papers (token mean over the
# kept tokens, no warm-up); "all" is the original GRPO per-response mean.
DEFAULT_RATIO = {"ict": 0.1, "random": 0.1, "frequent": 0.1, "entropy": 0.2}
DEFAULT_SCOPE = {"ict": "response", "random": "response", "frequent": "response", "entropy": "batch"}
ALLOWED_SCOPES = {"ict": SCOPES, "random": SCOPES, "frequent": SCOPES, "entropy": ("batch", "response")}
DEFAULT_NORM = {
    "ict": "per_response_selected",
    "random": "per_response_selected",
    "frequent": "per_response_selected",
    "entropy": "token_mean_selected",
    "stapo": "token_mean_selected",
    "all": "per_response_all",
}
DEFAULT_WARMUP = {"ict": 10, "random": 10, "frequent": 10, "entropy": 0, "stapo": 0, "all": 0}
# TRL loss types whose per-token surrogate is the clipped ratio that ``ictrl.loss.policy_loss`` computes; the
# others (cispo, sapo, vespo, luspo) are different objectives. Only the clip form is read: the normalisation
# always comes from ``loss_normalization``.
CLIPPED_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")


@dataclass
class ICTGRPOConfig(GRPOConfig):
    """``GRPOConfig`` with ICT / baseline token selection. ``None`` fields resolve to per-selector defaults in
    ``__post_init__`` (the resolved values are what the trainer reads)."""

    token_selector: str = field(
        default="ict",
        metadata={
            "help": "Which response tokens carry the policy gradient: 'all' (GRPO), 'ict' (top JS-to-group-mean "
            "tokens, Sparse-GRPO), 'entropy' (20-Entropy), 'stapo' (silence rare spurious tokens), 'random' "
            "(same count as ICT, uniform), 'frequent' (complement of ICT's selection)."
        },
    )
    selection_ratio: float | None = field(
        default=None,
        metadata={
            "help": "Fraction of tokens selected per scope unit (ceil(ratio * n)). None: 0.1 for ict/random/"
            "frequent (frequent keeps the complement of ICT's top ratio), 0.2 for entropy. Not used by all/stapo."
        },
    )
    selection_scope: str | None = field(
        default=None,
        metadata={
            "help": "Unit within which the top ratio is taken: 'response', 'group' (the G responses of a prompt) or "
            "'batch' (the whole generation batch across all processes). None: 'response' for ict/random/frequent, "
            "'batch' for entropy (which accepts only 'batch' or 'response'). Not used by all/stapo."
        },
    )
    selection_warmup_steps: int | None = field(
        default=None,
        metadata={
            "help": "Θ: for the first Θ optimizer steps every response token is selected. None: 10 for ict/random/"
            "frequent, 0 for entropy/stapo/all. The paper's ablation found Θ in {10, 20, 40} behaved alike; its "
            "main-run value is unpublished."
        },
    )
    loss_normalization: str | None = field(
        default=None,
        metadata={
            "help": "Loss normaliser, one of 'per_response_selected' (Sparse-GRPO), 'token_mean_selected' (80/20, "
            "STAPO), 'token_mean_all' (TRL's top_entropy_quantile), 'per_response_all' (original GRPO), 'dr_grpo' "
            "(Dr.GRPO: sum over the selected tokens / (responses * max_completion_length)). None: 'dr_grpo' when "
            "loss_type='dr_grpo', else per_response_selected for ict/random/frequent, token_mean_selected for "
            "entropy/stapo, per_response_all for all. Denominators are global over the optimizer step (all "
            "micro-batches and processes). Replaces TRL's loss_type normalisation."
        },
    )
    stapo_tau_p: float = field(
        default=0.002,
        metadata={"help": "STAPO: absolute probability threshold τ_p below which a positive-advantage token may be "
                  "silenced."},
    )
    stapo_q: float = field(
        default=0.75,
        metadata={"help": "STAPO: silence the bottom-q fraction by entropy of the low-probability positive-advantage "
                  "tokens of the batch (0.75 in STAPO v1, 0.8 reported elsewhere)."},
    )
    selection_temperature: float | None = field(
        default=None,
        metadata={"help": "Temperature applied to the sampling-policy logits for the selection statistics. None: "
                  "the sampling temperature (`temperature`)."},
    )
    stats_chunk_size: int = field(
        default=2048,
        metadata={"help": "Most (response, position) rows of full-vocabulary logits materialised at once by the "
                  "statistics pass (memory bound: rows × vocab × 4 bytes)."},
    )
    selection_topk: int | None = field(
        default=None,
        metadata={"help": "ICT score from each position's top-K sampling-policy log-probs instead of the full "
                  "distributions (ictrl.stats.group_js_divergence_topk; only for selectors that need the ICT score). "
                  "Each response becomes its top-K probabilities plus one tail bucket of the remaining mass; the "
                  "approximation treats the tail buckets of different responses as one bucket (a response puts 0 "
                  "on group ids outside its own top-K). Exact at K >= vocabulary size (K is capped there). Measured "
                  "agreement with the exact top-10%-per-response selection (bench/bench_topk_agreement.py, V 32,768, "
                  "synthetic logits): precision 0.88-0.90 on Zipf-like rows (entropy ~2.5 nats), ~0.98 on "
                  "Student-t rows (~0.6 nats), flat over K = 8..128; on the embedded task's real rollouts 0.97 at "
                  "K = 8 and >= 0.997 from K = 16 (bench/bench_topk_rollouts.py). Saves the full-vocabulary JS sweep; "
                  "with selection_topk_source the top-K come from the sampler, saving the top-K sweep too. None: the "
                  "exact score."},
    )
    selection_topk_source: str = field(
        default="auto",
        metadata={"help": "Where the top-K log-probs of selection_topk come from. 'sampler': recorded at generation "
                  "time (vLLM: logprobs=K per position; transformers generate: a logits processor recording the top-K "
                  "of log_softmax(scores / selection_temperature) at each step, i.e. after repetition/constraint "
                  "processors and before temperature/top-k/top-p warping), so the statistics pass skips its top-K "
                  "sweep over the LM head; an error at init if the sampler's distribution is not the one the "
                  "statistics pass scores (docs/vllm.md). 'head': from the statistics pass's LM-head logits. 'auto': "
                  "the sampler when it qualifies, else the head."},
    )
    selection_options: dict | None = field(
        default=None,
        metadata={"help": "Keyword options for a selector registered with ictrl.selection.register_selector (a "
                  "custom selector gets only these). For the built-in selectors use the dedicated fields above."},
    )
    sparse_backward: bool = field(
        default=False,
        metadata={"help": "Apply the LM head (and its backward) only at the selected tokens: the backbone runs as "
                  "usual, then ictrl.logprobs.selected_token_logprobs projects the selected positions' hidden states "
                  "to the vocabulary in row chunks. Same loss and gradient as the dense path, without the head's "
                  "[tokens, V] work at the unselected positions (~90% of them for ict). Log-probs at unselected "
                  "positions are not computed (they carry zero loss weight)."},
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
    eval_benchmarks: list[str] | None = field(
        default=None,
        metadata={"help": "Benchmarks (ictrl.data specs, e.g. ['math500', 'gsm8k']) evaluated with pass@k every "
                  "eval_steps optimizer steps during training, on fixed problems with a fixed sampling seed; logged "
                  "as eval/<benchmark>/pass@k, eval/avg/pass@k and eval/total beside the training metrics. "
                  "metric_for_best_model='eval/total' (or another of these keys) keeps the best checkpoint. None: "
                  "no evaluation during training (ictrl.engine.eval_callback)."},
    )
    eval_limit: int | None = field(
        default=None, metadata={"help": "Evaluate the first eval_limit problems of each benchmark; None: all."})
    eval_num_samples: int = field(default=4, metadata={"help": "Samples per problem for pass@k (>= max eval_ks)."})
    eval_ks: list[int] = field(default_factory=lambda: [1, 4], metadata={"help": "k values of pass@k."})
    eval_seed: int = field(default=0, metadata={"help": "Sampling seed of every evaluation during training."})
    eval_max_new_tokens: int | None = field(
        default=None, metadata={"help": "Generation budget of the evaluation; None: each benchmark's default "
                                "(ictrl.data registry: 4096 for MATH-500/AIME, 1024 for GSM8K)."})
    eval_temperature: float | None = field(
        default=None, metadata={"help": "Evaluation sampling temperature (0: greedy); None: each benchmark's "
                                "default (0.6)."})
    dynamic_sampling_max_rounds: int = field(
        default=9,
        metadata={"help": "Most extra generation rounds per generation batch under dynamic_sampling (9: at most 10 "
                  "generation batches, DAPO's max_num_gen_batches). A batch still short afterwards is filled with "
                  "uniform groups and a warning is logged."},
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        name = self.token_selector
        if name not in SELECTORS:
            raise ValueError(f"token_selector must be a registered selector, one of {sorted(SELECTORS)}, got "
                             f"{name!r} (register your own with ictrl.selection.register_selector)")
        if self.selection_options is not None and name in BUILTIN_SELECTORS:
            raise ValueError(f"selection_options is for custom selectors; token_selector={name!r} takes its "
                             "options from the selection_* / stapo_* fields")
        if self.selection_options is not None and not isinstance(self.selection_options, dict):
            raise ValueError(f"selection_options must be a dict, got {type(self.selection_options).__name__}")

        if name in DEFAULT_RATIO:
            if self.selection_ratio is None:
                self.selection_ratio = DEFAULT_RATIO[name]
            if isinstance(self.selection_ratio, bool) or not 0.0 < float(self.selection_ratio) <= 1.0:
                raise ValueError(f"selection_ratio must be in (0, 1], got {self.selection_ratio!r}")
            self.selection_ratio = float(self.selection_ratio)
            if self.selection_scope is None:
                self.selection_scope = DEFAULT_SCOPE[name]
            if self.selection_scope not in ALLOWED_SCOPES[name]:
                raise ValueError(f"selection_scope must be one of {list(ALLOWED_SCOPES[name])} for "
                                 f"token_selector={name!r}, got {self.selection_scope!r}")
        else:
            if self.selection_ratio is not None:
                raise ValueError(f"selection_ratio is not used by token_selector={name!r}; leave it None")
            if self.selection_scope is not None:
                raise ValueError(f"selection_scope is not used by token_selector={name!r}; leave it None")

        if self.selection_warmup_steps is None:
            self.selection_warmup_steps = DEFAULT_WARMUP.get(name, 0)
        if isinstance(self.selection_warmup_steps, bool) or not isinstance(self.selection_warmup_steps, int) \
                or self.selection_warmup_steps < 0:
            raise ValueError(f"selection_warmup_steps must be an int >= 0, got {self.selection_warmup_steps!r}")

        if self.loss_type == "dr_grpo" and self.loss_normalization not in (None, "dr_grpo"):
            raise ValueError(f"loss_type='dr_grpo' asks for Dr.GRPO's constant normaliser, but loss_normalization="
                             f"{self.loss_normalization!r}: leave loss_normalization unset or set it to 'dr_grpo'")
        if self.loss_normalization is None:
            # A custom selector defaults to the Sparse-GRPO normaliser, the one ICT uses.
            self.loss_normalization = "dr_grpo" if self.loss_type == "dr_grpo" else DEFAULT_NORM.get(
                name, "per_response_selected")
        if self.loss_normalization not in NORM_MODES:
            raise ValueError(f"loss_normalization must be one of {list(NORM_MODES)}, got {self.loss_normalization!r}")

        if not 0.0 < self.stapo_tau_p <= 1.0:
            raise ValueError(f"stapo_tau_p must be in (0, 1], got {self.stapo_tau_p!r}")
        if not 0.0 < self.stapo_q <= 1.0:
            raise ValueError(f"stapo_q must be in (0, 1], got {self.stapo_q!r}")
        if self.selection_temperature is None:
            self.selection_temperature = self.temperature
        if not self.selection_temperature > 0:
            raise ValueError(f"selection_temperature must be > 0, got {self.selection_temperature!r}")
        if isinstance(self.stats_chunk_size, bool) or not isinstance(self.stats_chunk_size, int) \
                or self.stats_chunk_size < 1:
            raise ValueError(f"stats_chunk_size must be an int >= 1, got {self.stats_chunk_size!r}")
        if self.selection_topk is not None and (isinstance(self.selection_topk, bool)
                                                or not isinstance(self.selection_topk, int) or self.selection_topk < 1):
            raise ValueError(f"selection_topk must be None or an int >= 1, got {self.selection_topk!r}")
        if self.selection_topk_source not in ("auto", "sampler", "head"):
            raise ValueError(f"selection_topk_source must be 'auto', 'sampler' or 'head', got "
                             f"{self.selection_topk_source!r}")
        if not isinstance(self.sparse_backward, bool):
            raise ValueError(f"sparse_backward must be a bool, got {self.sparse_backward!r}")
        if self.selection_seed is None:
            self.selection_seed = self.seed
        if isinstance(self.selection_seed, bool) or not isinstance(self.selection_seed, int) or self.selection_seed < 0:
            raise ValueError(f"selection_seed must be an int >= 0, got {self.selection_seed!r}")

        if not isinstance(self.dynamic_sampling, bool):
            raise ValueError(f"dynamic_sampling must be a bool, got {self.dynamic_sampling!r}")
        if isinstance(self.dynamic_sampling_max_rounds, bool) or not isinstance(self.dynamic_sampling_max_rounds, int) \
                or self.dynamic_sampling_max_rounds < 0:
            raise ValueError(f"dynamic_sampling_max_rounds must be an int >= 0, got {self.dynamic_sampling_max_rounds!r}")

        self._check_eval_during_training()

        # TRL options that the ictrl loss path replaces or cannot honour: reject rather than silently ignore.
        if self.top_entropy_quantile < 1.0:
            raise ValueError("top_entropy_quantile < 1 conflicts with token_selector (ictrl replaces it): use "
                             "token_selector='entropy', loss_normalization='token_mean_all' for TRL's behaviour")
        if self.loss_type not in CLIPPED_LOSS_TYPES:
            raise ValueError(f"loss_type must be one of {list(CLIPPED_LOSS_TYPES)} (the clipped surrogate; the "
                             f"normaliser comes from loss_normalization), got {self.loss_type!r}")
        if self.importance_sampling_level != "token":
            raise ValueError("importance_sampling_level must be 'token' with ICTGRPOTrainer")
        if self.entropy_coef != 0.0 or self.use_adaptive_entropy:
            raise ValueError("entropy_coef / use_adaptive_entropy are not supported by ICTGRPOTrainer's loss")
        if self.off_policy_mask_threshold is not None:
            raise ValueError("off_policy_mask_threshold is not supported by ICTGRPOTrainer's loss")
        if self.delta is not None:
            raise ValueError("delta (two-sided clipping) is not supported by ICTGRPOTrainer's loss")
        if self.vllm_importance_sampling_mode not in IS_MODES:
            raise ValueError(f"vllm_importance_sampling_mode must be one of {list(IS_MODES)}, got "
                             f"{self.vllm_importance_sampling_mode!r}")
        for bound in ("vllm_importance_sampling_clip_min", "vllm_importance_sampling_clip_max"):
            value = getattr(self, bound)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
                raise ValueError(f"{bound} must be None or a number >= 0, got {value!r}")

    def _check_eval_during_training(self) -> None:
        if self.eval_benchmarks is None:
            return
        if isinstance(self.eval_benchmarks, str) or not self.eval_benchmarks:
            raise ValueError(f"eval_benchmarks must be a non-empty list of benchmark specs, got {self.eval_benchmarks!r}")
        from ictrl.data import parse_spec

        for i, spec in enumerate(self.eval_benchmarks):
            try:
                parse_spec(spec)
            except ValueError as err:
                raise ValueError(f"eval_benchmarks[{i}]: {err}") from None
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
        if self.eval_limit is not None and (isinstance(self.eval_limit, bool) or self.eval_limit < 1):
            raise ValueError(f"eval_limit must be None or an int >= 1, got {self.eval_limit!r}")
        if not self.eval_ks or max(self.eval_ks) > self.eval_num_samples or min(self.eval_ks) < 1:
            raise ValueError(f"eval_ks={self.eval_ks} must be non-empty ints in [1, eval_num_samples="
                             f"{self.eval_num_samples}]")
