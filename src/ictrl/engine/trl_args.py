"""TRL's own trainer arguments as ``ICTGRPOTrainer`` takes them: a plain ``trl.GRPOConfig`` converted into an
``ICTGRPOConfig`` that runs TRL's GRPO, and the precision a set of arguments gives the Trainer's Accelerator."""

from __future__ import annotations

import logging
import os
from dataclasses import fields
from typing import Any

logger = logging.getLogger(__name__)


def from_grpo_config(args: Any, given: str = "args is a trl.GRPOConfig") -> Any:
    """An ``ICTGRPOConfig`` with every field of the ``trl.GRPOConfig`` ``args`` and TRL's behaviour: token_selector
    'all' with TRL's normaliser for ``loss_type``, as ``ictrl train`` runs a ``trl grpo`` file that sets no
    ``token_selector``. ictrl's other fields keep their defaults. Logs one line naming the method that runs."""
    from ictrl.engine.config import ICTGRPOConfig

    values = {f.name: getattr(args, f.name) for f in fields(args) if f.init}
    # TRL's __post_init__ derives generation_batch_size from steps_per_generation (or the reverse) and refuses both
    # set; steps_per_generation alone gives back the same generation batch.
    values["generation_batch_size"] = None
    # TRL's Trainer checks the trackers itself (a missing package is transformers' RuntimeError, after TRL's own
    # checks): ictrl's earlier check would change the exception a TRL user catches
    report_to, values["report_to"] = values["report_to"], "none"
    converted = ICTGRPOConfig(**values, token_selector="all")
    converted.report_to = report_to
    logger.warning("ICTGRPOTrainer: %s; converted to ICTGRPOConfig running TRL's GRPO (method %s, token_selector "
                   "'all': every response token, TRL's normaliser %r for loss_type %r); for ICT pass "
                   "ictrl.ICTGRPOConfig(..., token_selector='ict')", given, converted.selector.label,
                   converted.loss_normalization, converted.loss_type)
    return converted


def default_config(model: Any) -> Any:
    """The arguments ``trl.GRPOTrainer`` makes when given none: ``GRPOConfig("<model name>-GRPO")`` (the last part
    of the model's id or path, as a relative output folder), converted by :func:`from_grpo_config`: TRL's GRPO."""
    from trl import GRPOConfig

    name = model if isinstance(model, str) else getattr(model.config, "_name_or_path", "")  # as TRL reads it
    output_dir = f"{str(name).split('/')[-1]}-GRPO"
    return from_grpo_config(GRPOConfig(output_dir), f"no args: TRL's GRPOConfig({output_dir!r})")


def as_ict_config(args: Any) -> Any:
    """``args`` converted by :func:`from_grpo_config` when it is a ``trl.GRPOConfig`` but not an ``ICTGRPOConfig``;
    anything else unchanged (the trainer refuses what is not an ``ICTGRPOConfig``)."""
    from trl import GRPOConfig

    from ictrl.engine.config import ICTGRPOConfig

    if isinstance(args, GRPOConfig) and not isinstance(args, ICTGRPOConfig):
        return from_grpo_config(args)
    return args


def run_precision(args: Any, environ: dict[str, str] | None = None) -> tuple[str, str]:
    """(precision, what set it) for the trainer arguments ``args``, as transformers decides it: the config's
    ``fp16``/``bf16`` when true, else ``ACCELERATE_MIXED_PRECISION`` (set by ``accelerate launch`` from its config
    file's ``mixed_precision`` or its ``--mixed_precision`` flag), else fp32. ``args.mixed_precision`` is the value
    the Trainer hands its Accelerator; ``environ`` (default ``os.environ``) is read when ``args`` has none."""
    env = os.environ if environ is None else environ
    mixed = getattr(args, "mixed_precision", None) or env.get("ACCELERATE_MIXED_PRECISION", "no")
    if getattr(args, "fp16", False) and mixed == "fp16":
        return "fp16", "the run config's fp16: true"
    if getattr(args, "bf16", False) and mixed == "bf16":
        return "bf16", "the run config's bf16: true"
    if mixed != "no":
        return mixed, ("accelerate's mixed_precision (ACCELERATE_MIXED_PRECISION, from its config file or "
                       "--mixed_precision; the run config's bf16 and fp16 are false)")
    # "false", not "not set": the values are the arguments', whether the file wrote false or left TRL's default off
    return "fp32", "the run config's bf16 and fp16 are false and accelerate's mixed_precision is no"


# Set in every process an accelerate launcher starts (simple, multi-GPU, DeepSpeed) and by torchrun: the process's
# ACCELERATE_MIXED_PRECISION and OMP_NUM_THREADS are then that launcher's.
LAUNCHED_ENV = ("ACCELERATE_DYNAMO_BACKEND", "LOCAL_RANK")


def started_by_launcher(environ: dict[str, str] | None = None) -> bool:
    """Whether a launcher (``accelerate launch``, torchrun) started this process."""
    env = os.environ if environ is None else environ
    return any(key in env for key in LAUNCHED_ENV)


def launch_precision(environ: dict[str, str] | None = None) -> tuple[str, str] | None:
    """(mixed_precision, why) that ``trl grpo`` runs with when nothing launched this process: ``trl grpo`` starts
    its script through ``accelerate launch``, which sets ``ACCELERATE_MIXED_PRECISION`` for it from the default
    accelerate config file (``accelerate config``), else to ``no``, replacing the shell's value (``why`` is '' when
    no config file and no shell value had a say). None under a launcher: the value it set stands."""
    env = os.environ if environ is None else environ
    if started_by_launcher(env):
        return None
    from accelerate.commands import config as accelerate_config

    path = accelerate_config.default_config_file
    mixed, where = "no", "no default accelerate config file, so accelerate launch's default no"
    if os.path.isfile(path):  # read by accelerate's own loader, as accelerate launch reads it
        from accelerate.commands.config.config_args import load_config_from_file

        from ictrl.errors import ConfigError

        try:
            mixed = str(load_config_from_file(path).mixed_precision or "no")
        except Exception as exc:  # noqa: BLE001 - accelerate's loader raises whatever its parser does
            raise ConfigError(f"the default accelerate config {path} cannot be read ({type(exc).__name__}: {exc}); "
                              "fix or remove it (accelerate launch, as trl grpo runs, reads it too)") from None
        where = f"the default accelerate config {path}"
    shell = env.get("ACCELERATE_MIXED_PRECISION")
    replaced = f"; ACCELERATE_MIXED_PRECISION={shell} in the environment is replaced, as accelerate launch " \
               "replaces it" if shell is not None and shell != mixed else ""
    if not replaced and not os.path.isfile(path):  # nothing set it: run_precision's own words say it
        return mixed, ""
    return mixed, f"accelerate's mixed_precision as trl grpo's accelerate launch sets it: {where}{replaced}"


def cpu_kernel_problem(environ: dict[str, str] | None = None) -> str | None:
    """Why TRL's log-probs cannot run on this machine's CPU, or None. TRL 1.15's fused LM head
    (``trl/kernels/chunked_logprob.py``) launches a Triton kernel on every device (1.16 runs the same tiles in torch
    off CUDA/XPU): without CUDA it needs triton (the CPU torch wheel does not bring it; stock TRL then fails with
    ``'NoneType' object has no attribute 'apply'``) and ``TRITON_INTERPRET=1`` (else "0 active drivers")."""
    import trl
    from packaging.version import Version

    if Version(trl.__version__) >= Version("1.16"):
        return None
    env = os.environ if environ is None else environ
    how = "or use trl 1.16 (constraints.txt's), which runs it in torch off CUDA"
    try:
        import triton  # noqa: F401 - TRL 1.15 imports it the same way, and without it has no kernel at all
    except ImportError:
        return (f"trl {trl.__version__} computes log-probs with a Triton kernel on every device, and triton is not "
                "installed (the CPU torch wheel does not bring it): pip install -c constraints.txt triton and set "
                f"TRITON_INTERPRET=1 (Triton's interpreter runs it on the CPU, slowly), {how}")
    if env.get("TRITON_INTERPRET", "").strip() not in ("1", "true", "True"):
        return (f"trl {trl.__version__} computes log-probs with a Triton kernel on every device, which without CUDA "
                f"runs only under Triton's interpreter: set TRITON_INTERPRET=1 (slow), {how}")
    return None
