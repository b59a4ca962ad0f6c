"""The one-pass training-forward path (ictrl.engine.stats_pass) on 2 CPU processes, DDP and FSDP2-sharded
(mp_worker.cpu_fsdp2: accelerate's fsdp2_prepare_model on gloo): the selection gathered across processes in the
loss, the no-grad statistics sweep over the sharded head, TRL's fused head and the sparse head with grad give the
masks, loss and parameters of one process running the separate statistics pass."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import mp_worker as w

SELECTORS = ("ict", "entropy", "all")  # ict: group JS + sparse head; entropy: TRL's fused head; all: no selection


@pytest.fixture(scope="module", params=["ddp", "fsdp2"])
def onepass_runs(request: pytest.FixtureRequest, tiny_model_dir: Path,
                 tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp(f"onepass_{request.param}")
    w.run_worker(out, tiny_model_dir, request.param, "onepass", SELECTORS)
    return out, request.param


@pytest.mark.integration
@pytest.mark.parametrize("selector", SELECTORS)
def test_two_process_one_pass_matches_one_process_separate_pass(onepass_runs: tuple[Path, str],
                                                                 tiny_model_dir: Path, tmp_path: Path,
                                                                 selector: str) -> None:
    out, engine = onepass_runs
    ranks = [torch.load(out / f"{engine}_{selector}_onepass_rank{r}.pt", weights_only=False) for r in (0, 1)]
    if engine == "fsdp2":
        assert ranks[0]["engine"].startswith("FSDP"), ranks[0]["engine"]
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
