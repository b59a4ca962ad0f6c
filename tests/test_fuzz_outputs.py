"""Property-based fuzzing of the folders ictrl writes into, through the commands as a user runs them
(``ictrl.cli.main``): a file ictrl did not write under every name a command writes there (train, eval, compare,
inspect, table), with and without ``--overwrite``; torn or damaged JSON in every file a command reads back (the list
of ictrl's files, eval's settings and samples, a run's ``run.json``, compare's ``done.json``, ``result.json`` and
``metrics.jsonl``, a results file ``ictrl table`` reads); a folder another run holds; a folder the filesystem
refuses to write.

Each outcome is the README's: success, or one ``ictrl COMMAND: error:`` line naming the file, exit status 2, before
any model loads, and the folder byte for byte as it was. The model loaders are stand-ins that end the command when
reached (every check passed). The default suite runs few examples; ``pytest --integration`` ten times more."""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

THOROUGH = "--integration" in sys.argv
FEW = settings(max_examples=150 if THOROUGH else 15, deadline=None, database=None,
               derandomize=not os.environ.get("ICTRL_FUZZ_RANDOM"),
               suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

OWNED = ".ictrl-files.json"


class ModelLoaded(Exception):
    """Raised by the stand-ins: reaching one means every check passed."""


def _loaded(*args: Any, **kwargs: Any) -> Any:
    raise ModelLoaded


@pytest.fixture
def no_model_load(monkeypatch: pytest.MonkeyPatch) -> None:
    import ictrl.eval.generate
    import ictrl.models
    from ictrl.experiments.grid import cli as gridcli

    monkeypatch.setattr(ictrl.models, "load_model_and_tokenizer", _loaded)
    monkeypatch.setattr(ictrl.eval.generate, "build_backend", _loaded)
    # compare's runs and its base evaluation: a run folder that is done is read back, any other reaches the stand-in
    monkeypatch.setattr(gridcli, "make_experiment", lambda args: gridcli.Experiment(
        runner=_loaded, eval_base=_loaded, settings={}, default_lr=None))


def run_cli(argv: list[str]) -> tuple[int, str]:
    """``ictrl.cli.main(argv)``'s status and stderr; a stand-in reached is status 0."""
    from ictrl.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            status = main(argv)
        except ModelLoaded:
            status = 0
    return status, err.getvalue()


def one_line(status: int, stderr: str, command: str) -> str:
    """The one error line of a refused command (exit 2, no traceback)."""
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = [line for line in stderr.split("\n") if line.startswith(f"ictrl {command}: error:")]
    assert status == 2 and len(lines) == 1, (status, stderr[-3000:])
    return lines[0]


def snapshot(folder: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None) for p in sorted(folder.rglob("*"))}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> dict[str, Path]:
    """What the commands read: training rows, a model with a run's record beside it, rollouts, an eval result."""
    from ictrl.experiments.inspect import Rollout, save_rollouts

    root = tmp_path_factory.mktemp("fuzz_outputs")
    rows = [{"question": f"What is {i}+1?", "answer": str(i + 1)} for i in range(8)]
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    shutil.copytree(tiny_model_dir, root / "model")
    save_rollouts(root / "rollouts.jsonl", [Rollout("p", ["a", "b"], [0.1, 0.2], [0.3, 0.4], [0.5, 0.6],
                                                    [True, False], reward=1.0, group=0)])
    gen = {"max_new_tokens": 8, "temperature": 0.6, "top_p": 0.95}
    settings_ = {"model": "m", "method": "grpo", "train_seed": 0, "generation": {"a": gen}}
    benchmarks = {"a": {"num_problems": 4, "generation": gen, "pass_at_k": {"1": {"mean": 0.5}}}}
    (root / "result").mkdir()
    (root / "result" / "results.json").write_text(json.dumps({"summary": {"settings": settings_,
                                                                          "benchmarks": benchmarks}}))
    return {"root": root, "model": root / "model", "rows": root / "train.jsonl", "rollouts": root / "rollouts.jsonl",
            "result": root / "result"}


def argv(command: str, out: Path, inputs: dict[str, Path], flags: list[str]) -> list[str]:
    """The command writing into ``out``, given inputs it accepts."""
    if command == "train":
        cfg = out.parent / "run.yaml"
        cfg.write_text(yaml.safe_dump({
            "model_name_or_path": str(inputs["model"]), "output_dir": str(out), "use_vllm": False,
            "dataset_name": f"jsonl:{inputs['rows']}", "report_to": "none", "prompts_per_step": 2,
            "num_generations": 4, "per_device_train_batch_size": 8, "max_completion_length": 8,
            "max_prompt_length": None, "learning_rate": 1e-3}))
        return ["train", str(cfg), *flags]
    where = ["--output-dir", str(out)]
    return {"eval": ["eval", "--model", str(inputs["model"]), "--benchmarks", f"jsonl:{inputs['rows']}", "--n", "1",
                     "--k", "1", "--method", "base", *where],
            "compare": ["compare", "--methods", "ict,random10", "--seeds", "1", *where],
            "inspect": ["inspect", "--rollouts", str(inputs["rollouts"]), *where],
            "table": ["table", str(inputs["result"]), *where]}[command]


# every name each command writes at the top of its output folder
WRITES = {
    "train": ["README.md", "config.yaml", "run.json", "metrics.jsonl", "config.json", "manifest.json",
              "trainer_state.json", "model.safetensors", "model-00001-of-00002.safetensors",
              "model.safetensors.index.json", "pytorch_model.bin", "generation_config.json", "tokenizer.json",
              "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja", "vocab.json", "merges.txt",
              "added_tokens.json", "training_args.bin", "adapter_config.json", "adapter_model.safetensors",
              "adapter"],
    "eval": ["settings.json", "samples.jsonl", "results.json", "results.md"],
    "compare": ["results.md", "results.json", "report.html", "curve_reward.png", "curve_purity_beta_all_tokens.png",
                "curve_selected_fraction.png", "base", "ict", "random10"],
    "inspect": ["inspect.html"],
    "table": ["table.md", "table.json", "table.html"],
}
FOLDERS = ("adapter", "base", "ict", "random10")  # names a command writes as folders
CONTENT = st.one_of(st.binary(max_size=40), st.sampled_from([b"", b"{}", b"[]", b'{"files": []}', b"# my project\n",
                                                              b"project: mine\n", b'{"method": "ict"}\n']))


@FEW
@given(data=st.data())
def test_a_file_ictrl_did_not_write_is_never_replaced(data: Any, inputs: dict[str, Path], no_model_load: None,
                                                      tmp_path_factory: pytest.TempPathFactory) -> None:
    """A file (or folder) under a name the command writes, not in ictrl's list of its files there: one line naming
    it, the folder unchanged, whatever else ictrl listed and whatever the flags (--overwrite replaces only ictrl's
    own files)."""
    command = data.draw(st.sampled_from(sorted(WRITES)))
    name = data.draw(st.sampled_from(WRITES[command]))
    out = tmp_path_factory.mktemp("foreign") / "out"
    out.mkdir()
    content = data.draw(CONTENT)
    if data.draw(st.booleans()) or name in FOLDERS:
        (out / name).mkdir()
        (out / name / "mine.txt").write_bytes(content)
    else:
        (out / name).write_bytes(content)
    others = [n for n in WRITES[command] if n != name]
    listed = data.draw(st.lists(st.sampled_from(others), max_size=3, unique=True)) if others else []
    if listed:  # ictrl's own files beside it
        (out / OWNED).write_text(json.dumps({"files": listed}))
        for other in listed:
            if other in FOLDERS:
                (out / other).mkdir()
            else:
                (out / other).write_text("ictrl's")
    flags = data.draw(st.lists(st.sampled_from(["--overwrite", "--resume=auto"]), max_size=2, unique=True)) \
        if command == "train" else []
    before = snapshot(out)
    status, stderr = run_cli(argv(command, out, inputs, flags))
    line = one_line(status, stderr, command)
    assert f"{out / name} " in line, line
    assert "was not written by ictrl" in line or (out / name).is_dir() and "is a directory; name a file" in line
    assert snapshot(out) == before


def tear(data: Any, text: bytes, keep: int = 0) -> bytes:
    """``text`` cut short inside its JSON (``keep`` bytes at least), with a byte that is not UTF-8 in it, or
    holding a value nested past what Python's JSON parser reads."""
    body = text.rstrip(b"\n")
    how = data.draw(st.sampled_from(["cut", "byte", "deep"]))
    if how == "deep":
        depth = data.draw(st.sampled_from([200_000, 5000]))
        return b'{"deep": ' + b"[" * depth + b"]" * depth + b"}"
    if how == "cut":
        return body[: data.draw(st.integers(keep, len(body) - 1))]
    at = data.draw(st.integers(0, len(body)))
    return body[:at] + b"\xff" + body[at:]


def done_compare(out: Path) -> None:
    """A finished compare of ict and random10 (one seed each), as its files are read back."""
    for method in ("ict", "random10"):
        run = out / method / "seed0"
        run.mkdir(parents=True)
        (run / "done.json").write_text(json.dumps({"spec": {"method": method, "seed": 0}, "seconds": 1.0, "p1": 0.1,
                                                   "p4": 0.2}))
        (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward": 0.1}) + "\n" for s in (1, 2)))
    (out / "base").mkdir()
    (out / "base" / "result.json").write_text(json.dumps({"p1": 0.05, "p4": 0.1}))
    (out / OWNED).write_text(json.dumps({"files": ["base", "ict", "random10"]}))


# (command, the file read back, relative to the output folder; "model/" is beside the model)
READ_BACK = [("eval", OWNED), ("eval", "settings.json"), ("eval", "samples.jsonl"), ("eval", "model/run.json"),
             ("train", OWNED), ("compare", OWNED), ("compare", "ict/seed0/done.json"),
             ("compare", "base/result.json"), ("compare", "random10/seed0/metrics.jsonl"), ("table", OWNED),
             ("table", "result/results.json"), ("inspect", OWNED)]


@FEW
@given(data=st.data())
def test_torn_json_in_a_file_ictrl_reads_back_is_one_line_naming_it(data: Any, inputs: dict[str, Path],
                                                                    no_model_load: None,
                                                                    tmp_path_factory: pytest.TempPathFactory) -> None:
    command, name = data.draw(st.sampled_from(READ_BACK))
    root = tmp_path_factory.mktemp("torn")
    out = root / "out"
    out.mkdir()
    local = dict(inputs)
    if name.startswith("model/"):
        local["model"] = root / "model"
        shutil.copytree(inputs["model"], local["model"])
        path = local["model"] / "run.json"
        path.write_text(json.dumps({"method": "ict", "method_from": "file", "seed": 0}) + "\n")
    elif name.startswith("result/"):
        local["result"] = root / "result"
        shutil.copytree(inputs["result"], local["result"])
        path = local["result"] / "results.json"
    elif command == "compare":
        done_compare(out)
        path = out / name
    else:
        path = out / name
        rows = [{"seed": 0, "benchmark": "train", "problem_id": str(i), "samples": []} for i in range(3)]
        path.write_text({OWNED: json.dumps({"files": WRITES[command][:2]}) + "\n",
                         "settings.json": json.dumps({"model": "m", "n": 1, "ks": [1], "seeds": [0]}) + "\n",
                         "samples.jsonl": "".join(json.dumps(r) + "\n" for r in rows)}[name])
    text = path.read_bytes()
    if name.endswith(".jsonl"):  # a line before the last: a torn last line is a kill mid-write, repaired
        lines = text.split(b"\n")
        row = data.draw(st.integers(0, len([x for x in lines if x]) - 2))
        lines[row] = tear(data, lines[row], keep=1)  # an empty line is a blank line, skipped
        path.write_bytes(b"\n".join(lines))
    else:
        path.write_bytes(tear(data, text))
    before = path.read_bytes()
    status, stderr = run_cli(argv(command, out, local, []))
    line = one_line(status, stderr, command)
    assert str(path) in line, (line, path)
    assert path.read_bytes() == before


@FEW
@given(holder=st.text(max_size=60), command=st.sampled_from(["eval", "train"]))
def test_a_folder_another_run_holds_is_one_line_naming_the_holder(holder: str, command: str,
                                                                  inputs: dict[str, Path], no_model_load: None,
                                                                  tmp_path_factory: pytest.TempPathFactory) -> None:
    """Two runs into one folder at once: the second stops in one line that says what the lock file says of the
    first (its pid), before it loads anything."""
    import fcntl

    out = tmp_path_factory.mktemp("held") / "out"
    out.mkdir()
    with open(out / ".ictrl.lock", "w", encoding="utf-8", errors="surrogateescape") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write(f"pid {os.getpid()} {holder}")
        held.flush()
        status, stderr = run_cli(argv(command, out, inputs, []))
    line = one_line(status, stderr, command)
    assert f"{out} is in use by another run (pid {os.getpid()}" in line, line
    assert sorted(p.name for p in out.iterdir()) == [".ictrl.lock"]


@FEW
@given(command=st.sampled_from(["inspect", "table", "tiny-model", "eval", "compare"]),
       when=st.sampled_from(["probe", "write"]), fresh=st.booleans())
def test_a_folder_the_filesystem_refuses_is_one_line(command: str, when: str, fresh: bool, inputs: dict[str, Path],
                                                     no_model_load: None, tmp_path_factory: pytest.TempPathFactory,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A read-only folder (a mount; root passes ``os.access``), refused when the command probes it or only when it
    writes its file, where removing the temporary file fails too."""
    import pathlib

    import ictrl.files

    out = tmp_path_factory.mktemp("ro") / "out"
    if not fresh:
        out.mkdir()
    real_open, real_unlink, real_builtin_open = os.open, pathlib.Path.unlink, open

    def refused(path: Any) -> OSError:
        return OSError(errno.EROFS, "Read-only file system", str(path))

    def os_open(path: Any, flags: int, *args: Any) -> int:
        if when == "probe" and ".ictrl-probe-" in str(path):
            raise refused(path)
        return real_open(path, flags, *args)

    def files_open(path: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if when == "write" and str(path).endswith(".tmp") and "x" in mode:
            raise refused(path)
        return real_builtin_open(path, mode, *args, **kwargs)

    def unlink(self: pathlib.Path, missing_ok: bool = False) -> None:
        if str(self).endswith(".tmp"):
            raise refused(self)
        real_unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(os, "open", os_open)
    monkeypatch.setattr(ictrl.files, "open", files_open, raising=False)
    monkeypatch.setattr(pathlib.Path, "unlink", unlink)
    args = [command, str(out), "--untrained"] if command == "tiny-model" else argv(command, out, inputs, [])
    status, stderr = run_cli(args)
    if status == 0 and command in ("eval", "compare") and when == "write":
        return  # their first write is after the model loads (the stand-in ends them before it)
    line = one_line(status, stderr, command)
    assert "Read-only file system" in line and str(out) in line, line


# --- reruns after the data changed -------------------------------------------------------------------------------

class Scripted:
    """A backend whose completions are fixed by the question (``What is a+b?``: the sum, then the sum plus one,
    ...): a grade depends only on the gold. It counts the prompts it samples."""

    def __init__(self) -> None:
        self.sampled: list[str] = []

    def generate(self, prompts: Any, n: int, max_new_tokens: int, temperature: float, top_p: float,
                 seed: int) -> list[list[str]]:
        import re

        self.sampled += list(prompts)
        sums = [sum(map(int, re.search(r"What is (\d+)\+(\d+)\?", p).groups())) for p in prompts]  # type: ignore
        return [[f"so \\boxed{{{total + j}}}" for j in range(n)] for total in sums]


EDITS = st.sampled_from(["gold-right", "gold-wrong", "gold-invisible", "add-row", "drop-last-row", "question",
                         "nothing"])


@settings(max_examples=60 if THOROUGH else 6, deadline=None, database=None,
          derandomize=not os.environ.get("ICTRL_FUZZ_RANDOM"),
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_eval_reruns_after_the_data_changed_report_the_data_as_it_is(data: Any, inputs: dict[str, Path],
                                                                     tmp_path_factory: pytest.TempPathFactory,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """``ictrl eval`` run again after its rows were edited (golds corrected, made wrong or pasted with an invisible
    character; rows added or dropped; a question reworded): each run's results grade the saved completions against
    the golds the data holds now, only the blocks holding a problem without a saved row are sampled, and a changed
    prompt is one line with the folder as it was."""
    import ictrl.eval.generate
    from ictrl.rewards import math_reward

    backend = Scripted()
    monkeypatch.setattr(ictrl.eval.generate, "build_backend", lambda *a, **k: backend)
    root = tmp_path_factory.mktemp("rerun")
    rows = [{"question": f"What is {i}+{i + 1}?", "answer": str(2 * i + 1)}
            for i in range(data.draw(st.integers(1, 3)))]
    path, out = root / "rows.jsonl", root / "out"
    n, chunk = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 2))
    argv = ["eval", "--model", str(inputs["model"]), "--benchmarks", f"jsonl:{path}", "--n", str(n), "--k", "1",
            "--temperature", "0", "--method", "base", "--chunk-size", str(chunk), "--output-dir", str(out),
            "--no-progress"]
    saved: set[str] = set()
    for run in range(data.draw(st.integers(2, 4))):
        edit = data.draw(EDITS) if run else "nothing"
        i = data.draw(st.integers(0, len(rows) - 1))
        total = 2 * int(rows[i]["question"].split("+")[0].split()[-1]) + 1
        if edit == "gold-right":
            rows[i]["answer"] = str(total + data.draw(st.integers(0, n - 1)))
        elif edit == "gold-wrong":
            rows[i]["answer"] = str(total + n + 5)
        elif edit == "gold-invisible":
            rows[i]["answer"] = data.draw(st.sampled_from(["\u200b", "\ufeff", "\u00ad"])) + rows[i]["answer"]
        elif edit == "add-row":
            rows.append({"question": f"What is {len(rows)}+{len(rows) + 1}?", "answer": str(2 * len(rows) + 1)})
        elif edit == "drop-last-row" and len(rows) > 1:
            rows.pop()
        elif edit == "question":
            rows[i]["question"] += " Think."
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        before = snapshot(out) if out.exists() else {}
        backend.sampled.clear()
        status, stderr = run_cli(argv)
        if edit == "question" and f"jsonl:rows.jsonl-{i}" in saved:
            assert "prompt differs" in one_line(status, stderr, "eval") and snapshot(out) == before
            rows[i]["question"] = rows[i]["question"].removesuffix(" Think.")
            continue
        assert status == 0 and "Traceback" not in stderr, stderr[-3000:]
        ids = [f"jsonl:rows.jsonl-{k}" for k in range(len(rows))]
        blocks = [ids[k:k + chunk] for k in range(0, len(ids), chunk)]  # a block with a row to draw is drawn whole
        assert len(backend.sampled) == sum(len(b) for b in blocks if set(b) - saved), (edit, saved, backend.sampled)
        saved |= set(ids)
        records = json.loads((out / "results.json").read_text())["records"]
        assert [r["problem_id"] for r in records] == ids
        for rec, row in zip(records, rows):
            assert rec["gold"] == row["answer"]
            assert rec["num_correct"] == sum(math_reward(s["completion"], row["answer"]) for s in rec["samples"])
        on_disk = {r["problem_id"]: r for r in map(json.loads, (out / "samples.jsonl").read_text().splitlines())}
        assert all(on_disk[r["problem_id"]]["gold"] == r["gold"] for r in records)
