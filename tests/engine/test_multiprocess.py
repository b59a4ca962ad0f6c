"""DDP through ``accelerate launch``: two CPU processes (gloo) give the same masks, advantages, losses and parameters
as one process, and a run killed after its first checkpoint resumes to the one-process result.

Fair comparison: generation is the deterministic stub of ``mp_worker`` (sampling RNG differs per process), so both
runs see the same 2 prompts x 4 completions. The 2-process run has per_device_train_batch_size 2 and gradient
accumulation 2 (each process holds one whole group), the 1-process run one micro-batch of 8: the same optimizer
batch. SGD without clipping makes the parameter change the gradient itself (momentum 0.9 in the resume run, so the
optimizer state must come back too).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import mp_worker as w


@pytest.fixture(scope="module")
def ddp_runs(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ddp")
    for phases in ("step+kill", "resume"):
        w.run_worker(out, tiny_model_dir, "ddp", phases)
    return out


@pytest.mark.integration
@pytest.mark.parametrize("selector", w.SELECTORS)
def test_ddp_two_processes_match_one(ddp_runs: Path, tiny_model_dir: Path, selector: str) -> None:
    diffs = w.compare_step(ddp_runs, str(tiny_model_dir), "ddp", selector)
    print(f"ddp {selector} max abs diff: {diffs}")
    result = torch.load(ddp_runs / f"ddp_{selector}_rank0.pt", weights_only=False)
    final = w.initial_params(str(ddp_runs / f"final_ddp_{selector}"))  # run.save_final, called on every rank
    assert w.max_param_diff(final, result["params"]) == 0.0


@pytest.mark.integration
def test_ddp_kill_and_resume_matches_one_process(ddp_runs: Path, tiny_model_dir: Path) -> None:
    assert (ddp_runs / "run_ddp" / "checkpoint-1").is_dir()
    print(f"ddp resume max abs param diff: {w.compare_resume(ddp_runs, str(tiny_model_dir), 'ddp')}")
