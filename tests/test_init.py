"""``import ictrl`` stays cheap, and ``from ictrl import ICTGRPOConfig, ICTGRPOTrainer`` gives the library's classes."""

from __future__ import annotations

import json
import subprocess
import sys

CHECK = """
import json, sys
import ictrl
cheap = sorted(m for m in ("torch", "transformers", "trl") if m in sys.modules)
listed = [n for n in ("ICTGRPOConfig", "ICTGRPOTrainer") if n in dir(ictrl)]
from ictrl import ICTGRPOConfig, ICTGRPOTrainer
import ictrl.engine
print(json.dumps({"imported": cheap, "listed": listed, "all": ictrl.__all__,
                  "same": [ictrl.ICTGRPOTrainer is ictrl.engine.ICTGRPOTrainer,
                           ICTGRPOConfig is ictrl.engine.ICTGRPOConfig,
                           issubclass(ICTGRPOTrainer, __import__("trl").GRPOTrainer)]}))
"""


def test_import_is_cheap_and_reexports_the_library() -> None:
    proc = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["imported"] == []  # none of torch, transformers, trl after plain ``import ictrl``
    assert got["listed"] == ["ICTGRPOConfig", "ICTGRPOTrainer"]
    assert {"ICTGRPOConfig", "ICTGRPOTrainer"} <= set(got["all"])
    assert got["same"] == [True, True, True]


def test_unknown_attribute_is_an_attribute_error() -> None:
    import ictrl

    try:
        ictrl.NoSuchThing  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchThing" in str(exc)
    else:
        raise AssertionError("ictrl.NoSuchThing resolved")
