"""``ictrl.experiments.grid.runner``: a killed grid leaves no worker process running on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from fixtures.procs import pid_alive

SCRIPT = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path

    from ictrl.experiments.grid.runner import RunSpec, run_grid

    def slow(spec, run_dir):
        (Path(sys.argv[1]) / f"{os.getpid()}.pid").write_text("")
        time.sleep(120)
        return {"p1": 0.0, "p4": 0.0}

    if __name__ == "__main__":
        run_grid([RunSpec("grpo", s) for s in range(4)], Path(sys.argv[1]) / "grid", slow, jobs=2)
""")


def test_killing_the_parent_ends_its_workers(tmp_path: Path) -> None:
    script = tmp_path / "grid_script.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[3] / "src"),
                                                        os.environ.get("PYTHONPATH", "")])}
    parent = subprocess.Popen([sys.executable, str(script), str(tmp_path)], env=env)
    try:
        deadline = time.monotonic() + 120
        while len(list(tmp_path.glob("*.pid"))) < 2:
            assert parent.poll() is None, "the grid exited before its workers started"
            assert time.monotonic() < deadline, "the workers did not start"
            time.sleep(0.2)
        workers = [int(p.stem) for p in tmp_path.glob("*.pid")]
        assert all(pid_alive(w) for w in workers)
        parent.send_signal(signal.SIGTERM)  # what `kill` or a scheduler's preemption sends
        parent.wait(timeout=30)
        deadline = time.monotonic() + 20
        while any(pid_alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(pid_alive(w) for w in workers), f"orphan workers still running: {workers}"
        assert not list((tmp_path / "grid").glob("*/*/done.json"))
    finally:
        parent.kill()
        for pid in (int(p.stem) for p in tmp_path.glob("*.pid")):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
