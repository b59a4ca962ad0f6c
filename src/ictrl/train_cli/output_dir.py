"""``ictrl train``'s ``output_dir``: the value's one check (:func:`checked_output_dir`), what a run writes there and
may not replace, the checkpoints there against ``--resume`` (:func:`existing_checkpoints`) and, under the run's lock,
the checkpoint it resumes from (:func:`prepare_output_dir`).

The check runs once, before anything loads, where the command's other checks run
(``ictrl.train_cli.trainer_inputs``): the folder is writable, none of the run's inputs is among what it writes
(the model directory, a data file, the config file, a reward module), and it holds no file the run would replace
that ictrl did not write. The checkpoints are compared with ``--resume`` under the run's lock (and by the parent of
a launch): without a checkpoint to resume, ``output_dir`` holds no earlier run unless ``--overwrite``.
"""

from __future__ import annotations

import itertools
import logging
import os
from pathlib import Path
from typing import Any

from ictrl.checkpoints import (CHECKPOINT_RE, LAST_FILES, MANIFEST, OVERWRITE_FLAG, RUN_FILES, STAGING_PREFIX,
                               clear_staging, complete_checkpoints, foreign_checkpoints)
from ictrl.engine.resumable import resume_point, verified_checkpoints
from ictrl.errors import ConfigError, quote, shorten
from ictrl.files import LOCK_NAME, OWNED_FILE, check_output_dir
from ictrl.train_cli.exact_resume import INEXACT_FLAG
from ictrl.train_cli.process_group import answered_once
from ictrl.train_cli.run_config import RunConfig
from ictrl.train_cli.run_inputs import trl_dataset

log = logging.getLogger("ictrl.train")


def checked_output_dir(cfg: RunConfig, reward_funcs: list[Any], source: str, label: str) -> Path:
    """``output_dir`` checked, as the absolute path the run writes to (every path TRL and the Trainer build starts
    there: a reward or callback that changes the working directory moves nothing out of the locked folder).
    ``label`` leads each error (the config file, or the flag that set the key); what the run reads is
    :func:`inputs_read` (the config file ``source``, the model, the data, the modules of ``reward_funcs``).

    Not the model directory, and nothing the run reads among what it writes (:func:`written_by_run`); a directory
    that is, or can be made, writable, with no file there that the run would write over and ictrl did not write
    (``files.check_output_dir``) and no checkpoint ictrl did not write; one warning line when ``..`` takes it out
    of the working directory."""
    path = cfg.output_dir
    out = Path(path).expanduser()
    _check_not_an_input(path, inputs_read(cfg, reward_funcs, source), label)
    check_output_dir(path, f"{label}: output_dir", run_writes(out), earlier_run,
                     f" ({OVERWRITE_FLAG} replaces only files ictrl wrote)")
    _check_own_checkpoints(out, label)
    if ".." in out.parts:
        resolved, cwd = out.resolve(), Path.cwd().resolve()
        if not resolved.is_relative_to(cwd):
            log.warning("output_dir %s leaves the working directory %s: writing to %s", path, cwd, resolved)
    return Path(os.path.abspath(out))


def inputs_read(cfg: RunConfig, reward_funcs: list[Any], source: str = "<config>") -> list[tuple[str, Path]]:
    """(what, path) of every local file or directory the run reads that output_dir could alias: the model
    directory, the config file (``source``), each ``jsonl:`` data file (a dataset directory's files) and the
    file of each reward function's module."""
    import inspect

    from ictrl import data

    found: list[tuple[str, Path]] = []
    model = Path(cfg.model.model_name_or_path).expanduser()
    if model.is_dir():
        found.append(("model_name_or_path", model))
    if Path(source).is_file():
        found.append(("the config file", Path(source)))
    if trl_dataset(cfg) and Path(str(cfg.script.dataset_name)).is_file():  # a data file read by datasets' builders
        found.append(("the data file of dataset_name", Path(str(cfg.script.dataset_name))))
    elif trl_dataset(cfg):
        files = list(itertools.islice(Path(str(cfg.script.dataset_name)).rglob("*"), 1000))
        found += [(f"a file of dataset_name {cfg.script.dataset_name}", p) for p in files if p.is_file()]
    for spec in [] if trl_dataset(cfg) else cfg.script.sources():
        path = data.parse_spec(spec)[1]
        if path is not None:
            found.append((f"the data file of dataset_name {quote(spec, 120)}", Path(path)))
    for fn in reward_funcs:
        module = inspect.getmodule(fn if inspect.isroutine(fn) else type(fn))
        file = getattr(module, "__file__", None)
        if file:
            found.append((f"the module of reward {getattr(fn, '__name__', type(fn).__name__)!r}", Path(file)))
    return found


def named_checkpoint(cfg: RunConfig, resume: bool | str, source: str = "<config>") -> tuple[bool | str, Path | None]:
    """``resume_from_checkpoint`` (TRL's key, as ``trl grpo`` passes it to ``Trainer.train``) beside ictrl's
    ``--resume`` (``resume``): the ``resume`` the run takes and the checkpoint the key names (None: none named).
    ``true`` is TRL's "the last checkpoint in output_dir", which is ``--resume``; a path must be a checkpoint
    folder with a readable trainer state (its files are verified with the resume); a path outside output_dir
    beside ``--resume`` is refused in one line, since each names a different start."""
    from ictrl.checkpoints import trainer_state

    value = cfg.trainer.get("resume_from_checkpoint")
    text = str(value).strip().lower() if value is not None else ""
    if text in ("", "false", "none", "null"):
        return resume, None
    if value is True or text == "true":
        from ictrl.checkpoints import complete_checkpoints

        if not resume and not complete_checkpoints(cfg.output_dir):  # TRL raises here too; --resume=auto would not
            raise ConfigError(f"{source}: resume_from_checkpoint: true resumes the last checkpoint in output_dir "
                              f"{shorten(str(cfg.output_dir), 200)}, which holds none; check the output_dir, or "
                              "name a checkpoint folder")
        return (resume or True), None
    named, out = Path(str(value)).expanduser(), Path(cfg.output_dir).expanduser()
    key = f"{source}: resume_from_checkpoint: {shorten(str(value), 200)}"
    if not named.is_dir():
        raise ConfigError(f"{key}: {'not a folder' if named.exists() else 'does not exist'}; name a checkpoint "
                          "folder (OUTPUT_DIR/checkpoint-N) or true for the last one in output_dir")
    try:
        trainer_state(named)
    except ValueError:
        raise ConfigError(f"{key}: not a complete checkpoint (no readable trainer_state.json); name a checkpoint "
                          "folder (OUTPUT_DIR/checkpoint-N)") from None
    if resume and named.resolve().parent != out.resolve():
        raise ConfigError(f"{key}: --resume continues the last checkpoint in output_dir {out}, and "
                          "resume_from_checkpoint names a checkpoint elsewhere; give one of them")
    return resume, named


def existing_checkpoints(cfg: RunConfig, resume: bool | str, source: str = "<config>") -> list[Path]:
    """The complete checkpoints in ``output_dir``, oldest first; without ``resume`` there must be none (a fresh
    run does not start over another run's checkpoints), with ``resume=True`` there must be one (a misspelt
    output_dir does not train from step 0); ``resume="auto"`` takes either. With none, ``output_dir`` must hold
    no earlier run's model or record either (:func:`previous_run`; ``--overwrite`` allows it).
    ``resume_from_checkpoint`` counts as ``resume`` (:func:`named_checkpoint`: ``true``, or a checkpoint
    in output_dir)."""
    return _existing_checkpoints(cfg, *named_checkpoint(cfg, resume, source), source)


def _existing_checkpoints(cfg: RunConfig, resume: bool | str, named: Path | None, source: str) -> list[Path]:
    out = Path(cfg.output_dir)
    checkpoints = complete_checkpoints(out)
    if checkpoints and not resume and (named is None or named.resolve().parent != out.resolve()):
        raise ConfigError(f"{source}: output_dir: {out} already holds {checkpoints[-1].name}; pass --resume "
                          "to continue it or choose another output_dir")
    if not checkpoints and resume is True:
        where = "holds no checkpoint" if out.is_dir() else "does not exist"
        raise ConfigError(f"{source}: --resume: output_dir {out} {where}; check the output_dir, or pass "
                          "--resume=auto to start from step 0 when there is nothing to resume")
    if not checkpoints:
        _check_no_previous_run(out, resume, cfg.modes, source)
    return checkpoints


def prepare_output_dir(cfg: RunConfig, resume: bool | str, source: str = "<config>", args: Any = None) -> Path | None:
    """The checkpoint to resume from (None: start fresh): the newest whose files verify, when it ends the run
    (the final model of its step is in ``output_dir``), else the newest that resumes exactly
    (``resumable.resume_point``; without ``args``, the newest verified). Refuses to start over existing
    checkpoints."""
    out = Path(getattr(args, "output_dir", None) or cfg.output_dir)
    resume, named = named_checkpoint(cfg, resume, source)  # TRL's resume_from_checkpoint
    checkpoints = _existing_checkpoints(cfg, resume, named, source)
    clear_staging(out)
    if named is not None:  # that checkpoint, checked as --resume checks its own; a lost optimizer, scheduler or RNG
        verified = verified_checkpoints([named], lost_state_ok=True)  # state is check_exact's line, after this
        if not verified:
            raise ConfigError(f"{source}: resume_from_checkpoint: {named} is not a complete checkpoint (named "
                              "above); name another")
    else:
        if not checkpoints and OVERWRITE_FLAG in cfg.modes:
            forget_previous_run(out)
        if not resume or not checkpoints:
            return None
        # every file of every checkpoint is read to verify it: once per copy of output_dir, not once per process
        inexact = INEXACT_FLAG in cfg.modes  # else a checkpoint with lost state is skipped for an older exact one
        verified = answered_once(lambda: verified_checkpoints(checkpoints, inexact), f"{source}: output_dir",
                                 per_node=bool(getattr(args, "save_on_each_node", False)))
    if args is None:
        return named if named is not None else verified[0] if verified else None
    # a finished run ends at its newest checkpoint, wherever it falls; a named checkpoint must resume exactly
    return resume_point(verified, args, source, finished_ok=named is None)



# Names at the top of output_dir a run writes (its record, the final model's save, the lock), besides the
# checkpoint-N and staging folders it writes, rotates and clears.
_RUN_WRITES = frozenset({*RUN_FILES, *LAST_FILES, LOCK_NAME, "generation_config.json", "special_tokens_map.json",
                         "vocab.json", "merges.txt", "added_tokens.json", "training_args.bin", "tokenizer.json",
                         "tokenizer_config.json", "model.safetensors.index.json"})
_SAVE_SUFFIXES = (".safetensors", ".bin", ".jinja", ".model", ".pt", ".pth")


def written_by_run(path: Path, out: Path) -> bool:
    """Whether a run with ``output_dir`` ``out`` writes, replaces or removes ``path`` (both resolved): a file at
    the top of ``out`` with a name the run's record or final model save uses, or anything under one of its
    ``checkpoint-N`` (rotated by ``save_total_limit``) or staging folders (cleared at start)."""
    if not path.is_relative_to(out) or path == out:
        return False
    top = path.relative_to(out).parts[0]
    if CHECKPOINT_RE.match(top) or top.startswith(STAGING_PREFIX):
        return True
    if len(path.relative_to(out).parts) > 1:
        return False
    return top in _RUN_WRITES or top.startswith("adapter_") or top.endswith(_SAVE_SUFFIXES)


def run_writes(out: Path) -> list[str]:
    """The entries at the top of ``out`` that a run writes over (:func:`written_by_run`; a LoRA run's final
    ``adapter/``), but for its
    ``checkpoint-N`` and staging folders, which :func:`existing_checkpoints` and
    ``checkpoints.clear_staging`` answer for."""
    if not out.is_dir():
        return []
    return [p.name for p in sorted(out.iterdir()) if p.name == "adapter" or written_by_run(p, out)
            and not CHECKPOINT_RE.match(p.name) and not p.name.startswith(STAGING_PREFIX)]


def earlier_run(out: Path) -> bool:
    """Whether ``out`` holds the ``run.json`` of an ``ictrl train`` run written before ictrl listed its files."""
    from ictrl.files import holds_record

    return holds_record(out / "run.json", ("method_from", "seed"))


def _check_own_checkpoints(out: Path, label: str) -> None:
    """Refuse an ``output_dir`` holding a ``checkpoint-N`` folder ictrl did not write
    (``checkpoints.foreign_checkpoints``), which a resume would start from and rotation delete, as
    ``files.check_output_dir`` refuses a file the run would write over (a project's README.md or config.yaml under
    ``--output-dir .``). ``--overwrite`` replaces only ictrl's own files, so it lifts neither."""
    foreign = foreign_checkpoints(out, earlier_run)
    if foreign:
        more = f" (and {len(foreign) - 1} more)" if len(foreign) > 1 else ""
        raise ConfigError(f"{label}: output_dir: {foreign[-1]}{more} was not written by ictrl (not in its "
                          f"{OWNED_FILE}): a run would resume from it or delete it in rotation (save_total_limit); "
                          "move it away or choose another output directory")


def _check_not_an_input(out_dir: str, inputs: list[tuple[str, Path]], source: str) -> None:
    """Refuse an ``output_dir`` whose writes would replace a file the run reads: the model directory itself (its
    weights, config and tokenizer; a folder inside it is fine), or a data file, the config file or a local reward
    module (``inputs``: (what, path) pairs) that :func:`written_by_run` says the run writes. A config file that is
    the ``config.yaml`` an earlier run wrote beside its ``run.json`` (``ictrl train OUT/config.yaml --resume``) is
    the run's own record, written back as it was read."""
    out = Path(out_dir).expanduser().resolve()
    for what, path in inputs:
        path = path.expanduser().resolve()
        if what == "model_name_or_path" and path == out:
            raise ConfigError(f"{source}: output_dir: {out_dir} is the model directory (model_name_or_path): the run "
                              "would replace its weights, config and tokenizer; choose another output_dir (a folder "
                              "inside the model directory is fine)")
        if what == "the config file" and path == out / "config.yaml" and (out / "run.json").is_file():
            continue
        if written_by_run(path, out):
            raise ConfigError(f"{source}: output_dir: {out_dir}: the run writes {path}, which is {what}; choose "
                              "another output_dir or move the file out of it")


def previous_run(out: Path, finished_only: bool) -> list[str]:
    """The files in ``out`` that an earlier run left: its model (weights, ``config.json``, ``manifest.json``),
    and with ``finished_only`` False its record (``run.json``, ``metrics.jsonl``) too."""
    if not out.is_dir():
        return []
    record = () if finished_only else ("run.json", "metrics.jsonl")
    found = []
    for path in sorted(out.iterdir()):
        name = path.name
        if path.is_file() and (name in (*record, "config.json", "manifest.json", "adapter_config.json")
                               or name.endswith((".safetensors", ".bin")) and name != "training_args.bin"):
            found.append(name)
    return found


def _check_no_previous_run(out: Path, resume: bool | str, modes: frozenset[str] | set[str], source: str) -> None:
    """With no checkpoint to resume, ``out`` must hold no earlier run (:func:`previous_run`: its record or its
    model; under ``--resume=auto``, which starts over when nothing is left to resume, its model), unless
    :data:`OVERWRITE_FLAG`: TRL's ``Trainer.save_model`` would replace it without a word."""
    if OVERWRITE_FLAG in modes:
        return
    found = previous_run(out, finished_only=resume == "auto")
    if found:
        shown = ", ".join(found[:4]) + (f" and {len(found) - 4} more" if len(found) > 4 else "")
        raise ConfigError(f"{source}: output_dir: {out} holds an earlier run ({shown}) and no checkpoint to resume; "
                          f"choose another output_dir, or pass {OVERWRITE_FLAG} to replace it")


def forget_previous_run(out: Path) -> None:
    """Under :data:`OVERWRITE_FLAG`, remove the marks of the earlier run's final model (``manifest.json``,
    ``trainer_state.json``) before this run writes: a later ``--resume`` then never takes that model for this
    run's (``checkpoints.CheckpointState.finished``). The earlier files themselves are replaced as this run writes
    its own."""
    for name in (MANIFEST, "trainer_state.json"):
        (out / name).unlink(missing_ok=True)
