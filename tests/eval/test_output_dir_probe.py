"""``ictrl eval --output-dir`` where the directory cannot be made: one line before the model loads, also for root,
to whom ``os.access`` answers yes everywhere (sysfs, a read-only mount)."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

from ictrl.cli import main

SYSFS = Path("/sys/kernel")


@pytest.fixture
def rows(tmp_path: Path) -> Path:
    path = tmp_path / "rows.jsonl"
    path.write_text('{"question": "1+1?", "answer": "2"}\n')
    return path


def _eval(model: Path, rows: Path, out: str, capsys: pytest.CaptureFixture[str]) -> list[str]:
    assert main(["eval", "--model", str(model), "--benchmarks", f"jsonl:{rows}", "--n", "1", "--k", "1",
                 "--output-dir", out]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return [line for line in err.split("\n") if line.startswith("ictrl eval:")]


@pytest.mark.skipif(not SYSFS.is_dir(), reason="no sysfs")
def test_an_output_dir_in_sysfs_is_one_line_before_the_model_loads(tiny_model_dir: Path, rows: Path,
                                                                    loader_calls: list[Any],
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    lines = _eval(tiny_model_dir, rows, str(SYSFS / "x"), capsys)
    assert len(lines) == 1 and lines[0].startswith("ictrl eval: error: --output-dir: '/sys/kernel/x': cannot create "
                                                   "it"), lines
    assert not loader_calls and not (SYSFS / "x").exists()


def test_a_read_only_output_dir_is_one_line_and_the_probe_leaves_nothing(tiny_model_dir: Path, rows: Path,
                                                                         tmp_path: Path, loader_calls: list[Any],
                                                                         monkeypatch: pytest.MonkeyPatch,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    real_open = os.open

    def read_only(path: Any, flags: int, *args: Any) -> int:
        if ".ictrl-probe-" in str(path):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", read_only)
    out = tmp_path / "new" / "deeper"
    lines = _eval(tiny_model_dir, rows, str(out), capsys)
    assert lines == [f"ictrl eval: error: --output-dir: '{out}': cannot create it: Read-only file system"], lines
    assert not (tmp_path / "new").exists() and not loader_calls  # the folders the probe made are gone
    (tmp_path / "existing").mkdir()
    lines = _eval(tiny_model_dir, rows, str(tmp_path / "existing"), capsys)
    assert lines == [f"ictrl eval: error: --output-dir: '{tmp_path / 'existing'}' is not writable: Read-only file "
                     "system"], lines
    assert list((tmp_path / "existing").iterdir()) == []


def test_a_parent_os_access_refuses_is_one_line_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where ``os.access`` already says no (a user's read-only folder), the line names the folder, with no probe."""
    from ictrl.errors import UserError
    from ictrl.files import check_output_dir

    parent = tmp_path / "ro"
    parent.mkdir()
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != parent)
    with pytest.raises(UserError) as raised:
        check_output_dir(parent / "out")
    assert str(raised.value) == f"--output-dir: '{parent / 'out'}': cannot create it, {parent} is not writable"
    assert list(parent.iterdir()) == []
