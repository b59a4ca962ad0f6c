"""``ictrl inspect``: an HTML page showing, token by token, which tokens ICT would train on and why.

Two inputs:

- ``--model PATH --prompt TEXT``: sample G responses to one prompt (HF ``generate``, plain sampling at
  ``--temperature`` with top-k and top-p off, so the sampler *is* the policy whose logits we score), run one no-grad
  forward over prompt + response to get those logits, compute per-token statistics (``ictrl.core.stats``) and ICT
  scores with the G responses as one group, and the selection (``--selector ict --ratio 0.1 --scope response``).
- ``--rollouts FILE``: a saved rollouts file (schema below), e.g. one written by ``--save-rollouts``.

Rollouts file (JSONL, one object per response; ``save_rollouts`` / ``load_rollouts``)::

    {"prompt": str, "group": int, "tokens": [str, ...], "u": [float, ...], "entropy": [float, ...],
     "prob": [float, ...], "selected": [bool, ...], "reward": float | null}

``tokens`` are the response tokens as decoded strings (response positions only, padding removed); ``u``,
``entropy`` (H1, nats) and ``prob`` (sampled-token probability) have one value per token; ``group`` (optional,
default 0) is the prompt label; ``reward`` is optional.

The page is self-contained (inline CSS, no scripts, no external assets). A CSS-only radio toggle switches the
token background between ICT score u and entropy H1; selected tokens are outlined and underlined; each token's
tooltip (``title``) gives its position, u, H1 and pi. Colours scale linearly from 0 to the largest value on the
page (the legend prints that maximum), because u is usually far below its bound log 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import html
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ictrl.errors import UserError
from ictrl.experiments.sampling import check_sampling_flags, generate_group
from ictrl.files import atomic_write_text, read_jsonl, write_own

# What the page shows of every token, computed whatever the selector reads.
SHOWN = frozenset({"ict_score", "entropy", "prob"})


def check_selector(name: str) -> Any:
    """The registered selector ``name`` if inspect can compute what it reads (every token statistic and the group,
    but no rewards, hence no advantages: stapo cannot run here); ``ValueError`` (one line) if not."""
    from ictrl.core.selection import STAT_FIELDS, get_selector

    selector = get_selector(name)
    missing = sorted(selector.needs - {*STAT_FIELDS, "group_ids"})
    if missing:
        raise ValueError(f"selector {name!r} needs {', '.join(missing)} (from rewards), which ictrl inspect does not "
                         "compute for one prompt")
    return selector


def flag_options(name: str, ratio: float | None, scope: str | None) -> dict[str, Any]:
    """The selector's options with the ``--ratio`` / ``--scope`` flags applied, for selectors that take them (None:
    the selector's default)."""
    given = {k: v for k, v in (("ratio", ratio), ("scope", scope)) if v is not None}
    return check_selector(name).resolve_options(given)  # an option the selector does not take: ValueError naming it


U_RGB = (230, 85, 13)  # orange: ICT score
H_RGB = (49, 130, 189)  # blue: entropy


@dataclass
class Rollout:
    """One response: its tokens (decoded strings) and per-token u, H1, pi and selection, all of equal length."""

    prompt: str
    tokens: list[str]
    u: list[float]
    entropy: list[float]
    prob: list[float]
    selected: list[bool]
    reward: float | None = None
    group: int = 0
    where: str = field(default="rollout", repr=False, compare=False)  # names the source in error messages

    def __post_init__(self) -> None:
        w = self.where
        if not isinstance(self.prompt, str):
            raise ValueError(f"{w}: field 'prompt' must be a string")
        if not isinstance(self.tokens, list) or not all(isinstance(t, str) for t in self.tokens):
            raise ValueError(f"{w}: field 'tokens' must be a list of strings")
        n = len(self.tokens)
        for name in ("u", "entropy", "prob", "selected"):
            values = getattr(self, name)
            if not isinstance(values, list) or len(values) != n:
                raise ValueError(f"{w}: field {name!r} must be a list of {n} values (one per token)")
        for name in ("u", "entropy", "prob"):
            for i, v in enumerate(getattr(self, name)):
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                    raise ValueError(f"{w}: field {name!r}[{i}] must be a finite number, got {v!r}")
        for i, v in enumerate(self.selected):
            if v not in (True, False, 0, 1):
                raise ValueError(f"{w}: field 'selected'[{i}] must be a bool or 0/1, got {v!r}")
        self.u = [float(v) for v in self.u]
        self.entropy = [float(v) for v in self.entropy]
        self.prob = [float(v) for v in self.prob]
        self.selected = [bool(v) for v in self.selected]
        if self.reward is not None:
            if (isinstance(self.reward, bool) or not isinstance(self.reward, (int, float))
                    or not math.isfinite(self.reward)):
                raise ValueError(f"{w}: field 'reward' must be a finite number or null, got {self.reward!r}")
            self.reward = float(self.reward)
        if isinstance(self.group, bool) or not isinstance(self.group, int):
            raise ValueError(f"{w}: field 'group' must be an integer, got {self.group!r}")

    def to_json(self) -> dict[str, Any]:
        """The JSON object of one line; u, entropy and prob at float32 precision (the statistics are float32)."""
        import numpy as np

        d = asdict(self)
        del d["where"]
        for name in ("u", "entropy", "prob"):
            d[name] = [float(str(np.float32(v))) for v in d[name]]  # shortest repr that round-trips float32
        return d


def save_rollouts(path: str | os.PathLike[str], rollouts: Sequence[Rollout]) -> Path:
    """Write rollouts as JSONL (schema in the module docstring), atomically."""
    lines = [json.dumps(r.to_json(), ensure_ascii=False) for r in rollouts]
    return atomic_write_text(path, "".join(line + "\n" for line in lines))


def load_rollouts(path: str | os.PathLike[str]) -> list[Rollout]:
    """Read a rollouts JSONL file; a bad line raises ValueError naming the file, line and field."""
    allowed = {"prompt", "tokens", "u", "entropy", "prob", "selected", "reward", "group"}
    required = allowed - {"reward", "group"}
    out = []
    for where, obj in read_jsonl(path):
        missing = sorted(required - obj.keys())
        if missing:
            raise ValueError(f"{where}: missing field {missing[0]!r}")
        unknown = sorted(obj.keys() - allowed)
        if unknown:
            raise ValueError(f"{where}: unknown field {unknown[0]!r}")
        out.append(Rollout(**obj, where=where))
    if not out:
        raise ValueError(f"{path}: no rollouts in file")
    return out


def token_strings(tokenizer: Any, ids: Sequence[Sequence[int]]) -> list[list[str]]:
    """Decode each token id on its own (special tokens kept): [B][T] ids -> [B][T] strings.

    A multi-byte character split over several byte tokens decodes to U+FFFD per piece: the page shows tokens as the
    model sees them, not the joined text.
    """
    return [[tokenizer.decode([int(i)], skip_special_tokens=False) for i in row] for row in ids]


def rollouts_from_tensors(
    prompts: Sequence[str],
    tokens: Sequence[Sequence[str]],
    mask: Any,
    u: Any,
    entropy: Any,
    prob: Any,
    selected: Any,
    rewards: Sequence[float] | None = None,
    group_ids: Sequence[int] | None = None,
) -> list[Rollout]:
    """Build Rollouts from batch tensors in the shifted layout, keeping the masked-in positions of each row. The
    tensors are :func:`score_group`'s own (one step's statistics and selection, which ``select`` keeps inside the
    mask), so their shapes are taken as built.

    prompts: [B] prompt text per response; tokens: [B][T] decoded token strings (``token_strings``); mask, u,
    entropy, prob, selected: [B, T] tensors (or nested lists); rewards, group_ids: [B] or None.
    """
    import torch

    as_t = {n: torch.as_tensor(v).detach().cpu() for n, v in
            {"mask": mask, "u": u, "entropy": entropy, "prob": prob, "selected": selected}.items()}
    m = as_t["mask"].bool()
    out = []
    for i in range(m.shape[0]):
        keep = m[i].nonzero().flatten().tolist()
        out.append(
            Rollout(
                prompt=prompts[i],
                tokens=[tokens[i][j] for j in keep],
                u=as_t["u"][i, keep].double().tolist(),
                entropy=as_t["entropy"][i, keep].double().tolist(),
                prob=as_t["prob"][i, keep].double().tolist(),
                selected=as_t["selected"][i, keep].bool().tolist(),
                reward=None if rewards is None else float(rewards[i]),
                group=0 if group_ids is None else int(group_ids[i]),
                where=f"response {i}",
            )
        )
    return out


# ----------------------------------------------------------------------------------------------------- scoring


def score_group(
    model: Any,
    tokenizer: Any,
    prompt: str,
    prompt_ids: Any,
    response: Any,
    mask: Any,
    temperature: float = 1.0,
    selector: str = "ict",
    ratio: float | None = None,
    scope: str | None = None,
) -> list[Rollout]:
    """Score G responses to one prompt as one group: u, H1, pi per token and the selection.

    prompt_ids [1, P]; response, mask [G, T]. One no-grad forward over prompt + response without padding:
    positions after a response's first EOS are outside the mask, and causal attention keeps them from affecting
    earlier positions.
    """
    import torch

    from ictrl.core.selection import SelectionInputs, needed_stats, select
    from ictrl.core.stats import token_stats

    options = flag_options(selector, ratio, scope)
    needs = needed_stats(check_selector(selector))
    g, p_len = response.shape[0], prompt_ids.shape[1]
    full = torch.cat([prompt_ids.expand(g, -1), response], dim=1)
    group_ids = torch.zeros(g, dtype=torch.long, device=response.device)
    with torch.no_grad():
        logits = model(full).logits[:, p_len - 1 : -1].float()  # shifted: logits[b, t] produced response[b, t]
        stats = token_stats(logits, mask, tokens=response, temperature=temperature,
                            group_ids=group_ids if "ict_score" in needs | SHOWN else None)
    selected = select(selector, SelectionInputs.from_stats(mask, stats, needs, group_ids=group_ids), **options)
    strings = token_strings(tokenizer, response.tolist())
    return rollouts_from_tensors([prompt] * g, strings, mask, stats.ict_score, stats.entropy, stats.prob, selected)


def sample_and_score(
    model: Any,
    tokenizer: Any,
    prompt: str,
    num_generations: int = 8,
    max_new_tokens: int = 64,
    temperature: float = 1.0,
    seed: int = 0,
    selector: str = "ict",
    ratio: float | None = None,
    scope: str | None = None,
) -> list[Rollout]:
    """``generate_group`` then ``score_group``: G scored rollouts of one prompt."""
    flag_options(selector, ratio, scope)  # a bad name or option fails before sampling
    prompt_ids, response, mask = generate_group(model, tokenizer, prompt, num_generations, max_new_tokens,
                                                temperature, seed)
    return score_group(model, tokenizer, prompt, prompt_ids, response, mask, temperature, selector, ratio, scope)


# ---------------------------------------------------------------------------------------------------- HTML

_MARKS = {" ": "·", "\n": "↵", "\t": "→", "\r": "␍"}

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.4em;margin:.2em 0 .6em}
.meta{font-size:.9em;color:#444;margin:.2em 0}
pre.prompt{background:#f6f6f6;border:1px solid #ddd;padding:.5em;white-space:pre-wrap;margin:.4em 0 .8em}
.vr{position:absolute;opacity:0;pointer-events:none}
.views{margin:.6em 0}
.views label{margin-left:.6em;padding:.15em .6em;border:1px solid #bbb;border-radius:4px;cursor:pointer}
#view-u:checked ~ .views label[for=view-u],#view-h:checked ~ .views label[for=view-h]{background:#333;color:#fff}
.legend{display:flex;align-items:center;gap:1.2em;font-size:.85em;margin:.4em 0 1em}
.lg{display:flex;align-items:center;gap:.4em}
.bar{width:220px;height:14px;border:1px solid #999}
.bar.u{background:linear-gradient(to right,#fff,rgb(%(u)s))}
.bar.h{background:linear-gradient(to right,#fff,rgb(%(h)s))}
.leg-h{display:none}
#view-h:checked ~ .legend .leg-u{display:none}
#view-h:checked ~ .legend .leg-h{display:flex}
.row{display:flex;gap:.8em;border-top:1px solid #eee;padding:.35em 0}
.rmeta{flex:0 0 11em;font-size:.8em;color:#555}
.toks{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:14px;line-height:1.9;word-break:break-all}
.tok{background:var(--u);padding:1px 0;margin:0 1px;border-radius:2px}
#view-h:checked ~ .rows .tok{background:var(--h)}
.sel{outline:2px solid #111;outline-offset:-1px;text-decoration:underline;font-weight:bold}
.ws{color:#999}
.gh{margin:1em 0 .2em;font-weight:bold}
"""


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


def _rollout_rows(rollouts: Sequence[Rollout], u_max: float, h_max: float) -> list[str]:
    """HTML rows: each response's coloured tokens, preceded by its group's prompt the first time that prompt appears."""
    rows = []
    prompts: dict[tuple[int, str], None] = {}
    for i, r in enumerate(rollouts):
        key = (r.group, r.prompt)
        if key not in prompts:
            prompts[key] = None
            rows.append(f'<div class="gh">group {r.group} · prompt</div>'
                        f'<pre class="prompt">{html.escape(r.prompt)}</pre>')
        spans = []
        for t, tok in enumerate(r.tokens):
            tip = (f"t={t}\nu={r.u[t]:.4g}\nH1={r.entropy[t]:.4g}\nπ={r.prob[t]:.4g}"
                   + ("\nselected" if r.selected[t] else ""))
            cls = "tok sel" if r.selected[t] else "tok"
            style = f"--u:{_mix(U_RGB, r.u[t] / u_max)};--h:{_mix(H_RGB, r.entropy[t] / h_max)}"
            spans.append(f'<span class="{cls}" style="{style}" title="{html.escape(tip)}">{_visible(tok)}</span>')
        reward = "–" if r.reward is None else f"{r.reward:g}"
        rmeta = f"#{i} · reward {reward}<br>{len(r.tokens)} tokens · {sum(r.selected)} selected"
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

    meta: settings shown on top; view: the colouring shown first, "u" (ICT score) or "h" (entropy).
    """
    u_max = max((v for r in rollouts for v in r.u), default=0.0) or 1.0
    h_max = max((v for r in rollouts for v in r.entropy), default=0.0) or 1.0
    n_tok = sum(len(r.tokens) for r in rollouts)
    n_sel = sum(sum(r.selected) for r in rollouts)
    head = [f"<h1>{html.escape(title)}</h1>"]
    info = dict(meta or {})
    info.update({"responses": len(rollouts), "tokens": n_tok, "selected": n_sel})
    head.append('<div class="meta">'
                + " · ".join(f"{html.escape(str(k))}: {html.escape(str(v))}" for k, v in info.items()) + "</div>")
    # CSS-only toggle: the radios must be siblings of .views, .legend and .rows for the ~ selectors to reach them.
    controls = (
        f'<input type="radio" class="vr" name="view" id="view-u"{" checked" if view == "u" else ""}>'
        f'<input type="radio" class="vr" name="view" id="view-h"{" checked" if view == "h" else ""}>'
        '<div class="views"><b>Colour by</b><label for="view-u">ICT score u</label>'
        '<label for="view-h">entropy H1</label></div>'
    )
    legend = (
        '<div class="legend"><span class="leg-u lg">u: 0 <span class="bar u"></span> '
        f"{u_max:.4g} nats</span>"
        f'<span class="leg-h lg">H1: 0 <span class="bar h"></span> {h_max:.4g} nats</span>'
        '<span class="lg"><span class="sel">x</span> = selected (outlined, underlined)</span>'
        '<span class="lg">hover a token: t, u, H1, π · marks: · space, ↵ newline, → tab, ∅ empty</span></div>'
    )
    rows = _rollout_rows(rollouts, u_max, h_max)
    css = _CSS % {"u": ",".join(map(str, U_RGB)), "h": ",".join(map(str, H_RGB))}
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
    src.add_argument("--rollouts", help="rollouts JSONL file to render (schema: ictrl.experiments.inspect)")
    parser.add_argument("--prompt", help="prompt text (with --model), used verbatim: no chat template")
    parser.add_argument("--num-generations", type=int, default=8, help="responses sampled (the group), >= 2")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling and statistics temperature")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--selector", "--method", dest="selector", default="ict",
                        help="token selector or method label, as in ictrl train/demo (default: ict)")
    parser.add_argument("--ratio", type=float, help="fraction of tokens selected (default: the selector's)")
    parser.add_argument("--scope", help="response, group or batch, for selectors with one (default: the selector's)")
    parser.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda if available, else cpu)")
    parser.add_argument("--answer", help="gold answer: grade each response (math reward, last \\boxed{}) and show it")
    parser.add_argument("--output-dir", "--output_dir", default="runs/inspect", help="where inspect.html goes")
    parser.add_argument("--out", default=None, help="the HTML file to write instead of OUTPUT_DIR/inspect.html")
    parser.add_argument("--save-rollouts", default=None, help="also write the scored rollouts as JSONL (with --model)")


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


def run(args: argparse.Namespace) -> int:
    try:
        from ictrl import preflight

        outputs = check_outputs(args)
        if args.rollouts is not None:
            preflight.check_file(args.rollouts, "--rollouts")
            rollouts = load_rollouts(args.rollouts)
            meta: dict[str, Any] = {"source": args.rollouts}
        else:
            if args.prompt is None:
                raise ValueError("--prompt is required with --model")
            check_sampling_flags(args)
            options = flag_options(args.selector, args.ratio, args.scope)  # before the model loads
            preflight.check_model(args.model)
            from ictrl.models import check_device, load_model_and_tokenizer

            check_device(args.device)

            model, tokenizer = load_model_and_tokenizer(args.model, device=args.device)
            rollouts = sample_and_score(
                model, tokenizer, args.prompt, args.num_generations, args.max_new_tokens,
                args.temperature, args.seed, args.selector, args.ratio, args.scope,
            )
            opts = f"({', '.join(f'{k}={v}' for k, v in options.items())})" if options else ""
            meta = {"model": args.model, "temperature": args.temperature, "seed": args.seed,
                    "selector": f"{args.selector}{opts}"}
            if args.save_rollouts:
                write_own(outputs[1], lambda: save_rollouts(outputs[1], rollouts))
        if args.answer is not None:
            rollouts = score_rollouts(rollouts, args.answer)
            meta["answer"] = args.answer
        path = write_own(outputs[0], lambda: render_inspect_html(rollouts, outputs[0], meta=meta))
    except UserError:
        raise
    except (ValueError, FileNotFoundError) as e:  # the CLI prints one line (--debug: the traceback)
        raise UserError(str(e)) from e
    print(f"wrote {path} ({len(rollouts)} responses, {sum(len(r.tokens) for r in rollouts)} tokens)")
    return 0
