"""ictrl.core.stats against a naive float64 reference written out plainly here."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap

import pytest
import torch

from ictrl.core import reference
from ictrl.core.stats import (
    TokenStats,
    group_js_divergence,
    group_js_divergence_topk,
    token_stats,
    topk_log_softmax,
)

LOG2 = math.log(2.0)


# ----------------------------------------------------------------------------------------------- reference


def ref_probs(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """softmax in float64, [B, T, V]."""
    z = logits.double() / temperature
    z = z - z.max(dim=-1, keepdim=True).values
    e = torch.exp(z)
    return e / e.sum(dim=-1, keepdim=True)


def ref_entropy(p: torch.Tensor) -> torch.Tensor:
    safe = torch.where(p > 0, p, torch.ones_like(p))
    return -(torch.where(p > 0, p * torch.log(safe), torch.zeros_like(p))).sum(-1)


def ref_kl(p: torch.Tensor, q: torch.Tensor) -> float:
    total = 0.0
    for pv, qv in zip(p.tolist(), q.tolist()):
        if pv > 0:
            total += pv * math.log(pv / qv)
    return total


def ref_token_stats(logits, mask, tokens=None, temperature=1.0) -> dict[str, torch.Tensor]:
    p = ref_probs(logits, temperature)
    m = mask.bool().double()
    purity = (p * p).sum(-1)
    out = {"entropy": ref_entropy(p), "purity": purity, "renyi2": -torch.log(purity)}
    if tokens is not None:
        pt = p.gather(-1, tokens.clamp(min=0).unsqueeze(-1)).squeeze(-1)
        out["prob"], out["logprob"] = pt, torch.log(pt)
    else:
        out["prob"] = out["logprob"] = torch.zeros_like(purity)
    return {k: v * m for k, v in out.items()}


def ref_js(logits, mask, group_ids, temperature=1.0, probs=None) -> torch.Tensor:
    return reference.group_js(logits, mask, group_ids, temperature) if probs is None else \
        reference.group_js_of_probs(probs, mask, group_ids)


def assert_matches(st: TokenStats, logits, mask, tokens=None, temperature=1.0, group_ids=None, atol=2e-5, rtol=1e-5):
    ref = ref_token_stats(logits, mask, tokens, temperature)
    for name, want in ref.items():
        got = getattr(st, name)
        assert got.dtype == torch.float32 and got.shape == mask.shape, name
        assert torch.isfinite(got).all(), name
        torch.testing.assert_close(got.double(), want, atol=atol, rtol=rtol, msg=lambda s: f"{name}: {s}")
    if group_ids is not None:
        assert st.ict_score is not None
        want = ref_js(logits, mask, group_ids, temperature)
        torch.testing.assert_close(st.ict_score.double(), want, atol=atol, rtol=rtol)


def make_case(B=6, T=7, V=97, seed=0, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, T, V, generator=g) * scale
    tokens = torch.randint(0, V, (B, T), generator=g)
    lengths = torch.randint(0, T + 1, (B,), generator=g)
    lengths[0] = T
    mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
    return logits, mask, tokens


# Non-adjacent groups: 0 and 1 interleave, 2 is a single response.
GROUPS6 = torch.tensor([0, 1, 0, 1, 0, 2])


# ----------------------------------------------------------------------------------------------- values


def test_random_logits_all_stats_and_js():
    logits, mask, tokens = make_case()
    st = token_stats(logits, mask, tokens, group_ids=GROUPS6, chunk_size=5)
    assert_matches(st, logits, mask, tokens, group_ids=GROUPS6)
    # The plain row sweep (no groups) gives the same statistics as the group sweep.
    plain = token_stats(logits, mask, tokens, chunk_size=5)
    assert plain.ict_score is None
    for name in ("entropy", "renyi2", "purity", "logprob", "prob"):
        torch.testing.assert_close(getattr(plain, name), getattr(st, name), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(group_js_divergence(logits, mask, GROUPS6), st.ict_score, atol=1e-6, rtol=1e-6)


def test_peaked_logits():
    logits, mask, tokens = make_case(seed=1, scale=1.0)
    hot = torch.randint(0, logits.shape[-1], mask.shape, generator=torch.Generator().manual_seed(5))
    logits.scatter_add_(-1, hot.unsqueeze(-1), torch.full((*mask.shape, 1), 80.0))
    st = token_stats(logits, mask, hot, group_ids=GROUPS6)
    assert_matches(st, logits, mask, hot, group_ids=GROUPS6)
    assert st.entropy.abs().max() < 1e-6 and torch.allclose(st.prob, mask.float())


def test_uniform_logits():
    B, T, V = 4, 3, 50
    logits = torch.full((B, T, V), 2.5)
    mask = torch.ones(B, T, dtype=torch.bool)
    st = token_stats(logits, mask, torch.zeros(B, T, dtype=torch.long), group_ids=torch.tensor([0, 0, 1, 1]))
    torch.testing.assert_close(st.entropy, torch.full((B, T), math.log(V)))
    torch.testing.assert_close(st.renyi2, torch.full((B, T), math.log(V)))
    torch.testing.assert_close(st.purity, torch.full((B, T), 1.0 / V))
    torch.testing.assert_close(st.prob, torch.full((B, T), 1.0 / V))
    assert st.ict_score.abs().max() < 1e-6


def test_neg_inf_logits_no_nan():
    logits, mask, tokens = make_case(seed=2)
    g = torch.Generator().manual_seed(3)
    logits[torch.rand(logits.shape, generator=g) < 0.3] = -math.inf
    logits[1, 2] = -math.inf  # all but one -inf: a one-hot distribution
    logits[1, 2, 7] = 1.0
    mask[1, 2] = True
    tokens[1, 2] = 7
    # tokens must carry probability > 0 for the reference's log; re-point those at -inf
    finite_tok = torch.isfinite(logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1))
    tokens = torch.where(finite_tok, tokens, logits.argmax(-1))
    st = token_stats(logits, mask, tokens, group_ids=GROUPS6, chunk_size=4)
    clean = torch.where(mask.unsqueeze(-1), logits, torch.zeros(()))  # the reference multiplies by the mask
    assert_matches(st, clean, mask, tokens, group_ids=GROUPS6)
    assert st.entropy[1, 2] == 0 and st.prob[1, 2] == 1 and st.purity[1, 2] == 1


def test_ties():
    g = torch.Generator().manual_seed(4)
    logits = torch.randint(-2, 3, (6, 5, 40), generator=g).float()  # many equal logits, equal maxima
    mask = torch.ones(6, 5, dtype=torch.bool)
    tokens = torch.randint(0, 40, (6, 5), generator=g)
    st = token_stats(logits, mask, tokens, group_ids=GROUPS6)
    assert_matches(st, logits, mask, tokens, group_ids=GROUPS6)


@pytest.mark.parametrize("temperature", [0.7, 1.5])
def test_temperature(temperature):
    logits, mask, tokens = make_case(seed=6)
    st = token_stats(logits, mask, tokens, temperature=temperature, group_ids=GROUPS6, chunk_size=3)
    assert_matches(st, logits, mask, tokens, temperature=temperature, group_ids=GROUPS6)
    # and it matters: differs from tau = 1
    assert not torch.allclose(st.entropy, token_stats(logits, mask, tokens).entropy, atol=1e-3)


def test_bf16_input():
    logits, mask, tokens = make_case(seed=7)
    lb = logits.bfloat16()
    st = token_stats(lb, mask, tokens, group_ids=GROUPS6, chunk_size=4)
    # Reference on the bf16-rounded values; accumulation must be float32, not bf16.
    assert_matches(st, lb.float(), mask, tokens, group_ids=GROUPS6, atol=1e-4, rtol=1e-3)


def test_ragged_and_zero_length():
    logits, mask, tokens = make_case(B=6, T=9, seed=8)
    mask[:] = torch.arange(9).unsqueeze(0) < torch.tensor([9, 4, 0, 9, 6, 3]).unsqueeze(1)  # response 2 is empty
    st = token_stats(logits, mask, tokens, group_ids=GROUPS6, chunk_size=5)
    assert_matches(st, logits, mask, tokens, group_ids=GROUPS6)
    for name in ("entropy", "renyi2", "purity", "logprob", "prob", "ict_score"):
        assert (getattr(st, name)[~mask] == 0).all(), name
    # group 0 = responses 0, 2, 4 with lengths 9, 0, 6: only response 0 is active at t >= 6 -> u = 0
    assert (st.ict_score[0, 6:] == 0).all() and (st.ict_score[0, :6] > 0).all()


def test_single_active_response_in_group_is_zero():
    logits, mask, tokens = make_case(seed=9)
    mask[:] = True
    u = group_js_divergence(logits, mask, torch.tensor([0, 1, 2, 3, 4, 5]))
    assert (u == 0).all()


def test_permuted_batch_gives_permuted_result():
    logits, mask, tokens = make_case(B=8, seed=10)
    groups = torch.tensor([3, 1, 3, 1, 7, 3, 7, 1])
    st = token_stats(logits, mask, tokens, group_ids=groups, chunk_size=4)
    perm = torch.randperm(8, generator=torch.Generator().manual_seed(0))
    sp = token_stats(logits[perm], mask[perm], tokens[perm], group_ids=groups[perm] * 10 - 4, chunk_size=4)
    for name in ("entropy", "purity", "logprob", "ict_score"):
        torch.testing.assert_close(getattr(sp, name), getattr(st, name)[perm], atol=1e-6, rtol=1e-6)
    assert_matches(st, logits, mask, tokens, group_ids=groups)


@pytest.mark.parametrize("chunk_size", [1, 3, 7, 11, 1000, None])
def test_chunk_sizes(chunk_size):
    logits, mask, tokens = make_case(B=6, T=7, seed=11)  # 42 rows: 3, 7 divide nothing useful after masking
    st = token_stats(logits, mask, tokens, group_ids=GROUPS6, chunk_size=chunk_size)
    assert_matches(st, logits, mask, tokens, group_ids=GROUPS6)
    plain = token_stats(logits, mask, tokens, chunk_size=chunk_size)
    assert_matches(plain, logits, mask, tokens)


def test_large_vocab_few_rows():
    V = 151_936
    g = torch.Generator().manual_seed(12)
    logits = torch.randn(4, 2, V, generator=g) * 2.0
    logits[0, 1, 5] += 25.0  # one peaked row
    mask = torch.tensor([[True, True], [True, False], [True, True], [True, True]])
    tokens = torch.randint(0, V, (4, 2), generator=g)
    groups = torch.tensor([0, 0, 0, 1])
    st = token_stats(logits, mask, tokens, group_ids=groups, chunk_size=3)
    assert_matches(st, logits, mask, tokens, group_ids=groups, atol=1e-4, rtol=1e-5)
    assert st.ict_score[3].abs().max() == 0


# ----------------------------------------------------------------------------------------------- JS properties


def test_js_bounds_and_identical_members():
    logits, mask, tokens = make_case(B=8, T=6, V=30, seed=13, scale=8.0)
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    u = group_js_divergence(logits, mask, groups)
    assert (u >= 0).all() and (u <= LOG2).all() and (u > 0.05).any()
    same = logits.clone()
    same[1:4] = same[0]  # group 0 identical at every t
    same[5, :3] = same[4, :3]  # group 1 identical only for t < 3 (if those are its only active members)
    mask2 = mask.clone()
    mask2[4:, :3] = False
    mask2[4:6, :3] = True
    u2 = group_js_divergence(same, mask2, groups)
    assert u2[:4].abs().max() < 1e-6
    assert u2[4:6, :3].abs().max() < 1e-6


def test_js_extremes_and_symmetric_reference():
    # Disjoint one-hot responses: p = e_0, q = (e_0 + e_1) / 2 -> JS = H(3/4, 1/4) - log(2) / 2.
    logits = torch.full((2, 1, 4), -math.inf)
    logits[0, 0, 0] = 0.0
    logits[1, 0, 1] = 0.0
    u = group_js_divergence(logits, torch.ones(2, 1, dtype=torch.bool), torch.tensor([5, 5]))
    want = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25)) - 0.5 * LOG2
    torch.testing.assert_close(u, torch.full((2, 1), want))
    # Reference symmetry: JS(p || q) computed with the roles swapped is the same number.
    p, q = ref_probs(torch.randn(1, 1, 20))[0, 0], ref_probs(torch.randn(1, 1, 20))[0, 0]
    m = 0.5 * (p + q)
    assert abs((0.5 * ref_kl(p, m) + 0.5 * ref_kl(q, m)) - (0.5 * ref_kl(q, m) + 0.5 * ref_kl(p, m))) < 1e-15
    # Two-member group: the implementation's u for each member equals the reference's KL-form JS to the mean.
    two = torch.stack([torch.log(p), torch.log(q)]).float().view(2, 1, 20)
    u2 = group_js_divergence(two, torch.ones(2, 1, dtype=torch.bool), torch.tensor([0, 0]))
    torch.testing.assert_close(u2.double(), ref_js(two, torch.ones(2, 1, dtype=torch.bool), torch.tensor([0, 0])),
                               atol=1e-6, rtol=1e-5)


# ----------------------------------------------------------------------------------------------- top-K


def test_topk_equals_exact_when_k_is_v():
    logits, mask, _ = make_case(B=6, T=7, V=40, seed=14)
    lp = torch.log_softmax(logits, -1)
    perm = torch.randperm(40, generator=torch.Generator().manual_seed(1))
    ids = perm.expand(6, 7, 40).contiguous()  # every id, in a scrambled order
    u_topk = group_js_divergence_topk(lp.gather(-1, ids), ids, mask, GROUPS6)
    torch.testing.assert_close(u_topk.double(), ref_js(logits, mask, GROUPS6), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(u_topk, group_js_divergence(logits, mask, GROUPS6), atol=1e-5, rtol=1e-5)


def test_topk_small_k_against_reference_of_the_approximation():
    logits, mask, _ = make_case(B=6, T=5, V=30, seed=15)
    K = 4
    lp, ids = torch.log_softmax(logits.double(), -1).topk(K, dim=-1)
    ids[~mask] = -7  # garbage at masked positions must be ignored
    u = group_js_divergence_topk(lp, ids, mask, GROUPS6)
    # Reference: the approximate distribution written out as dense [V + 1] vectors (tail in the last slot).
    dense = torch.zeros(6, 5, 31, dtype=torch.float64)
    dense[..., :30].scatter_(-1, ids.clamp(min=0), lp.exp())
    dense[..., 30] = 1 - lp.exp().sum(-1)
    want = ref_js(None, mask, GROUPS6, probs=dense)
    torch.testing.assert_close(u.double(), want, atol=1e-6, rtol=1e-6)
    assert (u >= 0).all() and (u <= LOG2).all() and (u[:, :][~mask] == 0).all()
    assert (u[5] == 0).all()  # group 2 has one member


# ----------------------------------------------------------------------------------------------- validation


def _good():
    logits = torch.randn(2, 3, 5)
    return logits, torch.ones(2, 3, dtype=torch.bool), torch.zeros(2, 3, dtype=torch.long), torch.tensor([0, 0])


@pytest.mark.parametrize(
    "change, arg",
    [
        (lambda a: a.update(logits=torch.randn(2, 3)), "logits"),
        (lambda a: a.update(logits=torch.zeros(2, 3, 5, dtype=torch.long)), "logits"),
        (lambda a: a.update(mask=torch.ones(3, 2, dtype=torch.bool)), "mask"),
        (lambda a: a.update(mask=torch.full((2, 3), 2)), "mask"),
        (lambda a: a.update(mask=torch.full((2, 3), 0.5)), "mask"),
        (lambda a: a.update(tokens=torch.zeros(2, 4, dtype=torch.long)), "tokens"),
        (lambda a: a.update(tokens=torch.full((2, 3), 5)), "tokens"),
        (lambda a: a.update(tokens=torch.full((2, 3), -1)), "tokens"),
        (lambda a: a.update(tokens=torch.zeros(2, 3)), "tokens"),
        (lambda a: a.update(group_ids=torch.tensor([0, 0, 1])), "group_ids"),
        (lambda a: a.update(group_ids=torch.tensor([[0, 0]])), "group_ids"),
        (lambda a: a.update(group_ids=torch.tensor([0.0, 1.0])), "group_ids"),
        (lambda a: a.update(temperature=0.0), "temperature"),
        (lambda a: a.update(temperature=-1.0), "temperature"),
        (lambda a: a.update(chunk_size=0), "chunk_size"),
        (lambda a: a.update(chunk_size=-3), "chunk_size"),
    ],
)
def test_bad_inputs_raise_naming_the_argument(change, arg):
    logits, mask, tokens, groups = _good()
    kwargs = dict(logits=logits, mask=mask, tokens=tokens, group_ids=groups, temperature=1.0, chunk_size=None)
    change(kwargs)
    with pytest.raises(ValueError, match=arg):
        token_stats(**kwargs)
    if arg != "tokens":
        kwargs.pop("tokens")
        with pytest.raises(ValueError, match=arg):
            group_js_divergence(**kwargs)


def test_masked_out_tokens_may_be_padding_and_mask_may_be_01():
    logits, mask, tokens = make_case(seed=16)
    tokens[~mask] = -100
    st = token_stats(logits, mask.long(), tokens)
    assert_matches(st, logits, mask, tokens.clamp(min=0))


def test_topk_bad_inputs():
    lp, ids = torch.randn(2, 3, 4), torch.zeros(2, 3, 4, dtype=torch.long)
    mask, groups = torch.ones(2, 3, dtype=torch.bool), torch.tensor([0, 0])
    with pytest.raises(ValueError, match="topk_logprobs"):
        group_js_divergence_topk(lp[0], ids, mask, groups)
    with pytest.raises(ValueError, match="topk_ids"):
        group_js_divergence_topk(lp, ids[..., :2], mask, groups)
    with pytest.raises(ValueError, match="topk_ids"):
        group_js_divergence_topk(lp, ids.float(), mask, groups)
    with pytest.raises(ValueError, match="mask"):
        group_js_divergence_topk(lp, ids, mask[:, :2], groups)
    with pytest.raises(ValueError, match="group_ids"):
        group_js_divergence_topk(lp, ids, mask, groups[:1])


# ----------------------------------------------------------------------------------------------- memory

# Peak extra memory is measured as growth of the peak RSS (VmHWM) of a fresh subprocess: tracemalloc does not
# see torch's allocations, but the kernel's peak-RSS counter sees every touched page. Not ru_maxrss: a child
# inherits its parent's ru_maxrss across fork+exec, so under a large pytest process the baseline would start at the
# parent's peak and hide the child's growth (seen: the control read 335 MB instead of >= 400 MB); VmHWM belongs to
# the child's own address space. The baseline is taken after
# the logits exist (they are written by randn, so resident); each later allocation that is written raises the peak.
# The torch CPU allocator does not cache freed blocks, so chunk buffers cannot hide in a pool. The control run
# (a plain softmax over all rows) must exceed the bound, which shows the measurement can fail.
_MEM_SCRIPT = textwrap.dedent(
    """
    import json, sys, torch
    from ictrl.core.stats import token_stats

    def peak_rss_bytes():
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))

    torch.manual_seed(0)
    B, T, V = 8, 125, 100_000                      # N * V * 4 = 400 MB of float32 logits
    logits = torch.randn(B, T, V)
    mask = torch.ones(B, T, dtype=torch.bool)
    tokens = torch.randint(0, V, (B, T))
    groups = torch.arange(B) // 8
    token_stats(logits[:1, :2], mask[:1, :2], tokens[:1, :2], group_ids=groups[:1])  # warm up kernels/threads
    before = peak_rss_bytes()
    mode = sys.argv[1]
    if mode == "stats":
        st = token_stats(logits, mask, tokens, chunk_size=16)
    elif mode == "stats_js":
        # The plain path's chunk buffers; the compiled path holds none (bench/bench_stats.py measures it), but
        # its first call in a process imports and runs inductor, a one-time ~0.27 GB this bound is not about.
        st = token_stats(logits, mask, tokens, chunk_size=16, group_ids=groups, backend="plain")
    else:
        st = torch.softmax(logits, dim=-1)
    after = peak_rss_bytes()
    print(json.dumps({"extra_bytes": after - before, "logits_bytes": logits.numel() * 4}))
    """
)


def _peak_extra(mode: str) -> dict:
    res = subprocess.run([sys.executable, "-c", _MEM_SCRIPT, mode], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.integration
@pytest.mark.skipif(sys.platform != "linux", reason="reads VmHWM from /proc/self/status")
def test_peak_memory_is_bounded_by_a_chunk():
    control = _peak_extra("naive")
    assert control["extra_bytes"] > 0.9 * control["logits_bytes"]  # the measurement sees a full [N, V] buffer
    for mode in ("stats", "stats_js"):
        r = _peak_extra(mode)
        assert r["extra_bytes"] < 0.25 * r["logits_bytes"], (mode, r)


# ----------------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
def test_cuda_matches_cpu():
    logits, mask, tokens = make_case(B=8, T=9, V=1000, seed=17)
    groups = torch.tensor([0, 1, 0, 1, 0, 1, 2, 2])
    cpu = token_stats(logits, mask, tokens, group_ids=groups, chunk_size=5)
    gpu = token_stats(logits.cuda(), mask.cuda(), tokens.cuda(), group_ids=groups.cuda(), chunk_size=5)
    for name in ("entropy", "renyi2", "purity", "logprob", "prob", "ict_score"):
        torch.testing.assert_close(getattr(gpu, name).cpu(), getattr(cpu, name), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_inputs_are_not_modified(temperature, dtype):
    logits = (torch.randn(4, 6, 33) * 3).to(dtype)
    logits[0, 0, :5] = -math.inf
    before = logits.clone()
    mask = torch.ones(4, 6, dtype=torch.bool)  # all active: chunks are views of the logits, not copies
    st = token_stats(logits, mask, torch.zeros(4, 6, dtype=torch.long), temperature, chunk_size=5,
                     group_ids=torch.tensor([0, 0, 1, 1]))
    plain = token_stats(logits, mask, temperature=temperature, chunk_size=5)
    assert torch.equal(logits, before)
    torch.testing.assert_close(plain.entropy, st.entropy, atol=1e-6, rtol=1e-6)
    assert_matches(plain, logits.float(), mask, None, temperature, atol=1e-4, rtol=1e-4)


def test_whole_group_in_one_block_all_active():
    # Regression: with every position active and the whole group in one block, the t-major block rows span a
    # contiguous range of the flat logits without being in flat order; they must still be gathered, not sliced.
    logits, _, tokens = make_case(B=4, T=5, V=23, seed=18)
    mask = torch.ones(4, 5, dtype=torch.bool)
    groups = torch.tensor([0, 0, 1, 1])
    for chunk_size in (None, 10):
        st = token_stats(logits, mask, tokens, group_ids=groups, chunk_size=chunk_size)
        assert_matches(st, logits, mask, tokens, group_ids=groups)


@pytest.mark.parametrize("dtype, temperature", [(torch.float32, 1.0), (torch.float32, 0.8), (torch.bfloat16, 1.0),
                                                (torch.bfloat16, 1.3)])
def test_scattered_rows_and_large_groups(dtype, temperature):
    # Chunks are read either run by run straight from the logits (few contiguous runs) or gathered with one
    # index_select (more than 16 runs); both must match the reference, for fp32 and bf16, at any temperature.
    g = torch.Generator().manual_seed(19)
    B, T, V = 20, 9, 31
    logits = (torch.randn(B, T, V, generator=g) * 3).to(dtype)
    tokens = torch.randint(0, V, (B, T), generator=g)
    checker = (torch.arange(B).unsqueeze(1) + torch.arange(T).unsqueeze(0)) % 2 == 0  # every run is one row
    groups = torch.zeros(B, dtype=torch.long)  # one group of 20: more runs per block than the run-by-run limit
    groups[::7] = 1  # plus a non-adjacent group of 3
    ref_logits = logits.float()
    for mask, chunk_size in ((checker, 50), (torch.ones(B, T, dtype=torch.bool), 60), (checker, None)):
        plain = token_stats(logits, mask, tokens, temperature, chunk_size)
        assert_matches(plain, ref_logits, mask, tokens, temperature, atol=1e-4, rtol=1e-4)
        st = token_stats(logits, mask, tokens, temperature, chunk_size, group_ids=groups)
        assert_matches(st, ref_logits, mask, tokens, temperature, group_ids=groups, atol=1e-4, rtol=1e-4)


def test_members_ending_mid_block():
    # Responses that end (and one that starts late) inside what would be one position block: the active set of a
    # group changes at those positions, and each part must still use the right group mean.
    logits, _, tokens = make_case(B=8, T=12, V=41, seed=20)
    lengths = torch.tensor([12, 3, 7, 12, 1, 12, 5, 9])
    mask = torch.arange(12).unsqueeze(0) < lengths.unsqueeze(1)
    mask[3, :4] = False  # a late start
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    for chunk_size in (None, 8, 1):
        st = token_stats(logits, mask, tokens, group_ids=groups, chunk_size=chunk_size)
        assert_matches(st, logits, mask, tokens, group_ids=groups)
        assert (st.ict_score[mask] > 0).sum() > 0.8 * mask.sum()


def test_topk_log_softmax_matches_float64_log_softmax() -> None:
    g = torch.Generator().manual_seed(3)
    logits = 4 * torch.randn(3, 5, 300, generator=g)
    ref = torch.log_softmax(logits.double() / 0.7, dim=-1).topk(8, dim=-1)
    lp, ids = topk_log_softmax(logits.clone(), 8, 0.7)
    assert torch.equal(ids, ref.indices)
    torch.testing.assert_close(lp.double(), ref.values, atol=1e-5, rtol=1e-6)
    lp_all, _ = topk_log_softmax(logits.clone(), 1000, 1.0)  # K > V is capped at V: a full distribution
    assert lp_all.shape == (3, 5, 300)
    torch.testing.assert_close(lp_all.double().exp().sum(-1), torch.ones(3, 5, dtype=torch.float64))


# ----------------------------------------------------------------------------------------------- non-finite logits


@pytest.mark.parametrize("bad, shown", [(math.nan, "nan"), (math.inf, "inf")])
def test_non_finite_logit_at_an_active_position_names_row_and_position(bad, shown):
    # One NaN logit made the ICT score NaN for its whole group at that position, silently.
    logits, mask, tokens = make_case(seed=21)
    mask[1, 3] = mask[4, 2] = True
    logits[4, 2, 11] = bad
    for kwargs in ({}, {"group_ids": GROUPS6}):
        with pytest.raises(ValueError, match=rf"logits .* at \(row 4, position 2\): {shown} \(1 non-finite"):
            token_stats(logits, mask, tokens, chunk_size=4, **kwargs)
    with pytest.raises(ValueError, match=r"\(row 4, position 2\)"):
        group_js_divergence(logits, mask, GROUPS6)


def test_all_neg_inf_row_is_an_error_but_masked_rows_may_hold_anything():
    logits, mask, tokens = make_case(seed=22)
    mask[2, 1] = True
    logits[2, 1] = -math.inf  # no distribution at an active position
    with pytest.raises(ValueError, match=r"\(row 2, position 1\): -inf"):
        group_js_divergence(logits, mask, GROUPS6)
    mask[2, 1] = False  # the same row masked out, plus NaN and +inf in other masked rows: no error, no NaN
    mask[0, 6] = mask[3, 0] = False
    logits[0, 6, 3], logits[3, 0, 0] = math.nan, math.inf
    st = token_stats(logits, mask, tokens, group_ids=GROUPS6, chunk_size=4)
    clean = torch.where(mask.unsqueeze(-1), logits, torch.zeros(()))  # the reference multiplies by the mask
    assert_matches(st, clean, mask, tokens, group_ids=GROUPS6)


def test_sweep_block_comes_from_a_bounded_budget_not_from_free_memory(monkeypatch) -> None:
    """On a GPU the statistics pass's block is SWEEP_BYTES of logits whatever the free memory (a block sized from
    free memory materialised the whole step's logits); stats_chunk_size overrides it; CPU keeps its rows."""
    from ictrl.core import stats

    def huge_free(device=None):  # 1 TiB free: must not matter (and is not even asked)
        raise AssertionError("sweep_rows must not size the block from free memory")

    monkeypatch.setattr(torch.cuda, "mem_get_info", huge_free)
    cuda = torch.device("cuda")
    for V, itemsize in ((151_936, 2), (151_936, 4), (32_768, 2), (10**9, 2)):
        rows = stats.sweep_rows(None, V, cuda, itemsize)
        assert rows >= 1 and (rows == 1 or rows * V * itemsize <= stats.SWEEP_BYTES), (V, itemsize)
        assert (rows + 1) * V * itemsize > stats.SWEEP_BYTES  # the budget is used, not a fraction of it
    assert stats.sweep_rows(None, 151_936, cuda) == 883  # 256 MiB of bf16 logits at Qwen2.5's vocabulary
    assert stats.sweep_rows(64, 151_936, cuda) == 64  # stats_chunk_size, when set
    assert stats.sweep_rows(None, 151_936, torch.device("cpu")) == stats.CPU_SWEEP_ROWS
