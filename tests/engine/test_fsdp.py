"""FSDP2 on two CPU processes (gloo): the trainer's real code path on DTensor-sharded parameters matches one
unsharded process, and a sharded (torch.distributed.checkpoint) checkpoint resumes exactly.

accelerate 1.15 will not shard CPU processes, so ``mp_worker.cpu_fsdp2`` flips the accelerator's state to FSDP
after the Trainer builds it from ``fsdp_config`` (version 2, transformer-based wrap, SHARDED_STATE_DICT); from
there accelerate's own ``fsdp2_prepare_model`` shards the model (each Qwen2DecoderLayer, then the tail
[norm, tied embedding/LM head], then the root) and the Trainer's FSDP save/load code writes and reads the
checkpoints. The statistics pass, selection, loss, sparse head (``sparse_backward=True`` here) and optimizer step
are the code a GPU launch runs; what only a GPU run can show is in docs/scale.md.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import mp_worker as w


@pytest.fixture(scope="module")
def fsdp_runs(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fsdp2")
    for phases in ("step+kill", "resume"):
        w.run_worker(out, tiny_model_dir, "fsdp2", phases)
    return out


@pytest.mark.integration
@pytest.mark.parametrize("selector", w.SELECTORS)
def test_fsdp2_two_processes_match_one(fsdp_runs: Path, tiny_model_dir: Path, selector: str) -> None:
    result = torch.load(fsdp_runs / f"fsdp2_{selector}_rank0.pt", weights_only=False)
    assert result["engine"].startswith("FSDP"), result["engine"]  # really sharded, not a DDP fallback
    diffs = w.compare_step(fsdp_runs, str(tiny_model_dir), "fsdp2", selector)
    print(f"fsdp2 {selector} max abs diff: {diffs}")
    # The final save (run.save_final on every rank) gathers a full HF-format model from the sharded one, though
    # checkpoints are SHARDED_STATE_DICT.
    final = w.initial_params(str(fsdp_runs / f"final_fsdp2_{selector}"))
    assert w.max_param_diff(final, result["params"]) == 0.0


@pytest.mark.integration
def test_fsdp2_sharded_checkpoint_kill_and_resume(fsdp_runs: Path, tiny_model_dir: Path) -> None:
    checkpoint = fsdp_runs / "run_fsdp2" / "checkpoint-1"
    assert any(p.name.startswith("pytorch_model_fsdp") for p in checkpoint.iterdir()), sorted(checkpoint.iterdir())
    print(f"fsdp2 resume max abs param diff: {w.compare_resume(fsdp_runs, str(tiny_model_dir), 'fsdp2')}")
