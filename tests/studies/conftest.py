"""Fixtures of the study tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def quick_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This test module's own ``ICTRL_CACHE_DIR``: the quick base model is built once per module (about 4 s of CPU),
    and no module reads what another built, so the modules pass in any order or alone."""
    return tmp_path_factory.mktemp("ictrl_cache")
