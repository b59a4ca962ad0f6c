"""A user's selection rule in a training run, held to ictrl's standard: a rule that fails stops the run before an
optimizer step trains on its output, in one line (``ictrl train``: exit 2 with the last checkpoint and the
``--resume`` command); an empty selection is named each step and, when it persists, stops the run as other
no-signal runs stop; padding selected is named once; processes that compute different masks are named; the rule's
own metrics reach the run's; the run says which statistics it computes and where; the rule is recorded in run.json
and ``--print-config``."""

from __future__ import annotations

import json
import logging
import sys
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import yaml

import mp_worker as w
from ictrl.core.selection import SelectionInputs, SelectorError, register_selector, top_fraction
from ictrl.engine.loss_inputs import EmptySelection, LossInputsBuilder, mask_digest, select_tokens
from ictrl.engine.stats_source import StepContext


def _trainer(model_dir: Path, out: Path, selector: str, **overrides: Any) -> Any:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    return w.stub_trainer_class(False)(
        model=model, reward_funcs=w.digit_reward, train_dataset=w.make_dataset(), processing_class=tokenizer,
        args=w.make_config(out, token_selector=selector, beta=0.0, **overrides))


def test_a_rule_returning_a_score_stops_before_any_optimizer_step(tiny_model_dir: Path, tmp_path: Path) -> None:
    @register_selector("test_score_not_mask", needs=("prob",))
    def score_not_mask(inputs: SelectionInputs) -> torch.Tensor:
        return inputs.prob

    trainer = _trainer(tiny_model_dir, tmp_path, "test_score_not_mask")
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    with pytest.raises(SelectorError, match=r"score_not_mask returned a torch.float32 tensor of shape \[8, \d+\] on "
                                            r"cpu at step 0: .* a score is not a mask"):
        trainer.train()
    assert trainer.state.global_step == 0
    assert all(torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())  # nothing trained on it


def test_an_empty_selection_is_named_each_step_then_stops_the_run(tiny_model_dir: Path, tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    @register_selector("test_selects_nothing")
    def selects_nothing(inputs: SelectionInputs) -> torch.Tensor:
        return torch.zeros_like(inputs.mask)

    trainer = _trainer(tiny_model_dir, tmp_path, "test_selects_nothing", max_steps=5, no_signal_steps=3)
    with caplog.at_level(logging.WARNING, "ictrl.engine.loss_inputs"):
        with pytest.raises(EmptySelection, match=r"selects_nothing selected no token for 3 optimizer steps in a "
                                                 r"row, .* set no_signal_steps: 0 to train on"):
            trainer.train()
    said = [r.getMessage() for r in caplog.records if "selected no token of the batch" in r.getMessage()]
    assert [int(m.split("at step ")[1].split(":")[0]) for m in said] == [0, 1, 2]
    assert [h["ictrl/selection/empty"] for h in trainer.state.log_history if "ictrl/selection/empty" in h] == \
        [1.0, 1.0]  # steps 1 and 2 were logged; the third stopped the run


def test_the_empty_stretch_counts_optimizer_steps_and_a_selection_resets_it() -> None:
    from ictrl.engine.loss_inputs import SelectionWatch

    watch = SelectionWatch(limit=4, steps_per_batch=2)  # two optimizer steps per generation batch
    watch.observe({"selection/empty": 1.0}, "r.py:f", 0)
    watch.observe({"selection/empty": 0.0}, "r.py:f", 2)  # a batch that selects: the stretch starts again
    watch.observe({"selection/empty": 1.0}, "r.py:f", 4)
    assert watch.empty_steps == 2
    with pytest.raises(EmptySelection, match="r.py:f selected no token for 4 optimizer steps in a row"):
        watch.observe({"selection/empty": 1.0}, "r.py:f", 6)
    SelectionWatch(limit=0).observe({"selection/empty": 1.0}, "r.py:f", 0)  # no_signal_steps 0: trains on


def test_padding_selected_is_named_once_and_a_rules_metric_reaches_the_log(tiny_model_dir: Path, tmp_path: Path,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    @register_selector("test_selects_padding", needs=("entropy",))
    def selects_padding(inputs: SelectionInputs, *, ratio: float = 0.5) -> torch.Tensor:
        inputs.log_metric("mean_entropy", float(inputs.entropy[inputs.mask].mean()))
        inputs.log_metric("step", inputs.step)
        return top_fraction(inputs.entropy, inputs, ratio) | ~inputs.mask

    trainer = _trainer(tiny_model_dir, tmp_path, "test_selects_padding")
    with caplog.at_level(logging.WARNING, "ictrl.engine.loss_inputs"):
        trainer.train()
    said = [r.getMessage() for r in caplog.records if "padding position" in r.getMessage()]
    assert len(said) == 1 and "selects_padding selected" in said[0] and "at step 0" in said[0]
    rows = [h for h in trainer.state.log_history if "ictrl/rule/step" in h]
    assert [h["ictrl/rule/step"] for h in rows] == [0.0, 1.0]
    assert all(h["ictrl/selection/padding"] > 0 and h["ictrl/rule/mean_entropy"] > 0 for h in rows)
    assert all(h["ictrl/selection/empty"] == 0.0 for h in rows)


def test_the_run_says_which_statistics_it_computes_and_where(tiny_model_dir: Path, tmp_path: Path,
                                                            caplog: pytest.LogCaptureFixture, h2rule: Path) -> None:
    with caplog.at_level(logging.INFO, "ictrl.engine.trainer"):
        _trainer(tiny_model_dir, tmp_path, "h2rule:top_h2")
        _trainer(tiny_model_dir, tmp_path, "ict", selection_warmup_steps=2)
        _trainer(tiny_model_dir, tmp_path, "all")
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("statistics:")]
    assert lines == [
        "statistics: h2rule.py:top_h2 reads renyi2 (Renyi-2 entropy H2); training computes them from a no-grad "
        "forward of their own at generation (ictrl/stats_path 0); no group JS sweep",
        "statistics: 'ict' reads ict_score (ICT score u, from the group JS sweep); training computes them from a no-grad "
        "forward of their own at generation (ictrl/stats_path 0); none during the 2 warm-up steps",
        "statistics: 'all' reads none, so no statistics pass runs (the metrics come from the loss's forward)"]


def test_selection_topk_is_refused_for_a_rule_without_the_ict_score(tmp_path: Path, h2rule: Path) -> None:
    with pytest.raises(ValueError, match=r"selection_topk is not used by token_selector='h2rule:top_h2'; leave it"):
        w.make_config(tmp_path, token_selector="h2rule:top_h2", selection_topk=8)
    assert w.make_config(tmp_path, token_selector="ict", selection_topk=8).selection_topk == 8


class _TwoProcesses:
    """Process 0 of two whose partner's mask fingerprint is ``other`` (None: the same as its own)."""

    process_index, num_processes = 0, 2

    def __init__(self, other: int | None) -> None:
        self.other = other

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.long and x.numel() == 1:  # the fingerprint
            return torch.cat([x, x if self.other is None else torch.tensor([self.other])])
        return x

    def pad_across_processes(self, x: torch.Tensor, dim: int = 0, pad_index: int = 0) -> torch.Tensor:
        return x


def _step(accelerator: Any, selector: str, options: dict[str, Any]) -> LossInputsBuilder:
    from ictrl.core.selection import get_selector

    source = SimpleNamespace(stat_free=True)
    return LossInputsBuilder(accelerator, get_selector(selector), options, 0, count_selected=False, buffer_mean=False,
                         source=source, temperature=1.0)


def _select(step: LossInputsBuilder, context: StepContext, mask: torch.Tensor) -> torch.Tensor:
    """The step's selection of ``mask``'s rows (the fake accelerator's gather keeps them as they are)."""
    group_ids = torch.arange(mask.size(0)) // context.G
    return select_tokens(step.accelerator, step.selector, step.options, step.warmup_steps, step.seed, context, mask,
                         (None, None), torch.zeros(mask.size(0)), group_ids, step.watch)


def test_processes_with_different_masks_are_named() -> None:
    @register_selector("test_global_rng")
    def global_rng(inputs: SelectionInputs, *, ratio: float = 0.5) -> torch.Tensor:
        return top_fraction(torch.rand(inputs.mask.shape), inputs, ratio)  # torch's global generator: per process

    mask = torch.ones(4, 6, dtype=torch.bool)
    context = StepContext("train", 2, 7, frozenset(), defaultdict(list))
    same = _step(_TwoProcesses(None), "test_global_rng", {"ratio": 0.5})
    assert _select(same, context, mask).sum() == 12
    differs = _step(_TwoProcesses(-1), "test_global_rng", {"ratio": 0.5})
    with pytest.raises(SelectorError, match=r"global_rng gave the processes different masks at step 7: .* draw "
                                            r"random numbers from inputs.generator"):
        _select(differs, context, mask)
    a, b = torch.zeros(4, 6, dtype=torch.bool), torch.zeros(4, 6, dtype=torch.bool)
    a[0, 1], b[1, 0] = True, True
    assert mask_digest(a) != mask_digest(b) and mask_digest(a) == mask_digest(a.clone())


# --- through `ictrl train` -------------------------------------------------------------------------------------

RULES = '''
from ictrl.core.selection import register_selector, top_fraction


@register_selector("late_fail", needs=("prob",))
def late_fail(inputs, *, ratio=0.25, fail_at: int = 1):
    inputs.log_metric("calls", 1.0)
    if inputs.step >= fail_at:
        raise ZeroDivisionError("boom")
    return top_fraction(inputs.prob, inputs, ratio)
'''


def _run_config(tmp_path: Path, model: Path, **keys: Any) -> Path:
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is {i}+1?", "answer": str(i + 1)}) + "\n"
                            for i in range(8)))
    cfg = {"model_name_or_path": str(model), "dataset_name": f"jsonl:{data}", "max_prompt_length": None,
           "token_selector": "ict", "selection_warmup_steps": 0, "prompts_per_step": 2, "num_generations": 4,
           "per_device_train_batch_size": 8, "max_completion_length": 8, "use_vllm": False, "cpu_threads": 1,
           "learning_rate": 1e-3, "max_steps": 3, "save_steps": 1, "logging_steps": 1, "report_to": "none",
           "disable_tqdm": True, "output_dir": str(tmp_path / "out"), **keys}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _train(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, list[str]]:
    """``ictrl train ARGV``'s status, its stdout and stderr together, and its error lines."""
    from ictrl import cli

    code = cli.main(["train", *argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err
    return code, out + err, [line for line in err.splitlines() if line.startswith("ictrl train: error:")]


def test_print_config_checks_a_rules_options_and_shows_the_rule(tmp_path: Path, tiny_model_dir: Path,
                                                                monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "rules.py").write_text(RULES)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # a rule file's folder: this test's only
    config = _run_config(tmp_path, tiny_model_dir, token_selector="rules.py:late_fail")
    try:
        code, _, errors = _train([str(config), '--selection_options={"fail_at": "abc"}', "--print-config"], capsys)
        assert code == 2 and errors == ["ictrl train: error: override --selection_options={\"fail_at\": \"abc\"}: "
                                        "selection_options: fail_at must be an int (its default is 1), got str 'abc'"]
        code, out, errors = _train([str(config), "--print-config", "--selection_ratio=0.5"], capsys)
        assert code == 0 and errors == []
        (line,) = [x for x in out.splitlines() if x.startswith("# selector (as run.json records it): ")]
        shown = json.loads(line.split(": ", 1)[1])
        assert shown["name"] == "late_fail" and shown["file"] == str((tmp_path / "rules.py").resolve())
        assert shown["options"] == {"ratio": 0.5, "fail_at": 1} and len(shown["sha256"]) == 64
    finally:
        for name in [m for m in sys.modules if m.startswith("ictrl_rules_")]:
            sys.modules.pop(name)


@pytest.mark.integration
def test_ictrl_train_stops_a_failing_rule_in_one_line_with_the_resume_command(tmp_path: Path, tiny_model_dir: Path,
                                                                               monkeypatch: pytest.MonkeyPatch,
                                                                               capsys: pytest.CaptureFixture[str]
                                                                               ) -> None:
    """A rule of the user's file (given as rules.py:late_fail) that trains a step, then raises: one line naming
    the rule's file, line and step, the last checkpoint and the command that resumes; the rule, its file's hash
    and its options in run.json; its own metric in metrics.jsonl; the statistics it computes said first."""
    import hashlib

    (tmp_path / "rules.py").write_text(RULES)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # a rule file's folder: this test's only
    config = _run_config(tmp_path, tiny_model_dir)
    try:
        code, err, errors = _train([str(config), "--token_selector=rules.py:late_fail"], capsys)
        # the rule edited to train on: a resume would continue the run under another rule, so it is refused
        (tmp_path / "rules.py").write_text(RULES.replace("fail_at: int = 1", "fail_at: int = 99"))
        for name in [m for m in sys.modules if m.startswith("ictrl_rules_")]:
            sys.modules.pop(name)
        resumed, _, refused = _train([str(config), "--token_selector=rules.py:late_fail", "--resume"], capsys)
    finally:
        for name in [m for m in sys.modules if m.startswith("ictrl_rules_")]:
            sys.modules.pop(name)
    assert resumed == 2 and len(refused) == 1 and "--resume: the source of selector late_fail changed since the " \
        "run started" in refused[0], refused
    out = tmp_path / "out"
    assert code == 2 and len(errors) == 1, err[-3000:]
    assert errors[0].startswith("ictrl train: error: selector rules.py:late_fail raised ZeroDivisionError: boom "
                                "(rules.py, line 9) at step 1; stopped at step 1; last complete checkpoint ")
    assert errors[0].endswith(f"checkpoint-1; resume with `ictrl train {config} "
                              "--token_selector=rules.py:late_fail --resume`")
    assert "statistics: rules.py:late_fail reads prob (pi of the sampled token); training computes them from " in err
    record = json.loads((out / "run.json").read_text())["selector"]
    assert record == {"name": "late_fail", "spec": f"{(tmp_path / 'rules.py').resolve()}:late_fail",
                      "file": str((tmp_path / "rules.py").resolve()),
                      "sha256": hashlib.sha256(RULES.encode()).hexdigest(), "options": {"ratio": 0.25, "fail_at": 1}}
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1] and rows[0]["ictrl/rule/calls"] == 1.0


@pytest.mark.integration
def test_two_processes_that_draw_different_masks_stop_in_one_line(tmp_path: Path, tiny_model_dir: Path) -> None:
    """``ictrl train --num-processes 2`` with a rule that draws from torch's global generator: each process would
    train on another mask; the run names the rule and the remedy (inputs.generator) before any optimizer step."""
    import subprocess

    (tmp_path / "rules.py").write_text(RULES + '''

@register_selector("global_rng")
def global_rng(inputs, *, ratio=0.5):
    import torch
    return top_fraction(torch.rand(inputs.mask.shape), inputs, ratio)
''')
    config = _run_config(tmp_path, tiny_model_dir, max_steps=1)
    script = Path(sys.executable).with_name("ictrl")
    command = [str(script)] if script.is_file() else [sys.executable, "-m", "ictrl"]
    done = subprocess.run([*command, "train", str(config), "--token_selector=rules.py:global_rng",
                           "--num-processes", "2"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    errors = [line for line in done.stderr.splitlines() if line.startswith("ictrl train: error:")]
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert errors == ["ictrl train: error: selector rules.py:global_rng gave the processes different masks at step 0: "
                      "a rule must be a function of its inputs; draw random numbers from inputs.generator (seeded "
                      "from selection_seed and the step, the same on every process), not torch's global generator; "
                      "stopped at step 0; no checkpoint yet (save_steps)"]


def test_the_statistics_line_names_the_evaluations_path_where_it_differs() -> None:
    from ictrl.engine.stats_paths import Separate, TrainingForward, describe_statistics

    paths = {"train": TrainingForward(), "eval": Separate()}
    line = describe_statistics("rules.py:f", frozenset({"prob"}), paths, 0, evaluating=True)
    assert line == ("statistics: rules.py:f reads prob (pi of the sampled token); training computes them from the "
                    "loss's own forward, where the selection is made (ictrl/stats_path 2); no group JS sweep; "
                    "evaluation from a no-grad forward of their own at generation (ictrl/stats_path 0)")
    assert describe_statistics("rules.py:f", frozenset({"prob"}), paths, 0).endswith("no group JS sweep")
