"""ictrl.core.logprobs.selected_token_logprobs against the dense computation (full logits → log_softmax → gather)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import Tensor, nn

from ictrl.core.logprobs import selected_token_logprobs
from loss_call import policy_loss_kw


def _case(B: int = 4, T: int = 7, H: int = 6, V: int = 50, bias: bool = True, seed: int = 0,
          dtype: torch.dtype = torch.float64) -> dict:
    g = torch.Generator().manual_seed(seed)
    head = nn.Linear(H, V, bias=bias).to(dtype)
    with torch.no_grad():
        head.weight.copy_(torch.randn(V, H, generator=g, dtype=dtype))
        if bias:
            head.bias.copy_(torch.randn(V, generator=g, dtype=dtype))
    lengths = torch.tensor([T, 1, T - 3, 0][:B] + [T] * max(0, B - 4))  # ragged, one empty response
    mask = torch.arange(T)[None, :] < lengths[:, None]
    selected = mask & (torch.rand(B, T, generator=g) < 0.4)
    selected[0, 0] = True
    tokens = torch.randint(0, V, (B, T), generator=g).masked_fill(~mask, -100)  # padding out of vocabulary
    return {
        "hidden": torch.randn(B, T, H, generator=g, dtype=dtype),
        "head": head, "tokens": tokens, "mask": mask, "selected": selected,
        "advantages": torch.randn(B, generator=g, dtype=dtype),
        "old_noise": 0.3 * torch.randn(B, T, generator=g, dtype=dtype),
    }


def _dense_logprobs(hidden: Tensor, head: nn.Module, tokens: Tensor, temperature: float) -> Tensor:
    logits = head(hidden) / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, tokens.clamp(min=0).unsqueeze(-1)).squeeze(-1)


def _loss_and_grads(c: dict, logprob_fn) -> tuple[Tensor, list[Tensor]]:
    hidden = c["hidden"].clone().requires_grad_(True)
    head = c["head"]
    head.zero_grad(set_to_none=True)
    lp = logprob_fn(hidden, head)
    old = (lp.detach() + c["old_noise"]).masked_fill(~c["mask"], 0.0)
    loss, _ = policy_loss_kw(lp, old, c["advantages"], c["mask"], c["selected"], kl_coef=0.0)
    loss.backward()
    grads = [hidden.grad] + [p.grad if p.grad is not None else torch.zeros_like(p) for p in head.parameters()]
    return loss.detach(), grads


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk_size", [None, 1, 3])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("path", ["fused", "module"])
def test_loss_and_gradients_match_dense_float64(temperature: float, chunk_size: int | None, bias: bool,
                                                path: str) -> None:
    """Fused path (nn.Linear) and checkpointed path (any other module) both give the dense loss and gradients."""
    c = _case(bias=bias, seed=int(temperature * 10) + (chunk_size or 0))
    dense_loss, dense_grads = _loss_and_grads(c, lambda h, m: _dense_logprobs(h, m, c["tokens"], temperature))

    def sparse(h: Tensor, m: nn.Module) -> Tensor:
        head = m if path == "fused" else nn.Sequential(m)  # Sequential is not nn.Linear: the generic path
        return selected_token_logprobs(h, head, c["tokens"], c["selected"], temperature, chunk_size)

    sparse_loss, sparse_grads = _loss_and_grads(c, sparse)
    assert dense_loss.abs() > 1e-6  # the case carries a real gradient
    torch.testing.assert_close(sparse_loss, dense_loss, rtol=1e-12, atol=1e-12)
    for got, want in zip(sparse_grads, dense_grads):
        assert want.abs().max() > 0
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_values_at_selected_and_unselected_positions() -> None:
    c = _case(seed=3)
    dense = _dense_logprobs(c["hidden"], c["head"], c["tokens"], 0.8).detach()
    sparse = selected_token_logprobs(c["hidden"], c["head"], c["tokens"], c["selected"], 0.8, 2)
    torch.testing.assert_close(sparse[c["selected"]], dense[c["selected"]], rtol=1e-12, atol=1e-12)
    assert bool((sparse[~c["selected"]] == 0).all())

    hidden = c["hidden"].clone().requires_grad_(True)
    full = selected_token_logprobs(hidden, c["head"], c["tokens"], c["selected"], 0.8, 2,
                                   with_unselected=True, mask=c["mask"])
    torch.testing.assert_close(full[c["mask"]], dense[c["mask"]], rtol=1e-12, atol=1e-12)
    assert bool((full[~c["mask"]] == 0).all())
    # The unselected values are constants: a loss on them alone gives hidden no gradient.
    rest = c["mask"] & ~c["selected"]
    assert bool(rest.any())
    (full * rest).sum().backward()
    assert float(hidden.grad.abs().max()) == 0.0


@pytest.mark.parametrize("path", ["fused", "module"])
def test_empty_selection_gives_zero_finite_gradients(path: str) -> None:
    c = _case(seed=5)
    c["selected"] = torch.zeros_like(c["mask"])
    wrap = (lambda m: m) if path == "fused" else nn.Sequential
    loss, grads = _loss_and_grads(c, lambda h, m: selected_token_logprobs(h, wrap(m), c["tokens"], c["selected"]))
    assert float(loss) == 0.0
    for g in grads:
        assert bool(torch.isfinite(g).all()) and float(g.abs().max()) == 0.0


def test_weight_tensor_head_and_tied_embeddings_match_model_logits() -> None:
    """A tiny Qwen2 (tied embeddings, final norm inside the backbone): gradients equal the model's own logits."""
    from ictrl.models import build_byte_tokenizer, build_tiny_qwen2

    model = build_tiny_qwen2(build_byte_tokenizer(), hidden_size=32, num_hidden_layers=1, seed=1).double()
    head = model.get_output_embeddings()
    assert head.weight is model.get_input_embeddings().weight  # tied
    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, 259, (3, 12), generator=g)
    P = 5
    tokens = input_ids[:, P:]
    selected = torch.rand(tokens.shape, generator=g) < 0.5
    weights = torch.randn(tokens.shape, generator=g, dtype=torch.float64)

    def grads(use_sparse: bool, as_tensor: bool) -> list[Tensor]:
        model.zero_grad(set_to_none=True)
        if use_sparse:
            hidden = model.base_model(input_ids=input_ids).last_hidden_state[:, P - 1:-1]
            lp = selected_token_logprobs(hidden, head.weight if as_tensor else head, tokens, selected, 1.3)
        else:
            logits = model(input_ids=input_ids).logits[:, P - 1:-1] / 1.3
            lp = torch.log_softmax(logits, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        (lp * weights * selected).sum().backward()
        return [p.grad.clone() for p in model.parameters()]

    dense = grads(False, False)
    for as_tensor in (False, True):
        for got, want in zip(grads(True, as_tensor), dense):
            torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)
    assert float(dense[0].abs().max()) > 0  # the embedding (= head) gradient is non-trivial


def test_bfloat16_hidden_gives_float32_logprobs() -> None:
    c = _case(seed=7, dtype=torch.float32)
    want = _dense_logprobs(c["hidden"], c["head"], c["tokens"], 1.0).detach()
    head16 = nn.Linear(6, 50).to(torch.bfloat16)
    head16.load_state_dict({k: v.to(torch.bfloat16) for k, v in c["head"].state_dict().items()})
    got = selected_token_logprobs(c["hidden"].to(torch.bfloat16), head16, c["tokens"], c["selected"])
    assert got.dtype == torch.float32
    torch.testing.assert_close(got[c["selected"]], want[c["selected"]], rtol=0.05, atol=0.15)
    # bf16 activations into an fp32 head (TRL's cast_lm_head_to_fp32): computed in fp32, gradient back in bf16.
    hidden16 = c["hidden"].to(torch.bfloat16).requires_grad_(True)
    got = selected_token_logprobs(hidden16, c["head"], c["tokens"], c["selected"], with_unselected=True,
                                  mask=c["mask"])
    torch.testing.assert_close(got[c["mask"]], want[c["mask"]], rtol=0.02, atol=0.05)
    got.sum().backward()
    assert hidden16.grad.dtype == torch.bfloat16 and bool(torch.isfinite(hidden16.grad).all())


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"hidden": torch.zeros(4, 7)}, "hidden must be"),
        ({"lm_head": torch.zeros(50, 5)}, "lm_head as a tensor"),
        ({"lm_head": "head"}, "lm_head must be"),
        ({"tokens": torch.zeros(4, 6, dtype=torch.long)}, "tokens must have shape"),
        ({"tokens": torch.zeros(4, 7)}, "tokens must be an integer"),
        ({"selected": torch.full((4, 7), 2)}, "selected must be bool"),
        ({"temperature": 0.0}, "temperature"),
        ({"chunk_size": 0}, "chunk_size"),
        ({"tokens": torch.full((4, 7), 50)}, r"tokens at the positions scored must lie in \[0, 50\)"),
        ({"mask": torch.zeros(4, 7, dtype=torch.bool)}, "subset of mask"),
    ],
)
def test_invalid_arguments_raise(change: dict, match: str) -> None:
    c = _case(seed=0)
    kwargs = {"hidden": c["hidden"], "lm_head": c["head"], "tokens": c["tokens"].clamp(min=0),
              "selected": c["selected"], **change}
    with pytest.raises(ValueError, match=match):
        selected_token_logprobs(**kwargs)


_MEMORY_SCRIPT = textwrap.dedent("""
    import json, sys
    import torch
    from ictrl.core.logprobs import selected_token_logprobs
    torch.set_num_threads(1)
    B, T, H, V = 8, 64, 64, 100_000
    torch.manual_seed(0)  # nn.Linear initialises from the global generator
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(B, T, H, generator=g, requires_grad=True)
    head = torch.nn.Linear(H, V, bias=False)
    tokens = torch.randint(0, V, (B, T), generator=g)
    selected = torch.rand(B, T, generator=g) < 0.1

    def step(head, tokens):
        if sys.argv[1] == "dense":
            lp = torch.log_softmax(head(hidden), -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        else:
            lp = selected_token_logprobs(hidden, head, tokens, selected)
        (lp * selected).sum().backward()

    step(torch.nn.Linear(H, 300, bias=False), tokens % 300)  # first calls page in kernels: keep that out of the delta
    hidden.grad = None

    def status_kb(key):
        return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(key))

    # Not ru_maxrss: Linux carries the parent's high-water mark across fork+exec into it. VmHWM is this process's
    # own peak, and writing 5 to clear_refs resets it to the current RSS.
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = status_kb("VmRSS:")
    step(head, tokens)
    print(json.dumps({"delta_kb": status_kb("VmHWM:") - before, "grad": float(hidden.grad.abs().sum())}))
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_sparse_backward_peak_memory_is_much_lower() -> None:
    """Peak RSS growth of one forward+backward at V = 100,000, 512 positions, 10% selected, each in a fresh process."""
    result = {}
    for mode in ("dense", "sparse"):
        proc = subprocess.run([sys.executable, "-c", _MEMORY_SCRIPT, mode], capture_output=True, text=True,
                              timeout=120, check=True)
        result[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
    # Same gradient, far less memory: dense holds [512, V] logits + log-softmax + their gradients (~200 MB each).
    assert result["sparse"]["grad"] == pytest.approx(result["dense"]["grad"], rel=1e-4)
    assert result["dense"]["delta_kb"] > 300_000
    assert result["sparse"]["delta_kb"] < 0.3 * result["dense"]["delta_kb"], result
