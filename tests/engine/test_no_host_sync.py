"""The step's ICT path reads nothing back from the device: statistics, selection, sparse head and its backward.

A host-device sync is any op that needs a tensor's value on the host: ``.item()`` / ``int()`` / ``bool()`` /
``float()`` of a tensor (all dispatch to ``aten._local_scalar_dense``) and ops whose output shape depends on the
data (nonzero, masked_select, unique, boolean-mask indexing). On a GPU each one drains the stream and stalls the
next launch. A host-to-device copy syncs too: ``torch.tensor(host data, device=cuda)`` dispatches to
``aten.lift_fresh`` before its copy, which the recorder flags (CPU tensors alone cannot show the copy itself).
A TorchDispatchMode records every aten op while the path runs on CPU tensors; the group-JS sweep runs on its
GPU backend (the Triton kernels) under Triton's interpreter, in a subprocess because TRITON_INTERPRET must be set
before triton is imported. The selection takes its dense path (what a GPU runs; CPU otherwise sorts the active
positions only, tested equal in tests/core/test_selection_dense.py). On a GPU, ``torch.cuda.set_sync_debug_mode
("error")`` checks the same path with CUDA's own detector (marked gpu).

What stays, per phase of the step (the allow-list the assertions below encode):

- statistics (``hidden_stats`` with ``group_size``, the Triton backend): nothing. The sweep is planned from the
  group size; the token-range and finite checks are device-side flags (``ictrl.core.checks.require_on_device``),
  read once per step at the next rollout, where TRL's host lists already wait for the device. Without
  ``group_size``, or on the plain and compiled backends (CPU, or a GPU without triton), the sweep reads the mask on
  the host to plan its blocks, and the top-K variant (``selection_topk``) reads each group's layout on the host.
- selection (dense path): nothing.
- normalisers (responses and tokens of an optimizer step): counted on the device, once per generation batch, when
  the loss first sees one of its micro-batches (the trainer's ``_select``); not part of the
  per-micro-batch path recorded here.
- sparse head: one ``nonzero`` of the selected positions (it gathers exactly the selected rows, whose number only
  the data knows).
- backward: nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

SYNC_OPS = ("_local_scalar_dense", "nonzero", "masked_select", "unique", "bincount", "item", "masked_scatter",
            "lift_fresh")

_SCRIPT = r'''
import contextlib, json, sys
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from ictrl.core.logprobs import selected_token_logprobs
from ictrl.core import selection
from ictrl.core.selection import SelectionInputs, get_selector
from ictrl.engine.stats_source import Request, Sweep, hidden_stats

SYNC = tuple(sys.argv[1].split(","))


class Record(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.hits = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__ if hasattr(func, "__name__") else str(func)
        full = str(func)
        bool_index = full.startswith("aten.index") and any(
            isinstance(a, (list, tuple)) and any(isinstance(t, torch.Tensor) and t.dtype == torch.bool for t in a)
            for a in args)
        if bool_index or any(s in full for s in SYNC):
            self.hits.append(full)
        return func(*args, **(kwargs or {}))


torch.manual_seed(0)
B, T, H, V, G = 8, 12, 16, 203, 4
head = nn.Linear(H, V, bias=False)
hidden = torch.randn(B, T, H, requires_grad=True)
ids = torch.randint(0, V, (B, T))
lengths = torch.tensor([12, 7, 1, 12, 3, 9, 5, 2])
mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
groups = torch.tensor([0, 1, 0, 1, 1, 0, 1, 0])  # TRL's shuffled micro-batch: whole groups, rows interleaved
selection.DENSE_ON_CPU = True  # the path an accelerator takes
selector = get_selector("ict")
options = selector.resolve_options({})
phases = {}
with Record() as rec:
    stats, js = hidden_stats(head, hidden.detach(), Request(mask, ids, groups, G),
                             Sweep(0.9, None, None, contextlib.nullcontext, V))
phases["statistics"] = rec.hits
with Record() as rec:
    selected = selector.apply(SelectionInputs(mask=mask, step=20, ict_score=js, entropy=stats.entropy,
                                              prob=stats.prob, group_ids=groups), 10, options)
phases["selection"] = rec.hits
with Record() as rec:
    logps = selected_token_logprobs(hidden, head.weight, ids, selected, temperature=0.9, mask=mask)
phases["sparse_head"] = rec.hits
with Record() as rec:
    (logps * mask).sum().backward()
phases["backward"] = rec.hits
print("RESULT " + json.dumps({"phases": phases, "selected": int(selected.sum()), "active": int(mask.sum()),
                              "js_positive": int((js > 0).sum()), "grad": float(hidden.grad.abs().sum())}))
'''


def test_ict_step_path_makes_no_host_reads() -> None:
    env = dict(os.environ, TRITON_INTERPRET="1", ICTRL_STATS_BACKEND="triton", OMP_NUM_THREADS="1")
    res = subprocess.run([sys.executable, "-c", _SCRIPT, ",".join(SYNC_OPS)], capture_output=True, text=True,
                         env=env, cwd=Path(__file__).parent, timeout=300)
    line = next((ln for ln in res.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert res.returncode == 0 and line is not None, res.stdout[-2000:] + res.stderr[-3000:]
    import json

    out = json.loads(line[len("RESULT "):])
    phases = out["phases"]
    assert phases["statistics"] == [], phases["statistics"]
    assert phases["selection"] == [], phases["selection"]
    assert phases["sparse_head"] == ["aten.nonzero.default"], phases["sparse_head"]  # the selected rows
    assert phases["backward"] == [], phases["backward"]
    # The path did real work: ICT scores, a 10%-per-response selection, a gradient.
    assert out["js_positive"] > 0 and 0 < out["selected"] < out["active"] and out["grad"] > 0


def test_check_local_groups_still_raises_on_the_device_check() -> None:
    import torch

    from ictrl.engine.loss_inputs import check_local_groups

    prompts = torch.tensor([[5, 6], [5, 6], [7, 8], [7, 8]])
    batch = {"prompt_ids": prompts, "prompt_mask": torch.ones_like(prompts)}
    check_local_groups(batch, 2)
    with pytest.raises(RuntimeError, match="do not share one prompt"):
        check_local_groups(batch, 4)
    with pytest.raises(RuntimeError, match="not a multiple of num_generations=3"):
        check_local_groups(batch, 3)


@pytest.mark.gpu
def test_no_sync_on_cuda_with_sync_debug_mode() -> None:
    """On a GPU: CUDA's own sync detector raises on any synchronising call in statistics + selection."""
    import contextlib

    import torch
    from torch import nn

    from ictrl.core.selection import SelectionInputs, get_selector
    from ictrl.engine.stats_source import Request, Sweep, hidden_stats

    torch.manual_seed(0)
    B, T, H, V, G = 16, 64, 32, 1000, 8
    head = nn.Linear(H, V, bias=False).cuda()
    hidden = torch.randn(B, T, H, device="cuda")
    ids = torch.randint(0, V, (B, T), device="cuda")
    mask = torch.arange(T, device="cuda").unsqueeze(0) < torch.randint(1, T + 1, (B, 1), device="cuda")
    groups = torch.arange(B, device="cuda") // G
    selector = get_selector("ict")
    options = selector.resolve_options({})
    request, sweep = Request(mask, ids, groups, G), Sweep(1.0, None, None, contextlib.nullcontext, V)
    hidden_stats(head, hidden, request, sweep)  # compile the kernels first
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        stats, js = hidden_stats(head, hidden, request, sweep)
        selected = selector.apply(SelectionInputs(mask=mask, step=20, ict_score=js, group_ids=groups), 10, options)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert bool((selected & ~mask).sum() == 0) and bool(selected.any())
    from ictrl.core.checks import raise_failed_device_checks

    raise_failed_device_checks()  # the deferred device checks held: valid ids, finite logits
