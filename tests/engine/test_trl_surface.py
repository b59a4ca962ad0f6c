"""What ictrl swaps at run time or reads privately in TRL, accelerate and transformers, checked on the installed
versions without building a trainer: each test fails when the thing a row of docs/architecture.md's TRL-surface
table relies on is renamed, re-signed, or no longer looked up where the swap can reach it. Run on every TRL minor
pyproject declares (``.ci/run``: the TRL contract step)."""

from __future__ import annotations

import inspect
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]


def _params(fn: object) -> list[str]:
    return list(inspect.signature(fn).parameters)  # type: ignore[arg-type]


def test_installed_trl_is_in_the_range_pyproject_declares() -> None:
    import trl

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]
    (spec,) = [Requirement(d).specifier for d in deps if Requirement(d).name == "trl"]
    assert Version(trl.__version__) in spec, f"trl {trl.__version__} is outside pyproject's trl{spec}"


def test_fused_head_is_looked_up_where_the_swap_replaces_it() -> None:
    """``stats_source.fused_head_with_sum_sq`` replaces ``grpo_trainer.add_fused_lm_head`` while ``__init__`` runs."""
    import trl.trainer.grpo_trainer as grpo
    from trl.trainer.utils import add_fused_lm_head

    assert grpo.add_fused_lm_head is add_fused_lm_head
    assert _params(add_fused_lm_head) == ["model", "temperature", "cast_lm_head_to_fp32", "outputs"]
    init = inspect.getsource(grpo.GRPOTrainer.__init__)
    assert 'outputs=("log_probs", "entropy")' in init  # the policy's head: the one the swap widens
    assert "log_sum_sq_probs" in inspect.getsource(add_fused_lm_head)


def test_checkpoint_path_comes_from_get_output_dir() -> None:
    """``resumable.Resumable.save_checkpoint`` points ``_get_output_dir`` at the staging directory for one save."""
    from transformers import Trainer

    assert _params(Trainer._get_output_dir) == ["self", "trial"]
    assert "run_dir = self._get_output_dir(trial=trial)" in inspect.getsource(Trainer._save_checkpoint)


def test_vllm_generation_has_what_ictrl_replaces_and_reads() -> None:
    """``vllm_engine.building_engine`` (``LLM``, ``init_communicator``), ``vllm_engine.engine_built``
    (``sync_weights``) and ``vllm_engine.full_state_dict`` (``_iter_named_params``)."""
    from trl import GRPOTrainer
    from trl.generation import vllm_generation
    from trl.generation.vllm_client import VLLMClient

    gen = vllm_generation.VLLMGeneration
    assert _params(gen.sync_weights) == ["self"] and _params(gen._iter_named_params) == ["self"]
    assert re.search(r"self\.llm = LLM\(", inspect.getsource(gen._init_vllm))  # the module global building_engine swaps
    assert _params(VLLMClient.init_communicator) == ["self", "device"]
    turn = inspect.getsource(GRPOTrainer._generate_single_turn)
    assert "self.vllm_generation.sync_weights()" in turn


@pytest.mark.parametrize("attribute, method, pattern", [
    ("_metrics", "__init__", r'self\._metrics = \{"train": defaultdict\(list\), "eval": defaultdict\(list\)\}'),
    ("_buffered_inputs", "_prepare_inputs", r"inputs = self\._buffered_inputs\[self\._step % "),
], ids=["_metrics", "_buffered_inputs"])
def test_private_attributes_ictrl_reads_are_set_as_it_reads_them(attribute: str, method: str, pattern: str) -> None:
    """TRL's per-mode metric lists (the ``ictrl/*`` metrics go in them) and its buffer of micro-batches (the
    normalisers attach when it is refilled)."""
    from trl import GRPOTrainer

    assert re.search(pattern, inspect.getsource(getattr(GRPOTrainer, method))), attribute


def test_the_private_methods_ictrl_overrides_are_the_documented_five() -> None:
    """docs/architecture.md, "What ictrl overrides in TRL": a new override of a private TRL or transformers method
    goes in its table and count first."""
    from trl import GRPOTrainer

    from ictrl.engine.trainer import ICTGRPOTrainer

    overridden = {name for name in vars(ICTGRPOTrainer)
                  if name.startswith("_") and not name.startswith("__") and hasattr(GRPOTrainer, name)}
    assert overridden == {"_generate_and_score_completions", "_compute_loss",
                          "_calculate_rewards", "_get_train_sampler", "_save_checkpoint"}
