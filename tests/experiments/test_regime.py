"""``ictrl regime``: every per-prompt number against a float64 reference, the intervals over prompts, the verdict
rule, and the command end to end with its errors. The regimes of tinyarith and the studies' paths task told apart on
ideal bases, and the command on a task module path: tests/studies/tasks/test_paths.py."""

from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from scipy import stats as sps

from ictrl.experiments import regime


# ---------------------------------------------------------------------------------------------------- reference


def reference_numbers(logits: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor,
                      random10: torch.Tensor, temperature: float) -> dict[str, Any]:
    """The statistics, selections and record of one group, by plain loops in float64 (docs/method.md §2-4)."""
    G, T, _ = logits.shape
    p = torch.softmax(logits.double() / temperature, dim=-1)
    h1 = torch.zeros(G, T, dtype=torch.float64)
    pi = torch.zeros(G, T, dtype=torch.float64)
    u = torch.zeros(G, T, dtype=torch.float64)

    def entropy(q: torch.Tensor) -> float:
        return -sum(float(x) * math.log(float(x)) for x in q if x > 0)

    for t in range(T):
        active = [g for g in range(G) if mask[g, t]]
        mean = sum(p[g, t] for g in active) / len(active) if active else None
        for g in active:
            h1[g, t] = entropy(p[g, t])
            pi[g, t] = p[g, t, tokens[g, t]]
            m = (p[g, t] + mean) / 2
            u[g, t] = entropy(m) - entropy(p[g, t]) / 2 - entropy(mean) / 2
    ict = torch.zeros(G, T, dtype=torch.bool)
    for g in range(G):  # top ceil(10%) of each response by u, the earlier position first among ties
        pos = [t for t in range(T) if mask[g, t]]
        for t in sorted(pos, key=lambda t: (-u[g, t], t))[: math.ceil(0.1 * len(pos))]:
            ict[g, t] = True
    flat = [(g, t) for g in range(G) for t in range(T) if mask[g, t]]
    ent = torch.zeros(G, T, dtype=torch.bool)
    for g, t in sorted(flat, key=lambda gt: (-h1[gt], gt))[: math.ceil(0.2 * len(flat))]:
        ent[g, t] = True
    sel = {"ict": ict, "random10": random10, "entropy20": ent, "all": mask}

    def mean_at(x: torch.Tensor, where: torch.Tensor) -> float:
        cells = [float(x[g, t]) for g, t in flat if where[g, t]]
        return math.fsum(cells) / len(cells)

    d = next((t for t in range(T) if len({(bool(mask[g, t]), int(tokens[g, t]) if mask[g, t] else -1)
                                          for g in range(G)}) > 1), None)
    rec: dict[str, Any] = {"divergence": d}
    for name, where in sel.items():
        rec[f"pi/{name}"], rec[f"h1/{name}"] = mean_at(pi, where), mean_at(h1, where)
    for a, b in regime.pairs():
        for s in ("pi", "h1"):
            rec[f"{s}/{a}-{b}"] = rec[f"{s}/{a}"] - rec[f"{s}/{b}"]
    for name in ("ict", "random10"):
        chosen = [(g, t) for g, t in flat if sel[name][g, t]]
        rec[f"overlap/{name}&entropy20"] = sum(bool(ent[gt]) for gt in chosen) / len(chosen)
        rec[f"before/{name}"] = sum(t <= (T if d is None else d) for _, t in chosen) / len(chosen)
    return {"u": u, "h1": h1, "pi": pi, "selections": sel, "record": rec}


def a_group(seed: int, G: int = 5, T: int = 12, V: int = 7, shared: int = 3) -> tuple[torch.Tensor, ...]:
    """Logits, tokens and mask of a group whose responses share their first ``shared`` tokens (so their logits
    agree there, as a model's would), then differ; rows end at different lengths."""
    gen = torch.Generator().manual_seed(seed)
    logits = 2 * torch.randn(G, T, V, generator=gen)
    tokens = torch.randint(0, V, (G, T), generator=gen)
    tokens[:, :shared] = tokens[0, :shared]
    logits[:, : shared + 1] = logits[0, : shared + 1]
    lengths = torch.randint(shared + 2, T + 1, (G,), generator=gen)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    return logits, tokens, mask


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_group_numbers_match_a_float64_reference(seed: int) -> None:
    logits, tokens, mask = a_group(seed)
    temperature = 0.7
    st, masks = regime.group_selections(logits, tokens, mask, temperature, seed=3, index=seed)
    ref = reference_numbers(logits, tokens, mask, masks["random10"], temperature)
    torch.testing.assert_close(st.ict_score.double(), ref["u"], atol=1e-5, rtol=0)
    torch.testing.assert_close(st.entropy.double(), ref["h1"], atol=1e-5, rtol=0)
    torch.testing.assert_close(st.prob.double(), ref["pi"], atol=1e-6, rtol=0)
    for name in ("ict", "entropy20", "all"):
        assert torch.equal(masks[name], ref["selections"][name]), name
    rnd = masks["random10"]  # drawn by the selector: a subset of the mask, ceil(10%) of each response
    assert not (rnd & ~mask).any()
    assert rnd.sum(1).tolist() == [math.ceil(0.1 * int(n)) for n in mask.sum(1)]
    again = regime.group_selections(logits, tokens, mask, temperature, seed=3, index=seed + 1)[1]["random10"]
    assert not torch.equal(again, rnd) or int(mask.sum()) < 8  # one draw per prompt, not one for all
    rec = regime.group_record(st, masks, tokens, mask)
    assert rec["divergence"] == ref["record"]["divergence"] == 3
    assert rec["before/ict"] == 0.0  # u = 0 up to the divergence: ICT never picks there
    for key, value in ref["record"].items():
        assert rec[key] == pytest.approx(value, abs=1e-5), key


def test_identical_responses_have_no_divergence() -> None:
    tokens = torch.tensor([[1, 2, 3], [1, 2, 3]])
    mask = torch.tensor([[True, True, False], [True, True, False]])
    assert regime.first_divergence(tokens, mask) is None
    mask2 = torch.tensor([[True, True, True], [True, True, False]])  # one ended, the other went on
    assert regime.first_divergence(tokens, mask2) == 2


def test_intervals_over_prompts_match_scipy_and_leave_identical_groups_out() -> None:
    rng = np.random.default_rng(0)
    values = rng.normal(0.3, 0.1, size=17)
    cell = regime.mean_ci(values.tolist())
    lo, hi = sps.t.interval(0.95, len(values) - 1, loc=values.mean(), scale=sps.sem(values))
    assert (cell["mean"], cell["lo"], cell["hi"], cell["n"]) == pytest.approx((values.mean(), lo, hi, 17), abs=1e-12)
    assert regime.mean_ci([0.5])["lo"] is None and regime.mean_ci([])["mean"] is None
    share = regime.mean_ci([0.0, 0.0, 0.0, 0.1], bounds=(0.0, 1.0))  # t-interval -0.055..0.105, clipped at 0
    assert share["lo"] == 0.0 and share["hi"] == pytest.approx(0.025 + sps.t.ppf(0.975, 3) * 0.05 / 2)
    keys = ["pi/ict", "pi/random10"]
    recs = [{"divergence": 1, "tokens": 10, "responses": 2, **{k: float(v) for k, v in zip(keys, row)}}
            for row in rng.uniform(size=(6, 2))]
    recs.append({"divergence": None, "tokens": 4, "responses": 2, "pi/ict": 99.0, "pi/random10": 99.0})
    summ = regime.summarize_regime(recs)
    assert summ["prompts"] == 7 and summ["identical_groups"] == 1 and summ["pi/ict"]["n"] == 6
    assert summ["pi/ict"]["mean"] == pytest.approx(np.mean([r["pi/ict"] for r in recs[:6]]), abs=1e-12)
    assert summ["tokens_per_response"]["mean"] == pytest.approx((6 * 5 + 2) / 7)
    from ictrl.experiments.reports.regime_report import after

    assert after({"mean": 0.25, "lo": 0.125, "hi": 0.5, "n": 3}) == {"mean": 0.75, "lo": 0.5, "hi": 0.875, "n": 3}


def cell(mean: float, lo: float | None, hi: float | None, n: int = 20) -> dict[str, Any]:
    return {"mean": mean, "lo": lo, "hi": hi, "n": n}


@pytest.mark.parametrize("ict,diff,regime_name", [
    (0.26, cell(-0.12, -0.15, -0.09), "paper"),
    (0.95, cell(0.08, 0.06, 0.10), "confident"),
    (0.60, cell(-0.12, -0.15, -0.09), "confident"),  # below random, but not at low π
    (0.95, cell(0.03, 0.01, 0.05), "random"),  # differs from 0, but by less than the margin
    (0.26, cell(-0.01, -0.05, 0.03), "random"),
    (0.26, cell(-0.04, -0.07, -0.01), "undecided"),  # not within ±0.05, mean not beyond it
    (0.26, cell(-0.07, -0.12, 0.02), "undecided"),  # mean beyond -0.05, interval holds 0
    (0.90, cell(0.04, 0.02, 0.07), "undecided"),
    (0.26, cell(-0.01, None, None, 1), "unknown"),
])
def test_verdict_rule(ict: float, diff: dict[str, Any], regime_name: str) -> None:
    v = regime.verdict({"pi/ict": cell(ict, None, None), "pi/random10": cell(ict - diff["mean"], None, None),
                        "pi/ict-random10": diff})
    assert v["regime"] == regime_name
    assert ("differs from random" in v["line"]) == (regime_name in ("paper", "confident"))
    assert v["action"] == regime.ACTION[regime_name]
    assert (v["evidence"] is None) == (regime_name in ("undecided", "unknown"))
    text = regime.verdict_text(v)
    assert text.splitlines()[0] == v["line"] and "What to do: " in text
    if v["evidence"]:
        assert regime.EVIDENCE_DOC in text


def test_advice_embeds_no_study_numbers_and_promises_no_gain() -> None:
    """The studies' numbers live in the evidence doc, which the advice points to; the paper's-regime advice says the
    verdict does not predict a gain, since in the studies with that verdict ICT beat no baseline."""
    import re

    for text in [*regime.ACTION.values(), *(f for _, f in regime.EVIDENCE.values())]:
        assert not re.search(r"\d\.\d|\d{4}-\d\d-\d\d", text), text
    # the rule's own constants, and no study's π
    assert set(re.findall(r"\d+\.\d+", regime.VERDICT_RULE)) == {f"{regime.MARGIN:g}", f"{regime.PAPER_PI:g}"}
    assert "does not predict a gain" in regime.ACTION["paper"]
    assert "beat none" in regime.EVIDENCE["paper"][1]
    doc = (Path(__file__).parents[2] / regime.EVIDENCE_DOC).read_text(encoding="utf-8")
    for where, _ in regime.EVIDENCE.values():
        anchor = where.split("#")[1]
        headings = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
                    for h in re.findall(r"^#+ (.*)$", doc, flags=re.M)}
        assert anchor in headings, (anchor, headings)


def test_a_prompts_numbers_average_its_diverged_groups() -> None:
    groups = [{"responses": 4, "tokens": 20, "divergence": 2, "pi/ict": 0.2, "pi/random10": 0.5},
              {"responses": 4, "tokens": 12, "divergence": None, "pi/ict": 0.9, "pi/random10": 0.9},
              {"responses": 4, "tokens": 16, "divergence": 5, "pi/ict": 0.4, "pi/random10": None}]
    rec = regime.prompt_record(groups)
    assert rec["divergence"] == 3.5 and rec["tokens"] == 16 and rec["responses"] == 4
    assert rec["pi/ict"] == pytest.approx(0.3) and rec["pi/random10"] == 0.5  # identical group and None left out
    assert rec["identical_groups"] == 1 and rec["groups"] == groups
    none = regime.prompt_record(groups[1:2])
    assert none["divergence"] is None and none["pi/ict"] is None
    summ = regime.summarize_regime([{"id": 0, **rec}, {"id": 1, **none}])
    assert summ["groups"] == 4 and summ["identical_groups"] == 2 and summ["pi/ict"]["n"] == 1


# ---------------------------------------------------------------------------------------------------- the command


def test_command_writes_json_and_html(tiny_model_dir: Path, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    from ictrl.cli import main

    out = tmp_path / "out"
    rc = main(["regime", "--model", str(tiny_model_dir), "--prompts", "tinyarith", "--num-prompts", "3",
               "--num-generations", "4", "--seeds", "2", "--threads", "1", "--output-dir", str(out)])
    assert rc == 0, capsys.readouterr().err
    result = json.loads((out / "regime.json").read_text())  # strict JSON: no NaN
    assert len(result["prompts"]) == 3 and result["settings"]["max_new_tokens"] == 44  # tinyarith's own budget
    assert result["summary"]["prompts"] == 3 and result["summary"]["groups"] == 6
    assert all(r["responses"] == 4 and len(r["groups"]) == 2 for r in result["prompts"])
    assert all(0 <= r["before/ict"] <= 1 for r in result["prompts"] if r["before/ict"] is not None)
    page = (out / "regime.html").read_text()
    assert html.escape(result["verdict"]["line"]) in page and "entropy20" in page and "share after it" in page
    assert html.escape(result["verdict"]["action"]) in page and "sampling seeds 0-1" in page
    printed = capsys.readouterr().out
    assert regime.verdict_text(result["verdict"]) in printed


@pytest.mark.parametrize("argv,message", [
    (["--model", "{tmp}/missing", "--prompts", "tinyarith"], "--model: {tmp}/missing: no such directory"),
    (["--model", "{model}", "--prompts", "tinyarithm"], "--prompts: unknown source 'tinyarithm'; did you mean 'tinyarith'?"),
    (["--model", "{model}", "--prompts", "gsm8"], "--prompts: unknown source 'gsm8'; did you mean 'gsm8k'? (a task: "
                                                  "tinyarith or an importable task module"),
    (["--model", "{model}", "--prompts", "nomodule.tasks.x"], "or a .jsonl file); importing it: No module named "
                                                              "'nomodule'"),
    (["--model", "{model}", "--prompts", "json"], "--prompts: 'json' is not a task: it has no generate_problems"),
    (["--model", "{model}", "--prompts", "{tmp}/rows.jsonl"], "--prompts: {tmp}/rows.jsonl: no such file"),
    (["--model", "{model}", "--prompts", "tinyarith", "--num-generations", "1"], "--num-generations must be at least 2"),
    (["--model", "{model}", "--prompts", "tinyarith", "--num-generation", "8"], "unrecognized arguments: --num-generation"),
    (["--model", "{model}", "--prompts", "tinyarith", "--device", "foo"], "--device: 'foo' is not a torch device"),
    (["--model", "{model}", "--prompts", "tinyarith", "--device", "xla"], "--device xla: only cpu, cuda and mps"),
    (["--model", "{model}", "--prompts", "tinyarith", "--threads", "0"], "--threads must be at least 1"),
    (["--model", "{model}", "--prompts", "tinyarith", "--seeds", "0"], "--seeds must be at least 1"),
    pytest.param(["--model", "{model}", "--prompts", "tinyarith", "--device", "cuda"], "this machine has no CUDA device",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="the machine has CUDA")),
])
def test_bad_input_is_one_line_before_the_model_loads(argv: list[str], message: str, tiny_model_dir: Path,
                                                      tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import ictrl.models
    from ictrl.cli import main

    def no_load(*_: Any, **__: Any) -> None:
        raise AssertionError("the model loaded before the check")

    monkeypatch.setattr(ictrl.models, "load_model_and_tokenizer", no_load)
    fill = {"tmp": str(tmp_path), "model": str(tiny_model_dir)}
    try:
        rc = main(["regime", *[a.format(**fill) for a in argv]])
    except SystemExit as exc:  # argparse's own errors (an unknown flag) exit from the parser
        rc = exc.code
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message.format(**fill) in err, err
