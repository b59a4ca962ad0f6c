"""``call_head``: the LM head's whole weight for the statistics sweep and the sparse head, on every engine.

The sharded paths themselves run in test_fsdp.py (FSDP2 on 2 CPU processes); these check the plain and ZeRO-3-style
dispatch in one process: a biased head goes through an ``nn.Linear`` shell holding the very tensors, a head whose
weight carries DeepSpeed's ``ds_id`` runs ``fn`` inside the head module's forward (where ZeRO-3's hooks gather it),
and any other head module keeps its own forward.
"""

from __future__ import annotations

import torch
from torch import nn

from ictrl.engine.heads import call_head
from ictrl.core.logprobs import selected_token_logprobs


def _case() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 5, 8, generator=g, requires_grad=True)
    tokens = torch.randint(0, 11, (2, 5), generator=g)
    selected = torch.rand(2, 5, generator=g) < 0.6
    return hidden, tokens, selected


def test_biased_head_matches_dense_and_gets_gradients() -> None:
    hidden, tokens, selected = _case()
    head = nn.Linear(8, 11)
    got = call_head(head, lambda lm, h: selected_token_logprobs(h, lm, tokens, selected), hidden)
    got.sum().backward()
    grads = (head.weight.grad.clone(), head.bias.grad.clone(), hidden.grad.clone())
    head.zero_grad()
    hidden.grad = None
    dense = torch.log_softmax(head(hidden), -1).gather(-1, tokens[..., None]).squeeze(-1) * selected
    dense.sum().backward()
    torch.testing.assert_close(got, dense)
    for a, b in zip(grads, (head.weight.grad, head.bias.grad, hidden.grad)):
        torch.testing.assert_close(a, b)


def test_zero3_style_head_runs_inside_its_forward_hooks() -> None:
    hidden, tokens, selected = _case()
    head = nn.Linear(8, 11, bias=False)
    head.weight.ds_id = 0  # what ZeRO-3 tags its partitioned parameters with
    seen: list[str] = []
    head.register_forward_pre_hook(lambda module, args: seen.append("pre"))
    head.register_forward_hook(lambda module, args, out: seen.append("post"))

    def fn(lm: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        seen.append("fn")
        return selected_token_logprobs(h, lm, tokens, selected)

    out = call_head(head, fn, hidden)
    assert seen == ["pre", "fn", "post"]
    assert "forward" not in head.__dict__  # the instance forward is removed again
    ref = selected_token_logprobs(hidden, head.weight, tokens, selected)
    torch.testing.assert_close(out, ref)


def test_other_head_modules_keep_their_forward() -> None:
    hidden, _, _ = _case()

    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = nn.Linear(8, 11, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return 2 * self.inner(x)

    head = Scaled()
    out = call_head(head, lambda lm, h: lm(h), hidden)
    torch.testing.assert_close(out, head(hidden))
