"""Benchmark registry, problem loading, prompts and TRL datasets.

A :class:`Benchmark` names a data set twice: a hub id (``datasets.load_dataset(hub_id, hub_config,
split=hub_split)``, the path for users with network access) and a local file relative to the data root
(``$ICTRL_DATA_ROOT``, else ``../shared/data`` next to the repository), used first when present. Local copies
and hub versions of one benchmark often differ in layout (CommonsenseQA's nested ``question.stem``, ARC's
per-letter columns, MMLU's integer answer), so field names are lists of candidates (dotted paths allowed) and
choices/gold letters are normalised by one function for every layout seen.

Specs accepted by :func:`load_problems`: a registry name (``"math500"``), a name with options
(``"math_train:levels=3,4,5"``), or ``"jsonl:PATH[:key=value...]"`` with keys ``kind``, ``question_field``,
``answer_field``, ``choices_field``, ``id_field`` (a ``.json`` list works too).

Modules: :mod:`ictrl.data.registry` (Problem, Benchmark, BENCHMARKS, specs), :mod:`ictrl.data.loading`
(files, hub, mixtures, TRL datasets), :mod:`ictrl.data.prompts` (templates, the user message;
``registry.build_prompt`` adds the chat template).
"""

from ictrl.data.loading import (
    default_data_root,
    load_mixture,
    load_problems,
    read_records,
    row_to_problem,
    to_trl_dataset,
)
from ictrl.data.prompts import CHOICE_SUFFIX, LETTERS, MATH_SUFFIX, PROMPT_TEMPLATES, user_message
from ictrl.data.registry import (
    BENCHMARKS,
    Benchmark,
    Kind,
    Problem,
    apply_options,
    build_prompt,
    get_benchmark,
    parse_spec,
    register_benchmark,
)

__all__ = [
    "BENCHMARKS", "CHOICE_SUFFIX", "LETTERS", "MATH_SUFFIX", "PROMPT_TEMPLATES", "Benchmark", "Kind", "Problem",
    "apply_options", "build_prompt", "default_data_root", "get_benchmark", "load_mixture", "load_problems",
    "parse_spec", "read_records", "register_benchmark", "row_to_problem", "to_trl_dataset", "user_message",
]
