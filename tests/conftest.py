"""Shared fixtures. Heavy libraries (transformers) load lazily inside fixtures, once per session."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("ICTRL_DATA_ROOT") or REPO_ROOT.parent / "shared" / "data")  # as ictrl.data


WITHOUT_VLLM_ENV = "ICTRL_TEST_WITHOUT_VLLM"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--integration", action="store_true",
                     help="also run the tests marked integration (slow end-to-end runs; CI runs them)")
    parser.addoption("--without-vllm", action="store_true",
                     help=f"run as after the plain scripts/setup.sh: `import vllm` fails in this process and in the "
                          f"Python processes the tests start (also {WITHOUT_VLLM_ENV}=1); CI runs the default suite "
                          "so once")


def _hide_vllm(tmp: Path) -> None:
    """Make vLLM not installed for the session: ``sys.modules["vllm"] = None`` here (``import vllm`` raises,
    ``find_spec`` answers None) and, through a ``sitecustomize`` first on ``PYTHONPATH``, in every Python process
    a test starts."""
    sys.modules["vllm"] = None  # type: ignore[assignment]
    (tmp / "sitecustomize.py").write_text('import sys\nsys.modules["vllm"] = None\n')
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(tmp), os.environ.get("PYTHONPATH")) if p)
    os.environ[WITHOUT_VLLM_ENV] = "1"


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--without-vllm") or os.environ.get(WITHOUT_VLLM_ENV) == "1":
        import tempfile

        _hide_vllm(Path(tempfile.mkdtemp(prefix="ictrl-without-vllm-")))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The default run is the quick suite; `--integration` (CI) or an explicit `-m` selects the slow tests too.
    if not config.getoption("--integration") and not config.option.markexpr:
        # Markers, not keywords: keywords also hold the names of the directories above (a checkout in a folder
        # named "gpu" would skip every test).
        slow = [item for item in items if item.get_closest_marker("integration") is not None]
        if slow:
            config.hook.pytest_deselected(items=slow)
            items[:] = [item for item in items if item.get_closest_marker("integration") is None]
    from ictrl.vllm_env import INSTALL_HINT, installed

    if not installed():  # the plain set-up: tests of the real engine skip, the rest must pass
        skip_vllm = pytest.mark.skip(reason=f"needs vLLM ({INSTALL_HINT})")
        for item in items:
            if item.get_closest_marker("vllm") is not None:
                item.add_marker(skip_vllm)
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True)
def _selector_registry_isolated() -> Any:
    """A test (or a doc snippet run in-process) that registers a selector leaves the registry as it found it."""
    from ictrl.core import selection

    saved = dict(selection.SELECTORS), dict(selection._ALIASES)
    yield
    selection.SELECTORS.clear()
    selection.SELECTORS.update(saved[0])
    selection._ALIASES.clear()
    selection._ALIASES.update(saved[1])


# The README's rule on another statistic, as a user writes it beside their config (docs/method.md, "Write your own
# rule"); SEEN keeps what the trainer hands it, for the tests.
H2RULE = '''
from ictrl.core.selection import register_selector, top_fraction

SEEN = []


@register_selector("top_h2", needs=("renyi2",))
def top_h2(inputs, *, ratio=0.1):
    """The top `ratio` of each response's tokens by Renyi-2 entropy H2."""
    SEEN.append(inputs)
    return top_fraction(inputs.renyi2, inputs, ratio)
'''


@pytest.fixture
def h2rule(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The working directory ``tmp_path`` holding a user's ``h2rule.py`` (:data:`H2RULE`), importable as ``h2rule``
    as ``ictrl`` makes the working directory; forgotten again afterwards (the registry by the fixture above)."""
    (tmp_path / "h2rule.py").write_text(H2RULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    sys.modules.pop("h2rule", None)


@pytest.fixture(autouse=True)
def _no_process_group_left_behind() -> Any:
    """A test that initialises a default process group in this process (TRL's colocated vLLM set-up does, over the
    fake engine) destroys it at teardown, so the next test starts with none."""
    import torch.distributed as dist

    before = dist.is_available() and dist.is_initialized()
    yield
    if not before and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.exists():
        pytest.skip(f"benchmark files not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen2 checkpoint with the project's byte tokenizer, saved with save_pretrained."""
    from ictrl.models import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny_model"), seed=0)


def _digits_only(model_dir: Path) -> None:
    """Suppress every token but the digits and EOS in a saved model's generation config (HF generate honours it):
    a random tiny model then answers one-digit problems right about one time in ten."""
    from transformers import AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    config = GenerationConfig.from_pretrained(model_dir)
    eos = config.eos_token_id
    keep = {tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)} | set([eos] if isinstance(eos, int) else eos)
    config.suppress_tokens = [i for i in range(len(tokenizer)) if i not in keep]
    config.save_pretrained(model_dir)


@pytest.fixture(scope="session")
def digits_only() -> Any:
    """``digits_only(model_dir)``: make a saved model's generation answer only digits (see ``_digits_only``)."""
    return _digits_only


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
