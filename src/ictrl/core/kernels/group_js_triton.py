"""The group JS sweep as one hand-written Triton kernel: one program per (group, position), the whole batch in
one launch. Imported only when triton is (``ictrl.core.kernels.group_js`` guards it).

A program loads the group's members (padded to a power of two) and their mask bits at its position, then makes
two passes over the vocabulary in [GP, BLOCK_V] tiles: an online max and sum of exp (the log-normaliser), then p,
the group mean q = sum of active p / n, r = p + q, and the sums of p log p, p^2, q log q and r log r, all in
registers. The logits are read twice and nothing [*, V] is written. Correctness is tested on CPU tensors under
``TRITON_INTERPRET=1`` (tests/core/test_stats_triton.py); its speed needs a GPU.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

_LOG2 = math.log(2.0)


@triton.jit
def _group_js_kernel(logits_ptr, row_stride, members_ptr, mask_ptr, T, V, inv_temp,
                     mx_ptr, lse_ptr, ent_ptr, pur_ptr, js_ptr,
                     GP: tl.constexpr, BLOCK_V: tl.constexpr, LOG2: tl.constexpr):
    g = tl.program_id(0)
    t = tl.program_id(1)
    offs_j = tl.arange(0, GP)
    mem = tl.load(members_ptr + g * GP + offs_j)  # -1 pads the group
    valid = mem >= 0
    rows = tl.where(valid, mem, 0) * T + t
    act = valid & (tl.load(mask_ptr + rows, mask=valid, other=0) != 0)
    n = tl.sum(act.to(tl.int32), axis=0)
    if n > 0:
        row_off = rows.to(tl.int64) * row_stride
        # Pass 1: online max and sum of exp. m_safe keeps an all -inf prefix from giving -inf - -inf = NaN; a NaN
        # or +inf logit still makes s NaN, which the caller reports.
        m_i = tl.full([GP], float("-inf"), tl.float32)
        s_i = tl.zeros([GP], tl.float32)
        for v0 in range(0, V, BLOCK_V):
            offs_v = v0 + tl.arange(0, BLOCK_V)
            lm = act[:, None] & (offs_v < V)[None, :]
            x = tl.load(logits_ptr + row_off[:, None] + offs_v[None, :], mask=lm, other=float("-inf"))
            x = x.to(tl.float32) * inv_temp
            m_new = tl.maximum(m_i, tl.max(x, axis=1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            s_i = s_i * tl.exp(m_i - m_safe) + tl.sum(tl.exp(x - m_safe[:, None]), axis=1)
            m_i = m_new
        lse = tl.where(act, tl.log(s_i), 0.0)  # inactive rows: s = 0; keep their -inf out of later arithmetic
        mx = tl.where(act, m_i, 0.0)
        inv_n = 1.0 / tl.maximum(n, 1).to(tl.float32)
        pz = tl.zeros([GP], tl.float32)
        pp = tl.zeros([GP], tl.float32)
        rlr = tl.zeros([GP], tl.float32)
        qlq = tl.sum(tl.zeros([BLOCK_V], tl.float32), axis=0)
        # Pass 2: everything else. where(p > 0) keeps 0 * -inf out of the sums (0 log 0 = 0).
        for v0 in range(0, V, BLOCK_V):
            offs_v = v0 + tl.arange(0, BLOCK_V)
            lm = act[:, None] & (offs_v < V)[None, :]
            x = tl.load(logits_ptr + row_off[:, None] + offs_v[None, :], mask=lm, other=float("-inf"))
            z = x.to(tl.float32) * inv_temp - mx[:, None]
            p = tl.where(lm, tl.exp(z - lse[:, None]), 0.0)
            pz += tl.sum(tl.where(p > 0, p * z, 0.0), axis=1)
            pp += tl.sum(p * p, axis=1)
            q = tl.sum(p, axis=0) * inv_n
            qlq += tl.sum(tl.where(q > 0, q * tl.log(q), 0.0), axis=0)
            r = p + q[None, :]
            rlr += tl.sum(tl.where(r > 0, r * tl.log(r), 0.0), axis=1)
        ent = lse - pz
        js = LOG2 - 0.5 * rlr - 0.5 * ent + 0.5 * qlq
        js = tl.minimum(tl.maximum(js, 0.0), LOG2)
        js = tl.where(n >= 2, js, 0.0)
        tl.store(mx_ptr + rows, m_i, mask=act)
        tl.store(lse_ptr + rows, lse, mask=act)
        tl.store(ent_ptr + rows, ent, mask=act)
        tl.store(pur_ptr + rows, pp, mask=act)
        tl.store(js_ptr + rows, js, mask=act)


def triton_group_sweep(flat: Tensor, mask: Tensor, inverse: Tensor, temperature: float) -> dict[str, Tensor]:
    """flat: [B*T, V] logits (unit stride over V); mask: [B, T] bool; inverse: [B] group index 0..n_groups-1.
    Returns the dict of ``ictrl.core.kernels.group_js.fused_group_sweep`` with every active row done."""
    B, T = mask.shape
    V = flat.shape[1]
    if flat.stride(1) != 1:
        flat = flat.contiguous()
    device = flat.device
    n_groups = int(inverse.max()) + 1 if B else 0
    res = {k: torch.zeros(B * T, dtype=torch.float32, device=device) for k in ("max", "lse", "entropy", "purity", "ict")}
    res["done"] = mask.reshape(-1).clone()
    if n_groups == 0 or not bool(mask.any()):
        return res
    sizes = torch.bincount(inverse, minlength=n_groups)
    GP = max(2, triton.next_power_of_2(int(sizes.max())))
    # members[g, k] = the k-th response of group g, -1 past the group's size.
    order = torch.argsort(inverse, stable=True)
    slot = torch.arange(B, device=inverse.device) - torch.cumsum(sizes, 0)[inverse[order]] + sizes[inverse[order]]
    members = torch.full((n_groups, GP), -1, dtype=torch.int64, device=inverse.device)
    members[inverse[order], slot] = order
    BLOCK_V = max(16, min(triton.next_power_of_2(V), 4096 // GP))
    _group_js_kernel[(n_groups, T)](
        flat, flat.stride(0), members.to(device), mask.reshape(-1).to(torch.int8).to(device), T, V,
        1.0 / temperature, res["max"], res["lse"], res["entropy"], res["purity"], res["ict"],
        GP=GP, BLOCK_V=BLOCK_V, LOG2=_LOG2,
    )
    return res
