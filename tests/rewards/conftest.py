"""Every rewards test starts and ends with the default grader configuration."""

from __future__ import annotations

import pytest

from ictrl import rewards


@pytest.fixture(autouse=True)
def _default_config():
    rewards.configure(guard="process", timeout=3.0, wall_timeout=60.0, workers=1, cache_size=65536)
    yield
    rewards.configure(guard="process", timeout=3.0, wall_timeout=60.0, workers=1, cache_size=65536)
