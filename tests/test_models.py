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
