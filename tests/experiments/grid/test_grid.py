"""``ictrl.experiments.grid.runner``: a killed grid leaves no worker process running on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
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


COMPARE_SCRIPT = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path

    from ictrl.cli import main
    from ictrl.experiments.grid import cli as gridcli

    def slow(spec, run_dir):
        (Path(sys.argv[1]) / f"{os.getpid()}.pid").write_text("")
        time.sleep(600)
        return {"p1": 0.0, "p4": 0.0}

    if __name__ == "__main__":
        gridcli.make_experiment = lambda args: gridcli.Experiment(
            runner=slow, eval_base=lambda out: {"p1": 0.0, "p4": 0.0}, settings={}, default_lr=None)
        sys.exit(main(["compare", "--methods", "grpo,ict", "--seeds", "2", "--jobs", "2", "--output-dir",
                       str(Path(sys.argv[1]) / "cmp")]))
""")


@pytest.mark.integration
@pytest.mark.parametrize("signum, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_stopping_compare_ends_its_workers_and_leaves_the_grid_resumable(signum: int, status: int, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Ctrl-C or SIGTERM to ``ictrl compare --jobs 2`` alone (not its process group): the command ends at once with
    one line, its workers with it, and a rerun goes on (the pool's own exit waited for every queued run, its workers
    training on)."""
    script = tmp_path / "compare_script.py"
    script.write_text(COMPARE_SCRIPT)
    import ictrl

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(ictrl.__file__).parents[1]),
                                                        os.environ.get("PYTHONPATH", "")])}
    parent = subprocess.Popen([sys.executable, str(script), str(tmp_path)], env=env, stderr=subprocess.PIPE,
                              text=True)
    try:
        deadline = time.monotonic() + 120
        while len(list(tmp_path.glob("*.pid"))) < 2:
            assert parent.poll() is None, "the grid exited before its workers started"
            assert time.monotonic() < deadline, "the workers did not start"
            time.sleep(0.2)
        workers = [int(p.stem) for p in tmp_path.glob("*.pid")]
        parent.send_signal(signum)
        _, err = parent.communicate(timeout=60)  # the runs sleep 600 s: waiting for them would time out
        assert parent.returncode == status, err
        lines = [line for line in err.splitlines() if line.strip()]
        how = "terminated (SIGTERM)" if signum == signal.SIGTERM else "interrupted"
        assert lines[-1].startswith(f"ictrl compare: {how}; 0 of 4 runs are done"), err
        assert "rerun the same command to run the others" in lines[-1] and "Traceback" not in err, err
        deadline = time.monotonic() + 20
        while any(pid_alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(pid_alive(w) for w in workers), f"workers still running: {workers}"
    finally:
        parent.kill()
        for pid in (int(p.stem) for p in tmp_path.glob("*.pid")):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    from ictrl.cli import main
    from ictrl.experiments.grid import cli as gridcli

    def quick(spec: object, run_dir: Path) -> dict[str, float]:
        (run_dir / "metrics.jsonl").write_text('{"step": 1, "reward": 0.5}\n')
        return {"p1": 0.5, "p4": 0.5}

    monkeypatch.setattr(gridcli, "make_experiment", lambda args: gridcli.Experiment(
        runner=quick, eval_base=lambda out: {"p1": 0.0, "p4": 0.0}, settings={}, default_lr=None))
    out = tmp_path / "cmp"
    assert main(["compare", "--methods", "grpo,ict", "--seeds", "2", "--output-dir", str(out)]) == 0  # lock freed
    assert "unfinished earlier attempt found" in capsys.readouterr().out
    assert len(list(out.glob("*/seed*/done.json"))) == 4
