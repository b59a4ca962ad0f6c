"""Per-step diagnostics of the token selection (docs/method.md §2, §3: what the selected tokens look like).

``step_metrics(stats, mask, selected)`` returns plain floats, computed in float64:

- ``tokens/all``, ``tokens/selected``: counts of response tokens and of selected tokens (M = selected & mask).
- ``selected_frac``: Σ M / Σ mask (0 when the mask is empty).
- ``h1/{all,selected}``, ``h2/{all,selected}``, ``purity/{all,selected}``, ``prob/{all,selected}``: means of H1,
  H2, β and π(a_t) over the response tokens and over the selected tokens.
- ``pi_minus_beta/selected``: mean of π(a_t) − β over selected tokens (the paper's collapse/explosion diagnostic:
  > 0 pushes toward entropy collapse, < 0 toward explosion).
- ``selected/high_entropy_frac``: fraction of selected tokens with H1 strictly above the median H1 of all response
  tokens of the batch; the median is ``torch.median``'s, i.e. the lower of the two middle values for an even count.

Empty sets: a mean over an empty set is omitted from the dict (not 0, which would bias averages over steps; not
NaN). With no selected token, every ``*/selected`` mean and ``selected/high_entropy_frac`` are absent, and the
counts tell why.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import Tensor

from ictrl.core.checks import as_bool_mask

if TYPE_CHECKING:
    from ictrl.core.stats import TokenStats

_FIELDS = {"h1": "entropy", "h2": "renyi2", "purity": "purity", "prob": "prob"}


def step_metrics(stats: TokenStats, mask: Tensor, selected: Tensor) -> dict[str, float]:
    """Summarise the selection of one step.

    Args:
        stats: ``TokenStats`` whose fields ``entropy``, ``renyi2``, ``purity``, ``prob`` are [B, T].
        mask: [B, T] response mask, bool or 0/1.
        selected: [B, T] selected tokens, bool or 0/1 (intersected with ``mask``).
    """
    mask = as_bool_mask(mask, "mask")
    selected = as_bool_mask(selected, "selected")
    if mask.dim() != 2 or selected.shape != mask.shape:
        raise ValueError(f"mask and selected must both be [B, T]; got {tuple(mask.shape)} and {tuple(selected.shape)}")
    fields: dict[str, Tensor] = {}
    for key, attr in _FIELDS.items():
        value = getattr(stats, attr, None)
        if not isinstance(value, Tensor) or value.shape != mask.shape:
            raise ValueError(f"stats.{attr} must be a [B, T] tensor of shape {tuple(mask.shape)}, "
                             f"got {getattr(value, 'shape', type(value).__name__)}")
        fields[key] = value.detach().double()
    chosen = selected & mask
    n_all, n_sel = int(mask.sum()), int(chosen.sum())
    out: dict[str, float] = {
        "tokens/all": float(n_all),
        "tokens/selected": float(n_sel),
        "selected_frac": n_sel / n_all if n_all else 0.0,
    }
    for where, n, suffix in ((mask, n_all, "all"), (chosen, n_sel, "selected")):
        if n:
            for key, value in fields.items():
                out[f"{key}/{suffix}"] = float(value[where].mean())
    if n_sel:
        out["pi_minus_beta/selected"] = float((fields["prob"] - fields["purity"])[chosen].mean())
        threshold = fields["h1"][mask].median()
        out["selected/high_entropy_frac"] = float((fields["h1"][chosen] > threshold).double().mean())
    return out
