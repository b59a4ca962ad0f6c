"""Run-config schema: the flat keys of trl grpo (TRL's script, trainer and model dataclasses, read by TRL's parser)
plus ictrl's; every shipped config validates; flags in both forms; errors name the key and the source; the old
nested spelling names its new key; the global step shape."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
import yaml

from ictrl.train_cli.run_config import (
    ConfigError,
    RunConfig,
    config_from_dict,
    config_to_dict,
    load_config,
    read_yaml,
    save_config,
)
from ictrl.core.selection import get_selector

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
CELLS = sorted(p for p in CONFIGS.glob("qwen2.5-*/*.yaml"))
MINIMAL = {"model_name_or_path": "m", "output_dir": "o"}


def test_grid_is_complete() -> None:
    names = {str(p.relative_to(CONFIGS)) for p in CELLS}
    expected = {f"qwen2.5-{s}/{m}.yaml" for s in ("0.5b", "1.5b", "7b") for m in ("grpo", "entropy20", "stapo", "ict")}
    assert names == expected
    assert not (CONFIGS / "base" / "methods").exists()  # method defaults live in the selector registry only


@pytest.mark.parametrize("path", CELLS, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_every_cell_validates_and_builds_trainer_args(path: Path) -> None:
    from ictrl.train_cli.trainer_inputs import build_trainer_args

    cfg = load_config(path)
    size, method = path.parent.name, path.stem
    assert cfg.model.model_name_or_path.lower() == f"qwen/{size}"
    assert cfg.output_dir == f"runs/{size}/{method}"
    assert cfg.script.dataset_name == ["gsm8k_train", "math_train"] and cfg.script.reward_funcs == ["verifiable"]
    args = build_trainer_args(cfg, str(path), cpu=True)
    selector = get_selector(args.token_selector)
    assert args.selector is selector and selector.label == method
    # published values (docs/method.md §6) shared by the grid
    assert (args.learning_rate, args.temperature, args.beta) == (1e-6, 1.0, 0.0)
    assert (args.epsilon, args.epsilon_high) == (0.2, 0.28)
    assert args.use_cpu and not args.bf16 and args.use_vllm  # bf16 unset: fp32 on CPU; vLLM runs where installed
    # 32 prompts x 8 completions per optimizer step on one process
    assert args.per_device_train_batch_size * args.gradient_accumulation_steps == 256
    assert args.generation_batch_size == 256
    # the method's defaults come from its registration, nowhere else
    assert args.selection_warmup_steps == selector.warmup_steps
    assert args.loss_normalization == selector.normalization
    assert args.selector_options == selector.resolve_options()


def test_flags_in_both_forms_as_trl_reads_them() -> None:
    cell = CONFIGS / "qwen2.5-0.5b/ict.yaml"
    cfg = load_config(cell, ["--learning_rate=3e-6", "--dataset_name=[math_train]", "--selection_ratio", "0.2",
                             "--save-total-limit=1", "--use_vllm=false", "--dataset_limit=null", "--output_dir=/tmp/x",
                             "--sparse_backward", "--use_peft", "--lora_r", "8", "--lora_target_modules", "q_proj",
                             "v_proj", "--reward_funcs", "math", "format"])
    assert cfg.trainer["learning_rate"] == 3e-6 and isinstance(cfg.trainer["learning_rate"], float)
    assert cfg.script.dataset_name == ["math_train"] and cfg.script.eval_datasets  # the file's other keys stay
    assert cfg.trainer["selection_ratio"] == 0.2 and cfg.trainer["token_selector"] == "ict"
    assert cfg.trainer["save_total_limit"] == 1 and cfg.trainer["scale_rewards"] == "group"
    assert cfg.trainer["use_vllm"] is False and cfg.script.dataset_limit is None and cfg.output_dir == "/tmp/x"
    assert cfg.trainer["sparse_backward"] is True and cfg.script.reward_funcs == ["math", "format"]
    assert cfg.model.use_peft and cfg.model.lora_r == 8 and cfg.model.lora_target_modules == ["q_proj", "v_proj"]
    assert cfg.flags["learning_rate"] == "3e-06" and cfg.flags["save_total_limit"] == "1"
    assert cfg.flags["use_peft"] == "true" and "token_selector" not in cfg.flags  # the file's keys are not flags
    with pytest.raises(ConfigError, match="expected --key=value or --key value"):
        load_config(cell, ["learning_rate=1"])


def test_booleans_as_trl_reads_them() -> None:
    """A YAML bool and TRL's spellings on a flag (yes/no, true/false, 1/0) agree; scale_rewards' documented bools
    mean TRL's group / none whichever way they are written."""
    from ictrl.train_cli.trainer_inputs import build_trainer_args

    cell = CONFIGS / "qwen2.5-0.5b/grpo.yaml"
    for flag, want in (("--scale_rewards=false", "none"), ("--scale_rewards=true", "group"),
                       ("--scale_rewards=batch", "batch")):
        assert build_trainer_args(load_config(cell, [flag]), "cell", cpu=True).scale_rewards == want
    assert load_config(cell, ["--use_vllm=no"]).trainer["use_vllm"] is False
    assert load_config(cell, ["--use_vllm", "1"]).trainer["use_vllm"] is True
    with pytest.raises(ConfigError, match=r"override --scale_rewards=bogus: scale_rewards: must be one of"):
        build_trainer_args(load_config(cell, ["--scale_rewards=bogus"]), "cell", cpu=True,
                           flags={"scale_rewards": "bogus"})


def test_env_sets_variables_as_trl_parser_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ICTRL_TEST_ENV", raising=False)
    path = tmp_path / "env.yaml"
    path.write_text("model_name_or_path: m\noutput_dir: o\nenv: {ICTRL_TEST_ENV: 3}\n")
    cfg = load_config(path)
    assert "env" not in config_to_dict(cfg) and os.environ["ICTRL_TEST_ENV"] == "3"
    monkeypatch.delenv("ICTRL_TEST_ENV")


def test_old_nested_keys_name_their_new_spelling(tmp_path: Path) -> None:
    bad = tmp_path / "old.yaml"
    for text, line in (("model:\n  name_or_path: m\n", "model.name_or_path is now model_name_or_path"),
                       ("data:\n  train: [gsm8k_train]\n", "data.train is now dataset_name"),
                       ("reward:\n  names: [math]\n", "reward.names is now reward_funcs"),
                       ("peft:\n  r: 8\n", "peft.r is now lora_r"),
                       ("peft: {}\n", "the peft: section is now use_peft: true")):
        bad.write_text(text + "output_dir: o\n")
        with pytest.raises(ConfigError, match=rf"^{bad}: {line}"):
            load_config(bad)


def test_a_file_that_is_not_a_flat_mapping_is_one_line_naming_it(tmp_path: Path) -> None:
    """The file's shape (top level, base:, env:) is read_yaml's to check, each file naming itself, bases too."""
    bad, top = tmp_path / "bad.yaml", tmp_path / "top.yaml"
    top.write_text("base: bad.yaml\nmodel_name_or_path: m\noutput_dir: o\n")
    for text, line in (("- a\n- b\n", "top level must be a mapping of keys, got list"),
                       ("env: 3\n", "env: expected a mapping of environment variables, got 3"),
                       ("env: [A]\n", "env: expected a mapping of environment variables, got ['A']"),
                       ("base: 3\n", "base: expected a config file or a list of them, got 3"),
                       ("base: [a.yaml, 3]\n", "base: expected a config file or a list of them, got ['a.yaml', 3]"),
                       ("data:\n  train: [x]\n", "data.train is now dataset_name")):
        bad.write_text(text)
        for path in (bad, top):  # the file itself, and as another file's base
            with pytest.raises(ConfigError, match=rf"^{bad}: {re.escape(line)}"):
                load_config(path)


def test_mixture_list_and_name() -> None:
    cfg = config_from_dict({**MINIMAL, "dataset_name": {"gsm8k_train": 1, "math_train": 3}})
    assert cfg.script.dataset_name == {"gsm8k_train": 1, "math_train": 3}
    assert cfg.script.sources() == ["gsm8k_train", "math_train"]
    cfg = config_from_dict(MINIMAL, flags=["--dataset_name=math_train"])
    assert cfg.script.dataset_name == "math_train" and cfg.script.sources() == ["math_train"]
    cfg = config_from_dict(MINIMAL, flags=["--dataset_name={gsm8k_train: 1, math_train: 2}"])
    assert cfg.script.dataset_name == {"gsm8k_train": 1, "math_train": 2}
    with pytest.raises(ConfigError, match=r"dataset_name\.math_train: mixture weight must be a finite number > 0, got 0"):
        config_from_dict({**MINIMAL, "dataset_name": {"math_train": 0}})


@pytest.mark.parametrize(
    ("override", "pattern"),
    [
        ("--learning_rat=1e-6", r"override --learning_rat: unknown key 'learning_rat'; "
                                r"did you mean 'learning_rate'\?"),
        ("--data.train=x", r"unknown key 'data.train'; it is now dataset_name"),
        ("--peft=null", r"^override --peft: unknown key 'peft'; it is now use_peft: true"),
        ("--datset_name=x", r"unknown key 'datset_name'; did you mean 'dataset_name'"),
        ("--selection_topk_source=sampler", r"^override --selection_topk_source: unknown key 'selection_topk_source'; "
                                            r"removed: the top-K of selection_topk now always comes from the LM head$"),
        ("--learning_rate=abc", r"override --learning_rate: learning_rate: invalid float value: 'abc'"),
        ("--num_generations=1.5", r"num_generations: invalid int value"),
        ("--use_vllm=maybe", r"override --use_vllm: use_vllm: Truthy value expected: got maybe"),
        ("--dtype=fp8", r"override --dtype: dtype: invalid choice: 'fp8'"),
        ("--lora_rank=4", r"unknown key 'lora_rank'; did you mean 'lora_r'\?"),
        ("--use_pef", r"unknown key 'use_pef'; did you mean 'use_peft'\?"),
        ("--datasets=x", r"override --datasets=.*: datasets: expected a list of mappings \(path: ..., data_files"),
        ("--lora_r=x", r"override --lora_r: lora_r: invalid int value: 'x'"),
        ("--max_prompt_length=0", r"override --max_prompt_length=0: max_prompt_length: must be >= 1, got 0"),
    ],
)
def test_bad_flag_names_the_flag_and_key(override: str, pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        load_config(CONFIGS / "qwen2.5-0.5b/ict.yaml", [override])


def test_unrelated_fields_are_never_suggested() -> None:
    """A near spelling is offered only within its family (lora_*), or when it is nearly the same word."""
    from ictrl.train_cli.run_config import _suggest

    assert _suggest("use_peftt") == "; did you mean 'use_peft'?"
    for key in ("use_pef", "lora_rnk", "lora_target_module", "attn_implementaton"):
        assert _suggest(key).startswith("; did you mean") and "cpu" not in _suggest(key)
    assert "local_rank" not in _suggest("lora_rank") and "optim" not in _suggest("lora_target_module")
    assert "cache" not in _suggest("attn_implementaton")


@pytest.mark.parametrize(
    ("override", "pattern"),
    [
        ("--token_selector=ictt", r"token_selector: unknown selector 'ictt'; did you mean 'ict'\?"),
        ("--selection_scope=group", r"selection_scope: scope must be one of \['batch', 'response'\]"),
        ("--selection_ratio=0", r"selection_ratio: ratio must be a number in \(0, 1\]"),
        ("--selection_topk=0", r"selection_topk: must be >= 1, got 0"),
        ('--selection_options={"tau_p": 0.1}', r"selection_options: unknown option\(s\) \['tau_p'\]"),
        ("--per_device_train_batch_size=7", r"per_device_train_batch_size=7 must divide the 256 completions"),
    ],
)
def test_trainer_config_errors_name_the_file_and_field(override: str, pattern: str) -> None:
    from ictrl.train_cli.trainer_inputs import build_trainer_args

    cell = CONFIGS / "qwen2.5-0.5b/entropy20.yaml"
    cfg = load_config(cell, [override])
    with pytest.raises(ConfigError, match=rf"^{cell}: {pattern}"):
        build_trainer_args(cfg, str(cell), cpu=True)


def test_bad_value_in_file_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"base: {CONFIGS / 'qwen2.5-0.5b/ict.yaml'}\nnum_iterations: two\n")
    with pytest.raises(ConfigError, match=rf"^{bad}: num_iterations: invalid int value: 'two'"):
        load_config(bad)
    bad.write_text("model_name_or_path: m\noutput_dir: o\nmodel_name_or_pth: x\n")
    with pytest.raises(ConfigError, match=rf"{bad}: unknown key 'model_name_or_pth'; did you mean 'model_name_or_path"):
        load_config(bad)
    bad.write_text("model_name_or_path: m\noutput_dir: o\nlearning_rate: [1]\n")
    with pytest.raises(ConfigError, match=rf"{bad}: learning_rate: "):
        load_config(bad)
    bad.write_text("output_dir: o\n")
    with pytest.raises(ConfigError, match=r"missing required key model_name_or_path"):
        load_config(bad)
    bad.write_text("model_name_or_path: m\n")  # trl grpo's output_dir: TrainingArguments' default
    assert load_config(bad).output_dir == "trainer_output"
    bad.write_text("base: bad.yaml\n")
    with pytest.raises(ConfigError, match="inheritance cycle"):
        load_config(bad)


@pytest.mark.parametrize(("line", "said"), [
    ("learning_rate: null", "learning_rate: expected float, got null"),
    ("max_steps: true", "max_steps: expected int, got true"),
    ("learning_rate: {a: 1}", "learning_rate: expected float, got {'a': 1}"),
    ("dataset_limit: [1, 2]", "dataset_limit: expected int | None, got [1, 2]"),
    ("scale_rewards: false", None),  # a str field TRL documents as taking a bool too: kept as written
])
def test_a_file_value_of_the_wrong_form_names_the_key(tmp_path: Path, line: str, said: str | None) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"model_name_or_path: m\noutput_dir: o\n{line}\n")
    if said is None:
        assert load_config(bad).trainer["scale_rewards"] is False
        return
    with pytest.raises(ConfigError) as raised:
        load_config(bad)
    assert str(raised.value) == f"{bad}: {said}"


def test_checkpoint_inside_a_generation_buffer_is_refused() -> None:
    from ictrl.train_cli.trainer_inputs import trainer_args

    cfg = load_config(CONFIGS / "qwen2.5-0.5b/ict.yaml", ["--num_iterations=2", "--save_steps=3"])
    with pytest.raises(ConfigError, match=r"save_steps: 3 optimizer steps"):
        trainer_args(cfg, "x.yaml", cpu=True)


def test_roundtrip(tmp_path: Path) -> None:
    cfg = load_config(CONFIGS / "qwen2.5-1.5b/grpo.yaml", ["--epsilon_high=null", "--save_strategy=no", "--use_peft",
                                                           "--lora_target_modules", "q_proj", "--dataset_limit=9"])
    save_config(cfg, tmp_path / "config.yaml")
    again = config_from_dict(read_yaml(tmp_path / "config.yaml"), "saved")
    assert again.model.lora_target_modules == "q_proj" and again.script.dataset_limit == 9
    assert again == cfg and isinstance(again, RunConfig)
    assert config_to_dict(again) == config_to_dict(cfg)
    from ictrl.train_cli.trainer_inputs import build_trainer_args

    args = build_trainer_args(again, "saved", cpu=True)
    assert args.epsilon_high is None and args.epsilon == 0.2  # null: TRL clips symmetrically at epsilon
    assert args.token_selector == "all" and args.selection_ratio is None and args.loss_normalization == \
        "per_response_all"


# --- the global step shape ------------------------------------------------------------------------------------


def test_step_shape_arithmetic() -> None:
    from ictrl.engine.config import step_shape

    for processes, (micro, accumulation) in {1: (16, 16), 2: (16, 8), 8: (16, 2), 16: (16, 1), 32: (8, 1)}.items():
        assert step_shape(32, 8, processes, 16) == (micro, accumulation)
        assert micro * accumulation * processes == 256  # the same completions per optimizer step
        assert micro * accumulation % 8 == 0  # whole prompt groups on each process
    assert step_shape(4, 2, 1, 8) == (8, 1)
    with pytest.raises(ValueError, match=r"prompts_per_step=32 must be a multiple of the number of processes \(3\)"):
        step_shape(32, 8, 3, 16)
    with pytest.raises(ValueError, match=r"per_device_train_batch_size=12 must divide the 128 completions"):
        step_shape(32, 8, 2, 12)


@pytest.mark.parametrize("processes", [1, 2])
def test_same_yaml_same_completions_per_step(processes: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The paper cell on 1 or 2 processes (simulated world size): 256 completions per optimizer step."""
    import ictrl.engine.config
    from ictrl.train_cli.trainer_inputs import build_trainer_args

    monkeypatch.setattr(ictrl.engine.config, "process_count", lambda: processes)
    args = build_trainer_args(load_config(CONFIGS / "qwen2.5-1.5b/ict.yaml"), "cell", cpu=True)
    assert args.per_device_train_batch_size == 16
    assert args.gradient_accumulation_steps == 16 // processes
    assert args.per_device_train_batch_size * args.gradient_accumulation_steps * processes == 256
    assert args.steps_per_generation == args.gradient_accumulation_steps  # one generation batch per step
    with pytest.raises(ConfigError, match="leave gradient_accumulation_steps and generation_batch_size unset"):
        build_trainer_args(load_config(CONFIGS / "qwen2.5-1.5b/ict.yaml", ["--gradient_accumulation_steps=2"]),
                           "cell", cpu=True)


def test_process_count_reads_world_size(monkeypatch: pytest.MonkeyPatch) -> None:
    from accelerate import PartialState

    from ictrl.engine.config import process_count

    monkeypatch.setattr(PartialState, "_shared_state", {})  # as before accelerate starts (restored after)
    monkeypatch.setenv("WORLD_SIZE", "8")
    assert process_count() == 8
    monkeypatch.delenv("WORLD_SIZE")
    assert process_count() == 1


# --- custom selectors by module:function ----------------------------------------------------------------------


def test_custom_selector_by_module_function(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ictrl.train_cli.trainer_inputs import build_trainer_args
    from ictrl.core.selection import SELECTORS

    (tmp_path / "my_selectors.py").write_text(
        "from ictrl.core.selection import register_selector\n\n"
        "@register_selector('first_token_test', warmup_steps=3)\n"
        "def first(inputs, *, count: int = 1):\n"
        "    '''the first COUNT tokens'''\n"
        "    return inputs.mask.cumsum(1) <= count\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        cfg = config_from_dict({**MINIMAL, "token_selector": "my_selectors:first",
                                "selection_options": {"count": 2}})
        args = build_trainer_args(cfg, "custom", cpu=True)
        assert args.selection_warmup_steps == 3 and args.selector_options == {"count": 2}
        assert get_selector("my_selectors:first") is SELECTORS["first_token_test"]
        with pytest.raises(ConfigError, match=r"custom: token_selector: selector 'my_selectors:nope': cannot import"):
            build_trainer_args(config_from_dict({**MINIMAL, "token_selector": "my_selectors:nope"}), "custom",
                               cpu=True)
    finally:
        SELECTORS.pop("first_token_test", None)
        sys.modules.pop("my_selectors", None)


# --- which method a file runs -------------------------------------------------------------------------------


def test_a_file_without_token_selector_is_trls_grpo_and_says_so(tmp_path: Path) -> None:
    from ictrl.train_cli.trainer_inputs import build_trainer_args
    from ictrl.engine.model_card import resolved_method
    from ictrl.train_cli.run import method_line

    plain = config_from_dict(dict(MINIMAL), "plain.yaml")
    assert plain.trainer["token_selector"] == "all" and plain.method_from == "default"
    args = build_trainer_args(plain, "plain.yaml", cpu=True)
    assert resolved_method(args) == {"method": "grpo", "token_selector": "all", "selection_ratio": None,
                                     "selection_scope": None, "selection_warmup_steps": 0,
                                     "loss_normalization": "token_mean_all", "loss_type": "dapo"}  # TRL's dapo
    line = method_line(plain, "plain.yaml")
    assert line.startswith("method: TRL's GRPO (token_selector: all, the default: plain.yaml sets no")
    assert "--token_selector=ict" in line
    ict = config_from_dict({**MINIMAL, "token_selector": "ict"}, "ict.yaml")
    assert ict.method_from == "file" and method_line(ict, "ict.yaml") == \
        "method: ict (token_selector: ict, from ict.yaml)"
    assert resolved_method(build_trainer_args(ict, "ict.yaml", cpu=True))["loss_normalization"] == \
        "per_response_selected"
    flag = config_from_dict(dict(MINIMAL), "plain.yaml", ["--token-selector", "stapo"])
    assert flag.method_from == "flag" and "from --token_selector=stapo" in method_line(flag, "plain.yaml")
    save_config(plain, tmp_path / "config.yaml")  # the resolved method is written: a resume compares it
    assert read_yaml(tmp_path / "config.yaml")["token_selector"] == "all"


def test_every_config_of_the_project_names_its_method() -> None:
    """No file in configs/ that trains changes method under the default: each sets token_selector."""
    files = [p for p in CONFIGS.rglob("*.yaml") if "accelerate" not in p.parts and "base" not in p.parts]
    assert files and all("token_selector" in read_yaml(p) for p in files), files


def test_print_config_shows_the_resolved_method(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ictrl import cli

    config = tmp_path / "plain.yaml"
    config.write_text(yaml.safe_dump({**MINIMAL, "dataset_name": "gsm8k_train"}))
    assert cli.main(["train", "--learning-rate=1e-5", str(config), "--print-config"]) == 0
    out = capsys.readouterr().out
    assert "# resolved method (token_selector from the default, as the file sets none: TRL's GRPO):" in out
    assert "#   loss_normalization: token_mean_all" in out and "#   selection_warmup_steps: 0" in out
    printed = yaml.safe_load(out)
    assert printed["token_selector"] == "all" and printed["learning_rate"] == 1e-5


def test_the_saved_config_holds_no_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``hub_token`` and a ``token`` in ``model_init_kwargs`` (from_pretrained's) are left out of config.yaml, and a
    comment names them: a resume is given them again."""
    cfg = config_from_dict({**MINIMAL, "hub_token": "hf_secret_1",
                            "model_init_kwargs": {"token": "hf_secret_2", "revision": "main"}}, "plain.yaml")
    save_config(cfg, tmp_path / "config.yaml")
    text = (tmp_path / "config.yaml").read_text()
    assert "hf_secret" not in text and text.startswith("# not written here (secrets; give them again to resume): "
                                                       "hub_token\n")
    saved = read_yaml(tmp_path / "config.yaml")
    assert "hub_token" not in saved and saved["model_init_kwargs"] == {"revision": "main"}
    monkeypatch.setenv("HF_TOKEN", "")  # restored after the test: the file's env: sets it
    (tmp_path / "run.yaml").write_text("model_name_or_path: m\noutput_dir: o\nenv:\n  HF_TOKEN: hf_secret_3\n")
    save_config(load_config(tmp_path / "run.yaml"), tmp_path / "config.yaml")  # env: sets variables, never written
    assert "hf_secret" not in (tmp_path / "config.yaml").read_text()


def test_model_init_kwargs_given_as_json_is_read_where_it_enters_and_its_secret_is_not_saved(tmp_path: Path) -> None:
    """TRL's command line gives ``model_init_kwargs`` as a JSON string: the run config holds it as the mapping every
    reader takes (read once, where the value enters), so config.yaml leaves its ``token`` out as it does a mapping's;
    text that is no JSON object is one line naming the flag."""
    token = "hf_secret_json"
    cfg = config_from_dict(MINIMAL, "plain.yaml",
                           [f'--model_init_kwargs={{"token": "{token}", "attn_implementation": "eager"}}'])
    assert cfg.trainer["model_init_kwargs"] == {"token": token, "attn_implementation": "eager"}
    save_config(cfg, tmp_path / "config.yaml")
    assert token not in (tmp_path / "config.yaml").read_text()
    assert read_yaml(tmp_path / "config.yaml")["model_init_kwargs"] == {"attn_implementation": "eager"}
    for given, said in (("{not json", "not a JSON object"), ("[1, 2]", "expected a mapping of from_pretrained")):
        with pytest.raises(ConfigError) as refused:
            config_from_dict(MINIMAL, "plain.yaml", [f"--model_init_kwargs={given}"])
        assert str(refused.value).startswith("override --model_init_kwargs=") and said in str(refused.value)
