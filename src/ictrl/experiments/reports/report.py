"""Results tables and a self-contained report.html for ``ictrl compare`` (and the studies' reports).

Inputs are plain Python data so that compare.py (and a study) can call these functions directly:

- a *run* is the list of records of one ``metrics.jsonl`` (``ictrl.files.load_metrics``): dicts with ``"step"`` and
  any of the keys named in a curve mapping (display name -> metrics key, ``DEFAULT_CURVE_KEYS``). Missing keys are
  tolerated: a curve no run logged is not drawn.
- ``runs``: method -> list of runs (one per seed).
- per-seed results for the table: method -> list of ``{"p1": float, "p4": float}`` with values in [0, 1].

The figures live in ``ictrl.experiments.reports.figures`` and the significance tests (scipy) in
``ictrl.experiments.reports.stats_tests``. The page puts what a reader wants first: the
``--note``, the study's answer and its caveats, then the tables and figures with human captions, then how the
numbers were made. Every file is written atomically.
"""

from __future__ import annotations

import base64
import html
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ictrl.experiments.reports.figures import number as _number
from ictrl.experiments.reports.figures import png_caption
from ictrl.experiments.reports.stats_tests import DiffCI, sample_std, welch_diff
from ictrl.files import atomic_write_text

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TABLE_COLUMNS = ("P@1", "P@4", "Total")


# ---------------------------------------------------------------------------------------------------- tables


@dataclass(frozen=True)
class Cell:
    """mean and sample std (None for one seed) over seeds, in percent."""

    mean: float
    std: float | None
    n: int

    def __str__(self) -> str:
        return f"{self.mean:.2f} ± {'n/a' if self.std is None else f'{self.std:.2f}'}"


@dataclass(frozen=True)
class ResultsTable:
    """Rows = methods, columns P@1 / P@4 / Total (percent, mean ± std over seeds), plus an optional difference row."""

    rows: dict[str, dict[str, Cell]]
    diff_name: str | None = None
    diff: dict[str, DiffCI] | None = None

    def _lines(self) -> list[list[str]]:
        lines = [["method", *TABLE_COLUMNS]]
        for method, cells in self.rows.items():
            lines.append([f"{method} (n={cells['P@1'].n})", *(str(cells[c]) for c in TABLE_COLUMNS)])
        if self.diff is not None and self.diff_name is not None:
            conf = next(iter(self.diff.values())).confidence
            lines.append([f"{self.diff_name} ({conf:.0%} Welch CI)", *(str(self.diff[c]) for c in TABLE_COLUMNS)])
        return lines

    def to_markdown(self) -> str:
        lines = self._lines()
        out = ["| " + " | ".join(lines[0]) + " |", "|" + "---|" * len(lines[0])]
        out += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in lines[1:]]
        return "\n".join(out)

    def to_html(self) -> str:
        return markdown_table_to_html(self.to_markdown())


def results_table(
    per_seed: Mapping[str, Sequence[Mapping[str, float]]],
    diff: tuple[str, str] | None = ("ict", "random10"),
    confidence: float = 0.95,
) -> ResultsTable:
    """Aggregate per-seed pass@k into a results table.

    per_seed: method -> one ``{"p1": x, "p4": y}`` per seed, x and y in [0, 1]. Total = (P@1 + P@4) / 2 per seed
    (docs/method.md §6), then averaged. Cells are percent, "mean ± sample std". ``diff=(treatment, baseline)`` adds a
    row "treatment − baseline" with a Welch t-interval per column (``welch_diff``); both must be in ``per_seed``.
    None leaves the row out.
    """
    if not per_seed:
        raise ValueError("per_seed must name at least one method")
    columns: dict[str, dict[str, list[float]]] = {}
    for method, seeds in per_seed.items():
        if not seeds:
            raise ValueError(f"per_seed[{method!r}] has no seeds")
        cols: dict[str, list[float]] = {c: [] for c in TABLE_COLUMNS}
        for s, res in enumerate(seeds):
            vals = []
            for key in ("p1", "p4"):
                if key not in res:
                    raise ValueError(f"per_seed[{method!r}][{s}] has no {key!r}")
                v = _number(res[key], f"per_seed[{method!r}][{s}][{key!r}]")
                if v is None or not 0 <= v <= 1:
                    raise ValueError(f"per_seed[{method!r}][{s}][{key!r}] must be a finite fraction in [0, 1], "
                                     f"got {res[key]!r}")
                vals.append(100.0 * v)
            cols["P@1"].append(vals[0])
            cols["P@4"].append(vals[1])
            cols["Total"].append((vals[0] + vals[1]) / 2.0)
        columns[method] = cols
    rows = {
        m: {c: Cell(math.fsum(v) / len(v), sample_std(v), len(v)) for c, v in cols.items()}
        for m, cols in columns.items()
    }
    if diff is None:
        return ResultsTable(rows)
    treat, base = diff
    for name in diff:
        if name not in columns:
            raise ValueError(f"diff names method {name!r}, which is not in per_seed ({', '.join(per_seed)})")
    cis = {c: welch_diff(columns[treat][c], columns[base][c], confidence) for c in TABLE_COLUMNS}
    return ResultsTable(rows, f"{treat} − {base}", cis)


# ---------------------------------------------------------------------------------------------------- HTML


def markdown_table_to_html(text: str) -> str:
    """A markdown pipe table (header row, separator row, body rows) as an escaped HTML <table>."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    if (len(lines) < 2 or not all(ln.startswith("|") for ln in lines)
            or not re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", lines[1])):
        raise ValueError("table is neither HTML (starting with '<') nor a markdown pipe table")

    def cells(line: str) -> list[str]:
        parts = re.split(r"(?<!\\)\|", line.strip().strip("|"))
        return [html.escape(p.strip().replace("\\|", "|")) for p in parts]

    head = "".join(f"<th>{c}</th>" for c in cells(lines[0]))
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in cells(ln)) + "</tr>" for ln in lines[2:])
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


_REPORT_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;max-width:1100px;
color:#222;padding:0 1em;line-height:1.45}
h1{font-size:1.6em;border-bottom:2px solid #ddd;padding-bottom:.3em}
h2{font-size:1.2em;margin-top:1.6em}
.note{background:#fff8e1;border-left:4px solid #f0b400;padding:.6em 1em;margin:1em 0}
.answer{background:#eef6ee;border-left:4px solid #3a8f3a;padding:.6em 1em;margin:1em 0}
.answer p{margin:.3em 0}
.caveats{margin:.4em 0 0 0;padding-left:1.2em;color:#444}
table{border-collapse:collapse;margin:1em 0;font-variant-numeric:tabular-nums}
th,td{border:1px solid #ccc;padding:.35em .8em;text-align:right}
th:first-child,td:first-child{text-align:left}
thead th{background:#f2f2f2}
figure{display:inline-block;margin:.5em;vertical-align:top;max-width:530px}
figure img{max-width:520px;border:1px solid #eee}
figcaption{font-size:.85em;color:#444;text-align:left;padding:.2em .3em}
.notes p{color:#333}
"""

Table = str | tuple[str, str]  # an HTML / markdown table, or (heading, table)
Image = str | os.PathLike[str] | tuple[str | os.PathLike[str], str]  # a PNG, or (PNG, caption)


def _table_html(i: int, table: Table) -> str:
    heading, body = table if isinstance(table, tuple) else ("", table)
    stripped = body.strip()
    try:
        out = stripped if stripped.startswith("<") else markdown_table_to_html(stripped)
    except ValueError as e:
        raise ValueError(f"tables[{i}]: {e}") from None
    return (f"<h2>{html.escape(heading)}</h2>" if heading else "") + out


def _figure_html(image: Image) -> str:
    path, caption = (Path(image[0]), image[1]) if isinstance(image, tuple) else (Path(image), None)
    data = path.read_bytes()
    if not data.startswith(PNG_MAGIC):
        raise ValueError(f"images: {path.name} is not a PNG file")
    caption = caption or png_caption(path) or path.stem.replace("_", " ")
    uri = "data:image/png;base64," + base64.b64encode(data).decode("ascii")
    text = html.escape(caption)
    return f'<figure><img src="{uri}" alt="{text}"><figcaption>{text}</figcaption></figure>'


def _paragraphs(text: str) -> list[str]:
    return [html.escape(p.strip()) for p in re.split(r"\n\s*\n", text) if p.strip()]


def render_report(
    title: str,
    tables: Sequence[Table],
    images: Sequence[Image],
    notes: str,
    out_path: str | os.PathLike[str],
    *,
    note: str = "",
    answer: str = "",
    caveats: Sequence[str] = (),
) -> Path:
    """Write a self-contained report.html: inline CSS, PNGs embedded as base64 data URIs, no external assets.

    Order on the page: ``note`` (the user's ``--note``), the study's ``answer`` and ``caveats``, the tables, the
    figures, then ``notes`` (how the numbers were made). tables: HTML strings (starting with "<", inserted
    verbatim: callers pass trusted output such as ``ResultsTable.to_html()``) or markdown pipe tables (converted,
    cells escaped), each optionally as (heading, table). images: PNG files, or (PNG, caption); without a caption
    the PNG's Description metadata (``figures.save_figure``) is used. Text is escaped; blank lines separate
    paragraphs.
    """
    parts = [f"<h1>{html.escape(title)}</h1>"]
    if note.strip():
        parts.append('<div class="note">' + "".join(f"<p>{p}</p>" for p in _paragraphs(note)) + "</div>")
    if answer.strip() or caveats:
        block = "".join(f"<p>{p}</p>" for p in _paragraphs(answer))
        if caveats:
            block += "<p><b>Caveats</b></p><ul class=\"caveats\">" + "".join(
                f"<li>{html.escape(c)}</li>" for c in caveats) + "</ul>"
        parts.append(f'<div class="answer">{block}</div>')
    parts += [_table_html(i, t) for i, t in enumerate(tables)]
    parts += [_figure_html(img) for img in images]
    if notes.strip():
        parts.append('<h2>How these numbers were made</h2><div class="notes">'
                     + "".join(f"<p>{p}</p>" for p in _paragraphs(notes)) + "</div>")
    page = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{_REPORT_CSS}</style></head>\n<body>\n"
        + "\n".join(parts)
        + "\n</body></html>\n"
    )
    return atomic_write_text(out_path, page)
