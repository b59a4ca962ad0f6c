"""Token selectors: the registry of methods that turn per-token statistics into the [B, T] mask the loss trains
on (docs/architecture.md, "Module notes")."""

from __future__ import annotations

import difflib
import importlib
import inspect
import sys
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor

from ictrl.core.checks import OptionError, check_number, defers_on, require_on_device
from ictrl.core.loss import NORM_MODES
from ictrl.core.reference import ceil_count
from ictrl.core.rule_checks import (
    FILE_MODULES, check_inputs_unwritten, check_option_type, check_result, describe_value, import_failure,
    input_versions, is_file_spec, load_rule_file, raised, rule_label, rule_options, rule_source_file, sha256_of,
)
from ictrl.core.selection_inputs import (  # noqa: F401 - re-exported: a rule imports them from here
    FIELD_WORDS, NEEDS_FIELDS, STAT_FIELDS, SelectionInputs, SelectorError, SelectorExit, step_seed,
)

SCOPES = ("response", "group", "batch")


@dataclass(frozen=True)
class Selector:
    """A registered selection rule and the method it defines: ``fn(inputs, **options) -> [B, T] bool``.

    This record is the only place a method's defaults live; ``ICTGRPOConfig``, the YAML configs, the experiment
    grid and every command's method choices read them from here.

    - ``options``: the keyword-only parameters of ``fn`` and their defaults (``ratio``, ``scope``, ``tau_p``, ...).
    - ``scopes``: the values the ``scope`` option accepts (empty when the selector has no scope).
    - ``warmup_steps``: the method's default Θ (``ICTGRPOConfig.selection_warmup_steps``); ``select`` itself
      applies only the Θ it is given.
    - ``normalization``: the method's default loss normaliser (``ictrl.core.loss.NORM_MODES``).
    - ``label``: the method's name in papers, reports and run directories (``grpo`` for ``all``); ``aliases``
      are further names accepted wherever a method is named. ``in_default_grid``: run by ``ictrl compare``
      when no ``--methods`` is given.
    - ``trl_loss``: the rule is TRL's own (every response token), so with no ``loss_normalization`` the trainer
      normalises as TRL does for its ``loss_type`` (docs/trl-contract.md), not with ``normalization``.
    """

    name: str
    fn: Callable[..., Tensor]
    needs: frozenset[str]
    options: dict[str, Any]
    scopes: tuple[str, ...] = ()
    warmup_steps: int = 0
    normalization: str = "per_response_selected"
    label: str = ""
    aliases: tuple[str, ...] = ()
    help: str = ""
    in_default_grid: bool = False
    trl_loss: bool = False

    @property
    def spec(self) -> str:
        """The name another process finds this selector by: ``module:function`` for one a user's module registered
        with the decorator (a fresh process imports the module), ``/abs/path/file.py:function`` for one loaded from
        its file, else the registered name."""
        module = getattr(self.fn, "__module__", None) or "__main__"
        qualname = getattr(self.fn, "__qualname__", "")
        if module in FILE_MODULES and getattr(sys.modules.get(module), qualname, None) is self.fn:
            return f"{FILE_MODULES[module]}:{qualname}"
        ours = module == "__main__" or module.partition(".")[0] == "ictrl"  # a script's is not importable
        importable = getattr(inspect.getmodule(self.fn), qualname, None) is self.fn  # a module-level function
        return self.name if ":" in self.name or ours or not importable else f"{module}:{qualname}"

    @property
    def rule(self) -> str:
        """The rule as messages name it: ``file:function`` for a user's, the quoted name for ictrl's own."""
        return rule_label(self.name, self.fn)

    def resolve_options(self, given: dict[str, Any] | None = None) -> dict[str, Any]:
        """The selector's defaults updated with ``given``, each value checked once (an option's bad value is an
        :class:`OptionError` naming the option; an unknown option a ``ValueError``). A rule's own option is held to
        its default's type (``ictrl.core.rule_checks.check_option_type``)."""
        given = dict(given or {})
        unknown = sorted(set(given) - set(self.options))
        if unknown:
            raise ValueError(f"unknown option(s) {unknown} for selector {self.name!r}; it accepts "
                             f"{sorted(self.options)}")
        options = {**self.options, **given}
        for key, value in options.items():
            choices = self.scopes if key == "scope" else _OPTION_CHOICES.get(key)
            if choices is not None and value not in choices:
                raise OptionError(key, f"must be one of {list(choices)}, got {value!r}")
            if key in _OPTION_NUMBERS:
                options[key] = check_number(key, value, **_OPTION_NUMBERS[key])
            elif choices is None:
                options[key] = check_option_type(key, value, self.options[key])
        return options

    def resolve_warmup(self, given: int | None = None) -> int:
        """Θ: ``given``, or the method's registered default when None, checked (an int >= 0)."""
        return check_number("warmup_steps", self.warmup_steps if given is None else given, integer=True)

    def __call__(self, inputs: SelectionInputs, *, warmup_steps: int = 0, **options: Any) -> Tensor:
        """Apply the rule; while ``in_warmup(inputs.step, warmup_steps)`` return the whole mask instead."""
        return self.apply(inputs, self.resolve_warmup(warmup_steps), self.resolve_options(options))

    def apply(self, inputs: SelectionInputs, warmup_steps: int, options: dict[str, Any]) -> Tensor:
        """:meth:`__call__` with Θ and ``options`` already resolved by :meth:`resolve_warmup` and
        :meth:`resolve_options` (the trainer resolves them once per run, not once per batch)."""
        return self.choose(inputs, warmup_steps, options) & inputs.mask

    def choose(self, inputs: SelectionInputs, warmup_steps: int, options: dict[str, Any]) -> Tensor:
        """The rule's checked [B, T] bool result, before :meth:`apply` drops the positions outside the mask (the
        trainer names padding a rule selects). The one boundary a rule's output enters by: the rule sees the inputs
        its ``needs`` declares (:meth:`SelectionInputs.declared`); a result that is not a bool tensor of the mask's
        shape on its device, or a rule that raises, is a :class:`SelectorError` naming the rule, the step and what
        it returned or raised."""
        if in_warmup(inputs.step, warmup_steps):
            return inputs.mask.clone()
        rule = self.rule
        for field in sorted(self.needs):
            if getattr(inputs, field) is None:
                raise SelectorError(f"selector {rule} needs SelectionInputs.{field}, which is None")
        versions = input_versions(inputs)
        try:
            chosen = self.fn(inputs.declared(self.needs, rule), **options)
        except (SelectorError, KeyboardInterrupt):
            raise
        except BaseException as exc:  # noqa: BLE001 - sys.exit() in a rule too: named, never a silent end
            raise raised(exc, rule, self.fn, inputs.step) from exc
        check_inputs_unwritten(versions, inputs, rule, inputs.step)
        return check_result(chosen, inputs.mask, rule, inputs.step)


SELECTORS: dict[str, Selector] = {}
_ALIASES: dict[str, str] = {}  # alias -> registered name


def in_warmup(step: int, warmup_steps: int) -> bool:
    """True during the first Θ = ``warmup_steps`` optimizer steps (as :meth:`Selector.resolve_warmup` resolved
    it), when every response token is selected."""
    return step < warmup_steps


def needed_stats(selector: Selector, warming_up: bool = False) -> frozenset[str]:
    """The per-token statistics (TokenStats fields) a step computes for ``selector``: those its ``needs`` name,
    none while it warms up (the whole mask is selected then). The trainer plans its statistics path from this,
    ``ictrl inspect`` and ``ictrl regime`` what they sweep. ``ict_score`` means the group JS sweep; the other fields
    come from one sweep of each position's distribution (or TRL's fused head, where it gives them)."""
    return frozenset() if warming_up else selector.needs & frozenset(STAT_FIELDS)


def register_selector(
    name: str | None = None,
    needs: tuple[str, ...] = (),
    *,
    scopes: tuple[str, ...] | None = None,
    warmup_steps: int = 0,
    normalization: str = "per_response_selected",
    label: str | None = None,
    aliases: tuple[str, ...] = (),
    help: str | None = None,
    in_default_grid: bool = False,
    trl_loss: bool = False,
) -> Callable[[Callable[..., Tensor]], Callable[..., Tensor]]:
    """Decorator registering ``fn(inputs, *, option=default, ...)`` under ``name`` (default: ``fn.__name__``),
    with the method defaults described on :class:`Selector`, each checked here. ``scopes`` defaults to every scope
    when ``fn`` has a ``scope`` option; ``help`` defaults to the first line of ``fn``'s docstring."""
    needs = (needs,) if isinstance(needs, str) else tuple(needs)
    bad = sorted(set(needs) - set(NEEDS_FIELDS))
    if bad:
        raise ValueError(f"needs holds unknown field(s) {bad}; valid: {list(NEEDS_FIELDS)}")
    if normalization not in NORM_MODES:
        raise ValueError(f"normalization must be one of {list(NORM_MODES)}, got {normalization!r}")

    def decorator(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
        key = name or fn.__name__
        options = rule_options(fn, key)
        if "warmup_steps" in options:
            raise ValueError(f"selector {key!r}: warmup_steps is applied by select(), not an option of the rule")
        names = [key, *(a for a in (label, *aliases) if a and a != key)]
        taken = [n for n in names if (n in SELECTORS or n in _ALIASES) and not _reloaded(n, fn)]
        if taken:
            raise ValueError(f"selector {taken[0]!r} is already registered")
        allowed = tuple(scopes) if scopes is not None else (SCOPES if "scope" in options else ())
        doc = (fn.__doc__ or "").strip().splitlines()
        selector = Selector(key, fn, frozenset(needs), options, allowed, warmup_steps, normalization, label or key,
                            tuple(aliases), help if help is not None else (doc[0] if doc else ""), in_default_grid,
                            trl_loss)
        selector.resolve_warmup()  # the defaults themselves must pass the checks
        selector.resolve_options()
        SELECTORS[key] = selector
        _ALIASES.update({alias: key for alias in names[1:]})
        return fn

    return decorator


def _reloaded(name: str, fn: Callable[..., Tensor]) -> bool:
    """Whether ``name`` is registered to an earlier load of the same function (its module imported again after an
    edit, in a notebook or a second run in one process): the new definition replaces it."""
    held = SELECTORS.get(_ALIASES.get(name, name))
    return held is not None and (held.fn.__module__, held.fn.__qualname__) == (fn.__module__, fn.__qualname__) \
        and held.fn is not fn


def method_names() -> list[str]:
    """Every name a method may be given by: registered names, then labels and aliases."""
    return [*SELECTORS, *(a for a, target in _ALIASES.items() if target in SELECTORS)]


def get_selector(name: str) -> Selector:
    """The selector registered as ``name`` or under that label/alias, or ``module:function`` (the module is
    imported, which registers the function's selector; an undecorated function is registered as is)."""
    if name in SELECTORS:
        return SELECTORS[name]
    if _ALIASES.get(name) in SELECTORS:
        return SELECTORS[_ALIASES[name]]
    if ":" in name:
        return _import_selector(name)
    close = difflib.get_close_matches(name, method_names(), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise ValueError(f"unknown selector {name!r}; {hint}choose from {', '.join(method_names())} or give "
                     "module:function or path/to/file.py:function (a function registered with "
                     "ictrl.core.selection.register_selector; `ictrl selectors` lists them)")


def selector_identity(selector: Selector, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """What names a rule in a run's record (run.json, ``--print-config``, compare's results, the inspect page):
    ``name``; ``spec``, the name another process finds it by (:attr:`Selector.spec`); ``file``, its source file
    (None for ictrl's own rules); ``sha256``, that file's hash, so an edited rule is a different rule (None for
    ictrl's own rules, named by their registered name alone, and for a rule with no source file); ``options``, the
    resolved options (:meth:`Selector.resolve_options` of ``options``)."""
    path = rule_source_file(selector.fn)
    return {"name": selector.name, "spec": selector.spec, "file": None if path is None else str(path),
            "sha256": None if path is None else sha256_of(path), "options": selector.resolve_options(options)}


def _import_selector(spec: str) -> Selector:
    if is_file_spec(spec):
        module_obj, attr = load_rule_file(spec)
        fn = getattr(module_obj, attr, None)
        if fn is None:
            raise ValueError(f"selector {spec!r}: {spec.rpartition(':')[0]} defines no {attr!r}")
    else:
        module, _, attr = spec.partition(":")
        try:
            fn = getattr(importlib.import_module(module), attr)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001 - a user's module: whatever its import raises, in one line
            raise ValueError(f"selector {spec!r}: cannot import it: {import_failure(exc)}") from None
    for selector in SELECTORS.values():
        if selector.fn is fn:
            return selector
    if not callable(fn):
        raise ValueError(f"selector {spec!r}: {type(fn).__name__} is not a function")
    register_selector(spec)(fn)
    return SELECTORS[spec]


def select(name: str, inputs: SelectionInputs, *, warmup_steps: int = 0, **options: Any) -> Tensor:
    """Apply selector ``name``: returns a [B, T] bool tensor, a subset of ``inputs.mask`` (the whole mask while
    ``inputs.step < warmup_steps``)."""
    return get_selector(name)(inputs, warmup_steps=warmup_steps, **options)


# ---------------------------------------------------------------------------------------------- helpers


# Option name -> its rule, shared by every selector that takes the option (a custom option is passed as given): the
# values it may take, or check_number's keywords. ``scope``'s values are each selector's ``scopes``.
_OPTION_CHOICES: dict[str, tuple[str, ...]] = {"ties": ("position", "include")}
_FRACTION = {"low": 0, "high": 1, "above": True}
_OPTION_NUMBERS: dict[str, dict[str, Any]] = {"ratio": _FRACTION, "q": _FRACTION, "tau_p": _FRACTION,
                                              "seed": {"integer": True}}


def _units(inputs: SelectionInputs, scope: str) -> Tensor:
    """[B, T] long unit id of every position: its row, its group (0..G-1), or 0 for the batch."""
    B, T = inputs.mask.shape
    device = inputs.mask.device
    if scope == "response":
        row_unit = torch.arange(B, device=device)
    elif scope == "group":
        if inputs.group_ids is None:
            raise ValueError("scope='group' needs SelectionInputs.group_ids, which is None")
        row_unit = torch.unique(inputs.group_ids.to(device), return_inverse=True)[1]
    else:
        row_unit = torch.zeros(B, dtype=torch.long, device=device)
    return row_unit[:, None].expand(B, T)




# Whether CPU tensors take the dense selection too (tests check that path on CPU; otherwise CPU keeps the faster
# active-only sort).
DENSE_ON_CPU = False


def top_fraction(score: Tensor, inputs: SelectionInputs, ratio: float, scope: str = "response") -> Tensor:
    """[B, T] bool: in each unit of ``scope`` (a response, a group of ``inputs.group_ids``, or the batch), the
    ceil(ratio · n) positions of ``inputs.mask`` with the highest ``score`` [B, T] (n: the unit's active positions;
    ties go to the earlier position). ICT's rule is ``top_fraction(inputs.ict_score, inputs, ratio)``; a rule of
    your own on another statistic is the same line on that field. A score that is NaN or infinite at an active
    position is an error naming it (on a GPU at the next rollout: ``ictrl.core.checks.require_on_device``)."""
    mask = inputs.mask
    if not isinstance(score, Tensor) or score.shape != mask.shape:
        raise ValueError(f"top_fraction: score must be a tensor of the mask's shape [{', '.join(map(str, mask.shape))}]"
                         f", got {describe_value(score)}")
    named = next((f"inputs.{f}" for f in STAT_FIELDS if inputs.__dict__.get(f) is score), None)
    what = f"top_fraction's score ({named or 'computed by the rule, not one of the inputs as given'})"
    rule = inputs.__dict__.get("_declared", (None, None))[1]
    if rule is not None and defers_on(mask.device):  # raised at the next rollout, outside the rule's call
        what = f"selector {rule} at step {inputs.step}: {what}"
    return _top_k_per_unit(score, mask, _units(inputs, scope), ratio, what)


def _top_k_per_unit(score: Tensor, mask: Tensor, units: Tensor, ratio: float, what: str) -> Tensor:
    """[B, T] bool: in each unit, the ceil(ratio * n_active) active positions with the highest score; a score
    that is not finite at an active position is an error naming it (``what``): NaN would sort first and pick
    arbitrary tokens.

    Ties go to the lower flat index. On an accelerator (or with ``DENSE_ON_CPU``) :func:`_top_k_dense`, which reads
    nothing on the host; on CPU :func:`_top_k_active`, the same selection from a sort of the active positions only.
    """
    require_on_device(~(mask & ~torch.isfinite(score)).any(),
                      f"{what} is NaN or infinite at an active position: a ranking of it means nothing; check the "
                      "statistic, or how the rule computes its score")
    if mask.device.type == "cpu" and not DENSE_ON_CPU:
        return _top_k_active(score, mask, units, ratio)
    return _top_k_dense(score, mask, units, ratio)


def _top_k_active(score: Tensor, mask: Tensor, units: Tensor, ratio: float) -> Tensor:
    """:func:`_top_k_per_unit` over the active positions only (the CPU path: sorts fewer elements; its
    nonzero, max and bincount read the data on the host, which costs nothing without a device)."""
    flat_mask = mask.reshape(-1)
    idx = flat_mask.nonzero(as_tuple=True)[0]  # ascending flat index
    out = torch.zeros_like(flat_mask)
    if idx.numel() == 0:
        return out.view_as(mask)
    s = score.reshape(-1)[idx]
    u = units.reshape(-1)[idx]
    n = idx.numel()
    by_score = torch.sort(s, descending=True, stable=True).indices  # ties keep the lower index first
    n_units = int(u.max()) + 1
    if n_units == 1:
        order = by_score
    else:
        # Group by unit, keeping score order, with one sort of unique keys unit * n + score_rank. The key is
        # float64 (exact below 2**53) because CPU torch sorts int64 about 3x slower than float64.
        score_rank = torch.empty_like(by_score)
        score_rank[by_score] = torch.arange(n, device=idx.device)
        order = torch.sort(u.double() * n + score_rank.double()).indices
    u_sorted = u[order]
    counts = torch.bincount(u, minlength=n_units)
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.arange(n, device=idx.device) - starts[u_sorted]
    keep = rank < ceil_count(ratio, counts)[u_sorted]
    out[idx[order[keep]]] = True
    return out.view_as(mask)


def _top_k_dense(score: Tensor, mask: Tensor, units: Tensor, ratio: float) -> Tensor:
    """:func:`_top_k_per_unit` vectorised over every position, active or not, so no shape depends on the data
    (no host read on a GPU): order all positions by (inactive, unit, -score, index) with a stable sort of the
    scores, then a stable sort of the small unit keys (inactive positions get key B, after every unit). Unit ids
    are < B (a row, a group index or 0), which bounds the per-unit counts without reading them.
    """
    flat_mask = mask.reshape(-1)
    n = flat_mask.numel()
    if n == 0:
        return torch.zeros_like(mask)
    u = units.reshape(-1)
    n_units = mask.shape[0]
    arange = torch.arange(n, device=mask.device)
    by_score = torch.sort(score.reshape(-1), descending=True, stable=True).indices  # ties: lower index first
    unit_key = torch.where(flat_mask, u, n_units)[by_score]
    order = by_score[torch.sort(unit_key, stable=True).indices]  # active first, by unit, then score order
    u_sorted = u[order]
    counts = torch.zeros(n_units, dtype=torch.long, device=mask.device).scatter_add_(0, u, flat_mask.long())
    starts = torch.cumsum(counts, 0) - counts
    rank = arange - starts[u_sorted]
    keep = (rank < ceil_count(ratio, counts)[u_sorted]) & flat_mask[order]
    return torch.zeros_like(flat_mask).scatter_(0, order, keep).view_as(mask)


def _with_ties(chosen: Tensor, score: Tensor, mask: Tensor, units: Tensor) -> Tensor:
    """[B, T] bool: every active position whose score reaches its unit's lowest chosen score (ties kept whole)."""
    lowest = torch.full((mask.shape[0],), torch.inf, dtype=score.dtype, device=score.device)  # unit ids < B
    lowest.scatter_reduce_(0, units.reshape(-1), torch.where(chosen, score, torch.inf).reshape(-1), reduce="amin")
    return mask & (score >= lowest[units])


# --------------------------------------------------------------------------------------------- selectors
# Defaults (docs/method.md §3-5): random and frequent are ICT ablations, so they share ICT's ratio, scope, warm-up and
# Sparse-GRPO normaliser; 20-Entropy and STAPO follow their own papers (token mean over the kept tokens, no
# warm-up); "all" is the original GRPO per-response mean. Θ = 10: the paper's ablation found 10/20/40 alike.


@register_selector("all", normalization="per_response_all", label="grpo", in_default_grid=True, trl_loss=True,
                   help="GRPO: every response token carries the gradient")
def _select_all(inputs: SelectionInputs) -> Tensor:
    return inputs.mask.clone()


@register_selector("entropy", needs=("entropy",), scopes=("batch", "response"),
                   normalization="token_mean_selected", label="entropy20", in_default_grid=True,
                   help="20-Entropy: the top 20% of tokens by entropy, one cut-off for the batch")
def _select_entropy(inputs: SelectionInputs, *, ratio: float = 0.2, scope: str = "batch",
                    ties: str = "position") -> Tensor:
    """``ties``: ``"position"`` keeps exactly ceil(ratio·n) per unit (the earlier position wins a tie);
    ``"include"`` keeps every token whose entropy reaches the ceil(ratio·n)-th highest, as TRL's
    ``top_entropy_quantile`` (entropy >= its (1 − ratio) quantile) does."""
    assert inputs.entropy is not None
    units = _units(inputs, scope)
    chosen = _top_k_per_unit(inputs.entropy, inputs.mask, units, ratio, "20-Entropy's score (inputs.entropy)")
    return chosen if ties == "position" else _with_ties(chosen, inputs.entropy, inputs.mask, units)


@register_selector("stapo", needs=("entropy", "prob", "advantages"), normalization="token_mean_selected",
                   in_default_grid=True,
                   help="STAPO: silence low-probability, low-entropy positive-advantage tokens")
def _select_stapo(inputs: SelectionInputs, *, tau_p: float = 0.002, q: float = 0.75) -> Tensor:
    assert inputs.entropy is not None and inputs.prob is not None and inputs.advantages is not None
    positive = (inputs.advantages > 0).to(inputs.mask.device)[:, None]
    candidates = inputs.mask & positive & (inputs.prob < tau_p)
    # Bottom q by entropy = top q by negated entropy; one unit for the whole batch.
    silenced = _top_k_per_unit(-inputs.entropy, candidates, torch.zeros_like(inputs.mask, dtype=torch.long), q,
                               "STAPO's score (inputs.entropy)")
    return inputs.mask & ~silenced


@register_selector("ict", needs=("ict_score",), warmup_steps=10, in_default_grid=True,
                   help="ICT / Sparse-GRPO: the top 10% of each response by JS divergence to the group mean")
def _select_ict(inputs: SelectionInputs, *, ratio: float = 0.1, scope: str = "response") -> Tensor:
    assert inputs.ict_score is not None
    return top_fraction(inputs.ict_score, inputs, ratio, scope)


@register_selector("random", warmup_steps=10, label="random10", in_default_grid=True,
                   help="ablation: as many tokens as ICT picks, uniformly at random")
def _select_random(inputs: SelectionInputs, *, ratio: float = 0.1, scope: str = "response", seed: int = 0) -> Tensor:
    generator = torch.Generator(device="cpu").manual_seed(step_seed(seed, inputs.step))
    score = torch.rand(inputs.mask.shape, generator=generator, dtype=torch.float64).to(inputs.mask.device)
    return _top_k_per_unit(score, inputs.mask, _units(inputs, scope), ratio, "random's draw")


@register_selector("frequent", needs=("ict_score",), warmup_steps=10, label="frequent90",
                   help="ablation: the complement of ICT's selection (the frequent 90%)")
def _select_frequent(inputs: SelectionInputs, *, ratio: float = 0.1, scope: str = "response") -> Tensor:
    return inputs.mask & ~_select_ict(inputs, ratio=ratio, scope=scope)
