"""vLLM colocate and server modes on a GPU: bench/gpu_smoke.sh run as is, 3 ICT steps each with the ICT
score from vLLM's top-K log-probs and TRL's truncated importance sampling. Skipped without CUDA (conftest) or vLLM;
the server mode also needs a second GPU. Never run by the project so far: no GPU was available."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest

SMOKE = Path(__file__).resolve().parents[2] / "bench" / "gpu_smoke.sh"


def _run(mode: str, out: Path) -> list[dict]:
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed (pip install -e '.[vllm]')")
    env = dict(os.environ)  # keeps PYTHONPATH, so a worktree's src wins
    proc = subprocess.run(["bash", str(SMOKE), mode, str(out)], env=env, capture_output=True, text=True,
                          timeout=1800)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    if "SKIPPED" in proc.stdout:
        pytest.skip(proc.stdout.strip().splitlines()[-2])
    assert f"gpu_smoke {mode}: OK" in proc.stdout
    history = json.loads((out / mode / "log_history.json").read_text())
    return [h for h in history if "loss" in h]


@pytest.mark.gpu
@pytest.mark.integration
def test_vllm_colocate_three_ict_steps(tmp_path: Path) -> None:
    steps = _run("colocate", tmp_path)
    assert len(steps) == 3
    assert all("ictrl/is_ratio_mean" in h for h in steps)


@pytest.mark.gpu
@pytest.mark.integration
def test_vllm_server_three_ict_steps(tmp_path: Path) -> None:
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("server mode needs 2 GPUs (one for vllm serve, one for training)")
    steps = _run("server", tmp_path)
    assert len(steps) == 3
    assert all("ictrl/is_ratio_mean" in h for h in steps)
