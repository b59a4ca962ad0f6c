"""bench/memory_model.py: parameter counts of the real models, predictions against bench_real_shape.py's measured
peaks (within 25%), and docs/scale.md's memory tables computed by it."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import memory_model as mm  # noqa: E402

RESULTS = REPO / "bench" / "results" / "real_shape.json"


@pytest.mark.parametrize("name", ["qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b"])
def test_parameter_count_equals_the_built_model(name: str) -> None:
    from ictrl.models import build_real_shape

    model, _ = build_real_shape(name, device="meta")
    assert mm.Shape.qwen25(name).params() == sum(p.numel() for p in model.parameters())


def _measured_runs() -> list[tuple[str, dict[str, Any], int, int, bool, int]]:
    """(label, run, layers, completion length, first step, statistics chunk rows) for every step run in the committed results."""
    result = json.loads(RESULTS.read_text())
    out = []
    for part in ("ratios", "full", "lengths"):
        if part not in result:
            continue
        p = result[part]
        chunk = mm.part_stats_chunk_size(p)
        first = p.get("steps", 2) == 1
        for key, run in p["runs"].items():
            variant, _, length = key.partition("@")
            runs = run if isinstance(run, list) else [run]
            for r in runs:
                out.append((f"{part}:{key}", r, p["layers"], int(length or p["completion_len"]), first, chunk))
    return out


def test_predicted_peaks_within_25_percent_of_measured() -> None:
    runs = _measured_runs()
    assert len(runs) >= 4
    misses = []
    for label, run, layers, completion_len, first, chunk in runs:
        variant = label.split(":")[1].partition("@")[0]
        predicted = mm.predicted_peak(variant, layers, completion_len, first_step=first, stats_chunk_size=chunk)
        measured = run["process_peak_mb"] / 1024
        if abs(predicted / measured - 1) > 0.25:
            misses.append(f"{label}: predicted {predicted:.2f} GiB, measured {measured:.2f} GiB")
    assert not misses, misses


def _table_row(text: str, first_cell: str) -> list[str]:
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0] == first_cell:
            return cells
    raise AssertionError(f"docs/scale.md has no table row starting with {first_cell!r}")


def test_scale_doc_tables_are_the_models_numbers() -> None:
    text = (REPO / "docs" / "scale.md").read_text()
    for label, value in mm.doc_rows().items():
        cell = _table_row(text, label)[-1]
        assert float(re.sub(r"[^0-9.]", "", cell)) == round(value, 1), (label, cell, value)
