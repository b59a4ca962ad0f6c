"""What a selection rule reads (:class:`SelectionInputs`) and the view of it a rule is handed: the fields its
``needs`` declares, a generator seeded from (seed, step) and a metric hook (docs/method.md, "Write your own rule").
Re-exported by :mod:`ictrl.core.selection`, where the rules live."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any, Callable

import torch
from torch import Tensor

from ictrl.core.checks import INT, MASK, check_number, check_tensor, require_on_device
from ictrl.core.stats import TokenStats

# What a selector's ``needs`` may name: every per-token statistic (the fields of TokenStats, each under its own name
# on SelectionInputs), then the per-response values.
STAT_FIELDS = tuple(f.name for f in fields(TokenStats))
NEEDS_FIELDS = (*STAT_FIELDS, "advantages", "group_ids")
# What each field a rule may declare holds, in words (``ictrl selectors``, a run's first lines).
FIELD_WORDS = {"entropy": "entropy H1", "renyi2": "Renyi-2 entropy H2", "purity": "purity (sum of p squared)",
               "logprob": "log pi of the sampled token", "prob": "pi of the sampled token",
               "ict_score": "ICT score u, from the group JS sweep", "advantages": "[B] each response's advantage",
               "group_ids": "[B] each response's prompt (0..B/G-1)"}


class SelectorError(ValueError):
    """A selection rule failed at a step: it raised, returned what is not a mask, or read an input its ``needs``
    does not declare. The message is one line naming the rule (``file:function`` for a user's), the step and what
    it returned or raised; ``ictrl train`` adds the last checkpoint and the command that resumes."""


class SelectorExit(SelectorError, RuntimeError):
    """A selector's function raised ``SystemExit`` (or another ``BaseException`` but Ctrl-C): the message names it."""


def step_seed(seed: int, step: int) -> int:
    """A 63-bit seed derived from (seed, step) with a fixed hash: no collisions like seed*N + step."""
    digest = hashlib.blake2b(f"{seed}:{step}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


@dataclass
class SelectionInputs:
    """Everything a selector may read. ``mask`` is required; the rest are optional per selector.

    mask [B, T] bool (0/1 accepted, converted); entropy, renyi2, purity, logprob, prob, ict_score [B, T]: the
    fields of :class:`~ictrl.core.stats.TokenStats` under their own names; advantages [B]; group_ids [B] integer
    prompt labels; step: the optimizer step (warm-up and the random draw); seed: the run's ``selection_seed``, which
    seeds :attr:`generator` with the step. :meth:`from_stats` builds it from a ``TokenStats``, as the trainer,
    ``ictrl inspect`` and ``ictrl regime`` do. ``metric_sink(name, value)`` receives :meth:`log_metric`'s values
    (the trainer's: ``ictrl/rule/<name>`` in the run's metrics; None: dropped).
    """

    mask: Tensor
    step: int = 0
    entropy: Tensor | None = None
    renyi2: Tensor | None = None
    purity: Tensor | None = None
    logprob: Tensor | None = None
    prob: Tensor | None = None
    ict_score: Tensor | None = None
    advantages: Tensor | None = None
    group_ids: Tensor | None = None
    seed: int = 0
    metric_sink: Callable[[str, float], None] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_stats(cls, mask: Tensor, stats: TokenStats | None, fields: Iterable[str] = STAT_FIELDS, *,
                   step: int = 0, advantages: Tensor | None = None, group_ids: Tensor | None = None,
                   seed: int = 0, metric_sink: Callable[[str, float], None] | None = None) -> SelectionInputs:
        """The inputs with the statistics ``fields`` of ``stats`` (None: none) under their own names; the other
        statistics stay None (a step computes what its selector reads: :func:`needed_stats`)."""
        wanted = set(fields)
        values = {f: getattr(stats, f) for f in STAT_FIELDS if f in wanted} if stats is not None else {}
        return cls(mask=mask, step=step, advantages=advantages, group_ids=group_ids, seed=seed,
                   metric_sink=metric_sink, **values)

    def __post_init__(self) -> None:
        self.mask = check_tensor("mask", self.mask, ("B", "T"), MASK)  # the step's mask is bool: no host read
        check_number("step", self.step, integer=True)
        check_number("seed", self.seed, low=-(2**63), integer=True)
        B = self.mask.shape[0]
        for name in STAT_FIELDS:
            value = getattr(self, name)
            if value is not None:  # NaN checked on the device, in the step too: no host read
                check_tensor(name, value, self.mask.shape, of="the mask's ")
                require_on_device(~(torch.isnan(value) & self.mask).any(), f"{name} holds NaN at active positions")
        if self.advantages is not None:
            check_tensor("advantages", self.advantages, (B,))
        if self.group_ids is not None:
            check_tensor("group_ids", self.group_ids, (B,), INT)

    @property
    def generator(self) -> torch.Generator:
        """A ``torch.Generator`` on the mask's device seeded from (``seed``, ``step``): a rule that draws at random
        draws from it (``torch.rand(inputs.mask.shape, generator=inputs.generator, device=inputs.mask.device)``),
        so every process draws the same numbers and a rerun the same selection; torch's global generator differs
        between processes, and a run refuses a rule that gives them different masks. One generator per call."""
        generator = self.__dict__.get("_generator")
        if generator is None:
            generator = torch.Generator(device=self.mask.device).manual_seed(step_seed(self.seed, self.step))
            self.__dict__["_generator"] = generator
        return generator

    def log_metric(self, name: str, value: float | Tensor) -> None:
        """Log a scalar of the rule's own (as TRL hands reward functions ``log_metric``): the trainer averages it
        over the logging window as ``ictrl/rule/<name>`` in the run's metrics (metrics.jsonl). A tensor is read to
        the host here: pass a Python number where the rule has one."""
        value = float(value.detach().double()) if isinstance(value, Tensor) else value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"log_metric({name!r}) takes a number, got {type(value).__name__}")
        if self.metric_sink is not None:
            self.metric_sink(str(name), float(value))

    def declared(self, needs: Iterable[str], rule: str) -> SelectionInputs:
        """This input as the rule ``rule`` sees it: a statistic its ``needs`` does not name, or a per-response
        field it does not name that is None, raises :class:`SelectorError` naming the ``needs`` entry to add
        (never None three calls later). The tensors are shared, not copied."""
        view = object.__new__(_Declared)
        view.__dict__.update(self.__dict__)
        view.__dict__["_declared"] = (frozenset(needs), rule)
        return view


class _Declared(SelectionInputs):
    """:meth:`SelectionInputs.declared`'s view: reading an undeclared input is an error naming it."""

    def __getattribute__(self, name: str) -> Any:
        if name in NEEDS_FIELDS:
            values = object.__getattribute__(self, "__dict__")
            needs, rule = values["_declared"]
            if name not in needs and (name in STAT_FIELDS or values[name] is None):
                raise SelectorError(
                    f"selector {rule} reads inputs.{name} at step {values['step']}, which its needs does not "
                    f"declare: a run computes only what needs names; register it with needs=(..., {name!r})")
        return object.__getattribute__(self, name)

    def __repr__(self) -> str:
        needs, rule = self.__dict__["_declared"]
        shown = ", ".join(f"{k}=[{', '.join(map(str, self.__dict__[k].shape))}]" for k in sorted(needs)
                          if self.__dict__.get(k) is not None)
        return f"SelectionInputs(rule {rule}, step={self.step}, mask=[{', '.join(map(str, self.mask.shape))}]" + \
            (f", {shown})" if shown else ")")
