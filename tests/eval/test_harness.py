import json
import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import pytest

from ictrl.eval.harness import RESULTS_JSON, RESULTS_MD, SAMPLES_FILE, EvalConfig, EvalTask, ResumeMismatchError, evaluate
from ictrl.eval.passk import bootstrap_ci


@dataclass
class FakeProblem:
    id: str
    question: str
    gold: str


def exact_reward(completion: str, gold: str) -> float:
    return 1.0 if completion.strip() == f"answer {gold}" else 0.0


def extract(completion: str) -> str | None:
    return completion.split()[-1] if completion else None


def make_task(name: str, num: int) -> EvalTask:
    problems = [FakeProblem(id=f"{name}-{i}", question=f"q{i}", gold=str(i)) for i in range(num)]
    return EvalTask(name, problems, prompt_fn=lambda p: f"[{p.id}] {p.question}", reward_fn=exact_reward, extract_fn=extract)


@dataclass
class ScriptedBackend:
    """Returns, for prompt `[id] ...`, `correct[id]` right answers then wrong ones; counts what it is asked."""

    correct: dict[str, int]
    golds: dict[str, str]
    calls: int = 0
    prompts_seen: list[str] = field(default_factory=list)

    def generate(self, prompts: Sequence[str], n: int, max_new_tokens: int, temperature: float, top_p: float, seed: int) -> list[list[str]]:
        self.calls += 1
        self.prompts_seen.extend(prompts)
        out = []
        for p in prompts:
            pid = p[1 : p.index("]")]
            c = self.correct[pid]
            out.append([f"answer {self.golds[pid]}"] * c + ["answer wrong"] * (n - c))
        return out


@dataclass
class SeededBackend:
    """Each completion is right with probability 1/2, drawn from (prompt, seed): deterministic, seed-dependent."""

    crash_after_calls: int | None = None
    calls: int = 0
    prompts_seen: list[str] = field(default_factory=list)

    def generate(self, prompts: Sequence[str], n: int, max_new_tokens: int, temperature: float, top_p: float, seed: int) -> list[list[str]]:
        if self.crash_after_calls is not None and self.calls >= self.crash_after_calls:
            raise RuntimeError("simulated crash")
        self.calls += 1
        self.prompts_seen.extend(prompts)
        out = []
        for p in prompts:
            rng = random.Random(f"{p}|{seed}")
            gold = p[1 : p.index("]")].rsplit("-", 1)[1]
            out.append([f"answer {gold}" if rng.random() < 0.5 else f"answer x{rng.random():.3f}" for _ in range(n)])
        return out


def comb_pass(n: int, c: int, k: int) -> float:
    return float(1 - Fraction(math.comb(n - c, k), math.comb(n, k)))


def config(**kw: object) -> EvalConfig:
    base = dict(model="fake", n=4, ks=(1, 4), max_new_tokens=8, temperature=0.6, top_p=0.95, chunk_size=2, n_bootstrap=200)
    base.update(kw)
    return EvalConfig(**base)  # type: ignore[arg-type]


def test_pass_at_k_average_and_total_match_hand_computation(tmp_path: Path) -> None:
    a, b = make_task("alpha", 4), make_task("beta", 2)
    correct = {"alpha-0": 0, "alpha-1": 1, "alpha-2": 2, "alpha-3": 4, "beta-0": 1, "beta-1": 3}
    golds = {p.id: p.gold for t in (a, b) for p in t.problems}
    result = evaluate([a, b], ScriptedBackend(correct, golds), config(), output_dir=tmp_path, progress=False)
    s = result.summary
    # alpha: P@1 = (0 + 1/4 + 2/4 + 1) / 4 = 0.4375; P@4 = (0 + 1 + 1 + 1) / 4 = 0.75
    assert s["benchmarks"]["alpha"]["pass_at_k"]["1"]["mean"] == pytest.approx(0.4375)
    assert s["benchmarks"]["alpha"]["pass_at_k"]["4"]["mean"] == pytest.approx(0.75)
    # beta: P@1 = (1/4 + 3/4) / 2 = 0.5; P@4 = 1
    assert s["benchmarks"]["beta"]["pass_at_k"]["1"]["mean"] == pytest.approx(0.5)
    assert s["benchmarks"]["beta"]["pass_at_k"]["4"]["mean"] == pytest.approx(1.0)
    assert s["average"]["pass_at_k"]["1"]["mean"] == pytest.approx(0.46875)
    assert s["average"]["pass_at_k"]["4"]["mean"] == pytest.approx(0.875)
    assert s["total"]["mean"] == pytest.approx((0.46875 + 0.875) / 2)
    assert s["total"]["std"] is None  # one seed: no spread

    saved = json.loads((tmp_path / RESULTS_JSON).read_text())
    assert saved["summary"]["total"]["mean"] == pytest.approx(0.671875)
    assert len(saved["records"]) == 6
    rec = next(r for r in saved["records"] if r["problem_id"] == "alpha-2")
    assert rec["prompt"] == "[alpha-2] q2" and rec["num_correct"] == 2 and len(rec["samples"]) == 4
    assert [smp["reward"] for smp in rec["samples"]] == [1.0, 1.0, 0.0, 0.0]
    assert [smp["extracted"] for smp in rec["samples"]] == ["2", "2", "wrong", "wrong"]
    assert rec["pass_at_k"]["1"] == pytest.approx(0.5)
    table = (tmp_path / RESULTS_MD).read_text()
    assert table == result.markdown
    assert "| alpha | 4 | 43.75 " in table and "| **Avg** | 6 | 46.88 " in table and "| 67.19 " in table


def test_rerun_skips_finished_and_extends_to_new_problems(tmp_path: Path) -> None:
    first = SeededBackend()
    r1 = evaluate([make_task("alpha", 5)], first, config(), output_dir=tmp_path, progress=False)
    assert first.calls == 3 and len(first.prompts_seen) == 5  # chunks of 2, 2, 1
    again = SeededBackend()
    r2 = evaluate([make_task("alpha", 5)], again, config(), output_dir=tmp_path, progress=False)
    assert again.calls == 0
    assert r2.summary == r1.summary
    more = SeededBackend()
    evaluate([make_task("alpha", 7)], more, config(), output_dir=tmp_path, progress=False)
    # the block of alpha-4 and alpha-5 is drawn whole (alpha-5 gets a 7-problem run's samples); alpha-4 is kept
    assert more.prompts_seen == ["[alpha-4] q4", "[alpha-5] q5", "[alpha-6] q6"]
    lines = (tmp_path / SAMPLES_FILE).read_text().splitlines()
    assert len(lines) == 7


def test_crash_mid_run_loses_no_finished_problem(tmp_path: Path) -> None:
    tasks = [make_task("alpha", 5), make_task("beta", 3)]
    crashing = SeededBackend(crash_after_calls=4)  # alpha takes 3 calls, beta's first call succeeds
    with pytest.raises(RuntimeError, match="simulated crash"):
        evaluate(tasks, crashing, config(), output_dir=tmp_path / "run", progress=False)
    done = [json.loads(line)["problem_id"] for line in (tmp_path / "run" / SAMPLES_FILE).read_text().splitlines()]
    assert done == [f"alpha-{i}" for i in range(5)] + ["beta-0", "beta-1"]

    resumed = SeededBackend()
    result = evaluate(tasks, resumed, config(), output_dir=tmp_path / "run", progress=False)
    assert resumed.prompts_seen == ["[beta-2] q2"]
    # per-block seeds: the resumed run holds exactly the samples an uninterrupted run draws
    clean = evaluate(tasks, SeededBackend(), config(), output_dir=tmp_path / "clean", progress=False)
    assert result.records == clean.records
    assert result.summary == clean.summary


def test_torn_last_line_is_repaired_and_redone(tmp_path: Path) -> None:
    task = make_task("alpha", 3)
    evaluate([task], SeededBackend(), config(), output_dir=tmp_path, progress=False)
    path = tmp_path / SAMPLES_FILE
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:2]) + lines[2][:25])  # crash while writing the third record
    redo = SeededBackend()
    evaluate([task], redo, config(), output_dir=tmp_path, progress=False)
    assert redo.prompts_seen == ["[alpha-2] q2"]
    assert [json.loads(x)["problem_id"] for x in path.read_text().splitlines()] == ["alpha-0", "alpha-1", "alpha-2"]


def test_record_missing_its_newline_is_kept_and_the_next_append_starts_a_line(tmp_path: Path) -> None:
    evaluate([make_task("alpha", 2)], SeededBackend(), config(), output_dir=tmp_path, progress=False)
    path = tmp_path / SAMPLES_FILE
    path.write_text(path.read_text().rstrip("\n"))  # crash after the JSON, before its newline
    redo = SeededBackend()
    evaluate([make_task("alpha", 4)], redo, config(), output_dir=tmp_path, progress=False)
    assert redo.prompts_seen == ["[alpha-2] q2", "[alpha-3] q3"]
    assert [json.loads(x)["problem_id"] for x in path.read_text().splitlines()] == [f"alpha-{i}" for i in range(4)]


def test_corrupt_line_in_the_middle_is_an_error(tmp_path: Path) -> None:
    task = make_task("alpha", 3)
    evaluate([task], SeededBackend(), config(), output_dir=tmp_path, progress=False)
    path = tmp_path / SAMPLES_FILE
    lines = path.read_text().splitlines(keepends=True)
    path.write_text(lines[0] + "{not json\n" + lines[1])
    with pytest.raises(ValueError, match=f"{SAMPLES_FILE}:2"):
        evaluate([task], SeededBackend(), config(), output_dir=tmp_path, progress=False)


@pytest.mark.parametrize(("field_name", "value"), [("temperature", 1.0), ("n", 8), ("model", "other"), ("max_new_tokens", 16), ("top_p", 1.0),
                                                   ("chunk_size", 3)])
def test_resume_with_different_settings_names_the_field(tmp_path: Path, field_name: str, value: object) -> None:
    task = make_task("alpha", 2)
    evaluate([task], SeededBackend(), config(), output_dir=tmp_path, progress=False)
    with pytest.raises(ResumeMismatchError, match=rf"{field_name}: stored .* requested {value!r}"):
        evaluate([task], SeededBackend(), config(**{field_name: value}), output_dir=tmp_path, progress=False)


def test_resume_allows_new_ks_and_seeds(tmp_path: Path) -> None:
    task = make_task("alpha", 2)
    evaluate([task], SeededBackend(), config(), output_dir=tmp_path, progress=False)
    backend = SeededBackend()
    result = evaluate([task], backend, config(ks=(1, 2, 4), seeds=(0, 1)), output_dir=tmp_path, progress=False)
    assert len(backend.prompts_seen) == 2  # only seed 1 is new
    assert set(result.summary["benchmarks"]["alpha"]["pass_at_k"]) == {"1", "2", "4"}


def test_changed_prompt_is_a_mismatch(tmp_path: Path) -> None:
    task = make_task("alpha", 2)
    evaluate([task], SeededBackend(), config(), output_dir=tmp_path, progress=False)
    reworded = EvalTask("alpha", task.problems, prompt_fn=lambda p: f"[{p.id}] Solve: {p.question}", reward_fn=exact_reward)
    with pytest.raises(ResumeMismatchError, match="alpha problem alpha-0: the prompt differs"):
        evaluate([reworded], SeededBackend(), config(), output_dir=tmp_path, progress=False)


def test_several_seeds_report_mean_std_and_ci_against_reference(tmp_path: Path) -> None:
    tasks = [make_task("alpha", 6), make_task("beta", 4)]
    seeds = (0, 1, 2)
    result = evaluate(tasks, SeededBackend(), config(seeds=seeds), output_dir=tmp_path, progress=False)
    # reference: recount correct answers from the stored completions, then exact pass@k and statistics
    per = {(r["seed"], r["benchmark"], r["problem_id"]): r for r in result.records}
    assert len(per) == 3 * 10
    totals = []
    for seed in seeds:
        bench_means = {}
        for t in tasks:
            for k in (1, 4):
                vals = []
                for p in t.problems:
                    c = sum(s["completion"] == f"answer {p.gold}" for s in per[(seed, t.name, p.id)]["samples"])
                    vals.append(comb_pass(4, c, k))
                bench_means[(t.name, k)] = statistics.fmean(vals)
        avg1 = statistics.fmean(bench_means[(t.name, 1)] for t in tasks)
        avg4 = statistics.fmean(bench_means[(t.name, 4)] for t in tasks)
        totals.append((avg1 + avg4) / 2)
        assert result.summary["average"]["pass_at_k"]["1"]["per_seed"][seeds.index(seed)] == pytest.approx(avg1, abs=1e-12)
    total = result.summary["total"]
    assert total["mean"] == pytest.approx(statistics.fmean(totals), abs=1e-12)
    assert total["std"] == pytest.approx(statistics.stdev(totals), abs=1e-12)
    assert total["ci"][0] <= total["mean"] <= total["ci"][1]
    # the Total CI resamples problems within each benchmark, scoring each by its (P@1 + P@4) / 2 over seeds
    groups = [
        [statistics.fmean(r["pass_at_k"][k] for s in seeds for k in ("1", "4") for r in [per[(s, t.name, p.id)]]) for p in t.problems]
        for t in tasks
    ]
    assert total["ci"] == pytest.approx(list(bootstrap_ci(groups, n_boot=200, ci=0.95, seed=0)), abs=1e-12)
    assert len(set(totals)) > 1  # seeds really change the samples
    assert " ± " in result.markdown and "over 3 seeds" in result.markdown


def test_in_memory_run_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = evaluate([make_task("alpha", 3)], SeededBackend(), config(), output_dir=None, progress=False)
    assert len(result.records) == 3 and list(tmp_path.iterdir()) == []


def test_bad_inputs_raise() -> None:
    task = make_task("alpha", 2)

    class Short:
        def generate(self, prompts: Sequence[str], n: int, *args: object) -> list[list[str]]:
            return [["answer 0"] * (n - 1) for _ in prompts]

    with pytest.raises(ValueError, match="expected 4 per prompt"):
        evaluate([task], Short(), config(), progress=False)
    dup = EvalTask("alpha", [FakeProblem("x", "q", "1"), FakeProblem("x", "q", "1")], lambda p: p.question, exact_reward)
    with pytest.raises(ValueError, match="problem id 'x' appears more than once"):
        evaluate([dup], SeededBackend(), config(), progress=False)
    with pytest.raises(ValueError, match="task names must be distinct"):
        evaluate([task, task], SeededBackend(), config(), progress=False)
    with pytest.raises(ValueError, match="needs n >= 4"):
        config(n=2)
    # the sampling settings are checked where they are built (a backend takes them as they come)
    for bad, word in (({"top_p": 0.0}, "top_p"), ({"n": 0}, "n must"), ({"temperature": -1.0}, "temperature"),
                      ({"max_new_tokens": 0}, "max_new_tokens")):
        with pytest.raises(ValueError, match=word):
            config(**bad)


@dataclass
class RecordingBackend:
    """Answers wrong; records the generation settings of every call."""

    calls: list[tuple[int, int, float, float]] = field(default_factory=list)

    def generate(self, prompts: Sequence[str], n: int, max_new_tokens: int, temperature: float, top_p: float, seed: int) -> list[list[str]]:
        self.calls.append((len(prompts), max_new_tokens, temperature, top_p))
        return [["answer wrong"] * n for _ in prompts]


def with_generation(task: EvalTask, **gen: object) -> EvalTask:
    return EvalTask(task.name, task.problems, task.prompt_fn, task.reward_fn, task.extract_fn, **gen)  # type: ignore[arg-type]


def test_per_task_generation_defaults_and_overrides(tmp_path: Path) -> None:
    long = with_generation(make_task("long", 2), max_new_tokens=4096, temperature=0.6, top_p=0.95)
    short = with_generation(make_task("short", 2), max_new_tokens=1024, temperature=1.0, top_p=1.0)
    unset = config(max_new_tokens=None, temperature=None, top_p=None)
    backend = RecordingBackend()
    result = evaluate([long, short], backend, unset, output_dir=tmp_path, progress=False)
    assert backend.calls == [(2, 4096, 0.6, 0.95), (2, 1024, 1.0, 1.0)]
    saved = json.loads((tmp_path / RESULTS_JSON).read_text())["summary"]
    assert saved["benchmarks"]["long"]["generation"] == {"max_new_tokens": 4096, "temperature": 0.6, "top_p": 0.95}
    assert saved["settings"]["generation"]["short"] == {"max_new_tokens": 1024, "temperature": 1.0, "top_p": 1.0}
    assert "long: max_new_tokens=4096, temperature=0.6, top_p=0.95; short: max_new_tokens=1024" in result.markdown

    # a config value overrides every task's default; a second output dir, so nothing is resumed
    backend = RecordingBackend()
    evaluate([long, short], backend, config(max_new_tokens=None, temperature=0.0, top_p=None),
             output_dir=tmp_path / "greedy", progress=False)
    assert backend.calls == [(2, 4096, 0.0, 0.95), (2, 1024, 0.0, 1.0)]

    # resuming with one benchmark's default changed names that benchmark and field
    changed = with_generation(make_task("short", 2), max_new_tokens=2048, temperature=1.0, top_p=1.0)
    with pytest.raises(ResumeMismatchError, match="short max_new_tokens: stored 1024, requested 2048"):
        evaluate([long, changed], RecordingBackend(), unset, output_dir=tmp_path, progress=False)

    # a benchmark added on resume joins settings.json; the finished ones are not resampled
    extra = with_generation(make_task("extra", 1), max_new_tokens=8, temperature=0.6, top_p=0.95)
    backend = RecordingBackend()
    evaluate([long, short, extra], backend, unset, output_dir=tmp_path, progress=False)
    assert backend.calls == [(1, 8, 0.6, 0.95)]
    stored = json.loads((tmp_path / "settings.json").read_text())
    assert set(stored["generation"]) == {"long", "short", "extra"}


def test_a_task_without_generation_settings_needs_them_from_the_config() -> None:
    with pytest.raises(ValueError, match="task 'alpha': no max_new_tokens; set it on the EvalConfig"):
        evaluate([make_task("alpha", 1)], RecordingBackend(), config(max_new_tokens=None), progress=False)
    with pytest.raises(ValueError, match="task 'alpha': top_p must be in"):
        with_generation(make_task("alpha", 1), top_p=2.0)


def test_resume_reads_settings_written_before_per_benchmark_generation(tmp_path: Path) -> None:
    task = make_task("alpha", 2)
    evaluate([task], SeededBackend(), config(), output_dir=tmp_path, progress=False)
    path = tmp_path / "settings.json"
    legacy = json.loads(path.read_text())
    del legacy["generation"]  # the old file: one set of generation fields at the top level
    path.write_text(json.dumps(legacy))
    evaluate([task], SeededBackend(), config(), output_dir=tmp_path, progress=False)
    with pytest.raises(ResumeMismatchError, match="alpha temperature: stored 0.6, requested 1.0"):
        evaluate([task], SeededBackend(), config(temperature=1.0), output_dir=tmp_path, progress=False)


@dataclass
class StreamBackend:
    """Draws every completion of a call from one stream seeded by the call's seed, as a batched sampler does: a
    problem's samples depend on the prompts before it in the call."""

    prompts_seen: list[str] = field(default_factory=list)

    def generate(self, prompts: Sequence[str], n: int, max_new_tokens: int, temperature: float, top_p: float, seed: int) -> list[list[str]]:
        self.prompts_seen.extend(prompts)
        rng = random.Random(seed)
        return [[f"answer {p[1 : p.index(']')].rsplit('-', 1)[1] if rng.random() < 0.5 else 'x'}" for _ in range(n)]
                for p in prompts]


def test_a_torn_row_is_redrawn_as_an_uninterrupted_run_draws_it(tmp_path: Path) -> None:
    task = make_task("alpha", 4)
    clean = evaluate([task], StreamBackend(), config(), output_dir=tmp_path / "clean", progress=False)
    path = tmp_path / "run" / SAMPLES_FILE
    path.parent.mkdir()
    (tmp_path / "run" / "settings.json").write_text((tmp_path / "clean" / "settings.json").read_text())
    lines = (tmp_path / "clean" / SAMPLES_FILE).read_text().splitlines(keepends=True)
    path.write_text(lines[0] + lines[1][:30])  # killed while writing alpha-1, the second of block 0
    redo = StreamBackend()
    resumed = evaluate([task], redo, config(), output_dir=tmp_path / "run", progress=False)
    assert redo.prompts_seen == ["[alpha-0] q0", "[alpha-1] q1", "[alpha-2] q2", "[alpha-3] q3"]
    assert resumed.records == clean.records
    assert path.read_text() == "".join(lines)


def test_rows_with_another_sample_count_are_refused(tmp_path: Path) -> None:
    task = make_task("alpha", 2)
    evaluate([task], SeededBackend(), config(), output_dir=tmp_path, progress=False)
    path = tmp_path / SAMPLES_FILE
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows[1]["samples"] = rows[1]["samples"][:2]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ResumeMismatchError, match="alpha problem alpha-1 holds 2 samples, not n=4"):
        evaluate([task], SeededBackend(), config(), output_dir=tmp_path, progress=False)


def test_the_model_is_identified_by_its_weights_not_its_path(tmp_path: Path) -> None:
    task = make_task("alpha", 2)
    evaluate([task], SeededBackend(), config(model="a", model_sha256="1" * 64), output_dir=tmp_path, progress=False)
    moved = SeededBackend()  # the same weights at another path: resumed, nothing redrawn
    evaluate([task], moved, config(model="b", model_sha256="1" * 64), output_dir=tmp_path, progress=False)
    assert moved.prompts_seen == []
    with pytest.raises(ResumeMismatchError, match=r"the model's weights differ .*sha256 111111111111 stored, "
                                                  r"222222222222 now"):
        evaluate([task], SeededBackend(), config(model="a", model_sha256="2" * 64), output_dir=tmp_path,
                 progress=False)


def test_a_full_disk_while_writing_samples_is_one_line_and_tears_nothing(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import errno
    import os

    from ictrl.errors import WriteError

    task = make_task("alpha", 4)
    real_write = os.write
    calls = []

    def full_on_second_block(fd: int, data: object) -> int:
        calls.append(1)
        if len(calls) == 2:  # the second block's rows: a few bytes fit, then the disk is full
            real_write(fd, bytes(data)[:20])  # type: ignore[call-overload]
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "write", full_on_second_block)
    with pytest.raises(WriteError, match=rf"cannot write {tmp_path / SAMPLES_FILE}: No space left on device \(.* "
                                         r"free\); the rows before are kept"):
        evaluate([task], SeededBackend(), config(), output_dir=tmp_path, progress=False)
    monkeypatch.undo()
    assert [json.loads(x)["problem_id"] for x in (tmp_path / SAMPLES_FILE).read_text().splitlines()] == [
        "alpha-0", "alpha-1"]  # no torn third row
    result = evaluate([task], SeededBackend(), config(), output_dir=tmp_path, progress=False)
    clean = evaluate([task], SeededBackend(), config(), output_dir=tmp_path / "clean", progress=False)
    assert result.records == clean.records
