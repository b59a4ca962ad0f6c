"""``ictrl.vllm_env``: its exit handler (registered with the first engine, run before vLLM's own finalizer) and
the CPU attention's head sizes."""

from __future__ import annotations

import subprocess
import sys

import pytest

# An engine stand-in with a finalizer built with it, as vLLM's LLM builds one; two engines handed over.
SCRIPT = """
import atexit
import weakref

before = atexit._ncallbacks()
from ictrl import vllm_env
print("registered at import:", atexit._ncallbacks() - before)


class Core:
    def __init__(self, name):
        self.name = name

    def shutdown(self):
        print("shut down", self.name)


class Engine:
    def __init__(self, name):
        self.llm_engine = type("LLMEngine", (), {"engine_core": Core(name)})()
        weakref.finalize(self, print, "vLLM's finalizer", name)


engines = [Engine("a"), Engine("b")]
before = atexit._ncallbacks()
for engine in engines:
    vllm_env.shutdown_before_exit(engine)
print("registered by two engines:", atexit._ncallbacks() - before)
"""


def test_engines_shut_down_at_exit_before_their_finalizers_and_import_registers_nothing() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["registered at import: 0", "registered by two engines: 1", "shut down b",
                                        "shut down a", "vLLM's finalizer b", "vLLM's finalizer a"]


@pytest.mark.parametrize(("head_dim", "refused"), [(16, True), (32, False), (64, False), (512, False), (576, True)])
def test_cpu_attentions_head_sizes_are_one_line_before_the_engine(head_dim: int, refused: bool,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from ictrl import vllm_env
    from ictrl.errors import UserError

    monkeypatch.setattr(vllm_env, "on_cpu", lambda: True)
    config = SimpleNamespace(head_dim=head_dim, hidden_size=64, num_attention_heads=4)
    if not refused:
        vllm_env.check_cpu_head_dim(config, "use_vllm")
        return
    with pytest.raises(UserError, match=rf"^use_vllm: vLLM's CPU attention needs a head_dim in \[32, 512\], this "
                                        rf"model has {head_dim};"):
        vllm_env.check_cpu_head_dim(config, "use_vllm")
    monkeypatch.setattr(vllm_env, "on_cpu", lambda: False)  # a GPU build takes them
    vllm_env.check_cpu_head_dim(config, "use_vllm")
