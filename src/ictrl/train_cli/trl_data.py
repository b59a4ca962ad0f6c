"""TRL's data forms beyond a dataset directory or hub id, read as ``trl grpo`` reads them: the ``datasets:`` mixture
(``trl.get_dataset`` over ``DatasetMixtureConfig``) and a local data file as ``dataset_name`` (``datasets``' own
``parquet``, ``json`` and ``csv`` builders, where ``trl grpo`` fails). ``ictrl.train_cli.run_inputs`` calls them;
errors are one :class:`ictrl.errors.DataError` line naming the key."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ictrl.data.loading import check_json_nesting
from ictrl.errors import DataError, shorten

log = logging.getLogger("ictrl.train")

# A local data file's suffix -> the datasets builder that reads it (.jsonl and .json are both the json builder).
DATA_FILE_BUILDERS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".csv": "csv"}


def file_builder(name: Any) -> str | None:
    """The ``datasets`` builder for ``name`` when it is a local data file (:data:`DATA_FILE_BUILDERS`), else None."""
    if not isinstance(name, str):
        return None
    path = Path(name).expanduser()
    try:
        return DATA_FILE_BUILDERS.get(path.suffix.lower()) if path.is_file() else None
    except (OSError, ValueError):  # a name longer than a path can be, or with a NUL byte: not a file
        return None


def load_file(name: str, script: Any) -> Any:
    """``load_dataset(builder, data_files=name, streaming=dataset_streaming)``: the file as a ``DatasetDict`` whose
    one split is ``train`` (``datasets``' builders name it so)."""
    from datasets import load_dataset

    builder = file_builder(name)
    if builder == "json":
        check_json_nesting(Path(name).expanduser(), f"dataset_name: {name}")
    try:
        return load_dataset(builder, data_files=str(Path(name).expanduser()), streaming=script.dataset_streaming)
    except Exception as exc:  # datasets raises many types for a malformed file (ArrowInvalid, DatasetGenerationError)
        raise DataError(f"dataset_name: {name}: not readable as {builder} ({type(exc).__name__}: "
                        f"{shorten(str(exc).splitlines()[0] if str(exc) else '', 300)})") from None


def load_trl_mixture(script: Any, seed: int) -> Any:
    """trl grpo's ``get_dataset(DatasetMixtureConfig(datasets, streaming, test_split_size))``: each entry loaded
    by ``datasets.load_dataset`` with its path, name, data_dir, data_files and split, its columns selected, the
    fractions applied, concatenated, split into train and test by ``test_split_size`` with the ``train_test_split``
    TRL calls. TRL's split draws its seed from numpy's global state, so each call (and each run) splits anew; here
    it draws from ``seed``: the train and test splits of one run are one split, its eval rows never training rows,
    and a resumed run reads the same rows. With ``dataset_name`` set too, ``datasets`` is used, as in trl grpo,
    said in one line."""
    from datasets import DatasetDict
    from datasets.exceptions import DatasetGenerationError
    from trl import DatasetMixtureConfig, get_dataset
    from trl.scripts.utils import DatasetConfig

    if script.dataset_name:
        log.warning("datasets and dataset_name are both set: the datasets mixture is used and dataset_name %s is "
                    "ignored, as in trl grpo", shorten(str(script.dataset_name), 200))
    entries = [DatasetConfig(**entry) for entry in script.datasets]
    fractions = [entry.fraction for entry in entries]
    if all(f is not None for f in fractions) and sum(fractions) <= 0:  # TRL divides by their sum
        raise DataError(f"datasets: the fractions {fractions} sum to {sum(fractions)}; give a source a positive share")
    check_data_files(entries)
    split = script.test_split_size is not None and not script.streaming  # a stream: TRL's own call and error
    mixture = DatasetMixtureConfig(datasets=entries, streaming=script.streaming,
                                   test_split_size=None if split else script.test_split_size)
    try:
        loaded = get_dataset(mixture)
        if split:
            loaded = DatasetDict(loaded["train"].train_test_split(test_size=script.test_split_size, seed=seed))
            log.info("datasets: test_split_size=%s: one split of the mixture, drawn from seed %d (trl grpo draws "
                     "it from numpy's global state): %d training rows, %d test rows", script.test_split_size, seed,
                     len(loaded["train"]), len(loaded["test"]))
    except (ValueError, KeyError, OSError) as exc:  # datasets' DatasetNotFoundError is a FileNotFoundError
        raise DataError(f"datasets: {shorten(str(exc).splitlines()[0] if str(exc) else type(exc).__name__, 300)}"
                        ) from None
    except StopIteration:  # datasets' builders take the first of the files a pattern matched, when none did
        raise DataError("datasets: an entry's data_files matched no file") from None
    except (RecursionError, DatasetGenerationError, ZeroDivisionError) as exc:  # a row the builder cannot read
        cause = exc.__cause__ or exc
        raise DataError(f"datasets: cannot read the rows ({type(cause).__name__}: "
                        f"{shorten(str(cause).splitlines()[0] if str(cause) else '', 300)})") from None
    return loaded


def check_data_files(entries: list[Any]) -> None:
    """Every local ``data_files`` pattern of the ``datasets:`` entries matches a file, resolved as ``datasets``
    resolves it (against ``data_dir``, or the working directory, for a builder such as ``json``; inside the folder
    for a local dataset folder); else one line naming the entry and the pattern. A glob that matches nothing would
    reach the builder as an empty list, where ``datasets`` stops with a bare StopIteration. The JSON files an entry
    reads (its folder's, without data_files) are checked for rows nested past the parser
    (:func:`ictrl.data.loading.check_json_nesting`)."""
    from datasets.data_files import resolve_pattern, sanitize_patterns
    from datasets.packaged_modules import _PACKAGED_DATASETS_MODULES

    for index, entry in enumerate(entries):
        folder = entry.path not in _PACKAGED_DATASETS_MODULES
        if not folder:
            base = Path(entry.data_dir or "").expanduser().resolve()
        elif Path(entry.path).expanduser().is_dir():
            base = Path(entry.path, entry.data_dir or "").expanduser()
        else:
            continue  # a hub data set: its files are the hub's to resolve
        where = f"datasets[{index}] ({entry.path})"
        files: list[str] = []
        if not entry.data_files and (folder or entry.data_dir):  # datasets reads the folder's data files
            files = [str(p) for p in base.rglob("*")]
        for split, patterns in sanitize_patterns(entry.data_files or {}).items():
            for pattern in (str(p) for p in patterns if "://" not in str(p)):
                try:
                    files += resolve_pattern(pattern, base_path=base.as_posix())
                except FileNotFoundError:
                    raise DataError(f"{where}: data_files {shorten(repr(pattern), 200)} ({split}) matches no file "
                                    f"under {base}") from None
        if folder or entry.path == "json":  # the files datasets' json builder parses
            for file in (Path(f) for f in files if Path(f).suffix.lower() in (".json", ".jsonl")):
                check_json_nesting(file, f"{where}: {file}")


def prompt_text(prompt: Any, tokenizer: Any, where: str = "prompt") -> str:
    """The prompt as text (a chat through the tokenizer's template); a prompt that is neither (null in a row of a
    CSV read as a mixture's source, a message without text) is a DataError naming the row."""
    if isinstance(prompt, str):
        return prompt
    if not (isinstance(prompt, list) and prompt and all(isinstance(m, dict) for m in prompt)):
        raise DataError(f"{where}: prompt: expected text or a list of chat messages, got {shorten(repr(prompt), 80)}")
    try:
        return str(tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True))
    except (TypeError, ValueError, KeyError) as exc:  # the template's own error on a message it cannot render
        raise DataError(f"{where}: prompt: the chat template cannot render it ({type(exc).__name__}: "
                        f"{shorten(str(exc), 200)})") from None


# --- streamed data ------------------------------------------------------------------------------------------------


def streamed(script: Any) -> bool:
    """Whether the training data streams: ``dataset_streaming``, or the ``datasets`` mixture's ``streaming``."""
    return bool(script.datasets and script.streaming) or (not script.datasets and bool(script.dataset_streaming))


def first_row(rows: Any, name: str) -> dict[str, Any]:
    """A stream's first row (its columns, when ``datasets`` knows no features before reading)."""
    try:
        return dict(next(iter(rows)))
    except StopIteration:
        raise DataError(f"{name}: the stream has no rows") from None


class RowCheck:
    """ictrl's row checks, applied to each row as it streams (``IterableDataset.filter`` with its position): a
    prompt that is neither text nor chat messages, or messages without a chat template, stops the run in one line
    naming the row; a prompt longer than ``limit`` tokens (``max_prompt_length``) is skipped with a line; without a
    limit, one that cannot fit ``room`` tokens (the model's positions beside ``max_completion_length``) stops it."""

    def __init__(self, tokenizer: Any, name: str, limit: int | None, room: int | None) -> None:
        self.tokenizer, self.name, self.limit, self.room = tokenizer, name, limit, room
        self.skipped = 0

    def __call__(self, row: dict[str, Any], position: int) -> bool:
        prompt = row.get("prompt")
        where = f"{self.name}: streamed row {position}"
        if isinstance(prompt, list) and prompt and all(isinstance(m, dict) for m in prompt):
            if not getattr(self.tokenizer, "chat_template", None):
                raise DataError(f"{where}: the prompt is a list of chat messages and the tokenizer has no chat "
                                "template; set chat_template_path (the run stops at a bad streamed row)")
            text = str(self.tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True))
        elif isinstance(prompt, str) and prompt:
            text = prompt
        else:
            raise DataError(f"{where}: prompt: expected text or a list of chat messages, got "
                            f"{shorten(repr(prompt), 80)} (the run stops at a bad streamed row)")
        tokens = len(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        if self.limit is not None and tokens > self.limit:
            self.skipped += 1
            log.warning("%s: %d tokens, longer than max_prompt_length=%d: skipped (%d skipped so far)", where,
                        tokens, self.limit, self.skipped)
            return False
        if self.limit is None and self.room is not None and tokens > self.room:
            raise DataError(f"{where}: {tokens} tokens, longer than the {self.room} the model's positions leave "
                            "beside max_completion_length; set max_prompt_length to skip such prompts (the run stops "
                            "at a row that cannot fit)")
        return True


def check_stream(rows: Any, tokenizer: Any, name: str, limit: int | None, max_positions: int | None,
                 completion_length: int) -> Any:
    """``rows`` (an ``IterableDataset``) with :class:`RowCheck` applied to each row as it streams, the choice for
    each kind of bad row said in one line first."""
    room = max_positions - completion_length if max_positions is not None else None
    long = (f"longer than max_prompt_length={limit} is skipped with a line" if limit is not None else
            f"that cannot fit the model's {max_positions} positions beside max_completion_length stops the run")
    log.info("%s streams: each row is checked as it is read: a prompt that is neither text nor chat messages "
             "stops the run naming its position; one %s", name, long)
    return rows.filter(RowCheck(tokenizer, name, limit, room), with_indices=True)
