"""Verifiable rewards: math (math-verify), GSM8K (numeric), multiple choice (letter), format.

Every reward is a plain callable ``fn(completion: str, gold: str) -> float`` returning 0.0 or 1.0;
:func:`trl_reward` wraps one into TRL's batched signature ``(prompts, completions, **columns) -> list[float]``.

Design of :func:`math_reward` (the only reward that can be slow)
-----------------------------------------------------------------
RL training grades thousands of completions per step, and completions are adversarial by accident (a model
that writes ``9^{9^{9^9}}`` or a 100k-character box). math-verify's own timeouts use ``SIGALRM``, which fails
outside the main thread and is unsafe inside libraries, so they are always disabled here
(``parsing_timeout=None``, ``timeout_seconds=None``) and replaced by the pipeline below:

1. **Extraction** (:mod:`~ictrl.rewards.extraction`, in-process, linear time): the last ``\\boxed{...}`` /
   ``\\fbox{...}`` with balanced braces (a truncated last box falls back to the one before; only the last 8
   are tried), else the last "The answer is X" / "answer: X", else the last number in a text that reads as text
   (not in binary junk); the order is a :class:`MathExtractor` option. A box nested deeper than
   ``max_brace_depth`` is refused and the completion has no answer: nothing falls back past it.
2. **Pre-checks**: an extracted answer longer than ``max_answer_chars`` (default 1000; the longest gold in
   MATH train is 159 characters), or holding a numeric power tower (``9^{9^9}``), a 7+-digit exponent
   (``1e1234567`` too), a 5+-digit factorial or three bare nested braces ``{{{`` (unless the gold has the same
   shape), scores 0.0 without being parsed. Golds in MATH/MATH-500 nest braces at most 2 deep.
3. **Fast path** (:mod:`~ictrl.rewards.normalize`, microseconds): bold dropped (``\\mathbf{0.5}`` is ``0.5``), and
   invisible format characters (U+200B, U+FEFF, a soft hyphen: Unicode Cf) from golds and completions alike;
   equal after light LaTeX normalisation (brace styles ``E_{1}`` = ``E_1`` included) -> 1.0; two single numbers
   are read exactly in every written form (``8.7e8``, ``8.7 \\times 10^{8}``, ``870{,}000{,}000``, a trailing
   ``\\text{ unit}``, exponents of any length without writing the number out) and decided: equal -> 1.0, else 0.0
   (math-verify would round both to 6 decimals). Anything else goes to math-verify, with e-notation rewritten
   (math-verify reads ``8.7e8`` as 8.7 * e * 8), a trailing unit removed, and every decimal read exactly in the
   worker; the one tolerance is a gold of 6+ decimals against an answer with no decimal (``\\frac{1}{3}`` vs
   ``0.333333``), which scores 1.0 when the answer rounds to the gold (docs/method-choices.md, "Grading").
4. **Caches**: a bounded LRU over ``(answer, gold)`` (a group of G samples often repeats answers), and one of
   pairs that timed out, so the same bomb costs its budget once.
5. **math-verify in a persistent worker process** (:mod:`~ictrl.rewards.verify`, :mod:`~ictrl.rewards.worker`)
   with a budget of CPU time per call (default 3 s), enforced by the kernel in the worker (``ITIMER_PROF``,
   backed by ``RLIMIT_CPU``): a loaded machine stretches the wall time of a call but not its verdict. A call
   over budget ends its worker, a warm spare takes its place (a new spare starts), and the call returns 0.0 and
   counts a timeout. A wall-clock backstop (``wall_timeout``, default 60 s) bounds the whole call, waiting for a
   free worker and a fresh worker's start included (counted as a stall). Workers die with their parent
   (``PR_SET_PDEATHSIG``, or a watchdog thread off Linux) and their address space is capped (``RLIMIT_AS``,
   4 GiB). The worker is a plain ``python -c`` subprocess (not ``multiprocessing``), so it works from threads,
   from forked or daemonic pool workers and under any start method. One pool per process, re-created after
   ``fork``; ``configure(workers=N)`` lets N threads verify in parallel. math-verify's unit stripping is off
   (its unit list holds single letters, so ``\\frac{1}{m} t`` lost its ``t``); ictrl strips units itself.

Figures for the grader corpus (10k+ adversarial inputs, at idle and under a CPU hog): bench/README.md.
``configure(guard="inline")`` runs math-verify in-process with no limit, for trusted inputs only. Counters:
:func:`reward_stats` (per process). :mod:`~ictrl.rewards.graders` holds the rewards,
:mod:`~ictrl.rewards.trl_adapters` the TRL adapters.
"""


from ictrl.rewards.extraction import DEFAULT_EXTRACTOR, EXTRACTION_STEPS, MathExtractor, extract_choice, last_boxed
from ictrl.rewards.graders import choice_reward, format_reward, gsm8k_gold, gsm8k_reward, math_reward
from ictrl.rewards.normalize import parse_number
from ictrl.rewards.trl_adapters import (REWARDS, completion_text, get_reward, make_trl_reward, trl_kind_reward,
                                        trl_reward)
from ictrl.rewards.verify import (
    RewardStats,
    configure,
    reset_reward_stats,
    reward_stats,
    shutdown_workers,
    verify_answer,
)

__all__ = [
    "DEFAULT_EXTRACTOR", "EXTRACTION_STEPS", "REWARDS", "MathExtractor", "RewardStats", "choice_reward",
    "completion_text", "configure", "extract_choice", "format_reward", "get_reward", "gsm8k_gold", "gsm8k_reward",
    "last_boxed", "make_trl_reward", "math_reward", "parse_number", "reset_reward_stats", "reward_stats",
    "shutdown_workers", "trl_kind_reward", "trl_reward", "verify_answer",
]
