"""``ictrl inspect``: rollouts schema, HTML escaping and structure, and end to end on the tiny model."""

from __future__ import annotations

import argparse
import html
import json
import math
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
import torch

from ictrl.experiments import inspect as ins
from ictrl.experiments.inspect import Rollout, load_rollouts, render_inspect_html, rollouts_from_tensors, save_rollouts
from ictrl.experiments.sampling import generate_group

NASTY = ["<b>", "&amp;", " ", "\n", "a b", '"q"', "", "\t", "\x01", "é"]
SHOWN = ["<b>", "&amp;", "·", "↵", "a·b", '"q"', "∅", "→", "\\x01", "é"]  # visible text of each token


class TokenSpans(HTMLParser):
    """Collects every span whose class list has "tok": its classes, title and visible text."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.spans: list[dict] = []
        self._depth = 0  # nesting depth inside the current token span

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if self._depth:
            self._depth += tag == "span"
            return
        if tag == "span" and "tok" in (a.get("class") or "").split():
            self.spans.append({"cls": a["class"].split(), "title": a.get("title"), "style": a.get("style"), "text": ""})
            self._depth = 1

    def handle_endtag(self, tag: str) -> None:
        if self._depth and tag == "span":
            self._depth -= 1

    def handle_data(self, data: str) -> None:
        if self._depth:
            self.spans[-1]["text"] += data


def parse(path: Path) -> list[dict]:
    p = TokenSpans()
    p.feed(path.read_text(encoding="utf-8"))
    return p.spans


def make_rollouts() -> list[Rollout]:
    n = len(NASTY)
    return [
        Rollout("What is 2<3 & 4?", NASTY, [0.01 * i for i in range(n)], [0.1 * i for i in range(n)],
                [1 - 0.05 * i for i in range(n)], [i in (0, 3, 6) for i in range(n)], reward=1.0, group=0),
        Rollout("What is 2<3 & 4?", ["x", "y"], [0.3, 0.0], [2.0, 0.0], [0.5, 0.25], [True, False], reward=0.0),
        Rollout("second prompt", ["z"], [0.0], [0.0], [1.0], [False], group=1),
    ]


def test_html_escaping_and_structure(tmp_path: Path) -> None:
    rollouts = make_rollouts()
    out = render_inspect_html(rollouts, tmp_path / "page.html", title="<inspect>", meta={"model": "a&b"})
    text = out.read_text(encoding="utf-8")
    spans = parse(out)
    tokens = [t for r in rollouts for t in r.tokens]
    assert len(spans) == len(tokens)  # one span per token
    assert [s["text"] for s in spans[: len(NASTY)]] == SHOWN
    n_sel = sum(sum(r.selected) for r in rollouts)
    assert sum("sel" in s["cls"] for s in spans) == n_sel
    flat = [(r.u[i], r.entropy[i], r.prob[i], r.selected[i]) for r in rollouts for i in range(len(r.tokens))]
    for s, (u, h, p, sel) in zip(spans, flat):
        fields = dict(line.split("=", 1) for line in s["title"].splitlines() if "=" in line)
        assert float(fields["u"]) == pytest.approx(u, rel=1e-3, abs=1e-12)
        assert float(fields["H1"]) == pytest.approx(h, rel=1e-3, abs=1e-12)
        assert float(fields["π"]) == pytest.approx(p, rel=1e-3, abs=1e-12)
        assert ("selected" in s["title"]) == sel
    # colour: white at 0, the full colour at the page maximum (u max 0.3, H1 max 2.0)
    assert "--u:#ffffff" in spans[0]["style"]
    assert f"--u:#{ins.U_RGB[0]:02x}{ins.U_RGB[1]:02x}{ins.U_RGB[2]:02x}" in spans[len(NASTY)]["style"]
    assert f"--h:#{ins.H_RGB[0]:02x}{ins.H_RGB[1]:02x}{ins.H_RGB[2]:02x}" in spans[len(NASTY)]["style"]
    assert "<b>" not in text.split("<body>", 1)[1].replace("<b>Colour by</b>", "")
    assert "&lt;inspect&gt;" in text and "a&amp;b" in text and "2&lt;3 &amp; 4?" in text
    assert text.count('class="prompt"') == 2  # one header per (group, prompt)
    assert "<script" not in text and "http" not in text  # no JS, no external assets
    assert "0.3 nats" in text and "2 nats" in text  # legend maxima


def test_save_load_roundtrip_and_errors(tmp_path: Path) -> None:
    rollouts = make_rollouts()
    path = save_rollouts(tmp_path / "r.jsonl", rollouts)
    loaded = load_rollouts(path)
    for a, b in zip(loaded, rollouts):
        assert (a.prompt, a.tokens, a.selected, a.reward, a.group) == (b.prompt, b.tokens, b.selected, b.reward, b.group)
        for name in ("u", "entropy", "prob"):  # stored at float32 precision
            f32 = torch.tensor(getattr(b, name), dtype=torch.float32)
            assert torch.equal(torch.tensor(getattr(a, name), dtype=torch.float32), f32)
    lines = path.read_text(encoding="utf-8").splitlines()
    assert set(json.loads(lines[0])) == {"prompt", "tokens", "u", "entropy", "prob", "selected", "reward", "group"}
    bad = dict(json.loads(lines[1]), u=[0.1])
    path.write_text(lines[0] + "\n" + json.dumps(bad) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"r\.jsonl:2: field 'u' must be a list of 2 values"):
        load_rollouts(path)
    for broken, msg in (("{oops", "not valid JSON"), ('{"prompt": "p"}', "missing field 'entropy'"),
                        (json.dumps(dict(json.loads(lines[1]), extra=1)), "unknown field 'extra'"),
                        (json.dumps(dict(json.loads(lines[1]), prob=[0.5, math.inf])), r"'prob'\[1\]")):
        path.write_text(broken + "\n", encoding="utf-8")
        with pytest.raises(ValueError, match=msg):
            load_rollouts(path)
    path.write_text("\n", encoding="utf-8")
    with pytest.raises(ValueError, match="no rollouts"):
        load_rollouts(path)


def test_rollouts_from_tensors_keeps_masked_positions() -> None:
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.bool)
    u = torch.arange(8, dtype=torch.float32).view(2, 4) / 10
    sel = torch.tensor([[0, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.bool)
    toks = [["a", "b", "c", "<pad>"], ["d", "e", "<pad>", "<pad>"]]
    rs = rollouts_from_tensors(["p", "p"], toks, mask, u, u * 2, 1 - u, sel, rewards=[1.0, 0.0], group_ids=[3, 3])
    assert [r.tokens for r in rs] == [["a", "b", "c"], ["d", "e"]]
    assert rs[1].u == pytest.approx([0.4, 0.5]) and rs[0].selected == [False, True, False]
    assert rs[0].reward == 1.0 and rs[1].group == 3


def naive_reference(logits: torch.Tensor, mask: torch.Tensor, response: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """float64 H1, pi and group JS (one group, mean over the responses active at t) by the definition."""
    p = torch.softmax(logits.double(), -1)
    h = -(p * torch.log(p.clamp_min(1e-300))).sum(-1)
    pi = p.gather(-1, response.unsqueeze(-1)).squeeze(-1)
    m = mask.double().unsqueeze(-1)
    pbar = (p * m).sum(0) / m.sum(0).clamp_min(1)
    mid = 0.5 * (p + pbar)

    def kl(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (a * (torch.log(a.clamp_min(1e-300)) - torch.log(b.clamp_min(1e-300)))).sum(-1)

    u = 0.5 * kl(p, mid) + 0.5 * kl(pbar.expand_as(p), mid)
    u = torch.where(mask.sum(0, keepdim=True) > 1, u, torch.zeros_like(u))
    return h * mask, pi * mask, u * mask


@pytest.mark.integration
def test_end_to_end_on_tiny_model(tiny_model_dir: Path, tmp_path: Path) -> None:
    from ictrl.models import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer(str(tiny_model_dir), device="cpu")
    prompt_ids, response, mask = generate_group(model, tok, "Q: 2+3=", 4, 16, temperature=1.0, seed=0)
    assert response.shape == (4, 16)
    rollouts = ins.score_group(model, tok, "Q: 2+3=", prompt_ids, response, mask, 1.0, "ict", 0.1, "response")
    with torch.no_grad():
        full = torch.cat([prompt_ids.expand(4, -1), response], 1)
        logits = model(full).logits[:, prompt_ids.shape[1] - 1 : -1]
    h, pi, u = naive_reference(logits, mask, response)
    for b, r in enumerate(rollouts):
        keep = mask[b].nonzero().flatten()
        assert len(r.tokens) == len(keep)
        torch.testing.assert_close(torch.tensor(r.entropy, dtype=torch.float64), h[b, keep], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(torch.tensor(r.prob, dtype=torch.float64), pi[b, keep], atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(torch.tensor(r.u, dtype=torch.float64), u[b, keep], atol=1e-6, rtol=1e-4)
        # ict, scope response: the top ceil(0.1 n) by u (ties aside) are selected
        k = math.ceil(0.1 * len(keep))
        assert sum(r.selected) == k
        assert min(x for x, s in zip(r.u, r.selected) if s) >= max((x for x, s in zip(r.u, r.selected) if not s), default=0)

    # the same through the command, with the rollouts saved and re-rendered
    out, saved = tmp_path / "inspect.html", tmp_path / "rollouts.jsonl"
    parser = argparse.ArgumentParser()
    ins.add_arguments(parser)
    args = parser.parse_args(["--model", str(tiny_model_dir), "--prompt", "Q: 2+3=", "--num-generations", "4",
                              "--max-new-tokens", "16", "--out", str(out), "--save-rollouts", str(saved)])
    assert ins.run(args) == 0
    again = load_rollouts(saved)
    assert [x.tokens for x in again] == [x.tokens for x in rollouts]  # same seed, same samples
    spans = parse(out)
    assert len(spans) == sum(len(x.tokens) for x in again)
    assert sum("sel" in s["cls"] for s in spans) == sum(sum(x.selected) for x in again)
    assert html.escape("Q: 2+3=") in out.read_text(encoding="utf-8")


def test_rollouts_file_mode_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ictrl.cli import main

    path = save_rollouts(tmp_path / "r.jsonl", make_rollouts())
    out = tmp_path / "page.html"
    assert main(["inspect", "--rollouts", str(path), "--out", str(out)]) == 0
    assert len(parse(out)) == sum(len(r.tokens) for r in make_rollouts())
    assert main(["inspect", "--rollouts", str(tmp_path / "missing.jsonl"), "--out", str(out)]) == 2
    assert "missing.jsonl" in capsys.readouterr().err
    assert main(["inspect", "--model", "somewhere", "--out", str(out)]) == 2
    assert "--prompt is required" in capsys.readouterr().err
    # a sampling flag out of range: one line naming it, before the (here missing) model is looked at
    assert main(["inspect", "--model", "somewhere", "--prompt", "1+1=", "--num-generations", "1",
                 "--out", str(out)]) == 2
    assert "--num-generations must be at least 2" in capsys.readouterr().err
    # an option the selector does not take: one line naming it, before the (here missing) model is looked at
    assert main(["inspect", "--model", "somewhere", "--prompt", "1+1=", "--selector", "grpo", "--ratio", "0.2",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "unknown option(s) ['ratio'] for selector 'all'" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(SystemExit):
        main(["inspect", "--out", str(out)])  # neither --model nor --rollouts


@pytest.mark.parametrize(("device", "message"), [
    ("foo", "--device: 'foo' is not a torch device"),
    ("xla", "--device xla: only cpu, cuda and mps"),
    pytest.param("cuda", "this machine has no CUDA device",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")),
])
def test_a_bad_device_is_one_line_before_the_model_loads(device: str, message: str, tiny_model_dir: Path,
                                                         tmp_path: Path, loader_calls: list[Any],
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    from ictrl.cli import main

    argv = ["inspect", "--model", str(tiny_model_dir), "--prompt", "Q:1+1=A:", "--device", device,
            "--out", str(tmp_path / "page.html")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ictrl inspect: error:") and message in err[0], err
    assert loader_calls == []


def test_inspect_runs_a_rule_from_the_users_own_module(tiny_model_dir: Path, h2rule: Path) -> None:
    """``ictrl inspect --selector h2rule:top_h2``: the rule sees the sweep's H2 (and no statistic it does not read)
    and its selection is the page's."""
    import importlib

    from ictrl.cli import main

    saved = h2rule / "rollouts.jsonl"
    argv = ["inspect", "--model", str(tiny_model_dir), "--prompt", "Q: 2+3=", "--num-generations", "4",
            "--max-new-tokens", "12", "--selector", "h2rule:top_h2", "--out", str(h2rule / "inspect.html"),
            "--save-rollouts", str(saved)]
    assert main(argv) == 0
    (seen,) = importlib.import_module("h2rule").SEEN
    assert seen.renyi2 is not None and seen.__dict__["ict_score"] is None and seen.__dict__["entropy"] is None
    rollouts = load_rollouts(saved)
    active = seen.mask.sum(1).tolist()
    assert [len(r.tokens) for r in rollouts] == active
    assert [sum(r.selected) for r in rollouts] == [-(-n // 10) for n in active]  # ceil(0.1 n) of each response
    for r, h2, mask in zip(rollouts, seen.renyi2, seen.mask):
        chosen = [float(x) for x, s in zip(h2[mask], r.selected) if s]
        assert min(chosen) >= max((float(x) for x, s in zip(h2[mask], r.selected) if not s), default=0.0)


def test_a_page_ictrl_did_not_write_is_never_replaced(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``ictrl inspect`` into a folder holding someone's inspect.html (or ``--out`` naming someone's file): one line,
    the file as it was; its own page, listed or written by an earlier ictrl, is replaced."""
    from ictrl.cli import main

    rollouts = save_rollouts(tmp_path / "r.jsonl", make_rollouts())
    out = tmp_path / "out"
    out.mkdir()
    (out / "inspect.html").write_text("<html>my notes</html>")
    assert main(["inspect", "--rollouts", str(rollouts), "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.strip() == (f"ictrl inspect: error: --output-dir: {out / 'inspect.html'} was not written by ictrl and "
                           "the command would replace it; choose another output directory or move the file away")
    assert (out / "inspect.html").read_text() == "<html>my notes</html>"
    mine = tmp_path / "page.html"
    mine.write_text("mine")
    assert main(["inspect", "--rollouts", str(rollouts), "--out", str(mine)]) == 2
    assert f"--out: {mine} was not written by ictrl" in capsys.readouterr().err and mine.read_text() == "mine"
    own = tmp_path / "own"
    assert main(["inspect", "--rollouts", str(rollouts), "--output-dir", str(own)]) == 0
    assert main(["inspect", "--rollouts", str(rollouts), "--output-dir", str(own)]) == 0  # listed: its own
    (own / ".ictrl-files.json").unlink()  # a page an earlier ictrl wrote, before the list: known by its head
    assert main(["inspect", "--rollouts", str(rollouts), "--output-dir", str(own)]) == 0


# ------------------------------------------------------------------------------------------------ the rule applied


def page_of(argv: list[str], out: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, list[dict], str]:
    """``ictrl inspect ARGV --out OUT``: status, token spans and page text (the error line on failure)."""
    from ictrl.cli import main

    code = main(["inspect", *argv, "--out", str(out)])
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return code, (parse(out) if code == 0 else []), (out.read_text() if code == 0 else err.strip())


def test_a_selector_on_a_rollouts_file_selects_again(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rollouts = make_rollouts()  # the file's own selection: tokens 0, 3 and 6 of the first response
    path = save_rollouts(tmp_path / "r.jsonl", rollouts)
    for argv in (["--selector", "ict", "--ratio", "0.5"], ["--selector", "ict(ratio=0.5)"]):
        code, spans, text = page_of(["--rollouts", str(path), *argv], tmp_path / "page.html", capsys)
        assert code == 0, text
        expected = []
        for r in rollouts:  # naive: the ceil(n/2) highest u of each response, the earlier position on a tie
            order = sorted(range(len(r.u)), key=lambda t: (-r.u[t], t))[: -(-len(r.u) // 2)]
            expected += [t in order for t in range(len(r.u))]
        assert ["sel" in s["cls"] for s in spans] == expected
        assert "selector: ict(ratio=0.5, scope=response)" in text and "rule source: ictrl&#x27;s own" in text
    code, spans, text = page_of(["--rollouts", str(path)], tmp_path / "page.html", capsys)
    assert ["sel" in s["cls"] for s in spans] == [s for r in rollouts for s in r.selected]  # no --selector: the file's


def test_a_selector_reading_what_the_file_lacks_is_one_line(tmp_path: Path, h2rule: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    path = save_rollouts(tmp_path / "r.jsonl", make_rollouts())  # u, H1 and π only: no H2
    code, _, err = page_of(["--rollouts", str(path), "--selector", "h2rule:top_h2"], tmp_path / "page.html", capsys)
    assert code == 2 and len(err.splitlines()) == 1
    assert err == (f"ictrl inspect: error: --selector top_h2: it reads renyi2 ('renyi2'), which {path} does not hold; "
                   "score the prompt again with --model ... --save-rollouts")
    code, _, err = page_of(["--rollouts", str(path), "--selector", "stapo"], tmp_path / "page.html", capsys)
    assert code == 2 and "needs advantages (from rewards): give --answer" in err
    assert not (tmp_path / "page.html").exists()


STEPRULE = '''
from ictrl.core.selection import register_selector


@register_selector("at_step")
def at_step(inputs, *, offset=0):
    """The token at position step + offset of each response."""
    chosen = inputs.mask.clone() & False
    chosen[:, inputs.step + offset] = True
    return chosen
'''


def test_the_rule_sees_the_step_and_its_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    import sys

    (tmp_path / "steprule.py").write_text(STEPRULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    rollouts = [r for r in make_rollouts() if len(r.tokens) > 3]
    path = save_rollouts(tmp_path / "r.jsonl", rollouts)
    try:
        code, spans, text = page_of(["--rollouts", str(path), "--selector", "steprule:at_step(offset=1)", "--step",
                                     "2"], tmp_path / "page.html", capsys)
    finally:
        sys.modules.pop("steprule", None)
    assert code == 0, text
    assert [i for i, s in enumerate(spans) if "sel" in s["cls"]] == [3]
    assert "selector: steprule:at_step(offset=1)" in text and "step: 2" in text and "steprule.py, sha256 " in text


def test_the_page_colours_by_the_rules_statistic_and_shows_advantages(tiny_model_dir: Path, h2rule: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """--model with --answer and a user's rule on H2: the saved file keeps every statistic and the rewards the page
    shows; the page opens on H2, names the rule's file and hash, and shows each response's advantage; the rule
    applied again to the saved file gives the same selection."""
    import hashlib

    saved = h2rule / "rollouts.jsonl"
    argv = ["--model", str(tiny_model_dir), "--prompt", "Q: 2+3=", "--num-generations", "4", "--max-new-tokens", "12",
            "--selector", "h2rule:top_h2(ratio=0.2)", "--answer", "5", "--save-rollouts", str(saved)]
    code, spans, text = page_of(argv, h2rule / "inspect.html", capsys)
    assert code == 0, text
    rollouts = load_rollouts(saved)
    assert all(r.reward == 0.0 for r in rollouts)  # the tiny model does not box 5: graded, not null
    assert all(r.renyi2 is not None and r.purity is not None and r.logprob is not None for r in rollouts)
    assert '<input type="radio" class="vr" name="view" id="view-h2" checked>' in text
    assert all("--h2:#" in s["style"] and "--beta:#" in s["style"] and "--lp:#" in s["style"] for s in spans)
    sha = hashlib.sha256((h2rule / "h2rule.py").read_bytes()).hexdigest()
    assert f"h2rule.py, sha256 {sha[:16]}" in text and "selector: h2rule:top_h2(ratio=0.2)" in text
    assert text.count("advantage +0") == 4  # one group, every reward 0: advantage 0 each
    again = h2rule / "again.html"
    code, spans_again, _ = page_of(["--rollouts", str(saved), "--selector", "h2rule:top_h2(ratio=0.2)"], again,
                                   capsys)
    assert code == 0 and [s["cls"] for s in spans_again] == [s["cls"] for s in spans]
    assert [sum(r.selected) for r in rollouts] == [-(-len(r.tokens) // 5) for r in rollouts]


def test_advantages_are_the_groups_normalised_rewards(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--answer on a rollouts file: each response's advantage (r − mean) / (std + 1e-4) within its group, against a
    float64 reference; stapo, which reads them, runs."""
    import statistics

    texts = [["\\boxed{7}"], ["\\boxed{8}"], ["\\boxed{7}"], ["no"], ["\\boxed{7}"]]
    groups = [0, 0, 0, 0, 1]
    rollouts = [Rollout("p", t, [0.1], [0.5], [0.001], [False], group=g) for t, g in zip(texts, groups)]
    path = save_rollouts(tmp_path / "r.jsonl", rollouts)
    code, spans, text = page_of(["--rollouts", str(path), "--answer", "7", "--selector", "stapo"],
                                tmp_path / "page.html", capsys)
    assert code == 0, text
    rewards = [1.0, 0.0, 1.0, 0.0]
    mean, std = statistics.fmean(rewards), statistics.stdev(rewards)
    for r in rewards:
        assert f"advantage {(r - mean) / (std + 1e-4):+.3g}" in text
    assert "advantage +0 " in text or "advantage +0<" in text  # a group of one: no spread, advantage 0
    # stapo silences the positive-advantage, low-probability (π 0.001 < τ_p), lowest-entropy tokens: the correct ones
    # of group 0 (the lone response of group 1 has advantage 0)
    assert ["sel" in s["cls"] for s in spans] == [False, True, False, True, True]


@pytest.mark.parametrize("argv, says", [
    (["--ratio", "0.5"], "--ratio and --scope select again: give --selector with them"),
    (["--selector", "ict", "--step", "-1"], "--step must be >= 0, got -1"),
    (["--selector", "ict(ratio=2)"], "ratio"),
    (["--selector", "ict(0.2)"], "options are key=value pairs"),
])
def test_a_bad_rule_flag_is_one_line(argv: list[str], says: str, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    path = save_rollouts(tmp_path / "r.jsonl", make_rollouts())
    code, _, err = page_of(["--rollouts", str(path), *argv], tmp_path / "page.html", capsys)
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("ictrl inspect: error:") and says in err, err
