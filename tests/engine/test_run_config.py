"""Run-config schema: every shipped config validates; overrides; errors name the key and the source."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from ictrl.engine.run_config import (
    FIELD_MAP,
    ConfigError,
    RunConfig,
    config_from_dict,
    config_to_dict,
    load_config,
    parse_overrides,
    read_yaml,
    save_config,
    trainer_kwargs,
)

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
CELLS = sorted(p for p in CONFIGS.rglob("*.yaml") if "base" not in p.relative_to(CONFIGS).parts)
METHOD_FRAGMENTS = sorted((CONFIGS / "base" / "methods").glob("*.yaml"))


def test_grid_is_complete() -> None:
    names = {str(p.relative_to(CONFIGS)) for p in CELLS}
    expected = {f"qwen2.5-{s}/{m}.yaml" for s in ("0.5b", "1.5b", "7b") for m in ("grpo", "entropy20", "stapo", "ict")}
    assert names == expected
    assert {p.stem for p in METHOD_FRAGMENTS} == {"grpo", "entropy20", "stapo", "ict", "random10", "frequent"}


@pytest.mark.parametrize("path", CELLS, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_every_cell_validates_and_builds_trainer_args(path: Path) -> None:
    from ictrl.engine.run import build_trainer_args

    cfg = load_config(path)
    size, method = path.parent.name, path.stem
    assert cfg.model.name_or_path.lower() == f"qwen/{size}"
    assert cfg.method.name == method
    assert cfg.output_dir == f"runs/{size}/{method}"
    # published values (method.md §6) shared by the grid
    assert (cfg.optim.learning_rate, cfg.sampling.temperature, cfg.optim.beta) == (1e-6, 1.0, 0.0)
    assert (cfg.optim.epsilon, cfg.optim.epsilon_high) == (0.2, 0.28)
    assert cfg.data.train == ["gsm8k_train", "math_train"]
    # 32 prompts x 8 completions per optimizer step at every size
    assert cfg.optim.per_device_train_batch_size * cfg.optim.gradient_accumulation_steps == 256
    args = build_trainer_args(cfg, str(path), cpu=True)
    assert args.token_selector == cfg.method.selector
    assert args.learning_rate == 1e-6 and args.use_cpu and not args.bf16 and not args.use_vllm
    assert args.generation_batch_size == 256


@pytest.mark.parametrize("fragment", METHOD_FRAGMENTS, ids=lambda p: p.stem)
def test_method_fragments_map_to_trainer_fields(fragment: Path, tmp_path: Path) -> None:
    from ictrl.engine.run import build_trainer_args

    cell = tmp_path / "cell.yaml"
    cell.write_text(yaml.safe_dump({
        "base": [str(CONFIGS / "base/train.yaml"), str(CONFIGS / "base/models/qwen2.5-0.5b.yaml"), str(fragment)],
        "output_dir": str(tmp_path / "out"),
    }))
    cfg = load_config(cell)
    raw = yaml.safe_load(fragment.read_text())["method"]
    args = build_trainer_args(cfg, str(cell), cpu=True)
    for key, value in raw.items():
        if key != "name":
            assert getattr(args, FIELD_MAP[f"method.{key}"]) == value, key


def test_field_map_targets_exist_in_trainer_config() -> None:
    from ictrl.engine.run import trainer_classes

    fields = {f.name for f in dataclasses.fields(trainer_classes()[0])}
    assert set(FIELD_MAP.values()) <= fields


def test_overrides_are_yaml_scalars_and_dotted() -> None:
    cell = CONFIGS / "qwen2.5-0.5b/ict.yaml"
    cfg = load_config(cell, ["--optim.learning_rate=3e-6", "--data.train=[math_train]", "--method.ratio=0.2",
                             "--trainer.save_total_limit=1", "--sampling.use_vllm=false", "--data.limit=null",
                             "--output_dir=/tmp/x"])
    assert cfg.optim.learning_rate == 3e-6 and isinstance(cfg.optim.learning_rate, float)
    assert cfg.data.train == ["math_train"]
    assert cfg.method.ratio == 0.2 and cfg.method.selector == "ict"
    assert cfg.trainer["save_total_limit"] == 1 and cfg.trainer["scale_rewards"] == "group"  # merged, not replaced
    assert cfg.sampling.use_vllm is False and cfg.data.limit is None and cfg.output_dir == "/tmp/x"
    assert parse_overrides(["--a.b=1", "c=x y"]) == {"a.b": 1, "c": "x y"}
    with pytest.raises(ConfigError, match="expected --section.key=value"):
        parse_overrides(["--optim.learning_rate"])


def test_mixture_and_scalar_list() -> None:
    cfg = config_from_dict({"model": {"name_or_path": "m"}, "output_dir": "o",
                            "data": {"train": {"gsm8k_train": 1, "math_train": 3}}})
    assert cfg.data.train == {"gsm8k_train": 1.0, "math_train": 3.0}
    cfg = config_from_dict({"model": {"name_or_path": "m"}, "output_dir": "o"}, overrides={"data.train": "math_train"})
    assert cfg.data.train == ["math_train"]
    with pytest.raises(ConfigError, match=r"data\.train\.math_train: mixture weight must be > 0"):
        config_from_dict({"model": {"name_or_path": "m"}, "output_dir": "o",
                          "data": {"train": {"math_train": 0}}})


@pytest.mark.parametrize(
    ("override", "pattern"),
    [
        ("--optim.learning_rat=1e-6", r"override --optim.learning_rat=1e-6: unknown key 'optim.learning_rat'; "
                                      r"did you mean 'optim.learning_rate'\?"),
        ("--sampling.learning_rate=1e-6", r"unknown key 'sampling.learning_rate'; did you mean 'optim.learning_rate'"),
        ("--optim.learning_rate=abc", r"override --optim.learning_rate=abc: optim.learning_rate: expected a number"),
        ("--optim.learning_rate=-1", r"optim.learning_rate: must be > 0"),
        ("--method.selector=ictt", r"method.selector: must be one of .*did you mean 'ict'"),
        ("--sampling.num_generations=1.5", r"sampling.num_generations: expected an integer"),
        ("--sampling.use_vllm=maybe", r"sampling.use_vllm: expected true/false"),
        ("--trainer.save_total_limt=2", r"unknown trainer field 'trainer.save_total_limt'.*'save_total_limit'"),
        ("--trainer.learning_rate=1e-6", r"trainer.learning_rate: set it as 'optim.learning_rate'"),
        ("--sampling.num_generations=7", r"optim.per_device_train_batch_size: .* = 256 completions per step must "
                                         r"be a multiple of sampling.num_generations = 7"),
        ("--model=x", r"model: expected a mapping"),
        ("--method.topk=0", r"method.topk: must be an integer >= 1"),
    ],
)
def test_bad_override_names_the_key(override: str, pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        load_config(CONFIGS / "qwen2.5-0.5b/ict.yaml", [override])


def test_bad_value_in_file_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"base: {CONFIGS / 'qwen2.5-0.5b/ict.yaml'}\noptim:\n  num_iterations: two\n")
    with pytest.raises(ConfigError, match=rf"{bad}: optim.num_iterations: expected an integer, got 'two'"):
        load_config(bad)
    bad.write_text("model: {name_or_path: m}\noutput_dir: o\nmethodd: {}\n")
    with pytest.raises(ConfigError, match=rf"{bad}: unknown key 'methodd'; did you mean 'method'"):
        load_config(bad)
    bad.write_text("output_dir: o\n")
    with pytest.raises(ConfigError, match=r"missing required key model"):
        load_config(bad)
    bad.write_text("base: bad.yaml\n")
    with pytest.raises(ConfigError, match="inheritance cycle"):
        load_config(bad)


def test_trainer_errors_are_mapped_to_config_keys() -> None:
    from ictrl.engine.run import build_trainer_args

    cfg = load_config(CONFIGS / "qwen2.5-0.5b/entropy20.yaml", ["--method.scope=group"])
    with pytest.raises(ConfigError, match=r"entropy20.yaml: method.scope, method.selector: selection_scope must be one of"):
        build_trainer_args(cfg, str(CONFIGS / "qwen2.5-0.5b/entropy20.yaml"), cpu=True)
    # a checkpoint inside TRL's generation buffer could not resume exactly
    cfg = load_config(CONFIGS / "qwen2.5-0.5b/ict.yaml", ["--optim.num_iterations=2", "--save_steps=3",
                                                           "--optim.gradient_accumulation_steps=1"])
    with pytest.raises(ConfigError, match=r"save_steps: 3 optimizer steps"):
        build_trainer_args(cfg, "x.yaml", cpu=True)


def test_trainer_kwargs_and_roundtrip(tmp_path: Path) -> None:
    cfg = load_config(CONFIGS / "qwen2.5-1.5b/grpo.yaml", ["--optim.epsilon_high=null", "--save_steps=0"])
    kwargs = trainer_kwargs(cfg)
    assert kwargs["epsilon_high"] == kwargs["epsilon"] == 0.2  # null = symmetric clip
    assert kwargs["save_strategy"] == "no" and "save_steps" not in kwargs
    assert kwargs["token_selector"] == "all" and "selection_ratio" not in kwargs  # None -> trainer default
    assert kwargs["disable_tqdm"] is True
    save_config(cfg, tmp_path / "config.yaml")
    again = config_from_dict(read_yaml(tmp_path / "config.yaml"), "saved")
    assert again == cfg
    assert config_to_dict(again) == config_to_dict(cfg)
    assert isinstance(again, RunConfig)


def test_topk_and_sparse_backward_reach_the_trainer_config() -> None:
    from ictrl.engine.run_config import trainer_kwargs

    cfg = load_config(CONFIGS / "qwen2.5-0.5b/ict.yaml", ["--method.topk=64", "--method.sparse_backward=true"])
    kwargs = trainer_kwargs(cfg)
    assert kwargs["selection_topk"] == 64 and kwargs["sparse_backward"] is True
    assert "selection_topk" not in trainer_kwargs(load_config(CONFIGS / "qwen2.5-0.5b/ict.yaml", []))
