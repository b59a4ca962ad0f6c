"""The checks of the options every command shares (benchmark names, a file), run first, before torch, transformers
or a model loads; a model id or folder is ``ictrl.hub.check_model``'s.

Each check raises a :class:`ictrl.errors.UserError` whose message is one line naming the option, file or field
that is wrong; ``ictrl.cli.main`` prints it and exits 2. Nothing here imports torch or transformers: a mistake
costs a fraction of a second, not the minutes a model load takes.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from ictrl.errors import DataError, UserError, did_you_mean
from ictrl.hub import hub_reachable, in_hub_cache, why_unreachable


def check_benchmarks(names: Sequence[str], data_root: str | os.PathLike[str] | None = None,
                     option: str = "--benchmarks") -> None:
    """Every name is a registry name or spec (did-you-mean for a typo) or ``jsonl:PATH`` to an existing file, and
    one with no local file can reach the hub (or its cache)."""
    from ictrl.data import BENCHMARKS, default_data_root, parse_spec

    root = Path(data_root) if data_root is not None else default_data_root()
    if not names:  # `--benchmarks ''`: the comma list is empty
        raise UserError(f"{option}: no benchmark named (known: {', '.join(sorted(BENCHMARKS))}, or jsonl:PATH)")
    for name in names:
        head = name.split(":", 1)[0]
        if head != "jsonl" and head not in BENCHMARKS:
            raise UserError(f"{option}: unknown benchmark {head!r}{did_you_mean(head, BENCHMARKS)} "
                            f"(known: {', '.join(sorted(BENCHMARKS))}, or jsonl:PATH)")
        try:
            bench, path = parse_spec(name)
        except ValueError as exc:
            raise UserError(f"{option}: {name!r}: {exc}") from None
        if path is not None:
            check_file(path, f"{option}: {name!r}")
            continue
        if bench.local_path is not None and root is not None and (root / bench.local_path).is_file():
            continue
        if bench.hub_id is not None and (in_hub_cache(bench.hub_id, "dataset") or hub_reachable()):
            continue
        where = f"{root / bench.local_path}" if root is not None and bench.local_path else f"data root {root}"
        raise DataError(f"{option}: {bench.name}: no local copy ({where}), and {why_unreachable()} to fetch "
                        f"{bench.hub_id}; set --data-root / ICTRL_DATA_ROOT to a folder holding it")


def check_file(path: str | os.PathLike[str], option: str) -> Path:
    """An existing regular file; a :class:`UserError` naming ``option`` otherwise."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise UserError(f"{option}: {path}: {'not a file' if p.exists() else 'no such file'}")
    return p
