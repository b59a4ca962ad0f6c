"""What ``--resume`` compares besides the config (``run_inputs.input_hashes``): the base model's files and a
reward's code, its own module and the local modules it imports (``reward_sources.local_sources``)."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from ictrl.errors import ConfigError


@pytest.fixture
def user_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A reward module importing local code four ways (a module, a package's submodule through a relative import,
    a module imported inside the function), beside the standard library and installed packages."""
    code = tmp_path / "code"
    (code / "graders").mkdir(parents=True)
    (code / "graders" / "__init__.py").write_text("from .exact import same\n")
    (code / "graders" / "exact.py").write_text("def same(a, b):\n    return a == b\n")
    (code / "c1_helper.py").write_text("WEIGHT = 1.0\n")
    (code / "c1_late.py").write_text("BONUS = 0.0\n")
    (code / "c1_reward.py").write_text(
        "import json, os\nimport numpy\nimport ictrl.rewards\nfrom c1_helper import WEIGHT\nfrom graders import same\n"
        "def score(prompts=None, completions=None, **kw):\n    import c1_late\n"
        "    return [WEIGHT + c1_late.BONUS] * len(completions)\n")
    monkeypatch.syspath_prepend(str(code))
    yield code
    for name in ("c1_reward", "c1_helper", "c1_late", "graders", "graders.exact"):
        sys.modules.pop(name, None)


def test_the_local_modules_a_reward_imports_are_found(user_code: Path) -> None:
    import c1_reward  # type: ignore[import-not-found]

    from ictrl.train_cli.reward_sources import local_sources

    found = local_sources(c1_reward)
    assert found == {"c1_reward": user_code / "c1_reward.py", "c1_helper": user_code / "c1_helper.py",
                     "c1_late": user_code / "c1_late.py", "graders": user_code / "graders" / "__init__.py",
                     "graders.exact": user_code / "graders" / "exact.py"}


def test_resume_refuses_a_changed_imported_module_or_model_and_names_it(user_code: Path, tmp_path: Path,
                                                                       tiny_model_dir: Path,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    import shutil

    from datasets import Dataset

    import c1_reward  # type: ignore[import-not-found]

    from ictrl.train_cli.run_inputs import input_hashes, inputs_record

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    rows = Dataset.from_list([{"prompt": "1+1?", "answer": "2"}])
    first = input_hashes(rows, [c1_reward.score], str(model))
    assert set(first) == {"data", "model", "reward score", "reward score imports c1_helper",
                          "reward score imports c1_late", "reward score imports graders",
                          "reward score imports graders.exact"}
    out = tmp_path / "out"
    out.mkdir()
    (out / "run.json").write_text(json.dumps(inputs_record(out, first, None, False)))

    def resume(**kwargs: Any) -> dict[str, Any]:
        return inputs_record(out, input_hashes(rows, [c1_reward.score], str(model)), 3, **kwargs)

    (user_code / "graders" / "exact.py").write_text("def same(a, b):\n    return a.strip() == b.strip()\n")
    with pytest.raises(ConfigError, match=r"--resume: the source of module graders\.exact \(imported by reward "
                                          r"score\) changed since the run started; .* or pass "
                                          r"--accept-changed-inputs \(or --resume-inexact\)"):
        resume(accept=False)
    (user_code / "graders" / "exact.py").write_text("def same(a, b):\n    return a == b\n")
    (model / "config.json").write_text((model / "config.json").read_text().replace("{", '{"rope_theta": 7.0, ', 1))
    with pytest.raises(ConfigError, match=r"the model of model_name_or_path \(its files: the base and reference "
                                          r"model\) changed"):
        resume(accept=False)
    with caplog.at_level(logging.WARNING, logger="ictrl.train"):
        record = resume(accept=True, flag="--resume-inexact")
    assert record["changed_inputs"] == [{"step": 3, "changed": ["model"], "flag": "--resume-inexact"}]
    assert "--resume: continuing on changed inputs (the model of model_name_or_path (its files: the base and " \
           "reference model)) under --resume-inexact: the result will differ from an uninterrupted run" in caplog.text


def test_a_cached_hub_id_is_known_by_the_snapshot_its_main_resolves_to(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A hub id's model is the snapshot the local cache resolves ``main`` to, digested as a folder: a new revision
    fetched behind the same name (another config) is a change; the same files under another commit are not; a hub
    id with nothing cached has no model record (its name in config.yaml stands for it)."""
    import huggingface_hub.constants
    from datasets import Dataset

    from ictrl.checkpoints import model_digest
    from ictrl.train_cli.run_inputs import input_hashes

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    repo, rows = tmp_path / "hub" / "models--org--tiny", Dataset.from_dict({"prompt": ["1+1?"]})

    def snapshot(commit: str, config: str) -> None:
        folder = repo / "snapshots" / commit
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(config)
        (folder / "model.safetensors").write_bytes(b"weights")
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(commit)

    assert "model" not in input_hashes(rows, [], "org/tiny")
    snapshot("a" * 40, '{"vocab_size": 64}')
    first = input_hashes(rows, [], "org/tiny")["model"]
    assert first == model_digest(repo / "snapshots" / ("a" * 40))
    snapshot("b" * 40, '{"vocab_size": 64}')
    assert input_hashes(rows, [], "org/tiny")["model"] == first
    snapshot("c" * 40, '{"vocab_size": 65}')
    assert input_hashes(rows, [], "org/tiny")["model"] != first
