"""Property-based fuzzing of every input a user hands ictrl before a model loads: run configs (YAML text and
``--KEY=VALUE`` flags: wrong types, out-of-range and non-finite values, duplicate and unknown keys, odd unicode,
extreme learning rates), training data rows (jsonl with wrong fields, types, encodings and sizes; U+2028, U+0085,
lone surrogates, a BOM, CRLF), reward modules (exiting or raising at import, names that are not functions) and
reward calls (exiting, raising, returning anything), output paths that alias the model, the data or the config,
reruns into an earlier run's folder, and ``ictrl eval`` arguments.

The README promises two outcomes for bad input: success, or one line ``ictrl COMMAND: error: ...`` with exit status
2, before any model loads. Each case runs the command in-process (``ictrl.cli.main``: ``train --print-config``, the
data loader ``train`` uses, ``eval`` up to its backend) with the model loader replaced by one that fails the test,
and asserts one of the two outcomes; anything else (a traceback, an input or an earlier run replaced, a run that
trains nothing) fails with hypothesis's smallest example. The default suite runs the ``quick`` profile; ``pytest
--integration`` runs ``thorough`` (ten times the examples)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

# The same examples every run (CI stays reproducible); ICTRL_FUZZ_RANDOM=1 explores new ones.
COMMON = dict(deadline=None, database=None, derandomize=not os.environ.get("ICTRL_FUZZ_RANDOM"),
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
settings.register_profile("quick", max_examples=40, **COMMON)
settings.register_profile("thorough", max_examples=400, **COMMON)


# read when the module loads: hypothesis binds a test's settings when it is decorated
THOROUGH = "--integration" in sys.argv
settings.load_profile("thorough" if THOROUGH else "quick")
# the properties that run ictrl train's checks up to the model load (a tenth of a second each) take fewer
FULL_CHECKS = settings(max_examples=150 if THOROUGH else 12, **COMMON)


@pytest.fixture(scope="module", autouse=True)
def _count_cases() -> Any:
    """Prints (``-s``) how many cases the fuzzer drove through the checks, and how many passed them; with
    ICTRL_FUZZ_SHOW=1 each case's status and last line."""
    yield
    print(f"\nfuzzer cases run: {CASES['count']}; passed the checks: {sum(s == 0 for s, _ in OUTCOMES)} of the "
          f"{len(OUTCOMES)} command cases")
    if os.environ.get("ICTRL_FUZZ_SHOW"):
        for status, line in OUTCOMES:
            print(status, line)


class ModelLoaded(Exception):
    """Raised by the stand-in model loaders: reaching one means every check passed."""


@pytest.fixture
def no_model_load(monkeypatch: pytest.MonkeyPatch) -> None:
    import ictrl.eval.generate
    import ictrl.models

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise ModelLoaded

    monkeypatch.setattr(ictrl.models, "load_model_and_tokenizer", refuse)
    monkeypatch.setattr(ictrl.eval.generate, "build_backend", refuse)


CASES = {"count": 0}
OUTCOMES: list[tuple[int, str]] = []


def run_cli(argv: list[str], allow_load: bool = False) -> tuple[int, str]:
    """``ictrl.cli.main(argv)``'s status and stderr; a stand-in loader reached is status 0 (the checks passed)."""
    from ictrl.cli import main

    CASES["count"] += 1
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            status = main(argv)
        except ModelLoaded:
            assert allow_load, "the model loaded during the checks"
            status = 0
        except SystemExit as exc:  # argparse's usage errors
            status = exc.code if isinstance(exc.code, int) else 1
    return status, err.getvalue()


def assert_one_line_or_success(status: int, stderr: str, command: str, names: list[str]) -> None:
    """Success, or exit 2 with exactly one ``ictrl COMMAND: error:`` line that names one of ``names`` (the keys,
    flags or files the case set)."""
    OUTCOMES.append((status, stderr.strip().split("\n")[-1][:160] if stderr.strip() else ""))
    # "\n" only: a quoted key may hold U+0085 or U+2028, which str.splitlines would split at
    errors = [line for line in stderr.split("\n") if line.startswith(f"ictrl {command}: error:")]
    assert "Traceback" not in stderr, stderr[-3000:]
    if status == 0:
        assert not errors, stderr
        return
    assert status == 2, (status, stderr[-3000:])
    assert len(errors) == 1, stderr[-3000:]
    line = errors[0]
    assert any(name and (name in line or repr(name)[1:-1] in line) for name in names), (line, names)


# --- values and keys --------------------------------------------------------------------------------------------

ODD_TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=30)
# past float's range (10**400: float() raises OverflowError); "1" * 5000 below is past int()'s 4300 digits
HUGE = st.one_of(st.integers(min_value=-(10**400), max_value=10**400), st.sampled_from([10**400, -(10**400)]))
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(1 << 70), max_value=1 << 70), HUGE,
    st.floats(allow_nan=True, allow_infinity=True), ODD_TEXT,
    st.sampled_from(["1e-6", "-1", "0", "ict", "random", "all", "[1, 2]", "{a: 1}", "nan", ".inf", "null", "~",
                     "yes", "0x10", "1_000", "\u202e", "\x00", "🙂", "a" * 300, "1e400", "-1e400", "1" * 5000]))
PLAUSIBLE = st.one_of(st.integers(1, 8), st.floats(0.0, 1.0), st.booleans(), st.none())
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(ODD_TEXT, inner, max_size=3)), max_leaves=6)


def known_keys() -> list[str]:
    from ictrl.train_cli.run_config import owners

    return sorted(owners())


# the keys whose value sends a run elsewhere or loads something: fixed, so every case stays a config check
FIXED = {"model_name_or_path", "output_dir", "dataset_name", "push_to_hub", "hub_model_id", "resume_from_checkpoint",
         "report_to", "use_vllm", "vllm_mode", "reward_model_name_or_path", "deepspeed", "fsdp", "fsdp_config",
         "accelerator_config", "use_liger_kernel", "torch_compile", "eval_benchmarks", "eval_datasets",
         "reward_funcs", "token_selector", "chat_template_path", "logging_dir",
         "debug"}  # transformers' field shares its name with ictrl's --debug, which asks for the traceback


@st.composite
def configs(draw: Any, model: str, out: str) -> dict[str, Any]:
    keys = [k for k in known_keys() if k not in FIXED]
    cfg: dict[str, Any] = {"model_name_or_path": model, "output_dir": out, "dataset_name": "jsonl:train.jsonl",
                           "use_vllm": False, "report_to": "none"}
    for key in draw(st.lists(st.sampled_from(keys), max_size=4, unique=True)):
        cfg[key] = draw(st.one_of(PLAUSIBLE, PLAUSIBLE, VALUES))  # mostly values of a likely type, so some pass
    if draw(st.integers(0, 3)) == 0:
        cfg[draw(ODD_TEXT.filter(lambda k: k.strip() != ""))] = draw(VALUES)  # an unknown key
    return cfg


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    root = tmp_path_factory.mktemp("fuzz")
    rows = [{"question": f"What is {i}+1?", "answer": str(i + 1), "kind": "math"} for i in range(8)]
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


# --- properties -------------------------------------------------------------------------------------------------


@given(data=st.data())
def test_config_files_pass_or_are_one_line(data: Any, workdir: Path, tiny_model_dir: Path, no_model_load: None,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(workdir)
    cfg = data.draw(configs(str(tiny_model_dir), str(workdir / "out")))
    text = yaml.safe_dump(cfg, allow_unicode=data.draw(st.booleans()), sort_keys=False)
    if data.draw(st.integers(0, 3)) == 0:  # a key written twice, the second value last
        key = data.draw(st.sampled_from(sorted(cfg)))
        text += yaml.safe_dump({key: data.draw(VALUES)}, allow_unicode=True)
    path = workdir / "config.yaml"
    path.write_text(text, encoding="utf-8")
    assert_one_line_or_success(*run_cli(["train", str(path), "--print-config"]), "train",
                               [str(k) for k in cfg] + known_keys())  # a derived field counts (generation_batch_size)


@given(data=st.data())
def test_flags_pass_or_are_one_line(data: Any, workdir: Path, tiny_model_dir: Path, no_model_load: None,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(workdir)
    path = workdir / "base.yaml"
    path.write_text(yaml.safe_dump({"model_name_or_path": str(tiny_model_dir), "output_dir": str(workdir / "o"),
                                    "dataset_name": "jsonl:train.jsonl", "use_vllm": False}))
    flags = []
    for _ in range(data.draw(st.integers(1, 3))):
        key = data.draw(st.one_of(st.sampled_from([k for k in known_keys() if k not in FIXED]), ODD_TEXT))
        value = data.draw(st.one_of(ODD_TEXT, SCALARS.map(lambda v: yaml.safe_dump(v).strip().removesuffix("..."))))
        flags.append(data.draw(st.sampled_from([f"--{key}={value}", f"--{key}"])))
        if flags[-1] == f"--{key}":
            flags.append(value)
    assert_one_line_or_success(*run_cli(["train", str(path), *flags, "--print-config"]), "train",
                               [name for f in flags if f.startswith("--")  # the parser reads "-" in a key as "_"
                                for name in (f.split("=")[0], "--" + f.split("=")[0][2:].replace("-", "_"),
                                             repr(f.split("=")[0][2:]))]
                               + ["'--"])


# invisible format characters (Unicode Cf) a gold or question pasted from a web page carries
INVISIBLE = st.sampled_from(["\u200b", "\ufeff", "\u200e", "\u00ad", "\u200c", "\u2060", "\u2061", "\u202e",
                             "\U000e0041"])
WITH_INVISIBLE = st.tuples(ODD_TEXT, st.one_of(INVISIBLE, st.just("\u00a0")), ODD_TEXT).map("".join)


# levels of nesting: Python's parser reads about 1000, datasets' json builder fails past ~900 and crashes past ~10k
DEEP = st.sampled_from([200_000, 5000, 1100, 900, 10])
ROW_VALUES = st.one_of(SCALARS, st.lists(SCALARS, max_size=3), st.dictionaries(ODD_TEXT, SCALARS, max_size=2),
                       st.text(min_size=2000, max_size=5000), WITH_INVISIBLE)
ROW_KEYS = st.sampled_from(["question", "problem", "prompt", "answer", "solution", "kind", "id", "choices", "level",
                            "type", "messages", "extra"])


@given(data=st.data())
def test_data_rows_load_or_are_one_line(data: Any, workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The loader ``ictrl train`` reads its rows with (before the model loads): rows of any shape, or bytes that
    are not UTF-8 or not JSON, load or raise one UserError."""
    from ictrl import data as ictrl_data
    from ictrl.errors import UserError, one_line

    CASES["count"] += 1
    rows = data.draw(st.lists(st.dictionaries(ROW_KEYS, ROW_VALUES, max_size=5), min_size=0, max_size=6))
    lines = [json.dumps(r, ensure_ascii=data.draw(st.booleans()), allow_nan=True).encode() for r in rows]
    if data.draw(st.integers(0, 3)) == 0:  # a row nested deep, in any field
        depth = data.draw(DEEP)
        lines.insert(data.draw(st.integers(0, len(lines))), b'{"question": "q", "answer": "1", "%s": %s}' % (
            data.draw(ROW_KEYS).encode(), b"[" * depth + b"1" + b"]" * depth))
    if data.draw(st.booleans()):
        lines.insert(data.draw(st.integers(0, len(lines))), data.draw(st.sampled_from(
            [b"\xff\xfe not utf-8", b"{not json", b"[1, 2]", b"null", b"", b"\"text\"", b"{\"question\": NaN}",
             b"\xef\xbb\xbf{\"question\": \"q\", \"answer\": \"1\"}", b"{\"question\": \"q\"} trailing",
             b"{\"question\": \"q\\ud800\", \"answer\": \"1\"}", b"{\"question\": \"q\", \"answer\": \"\\udfff\"}",
             "{\"question\": \"a\u2028b\u0085c\", \"answer\": \"1\"}".encode(),
             b"{\"question\": \"q\", \"answer\": Infinity}", b"{\"question\": \"q\", \"answer\": \"$ $\"}",
             b"{\"question\": \"q\", \"answer\": 1e400}", b"{\"question\": \"q\", \"answer\": " + b"9" * 5000 + b"}",
             b"{\"question\": \"q\", \"answer\": " + b"9" * 401 + b"}"])))
    path = workdir / f"rows-{CASES['count']}.jsonl"
    end = data.draw(st.sampled_from([b"\n", b"\r\n"]))
    bom = b"\xef\xbb\xbf" if data.draw(st.integers(0, 3)) == 0 else b""
    path.write_bytes(bom + end.join(lines) + (end if data.draw(st.booleans()) else b""))
    try:
        ictrl_data.to_trl_dataset(f"jsonl:{path}")
    except UserError as exc:
        message = one_line(exc)
        assert "\n" not in message and str(path.name) in message, message
    finally:
        path.unlink()


@given(data=st.data())
def test_eval_arguments_pass_or_are_one_line(data: Any, workdir: Path, tiny_model_dir: Path, no_model_load: None,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    workdir = workdir / "eval"  # no config.yaml beside a --model path: eval reads a training run's labels there
    workdir.mkdir(exist_ok=True)
    (workdir / "train.jsonl").write_text((workdir.parent / "train.jsonl").read_text())
    monkeypatch.chdir(workdir)
    (workdir / "a-file").write_text("x")
    argv = ["eval", "--model", data.draw(st.sampled_from([str(tiny_model_dir), str(workdir / "missing"), "a-file"]))]
    options = {
        "--benchmarks": st.sampled_from(["gsm8k", "math500", "gsm8k,math500", "nope", "jsonl:train.jsonl", ""]),
        "--n": st.integers(-2, 9).map(str), "--k": st.sampled_from(["1", "1,4", "0", "-1", "x", "9"]),
        "--limit": st.integers(-1, 3).map(str), "--max-new-tokens": st.integers(-1, 5000).map(str),
        "--temperature": st.floats(allow_nan=True, allow_infinity=True).map(str),
        "--top-p": st.floats(-1, 2).map(str), "--seeds": st.integers(-1, 3).map(str),
        "--seed-start": st.integers(-2, 2).map(str), "--chunk-size": st.integers(-1, 4).map(str),
        "--batch-size": st.integers(-1, 4).map(str), "--n-bootstrap": st.integers(-1, 10).map(str),
        "--dtype": st.sampled_from(["auto", "float32", "int8", "🙂"]),
        "--output-dir": st.sampled_from(["out", "a-file", "a-file/under", "new/deeper"]),
        "--data-root": st.sampled_from([".", "missing-root", "a-file"]), "--method": ODD_TEXT,
    }
    for flag in data.draw(st.lists(st.sampled_from(sorted(options)), max_size=5, unique=True)):
        argv += [flag, data.draw(options[flag])]
    status, stderr = run_cli(argv, allow_load=True)
    named = [a for a in argv[1:] if a.startswith("--")]
    assert_one_line_or_success(status, stderr, "eval", named + [a[2:].replace("-", "_") for a in named] + ["--k"])


# --- what a run reads and writes: reward modules, output paths, reruns ----------------------------------------

IMPORT_TIME = st.sampled_from(["", "import sys\nsys.exit(0)\n", "import sys\nsys.exit(3)\n", "raise KeyError('k')\n",
                               "x = 1 / 0\n", "def broken(:\n", "import no_such_module_anywhere\n",
                               "raise SystemExit('bye')\n", "class Gone(BaseException):\n    pass\nraise Gone()\n"])
ATTRIBUTE = st.sampled_from(["def score(prompts=None, completions=None, **kw):\n    return [0.0] * len(completions)\n",
                             "score = 3\n", "score = 'text'\n", "score = None\n", "score = [1.0]\n", ""])


@FULL_CHECKS
@given(data=st.data())
def test_reward_modules_load_or_are_one_line(data: Any, workdir: Path, tiny_model_dir: Path, no_model_load: None,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A generated reward module (exiting or raising at import, a syntax error, a name that is not a function or
    is missing) is named in one line before the model loads, or reaches the model load."""
    monkeypatch.chdir(workdir)
    monkeypatch.syspath_prepend(str(workdir))
    name = f"fuzz_reward_{CASES['count']}"
    (workdir / f"{name}.py").write_text(data.draw(st.one_of(st.just(""), IMPORT_TIME)) + data.draw(ATTRIBUTE))
    path = workdir / "reward.yaml"
    path.write_text(yaml.safe_dump({**configs_base(tiny_model_dir, workdir / "out-reward"),
                                    "reward_funcs": [f"{name}:score"]}))
    status, stderr = run_cli(["train", str(path)], allow_load=True)
    assert_one_line_or_success(status, stderr, "train", [f"{name}:score"])
    if status == 0:  # only a module that imports and holds a function passes
        assert callable(getattr(__import__(name), "score", None))


@given(data=st.data())
def test_reward_calls_are_checked_or_one_error(data: Any) -> None:
    """Whatever a reward returns or raises when called (sys.exit, any BaseException, a wrong value) is a list TRL
    takes or one RewardError naming it; Ctrl-C stays Ctrl-C."""
    from ictrl.errors import one_line
    from ictrl.engine.reward_policy import RewardError, RewardPolicy

    CASES["count"] += 1
    from decimal import Decimal
    from fractions import Fraction

    huge = st.sampled_from([10**400, -(10**400), 10**5000, Fraction(10**400, 3), Decimal("1e400"), 2**1024])
    outcome = data.draw(st.one_of(VALUES, st.lists(st.one_of(PLAUSIBLE, SCALARS, huge), min_size=0, max_size=5),
                                  st.sampled_from([SystemExit(0), SystemExit(2), SystemExit("x"), GeneratorExit(),
                                                   ValueError("bad"), RecursionError(), MemoryError()])))

    def score(prompts: Any = None, completions: Any = None, **kw: Any) -> Any:
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    wrapped = RewardPolicy(timeout=data.draw(st.sampled_from([None, 30.0])), step=lambda: 1).wrap(score)
    try:
        out = wrapped(prompts=["p"] * 3, completions=["c"] * 3)
    except RewardError as exc:
        assert "\n" not in one_line(exc) and "'score'" in str(exc)
    else:
        assert isinstance(out, list) and len(out) == 3


def configs_base(model: Path, out: Path, **keys: Any) -> dict[str, Any]:
    """A run that passes every check (the stand-in loader ends it at the model load)."""
    return {"model_name_or_path": str(model), "output_dir": str(out), "dataset_name": "jsonl:train.jsonl",
            "use_vllm": False, "report_to": "none", "prompts_per_step": 2, "num_generations": 4,
            "per_device_train_batch_size": 8, "max_completion_length": 8, "max_prompt_length": None,
            "learning_rate": 1e-3, **keys}


# where output_dir points: the model, a data file's folder, the config's folder, an earlier run, or somewhere new
PLACES = ["new", "model", "model/sub", "data-as-metrics", "config-dir", "finished", "finished-with-checkpoint",
          "record-only", "data-beside"]


@FULL_CHECKS
@given(place=st.sampled_from(PLACES), flags=st.lists(st.sampled_from(["--overwrite", "--resume", "--resume=auto"]),
                                                     max_size=2, unique=True))
def test_output_paths_never_replace_what_the_run_reads_or_an_earlier_run(
        place: str, flags: list[str], workdir: Path, tiny_model_dir: Path, no_model_load: None,
        tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every output_dir aliasing the model, a data file or the config, and every rerun into an earlier run's folder,
    is refused in one line, unless nothing the run reads is replaced and an earlier run is continued (--resume
    with a checkpoint) or replaced by name (--overwrite)."""
    if "--resume" in flags and "--resume=auto" in flags:
        flags.remove("--resume")
    root = tmp_path_factory.mktemp("alias")
    monkeypatch.chdir(root)
    (root / "train.jsonl").write_text((workdir / "train.jsonl").read_text())
    model = root / "model"
    if place.startswith("model"):
        import shutil

        shutil.copytree(tiny_model_dir, model)
    out = {"new": root / "out", "model": model, "model/sub": model / "sub", "config-dir": root / "cfgdir",
           "data-as-metrics": root / "out", "data-beside": root / "out"}.get(place, root / "out")
    keys: dict[str, Any] = {}
    if place in ("data-as-metrics", "data-beside"):
        out.mkdir()
        target = out / ("metrics.jsonl" if place == "data-as-metrics" else "rows.jsonl")
        target.write_text((workdir / "train.jsonl").read_text())
        keys["dataset_name"] = f"jsonl:{target}"
    earlier = place.startswith(("finished", "record"))
    if earlier:
        out.mkdir()
        (out / "run.json").write_text('{"method": "ict", "method_from": "file", "seed": 0}')  # ictrl train's record
        (out / "metrics.jsonl").write_text('{"step": 1}\n')
        if place != "record-only":
            (out / "model.safetensors").write_text("weights")
            (out / "manifest.json").write_text("{}")
        if place == "finished-with-checkpoint":
            (out / "checkpoint-1").mkdir()
            (out / "checkpoint-1" / "trainer_state.json").write_text('{"global_step": 1}')
    cfg = root / ("cfgdir" if place == "config-dir" else ".") / "config.yaml"
    cfg.parent.mkdir(exist_ok=True)
    cfg.write_text(yaml.safe_dump(configs_base(model if place.startswith("model") else tiny_model_dir, out,
                                              **keys)))
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} if out.is_dir() else {}
    status, stderr = run_cli(["train", str(cfg), *flags], allow_load=True)
    assert_one_line_or_success(status, stderr, "train", ["output_dir", "--resume", str(out)])
    replaces_input = place in ("model", "data-as-metrics", "config-dir")
    continued = place == "finished-with-checkpoint" and any(f.startswith("--resume") for f in flags)
    replaced_by_name = "--overwrite" in flags and place != "finished-with-checkpoint"
    requeued = place == "record-only" and "--resume=auto" in flags
    if status == 0:
        assert not replaces_input, place
        assert not earlier or continued or replaced_by_name or requeued, (place, flags)
    if status != 0 or not (replaced_by_name or continued):  # nothing of the earlier run changed
        assert all(p.read_bytes() == data for p, data in before.items()), place


LINE_TEXT = st.text(alphabet=st.one_of(st.characters(codec="utf-8", exclude_categories=("Cs",)),
                                       st.sampled_from(["\u2028", "\u2029", "\u0085", "\x0b", "\x0c", "\x1c", "\r"])),
                    max_size=20)


@given(data=st.data())
def test_json_lines_read_every_row_as_written(data: Any, workdir: Path) -> None:
    """Rows whose strings hold U+2028, U+0085 and the other characters ``str.splitlines`` splits at, in a file
    with LF or CRLF endings and maybe a BOM, load as exactly those rows: none split, none lost."""
    from ictrl import data as ictrl_data

    CASES["count"] += 1
    questions = ["q" + data.draw(LINE_TEXT) for _ in range(data.draw(st.integers(1, 4)))]
    lines = [json.dumps({"question": q, "answer": str(i)}, ensure_ascii=data.draw(st.booleans())).encode()
             for i, q in enumerate(questions)]
    end = data.draw(st.sampled_from([b"\n", b"\r\n"]))
    path = workdir / f"lines-{CASES['count']}.jsonl"
    path.write_bytes((b"\xef\xbb\xbf" if data.draw(st.booleans()) else b"") + end.join(lines) + end)
    try:
        problems = ictrl_data.load_problems(f"jsonl:{path}")
    finally:
        path.unlink()
    assert [p.question for p in problems] == questions and [p.gold for p in problems] == [
        str(i) for i in range(len(questions))]


@given(rate=st.sampled_from(["0", "0.0", "-0.0", "0e5", "5e-324", "1e-300", "1e300", "1e309", "inf", "nan", "-1e-9",
                             "2e-6"]), no_op=st.booleans())
def test_extreme_learning_rates_pass_or_are_one_line(rate: str, no_op: bool, workdir: Path, tiny_model_dir: Path,
                                                     no_model_load: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every learning rate is a run or one line naming learning_rate; 0 only with --allow-no-op (no silent
    no-op)."""
    monkeypatch.chdir(workdir)
    path = workdir / "lr.yaml"
    path.write_text(yaml.safe_dump(configs_base(tiny_model_dir, workdir / "out-lr")))
    argv = ["train", str(path), f"--learning_rate={rate}", "--print-config", *(["--allow-no-op"] if no_op else [])]
    status, stderr = run_cli(argv)
    assert_one_line_or_success(status, stderr, "train", ["learning_rate"])
    value = float(rate)
    if status == 0:
        assert value > 0 and value != float("inf") or value == 0 and no_op, (rate, no_op)
    if value == 0 and not no_op:
        assert status == 2 and "0 trains nothing" in stderr


# --- what a reward does to its inputs, damaged model folders ----------------------------------------------------

MUTATIONS = st.sampled_from(["clear", "append", "replace", "delete", "reverse", "edit-message", "rebind-column"])


@given(data=st.data())
def test_a_reward_that_mutates_its_inputs_changes_nothing_outside_its_call(data: Any) -> None:
    """Whatever a reward does to its lists (clears, appends, replaces or deletes items, reverses, edits a message
    dict inside a completion), the batch TRL holds is unchanged after the call, the next reward sees it as it was,
    and the first reward's result is checked against TRL's count."""
    from ictrl.engine.reward_policy import RewardPolicy

    CASES["count"] += 1
    n = data.draw(st.integers(1, 6))
    conversational = data.draw(st.booleans())
    batch: dict[str, Any] = {
        "prompts": [[{"role": "user", "content": f"q{i}"}] if conversational else f"q{i}" for i in range(n)],
        "completions": [[{"role": "assistant", "content": f"c{i}"}] if conversational else f"c{i}" for i in range(n)],
        "completion_ids": [[i, i + 1] for i in range(n)], "answer": [str(i) for i in range(n)],
        "meta": [{"level": i, "tags": ["a"]} for i in range(n)]}
    before = repr(batch)
    plan = data.draw(st.lists(st.tuples(st.sampled_from(sorted(batch)), MUTATIONS), min_size=1, max_size=5))

    def vandal(**kw: Any) -> list[float]:
        for key, how in plan:
            column = kw[key]
            if how == "clear":
                column.clear()
            elif how == "append":
                column.append("x")
            elif how == "replace" and column:
                column[0] = "\\boxed{0}"
            elif how == "delete" and column:
                del column[-1]
            elif how == "reverse":
                column.reverse()
            elif how == "edit-message" and column and isinstance(column[0], (list, dict)):
                inner = column[0]  # a message dict inside a turn list, a metadata dict, or a list of ids
                (inner[0] if isinstance(inner, list) and inner and isinstance(inner[0], dict) else inner).clear()
            elif how == "rebind-column":
                kw[key] = []
        return [0.0] * n

    seen: list[str] = []
    policy = RewardPolicy(timeout=data.draw(st.sampled_from([None, 30.0])), step=lambda: 1)
    assert policy.wrap(vandal)(**batch) == [0.0] * n
    policy.wrap(lambda **kw: seen.append(repr(kw)) or [1.0] * n)(**batch)
    assert repr(batch) == before and seen == [before]


# what a copy cut short, a link to another file or a hand edit leaves in the JSON files transformers reads
JSON_FILES = ["config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json",
              "special_tokens_map.json"]
DAMAGES = st.sampled_from(["tokenizer.json", "tokenizer.json+tokenizer_config.json", "vocab_size", "auto_map",
                           "bigger-tokenizer", *[f"{how}:{name}" for how in ("torn", "link", "list", "deep", "not-utf8")
                                                 for name in JSON_FILES]])


@FULL_CHECKS
@given(damage=DAMAGES, command=st.sampled_from(["train", "eval"]), data=st.data())
def test_damaged_model_folders_are_one_line_before_the_model_loads(damage: str, command: str, data: Any,
                                                                    workdir: Path, tiny_model_dir: Path,
                                                                    no_model_load: None,
                                                                    tmp_path_factory: pytest.TempPathFactory,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A model folder that would load as something else (its tokenizer files gone, a vocab_size its weights do not
    have, custom code without trust_remote_code, a tokenizer with ids past the model's rows) or not at all (a JSON
    file transformers reads torn, a link to a data file, a list, nested past the parser, not UTF-8) is one line
    naming the folder, exit 2, before the weights load, in ``ictrl train`` and ``ictrl eval``."""
    import shutil

    from ictrl.models import build_byte_tokenizer

    root = tmp_path_factory.mktemp("damaged")
    model = root / "model"
    shutil.copytree(tiny_model_dir, model)
    config = json.loads((model / "config.json").read_text())
    if ":" in damage:
        how, name = damage.split(":")
        target = model / name
        text = target.read_bytes().rstrip() if target.is_file() else b"{}"
        target.unlink(missing_ok=True)
        if how == "torn":  # cut inside the JSON, not only its last newline
            target.write_bytes(text[: data.draw(st.integers(0, len(text) - 1))])
        elif how == "link":  # to a file that is not the model's: a data file's rows
            target.symlink_to(workdir / "train.jsonl")
        elif how == "list":
            target.write_text("[]")
        elif how == "deep":
            target.write_text("[" * 200_000 + "]" * 200_000)
        else:
            target.write_bytes(b"{\"a\": \"\xff\"}")
        config = json.loads((model / "config.json").read_text()) if name != "config.json" else None
    elif damage.startswith("tokenizer"):
        for name in damage.split("+"):
            (model / name).unlink()
    elif damage == "vocab_size":
        config["vocab_size"] = data.draw(st.integers(1, 100_000).filter(lambda v: v != 259))
    elif damage == "auto_map":
        config["model_type"] = "custom_" + data.draw(st.text("abcxyz", min_size=1, max_size=8))
        config["auto_map"] = {"AutoConfig": "modeling.Cfg", "AutoModelForCausalLM": "modeling.Model"}
        (model / "modeling.py").write_text("raise SystemExit('the folder's code ran')\n")
    else:
        tokenizer = build_byte_tokenizer()
        tokenizer.add_tokens([f"<extra{i}>" for i in range(data.draw(st.integers(1, 40)))])
        tokenizer.save_pretrained(model)
    if config is not None:
        (model / "config.json").write_text(json.dumps(config))
    monkeypatch.chdir(workdir)
    if command == "train":
        path = root / "run.yaml"
        path.write_text(yaml.safe_dump(configs_base(model, root / "out")))
        status, stderr = run_cli(["train", str(path)], allow_load=True)
    else:
        status, stderr = run_cli(["eval", "--model", str(model), "--benchmarks", "jsonl:train.jsonl", "--n", "1",
                                  "--k", "1", "--limit", "1"], allow_load=True)
    assert_one_line_or_success(status, stderr, command, [str(model)])
    assert status == 2 or damage == "bigger-tokenizer" and command == "train", (damage, command, stderr[-2000:])


# --- datasets: mixtures and globs, invisible characters in golds ------------------------------------------------

# paths under the working directory (for a builder such as json) and under the folder (for path: data)
ENTRY_FILES = st.sampled_from(["data/*.jsonl", "data/train.jsonl", "data/*.csv", "nomatch/*.jsonl", "data/**",
                               "missing.jsonl", "data/deep.jsonl", "data/d*.jsonl", "deep.jsonl", "*.jsonl",
                               ["data/train.jsonl", "data/*.parquet"], {"train": "data/t*.jsonl"},
                               {"train": "data/none*.jsonl"}, {"train": ["train.jsonl", "deep.jsonl"]}])


@FULL_CHECKS
@given(data=st.data())
def test_datasets_mixtures_and_globs_load_or_are_one_line(data: Any, workdir: Path, tiny_model_dir: Path,
                                                          no_model_load: None,
                                                          tmp_path_factory: pytest.TempPathFactory,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """TRL's ``datasets:`` mixture: entries naming a builder or a local folder, with data_files that are files,
    globs that match or match nothing, split mappings, a row nested past the parser, fractions and columns. Each
    run reaches the model load or is one line, exit 2 (datasets stops on an unmatched glob with a bare
    StopIteration, and crashes on a deep row)."""
    root = tmp_path_factory.mktemp("mixture")
    monkeypatch.chdir(root)
    (root / "data").mkdir()
    rows = [{"prompt": f"{i}+1=", "solution": str(i + 1)} for i in range(6)]
    (root / "data" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    depth = data.draw(DEEP)
    (root / "data" / "deep.jsonl").write_text(json.dumps(rows[0]) + "\n" + '{"prompt": "p", "x": %s}\n' % (
        "[" * depth + "]" * depth))
    entries = []
    for _ in range(data.draw(st.integers(1, 3))):
        entry: dict[str, Any] = {"path": data.draw(st.sampled_from(["json", "json", "csv", "data", "no/such/dir"]))}
        if data.draw(st.integers(0, 4)):
            entry["data_files"] = data.draw(ENTRY_FILES)
        if data.draw(st.booleans()):
            entry["columns"] = data.draw(st.sampled_from([["prompt"], ["prompt", "solution"], ["nope"]]))
        if data.draw(st.integers(0, 3)) == 0:
            entry["fraction"] = data.draw(st.sampled_from([0.5, 1.0, 0.0, 2.0]))
        entries.append(entry)
    path = root / "mix.yaml"
    path.write_text(yaml.safe_dump({**configs_base(tiny_model_dir, root / "out"), "datasets": entries,
                                    "dataset_name": None}))
    status, stderr = run_cli(["train", str(path)], allow_load=True)
    assert_one_line_or_success(status, stderr, "train", ["datasets", "dataset_name", "prompt", "reward"])


ANSWERS = st.one_of(st.integers(-10**6, 10**6).map(str), st.sampled_from(
    ["\\frac{1}{2}", "x^2+1", "3\\sqrt{2}", "(1, 2)", "10^{400}", "0.125", "-7", "\\pi", "1,000"]))


@given(answer=ANSWERS, other=ANSWERS, where=st.lists(st.tuples(st.integers(0, 12), INVISIBLE), min_size=1,
                                                      max_size=3), boxed=st.booleans())
def test_invisible_characters_in_a_gold_never_change_its_grade(answer: str, other: str,
                                                              where: list[tuple[int, str]], boxed: bool) -> None:
    """A gold with format characters (and NBSP) anywhere grades every answer as the clean gold does."""
    from ictrl.rewards import gsm8k_reward, math_reward

    CASES["count"] += 1
    gold = answer
    for at, char in where:
        gold = gold[:at] + char + gold[at:]
    for completion in (f"so \\boxed{{{answer}}}", f"so \\boxed{{{other}}}", f"The answer is {answer}"):
        assert math_reward(completion, gold) == math_reward(completion, answer), (completion, gold)
    if answer.lstrip("-").isdigit():
        assert gsm8k_reward(f"{answer} apples", f"#### {gold}") == 1.0
