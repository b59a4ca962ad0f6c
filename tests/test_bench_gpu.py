"""bench/bench_gpu.py runs end to end (its CPU smoke mode: a tiny model, every variant, the sweep, the profile)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.integration
def test_bench_gpu_tiny_cpu_smoke(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=f"{REPO / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    res = subprocess.run([sys.executable, str(REPO / "bench" / "bench_gpu.py"), "--tiny", "--device", "cpu",
                          "--steps", "2", "--out", str(out)], capture_output=True, text=True, env=env, timeout=900)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    data = json.loads(out.read_text())
    runs = data["shapes"]["tiny"]
    for variant in ("trl", "all", "ict", "ict+sparse"):
        assert runs[variant]["step_s"] > 0 and len(runs[variant]["step_times"]) == 2, variant
    assert runs["sweep"]["rows"] == 8 * 16 and runs["sweep"]["seconds"] > 0
    assert runs["ict"]["top_kernels"] and all(k["calls"] >= 1 for k in runs["ict"]["top_kernels"])
    md = out.with_suffix(".md").read_text()
    assert "| tiny |" in md and "ict / all" in md
    assert not list(tmp_path.glob("*.tmp*"))  # written atomically: no temporary left behind
