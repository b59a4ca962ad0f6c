"""``ictrl selectors [SPEC ...]``: the selection rules a run can name (``token_selector``, ``--selector``,
``ictrl compare --methods``) with their statistics, options and defaults, and what a rule of your own can read
(docs/method.md, "Write your own rule"). A SPEC (``path/to/rules.py:NAME`` or ``module:NAME``) is loaded and shown
with its file and that file's sha256, as a run records it."""

from __future__ import annotations

import argparse
import json

from ictrl.errors import UserError

_ALWAYS = ("mask [B, T] bool (the response tokens), step (the optimizer step), seed (selection_seed); "
           "inputs.generator: a torch.Generator seeded from (seed, step), the same on every process; "
           "inputs.log_metric(name, value): a scalar of the rule's own, logged as ictrl/rule/<name>")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("specs", nargs="*", metavar="SPEC",
                        help="rules of your own to load and show too: path/to/rules.py:NAME or module:NAME")
    parser.add_argument("--json", action="store_true", help="print the list as JSON (one object per rule)")


def run(args: argparse.Namespace) -> int:
    from ictrl.core.selection import FIELD_WORDS, NEEDS_FIELDS, SELECTORS, get_selector, selector_identity

    try:
        extra = [get_selector(spec) for spec in args.specs]
    except ValueError as exc:
        raise UserError(str(exc)) from None
    rules = [*SELECTORS.values(), *(s for s in extra if s.name not in SELECTORS or SELECTORS[s.name] is not s)]
    rows = [{"name": s.name, "label": s.label, "needs": sorted(s.needs), "options": s.options,
             "warmup_steps": s.warmup_steps, "normalization": "TRL's for loss_type" if s.trl_loss else s.normalization,
             "help": s.help, **{k: v for k, v in selector_identity(s, {}).items() if k in ("spec", "file", "sha256")}}
            for s in rules]
    if args.json:
        print(json.dumps({"selectors": rows, "fields": FIELD_WORDS}, indent=1, default=str))
        return 0
    print("Selection rules (token_selector, --selector, ictrl compare --methods):")
    for row in rows:
        label = f" = {row['label']}" if row["label"] != row["name"] else ""
        options = ", ".join(f"{k}={v!r}" for k, v in row["options"].items()) or "none"
        print(f"  {row['name']}{label}: {row['help'] or '(no docstring)'}")
        print(f"      reads {', '.join(row['needs']) or 'no statistic'}; options {options}; warm-up "
              f"{row['warmup_steps']}; normaliser {row['normalization']}")
        if row["file"]:
            print(f"      {row['spec']} (file {row['file']}, sha256 {row['sha256']})")
    print("\nWhat a rule may read (name it in register_selector(needs=...); each [B, T] unless said):")
    for name in NEEDS_FIELDS:
        print(f"  {name}: {FIELD_WORDS[name]}")
    print(f"Always given: {_ALWAYS}.")
    print("A rule of your own: token_selector path/to/rules.py:NAME or module:NAME, a function "
          "fn(inputs, *, option=default) returning a [B, T] bool mask (docs/method.md, \"Write your own rule\").")
    return 0
