"""Every distributed engine on two CPU processes (gloo, through ``accelerate launch``) against one process: DDP,
FSDP2 (``fully_shard``, DTensor), DeepSpeed ZeRO-2 and ZeRO-3.

For each engine one launch trains one step per selector (masks, advantages, losses and parameters equal to one
process, and the final HF-format model equal to the trained parameters), one step per selector on the one-pass
training-forward path (``ictrl.engine.onepass``; the selection gathered across processes in the loss) and a run
that every process leaves abruptly right after checkpoint-1; a second launch resumes it to step 2, which must
equal two uninterrupted steps on one process.

Fair comparison: generation is the deterministic stub of ``mp_worker`` (sampling RNG differs per process), so both
runs see the same 2 prompts x 4 completions. The 2-process run has per_device_train_batch_size 2 and gradient
accumulation 2 (each process holds one whole group), the 1-process run one micro-batch of 8: the same optimizer
batch. SGD without clipping makes the parameter change the gradient itself (momentum 0.9 in the resume run, so the
optimizer state must come back too).

Engine set-up on CPU (``mp_worker``): FSDP2 flips accelerate's state to FSDP after the Trainer builds it
(``cpu_fsdp2``: accelerate 1.15 shards only GPU-like processes); ZeRO-2/3 need no patch, only ``use_cpu=True``
(``zero_args``), with ZeRO-3 partitioning every parameter so that the head reaches ``call_head`` as a shard.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import mp_worker as w

ENGINES = ("ddp", "fsdp2", "zero2", "zero3")
WRAPPER = {"ddp": "DistributedDataParallel", "fsdp2": "FSDP", "zero2": "ZeRO-2", "zero3": "ZeRO-3"}


@pytest.fixture(scope="module", params=ENGINES)
def runs(request: pytest.FixtureRequest, tiny_model_dir: Path,
         tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    engine = request.param
    out = tmp_path_factory.mktemp(engine)
    for phases in ("step+onepass+kill", "resume"):
        w.run_worker(out, tiny_model_dir, engine, phases)
    return out, engine


def _ranks(out: Path, name: str) -> list[dict]:
    return [torch.load(out / f"{name}_rank{r}.pt", weights_only=False) for r in (0, 1)]


@pytest.mark.integration
@pytest.mark.parametrize("selector", w.SELECTORS)
def test_two_processes_match_one(runs: tuple[Path, str], tiny_model_dir: Path, selector: str) -> None:
    out, engine = runs
    ranks = _ranks(out, f"{engine}_{selector}")
    assert all(r["engine"].startswith(WRAPPER[engine]) for r in ranks), [r["engine"] for r in ranks]
    diffs = w.compare_step(out, str(tiny_model_dir), engine, selector)
    print(f"{engine} {selector} max abs diff: {diffs}")
    # run.save_final on every rank: the whole model gathered from shards (FSDP2 checkpoints are sharded; ZeRO-3
    # gathers partitions) or taken from one replica.
    final = w.initial_params(str(out / f"final_{engine}_{selector}"))
    assert w.max_param_diff(final, ranks[0]["params"]) == 0.0


@pytest.mark.integration
@pytest.mark.parametrize("runs", ["zero3"], indirect=True)
def test_zero3_head_is_gathered_from_partitions(runs: tuple[Path, str]) -> None:
    """ZeRO-3's branch of ``call_head`` ran on a partitioned head: the statistics sweep and the sparse head (ict,
    also on the one-pass path) and the statistics sweep before TRL's fused head (entropy) saw the weight as a shard
    on entry (and the steps matched one process, the tests above and below)."""
    out, engine = runs
    for name in ("ict", "entropy", "ict_onepass"):
        for r in _ranks(out, f"{engine}_{name}"):
            heads = r["heads"]
            assert heads and all(h["ds"] for h in heads), heads
            assert all(h["numel"] < h["full"] for h in heads), heads  # a shard on entry: only the gather helps


@pytest.mark.integration
def test_kill_after_checkpoint_and_resume_matches_one_process(runs: tuple[Path, str], tiny_model_dir: Path) -> None:
    out, engine = runs
    checkpoint = out / f"run_{engine}" / "checkpoint-1"
    names = [p.name for p in checkpoint.iterdir()]
    if engine == "fsdp2":  # torch.distributed.checkpoint shards, not a full state dict
        assert any(n.startswith("pytorch_model_fsdp") for n in names), names
    if engine.startswith("zero"):  # DeepSpeed's engine checkpoint (partitioned optimizer states)
        assert "global_step1" in names, names
    print(f"{engine} resume max abs param diff: {w.compare_resume(out, str(tiny_model_dir), engine)}")


@pytest.mark.integration
@pytest.mark.parametrize("selector", w.ONEPASS_SELECTORS)
def test_one_pass_on_two_processes_matches_one_process_separate_pass(runs: tuple[Path, str], tiny_model_dir: Path,
                                                                     tmp_path: Path, selector: str) -> None:
    out, engine = runs
    ranks = _ranks(out, f"{engine}_{selector}_onepass")
    assert all(r["engine"].startswith(WRAPPER[engine]) for r in ranks), [r["engine"] for r in ranks]
    assert all(r["paths"] == [2.0] for r in ranks)  # the training-forward path ran on every process
    single = w.run_one_step(tmp_path, str(tiny_model_dir), selector, per_device=8, grad_accum=1)
    assert single["paths"] == [0.0] and len(single["losses"]) == 1
    ref = single["batches"][0]
    T = ref["completion_ids"].size(1)
    got = torch.zeros_like(ref["ictrl_selected"])
    for r in ranks:
        (sel, row), = r["selected"]
        got[row] = w._pad(sel, T, False)  # the micro-batch's rows back to their place in the generation batch
    mask = ref["completion_mask"].bool()
    assert torch.equal(got & mask, ref["ictrl_selected"] & mask)
    if selector != "all":
        assert 0 < int((got & mask).sum()) < int(mask.sum())
    loss = abs(sum(r["losses"][0] for r in ranks) / 2 - single["losses"][0])
    assert loss <= 1e-5, loss
    params = max(w.max_param_diff(r["params"], single["params"]) for r in ranks)
    assert params <= 1e-5, params
    assert w.max_param_diff(single["params"], w.initial_params(str(tiny_model_dir))) > 1e-3
