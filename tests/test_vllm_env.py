"""``ictrl.vllm_env``'s exit handler: registered with the first engine, and run before vLLM's own finalizer."""

from __future__ import annotations

import subprocess
import sys

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
