"""The group JS sweep as two hand-written Triton kernels, split over the vocabulary so one launch fills a GPU.
Imported only when triton is (``ictrl.core.kernels.group_js`` guards it).

Grid: (group × position, vocabulary slice). A program loads its group's members (padded to a power of two) and
their mask bits at its position and streams one slice of ``split_v`` logits per member in [GP, BLOCK_V] tiles, in
the logits' own dtype (bf16 is read as bf16) with fp32 arithmetic. At Qwen2.5's V = 151,936 and split_v = 8,192
that is 19 programs per (group, position): a step of 2 groups × 1,024 positions is ~39k programs in one launch,
where one program per (group, position) gave 64 per launch on a 132-SM GPU.

- ``_lse_partial``: per member and slice, the online max m and sum of exp(x - m) (x = logits / temperature).
  The slices are combined in torch (a [rows, slices] logsumexp: no host read).
- ``_js_partial``: with each member's max and log-normaliser, p, the group mean q = (sum of active p) / n,
  r = p + q, and per slice the sums of p (x - max), p^2, r log r (per member) and q log q (per position).

The JS needs every member's normalised p before q exists, so the logits are read exactly twice (an online
rescaling cannot carry sum r log r, whose terms mix members with different normalisers); nothing [*, V] is
written. Correctness is tested on CPU tensors under ``TRITON_INTERPRET=1`` (tests/core/test_stats_triton.py); its
speed needs a GPU.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

_LOG2 = math.log(2.0)
SPLIT_V = 8192  # vocabulary per program: 19 slices at V = 151,936; 16 tiles of [8, 512] per slice at GP = 8
TILE = 4096  # logits per [GP, BLOCK_V] tile (tests lower it and SPLIT_V to cross many tiles and slices)


@triton.jit
def _members_at(members_ptr, mask_ptr, pid, T, GP: tl.constexpr):
    g = pid // T
    t = pid % T
    offs_j = tl.arange(0, GP)
    mem = tl.load(members_ptr + g * GP + offs_j)  # -1 pads the group
    valid = mem >= 0
    rows = tl.where(valid, mem, 0) * T + t
    act = valid & (tl.load(mask_ptr + rows, mask=valid, other=0) != 0)
    return offs_j, rows, act


@triton.jit
def _lse_partial(logits_ptr, row_stride, members_ptr, mask_ptr, T, V, split_v, n_split, inv_temp, m_ptr, s_ptr,
                 GP: tl.constexpr, BLOCK_V: tl.constexpr):
    pid = tl.program_id(0)
    sp = tl.program_id(1)
    offs_j, rows, act = _members_at(members_ptr, mask_ptr, pid, T, GP)
    if tl.sum(act.to(tl.int32), axis=0) > 0:
        row_off = rows.to(tl.int64) * row_stride
        # m_safe keeps an all -inf prefix from giving -inf - -inf = NaN; a NaN or +inf logit still makes s NaN,
        # which the caller reports.
        m_i = tl.full([GP], float("-inf"), tl.float32)
        s_i = tl.zeros([GP], tl.float32)
        for v0 in range(0, split_v, BLOCK_V):
            offs_v = sp * split_v + v0 + tl.arange(0, BLOCK_V)
            lm = act[:, None] & (offs_v < V)[None, :]
            x = tl.load(logits_ptr + row_off[:, None] + offs_v[None, :], mask=lm, other=float("-inf"))
            x = x.to(tl.float32) * inv_temp
            m_new = tl.maximum(m_i, tl.max(x, axis=1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            s_i = s_i * tl.exp(m_i - m_safe) + tl.sum(tl.exp(x - m_safe[:, None]), axis=1)
            m_i = m_new
        out = (pid * n_split + sp) * GP + offs_j
        tl.store(m_ptr + out, m_i)
        tl.store(s_ptr + out, s_i)


@triton.jit
def _js_partial(logits_ptr, row_stride, members_ptr, mask_ptr, T, V, split_v, n_split, inv_temp, mx_ptr, lse_ptr,
                pz_ptr, pp_ptr, rlr_ptr, qlq_ptr, GP: tl.constexpr, BLOCK_V: tl.constexpr):
    pid = tl.program_id(0)
    sp = tl.program_id(1)
    offs_j, rows, act = _members_at(members_ptr, mask_ptr, pid, T, GP)
    n = tl.sum(act.to(tl.int32), axis=0)
    if n > 0:
        row_off = rows.to(tl.int64) * row_stride
        mx = tl.load(mx_ptr + pid * GP + offs_j)  # 0 at inactive members: no -inf in their arithmetic
        lse = tl.load(lse_ptr + pid * GP + offs_j)
        inv_n = 1.0 / n.to(tl.float32)
        pz = tl.zeros([GP], tl.float32)
        pp = tl.zeros([GP], tl.float32)
        rlr = tl.zeros([GP], tl.float32)
        qlq = tl.sum(tl.zeros([BLOCK_V], tl.float32), axis=0)
        # where(p > 0) keeps 0 * -inf out of the sums (0 log 0 = 0).
        for v0 in range(0, split_v, BLOCK_V):
            offs_v = sp * split_v + v0 + tl.arange(0, BLOCK_V)
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
        out = (pid * n_split + sp) * GP + offs_j
        tl.store(pz_ptr + out, pz)
        tl.store(pp_ptr + out, pp)
        tl.store(rlr_ptr + out, rlr)
        tl.store(qlq_ptr + pid * n_split + sp, qlq)


def members_table(inverse: Tensor, group_size: int | None) -> Tensor:
    """[n_groups, GP] int64 row of each group's k-th member, -1 past the group's size (GP a power of two >= 2).

    With ``group_size`` (every group has exactly that many members) the table is one argsort of the group index:
    shapes come from Python, no host read. Otherwise the sizes are counted on the host (bincount, max).
    """
    B = inverse.numel()
    if group_size is not None:
        GP = max(2, triton.next_power_of_2(group_size))
        members = torch.argsort(inverse, stable=True).view(B // group_size, group_size)
        return torch.nn.functional.pad(members, (0, GP - group_size), value=-1)
    n_groups = int(inverse.max()) + 1
    sizes = torch.bincount(inverse, minlength=n_groups)
    GP = max(2, triton.next_power_of_2(int(sizes.max())))
    order = torch.argsort(inverse, stable=True)
    slot = torch.arange(B, device=inverse.device) - torch.cumsum(sizes, 0)[inverse[order]] + sizes[inverse[order]]
    members = torch.full((n_groups, GP), -1, dtype=torch.int64, device=inverse.device)
    members[inverse[order], slot] = order
    return members


def triton_group_sweep(flat: Tensor, mask: Tensor, members: Tensor, temperature: float,
                       split_v: int | None = None) -> dict[str, Tensor]:
    """flat: [B*T, V] logits (unit stride over V); mask: [B, T] bool; members: [n_groups, GP] from
    :func:`members_table`. Returns the dict of ``ictrl.core.kernels.group_js.fused_group_sweep`` with every active
    row done. Two launches, no host read; ``split_v`` (a multiple of the tile) only for tests of many slices."""
    B, T = mask.shape
    V = flat.shape[1]
    if flat.stride(1) != 1:
        flat = flat.contiguous()
    device = flat.device
    res = {k: torch.zeros(B * T, dtype=torch.float32, device=device)
           for k in ("max", "lse", "entropy", "purity", "ict")}
    res["done"] = mask.reshape(-1).clone()
    n_groups, GP = members.shape
    if n_groups == 0 or T == 0:
        return res
    BLOCK_V = max(16, min(triton.next_power_of_2(V), TILE // GP))
    split = split_v or max(BLOCK_V, min(SPLIT_V, triton.next_power_of_2(V)))
    split = triton.cdiv(split, BLOCK_V) * BLOCK_V
    n_split = triton.cdiv(V, split)
    P = n_groups * T
    members = members.to(device)
    mask8 = mask.reshape(-1).to(device=device, dtype=torch.int8)
    common = (flat, flat.stride(0), members, mask8, T, V, split, n_split, 1.0 / temperature)
    m_part = torch.full((P, n_split, GP), float("-inf"), dtype=torch.float32, device=device)
    s_part = torch.zeros_like(m_part)
    grid = (P, n_split)
    _lse_partial[grid](*common, m_part, s_part, GP=GP, BLOCK_V=BLOCK_V)
    # Slices combined: a logsumexp over [P, n_split, GP], all on the device.
    rows = torch.where(members >= 0, members, B).unsqueeze(1) * T + torch.arange(T, device=device).view(1, T, 1)
    rows = torch.where(members.unsqueeze(1) >= 0, rows, B * T).reshape(P, GP)  # B*T: a slot for padding
    act = torch.cat([mask8, mask8.new_zeros(1)])[rows] != 0  # [P, GP]
    m = m_part.amax(1)
    m_safe = torch.where(m == float("-inf"), 0.0, m)
    s = (s_part * torch.exp(m_part - m_safe.unsqueeze(1))).sum(1)
    lse = torch.where(act, s.log(), 0.0)
    mx = torch.where(act, m, 0.0)
    pz = torch.zeros_like(m_part)
    pp, rlr = torch.zeros_like(pz), torch.zeros_like(pz)
    qlq = torch.zeros(P, n_split, dtype=torch.float32, device=device)
    _js_partial[grid](*common, mx.contiguous(), lse.contiguous(), pz, pp, rlr, qlq, GP=GP, BLOCK_V=BLOCK_V)
    ent = lse - pz.sum(1)
    js = _LOG2 - 0.5 * rlr.sum(1) - 0.5 * ent + 0.5 * qlq.sum(1, keepdim=True)
    js = torch.where(act.sum(1, keepdim=True) >= 2, js.clamp(0.0, _LOG2), 0.0)
    flat_rows = rows.reshape(-1)
    for key, value in (("max", m), ("lse", lse), ("entropy", ent), ("purity", pp.sum(1)), ("ict", js)):
        buf = torch.zeros(B * T + 1, dtype=torch.float32, device=device)
        # Each active (row, position) appears once; inactive entries land in the padding slot (or are masked).
        buf.index_put_((torch.where(act.reshape(-1), flat_rows, B * T),), value.reshape(-1))
        res[key] = buf[:B * T]
    return res
