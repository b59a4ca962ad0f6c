"""The model card (``README.md``) ``ICTGRPOTrainer`` leaves in ``output_dir`` beside the model: the base model, the
method and the command that trained it. TRL's own card (``GRPOTrainer.create_model_card``) names no base model for
a local directory ("fine-tuned version of [None]") and no token selection, so ictrl's replaces it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from ictrl.files import redact_command


def resolved_method(args: Any) -> dict[str, Any]:
    """The method the trainer arguments ``args`` (an ``ICTGRPOConfig``) resolved: selector, label, ratio, scope,
    warm-up and loss normaliser (a ratio or scope the selector has not: None)."""
    return {"method": args.selector.label, "token_selector": args.token_selector,
            "selection_ratio": args.selection_ratio, "selection_scope": args.selection_scope,
            "selection_warmup_steps": args.selection_warmup_steps, "loss_normalization": args.loss_normalization,
            "loss_type": args.loss_type}


def model_card(base_model: str, output_dir: Path, args: Any, command: str | None, step: int | None = None) -> str:
    """The card's Markdown: YAML front matter (``base_model``, ``library_name``, ``tags``) as the Hub reads it,
    then the method as resolved (``args``: an ``ICTGRPOConfig``), the command and how to load the model."""
    method = resolved_method(args)
    label, trl = method["method"], args.selector.trl_loss  # trl_loss: the selector trains every token, as TRL
    name = (f"TRL's GRPO (token_selector {method['token_selector']}: every response token)" if trl
            else f"{label} (token_selector {method['token_selector']})")
    hub = not os.path.isdir(base_model)
    front = {"base_model": base_model, "library_name": "transformers",
             "tags": ["ictrl", "trl", "grpo", *([] if trl else [label])]}
    if not hub:
        front["base_model"] = str(Path(base_model).resolve())
    base = f"[{base_model}](https://huggingface.co/{base_model})" if hub else f"`{front['base_model']}`"
    details = ", ".join(f"{key} {value}" for key, value in method.items()
                        if key not in ("method", "token_selector") and value is not None)
    how = ("trained by `ictrl train` (ICTGRPOTrainer, a subclass of TRL's `GRPOTrainer`)" if command else
           f"trained from Python with `ictrl.ICTGRPOTrainer` (a subclass of TRL's `GRPOTrainer`, method {label})")
    # the line as run, less its secrets (--hub_token=<redacted>): the card is the file push_to_hub publishes
    made = (["Trained with:", "", "```bash", redact_command(command), "```", ""] if command else
            ["Trained from Python with `ICTGRPOTrainer(...)`, not a command: the settings above are its resolved "
             "arguments (`trainer.args`); no config file was written.", ""])
    # only the files that are really there: a Python run writes neither unless its caller did
    beside = [f"`{name}`" for name in ("config.yaml", "run.json") if (output_dir / name).is_file()]
    settings = ([f"The resolved settings are in {' and '.join(beside)} beside this file.", ""] if beside else [])
    lines = [
        "---", yaml.safe_dump(front, sort_keys=False).strip(), "---", "",
        f"# {output_dir.name}", "",
        f"This model is a fine-tuned version of {base}, {how} with {name}: {details}"
        + (f", {step} optimizer steps" if step is not None else "") + f", seed {args.seed}.", "",
        *made, *settings,
        "## Use", "", "```python", "from transformers import AutoModelForCausalLM, AutoTokenizer", "",
        f'model = AutoModelForCausalLM.from_pretrained("{output_dir}")',
        f'tokenizer = AutoTokenizer.from_pretrained("{output_dir}")', "```", "",
    ]
    return "\n".join(lines)


def write_model_card(trainer: Any, base_model: str, command: str | None) -> None:
    """Write the card to ``output_dir/README.md`` atomically, from the main process only: ``base_model`` as the
    trainer was given it, ``command`` the command line that trained it (None from Python)."""
    from ictrl.files import atomic_write_text

    if not trainer.is_world_process_zero():
        return
    out = Path(trainer.args.output_dir)
    atomic_write_text(out / "README.md", model_card(base_model, out, trainer.args, command, trainer.state.global_step))
