"""The tiny base model: deterministic warm start, atomic cache, reload through the Auto classes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ictrl.experiments.tasks import tinymodel
from ictrl.experiments.tasks import tinytask
from test_tinytask import gold_solution

# A deliberately tiny recipe: seconds, not minutes. It does not learn the task; the full recipe is exercised by
# `ictrl demo`.
TINY = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, difficulty=(2,), train_problems=200,
            max_steps=6, eval_every=3, dev_problems=4, dev_samples=1, batch_size=8)


def _weights(path: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path).state_dict()


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tinymodel.build_tiny_base(tinymodel.TinyRecipe(**TINY), cache_dir=tmp_path_factory.mktemp("cache"),
                                     log=lambda _: None)


def test_build_writes_a_reloadable_checkpoint_and_nothing_else(built: Path) -> None:
    assert built.name == f"tiny-base-{tinymodel.TinyRecipe(**TINY).key()}"
    assert sorted(p.name for p in built.parent.iterdir()) == [built.name]  # no temp dirs left behind
    info = (built / "warm_start.json").read_text()
    assert '"best_step"' in info and '"history"' in info
    model, tok = tinymodel.load_tiny_base(built)
    assert type(model).__name__ == "Qwen2ForCausalLM" and model.config.hidden_size == 32
    assert len(tok) == 259 and tok.chat_template is None
    fresh = tinymodel.build_byte_tokenizer(chat_template=None)
    for p in tinytask.generate_problems(20, "test", 2):
        text = p.question + gold_solution(p)
        assert tok(text)["input_ids"] == fresh(text)["input_ids"]
        assert tok.decode(tok(text)["input_ids"]) == text


def test_second_call_hits_the_cache(built: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = _weights(built)
    monkeypatch.setattr(tinymodel, "warm_start", lambda *a, **k: pytest.fail("cache miss: rebuilt the model"))
    again = tinymodel.build_tiny_base(tinymodel.TinyRecipe(**TINY), cache_dir=built.parent)
    assert again == built
    after = _weights(again)
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


def test_env_var_sets_the_cache_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ICTRL_CACHE_DIR", str(tmp_path / "c"))
    assert tinymodel.cache_root() == tmp_path / "c"


def test_warm_start_is_deterministic_for_a_seed(built: Path, tmp_path: Path) -> None:
    rebuilt = tinymodel.build_tiny_base(tinymodel.TinyRecipe(**TINY), cache_dir=tmp_path, log=lambda _: None)
    a, b = _weights(built), _weights(rebuilt)
    assert all(torch.equal(a[k], b[k]) for k in a)
    other = tinymodel.build_tiny_base(tinymodel.TinyRecipe(**{**TINY, "seed": 1}), cache_dir=tmp_path,
                                      log=lambda _: None)
    assert other != rebuilt
    c = _weights(other)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_a_failed_build_leaves_no_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken_rename(src: str, dst: str) -> None:
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(tinymodel.os, "rename", broken_rename)
    recipe = tinymodel.TinyRecipe(**{**TINY, "max_steps": 1, "eval_every": 1})
    with pytest.raises(OSError, match="simulated"):
        tinymodel.build_tiny_base(recipe, cache_dir=tmp_path, log=lambda _: None)
    assert list(tmp_path.iterdir()) == []


def test_sample_correct_counts_are_bounded_and_deterministic(built: Path) -> None:
    model, tok = tinymodel.load_tiny_base(built)
    problems = tinytask.generate_problems(6, "test", 2)
    a = tinymodel.sample_correct(model, tok, problems, n=3, seed=4)
    b = tinymodel.sample_correct(model, tok, problems, n=3, seed=4)
    assert a == b and len(a) == 6 and all(0 <= c <= 3 for c in a)


def test_recipe_key_and_validation() -> None:
    base = tinymodel.TinyRecipe(**TINY)
    assert base.key() == tinymodel.TinyRecipe(**TINY).key()
    assert base.key() != tinymodel.TinyRecipe(**{**TINY, "lr": 1e-3}).key()
    assert base.key() != tinymodel.TinyRecipe(**{**TINY, "digit_error": 0.1}).key()
    with pytest.raises(ValueError, match="order_error"):
        tinymodel.TinyRecipe(order_error=1.5)
    with pytest.raises(ValueError, match="hidden_size"):
        tinymodel.TinyRecipe(hidden_size=30, num_attention_heads=4)
    with pytest.raises(ValueError, match="max_steps"):
        tinymodel.TinyRecipe(max_steps=0)


@pytest.mark.integration
def test_cli_writes_a_real_width_model_with_fewer_layers(tmp_path: Path) -> None:
    from ictrl.cli import main
    from ictrl.models import load_model_and_tokenizer

    out = tmp_path / "m"
    assert main(["tiny-model", str(out), "--shape", "qwen2.5-0.5b", "--layers", "1", "--untrained",
                 "--problems", "4"]) == 0
    model, tok = load_model_and_tokenizer(str(out))
    assert (model.config.hidden_size, model.config.num_hidden_layers, model.config.vocab_size) == (896, 1, 151936)
    assert model.lm_head.weight is model.model.embed_tokens.weight and len(tok) == 151936
    assert len((out / "train.jsonl").read_text().splitlines()) == 4


@pytest.mark.parametrize("argv, message", [
    (["--shape", "qwen2.5-0.5b"], "add --untrained"),
    (["--layers", "2", "--untrained"], "add --shape"),
    (["--shape", "qwen2.5-0.5b", "--untrained", "--layers", "0"], "--layers must be at least 1"),
])
def test_cli_rejects_shape_flag_mistakes(tmp_path: Path, argv: list[str], message: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    from ictrl.cli import main

    assert main(["tiny-model", str(tmp_path / "m"), *argv]) == 2
    assert message in capsys.readouterr().err and not (tmp_path / "m").exists()


def test_recipe_and_rl_settings_hold_each_field_to_its_declared_range() -> None:
    from ictrl.experiments.grid.tinyrun import TinyRL

    for bad, message in ((dict(hidden_size=0), "hidden_size: must be >= 1, got 0"),
                         (dict(order_error=1.5), "order_error: must be >= 0 and <= 1"),
                         (dict(lr=float("nan")), "lr: must be finite"), (dict(threads=0), "threads: must be >= 1"),
                         (dict(batch_size=True), "batch_size: expected int"),
                         (dict(hidden_size=66), "hidden_size=66 must divide by num_attention_heads=4")):
        with pytest.raises(ValueError, match=message):
            tinymodel.TinyRecipe(**bad)
    for bad, message in ((dict(num_generations=1), "num_generations: must be >= 2"),
                         (dict(eval_n=3, eval_ks=(1,)), "eval_n: must be >= 4"),
                         (dict(eval_split="train"), "eval_split: must be one of 'test', 'dev'"),
                         (dict(temperature=0.0), "temperature: must be > 0"),
                         (dict(eval_ks=(1, 2)), "eval_ks must include 1 and 4")):
        with pytest.raises(ValueError, match=message):
            TinyRL(**bad)
    assert TinyRL(eval_ks=[1, 4], eval_split="dev").eval_ks == (1, 4)
