"""DeepSpeed ZeRO-2 / ZeRO-3 on 2 processes: the same equality with one process as test_fsdp / test_multiprocess.

GPU-marked: never run by this project. On the project's CPU machines DeepSpeed 0.19.8 itself runs ZeRO-2 and ZeRO-3
steps with gloo (``deepspeed.initialize`` + backward + step, after JIT-building its shm comm op: 260 s the first
time), but through the Trainer accelerate 1.15 enables DeepSpeed only for a non-CPU Accelerator, and with
``use_cpu=False`` on CPU processes TRL's first ``accelerator.gather`` fails with ``RuntimeError:
ProcessGroupGloo::allgather: invalid output tensor list at index 0 (expected length 2, got 1)`` (accelerate's state
counts one process under DeepSpeed on CPU). The ZeRO-3 head path (``ictrl.engine.heads.call_head``: the sparse
head runs as the head module's forward so DeepSpeed's hooks gather its weight) is therefore unproven; docs/scale.md.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import mp_worker as w


@pytest.mark.gpu
@pytest.mark.integration
@pytest.mark.parametrize("engine", ["zero2", "zero3"])
def test_zero_two_processes_match_one(engine: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    w.run_worker(tmp_path, tiny_model_dir, engine, "step")
    for selector in w.SELECTORS:
        w.compare_step(tmp_path, str(tiny_model_dir), engine, selector)
