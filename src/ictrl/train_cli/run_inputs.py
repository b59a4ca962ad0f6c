"""What a run reads besides its trainer arguments, checked before the model loads: the reward functions
(``build_rewards``: ictrl's graders, trl grpo's reward names, ``module:function``) and the training data
(``check_sources``, ``load_train_dataset``, ``drop_long_prompts``), with ``blame``, which names the flag or the file
an error comes from. ``ictrl.train_cli.run`` runs them in order."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Callable

from ictrl.train_cli.run_config import ConfigError, RunConfig
from ictrl.errors import UserError, did_you_mean, quote, shorten

log = logging.getLogger("ictrl.train")


def blame(message: str, source: str, flags: dict[str, Any] | None) -> str:
    """Where a trainer-config error comes from: the command-line flag whose key the message names (``override
    --learning_rate=-1``), else ``source`` (the config file)."""
    import re

    for key, value in (flags or {}).items():
        if re.search(rf"(?<![\w.]){re.escape(key)}(?!\w)", message):
            return f"override --{key}={shorten(str(value), 100)}"
    return source


# --- rewards ---------------------------------------------------------------------------------------------------


def reward_functions(cfg: RunConfig, args: Any, source: str = "<config>",
                     flags: dict[str, Any] | None = None) -> list[Any]:
    """The run's reward functions as the trainer gets them: one ``reward_weights`` entry per configured reward
    (:func:`check_reward_weights`, before any is built), each built (:func:`build_rewards`), then DAPO's overlong
    penalty (:func:`add_overlong_penalty`)."""
    configured = len(cfg.script.reward_names()) + bool(cfg.script.reward_model_name_or_path)
    check_reward_weights(cfg, args, configured, source, flags)
    funcs = build_rewards(cfg, blame("reward_funcs", source, flags))
    add_overlong_penalty(cfg, args, funcs, source)
    return funcs


def build_rewards(cfg: RunConfig, source: str = "<config>", gold_column: str = "answer") -> list[Any]:
    """TRL reward functions for ``reward_model_name_or_path`` (a model id or path, as TRL takes it) and each name of
    ``reward_funcs`` (default ``verifiable``): ``ictrl.rewards.trl_adapters.reward_function``, each error one line
    naming the entry."""
    from ictrl.rewards.trl_adapters import reward_function

    out: list[Any] = [cfg.script.reward_model_name_or_path] if cfg.script.reward_model_name_or_path else []
    for i, name in enumerate(cfg.script.reward_names()):
        try:
            out.append(reward_function(name, gold_column))
        except UserError as exc:
            raise ConfigError(f"{source}: reward_funcs[{i}]: {exc}") from None
    return out


def check_reward_weights(cfg: RunConfig, args: Any, rewards: int, source: str = "<config>",
                         flags: dict[str, Any] | None = None) -> None:
    """One ``reward_weights`` entry per reward function (``reward_funcs`` and ``reward_model_name_or_path``, the
    overlong penalty not counted: its weight is ``overlong_penalty_factor``); TRL's trainer would refuse the
    count only once the model has loaded."""
    weights = args.reward_weights
    if weights is not None and len(weights) != rewards:
        penalty = "; the overlong penalty's weight is overlong_penalty_factor" \
            if cfg.script.overlong_buffer_length is not None else ""
        raise ConfigError(f"{blame('reward_weights', source, flags)}: reward_weights: {len(weights)} weights for "
                          f"{rewards} rewards (reward_funcs){penalty}")


def add_overlong_penalty(cfg: RunConfig, args: Any, reward_funcs: list[Callable[..., Any]],
                         source: str = "<config>") -> None:
    """Append DAPO's soft overlong punishment (``trl.rewards.get_soft_overlong_punishment`` over
    ``max_completion_length`` with ``overlong_buffer_length``) after the verifier rewards, with weight
    ``overlong_penalty_factor`` appended to ``args.reward_weights`` (all 1 before it when unset; one per reward
    function: ``ictrl.train_cli.trainer_inputs`` checks the count first)."""
    buffer = cfg.script.overlong_buffer_length
    if buffer is None:
        return
    if buffer >= args.max_completion_length:  # DAPO's formula still holds; worth a word (a smoke-test override)
        log.warning("%s: overlong_buffer_length=%d >= max_completion_length=%d: every completion gets an "
                    "overlong penalty", source, buffer, args.max_completion_length)
    from trl.rewards import get_soft_overlong_punishment

    weights = list(args.reward_weights) if args.reward_weights is not None else [1.0] * len(reward_funcs)
    reward_funcs.append(get_soft_overlong_punishment(max_completion_len=args.max_completion_length,
                                                     soft_punish_cache=buffer))
    args.reward_weights = [*weights, float(cfg.script.overlong_penalty_factor)]


def reward_label(fn: Callable[..., Any] | str) -> str:
    """The name TRL logs a reward under (``rewards/NAME/mean``); a reward model's is its path's last part."""
    return fn.rstrip("/").split("/")[-1] if isinstance(fn, str) else getattr(fn, "__name__", type(fn).__name__)


# --- data ------------------------------------------------------------------------------------------------------


def check_sources(cfg: RunConfig, config: str = "<config>", flags: dict[str, Any] | None = None) -> None:
    """Every data source must be a registry spec (``math_train:levels=3,4,5``) or ``jsonl:PATH`` to a file. Errors
    name the flag that set the key (``flags``), else ``config``."""
    from ictrl import data

    if not cfg.script.sources() and not cfg.script.datasets:
        raise ConfigError(f"{blame('dataset_name', config, flags)}: dataset_name: required: an ictrl.data name "
                          "(gsm8k_train, math_train), jsonl:PATH, a list of them or a mapping name: weight")
    script, directory = cfg.script, trl_dataset(cfg)
    for key, set_to in (("dataset_config", script.dataset_config), ("dataset_train_split", script.dataset_train_split)):
        if set_to not in (None, "train") and not directory:
            raise ConfigError(f"{blame(key, config, flags)}: {key}: applies to a dataset directory or hub id "
                              "(trl grpo's dataset_name); an ictrl.data source takes its options in the name "
                              "(NAME:hub_split=...)")
    train = [] if directory else script.sources()
    for key, names in (("dataset_name", train), ("eval_datasets", script.eval_datasets)):
        source = blame(key, config, flags)
        for name in names:
            try:
                _, path = data.parse_spec(name)
            except ValueError as exc:
                hint = did_you_mean(name.split(":", 1)[0], data.BENCHMARKS)
                raise ConfigError(f"{source}: {key}: {quote(name)}: {shorten(str(exc), 300)}{hint}"
                                  f"{_tried(name) if key == 'dataset_name' else ''}") from None
            if path is not None and not Path(path).is_file():
                raise ConfigError(f"{source}: {key}: {quote(name)}: file not found")


def _tried(name: str) -> str:
    """What a ``dataset_name`` that is none of its forms was tried as, after the ictrl.data names."""
    import re

    from ictrl.train_cli.trl_data import DATA_FILE_BUILDERS

    local = Path(name).expanduser()
    try:
        is_file = local.is_file()
    except (OSError, ValueError):  # a name longer than a path can be, or with a NUL byte
        is_file = False
    where = (f"a {local.suffix} file, which datasets has no builder for (it reads {', '.join(DATA_FILE_BUILDERS)})"
             if is_file else f"no file or folder at {shorten(str(Path.cwd() / local), 120)}")
    hub = "not owner/name" if re.fullmatch(HUB_ID, name) is None else "owner/name"
    return f"; tried as a local path ({where}) and as a hub id ({hub})"


# A hub dataset id as the hub spells one: owner/name (letters, digits, '-', '_', '.').
HUB_ID = r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*"
OFFLINE_ENV = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


def trl_dataset(cfg: RunConfig) -> bool:
    """Whether ``trl grpo``'s ``datasets.load_dataset`` reads ``dataset_name``: a dataset directory, or a hub id
    (``owner/name``) that is neither an ictrl.data name nor a local path (those come first)."""
    import re

    from ictrl.train_cli.trl_data import file_builder

    name = cfg.script.dataset_name
    if cfg.script.datasets:  # trl grpo's mixture, which it reads in place of dataset_name
        return True
    if not isinstance(name, str):
        return False
    return Path(name).is_dir() or file_builder(name) is not None or (
        re.fullmatch(HUB_ID, name) is not None and not Path(name).exists())


def _offline() -> str | None:
    """The environment variable that keeps ``datasets`` off the hub, as it reads it (1, true, yes, on)."""
    return next((f"{key}={os.environ[key]}" for key in OFFLINE_ENV
                 if os.environ.get(key, "").strip().upper() in ("1", "TRUE", "YES", "ON")), None)


def _load_trl_dataset(script: Any, seed: int) -> Any:
    """``trl grpo``'s call: ``load_dataset(dataset_name, name=dataset_config, streaming=dataset_streaming)``, then
    its ``dataset_train_split``; errors are one :class:`ictrl.errors.DataError` line naming the id (offline: the
    setting that kept it off the hub; a missing split: the splits there are)."""
    from datasets import load_dataset

    from ictrl.errors import DataError

    return _split(*_load_trl_splits(script, seed), "dataset_train_split", script.dataset_train_split)


def _load_trl_splits(script: Any, seed: int) -> tuple[Any, str]:
    """The ``DatasetDict`` of the data ``trl grpo`` reads (the ``datasets`` mixture, its test split drawn from
    ``seed``; a local data file, a folder or hub id), and its name for error lines."""
    from ictrl.train_cli.trl_data import file_builder, load_file, load_trl_mixture

    if script.datasets:
        return load_trl_mixture(script, seed), "the datasets mixture"
    if file_builder(script.dataset_name) is not None:
        return load_file(script.dataset_name, script), script.dataset_name
    return _load_named(script.dataset_name, script), script.dataset_name


def _split(loaded: Any, name: str, key: str, split: str) -> Any:
    from ictrl.errors import DataError

    if split not in loaded:
        raise DataError(f"{key}: {split!r}: {name} has no such split; its splits: "
                        f"{', '.join(map(str, loaded)) or 'none'}")
    return loaded[split]


def eval_rows(cfg: RunConfig, args: Any) -> Any:
    """``trl grpo``'s ``eval_dataset``: the ``dataset_test_split`` of the data it reads when ``eval_strategy`` is
    not ``no`` (``trainer_inputs.check_trainer_inputs`` refuses it for ictrl.data sources), else None."""
    if getattr(args.eval_strategy, "value", args.eval_strategy) == "no":
        return None
    return _split(*_load_trl_splits(cfg.script, cfg.seed), "dataset_test_split", cfg.script.dataset_test_split)


def _load_named(name: str, script: Any) -> Any:
    """``load_dataset(dataset_name, name=dataset_config, streaming=dataset_streaming)``, its errors one line naming
    the key at fault: ``dataset_config`` when the data set's configs are the trouble, else ``dataset_name``."""
    from datasets import load_dataset

    from ictrl.errors import DataError

    try:
        return load_dataset(name, name=script.dataset_config, streaming=script.dataset_streaming)
    except Exception as exc:  # datasets raises many types (ConnectionError, DatasetNotFoundError, ValueError, ...)
        offline = _offline() if not Path(name).is_dir() else None
        if offline:
            raise DataError(f"dataset_name: {name}: not in the local datasets cache, and {offline} keeps datasets "
                            "off the hub: unset it to download the data set, or name a local directory") from None
        if isinstance(exc, (ValueError, KeyError, FileNotFoundError, ConnectionError, OSError)) \
                or str(exc).startswith("Dataset scripts are no longer supported"):  # a hub repo's loading script
            text = str(exc)
            if "Config name is missing" in text or "BuilderConfig" in text:  # datasets' words for a config name
                raise DataError(f"dataset_config: {script.dataset_config!r} for {name}: {shorten(text, 300)}") from None
            raise DataError(f"dataset_name: {name}: {shorten(text, 300)}") from None
        raise


def load_train_dataset(cfg: RunConfig) -> Any:
    """The training ``datasets.Dataset`` from ``ictrl.data.to_trl_dataset`` (columns ``prompt`` as a chat turn,
    ``answer``, ``kind``, ``id``, ``benchmark``). Called before the model loads: a bad row, a byte that is not
    UTF-8 or an empty file is a :class:`ictrl.errors.DataError` naming the file and line at once."""
    from ictrl import data

    if trl_dataset(cfg):  # as trl grpo: load_dataset(dataset_name, name=dataset_config)[dataset_train_split]
        from ictrl.errors import DataError

        from ictrl.train_cli.trl_data import first_row, streamed

        script = cfg.script
        rows = _load_trl_dataset(script, cfg.seed)
        key = "datasets" if script.datasets else f"dataset_name: {script.dataset_name}"
        columns = rows.column_names if rows.column_names is not None else list(first_row(rows, key))
        if "prompt" not in columns:
            raise DataError(f"{key}: no 'prompt' column (TRL's GRPOTrainer reads it); columns: {columns}")
        if streamed(script):  # rows checked as they stream (trl_data.check_stream)
            return rows.take(script.dataset_limit) if script.dataset_limit else rows
        return rows.select(range(min(len(rows), script.dataset_limit))) if script.dataset_limit else rows
    train, names, limit = cfg.script.dataset_name, cfg.script.sources(), cfg.script.dataset_limit
    if len(names) == 1:
        return data.to_trl_dataset(names[0], limit=limit)
    weights = list(train.values()) if isinstance(train, dict) else None
    return data.to_trl_dataset(names, limit=limit, weights=weights, seed=cfg.seed)


def drop_long_prompts(dataset: Any, tokenizer: Any, limit: int | None, max_positions: int | None = None,
                      completion_length: int = 0, source: str | None = None, data: str | None = None) -> Any:
    """``dataset`` minus prompts longer than ``limit`` tokens (``max_prompt_length``), with a warning naming
    the first rows dropped and their lengths. Without a limit, a prompt that cannot fit in the model's
    ``max_positions`` beside ``completion_length`` tokens is an error naming its row, led by ``source`` (the config
    file) and the data it came from (``data``, the ``dataset_name`` value)."""
    from ictrl.errors import DataError
    from ictrl.eval.tokenizer_checks import longest_token
    from ictrl.train_cli.trl_data import prompt_text

    room = max_positions - completion_length if limit is None and max_positions is not None else None
    cap, longest = limit if limit is not None else room, longest_token(tokenizer)
    lengths, bounds = [], set()
    for i, prompt in enumerate(dataset["prompt"]):
        text = prompt_text(prompt, tokenizer, f"{source + ': ' if source else ''}dataset_name: row {i}")
        at_least = -(-len(text) // longest)  # no token is longer than the vocabulary's longest entry
        if cap is not None and at_least > cap:  # too long without tokenising it (a megabyte takes tens of s)
            lengths.append(at_least)
            bounds.add(i)
        else:
            lengths.append(len(tokenizer(text, add_special_tokens=False)["input_ids"]))

    def rows(idx: list[int]) -> str:
        shown = ", ".join(f"row {i} (id {shorten(str(dataset[i].get('id', i)), 80)}, "
                          f"{'at least ' if i in bounds else ''}"
                          f"{lengths[i]} tokens)" for i in idx[:3])
        return shown + (f" and {len(idx) - 3} more" if len(idx) > 3 else "")

    if limit is None:
        too_long = [i for i, n in enumerate(lengths) if room is not None and n > room]
        if too_long:
            where = f"{source}: " if source else ""
            named = f" {shorten(data, 200)}" if data else ""
            raise DataError(f"{where}dataset_name{named}: {rows(too_long)}: longer than the {room} tokens the model's "
                            f"{max_positions} positions leave beside max_completion_length {completion_length}; "
                            "set max_prompt_length to drop such prompts")
        return dataset
    long = [i for i, n in enumerate(lengths) if n > limit]
    if long:
        log.warning("max_prompt_length=%d: dropping %d of %d prompts longer than that: %s", limit, len(long),
                    len(lengths), rows(long))
        keep = set(long)
        dataset = dataset.select([i for i in range(len(lengths)) if i not in keep])
    return dataset


def check_enough_rows(dataset: Any, args: Any, source: str = "<config>") -> None:
    """At least one generation batch of prompts: with fewer, the trainer's sampler yields nothing and the run
    would 'finish' at step 0."""
    from ictrl.errors import DataError

    from datasets import IterableDataset

    prompts = args.generation_batch_size // args.num_generations
    if isinstance(dataset, IterableDataset):  # a stream's length is max_steps' (trainer_inputs.check_trainer_inputs)
        return
    if len(dataset) == 0:
        raise DataError(f"{source}: dataset_name: no training rows left (check dataset_limit and max_prompt_length)")
    if len(dataset) < prompts:
        raise DataError(f"{source}: dataset_name: {len(dataset)} prompts, fewer than the {prompts} of one generation "
                        f"batch ({args.generation_batch_size} completions / num_generations {args.num_generations}):"
                        " raise dataset_limit or lower the batch")


# --- what a resumed run must read again --------------------------------------------------------------------------

ACCEPT_CHANGED_FLAG = "--accept-changed-inputs"


def input_hashes(dataset: Any, reward_funcs: list[Any], model: str | None = None,
                 args: Any = None) -> dict[str, str]:
    """What ``--resume`` compares, since a name (``jsonl:train.jsonl``, ``my_reward:score``, a model folder) says
    nothing of the content: the sha256 of the training rows as the trainer gets them (every column, after the prompt
    template); of the source file of each reward function defined outside ictrl and installed packages (a local
    module) and of each local module it imports (``reward_sources.local_sources``); and
    ``checkpoints.model_digest`` of the ``model`` folder (the base model, which is also the reference model) and of
    a reward model's folder; of a hub id, the folder of the snapshot its ``main`` resolves to in the local cache
    (``hub.cached_snapshot``). With the trainer's ``args``, the user's selection rule's file too
    (:func:`rule_hash`)."""
    import hashlib
    import inspect
    import json

    from ictrl.checkpoints import model_digest, sha256_file
    from ictrl.hub import cached_snapshot
    from ictrl.train_cli.reward_sources import is_local, local_sources

    from datasets import IterableDataset

    digest = hashlib.sha256()
    if isinstance(dataset, IterableDataset):  # a stream is not read ahead: what it is read from stands for it
        digest.update(json.dumps([str(dataset.info.builder_name), str(dataset.info.config_name),
                                  str(dataset.info.splits)], default=str).encode())
    columns = {} if isinstance(dataset, IterableDataset) else dataset.to_dict()  # every value as Python data
    for column in sorted(columns):
        digest.update(column.encode())
        digest.update(json.dumps(columns[column], sort_keys=True, ensure_ascii=False, default=str).encode())
    out = {"data": digest.hexdigest()}
    if model is not None and (weights := model_digest(cached_snapshot(model) or model)) is not None:
        out["model"] = weights
    for fn in reward_funcs:
        if isinstance(fn, str):  # a reward model, by its path or hub id
            if (weights := model_digest(cached_snapshot(fn) or fn)) is not None:
                out[f"reward model {reward_label(fn)}"] = weights
            continue
        module = inspect.getmodule(fn if inspect.isroutine(fn) else type(fn))
        source = getattr(module, "__file__", None)
        if module is None or not source or not Path(source).is_file() or not is_local(Path(source)):
            continue
        out[f"reward {reward_label(fn)}"] = sha256_file(Path(source))
        for name, path in sorted(local_sources(module).items()):
            if name != module.__name__:
                out[f"reward {reward_label(fn)} imports {name}"] = sha256_file(path)
    return {**out, **(rule_hash(args) if args is not None else {})}


def rule_hash(args: Any) -> dict[str, str]:
    """The sha256 of a user's selection rule's file under ``selector NAME``, beside the reward's in ``inputs``: an
    edited rule is another rule, so ``--resume`` refuses it as it refuses changed data (ictrl's own rules: none)."""
    from ictrl.core.selection import selector_identity

    rule = selector_identity(args.selector, args.selector_options)
    return {} if rule["sha256"] is None else {f"selector {rule['name']}": rule["sha256"]}


def _changed_text(key: str) -> str:
    if key == "data":
        return "the training data (the rows as read, after the prompt template)"
    if key == "model":
        return "the model of model_name_or_path (its files: the base and reference model)"
    if key.startswith("reward model "):
        return f"the files of {key}"
    reward, _, imported = key.partition(" imports ")
    return f"the source of module {imported} (imported by {reward})" if imported else f"the source of {key}"


def check_same_inputs(saved: dict[str, Any], now: dict[str, str], accept: bool, source: str = "<config>") -> list[str]:
    """The inputs whose content differs from the run's ``run.json`` record (``saved["inputs"]``; an input recorded
    before its hash was kept is not compared). A difference refuses the resume in one line, unless ``accept``
    (``--accept-changed-inputs`` or ``--resume-inexact``), when it is returned for ``run.json`` to record."""
    before = saved.get("inputs") or {}
    changed = sorted(k for k in before.keys() | now.keys() if before.get(k) != now.get(k) and k in before)
    if changed and not accept:
        what = ", ".join(_changed_text(k) for k in changed)
        raise ConfigError(f"{source}: --resume: {what} changed since the run started; a resumed run would not "
                          f"continue the same run: restore it, start a fresh run in another output_dir, or pass "
                          f"{ACCEPT_CHANGED_FLAG} (or --resume-inexact) to continue on the new content (run.json "
                          "records it)")
    return changed


def inputs_record(out: Path, hashes: dict[str, str], resume_step: int | None, accept: bool,
                  source: str = "<config>", flag: str = ACCEPT_CHANGED_FLAG) -> dict[str, Any]:
    """The ``run.json`` keys of a run's inputs: ``inputs`` (:func:`input_hashes`), and ``changed_inputs``, each
    resume that went on under ``flag`` (``--accept-changed-inputs`` or ``--resume-inexact``: the step and what
    changed). A resume (``resume_step`` not None) is checked against the record first (:func:`check_same_inputs`)."""
    import json

    try:
        saved = json.loads((out / "run.json").read_text()) if resume_step is not None else {}
    except (OSError, ValueError):
        saved = {}
    saved = saved if isinstance(saved, dict) else {}
    history = list(saved.get("changed_inputs") or [])
    if resume_step is not None:
        changed = check_same_inputs(saved, hashes, accept, source)
        if changed:
            log.warning("--resume: continuing on changed inputs (%s) under %s: the result will differ from an "
                        "uninterrupted run", "; ".join(_changed_text(k) for k in changed), flag)
            history.append({"step": resume_step, "changed": changed, "flag": flag})
    return {"inputs": hashes, **({"changed_inputs": history} if history else {})}


def _annotations(cls: type) -> dict[str, str]:
    """The fields' annotations as written (HfArgumentParser rewrites a dataclass field's ``type`` in place)."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        out.update({k: str(v) for k, v in vars(klass).get("__annotations__", {}).items()})
    return out


def name_the_key(message: str, values: dict[str, Any], config_cls: type | None = None) -> str:
    """``message`` (a trainer config's error) led by the key it is about when it names none: transformers' enum
    errors say only the value and the enum ("False is not a valid IntervalStrategy"). The key is the one set value
    (of ``values``) that opens the message, among the fields of ``config_cls`` typed with that enum, else the one
    text value the message quotes (TRL's own ``int(...)`` of a field); without exactly one, the message as it is."""
    import dataclasses
    import re

    if any(re.search(rf"(?<![\w.]){re.escape(key)}(?!\w)", message) for key in values):
        return message
    enum = re.match(r".+? is not a valid (\w+)", message)
    types = {f.name: str(f.type) for f in dataclasses.fields(config_cls)} if config_cls is not None else {}
    found = [key for key, value in values.items()
             if (message.startswith(f"{value} ") or message.startswith(f"{value!r} "))
             and (enum is None or enum[1] in types.get(key, enum[1]))]
    if not found:  # a conversion's own words quote only the text ("invalid literal for int() ...: 'null\n'")
        found = [key for key, value in values.items() if isinstance(value, str) and repr(value) in message]
        kind = re.search(r"\b(int|float)\(\)|convert string to (float)", message)
        if len(found) > 1 and kind and config_cls is not None:  # two keys, one text: the field converting that way
            hints = _annotations(config_cls)
            found = [key for key in found if (kind[1] or kind[2]) in hints.get(key, "")] or found
    return f"{found[0]}: {message}" if len(found) == 1 else message
