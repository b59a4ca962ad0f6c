from pathlib import Path

import pytest
import torch

from ictrl.models import build_byte_tokenizer, load_model_and_tokenizer


def test_byte_tokenizer_reloads_with_identical_ids(tiny_model_dir: Path) -> None:
    _, reloaded = load_model_and_tokenizer(str(tiny_model_dir))
    built = build_byte_tokenizer()
    text = "Q: 23+4*5=? héllo \\boxed{43}\n<|im_end|>"
    assert reloaded(text).input_ids == built(text).input_ids
    assert reloaded.decode(reloaded(text).input_ids) == text
    assert len(reloaded) == 259
    assert reloaded.eos_token == "<|im_end|>"
    chat = reloaded.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert chat.endswith("<|im_start|>assistant\n")


def test_tiny_model_loads_on_cpu_in_fp32_and_generates(tiny_model_dir: Path) -> None:
    model, tok = load_model_and_tokenizer(str(tiny_model_dir))
    assert next(model.parameters()).dtype == torch.float32
    assert tok.padding_side == "left"
    enc = tok(["1+1=", "22"], return_tensors="pt", padding=True)
    out = model.generate(**enc, max_new_tokens=4, do_sample=False)
    assert out.shape[0] == 2 and enc.input_ids.shape[1] < out.shape[1] <= enc.input_ids.shape[1] + 4


def test_directory_without_config_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_model_and_tokenizer(str(tmp_path))


# Published config.json values of Qwen/Qwen2.5-0.5B, Qwen/Qwen2.5-1.5B and Qwen/Qwen2.5-7B (Hugging Face hub),
# and the parameter counts their model cards state (total / non-embedding, in billions).
PUBLISHED = {
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True, rope_theta=1000000.0,
                         rms_norm_eps=1e-06, hidden_act="silu", max_position_embeddings=32768),
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True, rope_theta=1000000.0,
                         rms_norm_eps=1e-06, hidden_act="silu", max_position_embeddings=131072),
    "qwen2.5-7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False, rope_theta=1000000.0,
                       rms_norm_eps=1e-06, hidden_act="silu", max_position_embeddings=131072),
}
MODEL_CARD_PARAMS = {"qwen2.5-0.5b": (0.49, 0.36), "qwen2.5-1.5b": (1.54, 1.31), "qwen2.5-7b": (7.61, 6.53)}


@pytest.mark.parametrize("shape", sorted(PUBLISHED))
def test_real_shape_config_matches_the_published_config(shape: str) -> None:
    from ictrl.models import real_shape_config

    config = real_shape_config(shape)
    for field, value in PUBLISHED[shape].items():
        got = config.rope_parameters["rope_theta"] if field == "rope_theta" else getattr(config, field)
        assert got == value, (shape, field, got, value)
    assert not config.use_sliding_window and set(config.layer_types) == {"full_attention"}


@pytest.mark.parametrize("shape", sorted(PUBLISHED))
def test_real_shape_on_meta_has_the_model_cards_parameter_counts(shape: str) -> None:
    from ictrl.models import build_real_shape

    model, tok = build_real_shape(shape, device="meta")
    total = sum(p.numel() for p in model.parameters())  # a tied head is one parameter, counted once
    embed = model.model.embed_tokens.weight.numel() * (1 if model.config.tie_word_embeddings else 2)
    card_total, card_non_embedding = MODEL_CARD_PARAMS[shape]  # the cards round some counts and cut others
    assert abs(total / 1e9 - card_total) < 0.01 and abs((total - embed) / 1e9 - card_non_embedding) < 0.01
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == PUBLISHED[shape]["tie_word_embeddings"]
    assert len(tok) == model.config.vocab_size == PUBLISHED[shape]["vocab_size"]


def test_real_shape_depth_override_keeps_the_width() -> None:
    from ictrl.models import real_shape_config

    full, shallow = real_shape_config("qwen2.5-0.5b"), real_shape_config("qwen2.5-0.5b", num_layers=2)
    assert shallow.num_hidden_layers == 2 and len(shallow.layer_types) == 2
    for field in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "vocab_size"):
        assert getattr(shallow, field) == getattr(full, field)
    with pytest.raises(ValueError, match="unknown shape 'qwen2.5-3b'"):
        real_shape_config("qwen2.5-3b")
    with pytest.raises(ValueError, match="num_layers must be at least 1"):
        real_shape_config("qwen2.5-0.5b", num_layers=0)


def test_padded_tokenizer_reloads_as_qwen2_with_identical_ids(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from ictrl.models import build_byte_tokenizer, real_shape_config

    config = real_shape_config("qwen2.5-0.5b", num_layers=1)
    tok = build_byte_tokenizer(pad_to=config.vocab_size)
    config.save_pretrained(tmp_path)  # a qwen2 config.json makes AutoTokenizer rebuild it as Qwen2Tokenizer
    tok.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert type(reloaded).__name__ == "Qwen2Tokenizer" and len(reloaded) == 151936
    text = "Q: 23+4*5=? héllo \\boxed{43} <|pad_300|>\n<|im_end|>"
    ids = tok(text).input_ids
    assert reloaded(text).input_ids == ids == build_byte_tokenizer()(text).input_ids  # fillers never encode
    assert max(ids) == reloaded.eos_token_id == config.eos_token_id == 258
    assert reloaded.decode(ids) == text
    assert reloaded.decode([151935]) == "<|pad_151935|>"  # the last id a random model can sample decodes
    with pytest.raises(ValueError, match="pad_to=100"):
        build_byte_tokenizer(pad_to=100)


def test_saved_tokenizer_keeps_trl_sides(tiny_model_dir: Path, tmp_path: Path) -> None:
    """As TRL's GRPOTrainer loads its tokenizer, so its saved tokenizer_config.json says left padding/truncation."""
    import json

    _, tokenizer = load_model_and_tokenizer(str(tiny_model_dir))
    assert tokenizer.padding_side == "left"
    tokenizer.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert (saved["padding_side"], saved["truncation_side"]) == ("left", "left")


TORN = {
    "tokenizer.json torn": ("tokenizer.json", "torn", "tokenizer.json is not valid JSON"),
    "config.json torn": ("config.json", "torn", "config.json is not valid JSON"),
    "tokenizer.json a link to rows": ("tokenizer.json", "link", "tokenizer.json (a link to"),
    "tokenizer.json a link to one row": ("tokenizer.json", "one-row", "is not a tokenizer.json (no 'model'"),
    "generation_config.json a list": ("generation_config.json", "list", "holds a JSON list"),
}


@pytest.mark.parametrize("case", sorted(TORN))
@pytest.mark.parametrize("command", ["eval", "train"])
def test_a_torn_or_foreign_json_file_in_the_model_folder_is_one_line(case: str, command: str, tiny_model_dir: Path,
                                                                      tmp_path: Path, loader_calls: list,
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """A copy cut short, or a link to another file, where transformers reads JSON: one line naming the folder and
    the file, exit 2, before the model loads, in ``ictrl eval`` and ``ictrl train``."""
    import json
    import shutil

    import yaml

    from ictrl.cli import main

    name, how, says = TORN[case]
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"question": "1+1?", "answer": "2"}) + "\n")
    target = model / name
    if how == "torn":
        target.write_bytes(target.read_bytes()[: len(target.read_bytes()) // 2])
    elif how in ("link", "one-row"):
        target.unlink()
        target.symlink_to(rows)
        if how == "link":
            rows.write_text(rows.read_text() * 2)
    else:
        target.write_text("[1, 2]")
    monkeypatch.chdir(tmp_path)
    if command == "eval":
        argv = ["eval", "--model", str(model), "--benchmarks", f"jsonl:{rows}", "--n", "1", "--k", "1"]
    else:
        (tmp_path / "run.yaml").write_text(yaml.safe_dump({"model_name_or_path": str(model), "output_dir": "out",
                                                           "dataset_name": f"jsonl:{rows}", "use_vllm": False}))
        argv = ["train", "run.yaml"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    last = err.strip().split("\n")[-1]
    assert "Traceback" not in err and last.startswith(f"ictrl {command}: error:") and str(model) in last, err[-2000:]
    assert says in last, last
    assert not loader_calls and not (tmp_path / "out").exists()


@pytest.mark.parametrize("dtype", ["float8", "bogus", "int8", "float8_e4m3fn"])
def test_a_dtype_no_model_computes_in_is_one_line(dtype: str, tiny_model_dir: Path, loader_calls: list,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from ictrl.cli import main

    with pytest.raises(SystemExit) as exited:  # argparse's one line, as for every option's value
        main(["eval", "--model", str(tiny_model_dir), "--benchmarks", "gsm8k", "--dtype", dtype])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip().split("\n")[-1].startswith("ictrl eval: error: argument --dtype")
    assert not loader_calls


def test_the_loader_refuses_a_dtype_by_name() -> None:
    from ictrl.models import _compute_dtype

    assert _compute_dtype("bfloat16") is torch.bfloat16 and _compute_dtype("torch.float32") is torch.float32
    for bad in ("float8_e4m3fn", "int8", "bool", "bogus", "__class__"):
        with pytest.raises(ValueError, match=f"dtype: '{bad}' is not a dtype a model computes in"):
            _compute_dtype(bad)
