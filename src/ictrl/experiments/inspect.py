"""``ictrl inspect``: an HTML page showing, token by token, which tokens a selection rule would train on and why.

Two inputs:

- ``--model PATH --prompt TEXT``: sample G responses to one prompt (HF ``generate``, plain sampling at
  ``--temperature`` with top-k and top-p off, so the sampler *is* the policy whose logits we score), run one no-grad
  forward over prompt + response to get those logits, compute every per-token statistic (``ictrl.core.stats``) and
  the ICT scores with the G responses as one group, and the selection of ``--selector`` (default ``ict``; options as
  ``NAME(key=value, ...)`` or ``--ratio`` / ``--scope``; ``--step`` is the step the rule sees).
- ``--rollouts FILE``: a saved rollouts file (``ictrl.experiments.rollouts``), e.g. one written by
  ``--save-rollouts``; with ``--selector`` the rule selects again from the statistics the file holds (or the command
  names the one it lacks), without it the page shows the file's selection.

``--answer`` grades each response (the math reward, last ``\\boxed{}``) and gives each its group-normalised
advantage, before the rule selects (so a rule that reads advantages, as stapo, runs) and before ``--save-rollouts``
writes the rewards.

The page is self-contained (inline CSS, no scripts, no external assets). A CSS-only radio toggle colours the tokens
by any statistic the responses hold (the ICT score u, H1, H2, β, log π, π), first by the one the rule reads;
selected tokens are outlined and underlined; each token's tooltip (``title``) gives its position and statistics.
Colours scale linearly from 0 to the largest magnitude on the page (the legend prints it), because u is usually far
below its bound log 2. The header names the rule: its spec, its source file's sha256 and its resolved options.
"""

from __future__ import annotations

import argparse
import dataclasses
import html
import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ictrl.errors import UserError
from ictrl.experiments.rollouts import Rollout, load_rollouts, reselect, rollouts_from_tensors, save_rollouts
from ictrl.experiments.rollouts import with_advantages
from ictrl.experiments.sampling import check_sampling_flags, generate_group
from ictrl.files import atomic_write_text, write_own

__all__ = ["Rollout", "load_rollouts", "rollouts_from_tensors", "save_rollouts", "render_inspect_html"]


def check_selector(name: str, graded: bool = False) -> Any:
    """The selector ``name`` (``NAME(key=value, ...)`` allowed) if inspect can give it what it reads (every token
    statistic and the group; advantages only when ``graded``, i.e. with ``--answer``); ``ValueError`` (one line)
    if not."""
    from ictrl.core.selection import STAT_FIELDS, get_selector
    from ictrl.experiments.grid.methods import parse_call

    selector = get_selector(parse_call(name, "--selector")[0])
    missing = sorted(selector.needs - {*STAT_FIELDS, "group_ids", *(("advantages",) if graded else ())})
    if missing:
        raise ValueError(f"selector {name!r} needs {', '.join(missing)} (from rewards): give --answer to grade the "
                         "responses")
    return selector


def flag_options(name: str, ratio: float | None, scope: str | None, graded: bool = False) -> dict[str, Any]:
    """The selector's options: those of ``NAME(key=value, ...)``, then the ``--ratio`` / ``--scope`` flags, for
    selectors that take them (None: the selector's default)."""
    from ictrl.experiments.grid.methods import parse_call

    flags = {k: v for k, v in (("ratio", ratio), ("scope", scope)) if v is not None}
    given = {**dict(parse_call(name, "--selector")[1]), **flags}
    # an option the selector does not take, or a bad value: ValueError naming it
    return check_selector(name, graded).resolve_options(given)


U_RGB = (230, 85, 13)  # orange: ICT score
H_RGB = (49, 130, 189)  # blue: entropy


# ----------------------------------------------------------------------------------------------------- scoring


def score_group(
    model: Any,
    tokenizer: Any,
    prompt: str,
    prompt_ids: Any,
    response: Any,
    mask: Any,
    temperature: float = 1.0,
    selector: str | None = "ict",
    ratio: float | None = None,
    scope: str | None = None,
    step: int = 0,
) -> list[Rollout]:
    """Score G responses to one prompt as one group: every statistic per token, and ``selector``'s selection (None:
    none yet, for a caller that grades the responses first and then calls :func:`select_again`).

    prompt_ids [1, P]; response, mask [G, T]. One no-grad forward over prompt + response without padding:
    positions after a response's first EOS are outside the mask, and causal attention keeps them from affecting
    earlier positions.
    """
    import torch

    from ictrl.core.stats import token_stats

    g, p_len = response.shape[0], prompt_ids.shape[1]
    full = torch.cat([prompt_ids.expand(g, -1), response], dim=1)
    group_ids = torch.zeros(g, dtype=torch.long, device=response.device)
    with torch.no_grad():
        logits = model(full).logits[:, p_len - 1 : -1].float()  # shifted: logits[b, t] produced response[b, t]
        stats = token_stats(logits, mask, tokens=response, temperature=temperature, group_ids=group_ids)
    strings = token_strings(tokenizer, response.tolist())
    extra = {"renyi2": stats.renyi2, "purity": stats.purity, "logprob": stats.logprob}
    rollouts = rollouts_from_tensors([prompt] * g, strings, mask, stats.ict_score, stats.entropy, stats.prob,
                                     torch.zeros_like(mask, dtype=torch.bool), extra=extra)
    return rollouts if selector is None else select_again(rollouts, selector, ratio, scope, step, "the responses")


def select_again(rollouts: list[Rollout], selector: str, ratio: float | None = None, scope: str | None = None,
                 step: int = 0, source: str = "the rollouts") -> list[Rollout]:
    """``rollouts`` with the selection of ``selector`` (its options and the flags) at ``step``
    (``rollouts.reselect``)."""
    from ictrl.experiments.grid.methods import parse_call

    graded = all(r.advantage is not None for r in rollouts)
    options = flag_options(selector, ratio, scope, graded)
    rule = check_selector(parse_call(selector, "--selector")[0], graded)
    return reselect(rollouts, rule, options, step, source)


def sample_and_score(
    model: Any,
    tokenizer: Any,
    prompt: str,
    num_generations: int = 8,
    max_new_tokens: int = 64,
    temperature: float = 1.0,
    seed: int = 0,
    selector: str | None = "ict",
    ratio: float | None = None,
    scope: str | None = None,
    step: int = 0,
) -> list[Rollout]:
    """``generate_group`` then ``score_group``: G scored rollouts of one prompt."""
    if selector is not None:
        flag_options(selector, ratio, scope)  # a bad name or option fails before sampling
    prompt_ids, response, mask = generate_group(model, tokenizer, prompt, num_generations, max_new_tokens,
                                                temperature, seed)
    return score_group(model, tokenizer, prompt, prompt_ids, response, mask, temperature, selector, ratio, scope,
                       step)


def token_strings(tokenizer: Any, ids: Sequence[Sequence[int]]) -> list[list[str]]:
    """Decode each token id on its own (special tokens kept): [B][T] ids -> [B][T] strings.

    A multi-byte character split over several byte tokens decodes to U+FFFD per piece: the page shows tokens as the
    model sees them, not the joined text.
    """
    return [[tokenizer.decode([int(i)], skip_special_tokens=False) for i in row] for row in ids]


# ---------------------------------------------------------------------------------------------------- HTML

_MARKS = {" ": "·", "\n": "↵", "\t": "→", "\r": "␍"}

# The colourings a page offers, in order: (view id, Rollout field, button text, legend name, unit, colour). A
# view is offered when every response holds its statistic; a token's colour is |value| / the page's largest |value|
# (log π: its surprisal, strong where the token was unlikely).
VIEWS = (("u", "u", "ICT score u", "u", " nats", U_RGB), ("h", "entropy", "entropy H1", "H1", " nats", H_RGB),
         ("h2", "renyi2", "Rényi-2 H2", "H2", " nats", (117, 107, 177)),
         ("beta", "purity", "purity β", "β", "", (49, 163, 84)),
         ("lp", "logprob", "log π", "log π", " nats", (214, 39, 40)), ("pi", "prob", "π", "π", "", (140, 86, 75)))
VIEW_OF = {"ict_score": "u", "entropy": "h", "renyi2": "h2", "purity": "beta", "logprob": "lp", "prob": "pi"}

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.4em;margin:.2em 0 .6em}
.meta{font-size:.9em;color:#444;margin:.2em 0}
pre.prompt{background:#f6f6f6;border:1px solid #ddd;padding:.5em;white-space:pre-wrap;margin:.4em 0 .8em}
.vr{position:absolute;opacity:0;pointer-events:none}
.views{margin:.6em 0}
.views label{margin-left:.6em;padding:.15em .6em;border:1px solid #bbb;border-radius:4px;cursor:pointer}
.legend{display:flex;align-items:center;gap:1.2em;font-size:.85em;margin:.4em 0 1em}
.lg{display:flex;align-items:center;gap:.4em}
.bar{width:220px;height:14px;border:1px solid #999}
.row{display:flex;gap:.8em;border-top:1px solid #eee;padding:.35em 0}
.rmeta{flex:0 0 11em;font-size:.8em;color:#555}
.toks{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:14px;line-height:1.9;word-break:break-all}
.tok{padding:1px 0;margin:0 1px;border-radius:2px}
.sel{outline:2px solid #111;outline-offset:-1px;text-decoration:underline;font-weight:bold}
.ws{color:#999}
.gh{margin:1em 0 .2em;font-weight:bold}
"""


def _view_css(key: str, rgb: tuple[int, int, int]) -> str:
    """The CSS-only toggle of one view: its button lit, its legend shown, the tokens' background its variable."""
    return (f"#view-{key}:checked ~ .views label[for=view-{key}]{{background:#333;color:#fff}}\n"
            f".bar.{key}{{background:linear-gradient(to right,#fff,rgb({','.join(map(str, rgb))}))}}\n"
            f".leg-{key}{{display:none}}\n#view-{key}:checked ~ .legend .leg-{key}{{display:flex}}\n"
            f"#view-{key}:checked ~ .rows .tok{{background:var(--{key})}}\n")


def _mix(rgb: tuple[int, int, int], frac: float) -> str:
    """Hex colour between white (frac 0) and ``rgb`` (frac 1)."""
    frac = min(1.0, max(0.0, frac))
    return "#" + "".join(f"{round(255 + (c - 255) * frac):02x}" for c in rgb)


def _visible(text: str) -> str:
    """HTML for ``text`` with whitespace and control characters shown as grey marks."""
    if text == "":
        return '<span class="ws">∅</span>'
    parts = []
    for ch in text:
        if ch in _MARKS:
            parts.append(f'<span class="ws">{_MARKS[ch]}</span>')
        elif ord(ch) < 32 or ord(ch) == 127:
            parts.append(f'<span class="ws">\\x{ord(ch):02x}</span>')
        else:
            parts.append(html.escape(ch))
    return "".join(parts)


def _tip(r: Rollout, t: int) -> str:
    """A token's tooltip: its position, every statistic the response holds, and whether it is selected."""
    names = {"u": "u", "entropy": "H1", "renyi2": "H2", "purity": "β", "logprob": "logπ", "prob": "π"}
    values = [f"{shown}={getattr(r, field)[t]:.4g}" for field, shown in names.items()
              if getattr(r, field) is not None]
    return "\n".join([f"t={t}", *values] + (["selected"] if r.selected[t] else []))


def _rollout_rows(rollouts: Sequence[Rollout], scales: dict[str, float]) -> list[str]:
    """HTML rows: each response's coloured tokens, preceded by its group's prompt the first time that prompt appears.
    ``scales``: view id -> the page's largest |value| of its statistic."""
    rows = []
    prompts: dict[tuple[int, str], None] = {}
    views = [v for v in VIEWS if v[0] in scales]
    for i, r in enumerate(rollouts):
        key = (r.group, r.prompt)
        if key not in prompts:
            prompts[key] = None
            rows.append(f'<div class="gh">group {r.group} · prompt</div>'
                        f'<pre class="prompt">{html.escape(r.prompt)}</pre>')
        spans = []
        for t, tok in enumerate(r.tokens):
            cls = "tok sel" if r.selected[t] else "tok"
            style = ";".join(f"--{k}:{_mix(rgb, abs(getattr(r, field)[t]) / scales[k])}"
                             for k, field, *_, rgb in views)
            spans.append(f'<span class="{cls}" style="{style}" title="{html.escape(_tip(r, t))}">'
                         f"{_visible(tok)}</span>")
        reward = "–" if r.reward is None else f"{r.reward:g}"
        advantage = "" if r.advantage is None else f" · advantage {r.advantage:+.3g}"
        rmeta = f"#{i} · reward {reward}{advantage}<br>{len(r.tokens)} tokens · {sum(r.selected)} selected"
        rows.append(f'<div class="row"><div class="rmeta">{rmeta}</div><div class="toks">{"".join(spans)}</div></div>')
    return rows


def render_inspect_html(
    rollouts: Sequence[Rollout],
    out_path: str | os.PathLike[str],
    title: str = "ictrl inspect",
    meta: Mapping[str, Any] | None = None,
    view: str = "u",
) -> Path:
    """Write the inspect page for ``rollouts`` (atomically) and return its path.

    meta: settings shown on top; view: the colouring shown first, a view id of :data:`VIEWS` ("u": the ICT score,
    "h": entropy H1, "h2", "beta", "lp", "pi"), offered when every response holds its statistic.
    """
    views = [v for v in VIEWS if all(getattr(r, v[1]) is not None for r in rollouts)]
    extreme = {k: max((v for r in rollouts for v in getattr(r, field)), key=abs, default=0.0)
               for k, field, *_ in views}
    scales = {k: abs(v) or 1.0 for k, v in extreme.items()}
    first = view if view in scales else "u"
    n_tok = sum(len(r.tokens) for r in rollouts)
    n_sel = sum(sum(r.selected) for r in rollouts)
    head = [f"<h1>{html.escape(title)}</h1>"]
    info = dict(meta or {})
    info.update({"responses": len(rollouts), "tokens": n_tok, "selected": n_sel})
    head.append('<div class="meta">'
                + " · ".join(f"{html.escape(str(k))}: {html.escape(str(v))}" for k, v in info.items()) + "</div>")
    # CSS-only toggle: the radios must be siblings of .views, .legend and .rows for the ~ selectors to reach them.
    controls = "".join(f'<input type="radio" class="vr" name="view" id="view-{k}"{" checked" if k == first else ""}>'
                       for k, *_ in views)
    controls += ('<div class="views"><b>Colour by</b>'
                 + "".join(f'<label for="view-{k}">{html.escape(button)}</label>' for k, _, button, *_ in views)
                 + "</div>")
    legend = ('<div class="legend">'
              + "".join(f'<span class="leg-{k} lg">{html.escape(name)}: 0 <span class="bar {k}"></span> '
                        f"{extreme[k]:.4g}{unit}</span>" for k, _, _, name, unit, _ in views)
              + '<span class="lg"><span class="sel">x</span> = selected (outlined, underlined)</span>'
              '<span class="lg">hover a token: t and its statistics · marks: · space, ↵ newline, → tab, ∅ empty'
              "</span></div>")
    rows = _rollout_rows(rollouts, scales)
    css = _CSS + "".join(_view_css(k, rgb) for k, *_, rgb in views)
    page = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{css}</style></head>\n<body>\n"
        + "\n".join(head)
        + "\n" + controls + "\n" + legend + '\n<div class="rows">\n' + "\n".join(rows) + "\n</div>\n</body></html>\n"
    )
    return atomic_write_text(out_path, page)


# ---------------------------------------------------------------------------------------------------- CLI


def score_rollouts(rollouts: list[Rollout], answer: str) -> list[Rollout]:
    """``rollouts`` with ``reward`` set by the math reward of each response's text against ``answer``."""
    from ictrl.rewards import math_reward

    return [dataclasses.replace(r, reward=float(math_reward("".join(r.tokens), answer))) for r in rollouts]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="model directory or hub id to sample from (needs --prompt)")
    src.add_argument("--rollouts", help="rollouts JSONL file to render (schema: ictrl.experiments.rollouts)")
    parser.add_argument("--prompt", help="prompt text (with --model), used verbatim: no chat template")
    parser.add_argument("--num-generations", type=int, default=8, help="responses sampled (the group), >= 2")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling and statistics temperature")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--selector", "--method", dest="selector", default=None,
                        help="token selector or method label, as in ictrl train/demo, with options of its own as "
                             "NAME(key=value, ...), e.g. 'h2rule:top_h2(ratio=0.2)' (default: ict; with --rollouts, "
                             "the file's own selection)")
    parser.add_argument("--step", type=int, default=0,
                        help="the optimizer step the rule sees (a rule that changes with the step; no warm-up)")
    parser.add_argument("--ratio", type=float, help="fraction of tokens selected (default: the selector's)")
    parser.add_argument("--scope", help="response, group or batch, for selectors with one (default: the selector's)")
    parser.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda if available, else cpu)")
    parser.add_argument("--answer", help="gold answer: grade each response (math reward, last \\boxed{}), show it and "
                                          "its group-normalised advantage (a rule may read them)")
    parser.add_argument("--output-dir", "--output_dir", default="runs/inspect", help="where inspect.html goes")
    parser.add_argument("--out", default=None, help="the HTML file to write instead of OUTPUT_DIR/inspect.html")
    parser.add_argument("--save-rollouts", default=None,
                        help="also write the scored rollouts as JSONL (with --model): every statistic, the "
                             "selection and, with --answer, the rewards")


PAGE_HEAD = b'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>ictrl inspect</title>'


def _earlier(name: str, rollouts: bool = False) -> Callable[[Path], bool]:
    """Whether a folder holds, as ``name``, the page (``rollouts``: the JSONL) ``ictrl inspect`` wrote before ictrl
    listed its files there."""
    def earlier(folder: Path) -> bool:
        try:
            with open(folder / name, "rb") as fh:
                if not rollouts:
                    return fh.read(len(PAGE_HEAD)) == PAGE_HEAD
                first = json.loads(fh.readline())
        except (OSError, ValueError):
            return False
        return isinstance(first, dict) and {"tokens", "u", "entropy", "prob", "selected"} <= set(first)
    return earlier


def check_outputs(args: argparse.Namespace) -> list[Path]:
    """The files the command writes (``files.check_output_file``), before the model loads."""
    from ictrl.files import check_output_file

    page = Path(args.out) if args.out else Path(args.output_dir) / "inspect.html"
    outputs = [check_output_file(page, "--out" if args.out else "--output-dir", _earlier(page.name))]
    if args.save_rollouts and args.rollouts is None:
        path = Path(args.save_rollouts)
        outputs.append(check_output_file(path, "--save-rollouts", _earlier(path.name, rollouts=True)))
    return outputs


def rule_meta(rule: Any, options: dict[str, Any], step: int) -> dict[str, Any]:
    """The page header's account of the rule: its spec with its resolved options, its source (a user's file and
    that file's sha256, as ``selector_identity`` records it) and the step it saw."""
    from ictrl.core.selection import selector_identity

    identity = selector_identity(rule, options)
    shown = ", ".join(f"{k}={v}" for k, v in identity["options"].items())
    source = ("ictrl's own" if identity["sha256"] is None
              else f"{Path(identity['file']).name}, sha256 {identity['sha256'][:16]}")
    return {"selector": f"{identity['spec']}({shown})" if shown else identity["spec"], "rule source": source,
            "step": step}


def first_view(selector: Any) -> str:
    """The page's first colouring: the first statistic ``selector`` reads, else the ICT score."""
    return next((view for field, view in VIEW_OF.items() if field in selector.needs), "u")


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except UserError:
        raise
    except (ValueError, FileNotFoundError) as e:  # the CLI prints one line (--debug: the traceback)
        raise UserError(str(e)) from e


def _run(args: argparse.Namespace) -> int:
    from ictrl import option_checks
    from ictrl.hub import check_model

    outputs = check_outputs(args)
    name = args.selector if args.selector is not None or args.rollouts is not None else "ict"
    if name is None and (args.ratio is not None or args.scope is not None):
        raise ValueError("--ratio and --scope select again: give --selector with them")
    if args.step < 0:
        raise ValueError(f"--step must be >= 0, got {args.step}")
    graded = args.answer is not None
    rule = None if name is None else check_selector(name, graded)
    options = None if name is None else flag_options(name, args.ratio, args.scope, graded)
    if args.rollouts is not None:
        option_checks.check_file(args.rollouts, "--rollouts")
        rollouts = load_rollouts(args.rollouts)
        meta: dict[str, Any] = {"source": args.rollouts}
    else:
        if args.prompt is None:
            raise ValueError("--prompt is required with --model")
        check_sampling_flags(args)  # with the selector's options, before the model loads
        check_model(args.model)
        from ictrl.models import check_device, load_model_and_tokenizer

        check_device(args.device)
        model, tokenizer = load_model_and_tokenizer(args.model, device=args.device)
        rollouts = sample_and_score(model, tokenizer, args.prompt, args.num_generations, args.max_new_tokens,
                                    args.temperature, args.seed, selector=None)
        meta = {"model": args.model, "temperature": args.temperature, "seed": args.seed}
    if graded:  # first: a rule may read the advantages, and the saved file keeps the rewards
        rollouts = with_advantages(score_rollouts(rollouts, args.answer))
        meta["answer"] = args.answer
    if rule is None or options is None:
        meta["selection"] = "as saved in the file"
    else:
        rollouts = reselect(rollouts, rule, options, args.step, args.rollouts or "the responses")
        meta.update(rule_meta(rule, options, args.step))
    if args.save_rollouts and args.rollouts is None:
        write_own(outputs[1], lambda: save_rollouts(outputs[1], rollouts))
    view = "u" if rule is None else first_view(rule)
    path = write_own(outputs[0], lambda: render_inspect_html(rollouts, outputs[0], meta=meta, view=view))
    print(f"wrote {path} ({len(rollouts)} responses, {sum(len(r.tokens) for r in rollouts)} tokens)")
    return 0
