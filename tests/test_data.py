"""Benchmark registry, loaders for every file layout, malformed rows, hub path (monkeypatched), prompts."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ictrl.errors import DataError

from ictrl.data import (
    BENCHMARKS,
    MATH_SUFFIX,
    Problem,
    build_prompt,
    get_benchmark,
    load_mixture,
    load_problems,
    parse_spec,
    read_records,
    row_to_problem,
    to_trl_dataset,
)
from ictrl.rewards import choice_reward, math_reward

FIXTURES = Path(__file__).parent / "fixtures"
AOPS = "https://artofproblemsolving.com/wiki/index.php"

REQUIRED = {
    "math500", "gsm8k", "mmlu_stem", "gpqa_diamond", "aime23", "aime24", "aime25", "amc23", "minerva_math",
    "olympiadbench", "commonsenseqa", "arc_challenge", "gsm8k_train", "math_train",
}


def test_registry_entries() -> None:
    assert REQUIRED <= set(BENCHMARKS)
    assert get_benchmark("gsm8k").hub_id == "openai/gsm8k" and get_benchmark("gsm8k").hub_config == "main"
    assert get_benchmark("math500").hub_id == "HuggingFaceH4/MATH-500"
    gpqa = get_benchmark("gpqa_diamond")
    assert (gpqa.hub_id, gpqa.hub_config, gpqa.hub_split) == ("Idavidrein/gpqa", "gpqa_diamond", "train")
    assert get_benchmark("amc23").hub_id == "math-ai/amc23"
    for b in BENCHMARKS.values():
        assert b.hub_id, b.name
        gold = {"choice": "A", "math": "\\frac{1}{2}", "gsm8k": "#### 7"}[b.kind]
        assert b.reward("The answer is \\boxed{A}", gold) == (1.0 if b.kind == "choice" else 0.0)
    with pytest.raises(ValueError, match="unknown name"):
        get_benchmark("mmlu_pro")
    # the GPQA adapter's missing column is reported with the file and line
    row = {"Question": "q", "Correct Answer": "a", "Incorrect Answer 1": "b", "Incorrect Answer 3": "d"}
    with pytest.raises(DataError, match="x.jsonl: line 1: field 'Incorrect Answer 2' missing"):
        row_to_problem(row, gpqa, 0, "x.jsonl: line 1")


# ------------------------------------------------------------------------------------ local file layouts


def test_fixture_layouts() -> None:
    math = load_problems("math500", path=FIXTURES / "math500_head.jsonl")
    assert [p.id for p in math] == [
        "test/precalculus/807.json", "test/intermediate_algebra/1994.json", "test/algebra/2584.json"]
    assert math[0].gold == "\\left( 3, \\frac{\\pi}{2} \\right)" and math[0].meta["level"] == 2

    gsm = load_problems("gsm8k", path=FIXTURES / "gsm8k_head.jsonl")
    assert [p.gold for p in gsm] == ["18", "3"]
    assert gsm[0].meta["solution"].endswith("#### 18")

    csqa = load_problems("commonsenseqa", path=FIXTURES / "commonsenseqa_head.jsonl")
    assert csqa[0].question.startswith("A revolving door") and csqa[0].gold == "A"
    assert csqa[0].choices == ["bank", "library", "department store", "mall", "new york"]

    arc = {p.id: p for p in load_problems("arc_challenge", path=FIXTURES / "arc_challenge_excerpt.json")}
    assert arc["Mercury_7175875"].gold == "C" and len(arc["Mercury_7175875"].choices) == 4
    assert arc["NYSEDREGENTS_2010_4_4"].choices == ["slower", "faster", "at the same speed"]
    raw = {r["id"]: r for _, r in read_records(FIXTURES / "arc_challenge_excerpt.json")}
    numeric = next(r for r in raw.values() if r["label"][0] == "1")
    p = arc[numeric["id"]]
    # a "1".."4" label maps to the letter at the same position, and the text under it stays attached
    assert p.choices[ord(p.gold) - ord("A")] == numeric[numeric["answer"]]


def test_math_train_levels_and_missing_gold() -> None:
    path = FIXTURES / "math_train_excerpt.json"
    all_rows = load_problems("math_train", path=path)
    assert [p.gold for p in all_rows] == ["0", "98", "4"]  # the null-answer item is dropped
    assert [p.gold for p in load_problems("math_train:levels=3", path=path)] == ["4"]
    assert [p.gold for p in load_problems("math_train", path=path, levels=(5,))] == ["0", "98"]
    with pytest.raises(ValueError, match="levels"):
        load_problems("math_train:levels=three", path=path)


def test_json_list_line_numbers(tmp_path: Path) -> None:
    f = tmp_path / "list.json"
    f.write_text('[\n  {"problem": "a", "answer": "1"},\n\n  {"problem": "b",\n   "answer": "2"}\n]\n')
    assert [line for line, _ in read_records(f)] == [2, 4]


# ------------------------------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    ("rows", "match"),
    [
        ([{"problem": "ok", "answer": "1"}, {"problem": "no gold"}], r"bad\.jsonl: line 2: field 'answer' missing"),
        ([{"problem": "ok", "answer": "1"}, {"answer": "1"}], r"line 2: field 'problem' missing"),
        ([{"problem": 5, "answer": "1"}], r"line 1: field 'problem' must be a non-empty string"),
        ([{"problem": "x", "answer": ["a", "b"]}], r"line 1: field 'answer' must be"),
        ([{"problem": "x", "answer": None}], r"line 1: field 'answer' must be"),
        ([["not", "an", "object"]], r"line 1: expected a JSON object"),
    ],
)
def test_malformed_rows(tmp_path: Path, rows: list[Any], match: str) -> None:
    f = tmp_path / "bad.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(ValueError, match=match):
        load_problems("math500", path=f)


def test_malformed_json_and_choices(tmp_path: Path) -> None:
    f = tmp_path / "broken.jsonl"
    f.write_text('{"problem": "a", "answer": "1"}\n{"problem": "b", "answer": \n')
    with pytest.raises(ValueError, match=r"broken\.jsonl: line 2, column \d+: invalid JSON"):
        load_problems("math500", path=f)
    f = tmp_path / "mc.jsonl"
    f.write_text(json.dumps({"question": "q", "choices": ["x", "y"], "answer": 1}) + "\n"
                 + json.dumps({"question": "q", "choices": ["x", "y"], "answer": 7}) + "\n")
    with pytest.raises(ValueError, match=r"mc\.jsonl: line 2: field 'answer': index 7 out of range"):
        load_problems("mmlu_stem", path=f)
    f.write_text(json.dumps({"question": "q", "choices": "x or y", "answer": 0}) + "\n")
    with pytest.raises(ValueError, match=r"line 1: field 'choices'"):
        load_problems("mmlu_stem", path=f)
    with pytest.raises(DataError, match="missing.jsonl: no such file"):
        load_problems("math500", path=tmp_path / "missing.jsonl")


def test_non_utf8_byte_names_file_line_and_column(tmp_path: Path) -> None:
    f = tmp_path / "latin1.jsonl"
    f.write_bytes(b'{"problem": "a", "answer": "1"}\n{"problem": "caf\xe9", "answer": "2"}\n')
    with pytest.raises(DataError, match=r"latin1\.jsonl: line 2: byte 0xe9 at column 17 is not UTF-8"):
        load_problems("math500", path=f)


def test_empty_file_is_named(tmp_path: Path) -> None:
    f = tmp_path / "empty.jsonl"
    f.write_text("\n\n")
    with pytest.raises(DataError, match=r"empty\.jsonl: no rows \(the file is empty\)"):
        load_problems("math500", path=f)


def test_hub_without_network_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import datasets

    def offline(*args: object, **kwargs: object) -> None:
        raise ConnectionError("Couldn't reach 'math-ai/amc23' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(DataError, match=r"amc23: no local copy .* and no network to fetch math-ai/amc23"):
        load_problems("amc23", data_root=tmp_path)


def test_jsonl_spec_with_fields(tmp_path: Path) -> None:
    f = tmp_path / "custom.jsonl"
    f.write_text("\n".join(json.dumps({"uid": i, "q": f"Q{i}", "opts": ["a", "b", "c"], "key": "B"}) for i in range(5)))
    spec = f"jsonl:{f}:kind=choice:question_field=q:answer_field=key:choices_field=opts:id_field=uid"
    ps = load_problems(spec, limit=3)
    assert [p.id for p in ps] == ["0", "1", "2"]
    assert ps[0].question == "Q0" and ps[0].gold == "B" and ps[0].choices == ["a", "b", "c"]
    with pytest.raises(ValueError, match="unknown"):
        load_problems(f"jsonl:{f}:colour=red")


# ---------------------------------------------------------------------------------------------- hub path


def _fake_hub(monkeypatch: pytest.MonkeyPatch, rows: list[dict[str, Any]]) -> list[tuple]:
    import datasets

    calls: list[tuple] = []

    def load_dataset(path: str, name: str | None = None, split: str | None = None, **kw: Any) -> list[dict]:
        calls.append((path, name, split))
        return rows

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    return calls


def test_hub_path_formats(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls = _fake_hub(monkeypatch, [
        {"id": "x1", "question": "Where?", "question_concept": "c", "answerKey": "B",
         "choices": {"label": ["A", "B", "C", "D", "E"], "text": ["a", "b", "c", "d", "e"]}},
    ])
    (p,) = load_problems("commonsenseqa", data_root=tmp_path)
    assert calls == [("tau/commonsense_qa", None, "validation")]
    assert (p.id, p.question, p.gold, p.choices) == ("x1", "Where?", "B", ["a", "b", "c", "d", "e"])

    calls = _fake_hub(monkeypatch, [
        {"id": "a1", "question": "Q", "answerKey": "3",
         "choices": {"label": ["1", "2", "3", "4"], "text": ["w", "x", "y", "z"]}},
    ])
    (p,) = load_problems("arc_challenge", data_root=tmp_path)
    assert calls == [("allenai/ai2_arc", "ARC-Challenge", "test")] and p.gold == "C" and p.choices[2] == "y"

    calls = _fake_hub(monkeypatch, [
        {"problem": "P", "level": "Level 4", "type": "Algebra", "solution": "so $\\boxed{\\frac{1}{2}}$."},
        {"problem": "P2", "level": "Level 1", "type": "Algebra", "solution": "\\boxed{3}"},
    ])
    ps = load_problems("math_train:levels=3,4,5", data_root=tmp_path)
    assert calls == [("DigitalLearningGmbH/MATH-lighteval", None, "train")]
    assert [(p.gold, p.meta["level"]) for p in ps] == [("\\frac{1}{2}", 4)]

    _fake_hub(monkeypatch, [{"question": "Q", "final_answer": ["$3\\sqrt{2}$"], "id": 7}])
    (p,) = load_problems("olympiadbench")
    assert p.gold == "3\\sqrt{2}" and p.id == "7"

    _fake_hub(monkeypatch, [
        {"url": f"{AOPS}/2022_AIME_I_Problems/Problem_1", "problem": "old", "answer": "1"},
        {"url": f"{AOPS}/2023_AIME_II_Problems/Problem_3", "problem": "new", "answer": "080"},
    ])
    (p,) = load_problems("aime23", data_root=tmp_path)
    assert p.question == "new" and math_reward("\\boxed{80}", p.gold) == 1.0

    _fake_hub(monkeypatch, [{"problem": "bad"}])
    with pytest.raises(ValueError, match=r"hub:HuggingFaceH4/MATH-500\[test\]: row 0: field 'answer' missing"):
        load_problems("math500", data_root=tmp_path)


def test_gpqa_shuffle(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [{"Record ID": f"r{i}", "Question": f"Question {i}?", "Correct Answer": f"right {i}",
             "Incorrect Answer 1": "w1", "Incorrect Answer 2": "w2", "Incorrect Answer 3": "w3", "Subdomain": "Physics"}
            for i in range(40)]
    _fake_hub(monkeypatch, rows)
    ps = load_problems("gpqa_diamond")
    assert all(p.choices[ord(p.gold) - 65] == f"right {i}" for i, p in enumerate(ps))
    assert len({p.gold for p in ps}) == 4  # the correct answer is not always first
    assert [p.gold for p in load_problems("gpqa_diamond")] == [p.gold for p in ps]  # stable
    _fake_hub(monkeypatch, [{"Question": "q"}])
    with pytest.raises(ValueError, match="Correct Answer"):
        load_problems("gpqa_diamond")


def test_data_root_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "aime25").mkdir()
    (tmp_path / "aime25" / "test.jsonl").write_text(json.dumps({"problem": "P", "answer": "042"}) + "\n")
    monkeypatch.setenv("ICTRL_DATA_ROOT", str(tmp_path))
    (p,) = load_problems("aime25")
    assert p.gold == "042" and p.id == "aime25-0"


# --------------------------------------------------------------------------------------- shared data


EXPECTED_COUNTS = {
    "gsm8k": 1319, "gsm8k_train": 7473, "math500": 500, "aime23": 30, "aime24": 30, "aime25": 30,
    "mmlu_stem": 3018, "commonsenseqa": 1221, "arc_challenge": 1172, "math_train": 7470,
}


@pytest.mark.parametrize("name", sorted(EXPECTED_COUNTS))
def test_shared_data_counts(name: str, shared_data: Path) -> None:
    ps = load_problems(name, data_root=shared_data)
    assert len(ps) == EXPECTED_COUNTS[name]
    assert len({p.id for p in ps}) == len(ps) or name in ("gsm8k", "gsm8k_train", "aime25", "mmlu_stem", "math_train")
    assert all(p.gold and p.question for p in ps)
    if get_benchmark(name).kind == "choice":
        assert all(p.choices and "A" <= p.gold <= chr(64 + len(p.choices)) for p in ps)
    assert len(load_problems(name, data_root=shared_data, limit=7)) == 7


def test_shared_math_train_levels(shared_data: Path) -> None:
    ps = load_problems("math_train:levels=3,4,5", data_root=shared_data)
    # SOURCES.md: levels 3-5 = 5563 rows, 4 of which (levels 3 and 5) have no gold
    assert len(ps) == 5559 and {p.meta["level"] for p in ps} == {3, 4, 5}


# --------------------------------------------------------------------------------------- prompts, TRL


def test_build_prompt_plain_and_chat() -> None:
    p = Problem("1", "What is 1+1?", "2")
    assert build_prompt(p, get_benchmark("math500")) == "What is 1+1?\n" + MATH_SUFFIX + "\n"
    assert MATH_SUFFIX == "Please reason step by step, and put your final answer within \\boxed{}."
    mc = Problem("2", "Pick one.", "B", choices=["red", "blue", "green"])
    text = build_prompt(mc, "mmlu_stem")
    assert "Pick one.\n\nA. red\nB. blue\nC. green\n\n" in text
    assert choice_reward("The answer is \\boxed{B}", mc.gold) == 1.0

    seen: list[Any] = []

    def apply_chat_template(messages: list[dict], tokenize: bool, add_generation_prompt: bool) -> str:
        seen.append((messages, tokenize, add_generation_prompt))
        return "<|user|>" + messages[0]["content"] + "<|assistant|>"

    tok = SimpleNamespace(chat_template="{{ messages }}", apply_chat_template=apply_chat_template)
    out = build_prompt(p, "math500", tokenizer=tok)
    assert out == "<|user|>What is 1+1?\n" + MATH_SUFFIX + "<|assistant|>"
    assert seen == [([{"role": "user", "content": "What is 1+1?\n" + MATH_SUFFIX}], False, True)]
    no_template = SimpleNamespace(chat_template=None, apply_chat_template=apply_chat_template)
    assert build_prompt(p, "math500", tokenizer=no_template).endswith(MATH_SUFFIX + "\n")


def test_build_prompt_real_tokenizer(tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    text = build_prompt(Problem("1", "What is 1+1?", "2"), "gsm8k", tokenizer=tok)
    if tok.chat_template:
        assert text != "What is 1+1?\n" + MATH_SUFFIX + "\n" and "What is 1+1?" in text
    else:
        assert text == "What is 1+1?\n" + MATH_SUFFIX + "\n"


def test_to_trl_dataset_and_mixture(tmp_path: Path) -> None:
    (tmp_path / "gsm8k").mkdir()
    (tmp_path / "gsm8k" / "train.jsonl").write_text(
        "\n".join(json.dumps({"question": f"G{i}", "answer": f"work\n#### {i}"}) for i in range(30)))
    (tmp_path / "math_train").mkdir()
    (tmp_path / "math_train" / "math.json").write_text(
        json.dumps([{"problem": f"M{i}", "answer": f"\\frac{{{i}}}{{7}}", "difficulty": 1 + i % 5, "type": "A"}
                    for i in range(10)]))

    ds = to_trl_dataset("gsm8k_train", data_root=tmp_path, limit=4)
    assert ds.column_names == ["prompt", "answer", "kind", "id", "benchmark"]
    assert ds[0]["prompt"] == [{"role": "user", "content": "G0\n" + MATH_SUFFIX}] and ds[0]["answer"] == "0"
    plain = to_trl_dataset("gsm8k_train", data_root=tmp_path, limit=2, conversational=False)
    assert plain[1]["prompt"] == "G1\n" + MATH_SUFFIX + "\n"

    mix = load_mixture(["gsm8k_train", "math_train"], seed=1, data_root=tmp_path)
    assert sorted(p.question for p in mix) == sorted([f"G{i}" for i in range(30)] + [f"M{i}" for i in range(10)])

    def ids(seed: int) -> list[str]:
        return [p.id for p in load_mixture(["gsm8k_train", "math_train"], seed=seed, data_root=tmp_path)]

    assert [p.id for p in mix] == ids(1) and [p.id for p in mix] != ids(2)
    weighted = load_mixture(["gsm8k_train", "math_train"], weights=[1, 3], size=40, seed=0, data_root=tmp_path)
    counts = {b: sum(p.meta["benchmark"] == b for p in weighted) for b in ("gsm8k_train", "math_train")}
    assert counts == {"gsm8k_train": 10, "math_train": 30}  # math_train cycles: 10 problems, 3 passes
    with pytest.raises(ValueError, match="weights"):
        load_mixture(["gsm8k_train", "math_train"], weights=[1], data_root=tmp_path)

    mixed = to_trl_dataset(["gsm8k_train", "math_train:levels=1"], data_root=tmp_path, seed=0)
    assert len(mixed) == 32 and set(mixed["kind"]) == {"gsm8k", "math"}
    row = next(r for r in mixed if r["benchmark"] == "math_train")
    assert row["kind"] == "math" and row["prompt"][0]["content"].startswith("M")


# ------------------------------------------------------------------------------------ generation defaults


def test_benchmark_generation_defaults() -> None:
    from ictrl.data import parse_spec

    for name in ("math500", "aime23", "aime24", "aime25", "amc23", "minerva_math", "olympiadbench"):
        assert get_benchmark(name).max_new_tokens >= 2048, name
    assert get_benchmark("gsm8k").generation == {"max_new_tokens": 1024, "temperature": 0.6, "top_p": 0.95}
    for b in BENCHMARKS.values():
        gen = b.generation
        assert gen["max_new_tokens"] >= 1 and gen["temperature"] >= 0 and 0 < gen["top_p"] <= 1, b.name
    bench, _ = parse_spec("math500:max_new_tokens=8192:temperature=1:top_p=0.9")
    assert bench.generation == {"max_new_tokens": 8192, "temperature": 1.0, "top_p": 0.9}
    assert get_benchmark("math500").max_new_tokens == 4096  # the registry entry is untouched
    with pytest.raises(ValueError, match="max_new_tokens: expected a number, got 'lots'"):
        parse_spec("math500:max_new_tokens=lots")
    with pytest.raises(ValueError, match="'math500': top_p must be in"):
        parse_spec("math500:top_p=0")
    with pytest.raises(ValueError, match="'math500': max_new_tokens must be an int >= 1"):
        parse_spec("math500:max_new_tokens=0")


def test_prompt_template_option_sends_the_question_alone(tmp_path: Path) -> None:
    from ictrl.data import Problem, parse_spec, user_message

    bench, path = parse_spec(f"jsonl:{tmp_path / 'train.jsonl'}:prompt_template={{question}}")
    assert path == str(tmp_path / "train.jsonl") and bench.template == "{question}"
    problem = Problem(id="0", question="Q:3+4*5=A:", gold="23")
    assert user_message(problem, bench) == "Q:3+4*5=A:"  # no boxed-answer instruction appended
    assert user_message(problem, parse_spec("jsonl:f.jsonl")[0]).endswith("within \\boxed{}.")
    with pytest.raises(ValueError, match="prompt_template: must contain"):
        parse_spec("jsonl:f.jsonl:prompt_template=no placeholder")


# --- JSON Lines as datasets reads them ------------------------------------------------------------------------


def test_jsonl_lines_end_at_newline_only(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """U+2028 and U+0085 inside a string stay in it (str.splitlines would split there), CRLF ends a line, and a
    BOM at the start is skipped with one warning: what ``datasets.load_dataset("json")`` reads."""
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + '{"question": "a\u2028b\u0085c", "answer": "1"}\r\n\r\n'.encode()
                     + b'{"question": "d", "answer": "2"}')
    with caplog.at_level("WARNING"):
        problems = load_problems(f"jsonl:{path}")
    assert [p.question for p in problems] == ["a\u2028b\u0085c", "d"] and [p.gold for p in problems] == ["1", "2"]
    assert [r.getMessage() for r in caplog.records] == [
        f"{path}: skipping the UTF-8 byte order mark at the start of the file"]
    path.write_bytes(b'{"question": "a", "answer": "1"}\n{"question": "b"\n')
    with pytest.raises(DataError, match=r"rows.jsonl: line 2, column"):
        load_problems(f"jsonl:{path}")


@pytest.mark.parametrize("gold, says", [("NaN", "nan is not a gold answer"), ("Infinity", "inf is not a gold"),
                                        ('"$$"', "empty once normalised"), ('"#### "', "empty once normalised")])
def test_a_gold_no_completion_can_match_is_refused(tmp_path: Path, gold: str, says: str) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text(f'{{"question": "q", "answer": "1"}}\n{{"question": "q", "answer": {gold}}}\n')
    kind = ":kind=gsm8k" if "####" in gold else ""
    with pytest.raises(DataError, match=rf"rows.jsonl: line 2: field 'answer': .*{says}"):
        load_problems(f"jsonl:{path}{kind}")


def test_a_lone_surrogate_is_refused_naming_the_row(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text('{"question": "q", "answer": "1"}\n{"question": "q", "answer": "\\udc00x"}\n')
    with pytest.raises(DataError, match=r"rows.jsonl: line 2: field 'answer': a lone surrogate '\\udc00'"):
        load_problems(f"jsonl:{path}")
    path.write_text('{"question": "\\ud83d\\ude00", "answer": "1"}\n')  # a pair is one character
    assert load_problems(f"jsonl:{path}")[0].question == "\U0001f600"


def test_a_path_with_equals_is_given_as_the_path_option(tmp_path: Path) -> None:
    folder = tmp_path / "run=3"
    folder.mkdir()
    (folder / "train.jsonl").write_text('{"question": "q", "answer": "#### 4"}\n')
    bench, path = parse_spec(f"jsonl:path={folder}/train.jsonl:kind=gsm8k")
    assert path == f"{folder}/train.jsonl" and bench.kind == "gsm8k"
    assert load_problems(f"jsonl:path={folder}/train.jsonl:kind=gsm8k")[0].gold == "4"
    with pytest.raises(ValueError, match=r"needs a path \(one with '=' in it is written jsonl:path=PATH\)"):
        parse_spec(f"jsonl:{folder}/train.jsonl")
    with pytest.raises(ValueError, match="two paths"):
        parse_spec("jsonl:a.jsonl:path=b.jsonl")


def test_mixture_sources_with_one_file_name_keep_their_own_options(tmp_path: Path) -> None:
    for folder, row in (("a", '{"question": "one", "answer": "1"}'), ("b", '{"question": "two", "answer": "#### 2"}')):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "train.jsonl").write_text(row + "\n")
    dataset = to_trl_dataset([f"jsonl:{tmp_path}/a/train.jsonl:prompt_template=A {{question}}",
                              f"jsonl:{tmp_path}/b/train.jsonl:kind=gsm8k:prompt_template=B {{question}}"])
    rows = sorted((r["prompt"][0]["content"], r["kind"], r["answer"]) for r in dataset)
    assert rows == [("A one", "math", "1"), ("B two", "gsm8k", "2")]


@pytest.mark.parametrize("form", ["jsonl", "json list"])
def test_a_row_nested_past_the_parsers_recursion_is_one_line_naming_it(tmp_path: Path, form: str,
                                                                       tiny_model_dir: Path, loader_calls: list,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """200,000 nested lists in a row: Python's json parser recurses once a level; the row is named in one line,
    through ``ictrl eval`` (the rows are read before the model loads)."""
    from ictrl.cli import main

    deep = "[" * 200_000 + "]" * 200_000
    good = '{"question": "q", "answer": "1"}'
    rows = [good, f'{{"question": "q", "answer": "1", "extra": {deep}}}']
    path = tmp_path / ("rows.jsonl" if form == "jsonl" else "rows.json")
    path.write_text("\n".join(rows) + "\n" if form == "jsonl" else "[" + ",\n".join(rows) + "]\n")
    with pytest.raises(DataError, match=rf"{path.name}: line 2: the row nests lists or objects deeper"):
        load_problems(f"jsonl:{path}")
    assert main(["eval", "--model", str(tiny_model_dir), "--benchmarks", f"jsonl:{path}", "--n", "1", "--k", "1",
                 "--method", "base"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip().split("\n")[-1].startswith(f"ictrl eval: error: {path}: line 2:")
    assert not loader_calls


def test_invisible_format_characters_in_hub_rows_are_named_as_local_rows_are(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Rows a benchmark loads from the hub are scanned as a local file's are: one line naming the first row (its
    index in the hub split) and the character."""
    _fake_hub(monkeypatch, [
        {"id": "x1", "question": "Where?", "question_concept": "c", "answerKey": "B",
         "choices": {"label": ["A", "B"], "text": ["a", "b"]}},
        {"id": "x2", "question": "Wh\u200bere?", "question_concept": "c", "answerKey": "A",
         "choices": {"label": ["A", "B"], "text": ["a", "b"]}},
    ])
    with caplog.at_level("INFO"):
        problems = load_problems("commonsenseqa", data_root=tmp_path)
    assert len(problems) == 2
    assert [(r.levelname, r.getMessage()) for r in caplog.records if "hold invisible" in r.getMessage()] == [(
        "INFO", "hub:tau/commonsense_qa[validation]: 1 row(s) hold invisible format characters (first: row 1, "
        "the question, U+200B ZERO WIDTH SPACE); the grader ignores them in answers, prompts are sent as written")]


def test_invisible_format_characters_are_named_when_the_rows_load(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """A gold (or question) holding U+200B, a soft hyphen or another format character loads as written, with one
    line naming the first row and the character; the grader ignores them (tests/rewards/test_graders.py)."""
    path = tmp_path / "rows.jsonl"
    rows = [{"question": "What is 2+3?", "answer": "5"}, {"question": "What is 1+1?", "answer": "2\u200b"},
            {"question": "What\u00ad is 3+3?", "answer": "6\ufeff"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with caplog.at_level("WARNING"):
        problems = load_problems(f"jsonl:{path}")
    assert [p.gold for p in problems] == ["5", "2\u200b", "6\ufeff"]
    assert [r.getMessage() for r in caplog.records] == [
        f"{path}: 2 row(s) hold invisible format characters (first: line 2, the gold, U+200B ZERO WIDTH SPACE); the "
        "grader ignores them in answers, prompts are sent as written"]
    assert math_reward("\\boxed{2}", problems[1].gold) == 1.0
    caplog.clear()
    path.write_text(json.dumps({"question": "Q\u00a0with NBSP", "answer": "5"}) + "\n")
    with caplog.at_level("INFO"):
        load_problems(f"jsonl:{path}")
    assert not caplog.records
    path.write_text(json.dumps({"question": "Q\u200bwith ZWSP", "answer": "5"}) + "\n")  # a question alone: info
    with caplog.at_level("INFO"):
        load_problems(f"jsonl:{path}")
    assert [(r.levelname, "line 1, the question, U+200B" in r.getMessage()) for r in caplog.records] == [
        ("INFO", True)]


@pytest.mark.parametrize("form", ["jsonl", "json list"])
def test_a_gold_past_floats_range_is_kept_exactly_and_one_past_ints_reader_is_one_line(tmp_path: Path,
                                                                                        form: str) -> None:
    path = tmp_path / ("rows.jsonl" if form == "jsonl" else "rows.json")

    def write(*golds: str) -> None:
        rows = [f'{{"question": "q{i}", "answer": {g}}}' for i, g in enumerate(golds)]
        path.write_text("\n".join(rows) + "\n" if form == "jsonl" else "[" + ",\n".join(rows) + "]\n")

    write("1", str(10**400), str(-(10**400)))
    assert [p.gold for p in load_problems(f"jsonl:{path}")] == ["1", str(10**400), str(-(10**400))]
    assert math_reward(f"\\boxed{{10^{{400}}}}", load_problems(f"jsonl:{path}")[1].gold) == 1.0
    write("1", "1" * 5000)
    with pytest.raises(DataError, match=r"line 2: a number longer than Python's JSON reader converts"):
        load_problems(f"jsonl:{path}")
