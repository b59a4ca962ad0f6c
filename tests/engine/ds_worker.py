"""Worker of the 2-process dynamic-sampling test (``torchrun --nproc_per_node 2 ds_worker.py OUT MODEL``).

Trains two optimizer steps with the deterministic generation stub of ``mp_worker`` and dynamic sampling on, with a
reward that makes the groups of even prompts uniform; writes ``rank{r}.pt`` with the final generation batches and
the trainer's log history.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mp_worker as w  # noqa: E402


def half_uniform_reward(prompts: list[Any], completions: list[str], **kwargs: Any) -> list[float]:
    digit = w.digit_reward(prompts, completions)
    return [1.0 if int(str(p).split(":")[0][1:]) % 2 == 0 else d for p, d in zip(prompts, digit)]


def main(out: Path, model_dir: str) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    args = w.make_config(out / "trainer", token_selector="ict", dynamic_sampling=True, per_device_train_batch_size=8,
                         max_steps=2)
    trainer = w.stub_trainer_class()(model=model, reward_funcs=half_uniform_reward, args=args,
                                     train_dataset=w.make_dataset(), processing_class=tokenizer)
    trainer.train()
    rank = trainer.accelerator.process_index
    result = {"batches": trainer.recorded, "log": trainer.state.log_history, "world": trainer.accelerator.num_processes}
    path = out / f"rank{rank}.pt"
    torch.save(result, path.with_suffix(".tmp"))
    os.replace(path.with_suffix(".tmp"), path)


if __name__ == "__main__":
    from ictrl.train_cli.process_group import process_group_left

    with process_group_left():
        main(Path(sys.argv[1]), sys.argv[2])
    # The results are on disk and the group is left. Skip interpreter finalisation too: FSDP2 and DeepSpeed keep
    # threads of their own whose teardown during finalisation can still abort a finished worker.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
