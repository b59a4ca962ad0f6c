"""The group JS sweep fused into one loop nest per block, with a clean fallback to plain torch.

Per row of a group's block it returns the row max and log-normaliser of x = logits / temperature, the entropy, sum
p^2 and the JS divergence to the group mean; ``ictrl.core.stats`` derives log p[token] from the max and normaliser and
runs its plain sweep over whatever a fused backend leaves (see ``done``). No [rows, V] buffer is allocated.

Backends (argument ``backend`` of ``token_stats`` / ``group_js_divergence``; ``auto`` can be overridden with the
environment variable ``ICTRL_STATS_BACKEND``):

- ``plain``: ``ictrl.core.stats``' chunked torch ops (~4x one log_softmax pass; the reference path);
- ``compiled`` (CPU): :func:`_block_fn` under ``torch.compile(dynamic=True)``; inductor emits one C++ loop nest per
  block, parallel over positions: per row a max pass and a sum-of-exp pass (exp kept in a per-thread [V] buffer),
  then one pass for p, the mean q, r = p + q and all the sums. The group's members are unrolled: one graph per
  padded group size (2, 4, 8, 16; members that have ended are masked out, and still computed), per logits dtype,
  and per side of V = 4096 (inductor's cascade sum above it); block length, vocabulary and batch are otherwise
  dynamic. Compiled code lands in inductor's FX graph cache (``TORCHINDUCTOR_CACHE_DIR``, set to
  ``~/.cache/ictrl/inductor`` unless already set), so the C++ compile (tens of seconds per graph on a small
  CPU) is paid once per machine; a new process still pays 4-20 s of tracing per graph and ~0.27 GB of resident
  memory for inductor itself. Groups larger than 16 go to the plain path.
- ``triton`` (CUDA): :mod:`ictrl.core.kernels.group_js_triton`, two launches for the whole batch, each split over
  (group, position) and vocabulary slices; two reads of the logits in their own dtype (an online max and
  normaliser, then everything else in registers); no host read when the caller gives ``group_size``. The same
  kernels run on CPU tensors under ``TRITON_INTERPRET=1``, which is how they are tested without a GPU.
- ``auto``: ``triton`` on CUDA when triton imports; ``compiled`` on CPU for sweeps of at least ``AUTO_MIN_LOGITS``
  active logits (smaller ones do not repay the per-process tracing); otherwise ``plain``. A fused backend that fails
  (no C++ compiler, an inductor or triton error) is logged once and ``plain`` is used from then on in the process.
  An explicitly named backend (argument or environment) raises instead, so a test of it cannot silently run plain.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor

log = logging.getLogger(__name__)

BACKENDS = ("auto", "plain", "compiled", "triton")
BUCKETS = (2, 4, 8, 16)  # padded group sizes the compiled path unrolls; larger groups take the plain path
AUTO_MIN_LOGITS = 2**25  # ~34M active logits (e.g. 224 rows at V = 151,936): below this auto stays plain
# (member, position) rows per compiled block when the caller gives no chunk_size: 64 positions of a group of 8.
# Each call is one parallel region, whose barrier costs milliseconds on a loaded machine: few, large blocks.
FUSED_ROWS = 512
FIELDS = ("max", "lse", "entropy", "purity", "ict")
_LOG2 = math.log(2.0)

_compiled: Callable[..., Tensor] | None = None
_failed: dict[str, str] = {}  # backend -> why it was switched off in this process
_announced: set[str] = set()


def resolve_backend(backend: str, device: torch.device, n_logits: int | Callable[[], int]) -> tuple[str, bool]:
    """(backend to run, whether it was named explicitly) for a sweep of n_logits active logits on device (see the
    module docstring). A named backend (argument or environment) that fails raises; "auto"'s choice falls back.
    n_logits may be a callable, called only when the choice depends on it (it reads the mask on the host)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        env = os.environ.get("ICTRL_STATS_BACKEND", "auto")
        if env not in BACKENDS:
            raise ValueError(f"ICTRL_STATS_BACKEND must be one of {BACKENDS}, got {env!r}")
        backend = env
    if backend != "auto":
        return backend, True
    if device.type == "cuda" and "triton" not in _failed and triton_available():
        return "triton", False
    if device.type == "cpu" and "compiled" not in _failed and \
            (n_logits() if callable(n_logits) else n_logits) >= AUTO_MIN_LOGITS:
        return "compiled", False
    return "plain", False


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def disable(backend: str, err: BaseException) -> None:
    """Switch a fused backend off for this process after it failed, logging why once."""
    if backend not in _failed:
        _failed[backend] = f"{type(err).__name__}: {err}".splitlines()[0][:300]
        log.warning("ictrl.core.stats: the %s group-JS path failed (%s); using the plain torch path from now on",
                    backend, _failed[backend])


def announce(backend: str) -> None:
    if backend not in _announced:
        _announced.add(backend)
        log.info("ictrl.core.stats: group JS sweep runs on the %s path", backend)


# ----------------------------------------------------------------------------------------------- compiled (CPU)


def _block_fn(flat: Tensor, idx: Tensor, act: Tensor, inv_n: Tensor, inv_temp: Tensor) -> tuple[Tensor, ...]:
    """Raw per-row sums of one group block, for :func:`_finish`.

    flat: [N, V] logits (any float dtype); idx: [G, tb] int64 rows (G static: unrolled); act: [G, tb] bool, the
    (member, position) pairs that take part (others may hold anything, e.g. padding rows or NaN); inv_n: [tb, 1]
    float32 1 / max(1, active members at t); inv_temp: 0-d float32 1 / temperature.
    Returns 5G + 1 tensors: per member [tb] the max m of x = flat[idx] * inv_temp, s = sum exp(x - m),
    sum p (x - m), sum p^2, sum r log r (r = p + q, q the mean of the active p), then [tb] sum q log q.
    Only reductions happen here: every finishing step on [tb] vectors is left to plain torch, because each small
    op inductor emits is one more parallel region and barrier, which costs milliseconds on a loaded machine.
    """
    G = idx.shape[0]
    mx, sums, pz, pp, ps = [], [], [], [], []
    q = None
    for j in range(G):  # unrolled: every per-member tensor is [tb, V], so inductor fuses the whole block
        x = flat[idx[j]].float() * inv_temp
        m = x.amax(-1, keepdim=True)
        z = x - m  # <= 0: no cancellation in the entropy of a peaked row
        e = torch.exp(z)
        s = e.sum(-1, keepdim=True)
        p = torch.where(act[j].unsqueeze(-1), e * s.reciprocal(), 0.0)  # one divide per row, not per element
        # p = 0 where z = -inf; the where keeps 0 * -inf out of the sum (0 log 0 = 0).
        pz.append(torch.where(p > 0, p * z, 0.0).sum(-1))
        pp.append((p * p).sum(-1))
        mx.append(m.squeeze(-1))
        sums.append(s.squeeze(-1))
        ps.append(p)
        q = p if q is None else q + p
    assert q is not None
    q = q * inv_n
    qlogq = torch.where(q > 0, q * torch.log(q), 0.0).sum(-1)
    rlogr = []
    for j in range(G):
        r = ps[j] + q  # 2m; H(m) = log 2 - (1/2) sum r log r
        rlogr.append(torch.where(r > 0, r * torch.log(r), 0.0).sum(-1))
    return (*mx, *sums, *pz, *pp, *rlogr, qlogq)


def _finish(raw: tuple[Tensor, ...], act: Tensor) -> Tensor:
    """[5, G, tb] float32 from :func:`_block_fn`'s sums: row max, log-normaliser lse = log s, entropy
    lse - sum p (x - m), sum p^2, JS = H(m) - H(p)/2 - H(q)/2 (0 where fewer than two members are active)."""
    G = act.shape[0]
    mx, s, pz, pp, rlogr = (torch.stack(raw[k * G:(k + 1) * G]) for k in range(5))
    qlogq = raw[-1]
    lse = s.log()
    ent = lse - pz
    js = (_LOG2 - 0.5 * rlogr - 0.5 * ent + 0.5 * qlogq).clamp_(0.0, _LOG2)
    js = torch.where(act.sum(0) >= 2, js, 0.0)  # one active member: u = 0 exactly, not rounding noise
    return torch.stack([mx, lse, ent, pp, js])


def _compiled_fn() -> Callable[..., Tensor]:
    global _compiled
    if _compiled is None:
        # A persistent cache so the C++ compile is paid once per machine, not per run (inductor's default lives in
        # /tmp). Respect a user's own setting.
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path.home() / ".cache" / "ictrl" / "inductor"))
        _compiled = torch.compile(_block_fn, dynamic=True)
    return _compiled


def _new_result(n: int, device: torch.device) -> dict[str, Tensor]:
    res = {k: torch.zeros(n, dtype=torch.float32, device=device) for k in FIELDS}
    res["done"] = torch.zeros(n, dtype=torch.bool, device=device)
    return res


def compiled_group_sweep(
    flat: Tensor, mask: Tensor, inverse: Tensor, temperature: float, rows: int
) -> dict[str, Tensor]:
    """Run :func:`_block_fn` compiled over every (group, position block); see :func:`fused_group_sweep`."""
    fn = _compiled_fn()
    B, T = mask.shape
    res = _new_result(B * T, flat.device)
    inv = torch.tensor(1.0 / temperature, dtype=torch.float32)
    for g in range(int(inverse.max()) + 1 if B else 0):
        members = (inverse == g).nonzero().squeeze(1)  # [G]
        if members.numel() > BUCKETS[-1]:
            continue  # left to the plain sweep
        sub = mask.index_select(0, members)  # [G, T]
        bucket = next(b for b in BUCKETS if b >= members.numel())
        t_block = max(2, rows // bucket)
        for t0 in range(0, T, t_block):
            t1 = min(T, t0 + t_block)
            act = sub[:, t0:t1]
            used = act.any(1)
            if int(used.sum()) < 2:
                continue  # no one, or one member alone (u = 0): the plain sweep takes its rows
            _run_block(fn, flat, res, members[used], act[used], t0, T, inv, bucket)
    return res


def _run_block(fn: Callable[..., Tensor], flat: Tensor, res: dict[str, Tensor], members: Tensor, act: Tensor,
               t0: int, T: int, inv: Tensor, bucket: int) -> None:
    """Pad members [J] to the group's bucket and positions [t0, t0 + tb) to >= 2 (a size-1 dim would be
    specialised and recompiled), call fn, scatter the active entries into res.

    The bucket is the whole group's, not the J members active in this block: one graph per group size (a trainer
    has one) rather than one per J; the price is compute on the members that have ended, at a group's tail.
    """
    J, tb = act.shape
    width = max(2, tb)
    pos = torch.arange(t0, t0 + width).clamp_(max=T - 1)
    idx = (members.unsqueeze(1) * T + pos).reshape(J, width)
    pad_act = torch.zeros(bucket, width, dtype=torch.bool)
    pad_act[:J, :tb] = act
    pad_idx = torch.empty(bucket, width, dtype=torch.long)
    pad_idx[:J] = idx
    pad_idx[J:] = idx[:1]  # any valid row; masked out by pad_act
    inv_n = 1.0 / pad_act.sum(0, keepdim=True).clamp_(min=1).t().to(torch.float32)  # [width, 1]
    out = _finish(fn(flat, pad_idx, pad_act, inv_n, inv), pad_act)  # [5, bucket, width]
    sel = pad_act.nonzero(as_tuple=True)
    rows_done = pad_idx[sel]
    for k, field in enumerate(FIELDS):
        res[field][rows_done] = out[k][sel]
    res["done"][rows_done] = True


# ----------------------------------------------------------------------------------------------- dispatch


def fused_group_sweep(backend: str, flat: Tensor, mask: Tensor, group_ids: Tensor, temperature: float,
                      rows: int, group_size: int | None = None) -> dict[str, Tensor]:
    """The fused sweep on ``backend`` ("compiled" or "triton").

    flat: [B*T, V] logits; mask: [B, T] bool; group_ids: [B] integer; group_size: every group has exactly this
    many members (lets the triton path plan without reading group_ids on the host). Returns [B*T] float32 tensors
    "max", "lse" (row max and log sum exp(x - max) of x = logits / temperature), "entropy", "purity", "ict" (0
    where fewer than two members are active), each filled where "done" ([B*T] bool) is True. Rows left undone
    (groups above the largest bucket, a member active alone in its block) are for the caller's plain sweep.
    """
    if backend == "compiled":
        if flat.device.type != "cpu":
            raise ValueError(f"the compiled group-JS path runs on CPU tensors, got {flat.device}")
        _, inverse = torch.unique(group_ids, return_inverse=True)
        return compiled_group_sweep(flat, mask, inverse, temperature, rows)
    from ictrl.core.kernels.group_js_triton import members_table, triton_group_sweep  # the other fused backend

    # With group_size, sorting the raw ids is enough to make each group contiguous (no unique: a host read).
    inverse = group_ids if group_size is not None else torch.unique(group_ids, return_inverse=True)[1]
    if inverse.numel() == 0:
        return _new_result(flat.shape[0], flat.device)
    return triton_group_sweep(flat, mask, members_table(inverse, group_size), temperature)


def fill_token_stats(res: dict[str, Tensor], flat: Tensor, tok_flat: Tensor | None, temperature: float,
                     out: dict[str, Any], ict: Tensor) -> None:
    """Write the done rows of a fused result into ``ictrl.core.stats``' [B*T] outputs (log p[token] = x[token] - max -
    lse, the same formula as log_softmax). Dense [B*T] ops: no host read of which rows are done."""
    done = res["done"]
    purity = res["purity"]
    torch.where(done, res["entropy"], out["entropy"], out=out["entropy"])
    torch.where(done, purity, out["purity"], out=out["purity"])
    torch.where(done, -purity.log(), out["renyi2"], out=out["renyi2"])
    if tok_flat is not None:
        tok = torch.where(done, tok_flat, 0).unsqueeze(1)  # padding ids at undone rows need not index V
        # A Python float, not a tensor: a scalar tensor built on the GPU is a host-to-device copy (a sync).
        z = flat.gather(1, tok).squeeze(1).float() * (1.0 / temperature)
        lp = z - res["max"] - res["lse"]
        torch.where(done, lp, out["logprob"], out=out["logprob"])
        torch.where(done, lp.exp(), out["prob"], out=out["prob"])
    torch.where(done, res["ict"], ict, out=ict)
