"""``ictrl train`` builds its model as ``trl grpo`` does: ``model_init_kwargs`` and ModelConfig's keys reach
``from_pretrained``, and ``use_peft`` with the ``lora_*`` keys becomes TRL's ``get_peft_config``. Bad values stop
before the model loads; LoRA with ICT and the sparse backward trains, saves and resumes on CPU, and the statistics
pass scores the adapted model."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import yaml
from transformers import TrainerCallback

import mp_worker as w
from ictrl.core import reference as core_ref
from ictrl import cli
from rollout_helpers import _capture_stats, _full_logits, _inputs, _load
from train_cli.test_train_cli import CELL, read_metrics, tiny_overrides

def letters(prompts: Any = None, completions: Any = None, **columns: Any) -> list[float]:
    """A graded reward (the completion's share of letters), so advantages are non-zero on a random model."""
    from ictrl.rewards import completion_text

    texts = [completion_text(c) for c in completions]
    return [sum(ch.isalpha() for ch in t) / max(len(t), 1) for t in texts]


# The paper's lengths exceed the tiny model's 1,024 positions, a check that comes before the model options'.
FITS_THE_TINY_CONTEXT = ("--max_prompt_length=256", "--max_completion_length=64")
LORA = {"use_peft": True, "lora_r": 4, "lora_alpha": 8, "lora_dropout": 0.0,
        "lora_target_modules": ["q_proj", "v_proj", "down_proj"]}


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ('--model_init_kwargs={"dtype": "float64"}', "model_init_kwargs.dtype: must be one of"),
        ('--model_init_kwargs={"torch_dtype": "bfloat16"}', "model_init_kwargs.torch_dtype: transformers 5 calls it"),
        ('--model_init_kwargs={"quantization_config": {"quant_method": "nope"}}',
         "model_init_kwargs.quantization_config: Unknown quantization type, got nope"),
        ('--model_init_kwargs={"load_in_4bit": true}', "model_init_kwargs.load_in_4bit: transformers 5 takes it as"),
        ("--lora_target_modules=q_prj", "lora_target_modules[0]: the model has no module 'q_prj'; did you mean "
                                        "'q_proj'?"),
        ("--lora_r=0", "override --lora_r=0: lora_r: must be >= 1"),
        ("--lora_dropout=1.5", "override --lora_dropout=1.5: lora_dropout: must be >= 0 and < 1, got 1.5"),
    ],
)
def test_bad_model_options_fail_before_the_model_loads(override: str, message: str, loader_calls: list[Any],
                                                       tiny_model_dir: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["train", str(CELL), f"--model_name_or_path={tiny_model_dir}", f"--output_dir={tmp_path / 'o'}",
                     "--use_vllm=false", *FITS_THE_TINY_CONTEXT,
                     "--use_peft", override])
    err = capsys.readouterr().err
    assert code == 2 and message in err, err
    assert len([line for line in err.splitlines() if "error" in line]) == 1
    assert loader_calls == [] and not (tmp_path / "o").exists()


@pytest.mark.parametrize(("override", "module", "message"), [
    ('--model_init_kwargs={"quantization_config": {"load_in_4bit": true}}', "bitsandbytes",
     "model_init_kwargs.quantization_config: Using `bitsandbytes` 4-bit quantization requires bitsandbytes"),
    ("--load_in_4bit", "bitsandbytes", "load_in_4bit: Using `bitsandbytes` 4-bit quantization requires"),
    ('--model_init_kwargs={"attn_implementation": "flash_attention_2"}', "flash_attn",
     "attn_implementation: FlashAttention2"),
    ("--attn_implementation=flash_attention_2", "flash_attn", "attn_implementation: FlashAttention2"),
    ("--use_liger_kernel", "liger_kernel", "use_liger_kernel: needs the liger-kernel package"),
])
def test_a_missing_package_is_one_line_naming_it(override: str, module: str, message: str, loader_calls: list[Any],
                                                 tiny_model_dir: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    if importlib.util.find_spec(module) is not None:
        pytest.skip(f"{module} is installed here")
    code = cli.main(["train", str(CELL), f"--model_name_or_path={tiny_model_dir}", f"--output_dir={tmp_path / 'o'}",
                     "--use_vllm=false", *FITS_THE_TINY_CONTEXT,
                     "--use_peft", override])
    err = capsys.readouterr().err
    assert code == 2 and message in err, err
    assert loader_calls == []


def test_model_init_kwargs_update_model_config_as_trl_grpo(tiny_model_dir: Path) -> None:
    from ictrl.train_cli.model_init import load_kwargs
    from ictrl.train_cli.run_config import config_from_dict

    base = {"model_name_or_path": str(tiny_model_dir), "output_dir": "x"}
    kwargs = load_kwargs(config_from_dict({**base, "model_init_kwargs": {"attn_implementation": "eager",
                                                                         "revision": "v1"}}))
    assert kwargs == {"attn_implementation": "eager", "revision": "v1", "dtype": "float32", "trust_remote_code": False}
    kwargs = load_kwargs(config_from_dict({**base, "dtype": "bfloat16", "attn_implementation": "sdpa"}))
    assert (kwargs["dtype"], kwargs["attn_implementation"]) == ("bfloat16", "sdpa")  # ModelConfig's keys
    assert load_kwargs(config_from_dict({**base, "model_init_kwargs": '{"dtype": "float16"}'}))["dtype"] == "float16"
    kwargs = load_kwargs(config_from_dict({**base, "dtype": "bfloat16", "model_init_kwargs": {"dtype": "float16"}}))
    assert kwargs["dtype"] == "float16"  # trl grpo: model_init_kwargs update ModelConfig's values
    assert load_kwargs(config_from_dict({**base, "trust_remote_code": True}))["trust_remote_code"] is True

    from ictrl.models import load_model_and_tokenizer

    kwargs = load_kwargs(config_from_dict({**base, "model_init_kwargs": {"dtype": "bfloat16",
                                                                         "attn_implementation": "eager"}}))
    model, _ = load_model_and_tokenizer(str(tiny_model_dir), **kwargs)
    assert model.dtype == torch.bfloat16 and model.config._attn_implementation == "eager"


def test_peft_section_round_trips_and_turns_off(tiny_model_dir: Path, tmp_path: Path) -> None:
    from ictrl.train_cli.model_init import peft_config
    from ictrl.train_cli.run_config import config_from_dict, load_config, save_config

    cfg = config_from_dict({"model_name_or_path": str(tiny_model_dir), "output_dir": "x", **LORA})
    lora = peft_config(cfg)
    assert (lora.r, lora.lora_alpha, lora.lora_dropout, lora.task_type) == (4, 8, 0.0, "CAUSAL_LM")
    assert set(lora.target_modules) == {"q_proj", "v_proj", "down_proj"} and not lora.use_dora
    save_config(cfg, tmp_path / "c.yaml")
    assert load_config(tmp_path / "c.yaml") == cfg
    assert peft_config(load_config(tmp_path / "c.yaml", ["--use_peft=false"])) is None  # a base file's LoRA, off
    assert peft_config(config_from_dict({"model_name_or_path": "m", "output_dir": "x"})) is None
    lora = peft_config(config_from_dict({"model_name_or_path": "m", "output_dir": "x", "use_peft": True,
                                         "lora_target_modules": ["all-linear"], "use_dora": True, "use_rslora": True}))
    assert lora.target_modules == "all-linear" and lora.use_dora and lora.use_rslora  # TRL's get_peft_config


class Snapshots(TrainerCallback):
    """The trainable (adapter) and frozen (base) parameters at the start and the end of training, and the
    attention implementation and dtype of the model the trainer got."""

    def __init__(self) -> None:
        self.begin: dict[str, torch.Tensor] = {}
        self.end: dict[str, torch.Tensor] = {}
        self.attn: str | None = None
        self.trainable: set[str] = set()

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self.begin = {n: p.detach().clone() for n, p in model.named_parameters()}
        self.trainable = {n for n, p in model.named_parameters() if p.requires_grad}
        self.attn = model.config._attn_implementation

    def on_train_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self.end = {n: p.detach().clone() for n, p in model.named_parameters()}


def _lora_cell(tmp_path: Path) -> Path:
    cell = tmp_path / "lora.yaml"
    cell.write_text(yaml.safe_dump({"base": str(CELL), **LORA, "sparse_backward": True,
                                    "model_init_kwargs": {"attn_implementation": "eager"}}))
    return cell


def _adapter(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(directory / "adapter_model.safetensors"))


@pytest.mark.integration
def test_lora_trains_saves_and_resumes_from_a_yaml_peft_section(tiny_model_dir: Path, shared_data: Path,
                                                                tmp_path: Path) -> None:
    from ictrl.train_cli.run import train
    from ictrl.train_cli.run_config import load_config
    from ictrl.models import load_model_and_tokenizer

    cell = _lora_cell(tmp_path)
    out, straight = tmp_path / "out", tmp_path / "straight"
    lr = ["--learning_rate=1e-2", "--warmup_steps=0", "--reward_funcs=test_lora:letters"]
    snap = Snapshots()
    cfg = load_config(cell, [*tiny_overrides(tiny_model_dir, out), *lr])
    assert cfg.trainer["token_selector"] == "ict" and cfg.trainer["sparse_backward"] is True
    result = train(cfg, source=str(cell), callbacks=[snap])
    assert result.global_step == 2 and snap.attn == "eager"
    assert snap.trainable and all("lora_" in n for n in snap.trainable)
    changed = {n for n in snap.trainable if not torch.equal(snap.begin[n], snap.end[n])}
    assert changed == snap.trainable
    frozen = set(snap.begin) - snap.trainable
    assert frozen and all(torch.equal(snap.begin[n], snap.end[n]) for n in frozen)
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2] and all(r["ictrl/selected_frac"] < 1 for r in rows)

    # checkpoints hold the adapter; output_dir the merged model (what ictrl eval reads) and output_dir/adapter
    assert (out / "checkpoint-1" / "adapter_model.safetensors").is_file()
    assert (result.final_model / "model.safetensors").is_file()
    merged, tokenizer = load_model_and_tokenizer(str(result.final_model))
    from peft import PeftModel

    base, _ = load_model_and_tokenizer(str(tiny_model_dir))
    adapted = PeftModel.from_pretrained(base, str(result.final_model / "adapter"))
    ids = tokenizer(["Q: 3+4=A:"], return_tensors="pt")["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(merged(ids).logits, adapted(ids).logits, atol=1e-5, rtol=1e-5)
        with adapted.disable_adapter():
            assert (adapted(ids).logits - merged(ids).logits).abs().max() > 1e-3  # the adapter did something

    # --resume continues from checkpoint-2's adapter: 2 steps + 1 resumed = 3 uninterrupted steps
    resumed = train(load_config(cell, [*tiny_overrides(tiny_model_dir, out, steps=3), *lr]), resume=True,
                    source=str(cell))
    assert resumed.global_step == 3 and resumed.resumed_from == out / "checkpoint-2"
    train(load_config(cell, [*tiny_overrides(tiny_model_dir, straight, steps=3), *lr]), source=str(cell))
    a, b = _adapter(out / "checkpoint-3"), _adapter(straight / "checkpoint-3")
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    two = _adapter(out / "checkpoint-2")
    assert any(not torch.equal(a[k], two[k]) for k in a)  # the resumed step trained


@pytest.mark.parametrize("path", ["separate", "training_forward"])
def test_statistics_pass_scores_the_adapted_model(tiny_model_dir: Path, tmp_path: Path, path: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The group JS the trainer computes equals a float64 reference from the merged model's logits, and differs
    from the base model's: the adapter is in the statistics pass, on its own pass and in the loss's forward."""
    from peft import LoraConfig

    from ictrl.engine import stats_source
    from ictrl.engine.loss_inputs import model_inputs
    from ictrl.engine.stats_source import STATS_PATHS
    from ictrl.engine.trainer import ICTGRPOTrainer

    model, tokenizer = _load(tiny_model_dir)
    # random A and B (peft's init_lora_weights=False): the adapter changes the model before any step
    lora = LoraConfig(task_type="CAUSAL_LM", r=4, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"],
                      init_lora_weights=False)
    trainer = ICTGRPOTrainer(model=model, reward_funcs=w.digit_reward, train_dataset=w.make_dataset(),
                             processing_class=tokenizer, peft_config=lora,
                             args=w.make_config(tmp_path, token_selector="ict", temperature=0.8, sparse_backward=True))
    if path == "separate":
        w.separate_pass(trainer)
    calls = _capture_stats(trainer)  # the separate pass: the batch in generation order
    seen: list[tuple[Any, Any, Any]] = []
    original = stats_source.hidden_stats

    def recording(head: Any, hidden: Any, request: Any, sweep: Any) -> Any:
        stats, js = original(head, hidden, request, sweep)
        seen.append((request.mask, request.group_ids, js))
        return stats, js

    monkeypatch.setattr(stats_source, "hidden_stats", recording)  # the separate pass and the loss's forward alike
    trainer.model.train()
    inputs = trainer._prepare_inputs(_inputs(trainer))
    if path == "training_forward":
        trainer._compute_loss(trainer.model, inputs)
        tokens = model_inputs(inputs)  # the loss's micro-batch, in its own row order
    else:
        (call,) = calls
        tokens = call["inputs"]
    assert trainer._metrics["train"]["ictrl/stats_path"] == [STATS_PATHS[path]]
    ((mask, groups, js),) = seen
    merged = copy.deepcopy(trainer.model).merge_and_unload().eval()
    exact = core_ref.group_js(_full_logits(SimpleNamespace(model=merged), tokens, mask.size(1)), mask, groups, 0.8)
    torch.testing.assert_close(js.double(), exact, atol=2e-6, rtol=1e-4)
    with trainer.model.disable_adapter():
        base = core_ref.group_js(_full_logits(trainer, tokens, mask.size(1)), mask, groups, 0.8)
    assert float((base - exact)[mask].abs().max()) > 1e-3


def test_vllm_gets_the_merged_adapter(tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """TRL's colocated weight sync of a LoRA model (merge, strip peft's names, unmerge), run over the fake vLLM
    0.31 engine: the engine then holds the merged weights and the trainer's model is unmerged again."""
    from peft import LoraConfig

    from fixtures import fake_vllm
    from ictrl.engine.trainer import ICTGRPOTrainer

    fake_vllm.install(monkeypatch)
    model, tokenizer = _load(tiny_model_dir)
    lora = LoraConfig(task_type="CAUSAL_LM", r=4, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                      init_lora_weights=False)
    trainer = ICTGRPOTrainer(model=model, reward_funcs=w.digit_reward, train_dataset=w.make_dataset(),
                             processing_class=tokenizer, peft_config=lora,
                             args=w.make_config(tmp_path, token_selector="ict", use_vllm=True, vllm_mode="colocate"))
    trainer.model.train()
    trainer._generate_and_score_completions(_inputs(trainer))
    engine = dict(trainer.vllm_generation.llm.model.named_parameters())
    merged = dict(copy.deepcopy(trainer.model).merge_and_unload().named_parameters())
    assert engine.keys() == merged.keys() and trainer.vllm_generation.llm.weights.loaded == set(engine)
    assert all(torch.allclose(engine[n], merged[n], atol=1e-6) for n in engine)
    base = dict(trainer.model.get_base_model().named_parameters())
    q = "model.layers.0.self_attn.q_proj"
    assert not torch.allclose(base[f"{q}.base_layer.weight"], engine[f"{q}.weight"], atol=1e-4)  # adapter merged
