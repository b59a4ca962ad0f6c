"""Helpers for the engine tests, and the worker script of the 2-process run.

As a script (``accelerate launch --config_file configs/accelerate/ddp.yaml --num_processes 2 --mixed_precision no
tests/engine/mp_worker.py OUT MODEL ENGINE PHASES [SELECTORS]``: two CPU processes on gloo where there is no GPU) it
runs phases of :func:`main` under ENGINE ``ddp`` (accelerate's own DDP), ``fsdp2`` (accelerate's FSDP2 preparation
driven on CPU, :func:`cpu_fsdp2`), ``zero2`` or ``zero3`` (DeepSpeed through the Trainer, :func:`zero_args`) and
writes per-rank ``.pt`` files the tests compare with one process.

Generation is replaced by a deterministic stub (``StubGenerationTrainer``): a completion is a function of its prompt
and its index within the prompt's group, so a 1-process and a 2-process run see the same data whatever the
per-process sampling RNG would do. Everything after generation (rewards, advantages, statistics, selection, loss,
optimizer) is the real code path.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

PROMPTS = [f"Q{i}: add {i} and {i + 3}. A:" for i in range(16)]


def digit_reward(prompts: list[Any], completions: list[str], **kwargs: Any) -> list[float]:
    """A verifiable reward: 1 if the completion contains a digit."""
    return [1.0 if any(c.isdigit() for c in completion) else 0.0 for completion in completions]


def make_dataset(n: int = 16) -> Any:
    from datasets import Dataset

    return Dataset.from_dict({"prompt": PROMPTS[:n]})


def stub_completion(prompt_ids: list[int], j: int) -> list[int]:
    """Deterministic completion j of a prompt: 4–11 bytes of lowercase letters, digits in about half of them."""
    digest = hashlib.blake2b(bytes(str((list(prompt_ids), j)), "utf8"), digest_size=8).digest()
    g = torch.Generator().manual_seed(int.from_bytes(digest, "little") & ((1 << 62) - 1))
    length = 4 + int(torch.randint(0, 8, (1,), generator=g))
    ids = torch.randint(ord("a"), ord("z") + 1, (length,), generator=g)
    if j % 2 == 0:
        ids[int(torch.randint(0, length, (1,), generator=g))] = ord("0") + j
    return ids.tolist()


def select_now(trainer: Any, batch: dict[str, Any]) -> torch.Tensor:
    """``batch``'s ``ictrl_selected``, selected now as the loss would select it (on the separate path, whose
    statistics ride the batch): a generation batch alone, or TRL's buffered micro-batch with its buffer; the
    selection's metrics kept out of the run's."""
    import dataclasses
    from collections import defaultdict

    step = dataclasses.replace(trainer._step_context(), metrics=defaultdict(list), mode="eval")
    trainer._select(batch, step, trainer.stats_paths[trainer._mode()], None)
    return batch["ictrl_selected"]


def stock_stub_class() -> type:
    """TRL's own GRPOTrainer generating as :func:`stub_trainer_class` does: the stock side of the equality tests."""
    from trl import GRPOTrainer

    class StockStub(GRPOTrainer):
        def _generate_single_turn(self, prompt_ids: list[list[int]], images: Any, multimodal_fields: Any,
                                  num_generations: int, has_tool_images: bool = False) -> tuple[list, None]:
            return [stub_completion(p, i % num_generations) for i, p in enumerate(prompt_ids)], None

    return StockStub


def stub_trainer_class(one_pass: bool = False) -> type:
    """``one_pass`` False (default): the separate statistics pass; else the path the trainer plans. Each recorded
    generation batch gets, as the loss selects its micro-batches, their ``ictrl_selected`` rows in generation
    order."""
    from ictrl.engine.trainer import ICTGRPOTrainer

    class StubGenerationTrainer(ICTGRPOTrainer):
        """Records every generation batch in ``self.recorded`` and generates deterministically."""

        recorded: list[dict[str, Any]]

        def _generate_single_turn(self, prompt_ids: list[list[int]], images: Any, multimodal_fields: Any,
                                  num_generations: int, has_tool_images: bool = False) -> tuple[list, None]:
            # Rows of one group are adjacent and aligned on every process (checked by the trainer for ict).
            return [stub_completion(p, i % num_generations) for i, p in enumerate(prompt_ids)], None

        def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
            batch = super()._generate_and_score_completions(inputs)
            if not hasattr(self, "recorded"):
                self.recorded = []
            self.recorded.append({k: (v.detach().clone() if isinstance(v, torch.Tensor) else v)
                                  for k, v in batch.items()})
            return batch

        def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> torch.Tensor:
            loss = super()._compute_loss(model, inputs)
            record = self.recorded[-1]  # the loss's micro-batch is of the latest generation batch
            selected = record.setdefault("ictrl_selected",
                                         torch.zeros_like(record["completion_mask"], dtype=torch.bool))
            rows = inputs["ictrl_row"] - self.accelerator.process_index * selected.size(0)
            selected[rows] = inputs["ictrl_selected"].detach()
            return loss

    StubGenerationTrainer.one_pass = one_pass
    return StubGenerationTrainer


def separate_pass(trainer: Any) -> None:
    """From now on the separate statistics pass in every mode: the path ``one_pass = False`` plans when the trainer
    is built (``ictrl.engine.stats_paths``)."""
    from ictrl.engine.stats_paths import Separate

    trainer.stats_paths = {mode: Separate() for mode in trainer.stats_paths}


def make_config(output_dir: str | os.PathLike[str], **overrides: Any) -> Any:
    from ictrl.engine.config import ICTGRPOConfig

    kwargs: dict[str, Any] = dict(
        output_dir=str(output_dir), use_cpu=True, bf16=False, report_to="none", save_strategy="no",
        logging_steps=1, max_steps=2, per_device_train_batch_size=8, num_generations=4, max_completion_length=12,
        learning_rate=1e-2, seed=0, disable_tqdm=True, dataloader_num_workers=0, selection_warmup_steps=0,
    )
    kwargs.update(overrides)
    return ICTGRPOConfig(**kwargs)


# ------------------------------------------------------------------- naive float64 references (test oracle)


def naive_stats(logits: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor, temperature: float
                ) -> dict[str, torch.Tensor]:
    """[B, T, V] logits → float64 [B, T] entropy, renyi2, purity, logprob, prob (0 where mask is False)."""
    logp = torch.log_softmax(logits.double() / temperature, dim=-1)
    p = logp.exp()
    purity = (p * p).sum(-1)
    out = {
        "entropy": -(p * logp).sum(-1),
        "renyi2": -torch.log(purity),
        "purity": purity,
        "logprob": logp.gather(-1, tokens[..., None]).squeeze(-1),
    }
    out["prob"] = out["logprob"].exp()
    return {k: torch.where(mask, v, 0.0) for k, v in out.items()}


# -------------------------------------------------------------------------------------- 2-process worker

# FSDP2 as accelerate's FSDP2 path builds it (TRL's fsdp2.yaml): each decoder layer a unit, then the tail
# [final norm, tied embedding + LM head] and the root (accelerate.utils.fsdp2_prepare_model); sharded
# (torch.distributed.checkpoint) checkpoints.
FSDP2_ARGS: dict[str, Any] = dict(
    fsdp=True,
    fsdp_config={"version": 2, "auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "reshard_after_forward": True,
                 "state_dict_type": "SHARDED_STATE_DICT", "cpu_ram_efficient_loading": False},
)
# One optimizer step of 2 prompts x 4 completions, the 2-process runs in micro-batches of 2 with 2 accumulation
# steps (one whole group per process), the 1-process run in one micro-batch of 8.
SPLIT = {1: (8, 1), 2: (2, 2)}


def cpu_fsdp2(cls: type) -> type:
    """``cls`` whose accelerator runs FSDP2 on CPU processes.

    accelerate 1.15 turns only GPU-like distributed types into FSDP (a CPU launch with an FSDP config trains
    unsharded), so after the Trainer builds its accelerator from ``args.fsdp_plugin_args`` this flips the shared
    AcceleratorState to FSDP with that plugin: from there on ``accelerator.prepare`` (``fsdp2_prepare_model``:
    ``fully_shard`` on gloo), the Trainer's FSDP checkpointing (``save_fsdp_model`` / ``load_fsdp_model``, DCP)
    and ``get_state_dict`` are the code a GPU launch runs.
    """

    class CpuFSDP2(cls):  # type: ignore[misc, valid-type]
        def create_accelerator_and_postprocess(self) -> None:
            from accelerate.state import PartialState
            from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

            super().create_accelerator_and_postprocess()
            state = self.accelerator.state
            assert state.distributed_type in (DistributedType.MULTI_CPU, DistributedType.FSDP), state.distributed_type
            state.fsdp_plugin = FullyShardedDataParallelPlugin(**self.args.fsdp_plugin_args)
            # Both shared states: every later AcceleratorState() copies PartialState's fields over its own.
            PartialState._shared_state["distributed_type"] = DistributedType.FSDP
            state.distributed_type = DistributedType.FSDP
            self.is_fsdp_enabled = True

    return CpuFSDP2


def zero_args(stage: int) -> dict[str, Any]:
    """DeepSpeed ZeRO-``stage`` through the Trainer's own ``deepspeed=`` config (as accelerate's zero2/zero3.yaml
    give it), on CPU processes.

    ``use_cpu=True`` as ``ictrl train`` sets it without CUDA: accelerate's PartialState then joins the gloo group of
    the launch (MULTI_CPU) and counts its processes, and the Accelerator still turns DeepSpeed on (its own ``cpu``
    flag stays False). With ``use_cpu=False`` on a machine without GPUs PartialState finds no device backend,
    DeepSpeed makes the gloo group itself, and accelerate counts one process (the first gather of a 2-process run
    fails). ZeRO-3: every parameter partitioned (``stage3_param_persistence_threshold`` 0; by default parameters
    under 1e5 elements, the whole tiny model, stay whole on every rank, so a head read without DeepSpeed's gather
    would pass unnoticed), and the final save gathers the full weights as zero3.yaml's ``zero3_save_16bit_model``.
    """
    zero: dict[str, Any] = {"stage": stage}
    if stage == 3:
        zero.update(stage3_param_persistence_threshold=0, stage3_gather_16bit_weights_on_model_save=True)
    return dict(use_cpu=True, deepspeed={
        "zero_optimization": zero, "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "zero_allow_untested_optimizer": True,
        "bf16": {"enabled": False}, "fp16": {"enabled": False}})


def full_params(trainer: Any) -> dict[str, torch.Tensor]:
    """Parameters after training, gathered whole (DTensor.full_tensor is a collective: every rank calls it)."""
    from torch.distributed.tensor import DTensor

    model = trainer.accelerator.unwrap_model(trainer.model)
    params = dict(model.named_parameters())
    if any(hasattr(v, "ds_id") for v in params.values()):  # ZeRO-3: gather every partition (a collective)
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(params.values())):
            return {k: v.detach().clone() for k, v in params.items()}
    return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone() for k, v in params.items()}


def build_trainer(out_dir: Path, model_dir: str, selector: str, engine: str = "ddp", world: int = 1,
                  per_device: int | None = None, grad_accum: int | None = None, one_pass: bool = False,
                  **overrides: Any) -> Any:
    """The stub-generation trainer (with ictrl's atomic checkpoints) for one comparison run."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    per_device, grad_accum = per_device or SPLIT[world][0], grad_accum or SPLIT[world][1]
    # Plain SGD without clipping: the parameter change is lr x gradient, so a gradient scale error shows (Adam's
    # first step and norm clipping would hide it).
    kwargs: dict[str, Any] = dict(token_selector=selector, per_device_train_batch_size=per_device,
                                  gradient_accumulation_steps=grad_accum, max_steps=1, optim="sgd", learning_rate=0.1,
                                  max_grad_norm=0.0,
                                  # ict takes the sparse LM-head path (ictrl.core.logprobs), the others TRL's fused one
                                  sparse_backward=selector == "ict")
    cls = stub_trainer_class(one_pass)
    if engine == "fsdp2":
        kwargs.update(FSDP2_ARGS)
        cls = cpu_fsdp2(cls)
    elif engine.startswith("zero"):
        kwargs.update(zero_args(int(engine[-1])))
    kwargs.update(overrides)
    return cls(model=model, reward_funcs=digit_reward, args=make_config(out_dir, **kwargs),
               train_dataset=make_dataset(), processing_class=tokenizer)


def run_one_step(out_dir: Path, model_dir: str, selector: str, per_device: int | None = None,
                 grad_accum: int | None = None, engine: str = "ddp", world: int = 1, final_dir: Path | None = None,
                 one_pass: bool = False, **overrides: Any) -> dict[str, Any]:
    """Train one optimizer step with the stub trainer; return what the comparison needs (``selected``: each loss
    micro-batch's selection and, on the one-pass path, its rows' indices in the global generation batch). With
    ``final_dir``, also write the final HF-format model there as ``ictrl train`` does (``run.save_final``, every
    rank)."""
    trainer = build_trainer(out_dir, model_dir, selector, engine, world, per_device, grad_accum, one_pass,
                            **overrides)
    losses: list[float] = []
    selected: list[tuple[torch.Tensor, torch.Tensor | None]] = []
    original = trainer._compute_loss

    def recording_loss(model: Any, inputs: dict[str, Any]) -> torch.Tensor:
        loss = original(model, inputs)
        losses.append(float(loss.detach()))
        row = inputs.get("ictrl_row")
        selected.append((inputs["ictrl_selected"].detach().clone(), None if row is None else row.detach().clone()))
        return loss

    trainer._compute_loss = recording_loss  # type: ignore[method-assign]
    with recorded_heads() as heads:
        trainer.train()
    if final_dir is not None:
        from ictrl.checkpoints import STAGING_PREFIX
        from ictrl.engine.resumable import save_final

        save_final(trainer, final_dir.with_name(STAGING_PREFIX + final_dir.name), final_dir)
    paths = sorted({h["ictrl/stats_path"] for h in trainer.state.log_history if "ictrl/stats_path" in h})
    return {"batches": trainer.recorded, "losses": losses, "selected": selected, "paths": paths,
            "params": full_params(trainer),
            "rank": trainer.accelerator.process_index, "world": trainer.accelerator.num_processes,
            "engine": engine_name(trainer), "heads": heads}


def engine_name(trainer: Any) -> str:
    """What runs the model: ``ZeRO-2``/``ZeRO-3`` (a DeepSpeedEngine of that stage), else the class of the
    prepared model (``DistributedDataParallel``, ``FSDP...`` for fully_shard, the model's own class unwrapped)."""
    plugin = trainer.accelerator.state.deepspeed_plugin
    if type(trainer.model_wrapped).__name__ == "DeepSpeedEngine" and plugin is not None:
        return f"ZeRO-{plugin.zero_stage}"
    return type(trainer.model_wrapped).__name__


@contextlib.contextmanager
def recorded_heads() -> Iterator[list[dict[str, Any]]]:
    """Each ``call_head`` call's head weight as the engine holds it on entry (the statistics sweep calls it from
    ``ictrl.engine.stats_source``, the sparse head from ``ictrl.engine.loss_inputs``): ``ds`` (a DeepSpeed ZeRO-3
    parameter), ``numel`` (elements present on this rank), ``full`` (elements of the whole weight). ``numel <
    full``: the head was a shard on entry, so only the engine's gather gave ``fn`` the whole."""
    import ictrl.engine.loss_inputs as loss_inputs_module
    import ictrl.engine.stats_source as stats_source_module

    modules = (stats_source_module, loss_inputs_module)
    calls: list[dict[str, Any]] = []
    original = loss_inputs_module.call_head

    def recording(head: torch.nn.Module, fn: Any, *inputs: torch.Tensor, **kwargs: Any) -> Any:
        weight = head.weight
        calls.append({"ds": hasattr(weight, "ds_id"), "numel": weight.numel(),
                      "full": int(getattr(weight, "ds_numel", weight.numel()))})
        return original(head, fn, *inputs, **kwargs)

    for module in modules:
        module.call_head = recording
    try:
        yield calls
    finally:
        for module in modules:
            module.call_head = original


RESUME_ARGS: dict[str, Any] = dict(max_steps=2, save_strategy="steps", save_steps=1, optim_args="momentum=0.9")


def _save(result: dict[str, Any], path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(result, tmp)
    os.replace(tmp, path)


def main(argv: list[str]) -> None:
    """``OUT MODEL ENGINE PHASES [SELECTORS]``, PHASES joined by ``+``: ``step`` (one step per selector),
    ``onepass`` (one step of each of ``ONEPASS_SELECTORS`` on the training-forward path), ``kill`` (2 steps with a
    checkpoint each; every process exits abruptly right after checkpoint-1: last) or ``resume`` (from checkpoint-1
    to step 2)."""
    from transformers import TrainerCallback

    out, model_dir, engine, phases = Path(argv[0]), argv[1], argv[2], argv[3].split("+")
    if "step" in phases:
        for selector in argv[4].split(","):
            result = run_one_step(out / f"trainer_{engine}_{selector}", model_dir, selector, engine=engine, world=2,
                                  final_dir=out / f"final_{engine}_{selector}")
            _save(result, out / f"{engine}_{selector}_rank{result['rank']}.pt")
    if "onepass" in phases:  # one micro-batch of 4 (a whole group) per process: the training-forward path
        for selector in ONEPASS_SELECTORS:
            result = run_one_step(out / f"onepass_{engine}_{selector}", model_dir, selector, per_device=4,
                                  grad_accum=1, engine=engine, world=2, one_pass=True)
            _save(result, out / f"{engine}_{selector}_onepass_rank{result['rank']}.pt")
    if "bench" in phases:
        bench_steps(out, model_dir, engine, int(argv[4]))
        return
    run_dir = out / f"run_{engine}"
    if "resume" in phases:
        trainer = build_trainer(run_dir, model_dir, "ict", engine, world=2, **RESUME_ARGS)
        trainer.train(resume_from_checkpoint=str(run_dir / "checkpoint-1"))
        rank = trainer.accelerator.process_index
        _save({"params": full_params(trainer), "step": trainer.state.global_step, "rank": rank},
              out / f"{engine}_resume_rank{rank}.pt")
    if "kill" in phases:
        class Kill(TrainerCallback):
            def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                if state.global_step == 1:
                    os._exit(0)  # no cleanup, no further step: as a SIGKILL right after the checkpoint

        trainer = build_trainer(run_dir, model_dir, "ict", engine, world=2, **RESUME_ARGS)
        trainer.add_callback(Kill())
        trainer.train()
        raise AssertionError("the run should have been killed after checkpoint-1")


def bench_steps(out: Path, model_dir: str, engine: str, steps: int) -> None:
    """``steps`` optimizer steps of ict (sparse head) under ``engine``; rank 0 writes each step's wall time
    (bench/bench_scale.py)."""
    from transformers import TrainerCallback

    class Clock(TrainerCallback):
        def __init__(self) -> None:
            self.times: list[float] = []

        def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
            self.start = time.perf_counter()

        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            self.times.append(time.perf_counter() - self.start)

    trainer = build_trainer(out / f"bench_{engine}", model_dir, "ict", engine, world=2, max_steps=steps)
    clock = Clock()
    trainer.add_callback(clock)
    trainer.train()
    if trainer.accelerator.is_main_process:
        _save({"engine": engine, "step_times": clock.times}, out / f"bench_{engine}.pt")


# ------------------------------------------------------------------------------ launching and comparing (tests)

SELECTORS = ("ict", "entropy", "random")  # group JS, a batch-scope threshold + token mean, a seeded draw
ONEPASS_SELECTORS = ("ict", "entropy", "all")  # ict: group JS + sparse head; entropy: TRL's fused head; all: none
REPO_ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    import socket

    # The static rendezvous hangs on port 0, so hand it a port that was free a moment ago.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def launch(args: list[str], timeout: int = 300, cwd: Path | None = None) -> Any:
    """``accelerate launch --config_file configs/accelerate/ddp.yaml --num_processes 2 --mixed_precision no ARGS``:
    two CPU processes on gloo on a machine without GPUs. Returns the CompletedProcess."""
    import subprocess

    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
           str(REPO_ROOT / "configs" / "accelerate" / "ddp.yaml"), "--num_processes", "2", "--mixed_precision", "no",
           "--main_process_port", str(free_port()), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd)



def run_worker(out: Path, model_dir: Path, engine: str, phases: str, selectors: tuple[str, ...] = SELECTORS) -> None:
    """This file under :func:`launch` on 2 processes: ``phases`` of ``engine`` for each selector, results in ``out``."""
    proc = launch([str(Path(__file__)), str(out), str(model_dir), engine, phases, ",".join(selectors)])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

_SINGLE: dict[tuple[str, str], dict[str, Any]] = {}


def single_process(out: Path, model_dir: str, selector: str) -> dict[str, Any]:
    """The 1-process reference (``resume``: 2 uninterrupted steps with RESUME_ARGS), computed once per session."""
    key = (model_dir, selector)
    if key not in _SINGLE:
        if selector == "resume":
            trainer = build_trainer(out / "single_resume", model_dir, "ict", **{**RESUME_ARGS, "save_strategy": "no"})
            trainer.train()
            _SINGLE[key] = {"params": full_params(trainer), "step": trainer.state.global_step}
        else:
            _SINGLE[key] = run_one_step(out / f"single_{selector}", model_dir, selector)
    return _SINGLE[key]


def initial_params(model_dir: str) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return {k: v.detach() for k, v in model.named_parameters()}


def _pad(x: torch.Tensor, T: int, value: int | bool) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, T - x.size(1)), value=value)


def max_param_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def compare_step(out: Path, model_dir: str, engine: str, selector: str, tol: float = 1e-5) -> dict[str, float]:
    """Assert the 2-process run of ``selector`` under ``engine`` matches one process: rows, advantages, masks,
    losses, parameters after the step. Returns the max abs differences (advantages, loss, parameters)."""
    ranks = [torch.load(out / f"{engine}_{selector}_rank{r}.pt", weights_only=False) for r in (0, 1)]
    single = single_process(out, model_dir, selector)
    assert [r["world"] for r in ranks] == [2, 2] and single["world"] == 1
    ref = single["batches"][0]
    T = ref["completion_ids"].size(1)
    padding = ref["completion_mask"] == 0
    pad_id = int(ref["completion_ids"][padding][0]) if bool(padding.any()) else 0
    parts = [r["batches"][0] for r in ranks]
    assert all(p["completion_ids"].size(0) == 4 for p in parts)  # one whole group per process
    assert torch.equal(torch.cat([_pad(p["completion_ids"], T, pad_id) for p in parts]), ref["completion_ids"])
    adv = float((torch.cat([p["advantages"] for p in parts]) - ref["advantages"]).abs().max())
    assert adv <= tol, (engine, selector, adv)
    mask_2p = torch.cat([_pad(p["ictrl_selected"], T, False) for p in parts])
    assert torch.equal(mask_2p, ref["ictrl_selected"]), (engine, selector)
    assert 0 < int(ref["ictrl_selected"].sum()) < int(ref["completion_mask"].sum())
    # Gradients are averaged over processes: the single loss is the mean over processes of their summed
    # micro-batch losses.
    assert [len(r["losses"]) for r in ranks] == [2, 2] and len(single["losses"]) == 1
    loss = abs(sum(sum(r["losses"]) for r in ranks) / 2 - single["losses"][0])
    assert loss <= tol, (engine, selector, loss)
    params = max(max_param_diff(r["params"], single["params"]) for r in ranks)
    assert params <= tol, (engine, selector, params)
    moved = max_param_diff(single["params"], initial_params(model_dir))
    assert moved > 1e-3, (selector, moved)
    return {"advantages": adv, "loss": loss, "params": params}


def compare_resume(out: Path, model_dir: str, engine: str, tol: float = 1e-5) -> float:
    """Killed after checkpoint-1 and resumed to step 2 on 2 processes = 2 uninterrupted steps on one process."""
    ranks = [torch.load(out / f"{engine}_resume_rank{r}.pt", weights_only=False) for r in (0, 1)]
    single = single_process(out, model_dir, "resume")
    assert [r["step"] for r in ranks] == [2, 2] and single["step"] == 2
    diff = max(max_param_diff(r["params"], single["params"]) for r in ranks)
    assert diff <= tol, (engine, diff)
    return diff


if __name__ == "__main__":
    from ictrl.train_cli.process_group import process_group_left

    with process_group_left():  # as ictrl train: every exit leaves the process group
        main(sys.argv[1:])
    # The results are on disk and the group is left. Skip interpreter finalisation too: FSDP2 and DeepSpeed keep
    # threads of their own whose teardown during finalisation can still abort a finished worker.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
