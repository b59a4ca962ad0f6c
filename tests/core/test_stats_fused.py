"""The compiled (torch.compile / inductor C++) group JS path against the float64 reference and the plain path,
and its fallback. Compiling costs ~20-60 s per graph on a cold cache (paid once per machine: inductor's FX graph
cache), so the compiled cases share one graph: fp32, groups padded to 4 members, and V > 4096 (inductor's C++
reductions switch to a cascade-sum helper above 4096 elements, so V <= 4096 is a second graph; > 4096 is the one
real vocabularies run)."""

from __future__ import annotations

import json
import logging
import math
import subprocess
import sys
import textwrap

import pytest
import torch

from ictrl.core.kernels import group_js as fused
from ictrl.core.stats import group_js_divergence, token_stats
from test_stats import assert_matches, make_case

STAT_FIELDS = ("entropy", "renyi2", "purity", "logprob", "prob", "ict_score")


def _case():
    """Groups of 4 and 3 (both padded to 4), a group of 20 (above the largest bucket: plain), a group of one;
    ragged lengths, a late start, ties, -inf logits, a one-hot row, NaN in a masked-out row."""
    B, T, V = 29, 11, 4099
    logits, _, tokens = make_case(B=B, T=T, V=V, seed=30)
    groups = torch.tensor([0, 1, 0, 1, 0, 1, 0] + [2] * 20 + [3, 1])  # group 1 has 4 members, non-adjacent
    lengths = torch.tensor([11, 3, 7, 11, 1, 11, 5] + [9] * 20 + [6, 8])
    mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
    mask[3, :4] = False  # a late start
    logits[2, :, :10] = torch.randint(-1, 2, (T, 10)).float()  # ties
    logits[0, 1, 20:] = -math.inf
    logits[5, 2] = -math.inf
    logits[5, 2, 4] = 3.0  # one-hot
    tokens[5, 2] = 4
    tokens = torch.where(torch.isfinite(logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)), tokens,
                         logits.argmax(-1))
    logits[4, 5, 0] = math.nan  # masked out (length 1): may hold anything
    return logits, mask, tokens, groups


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_compiled_matches_reference_and_plain(temperature) -> None:
    logits, mask, tokens, groups = _case()
    clean = torch.where(mask.unsqueeze(-1), logits, torch.zeros(()))
    for chunk_size in (8, None):  # 2-position blocks of 4 members; the whole T in one block
        st = token_stats(logits, mask, tokens, temperature, chunk_size, groups, backend="compiled")
        assert_matches(st, clean, mask, tokens, temperature, groups)
        plain = token_stats(logits, mask, tokens, temperature, chunk_size, groups, backend="plain")
        for f in STAT_FIELDS:
            torch.testing.assert_close(getattr(st, f), getattr(plain, f), atol=2e-6, rtol=1e-5, msg=f)
    assert (st.ict_score[0, 7:] == 0).all() and (st.ict_score[27] == 0).all()  # alone at t >= 7; group of one


def test_compiled_non_finite_active_logit_raises() -> None:
    logits, mask, tokens, groups = _case()
    logits[1, 2, 9] = math.inf
    with pytest.raises(ValueError, match=r"\(row 1, position 2\): inf"):
        group_js_divergence(logits, mask, groups, backend="compiled")


def test_backend_choice() -> None:
    big = fused.AUTO_MIN_LOGITS
    assert fused.resolve_backend("auto", torch.device("cpu"), big - 1) == ("plain", False)
    assert fused.resolve_backend("auto", torch.device("cpu"), big) == ("compiled", False)
    assert fused.resolve_backend("auto", torch.device("mps"), big) == ("plain", False)  # no fused path there
    assert fused.resolve_backend("plain", torch.device("cpu"), big) == ("plain", True)
    with pytest.raises(ValueError, match="backend"):
        token_stats(torch.randn(2, 3, 5), torch.ones(2, 3), group_ids=torch.tensor([0, 0]), backend="fast")


def test_env_var_selects_the_plain_path(monkeypatch) -> None:
    monkeypatch.setenv("ICTRL_STATS_BACKEND", "plain")
    assert fused.resolve_backend("auto", torch.device("cpu"), 2**40) == ("plain", True)
    monkeypatch.setenv("ICTRL_STATS_BACKEND", "fast")
    with pytest.raises(ValueError, match="ICTRL_STATS_BACKEND"):
        fused.resolve_backend("auto", torch.device("cpu"), 1)


def test_a_failing_fused_path_falls_back_once_under_auto_and_raises_when_named(monkeypatch, caplog) -> None:
    def broken(*args, **kwargs):
        raise RuntimeError("simulated: no C++ compiler")

    monkeypatch.setattr(fused, "fused_group_sweep", broken)
    monkeypatch.setattr(fused, "AUTO_MIN_LOGITS", 1)
    monkeypatch.setattr(fused, "_failed", {})
    logits, mask, tokens = make_case(seed=31)
    groups = torch.tensor([0, 1, 0, 1, 0, 2])
    plain = token_stats(logits, mask, tokens, group_ids=groups, backend="plain")
    with caplog.at_level(logging.WARNING, logger=fused.__name__):
        for _ in range(2):
            st = token_stats(logits, mask, tokens, group_ids=groups)
            for f in STAT_FIELDS:
                assert torch.equal(getattr(st, f), getattr(plain, f)), f
    warnings = [r for r in caplog.records if "failed" in r.getMessage()]
    assert len(warnings) == 1 and "no C++ compiler" in warnings[0].getMessage()
    assert fused.resolve_backend("auto", torch.device("cpu"), 2**40) == ("plain", False)  # off for the process
    with pytest.raises(RuntimeError, match="no C\\+\\+ compiler"):
        token_stats(logits, mask, tokens, group_ids=groups, backend="compiled")


_NO_COMPILER = textwrap.dedent(
    """
    import json, logging, sys, torch
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    from ictrl.core.kernels import group_js as fused
    from ictrl.core.stats import token_stats
    fused.AUTO_MIN_LOGITS = 1
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 3, 17, generator=g)
    mask, groups = torch.ones(4, 3, dtype=torch.bool), torch.tensor([0, 0, 1, 1])
    auto = token_stats(logits, mask, group_ids=groups).ict_score
    plain = token_stats(logits, mask, group_ids=groups, backend="plain").ict_score
    print(json.dumps({"equal": bool(torch.equal(auto, plain)), "failed": fused._failed}))
    """
)


@pytest.mark.integration
@pytest.mark.skipif(sys.platform != "linux", reason="inductor's C++ compiler is chosen through CXX")
def test_no_cpp_compiler_falls_back_to_plain(tmp_path) -> None:
    # A machine without a working C++ compiler: CXX points at a program that fails, and a fresh cache dir means
    # no cached kernel can hide the failure.
    env = {**__import__("os").environ, "CXX": "/bin/false", "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache")}
    res = subprocess.run([sys.executable, "-c", _NO_COMPILER], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["equal"] and "compiled" in out["failed"], out
    assert res.stderr.count("using the plain torch path") == 1, res.stderr[-3000:]
