"""Two CPU processes (torchrun, gloo) give the same masks, losses and parameters as one process.

Fair comparison: generation is the deterministic stub of ``mp_worker`` (sampling RNG differs per process), so both
runs see the same 2 prompts × 4 completions. The 2-process run has per_device_train_batch_size 2 and gradient
accumulation 2 (each process holds one whole group), the 1-process run one micro-batch of 8: the same optimizer
batch. SGD without clipping makes the parameter change the gradient itself.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import mp_worker as w

SELECTORS = ("ict", "entropy", "random")  # group JS, a batch-scope threshold + token mean, a seeded draw
WORKER = Path(w.__file__)


def _free_port() -> int:
    # torchrun's static rendezvous hangs on --master_port 0, so hand it a port that was free a moment ago.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _pad(x: torch.Tensor, T: int, value: int | bool) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, T - x.size(1)), value=value)


@pytest.mark.integration
def test_two_processes_match_one(tiny_model_dir: Path, tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(_free_port()), str(WORKER), str(tmp_path), str(tiny_model_dir), ",".join(SELECTORS), "2", "2"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    from transformers import AutoModelForCausalLM

    initial = dict(AutoModelForCausalLM.from_pretrained(tiny_model_dir).named_parameters())
    for selector in SELECTORS:
        ranks = [torch.load(tmp_path / f"{selector}_rank{r}.pt", weights_only=False) for r in (0, 1)]
        assert [r["world"] for r in ranks] == [2, 2]
        single = w.run_one_step(tmp_path / f"single_{selector}", str(tiny_model_dir), selector, per_device=8,
                                grad_accum=1)
        assert single["world"] == 1
        ref = single["batches"][0]
        T = ref["completion_ids"].size(1)
        padding = ref["completion_mask"] == 0
        pad_id = int(ref["completion_ids"][padding][0]) if bool(padding.any()) else 0
        parts = [r["batches"][0] for r in ranks]
        assert all(p["completion_ids"].size(0) == 4 for p in parts)  # one whole group per process
        assert torch.equal(torch.cat([_pad(p["completion_ids"], T, pad_id) for p in parts]), ref["completion_ids"])
        torch.testing.assert_close(torch.cat([p["advantages"] for p in parts]), ref["advantages"])
        mask_2p = torch.cat([_pad(p["ictrl_selected"], T, False) for p in parts])
        assert torch.equal(mask_2p, ref["ictrl_selected"]), selector
        assert 0 < int(ref["ictrl_selected"].sum()) < int(ref["completion_mask"].sum())

        # DDP averages the processes' gradients: the single loss is the mean over processes of their summed
        # micro-batch losses.
        assert [len(r["losses"]) for r in ranks] == [2, 2] and len(single["losses"]) == 1
        assert abs(sum(sum(r["losses"]) for r in ranks) / 2 - single["losses"][0]) < 1e-6

        for name, value in single["params"].items():
            for r in ranks:
                torch.testing.assert_close(r["params"][name], value, atol=1e-6, rtol=1e-5, msg=f"{selector} {name}")
        moved = max((single["params"][k] - v.detach()).abs().max().item() for k, v in initial.items())
        assert moved > 1e-3, selector
