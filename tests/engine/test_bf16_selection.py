"""ICT's selection from bf16 statistics against fp32 statistics on the same rollouts.

Both selections come from the trainer's statistics sweep (``hidden_stats``: the LM head over final-norm hidden
states, then ``token_stats`` with the group JS), once without autocast and once under
``torch.autocast("cpu", dtype=torch.bfloat16)``, which is what ``accelerator.autocast()`` is on a bf16 run: the head's
matmul rounds its inputs to bf16 and its logits come out bf16 (ulp 2^-7 relative), then are upcast for the
statistics. The hidden states are given, so only the head's rounding is in play here; the bench runs the layers
under autocast too (its bf16 logit error RMS is 2-6x this one's, at larger logits).

Synthetic rollouts with a trained LM's peakedness at a reduced width (H 256, V 8,192): 4 groups of 8 responses x 64
tokens; members of a group copy a base completion and replace each token with probability 0.25; the hidden state
is the current token's embedding plus a running context of the earlier ones, RMS-normalised and scaled so the mean
entropy is 0.97 nats and the mean top-1 probability 0.70 (a random head at this scale; bench/bench_bf16_selection.py
measures the same at the real width, V 151,936).

The bound. At Qwen2.5-0.5B width bench/bench_bf16_selection.py measured fp32/bf16 top-10% agreements of 0.97-0.99
(bench/README.md), and this reduced model gives 0.99 (2 of 224 picks move). AGREEMENT_BOUND = 0.95 sits below both
with room for a seed or platform to move a few picks, and the test shows it can fail: Gaussian noise of the bf16
logit error's own RMS, added to the fp32 logits, reproduces the bf16 agreement (so the disagreement is the ranking's
sensitivity to errors of that size, not a bug of the bf16 path), while noise 16x larger (the rounding of a format
with 4 fewer mantissa bits, e.g. fp8 e4m3's 3 against bf16's 7) gives 0.93-0.94, below the bound.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ictrl.core import reference
from ictrl.core.selection import SelectionInputs, select
from ictrl.core.stats import TokenStats, token_stats
from ictrl.engine.stats_source import Autocast, Request, Sweep, hidden_stats

G, N_GROUPS, T, H, V = 8, 4, 64, 256, 8192
SCALE = 28.0  # final-norm gain: mean entropy 0.97 nats, top-1 0.70 with a std-0.02 head at V 8,192
AGREEMENT_BOUND = 0.95


def _bf16() -> contextlib.AbstractContextManager[object]:
    return torch.autocast("cpu", dtype=torch.bfloat16)


def _rollouts() -> tuple[Tensor, nn.Linear, Tensor, Tensor, Tensor]:
    """(hidden [B, T, H], head, mask [B, T], completion ids [B, T], group ids [B]), fixed by seed."""
    gen = torch.Generator().manual_seed(0)
    embed = torch.randn(V, H, generator=gen) * 0.02
    head = nn.Linear(H, V, bias=False)
    head.weight.data = torch.randn(V, H, generator=gen) * 0.02
    base = torch.randint(0, V, (N_GROUPS, 1, T), generator=gen).expand(-1, G, -1)
    other = torch.randint(0, V, (N_GROUPS, G, T), generator=gen)
    swap = torch.rand(N_GROUPS, G, T, generator=gen) < 0.25
    tokens = torch.where(swap, other, base).reshape(N_GROUPS * G, T)
    e = embed[tokens]
    h = e + 0.5 * torch.cumsum(e, 1) / torch.arange(1, T + 1).view(1, T, 1).sqrt()
    h = SCALE * h / h.pow(2).mean(-1, keepdim=True).sqrt()
    B = N_GROUPS * G
    return h, head, torch.ones(B, T, dtype=torch.bool), tokens, torch.arange(B) // G


def _sweep(h: Tensor, head: nn.Linear, mask: Tensor, tokens: Tensor, groups: Tensor,
           autocast: Autocast) -> tuple[TokenStats, Tensor]:
    stats, u = hidden_stats(head, h, Request(mask, tokens, groups), Sweep(1.0, None, 512, autocast, head.out_features))
    assert u is not None
    return stats, u


def _ict(u: Tensor, mask: Tensor) -> Tensor:
    return select("ict", SelectionInputs(mask=mask, ict_score=u))


def _agreement(a: Tensor, b: Tensor) -> float:
    """|a & b| / |a|; both keep ceil(0.1 * n) per response, so it equals |a & b| / |b|."""
    return float((a & b).sum()) / float(a.sum())


@pytest.fixture(scope="module")
@torch.no_grad()
def passes() -> dict[str, object]:
    h, head, mask, tokens, groups = _rollouts()
    s32, u32 = _sweep(h, head, mask, tokens, groups, contextlib.nullcontext)
    s16, u16 = _sweep(h, head, mask, tokens, groups, _bf16)
    z32 = F.linear(h, head.weight)
    with _bf16():
        z16 = F.linear(h, head.weight)  # the same op hidden_stats runs under autocast: bf16 logits
    assert z16.dtype == torch.bfloat16
    return dict(h=h, mask=mask, groups=groups, s32=s32, u32=u32, s16=s16, u16=u16, z32=z32, z16=z16.float())


def test_rollouts_are_peaked_like_a_trained_lm(passes: dict) -> None:
    """The premise of the agreement figure: near-uniform rows would make every u tiny and ties decide the top 10%."""
    p = passes["z32"].softmax(-1)
    top1 = float(p.amax(-1).mean())
    entropy = float(passes["s32"].entropy.mean())
    assert 0.55 <= top1 <= 0.8, top1
    assert 0.6 <= entropy <= 1.5, entropy
    assert float(passes["u32"].std(dim=1).mean()) > 0.05  # scores spread within a response, not a tie


def test_bf16_selection_agrees_with_fp32(passes: dict) -> None:
    mask, u32, u16 = passes["mask"], passes["u32"], passes["u16"]
    sel32, sel16 = _ict(u32, mask), _ict(u16, mask)
    assert int(sel32.sum()) == int(sel16.sum()) == N_GROUPS * G * 7  # ceil(0.1 * 64) per response
    agreement = _agreement(sel32, sel16)
    assert agreement >= AGREEMENT_BOUND, agreement
    assert agreement < 1.0  # bf16 does move some picks: the comparison is not fp32 against itself


def test_the_bound_can_fail_with_larger_logit_errors(passes: dict) -> None:
    """Noise of the bf16 logit error's RMS on the fp32 logits gives about the bf16 agreement; 16x that fails."""
    mask, groups, z32 = passes["mask"], passes["groups"], passes["z32"]
    sel32 = _ict(passes["u32"], mask)
    bf16_agreement = _agreement(sel32, _ict(passes["u16"], mask))
    rms = float((passes["z16"] - z32).pow(2).mean().sqrt())
    gen = torch.Generator().manual_seed(1)

    def agreement_with_noise(size: float) -> float:
        noisy = z32 + size * torch.randn(z32.shape, generator=gen)
        return _agreement(sel32, _ict(token_stats(noisy, mask, group_ids=groups).ict_score, mask))

    assert abs(agreement_with_noise(rms) - bf16_agreement) <= 0.03
    assert agreement_with_noise(16 * rms) < AGREEMENT_BOUND


def test_bf16_statistics_match_a_float64_reference(passes: dict) -> None:
    """bf16 statistics equal a naive float64 computation on the same bf16 logits (the sweep adds only fp32
    rounding), and are within the first-order effect of the bf16 logit error of the exact (fp32-logit) values."""
    mask, groups, z32, z16 = passes["mask"], passes["groups"], passes["z32"], passes["z16"]
    s16, u16 = passes["s16"], passes["u16"]
    rows, cols = slice(0, G), slice(0, 16)  # one group, 16 positions: the reference loops in Python
    sub_mask, sub_groups = mask[rows, cols], groups[rows]
    z16, z32 = z16[:, cols], z32[:, cols]
    p_same = reference.softmax64(z16)
    torch.testing.assert_close(s16.entropy[:, cols].double(), -torch.special.xlogy(p_same, p_same).sum(-1),
                               atol=2e-5, rtol=1e-5)
    u_same = reference.group_js(z16[rows], sub_mask, sub_groups)
    torch.testing.assert_close(u16[rows, cols].double(), u_same, atol=2e-5, rtol=1e-5)

    # Against the exact values: for a logit error dz, dH = -sum p (z - zbar) dz (first order), so
    # |dH| <= (max dz - min dz) * E_p|z - E_p z| per row; 1.5x for the second-order terms.
    p64, z64 = reference.softmax64(z32), z32.double()
    h_exact = -torch.special.xlogy(p64, p64).sum(-1)
    dz = z16.double() - z64
    spread = dz.amax(-1) - dz.amin(-1)
    dev = (p64 * (z64 - (p64 * z64).sum(-1, keepdim=True)).abs()).sum(-1)
    h_err = (s16.entropy[:, cols].double() - h_exact).abs()
    assert bool((h_err <= 1.5 * spread * dev + 1e-5).all()), float((h_err / (spread * dev)).max())
    # u = JS(p || q) = (KL(p || m) + KL(q || m)) / 2 moves, to first order, by sum_v p_v (dz_v - E_p dz) log(p_v / m_v)
    # / 2 for an error in p's logits, and sum_v p_v |log(p_v / m_v)| <= log 2 + 1/e; the same for each member's share
    # of q. So |du| <= 2 (log 2 + 1/e) / 2 * 2 x the largest logit spread in the group at t (p's and q's terms).
    # A worst case (errors aligned with log(p / m)): rounding errors are not, and |du| stays near 4% of it here.
    u_exact = reference.group_js(z32[rows], sub_mask, sub_groups)
    group_spread = spread[rows].amax(0, keepdim=True)
    u_err = (u16[rows, cols].double() - u_exact).abs()
    assert bool((u_err <= 2 * 1.06 * group_spread + 1e-5).all()), float((u_err / group_spread).max())
