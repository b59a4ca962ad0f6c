"""The hand-written Triton kernel of the group JS sweep against the float64 reference.

Without a GPU the kernel runs on CPU tensors under Triton's interpreter. TRITON_INTERPRET must be set before the
kernel is defined, and other tests in this process may have imported triton already, so
``test_kernel_under_the_interpreter`` reruns this file in a subprocess with TRITON_INTERPRET=1, where the case
tests below run (in the parent they are skipped). On a CUDA machine they run on the GPU as well (marked gpu).
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from test_stats import GROUPS6, assert_matches, make_case

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
pytest.importorskip("triton")

from ictrl.core.checks import raise_failed_device_checks  # noqa: E402
from ictrl.core.stats import group_js_divergence, token_stats  # noqa: E402


def _devices() -> list:
    devs = []
    if INTERPRETED:
        devs.append("cpu")
    devs.append(pytest.param("cuda", marks=pytest.mark.gpu))
    return devs


cases = pytest.mark.parametrize("device", _devices())


def _stats(logits, mask, tokens, device, **kw):
    dev = lambda x: x.to(device) if x is not None else None  # noqa: E731
    st = token_stats(dev(logits), dev(mask), dev(tokens), backend="triton", **{k: dev(v) if isinstance(v, torch.Tensor)
                                                                               else v for k, v in kw.items()})
    for f in ("entropy", "renyi2", "purity", "logprob", "prob", "ict_score"):
        setattr(st, f, getattr(st, f).cpu())
    return st


@pytest.mark.skipif(INTERPRETED, reason="this is the parent: it starts the interpreter run")
@pytest.mark.skipif(sys.platform == "win32", reason="subprocess env")
def test_kernel_under_the_interpreter() -> None:
    env = dict(os.environ, TRITON_INTERPRET="1")  # keeps PYTHONPATH: the worktree's code runs
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W",
                          "ignore::RuntimeWarning", __file__], capture_output=True, text=True, env=env,
                         cwd=Path(__file__).parent, timeout=600)
    tail = res.stdout[-3000:] + res.stderr[-2000:]
    assert res.returncode == 0, tail
    passed = re.search(r"(\d+) passed", res.stdout)
    assert passed and int(passed.group(1)) >= 11 and "failed" not in res.stdout, tail  # every CPU case ran


@cases
def test_random_ragged_and_non_adjacent_groups(device) -> None:
    logits, mask, tokens = make_case(B=6, T=9, seed=8)
    mask[:] = torch.arange(9).unsqueeze(0) < torch.tensor([9, 4, 0, 9, 6, 3]).unsqueeze(1)  # one empty response
    st = _stats(logits, mask, tokens, device, group_ids=GROUPS6)
    assert_matches(st, logits, mask, tokens, group_ids=GROUPS6)
    assert (st.ict_score[0, 6:] == 0).all() and (st.ict_score[0, :6] > 0).all()  # alone at t >= 6
    assert (st.ict_score[5] == 0).all()  # a group of one


@cases
@pytest.mark.parametrize("temperature", [0.7, 1.5])
def test_temperature(device, temperature) -> None:
    logits, mask, tokens = make_case(seed=6)
    st = _stats(logits, mask, tokens, device, temperature=temperature, group_ids=GROUPS6)
    assert_matches(st, logits, mask, tokens, temperature=temperature, group_ids=GROUPS6)


@cases
def test_ties_and_neg_inf(device) -> None:
    g = torch.Generator().manual_seed(4)
    logits = torch.randint(-2, 3, (6, 5, 40), generator=g).float()  # equal logits and equal maxima
    logits[torch.rand(logits.shape, generator=g) < 0.3] = -math.inf
    logits[1, 2] = -math.inf
    logits[1, 2, 7] = 1.0  # one-hot row
    mask = torch.ones(6, 5, dtype=torch.bool)
    tokens = torch.where(torch.isfinite(logits.gather(-1, torch.zeros(6, 5, 1, dtype=torch.long))).squeeze(-1), 0,
                         logits.argmax(-1))
    st = _stats(logits, mask, tokens, device, group_ids=GROUPS6)
    assert_matches(st, logits, mask, tokens, group_ids=GROUPS6)
    assert st.entropy[1, 2] == 0 and st.purity[1, 2] == 1


@cases
def test_large_group_bf16_and_members_ending(device) -> None:
    g = torch.Generator().manual_seed(19)
    B, T, V = 20, 9, 300  # one group of 17 (padded to 32), one of 3; V spans several tiles
    logits = (torch.randn(B, T, V, generator=g) * 3).bfloat16()
    tokens = torch.randint(0, V, (B, T), generator=g)
    mask = torch.arange(T).unsqueeze(0) < torch.randint(1, T + 1, (B,), generator=g).unsqueeze(1)
    groups = torch.zeros(B, dtype=torch.long)
    groups[::7] = 1
    st = _stats(logits, mask, tokens, device, group_ids=groups)
    assert_matches(st, logits.float(), mask, tokens, group_ids=groups, atol=1e-4, rtol=1e-4)


@cases
def test_identical_members_and_two_point_extreme(device) -> None:
    logits = torch.full((2, 1, 4), -math.inf)
    logits[0, 0, 0] = 0.0
    logits[1, 0, 1] = 0.0
    u = group_js_divergence(logits.to(device), torch.ones(2, 1, dtype=torch.bool).to(device),
                            torch.tensor([5, 5]).to(device), backend="triton").cpu()
    want = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25)) - 0.5 * math.log(2.0)
    torch.testing.assert_close(u, torch.full((2, 1), want))
    same = torch.randn(1, 3, 50).expand(4, 3, 50).contiguous()
    u2 = group_js_divergence(same.to(device), torch.ones(4, 3, dtype=torch.bool).to(device),
                             torch.zeros(4, dtype=torch.long).to(device), backend="triton").cpu()
    assert u2.abs().max() < 1e-6


@cases
def test_non_finite_active_logit_raises_masked_may_hold_anything(device) -> None:
    logits, mask, tokens = make_case(seed=21)
    mask[4, 2] = True
    logits[4, 2, 11] = math.nan
    with pytest.raises(ValueError, match=r"\(row 4, position 2\): nan"):
        _stats(logits, mask, tokens, device, group_ids=GROUPS6)
    mask[4, 2] = False
    st = _stats(logits, mask, tokens, device, group_ids=GROUPS6)
    clean = torch.where(mask.unsqueeze(-1), logits, torch.zeros(()))
    assert_matches(st, clean, mask, tokens, group_ids=GROUPS6)


@pytest.fixture
def small_slices(monkeypatch):
    """Tiles of 16 logits and slices of 32: V = 97 spans 4 slices (the last partial), 7 tiles."""
    from ictrl.core.kernels import group_js_triton

    monkeypatch.setattr(group_js_triton, "TILE", 128)
    monkeypatch.setattr(group_js_triton, "SPLIT_V", 32)


@cases
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_many_vocabulary_slices_ragged_ties_bf16(device, temperature, small_slices) -> None:
    logits, mask, tokens = make_case(B=6, T=9, seed=31)
    logits[2, 3] = torch.round(logits[2, 3])  # ties inside a row, across slice borders
    logits[0, 1, 40:] = -math.inf  # whole slices of -inf
    tokens[0, 1] = 3
    mask[:] = torch.arange(9).unsqueeze(0) < torch.tensor([9, 2, 5, 9, 1, 7]).unsqueeze(1)
    st = _stats(logits, mask, tokens, device, group_ids=GROUPS6, temperature=temperature)
    assert_matches(st, logits, mask, tokens, temperature=temperature, group_ids=GROUPS6)
    half = logits.bfloat16()
    st = _stats(half, mask, tokens, device, group_ids=GROUPS6, temperature=temperature)
    assert_matches(st, half.float(), mask, tokens, temperature=temperature, group_ids=GROUPS6, atol=1e-4, rtol=1e-4)


@cases
def test_group_size_path_shuffled_rows_and_one_active_response(device, small_slices) -> None:
    """group_size (the trainer's layout: equal groups, rows in any order) plans without reading group_ids."""
    logits, mask, tokens = make_case(B=8, T=6, seed=33)
    groups = torch.tensor([3, 1, 1, 3, 3, 1, 3, 1])  # two groups of 4, interleaved
    mask[:] = torch.arange(6).unsqueeze(0) < torch.tensor([6, 3, 1, 2, 2, 1, 1, 1]).unsqueeze(1)
    st = _stats(logits, mask, tokens, device, group_ids=groups, group_size=4)
    assert_matches(st, logits, mask, tokens, group_ids=groups)
    assert (st.ict_score[:, 2:] == 0).all()  # from t = 2 one response per group is active (rows 0, 1)
    assert (st.ict_score[[0, 3], :2] > 0).all()
    bad = tokens.clone()
    bad[0, 0] = logits.shape[-1]
    nan = logits.clone()
    nan[1, 0, 5] = math.nan
    for inputs, tok, says in ((logits, bad, r"tokens at masked-in positions must lie in \[0, 97\)"),
                              (nan, tokens, "NaN or \\+inf logit")):
        if device == "cpu":  # the device check raises at once
            with pytest.raises(ValueError, match=says):
                _stats(inputs, mask, tok, device, group_ids=groups, group_size=4)
            continue
        # CUDA: no device-side assert (it would poison the context); the check is deferred and raised when read.
        got = _stats(inputs, mask, tok, device, group_ids=groups, group_size=4)
        with pytest.raises(ValueError, match=says):
            raise_failed_device_checks()
        if tok is bad:  # the bad id reads as id 0; every other output is the clean call's
            torch.testing.assert_close(got.entropy, st.entropy)
            want = torch.log_softmax(logits[0, 0].double(), -1)[0].float()
            torch.testing.assert_close(got.logprob[0, 0], want, atol=1e-5, rtol=1e-5)
    raise_failed_device_checks()  # nothing left pending
    assert torch.ones(3, device=device).sum().item() == 3  # the device still works


@cases
def test_multi_block_sweep_from_a_bounded_budget_matches_the_reference(device, monkeypatch) -> None:
    """The trainer's statistics pass (hidden_stats with group_size, the triton backend) over several position
    blocks of a bounded sweep: ragged masks, one active response per group, temperature != 1."""
    import contextlib

    from ictrl.core import stats as core_stats
    from ictrl.engine.stats_source import Request, Sweep, hidden_stats

    monkeypatch.setenv("ICTRL_STATS_BACKEND", "triton")
    g = torch.Generator().manual_seed(41)
    B, T, H, V, G = 8, 11, 16, 97, 4
    head = torch.nn.Linear(H, V, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(V, H, generator=g))
    hidden = torch.randn(B, T, H, generator=g)
    ids = torch.randint(0, V, (B, T), generator=g)
    mask = torch.arange(T).unsqueeze(0) < torch.tensor([11, 3, 1, 7, 11, 2, 5, 1]).unsqueeze(1)
    groups = torch.tensor([0, 1, 0, 1, 1, 0, 1, 0])
    head, hidden, ids, mask, groups = (x.to(device) for x in (head, hidden, ids, mask, groups))
    # A budget of 2 positions' logits (B * 2 rows of V fp32): 6 blocks, the last partial.
    budget = B * 2 * V * 4
    monkeypatch.setattr(core_stats, "SWEEP_BYTES", budget)
    monkeypatch.setattr(core_stats, "CPU_SWEEP_ROWS", B * 2)
    assert core_stats.sweep_rows(None, V, torch.device(device), itemsize=4) * V * 4 <= budget
    req = Request(mask, ids, groups, group_size=G)
    st, js = hidden_stats(head, hidden, req, Sweep(0.7, None, None, contextlib.nullcontext, V))
    logits = (hidden @ head.weight.t()).float().cpu()
    st.ict_score = js
    for f in ("entropy", "renyi2", "purity", "logprob", "prob", "ict_score"):
        setattr(st, f, getattr(st, f).cpu())
    assert_matches(st, logits, mask.cpu(), ids.cpu(), temperature=0.7, group_ids=groups.cpu(), atol=1e-4, rtol=1e-4)
    assert (st.ict_score[:, 7:] == 0).all()  # one response per group active from t = 7 on (rows 0, 4)
    assert (st.ict_score[[0, 2], 0] > 0).all()
    one = hidden_stats(head, hidden, req, Sweep(0.7, None, B * T, contextlib.nullcontext, V))  # one block
    torch.testing.assert_close(one[1].cpu(), st.ict_score, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(one[0].entropy.cpu(), st.entropy, atol=1e-6, rtol=1e-6)
