"""A ``trl grpo --config`` file runs unchanged under ``ictrl train``: TRL's own script (``trl.scripts.grpo``, run
in-process) and ``ictrl train`` resolve the same ``GRPOConfig`` and ``ModelConfig``, draw the same first batch and,
trained two steps on a reward that varies, save bit-identical weights where TRL saves them (``output_dir``): a file
without ``token_selector`` is TRL's GRPO. The same file with ``--token_selector=ict`` trains with ICT. The tiny
embedded model and a local jsonl dataset directory: no network."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REWARD = "def length_reward(completions, **kwargs):\n    return [float(len(str(c))) for c in completions]\n"


class Started(Exception):
    """Raised by the patched ``train``: the trainer is built and about to train."""

    def __init__(self, trainer: Any) -> None:
        super().__init__("started")
        self.trainer = trainer


def trl_file(tmp_path: Path, model_dir: Path, max_steps: int = 1) -> Path:
    """A file as a TRL user writes it for ``trl grpo`` (no ictrl key): a dataset directory, a dotted reward, LoRA
    off, CPU."""
    data = tmp_path / "digits"
    data.mkdir()
    rows = [{"prompt": f"{a}+{b}=", "solution": str(a + b)} for a in range(4) for b in range(4)]
    (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "parity_rewards.py").write_text(REWARD)
    config = tmp_path / "grpo.yaml"
    config.write_text(yaml.safe_dump({
        "model_name_or_path": str(model_dir), "dtype": "float32", "dataset_name": str(data),
        "dataset_train_split": "train", "reward_funcs": ["parity_rewards.length_reward"],
        "output_dir": str(tmp_path / "out"), "per_device_train_batch_size": 4, "num_generations": 4,
        "max_completion_length": 8, "max_steps": max_steps, "learning_rate": 1e-5, "seed": 7, "logging_steps": 1,
        "scale_rewards": False, "use_cpu": True, "bf16": False, "report_to": "none", "save_strategy": "no",
        "disable_tqdm": True,
    }))
    return config


def first_batch(trainer: Any) -> list[Any]:
    return [row["prompt"] for row in next(iter(trainer.get_train_dataloader()))]


def run_trl(config: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any, Any]:
    """TRL's ``trl grpo --config FILE`` in-process, stopped when training starts: (GRPOConfig, trainer, ModelConfig)."""
    import trl
    from trl.scripts import grpo

    with monkeypatch.context() as patch:
        patch.setattr(trl.GRPOTrainer, "train", lambda self, **_: (_ for _ in ()).throw(Started(self)))
        parser = grpo.make_parser()
        # ictrl's keys are not TRL's: TRL's own parser reports them as unknown, which trl grpo tolerates
        script, args, model, mixture = parser.parse_args_and_config(["--config", str(config)],
                                                                    fail_with_unknown_args=False)
        with pytest.raises(Started) as started:
            grpo.main(script, args, model, mixture)
    return args, started.value.trainer, model


def run_ictrl(config: Path, monkeypatch: pytest.MonkeyPatch, *flags: str) -> tuple[Any, Any, Any]:
    import trl

    from ictrl.train_cli.run import train
    from ictrl.train_cli.run_config import load_config

    cfg = load_config(config, list(flags))
    with monkeypatch.context() as patch:
        patch.setattr(trl.GRPOTrainer, "train", lambda self, **_: (_ for _ in ()).throw(Started(self)))
        with pytest.raises(Started) as started:
            train(cfg, source=str(config))
    return started.value.trainer.args, started.value.trainer, cfg.model


@pytest.mark.integration
def test_trl_grpo_and_ictrl_train_start_the_same_run(tiny_model_dir: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from trl import GRPOConfig

    config = trl_file(tmp_path, tiny_model_dir)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    try:
        trl_args, trl_trainer, trl_model = run_trl(config, monkeypatch)
        ours, trainer, model = run_ictrl(config, monkeypatch)
    finally:
        sys.modules.pop("parity_rewards", None)
    assert type(trainer).__mro__[-len(type(trl_trainer).__mro__):] == type(trl_trainer).__mro__  # a GRPOTrainer
    skip = {"model_init_kwargs"}  # trl grpo fills it with ModelConfig's values; ictrl loads the model with them
    differ = {f.name: (getattr(trl_args, f.name), getattr(ours, f.name)) for f in dataclasses.fields(GRPOConfig)
              if f.name not in skip and getattr(trl_args, f.name) != getattr(ours, f.name)}
    assert differ == {}
    assert trl_args.scale_rewards == ours.scale_rewards == "none"  # the file's `false`, as TRL reads it
    assert dataclasses.asdict(trl_model) == dataclasses.asdict(model)
    assert [f.__name__ for f in trl_trainer.reward_funcs] == [f.__name__ for f in trainer.reward_funcs]
    assert trl_trainer.train_dataset[:] == trainer.train_dataset[:]
    assert first_batch(trl_trainer) == first_batch(trainer) and len(first_batch(trainer)) == 4
    assert all(p.dtype == q.dtype for p, q in zip(trl_trainer.model.parameters(), trainer.model.parameters()))


@pytest.mark.integration
def test_the_same_file_trains_with_ict(tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ictrl import cli

    config = trl_file(tmp_path, tiny_model_dir)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    try:
        code = cli.main(["train", str(config), "--token_selector=ict", "--selection_warmup_steps=0"])
    finally:
        sys.modules.pop("parity_rewards", None)
    assert code == 0
    rows = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1]
    assert rows[0]["ictrl/tokens/selected"] == 4  # ceil(0.1 n) = 1 token of each of the 4 responses of <= 8 tokens
    assert rows[0]["ictrl/tokens/selected"] < rows[0]["ictrl/tokens/all"]


@pytest.mark.integration
def test_a_plain_trl_file_trains_as_trl_grpo_bit_for_bit(tiny_model_dir: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """Two steps of ``trl grpo`` and of ``ictrl train`` on the unchanged file: the same weights to the bit, both
    loadable from ``output_dir`` as TRL leaves it; ictrl's first line names the method and how to get ICT, and
    its model card names the base model, the method and the command."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.scripts import grpo

    from ictrl import cli

    config = trl_file(tmp_path, tiny_model_dir, max_steps=2)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    try:
        parser = grpo.make_parser()
        script, args, model, mixture = parser.parse_args_and_config(
            ["--config", str(config), "--output_dir", str(tmp_path / "trl")], fail_with_unknown_args=False)
        grpo.main(script, args, model, mixture)
        code = cli.main(["train", str(config)])
    finally:
        sys.modules.pop("parity_rewards", None)
    err = capsys.readouterr().err
    assert code == 0, err
    first = next(line for line in err.splitlines() if "ictrl.train" in line)
    assert "method: TRL's GRPO (token_selector: all, the default" in first and "--token_selector=ict" in first
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path / "trl").state_dict()
    ours = AutoModelForCausalLM.from_pretrained(tmp_path / "out").state_dict()
    AutoTokenizer.from_pretrained(tmp_path / "out")
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    sides = [{k: v for k, v in json.loads((tmp_path / d / "tokenizer_config.json").read_text()).items()
              if k.endswith("_side")} for d in ("trl", "out")]
    assert sides[0] == sides[1] == {"padding_side": "left", "truncation_side": "left"}
    assert any(not torch.equal(ours[k], base[k]) for k in ours)  # the reward varied: the weights moved
    labels = json.loads((tmp_path / "out" / "run.json").read_text())
    assert (labels["method"], labels["method_from"], labels["loss_normalization"]) == ("grpo", "default",
                                                                                       "token_mean_all")
    card = (tmp_path / "out" / "README.md").read_text()
    assert f"base_model: {tiny_model_dir.resolve()}" in card and "None" not in card
    assert "TRL's GRPO" in card and f"ictrl train {config}" in card
    assert "`config.yaml` and `run.json` beside this file" in card and "from Python" not in card
