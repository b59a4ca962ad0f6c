"""A long-horizon setting at every method's own tuned setting, from a fresh clone, in one command::

    OMP_NUM_THREADS=1 python studies/horizon/tuned.py paths-tuned --jobs 2

1. The tuned protocol (``python -m studies compare --tune --setting SETTING``: the setting's task and base
   recipe) with the options of the setting's ``tune`` field, into ``RUNS/tune-SETTING``. Its choice rule is
   ``studies.protocols.tune.CHOICE_RULE``.
2. Its choices (``choices.json``) become the setting's ``tuned`` field: written into the setting file when the
   file has none, checked against it when it has one (a mismatch stops here: the file's learning rates are not
   the ones this tune chose). The base is warm-started on the machine that runs the study, and another machine
   can build another base and tune to other choices: ``--own-choices`` then writes the setting with this tune's
   choices to ``RUNS/SETTING.json`` and runs the horizon from it, leaving the project's file as it is.
3. The long-horizon protocol (``python -m studies compare --horizon SETTING``) into ``RUNS/horizon-SETTING``.

Rerunning the command resumes: both protocols skip the runs they finished.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from ictrl.files import atomic_write_text

HERE = Path(__file__).resolve().parent


def tune_flags(tune: dict[str, Any]) -> list[str]:
    """The setting's ``tune`` field as ``python -m studies compare --tune`` options (a list is one comma-separated
    value)."""
    out = []
    for key, value in tune.items():
        out += [f"--{key}", ",".join(map(str, value)) if isinstance(value, list) else str(value)]
    return out


def chosen_tuned(choices: dict[str, Any], methods: list[str]) -> dict[str, list[Any]]:
    """``choices.json``'s choice per method as a setting's ``tuned`` field: [lr, normaliser or null]."""
    return {m: [choices["chosen"][m]["lr"], choices["chosen"][m]["norm"]] for m in methods}


def horizon_setting(path: Path, data: dict[str, Any], tuned: dict[str, list[Any]], runs: Path,
                    own_choices: bool) -> Path:
    """The setting file the long runs start from, given this tune's choices ``tuned``: the project's file (its
    ``tuned`` field written when absent, checked when present), or with ``own_choices`` and a file that differs,
    a copy with this tune's choices in ``runs``. A mismatch without ``own_choices`` stops with one line."""
    if "tuned" not in data:
        data = {**data, "tuned": tuned,
                "tuned_source": f"this setting's own tuned protocol (studies/horizon/tuned.py {path.stem}: "
                                f"python -m studies compare --tune --setting {path.stem}, its choices.json)"}
        atomic_write_text(path, json.dumps(data, indent=2) + "\n")
        print(f"wrote the tuned settings into {path}: {json.dumps(tuned)}", flush=True)
        return path
    if data["tuned"] == tuned:
        return path
    tune_dir = runs / f"tune-{path.stem}"
    if not own_choices:
        sys.exit(f"{path}: its 'tuned' field {json.dumps(data['tuned'])} is not what the tune in {tune_dir} chose "
                 f"({json.dumps(tuned)}); --own-choices runs the long horizon at the tune's choices")
    own = runs / path.name
    source = (f"this setting's own tuned protocol on this machine's base (studies/horizon/tuned.py {path.stem} "
              f"--own-choices: {tune_dir / 'choices.json'}; the project's file chose {json.dumps(data['tuned'])})")
    atomic_write_text(own, json.dumps({**data, "tuned": tuned, "tuned_source": source}, indent=2) + "\n")
    print(f"this tune chose other settings than {path}; the long runs start from {own}: {json.dumps(tuned)}",
          flush=True)
    return own


def studies(*args: str) -> None:
    """``python -m studies ARGS`` with the repository's root on the path, from any working directory."""
    print("+ python -m studies " + " ".join(args), flush=True)
    path = os.pathsep.join(p for p in (str(HERE.parents[1]), os.environ.get("PYTHONPATH", "")) if p)
    subprocess.run([sys.executable, "-m", "studies", *args], check=True, env={**os.environ, "PYTHONPATH": path})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("setting", help="a name in studies/horizon/ (its file needs a 'tune' field)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--runs", type=Path, default=Path("runs"), help="where the two output directories go")
    parser.add_argument("--own-choices", action="store_true",
                        help="where the tune chooses other settings than the setting file's, run the long horizon "
                             "at the tune's choices (written to RUNS/SETTING.json) instead of stopping")
    args = parser.parse_args(argv)
    path = HERE / f"{args.setting}.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    if not data.get("tune"):
        parser.error(f"{path}: no 'tune' field (the tuned protocol's options)")
    tune_dir, horizon_dir = args.runs / f"tune-{args.setting}", args.runs / f"horizon-{args.setting}"
    studies("compare", "--tune", "--setting", str(path), *tune_flags(data["tune"]), "--jobs", str(args.jobs),
          "--output-dir", str(tune_dir))
    choices = json.loads((tune_dir / "choices.json").read_text())
    methods = [m.strip() for m in str(data["tune"]["variants"]).split(",")] if isinstance(
        data["tune"]["variants"], str) else list(data["tune"]["variants"])
    setting = horizon_setting(path, data, chosen_tuned(choices, methods), args.runs, args.own_choices)
    studies("compare", "--horizon", str(setting), "--jobs", str(args.jobs), "--output-dir", str(horizon_dir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
