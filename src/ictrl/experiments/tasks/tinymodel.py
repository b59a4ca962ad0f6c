"""The demo's tiny base model: a Qwen2-architecture network warm-started on imperfect demonstrations.

``build_tiny_base(recipe)`` returns the path of a ``save_pretrained`` checkpoint
(model + byte tokenizer, reloadable with ``AutoModelForCausalLM`` / ``AutoTokenizer``).
It is cached under ``$ICTRL_CACHE_DIR`` (default ``~/.cache/ictrl``) in
``tiny-base-<hash of recipe>``, written to a temporary directory and renamed into
place, so an interrupted build never leaves a half cache.

``ictrl tiny-model OUTPUT_DIR`` (:func:`export_tiny_model`) copies it to a directory any command takes as
``--model`` / ``model_name_or_path``, with a plain-prompt chat template (``ictrl.models.PLAIN_CHAT_TEMPLATE``: the
user's text, no role markers, as the model was trained) and ``train.jsonl`` of tiny-task problems for
``dataset_name: jsonl:OUTPUT_DIR/train.jsonl`` (``configs/tiny/ict.yaml``). ``--task`` warm-starts on another task
module (``ictrl.experiments.tasks.registry``), e.g. the studies' ``studies.tasks.paths`` from a clone's root.

The warm start stops on a dev-set score, not a step count, because these models
learn in sudden jumps (dev pass@1 went from 18% to 36% within 50 s while the recipe was tuned): it stops once
sampled pass@1 on the dev split reaches ``recipe.target_dev`` (or after ``recipe.patience`` evaluations
without improvement, or at ``recipe.max_steps``), and keeps the best evaluated weights.

Determinism: for a fixed recipe and thread count the build is reproducible (seeded
init, seeded data order and noise, seeded dev sampling). Floating-point reductions
in CPU kernels can round differently with another ``torch.get_num_threads()``, and a
jump-prone run may then stop at a different evaluation: ``TinyRecipe.threads`` fixes the
count for the build (and is part of the cache key when set).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import random
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any

import torch

from ictrl.data import Problem
from ictrl.validation import AT_LEAST_ONE, POSITIVE, UNIT, check_fields
from ictrl.errors import UserError
from ictrl.experiments.tasks.registry import CHOICES, get_task, task_recipe
from ictrl.files import atomic_write_text
from ictrl.models import PLAIN_CHAT_TEMPLATE, QWEN25_SHAPES, build_byte_tokenizer, build_real_shape, build_tiny_qwen2

# Bump when the training code changes in a way that changes the weights for a recipe.
RECIPE_VERSION = 1
# The thread count of the bases `ictrl demo` and `ictrl tiny-model` build (TinyRecipe.threads): the same weights on
# every machine, and one cached base for both commands.
REPRODUCIBLE_THREADS = 1


@dataclass(frozen=True)
class TinyRecipe:
    """Everything that determines the cached base model."""

    seed: int = field(default=0, metadata={"help": "seed for init, data order, noise and dev sampling"})
    task: str = field(default="tinyarith", metadata={"help": "tinyarith or a task module path "
                                                             "(ictrl.experiments.tasks.registry), recorded as given: "
                                                             "it names the task again when the base is reused"})
    hidden_size: Annotated[int, AT_LEAST_ONE] = field(default=64, metadata={"help": "model width"})
    num_hidden_layers: Annotated[int, AT_LEAST_ONE] = field(default=2, metadata={"help": "transformer blocks"})
    num_attention_heads: Annotated[int, AT_LEAST_ONE] = field(default=4, metadata={"help": "attention heads"})
    difficulty: tuple[int, ...] = field(default=(2,), metadata={"help": "difficulty levels mixed in the task "
                                                                          "(tinyarith: operators)"})
    order_error: Annotated[float, UNIT] = field(
        default=0.5, metadata={"help": "share of demonstrations with a choice error (tinyarith: left to right)"})
    digit_error: Annotated[float, UNIT] = field(
        default=0.5, metadata={"help": "share of demonstrations with one corrupted digit"})
    train_problems: Annotated[int, AT_LEAST_ONE] = field(
        default=2000, metadata={"help": "size of the supervised problem pool"})
    batch_size: Annotated[int, AT_LEAST_ONE] = field(default=32, metadata={"help": "sequences per supervised step"})
    lr: Annotated[float, POSITIVE] = field(
        default=3e-3, metadata={"help": "AdamW learning rate (constant after warm-up)"})
    max_steps: Annotated[int, AT_LEAST_ONE] = field(default=2500, metadata={"help": "hard cap on supervised steps"})
    eval_every: Annotated[int, AT_LEAST_ONE] = field(default=100, metadata={"help": "steps between dev evaluations"})
    dev_problems: Annotated[int, AT_LEAST_ONE] = field(default=64, metadata={"help": "dev problems per evaluation"})
    dev_samples: Annotated[int, AT_LEAST_ONE] = field(default=2, metadata={"help": "samples per dev problem"})
    target_dev: Annotated[float, UNIT] = field(
        default=0.25, metadata={"help": "stop once dev sampled pass@1 reaches this"})
    patience: Annotated[int, AT_LEAST_ONE] = field(
        default=6, metadata={"help": "stop after this many evaluations without improvement"})
    threads: Annotated[int | None, AT_LEAST_ONE] = field(
        default=None, metadata={"help": "torch threads for the build (None: the process's own); a fixed count makes "
                                        "the weights independent of the machine's core count"})

    def __post_init__(self) -> None:
        object.__setattr__(self, "difficulty", tuple(self.difficulty))
        check_fields(self)  # each field's type and the range in its annotation
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size={self.hidden_size} must divide by "
                             f"num_attention_heads={self.num_attention_heads}")
        get_task(self.task)

    def key(self) -> str:
        fields = asdict(self)
        if fields["task"] == "tinyarith":
            del fields["task"]  # keys (cached bases) from before the task field stay valid
        if fields["threads"] is None:
            del fields["threads"]  # the same: a build at the process's thread count keeps its old key
        blob = json.dumps({"version": RECIPE_VERSION, **fields}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def cache_root() -> Path:
    return Path(os.environ.get("ICTRL_CACHE_DIR", Path.home() / ".cache" / "ictrl"))


def task_max_new_tokens(difficulty: tuple[int, ...], task: str = "tinyarith") -> int:
    """The completion budget of ``task`` at ``difficulty`` (the task module's ``max_new_tokens``)."""
    return int(get_task(task).max_new_tokens(difficulty))


@torch.no_grad()
def sample_correct(
    model: Any, tokenizer: Any, problems: list[Problem], n: int, temperature: float = 1.0,
    seed: int = 0, batch_prompts: int = 64, task: str = "tinyarith",
) -> list[int]:
    """Correct-sample counts per problem of ``task`` from ``n`` samples each (pure sampling: no top-k / top-p).

    Sampling runs under a forked RNG seeded with ``seed``, so callers' random streams are untouched.
    """
    was_training = model.training
    model.eval()
    tokenizer.padding_side = "left"
    difficulty = tuple({p.meta.get("difficulty", 3) for p in problems}) or (3,)
    counts: list[int] = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for start in range(0, len(problems), batch_prompts):
            chunk = problems[start : start + batch_prompts]
            enc = tokenizer([p.question for p in chunk], return_tensors="pt", padding=True)
            out = model.generate(
                **enc, do_sample=True, temperature=temperature, top_k=0, top_p=1.0, num_return_sequences=n,
                max_new_tokens=task_max_new_tokens(difficulty, task), pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )
            texts = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
            for i, p in enumerate(chunk):
                counts.append(int(sum(get_task(task).grade(t, p.gold) for t in texts[i * n : (i + 1) * n])))
    model.train(was_training)
    return counts


def _encode_batch(
    tokenizer: Any, prompts: list[str], completions: list[str]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids [B, L], attention mask [B, L], and labels [B, L] (-100 outside completion + EOS)."""
    p_ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    c_ids = tokenizer(completions, add_special_tokens=False)["input_ids"]
    seqs = [p + c + [tokenizer.eos_token_id] for p, c in zip(p_ids, c_ids)]
    length = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), length), tokenizer.pad_token_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for i, (p, s) in enumerate(zip(p_ids, seqs)):
        ids[i, : len(s)] = torch.tensor(s)
        attn[i, : len(s)] = 1
        labels[i, len(p) : len(s)] = ids[i, len(p) : len(s)]
    return ids, attn, labels


def warm_start(recipe: TinyRecipe, log: Any = print) -> tuple[Any, Any, dict[str, Any]]:
    """Train a fresh tiny Qwen2 on noisy demonstrations; returns (model, tokenizer, info) with the best dev weights."""
    tokenizer = build_byte_tokenizer(chat_template=None)
    model = build_tiny_qwen2(
        tokenizer, hidden_size=recipe.hidden_size, num_hidden_layers=recipe.num_hidden_layers,
        num_attention_heads=recipe.num_attention_heads, num_key_value_heads=max(1, recipe.num_attention_heads // 2),
        max_position_embeddings=256, seed=recipe.seed,
    )
    task = get_task(recipe.task)
    train = task.generate_problems(recipe.train_problems, "train", recipe.difficulty, seed=recipe.seed)
    dev = task.generate_problems(recipe.dev_problems, "dev", recipe.difficulty, seed=recipe.seed)
    rng = random.Random(f"warm-start:{recipe.seed}")
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=0.0, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 50))
    best = (-1.0, 0, copy.deepcopy(model.state_dict()))
    history: list[dict[str, float]] = []
    stale, start = 0, time.perf_counter()
    model.train()
    for step in range(1, recipe.max_steps + 1):
        batch = [train[rng.randrange(len(train))] for _ in range(recipe.batch_size)]
        demos = [task.demonstration(p, rng, recipe.order_error, recipe.digit_error) for p in batch]
        ids, attn, labels = _encode_batch(tokenizer, [p.question for p in batch], demos)
        loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % recipe.eval_every and step != recipe.max_steps:
            continue
        counts = sample_correct(model, tokenizer, dev, recipe.dev_samples, seed=recipe.seed, task=recipe.task)
        score = sum(counts) / (len(counts) * recipe.dev_samples)
        history.append({"step": step, "loss": loss.item(), "dev_pass1": score, "seconds": time.perf_counter() - start})
        log(f"warm start step {step}: loss {loss.item():.3f}, dev sampled pass@1 {score:.3f}")
        if score > best[0]:
            best, stale = (score, step, copy.deepcopy(model.state_dict())), 0
        else:
            stale += 1
        if score >= recipe.target_dev or stale >= recipe.patience:
            break
    model.load_state_dict(best[2])
    model.eval()
    info = {"best_step": best[1], "best_dev_pass1": best[0], "history": history, "recipe": asdict(recipe),
            "recipe_key": recipe.key(), "seconds": time.perf_counter() - start}
    return model, tokenizer, info


def build_tiny_base(recipe: TinyRecipe | None = None, cache_dir: str | os.PathLike[str] | None = None,
                    log: Any = print) -> Path:
    """Path of the cached warm-started checkpoint for ``recipe``, building it on a miss."""
    recipe = recipe or TinyRecipe()
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    final = root / f"tiny-base-{recipe.key()}"
    if (final / "warm_start.json").exists():
        return final
    root.mkdir(parents=True, exist_ok=True)
    log(f"building tiny base model (recipe {recipe.key()}) into {final}")
    threads = torch.get_num_threads()
    try:
        if recipe.threads is not None:
            torch.set_num_threads(recipe.threads)
        model, tokenizer, info = warm_start(recipe, log=log)
    finally:
        torch.set_num_threads(threads)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=root))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        # Written last: its presence marks a complete checkpoint.
        (tmp / "warm_start.json").write_text(json.dumps(info, indent=2))
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / "warm_start.json").exists():  # not a concurrent builder that won the race
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def load_tiny_base(path: str | os.PathLike[str]) -> tuple[Any, Any]:
    """Reload a checkpoint with the Auto classes (fp32, CPU, left padding for generation)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.eval()
    return model, tokenizer


def export_tiny_model(output_dir: str | os.PathLike[str], recipe: TinyRecipe | None = None, untrained: bool = False,
                      problems: int = 256, cache_dir: str | os.PathLike[str] | None = None, log: Any = print,
                      shape: str | None = None, layers: int | None = None) -> Path:
    """Write the embedded tiny model (model, tokenizer with a plain-prompt chat template) and ``train.jsonl``
    (``problems`` train-split tiny-task rows: ``id``, ``question``, ``answer``) to ``output_dir``.

    ``untrained``: a randomly initialised model of the recipe's shape (instant; for plumbing checks) instead of
    the warm-started base (built once and cached, minutes on CPU). ``shape`` (with ``untrained``): a random
    Qwen2.5 architecture instead (``ictrl.models.QWEN25_SHAPES``), ``layers`` blocks deep if given, with the
    byte tokenizer padded to its vocabulary. Returns ``output_dir``.
    """
    recipe = recipe or TinyRecipe()
    out = Path(output_dir)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out}: directory is not empty; choose a new OUTPUT_DIR")
    if shape is not None:
        if not untrained:
            raise UserError("--shape builds random weights only (no download); add --untrained")
        model, tokenizer = build_real_shape(shape, num_layers=layers, seed=recipe.seed)
    elif layers is not None:
        raise UserError("--layers sets the depth of a --shape model; add --shape")
    elif untrained:
        tokenizer = build_byte_tokenizer(chat_template=None)
        model = build_tiny_qwen2(tokenizer, hidden_size=recipe.hidden_size, num_hidden_layers=recipe.num_hidden_layers,
                                 num_attention_heads=recipe.num_attention_heads,
                                 num_key_value_heads=max(1, recipe.num_attention_heads // 2),
                                 max_position_embeddings=256, seed=recipe.seed)
    else:
        model, tokenizer = load_tiny_base(build_tiny_base(recipe, cache_dir=cache_dir, log=log))
    tokenizer.chat_template = PLAIN_CHAT_TEMPLATE
    model.generation_config.max_new_tokens = task_max_new_tokens(recipe.difficulty, recipe.task)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    rows = get_task(recipe.task).generate_problems(problems, "train", recipe.difficulty, seed=recipe.seed)
    atomic_write_text(out / "train.jsonl", "".join(
        json.dumps({"id": p.id, "question": p.question, "answer": p.gold}) + "\n" for p in rows))
    return out


DEFAULT_OUTPUT = "runs/tiny-model"  # configs/tiny/ict.yaml's model_name_or_path


def train_source(out: str | os.PathLike[str]) -> str:
    """The ``dataset_name`` for ``out/train.jsonl``: the question alone as the prompt (no boxed-answer
    instruction), as the model saw it in its warm start."""
    return f"jsonl:{Path(out) / 'train.jsonl'}:prompt_template={{question}}"


def add_arguments(parser: Any) -> None:
    parser.add_argument("output_dir", nargs="?", default=None,
                        help=f"new directory for the model, its tokenizer and train.jsonl (default: {DEFAULT_OUTPUT})")
    parser.add_argument("--output-dir", "--output_dir", dest="output_flag", default=None, metavar="OUTPUT_DIR",
                        help="the same as the positional OUTPUT_DIR")
    parser.add_argument("--untrained", action="store_true",
                        help="random weights of the same shape (instant) instead of the warm-started base")
    parser.add_argument("--shape", choices=sorted(QWEN25_SHAPES), default=None,
                        help="with --untrained: a random model of this Qwen2.5 architecture (real width and "
                             "vocabulary) instead of the tiny one")
    parser.add_argument("--layers", type=int, default=None,
                        help="with --shape: this many transformer blocks (same width; default: the published depth)")
    parser.add_argument("--task", default="tinyarith",
                        help=f"the task whose warm-started base is exported, with its train.jsonl rows (default: "
                             f"%(default)s, the demo's): {CHOICES}")
    parser.add_argument("--problems", type=int, default=256, help="the task's rows written to train.jsonl")
    parser.add_argument("--cache-dir", default=None, help="where the warm-started base is cached "
                                                         "(default $ICTRL_CACHE_DIR or ~/.cache/ictrl)")


def run(args: Any) -> int:
    import sys

    for flag, value in (("--problems", args.problems), ("--layers", args.layers)):
        if value is not None and value < 1:
            print(f"ictrl tiny-model: error: {flag} must be at least 1, got {value}", file=sys.stderr)
            return 2
    if args.output_dir and args.output_flag and args.output_dir != args.output_flag:
        print(f"ictrl tiny-model: error: two output directories: {args.output_dir} and --output-dir "
              f"{args.output_flag}", file=sys.stderr)
        return 2
    args.output_dir = args.output_dir or args.output_flag or DEFAULT_OUTPUT
    from ictrl.files import check_output_dir, reported_write

    try:
        recipe = TinyRecipe(threads=REPRODUCIBLE_THREADS, **task_recipe(args.task, "--task"))
        check_output_dir(args.output_dir, "OUTPUT_DIR")  # a folder it cannot write: before minutes of building
        with reported_write(args.output_dir, "remove the folder and run the command again"):
            out = export_tiny_model(args.output_dir, recipe, untrained=args.untrained, problems=args.problems,
                                    cache_dir=args.cache_dir, shape=args.shape, layers=args.layers)
    except (FileExistsError, UserError) as exc:
        print(f"ictrl tiny-model: error: {exc}", file=sys.stderr)
        return 2
    import shlex

    if args.task != "tinyarith":  # configs/tiny/ict.yaml grades the arithmetic task's boxed answers
        print(f"wrote the {args.task} model and {out / 'train.jsonl'} to {out}")
        return 0
    where = "" if Path(out) == Path(DEFAULT_OUTPUT) else (
        f" --model_name_or_path={shlex.quote(str(out))} {shlex.quote(f'--dataset_name={train_source(out)}')}")
    print(f"wrote the tiny model and {out / 'train.jsonl'} to {out}; train it with "
          f"`ictrl train configs/tiny/ict.yaml{where}`")
    return 0
