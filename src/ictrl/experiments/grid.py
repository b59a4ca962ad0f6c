"""The resumable (method, seed[, lr]) grid shared by ``ictrl compare`` and ``ictrl sweep``.

One *run* = RL training with one method and seed (and learning rate), then a held-out pass@k evaluation. Each
run owns a directory ``<root>/[lr<lr>/]<method>/seed<seed>/`` holding ``metrics.jsonl`` (the trainer's per-step
log), ``eval/`` (the harness's samples and results) and, written atomically and last, ``done.json`` (the run's
result). A rerun skips runs whose ``done.json`` exists and restarts the others from scratch; in ``--config``
mode (the engine saves checkpoints) an unfinished run resumes from its last complete checkpoint instead.

Two sources of runs:

- the *embedded task* (default): the tiny arithmetic task of ``tinytask`` on the cached warm-started base model
  of ``tinymodel.build_tiny_base``, trained with the engine's ``ICTGRPOTrainer`` (the same trainer class,
  config mapping and ``metrics.jsonl`` callback as ``ictrl train``) and evaluated on the task's test split;
- a *run config* (``--config``): ``ictrl train``'s own ``engine.run.train``, evaluated on ``data.eval``.

Held-out evaluation samples with the training temperature and top-p, so the base model's P@1 is also its
expected training reward (the reference ``outcomes.label_run`` compares a run's final reward with).
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ictrl.experiments.report import atomic_write_text

DONE_FILE = "done.json"
EVAL_DIR = "eval"
CONFIG_EVAL_N = 4  # samples per problem when evaluating --config runs (n >= the largest k, 4)



def _methods() -> dict[str, Any]:
    """Method label (grpo, entropy20, ...) -> its registered selector, in registration order."""
    from ictrl.selection import SELECTORS

    return {selector.label: selector for selector in SELECTORS.values()}


METHODS = _methods()
DEFAULT_METHODS = tuple(label for label, selector in METHODS.items() if selector.in_default_grid)


def parse_methods(names: str | Sequence[str]) -> list[str]:
    """``"grpo,ict"`` or ``["grpo", "ict"]`` -> de-duplicated method labels, order kept. Any name the
    selector registry accepts is allowed (``all`` = ``grpo``, ``module:function``); the label names the runs."""
    from ictrl.selection import get_selector

    items = [n.strip() for n in (names.split(",") if isinstance(names, str) else names)]
    items = [n for n in items if n]
    if not items:
        raise ValueError("methods: need at least one method")
    labels = []
    for name in items:
        try:
            labels.append(get_selector(name).label)
        except ValueError as exc:
            raise ValueError(f"methods: {str(exc).replace('unknown selector', 'unknown method')}") from None
    return list(dict.fromkeys(labels))


def method_keys(name: str, warmup_steps: int | None = None) -> dict[str, Any]:
    """The run-config keys that choose method ``name``: its selector and run name, plus Θ = ``warmup_steps``
    for methods that warm up (everything else is the selector's registered default)."""
    from ictrl.selection import get_selector

    (label,) = parse_methods([name])
    selector = get_selector(name)
    keys: dict[str, Any] = {"token_selector": name if ":" in name else selector.name, "run_name": label}
    if warmup_steps is not None and selector.warmup_steps > 0:
        keys["selection_warmup_steps"] = warmup_steps
    return keys


def theta(rl: dict[str, Any]) -> int:
    """Θ of an embedded-task grid whose settings are ``rl`` (``TinyRL`` as a dict): its ``selection_warmup``, or
    ICT's registered default."""
    return int(rl["selection_warmup"]) if rl.get("selection_warmup") is not None else METHODS["ict"].warmup_steps


@dataclass(frozen=True)
class RunSpec:
    """One cell of the grid; ``lr`` None means the recipe's learning rate. ``ratio`` / ``norm`` override the
    method's selected fraction / loss normaliser (``ictrl compare --tune``'s variants); None keeps its default."""

    method: str
    seed: int
    lr: float | None = None
    ratio: float | None = None
    norm: str | None = None

    @property
    def variant(self) -> str:
        """The method with its overrides, e.g. ``ict``, ``ict-r0.2``, ``random10-per_response_all``."""
        return (self.method + (f"-r{self.ratio:g}" if self.ratio is not None else "")
                + (f"-{self.norm}" if self.norm is not None else ""))

    @property
    def relpath(self) -> str:
        head = f"lr{self.lr:g}/" if self.lr is not None else ""
        return f"{head}{self.variant}/seed{self.seed}"


def grid_specs(methods: Sequence[str], seeds: int, lrs: Sequence[float] | None = None) -> list[RunSpec]:
    """Every (lr, method, seed) cell, seeds innermost so that a partial grid covers methods evenly per lr."""
    if seeds < 1:
        raise ValueError(f"seeds: need at least 1, got {seeds}")
    methods = parse_methods(methods)
    if lrs is None:
        return [RunSpec(m, s) for s in range(seeds) for m in methods]
    for lr in lrs:
        if not (math.isfinite(lr) and lr > 0):
            raise ValueError(f"lrs: learning rates must be finite and > 0, got {lr!r}")
    return [RunSpec(m, s, float(lr)) for lr in lrs for s in range(seeds) for m in methods]


def run_grid(
    specs: Sequence[RunSpec],
    root: str | Path,
    run_one: Callable[[RunSpec, Path], dict[str, Any]],
    log: Callable[[str], None] = print,
    jobs: int = 1,
    threads: int | None = None,
) -> dict[RunSpec, dict[str, Any]]:
    """Run every spec without a done marker; returns spec -> result (the content of its ``done.json``).

    ``run_one(spec, run_dir)`` trains and evaluates into ``run_dir`` (which may hold an unfinished attempt: the
    runner decides between resuming and starting over) and returns a JSON-serialisable dict with at least
    ``p1`` and ``p4``. The grid adds ``spec`` and ``seconds`` and writes ``done.json`` atomically, last.

    jobs > 1 runs that many worker processes (spawned; ``run_one`` must be picklable, e.g. a
    ``functools.partial`` of a module-level function), each with ``threads`` torch threads (default 1): on a
    few CPU cores, single-threaded processes side by side get more done with tiny models than one process
    with several threads.
    """
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, got {jobs}")
    root = Path(root)
    results: dict[RunSpec, dict[str, Any]] = {}
    todo = []
    for spec in specs:
        done = root / spec.relpath / DONE_FILE
        if done.is_file():
            results[spec] = json.loads(done.read_text())
        else:
            todo.append(spec)
    log(f"grid: {len(specs)} runs, {len(results)} already done, {len(todo)} to run"
        + (f" in {jobs} processes" if jobs > 1 and todo else ""))

    def finish(spec: RunSpec, result: dict[str, Any], seconds: float) -> None:
        for key in ("p1", "p4"):
            if key not in result:
                raise ValueError(f"{spec.relpath}: the runner's result has no {key!r}")
        result = {"spec": asdict(spec), "seconds": seconds, **result}
        atomic_write_text(root / spec.relpath / DONE_FILE, json.dumps(result, indent=1) + "\n")
        results[spec] = result
        log(f"[{len(results)}/{len(specs)}] {spec.relpath}: P@1 {result['p1']:.3f} P@4 {result['p4']:.3f} "
            f"final reward {result.get('final_reward', math.nan):.3f} ({seconds:.0f}s)")

    for spec in todo:
        run_dir = root / spec.relpath
        if run_dir.exists():
            log(f"{spec.relpath}: unfinished earlier attempt found (no {DONE_FILE})")
        run_dir.mkdir(parents=True, exist_ok=True)
    if jobs == 1 or len(todo) <= 1:
        for spec in todo:
            start = time.perf_counter()
            result = run_one(spec, root / spec.relpath)
            finish(spec, result, time.perf_counter() - start)
    else:
        import multiprocessing
        from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

        ctx = multiprocessing.get_context("spawn")  # fork after torch/OpenMP initialisation can deadlock
        with ProcessPoolExecutor(jobs, mp_context=ctx, initializer=_init_worker, initargs=(threads or 1,)) as pool:
            pending = {pool.submit(_timed, run_one, spec, root / spec.relpath): spec for spec in todo}
            while pending:
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    spec = pending.pop(future)
                    result, seconds = future.result()
                    finish(spec, result, seconds)
    return {spec: results[spec] for spec in specs}


def _init_worker(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


def _timed(run_one: Callable[[RunSpec, Path], dict[str, Any]], spec: RunSpec,
           run_dir: Path) -> tuple[dict[str, Any], float]:
    start = time.perf_counter()
    return run_one(spec, run_dir), time.perf_counter() - start


def cached_result(path: Path, compute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``compute()`` once: its JSON result is stored atomically at ``path`` and read back on later calls."""
    if path.is_file():
        return json.loads(path.read_text())
    result = compute()
    atomic_write_text(path, json.dumps(result, indent=1) + "\n")
    return result


def final_reward(records: Sequence[dict[str, Any]], window: int = 5) -> float:
    """Mean ``reward`` over the last ``window`` logged steps (NaN when none logged a reward)."""
    rewards = [float(r["reward"]) for r in records if isinstance(r.get("reward"), (int, float))]
    tail = rewards[-window:]
    return math.fsum(tail) / len(tail) if tail else math.nan


# ------------------------------------------------------------------------------------------ the embedded task


@dataclass(frozen=True)
class TinyRL:
    """RL and evaluation budget on the embedded task (``default_tiny_settings`` fills it from ``ictrl demo``'s
    recipe, so compare / sweep runs are demo runs with another method, seed or lr)."""

    steps: int = field(default=60, metadata={"help": "optimizer steps per run"})
    lr: float = field(default=2e-4, metadata={"help": "Adam learning rate (constant after warm-up)"})
    lr_warmup_steps: int = field(default=0, metadata={"help": "linear learning-rate warm-up steps"})
    prompts_per_step: int = field(default=32, metadata={"help": "prompts per generation batch"})
    num_generations: int = field(default=8, metadata={"help": "G: samples per prompt"})
    num_iterations: int = field(default=2, metadata={"help": "optimizer steps per generation batch (mu)"})
    epsilon: float = field(default=0.2, metadata={"help": "lower clip"})
    epsilon_high: float = field(default=0.28, metadata={"help": "upper clip (DAPO clip-higher)"})
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature (training and eval)"})
    selection_warmup: int | None = field(default=None, metadata={"help": "Θ for the methods that warm up (ict, random10, frequent90); None: their registered default"})
    eval_problems: int = field(default=200, metadata={"help": "held-out problems (test split)"})
    eval_n: int = field(default=4, metadata={"help": "samples per held-out problem (>= 4 for P@4)"})
    eval_split: str = field(default="test", metadata={"help": "split evaluated after training: test, or dev "
                                                      "for tuning runs (ictrl compare --tune)"})
    eval_every: int = field(default=0, metadata={"help": "optimizer steps between held-out pass@k evaluations "
                                                 "during training (the eval/* curves); 0: only after training"})
    curve_problems: int = field(default=64, metadata={"help": "held-out problems (the first of the test split) "
                                                      "evaluated during training"})

    def __post_init__(self) -> None:
        for name in ("steps", "prompts_per_step", "num_iterations", "eval_problems"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.num_generations < 2:
            raise ValueError(f"num_generations must be at least 2, got {self.num_generations}")
        if self.eval_every < 0 or self.curve_problems < 1:
            raise ValueError(f"eval_every must be >= 0 and curve_problems >= 1, got {self.eval_every}, "
                             f"{self.curve_problems}")
        if self.eval_n < 4:
            raise ValueError(f"eval_n must be at least 4 (P@4 needs n >= 4), got {self.eval_n}")
        if self.eval_split not in ("dev", "test"):
            raise ValueError(f"eval_split must be 'dev' or 'test', got {self.eval_split!r}")
        if not (self.lr > 0 and self.temperature > 0):
            raise ValueError(f"lr and temperature must be > 0, got {self.lr}, {self.temperature}")


def tiny_run_config(settings: TinyRL, base: Path, spec: RunSpec, run_dir: Path) -> Any:
    """The validated ``RunConfig`` of one embedded-task run (the engine maps it onto ICTGRPOConfig)."""
    from ictrl.engine.run_config import config_from_dict
    from ictrl.experiments.tinymodel import max_new_tokens

    difficulty = _base_difficulty(base)
    batch = settings.prompts_per_step * settings.num_generations
    method = method_keys(spec.method, settings.selection_warmup)
    if spec.ratio is not None:
        method["selection_ratio"] = spec.ratio
    if spec.norm is not None:
        method["loss_normalization"] = spec.norm
    data = {
        "model": {"name_or_path": str(base), "dtype": "float32"},
        "output_dir": str(run_dir),
        **method,
        "num_generations": settings.num_generations, "temperature": settings.temperature,
        "max_completion_length": max_new_tokens(difficulty, base_task(base)),
        "learning_rate": spec.lr if spec.lr is not None else settings.lr, "lr_scheduler_type": "constant",
        "warmup_steps": settings.lr_warmup_steps, "epsilon": settings.epsilon, "epsilon_high": settings.epsilon_high,
        "beta": 0.0, "num_iterations": settings.num_iterations, "per_device_train_batch_size": batch,
        "max_steps": settings.steps, "seed": spec.seed, "weight_decay": 0.0, "max_grad_norm": 1.0,
        "report_to": "none", "logging_steps": 1, "disable_tqdm": True,
        "top_k": 0,  # pure sampling, as ictrl demo
        "save_strategy": "no",  # runs are short: a crashed run restarts rather than resumes
    }
    return config_from_dict(data, source=f"{spec.relpath} (embedded task)")


def _base_difficulty(base: Path) -> tuple[int, ...]:
    info = json.loads((base / "warm_start.json").read_text())
    return tuple(info["recipe"]["difficulty"])


def base_task(base: Path) -> str:
    """The embedded task a cached base was warm-started on (bases from before the task field: tinyarith)."""
    return str(json.loads((base / "warm_start.json").read_text())["recipe"].get("task", "tinyarith"))


def _max_new(base: Path) -> int:
    from ictrl.experiments.tinymodel import max_new_tokens

    return max_new_tokens(_base_difficulty(base), base_task(base))


def tiny_eval_tasks(settings: TinyRL, base: Path) -> list[Any]:
    from ictrl.experiments.tasks import get_task

    task = get_task(base_task(base))
    # seed 0 as ictrl demo: the held-out set depends only on the task, never on a run's seed.
    problems = task.generate_problems(settings.eval_problems, settings.eval_split, _base_difficulty(base), seed=0)
    return [task.eval_task(problems)]


def evaluate_model(model: Any, tokenizer: Any, tasks: list[Any], out_dir: Path, label: str, n: int,
                   max_new_tokens: int, temperature: float, top_p: float) -> dict[str, float]:
    """Held-out pass@1 / pass@4 (fractions, averaged over ``tasks``) with the HF backend, one eval seed (0)."""
    from ictrl.eval.generate import HFBackend
    from ictrl.eval.harness import EvalConfig, evaluate

    config = EvalConfig(model=label, n=n, ks=(1, 4), max_new_tokens=max_new_tokens, temperature=temperature,
                        top_p=top_p, seeds=(0,), chunk_size=64, n_bootstrap=200)
    result = evaluate(tasks, HFBackend(model, tokenizer, batch_size=256), config, output_dir=out_dir,
                      progress=False)
    avg = result.summary["average"]["pass_at_k"]
    return {"p1": float(avg["1"]["mean"]), "p4": float(avg["4"]["mean"])}


def train_tiny(settings: TinyRL, base: Path, spec: RunSpec, run_dir: Path) -> dict[str, Any]:
    """Train one run on the embedded task from scratch and evaluate it; returns p1, p4, final_reward."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from ictrl.engine.callbacks import MetricsJSONL
    from ictrl.engine.run import build_trainer_args, make_trainer_class, trainer_classes
    from ictrl.experiments.report import load_metrics
    from ictrl.experiments.tasks import get_task
    from ictrl.experiments.tinymodel import load_tiny_base
    from ictrl.experiments.update_norm import UpdateNorm

    for stale in list(run_dir.iterdir()):  # an unfinished attempt: start over
        shutil.rmtree(stale) if stale.is_dir() else stale.unlink()
    cfg = tiny_run_config(settings, base, spec, run_dir)
    args = build_trainer_args(cfg, cfg.output_dir)
    model, tokenizer = load_tiny_base(base)
    task = get_task(base_task(base))
    dataset = task.train_dataset(settings.prompts_per_step, settings.steps, _base_difficulty(base), spec.seed)
    _, trainer_cls = trainer_classes()
    trainer = make_trainer_class(trainer_cls)(model=model, reward_funcs=[task.reward], args=args,
                                              train_dataset=dataset, processing_class=tokenizer)
    for cb in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(cb)
    metrics_path = run_dir / "metrics.jsonl"
    trainer.add_callback(UpdateNorm())  # before MetricsJSONL: it adds ictrl/update_norm to the row that one writes
    trainer.add_callback(MetricsJSONL(metrics_path, accuracy_reward=task.reward.__name__))
    if settings.eval_every:
        trainer.add_callback(curve_callback(settings, base, spec).bind(trainer))
    try:
        trainer.train()
    except RuntimeError as exc:
        if not is_divergence(exc):
            raise
        # Weights gone non-finite (sampling from nan/inf probabilities): an outcome of the run, not a bug.
        # The model can no longer sample, so it scores 0 on the held-out set.
        records = load_metrics(metrics_path) if metrics_path.exists() else []
        return {"p1": 0.0, "p4": 0.0, "final_reward": final_reward(records), "steps": trainer.state.global_step,
                "diverged": str(exc)[:300]}
    tasks = tiny_eval_tasks(settings, base)
    scores = evaluate_model(trainer.model, tokenizer, tasks, run_dir / EVAL_DIR, f"{spec.relpath}", settings.eval_n,
                            _max_new(base), settings.temperature, 1.0)
    return {**scores, "final_reward": final_reward(load_metrics(metrics_path)), "steps": trainer.state.global_step}


def curve_callback(settings: TinyRL, base: Path, spec: RunSpec) -> Any:
    """Held-out pass@k every ``settings.eval_every`` steps on the first ``curve_problems`` test problems, with the
    end-of-run evaluation's sampling settings and seed: the ``eval/avg/pass@1`` curves of compare/sweep."""
    from ictrl.engine.eval_callback import PassAtKCallback
    from ictrl.eval.harness import EvalConfig, EvalTask

    (task,) = tiny_eval_tasks(settings, base)
    subset = EvalTask(task.name, list(task.problems)[:settings.curve_problems], task.prompt_fn, task.reward_fn,
                      task.extract_fn)
    config = EvalConfig(model=spec.relpath, n=settings.eval_n, ks=(1, 4),
                        max_new_tokens=_max_new(base), temperature=settings.temperature,
                        top_p=1.0, seeds=(0,), n_bootstrap=1)
    return PassAtKCallback([subset], config, every=settings.eval_every, batch_size=256)


def is_divergence(exc: BaseException) -> bool:
    """torch's error for sampling from a distribution with nan / inf / negative entries."""
    text = str(exc).lower()
    return "probability tensor contains" in text or ("nan" in text and "inf" in text)


def eval_tiny_base(settings: TinyRL, base: Path, out_dir: Path) -> dict[str, Any]:
    from ictrl.experiments.tinymodel import load_tiny_base

    model, tokenizer = load_tiny_base(base)
    return evaluate_model(model, tokenizer, tiny_eval_tasks(settings, base), out_dir, str(base), settings.eval_n,
                          _max_new(base), settings.temperature, 1.0)


# ------------------------------------------------------------------------------------------ a run config


def config_run(config_path: Path, steps: int | None, eval_limit: int | None, spec: RunSpec,
               run_dir: Path) -> dict[str, Any]:
    """One run of ``ictrl train`` from ``config_path`` with the grid's method / seed / lr / steps, resumed from
    its last complete checkpoint when there is one, then evaluated on the config's ``data.eval``."""
    from ictrl.engine.run import complete_checkpoints, train
    from ictrl.experiments.report import load_metrics
    from ictrl.models import load_model_and_tokenizer

    cfg = load_run_config(config_path, spec, run_dir, steps)
    resume = bool(complete_checkpoints(run_dir))
    shutil.rmtree(run_dir / EVAL_DIR, ignore_errors=True)  # an eval of an unfinished model is stale
    if not resume and (run_dir / "metrics.jsonl").exists():
        (run_dir / "metrics.jsonl").unlink()
    result = train(cfg, resume=resume, source=str(config_path))
    model, tokenizer = load_model_and_tokenizer(str(result.final_model), dtype=cfg.model.dtype)
    scores = config_eval(cfg, model, tokenizer, run_dir / EVAL_DIR, str(result.final_model), eval_limit)
    records = load_metrics(run_dir / "metrics.jsonl")
    return {**scores, "final_reward": final_reward(records), "steps": result.global_step, "resumed": resume}


def load_run_config(config_path: Path, spec: RunSpec, run_dir: Path, steps: int | None) -> Any:
    """The config file with the method section replaced and output_dir / seed / lr / max_steps set."""
    from ictrl.engine.run_config import config_from_dict, read_yaml

    data = read_yaml(config_path)
    for key in ("token_selector", "selection_ratio", "selection_scope", "selection_warmup_steps",
                "selection_options", "loss_normalization", "run_name"):
        data.pop(key, None)  # the grid's method replaces the config's, defaults included
    data.update(method_keys(spec.method), output_dir=str(run_dir), seed=spec.seed, disable_tqdm=True)
    if spec.lr is not None:
        data["learning_rate"] = spec.lr
    if steps is not None:
        data["max_steps"] = steps
    cfg = config_from_dict(data, source=str(config_path))
    if not cfg.data.eval:
        raise ValueError(f"{config_path}: data.eval: --config needs held-out benchmarks to evaluate on")
    return cfg


def config_eval(cfg: Any, model: Any, tokenizer: Any, out_dir: Path, label: str, limit: int | None) -> dict[str, float]:
    from ictrl.eval.harness import benchmark_tasks

    tasks = benchmark_tasks(cfg.data.eval, tokenizer=tokenizer, limit=limit)
    t = cfg.trainer
    return evaluate_model(model, tokenizer, tasks, out_dir, label, CONFIG_EVAL_N, t.get("max_completion_length", 256),
                          t.get("temperature", 1.0), t.get("top_p", 1.0))


def eval_config_base(config_path: Path, out_dir: Path, eval_limit: int | None) -> dict[str, Any]:
    from ictrl.models import load_model_and_tokenizer

    cfg = load_run_config(config_path, RunSpec("grpo", 0), out_dir, None)
    model, tokenizer = load_model_and_tokenizer(cfg.model.name_or_path, dtype=cfg.model.dtype)
    return config_eval(cfg, model, tokenizer, out_dir / EVAL_DIR, cfg.model.name_or_path, eval_limit)


# ------------------------------------------------------------------------------------------ the command lines

# Warm-start noise per task beyond the shared recipe: countdown's demonstrations err mostly by choice (a correct
# chain to another value), rarely by an arithmetic slip.
# Its longer chains stay at 0% dev pass@1 for the first ~1,000 steps: more patience than tinyarith's 6 evaluations.
TASK_RECIPES: dict[str, dict[str, Any]] = {"countdown": {"order_error": 0.5, "digit_error": 0.1,
                                                           "train_problems": 1300, "patience": 12,
                                                           "max_steps": 4000}}

# --quick: ictrl demo's quick base model and an RL budget small enough for tests (seconds per run).
QUICK_RL = dict(steps=2, prompts_per_step=4, num_generations=4, num_iterations=1, selection_warmup=0,
                eval_problems=8)


def add_common_arguments(parser: Any, default_output: str) -> None:
    """Options shared by ``ictrl compare`` and ``ictrl sweep``."""
    parser.add_argument("--methods", default=",".join(DEFAULT_METHODS),
                        help=f"comma-separated methods from: {', '.join(METHODS)}, their selector names, or "
                             "module:function (default: %(default)s)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per method (0..N-1; default: %(default)s)")
    parser.add_argument("--steps", type=int, default=None,
                        help="optimizer steps per run (default: the embedded recipe's, or the config's max_steps)")
    parser.add_argument("--output-dir", type=Path, default=Path(default_output),
                        help="where run directories, tables, plots and report.html go; a rerun resumes")
    parser.add_argument("--config", type=Path, default=None,
                        help="an `ictrl train` YAML config instead of the embedded task (its token_selector and "
                             "selection keys are replaced per method; held-out eval on its data.eval)")
    parser.add_argument("--quick", action="store_true", help="a tiny base model and 2 steps per run (tests)")
    parser.add_argument("--eval-problems", type=int, default=None,
                        help="held-out problems (embedded task; default 200) or per-benchmark limit (--config)")
    parser.add_argument("--prompts-per-step", type=int, default=None, help="embedded task: prompts per step")
    parser.add_argument("--selection-warmup", type=int, default=None,
                        help="embedded task: Θ, steps of full GRPO before ict/random10 select (default 10); "
                             "scale it down with --steps")
    parser.add_argument("--eval-every", type=int, default=None,
                        help="embedded task: held-out pass@k every N optimizer steps during training (the "
                             "eval/avg/pass@1 curve); default: only after training")
    parser.add_argument("--jobs", type=int, default=1, help="runs in parallel, one torch thread each")


@dataclass
class Experiment:
    """What a grid command needs: how to run one cell, how to evaluate the base model, what to record."""

    runner: Callable[[RunSpec, Path], dict[str, Any]]
    eval_base: Callable[[Path], dict[str, Any]]
    settings: dict[str, Any]
    default_lr: float | None


def make_experiment(args: Any, log: Callable[[str], None] = print) -> Experiment:
    """The embedded task (building or reusing the cached base) or ``--config``, from the shared options."""
    import functools

    if args.steps is not None and args.steps < 1:
        raise ValueError(f"--steps must be at least 1, got {args.steps}")
    if args.eval_problems is not None and args.eval_problems < 1:
        raise ValueError(f"--eval-problems must be at least 1, got {args.eval_problems}")
    if args.config is not None:
        if not args.config.is_file():
            raise ValueError(f"--config: {args.config}: file not found")
        probe = load_run_config(args.config, RunSpec("grpo", 0), args.output_dir / "_probe", args.steps)
        runner = functools.partial(config_run, args.config, args.steps, args.eval_problems)
        return Experiment(
            runner=runner,
            eval_base=lambda out: eval_config_base(args.config, out, args.eval_problems),
            settings={"source": "config", "config": str(args.config), "steps": probe.trainer.get("max_steps", -1),
                      "model": probe.model.name_or_path, "eval": list(probe.data.eval),
                      "eval_limit": args.eval_problems},
            default_lr=probe.trainer.get("learning_rate", 1e-6),
        )
    from ictrl.experiments.tinymodel import TinyRecipe, build_tiny_base

    recipe_kw, rl_kw = default_tiny_settings(args.quick)
    task = getattr(args, "task", None) or "tinyarith"
    if task != "tinyarith":
        from ictrl.experiments.tasks import DEFAULT_DIFFICULTY

        extra = TASK_RECIPES.get(task, {})
        if args.quick:  # the quick recipe's own budget (steps, problems) wins
            extra = {k: v for k, v in extra.items() if k not in recipe_kw}
        recipe_kw.update(task=task, difficulty=DEFAULT_DIFFICULTY[task], **extra)
    if args.steps is not None:
        rl_kw["steps"] = args.steps
    if args.eval_problems is not None:
        rl_kw["eval_problems"] = args.eval_problems
    if args.prompts_per_step is not None:
        rl_kw["prompts_per_step"] = args.prompts_per_step
    if getattr(args, "eval_every", None) is not None:
        rl_kw["eval_every"] = args.eval_every
    if args.selection_warmup is not None:
        if args.selection_warmup < 0:
            raise ValueError(f"--selection-warmup must be >= 0, got {args.selection_warmup}")
        rl_kw["selection_warmup"] = args.selection_warmup
    recipe = TinyRecipe(**recipe_kw)
    settings = TinyRL(**rl_kw)
    base = build_tiny_base(recipe, log=log)
    return Experiment(
        runner=functools.partial(train_tiny, settings, base),
        eval_base=functools.partial(eval_tiny_base, settings, base),
        settings={"source": "embedded", "base": str(base), "recipe": asdict(recipe), "rl": asdict(settings)},
        default_lr=settings.lr,
    )


def default_tiny_settings(quick: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """(TinyRecipe kwargs, TinyRL kwargs): ``ictrl demo``'s base recipe (seed 0, shared by every run) and RL plan."""
    from ictrl.experiments import demo

    if quick:
        return dict(demo.QUICK_RECIPE), dict(QUICK_RL)
    plan = demo.FULL
    # ictrl demo's full run uses TinyRecipe()'s defaults (seed = its --seed); every grid run shares seed 0's base.
    return {}, {"steps": plan["steps"], "lr": plan["lr"], "prompts_per_step": plan["prompts"],
                "num_generations": plan["generations"], "eval_problems": plan["eval_problems"],
                "eval_n": plan["eval_samples"]}


def load_grid_metrics(root: Path, specs: Sequence[RunSpec]) -> dict[RunSpec, list[dict[str, Any]]]:
    from ictrl.experiments.report import load_metrics

    return {s: load_metrics(root / s.relpath / "metrics.jsonl") for s in specs}
