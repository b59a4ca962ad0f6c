"""Fixtures shared by the engine tests."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def uninterrupted_reference(tiny_model_dir: Path, shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The output directory of the uninterrupted one-process run (test_resume's ``command``, no launcher) that a
    killed and resumed run must match: test_resume kills the process, test_launcher_kill its 1-process launcher."""
    from test_resume import REWARD_MODULE, command

    root = tmp_path_factory.mktemp("uninterrupted")
    (root / "ictrl_resume_reward.py").write_text(REWARD_MODULE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command(tiny_model_dir, root / "ref"), env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return root / "ref"
