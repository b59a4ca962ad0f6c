"""Rollout throughput on CPU: vLLM's CPU build against transformers ``generate``, same model, prompts and lengths.

    .venv/bin/python bench/bench_vllm_rollouts.py MODEL_DIR [--prompts 8 --generations 4 --tokens 64 --dtype bfloat16]

Both sample G completions of exactly T new tokens (EOS ignored) for each of the prompts, at temperature 1, after one
warm-up call each; the time of the second call is reported as new tokens per second. The engine starts with
``VLLM_CPU_CI_ENV=1`` unless the variable is set (no warm-up compile: its start time is printed apart). Writes
``bench/results/vllm_rollouts.json`` atomically.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def hf_rate(model_dir: str, prompts: list[list[int]], G: int, T: int, dtype: torch.dtype) -> float:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
    width = max(len(p) for p in prompts)
    pad = model.generation_config.pad_token_id or 0
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts for _ in range(G)])
    attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts for _ in range(G)])

    def call() -> float:
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=attention, do_sample=True, temperature=1.0, top_k=0,
                                 top_p=1.0, max_new_tokens=T, min_new_tokens=T, pad_token_id=pad)
        assert out.shape[1] == width + T
        return time.perf_counter() - start

    call()
    return ids.shape[0] * T / call()


def vllm_rate(model_dir: str, prompts: list[list[int]], G: int, T: int, dtype: str) -> tuple[float, float]:
    from ictrl import vllm_env

    vllm_env.cpu_environment()
    os.environ.setdefault("VLLM_CPU_CI_ENV", "1")
    from vllm import LLM, SamplingParams

    start = time.perf_counter()
    llm = LLM(model=model_dir, dtype=dtype, seed=0, max_model_len=max(len(p) for p in prompts) + T + 8)
    started = time.perf_counter() - start
    vllm_env.shutdown_before_exit(llm)
    params = SamplingParams(n=G, temperature=1.0, max_tokens=T, min_tokens=T, ignore_eos=True)

    def call() -> float:
        start = time.perf_counter()
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        assert all(len(c.token_ids) == T for o in outs for c in o.outputs)
        return time.perf_counter() - start

    call()
    return len(prompts) * G * T / call(), started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--generations", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    prompts = [tokenizer(f"Question {i}: what is {i} plus {i + 3}? Answer:")["input_ids"] for i in range(args.prompts)]
    vllm, started = vllm_rate(args.model, prompts, args.generations, args.tokens, args.dtype)
    hf = hf_rate(args.model, prompts, args.generations, args.tokens, getattr(torch, args.dtype))
    result = {"model": args.model, "prompts": args.prompts, "generations": args.generations, "tokens": args.tokens,
              "dtype": args.dtype, "threads": torch.get_num_threads(), "hf_tokens_per_s": round(hf, 1),
              "vllm_tokens_per_s": round(vllm, 1), "vllm_over_hf": round(vllm / hf, 2),
              "vllm_start_s": round(started, 1)}
    print(json.dumps(result))
    from ictrl.files import atomic_write_json

    atomic_write_json(ROOT / "bench" / "results" / "vllm_rollouts.json", result)


if __name__ == "__main__":
    main()
