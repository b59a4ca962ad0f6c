"""``python -m studies compare --horizon SETTING``: the long-horizon protocol, and the collapse / explosion
definitions.

Everything here is fixed before the first full run and not tuned on its results:

- *Setting*: a JSON file (:func:`load_setting`): the embedded task, its base's recipe overrides, every method's
  tuned (lr, loss normaliser), the fresh seeds and why the setting exists. The project's own settings (tinyarith,
  countdown, countdown-lesstrained, paths), with their dated learning rates, are data beside the package in the
  repository's ``studies/horizon/``.
- *Methods*: grpo, ict, random10, entropy20, stapo, each at the setting's tuned (lr, loss normaliser).
- *Horizon*: at least ``MIN_STEPS`` optimizer steps, or until GRPO's all-token H1 has fallen by
  ``STOP_FALL`` from its start, whichever is longer, capped at ``CAP_STEPS``. Resumably: phase 1 runs GRPO's seeds
  with the stop rule (:func:`stop_step`, checked every step by :func:`stop_callback`); the horizon N is the largest
  step at which a GRPO seed stopped; phase 2 runs every method for exactly N steps (a GRPO seed that stopped at N
  is reused, one that stopped earlier is rerun to N).
- *Seeds*: the setting's (fresh ones: not those its learning rates were tuned on).
- *Evaluation*: held-out pass@k at ``EVAL_KS`` on the first ``CURVE_PROBLEMS`` test problems x ``EVAL_N`` samples
  every ``EVAL_EVERY`` steps, and on ``EVAL_PROBLEMS`` test problems at the end; H1, H2, purity and π of all and of
  the selected tokens every step (the trainer logs them).
- *Collapse / explosion* of one run: :func:`collapse_step` and :func:`explosion_step`, stated in
  ``DEFINITIONS`` (the report prints it with the commit that fixed it).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ictrl.core.selection import get_selector
from ictrl.experiments.grid.runner import DEFAULT_METHODS

H1_KEY = "ictrl/h1/all"
H2_KEY = "ictrl/h2/all"
REWARD_KEY = "reward"

MIN_STEPS = 400
CAP_STEPS = 800
STOP_FALL = 0.8  # the stop rule: H1 at or below (1 - STOP_FALL) x its start
METHODS = DEFAULT_METHODS  # grpo, entropy20, stapo, ict, random10: the registry's default grid
PROBE_METHOD = get_selector("all").label  # GRPO: the stop rule watches its entropy
EVAL_KS = (1, 4, 16)
EVAL_N = 16
EVAL_EVERY = 50
CURVE_PROBLEMS = 64
EVAL_PROBLEMS = 200
PROMPTS_PER_STEP = 16  # the tuned study's batch: its learning rates belong to it
SELECTION_WARMUP = 2  # Θ, as in the tuned study

START_STEPS = 5  # a run's "start": the mean over its first 5 logged steps
WINDOW = 10  # the rolling mean the rules compare (one step of 16 prompts is noisy)
COLLAPSE_FRACTION = 0.2  # collapse: rolling all-token H1 <= 0.2 x start
EXPLOSION_FACTOR = 2.0  # explosion: rolling all-token H1 >= 2 x start while rolling reward < start reward

DEFINITIONS = (
    f"Start of a run: the mean over its first {START_STEPS} logged optimizer steps. Rolling value at step s: the "
    f"mean over steps s-{WINDOW - 1}..s (defined from step {WINDOW}). Collapse step: the first step whose rolling "
    f"all-token H1 (Shannon entropy of the policy at the sampled positions, nats) is at most "
    f"{COLLAPSE_FRACTION:g} x the start H1. Explosion step: the first step whose rolling all-token H1 is at least "
    f"{EXPLOSION_FACTOR:g} x the start H1 while the rolling reward is below the start reward; a run whose weights "
    f"went non-finite explodes at its last logged step. Horizon: at least {MIN_STEPS} steps, or the first step at "
    f"which every GRPO seed's rolling all-token H1 is at most {1 - STOP_FALL:g} x its start (a fall of "
    f"{STOP_FALL:.0%}), whichever is longer, capped at {CAP_STEPS}."
)

# The Rényi-2 half of the paper's claim (ICT lowers Shannon entropy while controlling Rényi-2 concentration), per
# run. Defined on 2026-11-26 after the four first settings had run (for them an after-the-fact reading), before any
# later run. H2 = -log sum p^2 <= H1; a run whose H2 halves has concentrated its mass on one token per position.
H1_LOWERED = 0.1  # H1 lowered: the last rolling all-token H1 is at most (1 - 0.1) x its start
H2_FLOOR = 0.5  # H2 controlled: the rolling all-token H2 never falls below 0.5 x its start
RENYI2_DEFINITION = (
    f"Controls Rényi-2 (one run): its all-token Shannon entropy H1 is lowered (the last rolling H1 is at most "
    f"{1 - H1_LOWERED:g} x the start H1) while its all-token Rényi-2 entropy H2 = -log Σp² is held (the rolling H2 "
    f"never falls below {H2_FLOOR:g} x the start H2), with start and rolling as above. A method controls it when "
    f"most of its seeds do. The Rényi-2 half of the claim holds in a setting when ICT controls Rényi-2 and GRPO "
    f"does not (its H2 falls below the floor, or it does not lower H1); random10 is the control, as for collapse. "
    f"Defined 2026-11-26, after the tinyarith, countdown, countdown-lesstrained and paths studies ran: for those "
    f"four it is an after-the-fact reading."
)


SETTINGS_DIR = Path(__file__).resolve().parents[1] / "horizon"  # the project's settings, by name


@dataclass(frozen=True)
class Setting:
    """One long-horizon setting, read from a JSON file by :func:`load_setting`."""

    name: str  # the file's stem
    task: str  # tinyarith or a task module path (ictrl.experiments.tasks.registry): studies.tasks.paths
    tuned: dict[str, tuple[float, str | None]]  # method -> (lr, loss normaliser; None = the method's own)
    seeds: tuple[int, ...]
    recipe: dict[str, Any] = field(default_factory=dict)  # TinyRecipe overrides on top of the task's recipe
    why: str = ""
    tuned_source: str = ""  # where the learning rates were chosen
    tune: dict[str, Any] = field(default_factory=dict)  # the tuned protocol's options that chose them (--tune)


def _setting_error(where: object, message: str) -> Exception:
    from ictrl.errors import UserError

    return UserError(f"{where}: {message}")


def setting_path(spec: str) -> Path:
    """A setting file: ``spec`` itself when it names a file, else ``studies/horizon/SPEC.json``."""
    path = Path(spec)
    if path.suffix == ".json" or path.exists():
        return path
    return SETTINGS_DIR / f"{spec}.json"


def load_setting(spec: str, need_tuned: bool = True) -> Setting:
    """The setting in file ``spec`` (or named ``spec`` in ``studies/horizon/``); a bad file or field is one
    :class:`ictrl.errors.UserError` line naming it. ``need_tuned=False`` accepts a file without ``tuned`` (a
    setting whose learning rates its own tuned protocol is still to choose: ``python -m studies compare --tune
    --setting``)."""
    from ictrl.core.loss import NORM_MODES
    from ictrl.experiments.tasks.registry import get_task

    path = setting_path(spec)
    if not path.is_file():
        known = sorted(p.stem for p in SETTINGS_DIR.glob("*.json")) if SETTINGS_DIR.is_dir() else []
        raise _setting_error(f"--horizon {spec}", f"no setting file {path}" + (
            f" (settings in {SETTINGS_DIR}: {', '.join(known)})" if known else ""))
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise _setting_error(path, f"not valid JSON ({exc.msg}, line {exc.lineno})") from None
    allowed = {"task", "tuned", "seeds", "recipe", "why", "tuned_source", "tune"}
    required = {"task", "tuned", "seeds"} if need_tuned else {"task", "seeds"}
    if not isinstance(data, dict) or required - data.keys() or data.keys() - allowed:
        what = sorted(required - data.keys()) if isinstance(data, dict) else ["an object"]
        extra = sorted(data.keys() - allowed) if isinstance(data, dict) else []
        raise _setting_error(path, f"missing field {what[0]!r}" if what else f"unknown field {extra[0]!r}")
    if not isinstance(data["task"], str):
        raise _setting_error(path, f"field 'task': expected a task name or module path, got {data['task']!r}")
    get_task(data["task"], f"{path}: field 'task'")
    tuned = data.get("tuned", {m: [1.0, None] for m in METHODS})  # absent (need_tuned=False): checked as valid
    if not isinstance(tuned, dict) or set(tuned) != set(METHODS):
        raise _setting_error(path, f"field 'tuned': needs exactly the methods {', '.join(METHODS)}")
    for m, v in tuned.items():
        ok = (isinstance(v, list) and len(v) == 2 and isinstance(v[0], (int, float)) and not isinstance(v[0], bool)
              and v[0] > 0 and (v[1] is None or v[1] in NORM_MODES))
        if not ok:
            raise _setting_error(path, f"field 'tuned.{m}': expected [lr > 0, normaliser or null], got {v!r}")
    seeds = data["seeds"]
    if (not isinstance(seeds, list) or len(seeds) < 2 or len(set(seeds)) != len(seeds)
            or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in seeds)):
        raise _setting_error(path, f"field 'seeds': expected two or more distinct integers >= 0, got {seeds!r}")
    from dataclasses import fields

    from ictrl.experiments.tasks.tinymodel import TinyRecipe

    recipe, names = data.get("recipe", {}), {f.name for f in fields(TinyRecipe)}
    if not isinstance(recipe, dict) or recipe.keys() - names:
        bad = sorted(recipe.keys() - names)[0] if isinstance(recipe, dict) else recipe
        raise _setting_error(path, f"field 'recipe': {bad!r} is not a TinyRecipe field ({', '.join(sorted(names))})")
    tune = data.get("tune", {})
    if not isinstance(tune, dict) or not all(isinstance(k, str) for k in tune):
        raise _setting_error(path, f"field 'tune': expected an object of --tune options, got {tune!r}")
    return Setting(path.stem, data["task"],
                   {m: (float(v[0]), v[1]) for m, v in data["tuned"].items()} if "tuned" in data else {},
                   tuple(seeds), dict(data.get("recipe", {})), str(data.get("why", "")),
                   str(data.get("tuned_source", "")), dict(tune))


def _values(records: Sequence[dict[str, Any]], key: str) -> list[tuple[int, float]]:
    out = []
    for r in records:
        v = r.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and isinstance(r.get("step"), int):
            out.append((int(r["step"]), float(v)))
    return out


def start_value(records: Sequence[dict[str, Any]], key: str = H1_KEY) -> float:
    """Mean of ``key`` over the first ``START_STEPS`` logged steps (NaN when fewer were logged)."""
    values = _values(records, key)[:START_STEPS]
    return math.fsum(v for _, v in values) / len(values) if len(values) == START_STEPS else math.nan


def rolling(records: Sequence[dict[str, Any]], key: str) -> list[tuple[int, float]]:
    """(step, mean of ``key`` over the last ``WINDOW`` logged steps) from the ``WINDOW``-th logged step on."""
    values = _values(records, key)
    return [(values[i][0], math.fsum(v for _, v in values[i + 1 - WINDOW:i + 1]) / WINDOW)
            for i in range(WINDOW - 1, len(values))]


def collapse_step(records: Sequence[dict[str, Any]], fraction: float = COLLAPSE_FRACTION) -> int | None:
    """The first step whose rolling all-token H1 is <= ``fraction`` x the start H1; None if none."""
    start = start_value(records)
    if not math.isfinite(start):
        return None
    return next((s for s, v in rolling(records, H1_KEY) if v <= fraction * start), None)


def explosion_step(records: Sequence[dict[str, Any]], diverged: bool = False) -> int | None:
    """The first step whose rolling all-token H1 is >= ``EXPLOSION_FACTOR`` x start while the rolling reward is
    below the start reward; a diverged run explodes at its last logged step. None if neither."""
    h1, r0 = start_value(records), start_value(records, REWARD_KEY)
    if math.isfinite(h1) and math.isfinite(r0):
        reward = dict(rolling(records, REWARD_KEY))
        for s, v in rolling(records, H1_KEY):
            if v >= EXPLOSION_FACTOR * h1 and reward.get(s, math.inf) < r0:
                return s
    if diverged:
        steps = [s for s, _ in _values(records, "loss")] or [s for s, _ in _values(records, H1_KEY)]
        return max(steps) if steps else 0
    return None


def renyi2_control(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One run under ``RENYI2_DEFINITION``: whether H1 was lowered, whether H2 was held, both (``controls``), and
    the lowest rolling H2 and the last rolling H1 as fractions of their starts (None without enough steps)."""
    h1, h2 = start_value(records, H1_KEY), start_value(records, H2_KEY)
    roll1, roll2 = rolling(records, H1_KEY), rolling(records, H2_KEY)
    if not (math.isfinite(h1) and math.isfinite(h2) and h1 > 0 and h2 > 0 and roll1 and roll2):
        return {"h1_lowered": None, "h2_held": None, "controls": None, "h1_end_ratio": None, "h2_min_ratio": None}
    h1_end, h2_min = roll1[-1][1] / h1, min(v for _, v in roll2) / h2
    lowered, held = h1_end <= 1 - H1_LOWERED, h2_min >= H2_FLOOR
    return {"h1_lowered": lowered, "h2_held": held, "controls": lowered and held, "h1_end_ratio": h1_end,
            "h2_min_ratio": h2_min}


def stop_step(records: Sequence[dict[str, Any]], min_steps: int = MIN_STEPS) -> int | None:
    """The stop rule on one GRPO run: the first step >= ``min_steps`` whose rolling H1 has fallen by
    ``STOP_FALL`` from the start; None while it has not."""
    start = start_value(records)
    if not math.isfinite(start):
        return None
    return next((s for s, v in rolling(records, H1_KEY) if s >= min_steps and v <= (1 - STOP_FALL) * start),
                None)


def horizon(stopped: Sequence[int]) -> int:
    """N: the largest step at which a GRPO seed stopped (each stopped at the rule or at the cap)."""
    if not stopped:
        raise ValueError("horizon needs the GRPO seeds' stop steps")
    return max(stopped)


def stop_callback(min_steps: int, metrics_path: Any) -> Any:
    """A ``transformers.TrainerCallback`` that ends training once :func:`stop_step` fires on the run's own log
    (the rows ``MetricsJSONL`` wrote to ``metrics_path``; add it after that callback)."""
    from transformers import TrainerCallback

    from ictrl.files import load_metrics

    class StopRule(TrainerCallback):
        def on_log(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step >= min_steps and stop_step(load_metrics(metrics_path), min_steps) is not None:
                control.should_training_stop = True

    return StopRule()
