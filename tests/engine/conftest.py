"""Fixtures shared by the engine tests."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture
def loader_calls(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Replace the model loader with one that records its calls and refuses to load."""
    import ictrl.models

    calls: list[Any] = []

    def fake(*args: Any, **kwargs: Any) -> Any:
        calls.append((args, kwargs))
        raise AssertionError("the model loader must not be reached")

    monkeypatch.setattr(ictrl.models, "load_model_and_tokenizer", fake)
    return calls
