"""selection_topk from generation on 2 processes (DDP on CPU through accelerate launch): each process records the
top-K of its own rows while generating, and the selection runs on the gathered batch. Real sampling differs per
process, so this checks the run (both steps from the sampler, finite, a sparse selection), not equality with one
process (tests/engine/test_topk_sampler.py checks the recorded score against the exact one)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

import mp_worker as w

TINY = w.REPO_ROOT / "configs" / "tiny" / "ict.yaml"


@pytest.mark.integration
def test_two_processes_take_topk_from_generation(tmp_path: Path) -> None:
    assert subprocess.run([sys.executable, "-m", "ictrl", "tiny-model", "runs/tiny-model", "--untrained"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120).returncode == 0
    proc = w.launch(["-m", "ictrl", "train", str(TINY), "--selection_topk=8", "--save_strategy=no", "--max_steps=2",
                     "--prompts_per_step=4", "--num_generations=4", "--per_device_train_batch_size=8",
                     "--max_completion_length=32", "--num_iterations=1"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "runs" / "tiny" / "ict" / "metrics.jsonl").read_text()
            .splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["ictrl/topk_from_sampler"] == 1.0 and 0 < r["ictrl/selected_frac"] < 0.5
        assert r["ictrl/ict_score/all"] > 0 and math.isfinite(r["loss"])
