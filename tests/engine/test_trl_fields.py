"""Every field of TRL's GRPOConfig is in ictrl's table (honoured, honoured with a selection meaning, or refused),
the docs show that table, and a refused field set away from TRL's default is one line naming it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import trl

from ictrl.engine.config import ICTGRPOConfig
from ictrl.engine.config_fields import (GRPO_FIELDS, HONOURED, REFUSED, SELECTION, TABLE_END, TABLE_START,
                                        TRAINING_ARGUMENTS)

DOC = Path(__file__).resolve().parents[2] / "docs" / "trl-contract.md"


def render_table() -> str:
    """The Markdown table of every GRPOConfig field (the GRPO ones first, then transformers' in one row)."""
    rows = ["| field | under ICTGRPOTrainer | note |", "|---|---|---|"]
    label = {HONOURED: "honoured", SELECTION: "honoured, with a token-selection meaning", REFUSED: "refused"}
    rows += [f"| `{name}` | {label[status]} | {note} |" for name, (status, note) in GRPO_FIELDS.items()]
    rows.append("| " + ", ".join(f"`{n}`" for n in TRAINING_ARGUMENTS) + " | honoured | transformers' "
                "TrainingArguments, run by its Trainer, which ictrl does not replace |")
    return "\n".join(rows)


def test_every_grpo_config_field_is_in_the_table() -> None:
    names = [f.name for f in dataclasses.fields(trl.GRPOConfig)]
    covered = list(GRPO_FIELDS) + list(TRAINING_ARGUMENTS)
    assert len(covered) == len(set(covered)), "a field is listed twice"
    missing = [n for n in names if n not in covered]
    assert not missing, f"GRPOConfig fields with no entry in ictrl.engine.config_fields: {missing}"
    stale = sorted(set(covered) - set(names))
    assert not stale, f"entries for fields GRPOConfig no longer has: {stale}"


def test_docs_show_the_generated_table() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert TABLE_START in text and TABLE_END in text
    shown = text.split(TABLE_START, 1)[1].split(TABLE_END, 1)[0].strip()
    assert shown == render_table(), ("docs/trl-contract.md's table is stale: replace it with "
                                     "this file's render_table()")


@pytest.mark.parametrize("name", [n for n, (status, _) in GRPO_FIELDS.items() if status == REFUSED])
def test_refused_fields_name_themselves(tmp_path: Path, name: str) -> None:
    default = {f.name: f.default for f in dataclasses.fields(trl.GRPOConfig)}[name]
    value = (not default) if isinstance(default, bool) else default + 0.5
    with pytest.raises(ValueError, match=f"^{name}=.*not supported by ICTGRPOTrainer") as err:
        ICTGRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", **{name: value})
    assert "\n" not in str(err.value)
    ICTGRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", **{name: default})
