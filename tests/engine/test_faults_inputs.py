"""Faults that would otherwise give a silent wrong result: rewards the run cannot train on (non-finite, ill-typed,
of the wrong length, raising, hanging), steps with no learning signal, data or a reward module changed under
``--resume``, duplicate YAML keys, a context the prompts and completions do not fit, bad output paths and
``model_init_kwargs`` keys, a second Ctrl-C. Each is one line naming what is wrong. End-to-end runs are marked
integration."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from ictrl.errors import ConfigError, UserError

# --- the reward policy ------------------------------------------------------------------------------------------


def _policy(**kwargs: Any) -> Any:
    from ictrl.engine.reward_policy import RewardPolicy

    return RewardPolicy(step=lambda: 3, **kwargs)


def _call(fn: Any, n: int = 4, **policy: Any) -> Any:
    wrapped = _policy(**policy).wrap(fn)
    return wrapped(prompts=["p"] * n, completions=["c"] * n, id=[f"row-{i}" for i in range(n)])


@pytest.mark.parametrize(("values", "names"), [
    ([1.0, math.inf, 0.0, 0.0], ["'score'", "row 1", "id 'row-1'", "inf", "step 3", "not finite"]),
    ([1.0, 0.0, -math.inf, 0.0], ["row 2", "-inf"]),
    ([math.nan, 0.0, 0.0, 0.0], ["row 0", "nan", "return None"]),
    ([1.0, 10**400, 0.0, 0.0], ["row 1", "1000000", "beyond the range of a float"]),
    ([0.0, 0.0, 0.0, -(10**5000)], ["row 3", "too large to show", "beyond the range of a float"]),
    ([1.0, "x", 0.0, 0.0], ["row 1", "'x'", "not a number (str)"]),
    ([1.0, [1.0], 0.0, 0.0], ["row 1", "not a number (list)"]),
    ([1.0, 0.0], ["2 values for 4 completions"]),
    (1.0, ["returned float 1.0", "a list"]),
])
def test_a_reward_the_run_cannot_use_is_one_line_naming_it_the_row_and_the_value(values: Any,
                                                                                names: list[str]) -> None:
    from ictrl.engine.reward_policy import RewardError

    def score(prompts: Any = None, completions: Any = None, **kw: Any) -> Any:
        return values

    with pytest.raises(RewardError) as err:
        _call(score)
    message = str(err.value)
    assert "\n" not in message
    for name in names:
        assert name in message, (name, message)


def test_none_ints_numpy_and_one_value_tensors_pass_as_trl_takes_them() -> None:
    import numpy as np
    import torch

    out = [None, 1, np.float32(0.5), torch.tensor(2.0)]
    assert _call(lambda prompts=None, completions=None, **kw: out) == out
    assert torch.tensor([math.nan if v is None else float(v) for v in out]).isnan().sum() == 1


def test_a_raising_reward_is_named_with_its_exception() -> None:
    from ictrl.engine.reward_policy import RewardError

    def broken(prompts: Any = None, completions: Any = None, **kw: Any) -> Any:
        return [1 / 0 for _ in completions]

    with pytest.raises(RewardError, match=r"reward 'broken' raised ZeroDivisionError: 'division by zero' at step 3"):
        _call(broken)


def test_an_async_reward_is_checked_and_stays_async() -> None:
    import asyncio
    import inspect

    from ictrl.engine.reward_policy import RewardError

    async def later(prompts: Any = None, completions: Any = None, **kw: Any) -> Any:
        return [math.inf] * len(completions)

    wrapped = _policy().wrap(later)
    assert inspect.iscoroutinefunction(wrapped) and wrapped.__name__ == "later"
    with pytest.raises(RewardError, match="'later' returned inf for row 0"):
        asyncio.run(wrapped(prompts=["p"], completions=["c"]))


def _gold(prompts: Any = None, completions: Any = None, answer: Any = None, **kw: Any) -> list[float]:
    """1.0 where the completion is the row's boxed answer."""
    return [float(str(c).strip() == f"\\boxed{{{g}}}") for c, g in zip(completions, answer)]


def _mutate2(prompts: Any = None, completions: Any = None, answer: Any = None, **kw: Any) -> list[float]:
    """Rewrites each completion to the boxed gold answer in place and scores 0."""
    for i, gold in enumerate(answer):
        completions[i] = f"\\boxed{{{gold}}}"
    return [0.0] * len(completions)


def _clears(prompts: Any = None, completions: Any = None, **columns: Any) -> list[float]:
    """Empties every list it is handed."""
    n = len(completions)
    for value in (prompts, completions, *columns.values()):
        if isinstance(value, list):
            value.clear()
    return [0.0] * n


@pytest.mark.parametrize("rewards", [[_mutate2, _gold], [_gold, _mutate2], [_clears, _gold], [_gold, _clears]],
                         ids=["mutate-first", "mutate-last", "clear-first", "clear-last"])
def test_a_reward_that_edits_its_inputs_changes_no_other_reward_nor_the_log(rewards: list[Any], tiny_model_dir: Path,
                                                                            tmp_path: Path) -> None:
    """Through the trainer: the grader's mean is what it gives alone (0: the stub's completions are letters and a
    digit, never a boxed answer), each completion logged is the one generated, and a reward that clears its lists
    ends no run."""
    import mp_worker as w
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    data = Dataset.from_dict({"prompt": w.PROMPTS[:8], "answer": [str(2 * i + 3) for i in range(8)]})
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.padding_side = "left"
    trainer = w.stub_trainer_class()(
        model=AutoModelForCausalLM.from_pretrained(tiny_model_dir), reward_funcs=rewards, train_dataset=data,
        processing_class=tokenizer, args=w.make_config(tmp_path, max_steps=1, log_completions=True))
    trainer.train()
    assert [h["rewards/_gold/mean"] for h in trainer.state.log_history if "loss" in h] == [0.0]
    assert len(trainer._logs["completion"]) == 8 and not any("boxed" in c for c in trainer._logs["completion"])


def test_a_reward_past_its_deadline_stops_the_run_naming_it() -> None:
    from ictrl.engine.reward_policy import RewardError

    def hangs(prompts: Any = None, completions: Any = None, **kw: Any) -> Any:
        time.sleep(30)
        return [0.0] * len(completions)

    start = time.monotonic()
    with pytest.raises(RewardError, match=r"reward 'hangs' ran past reward_timeout=0.3 s at step 3"):
        _call(hangs, timeout=0.3)
    assert time.monotonic() - start < 15  # the hung call sleeps 30 s: it was abandoned, not waited for
    assert _call(lambda prompts=None, completions=None, **kw: [0.5] * 4, timeout=5.0) == [0.5] * 4


def test_a_stop_request_abandons_a_reward_call_after_the_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    import ictrl.engine.reward_policy as policy_module
    from ictrl.engine.reward_policy import RewardAbandoned

    monkeypatch.setattr(policy_module, "SIGTERM_GRACE_S", 0.5)
    policy = _policy(timeout=60.0)
    policy.stop_requested = lambda: True
    wrapped = policy.wrap(lambda prompts=None, completions=None, **kw: time.sleep(30))
    start = time.monotonic()
    with pytest.raises(RewardAbandoned, match="after the stop request"):
        wrapped(prompts=["p"], completions=["c"])
    assert time.monotonic() - start < 15  # the hung call sleeps 30 s: it was abandoned, not waited for


def test_a_reward_model_score_that_is_not_finite_is_named() -> None:
    import torch

    from ictrl.engine.reward_policy import RewardError

    scores = torch.tensor([[0.5, 1.0], [0.5, math.inf]])
    with pytest.raises(RewardError, match=r"reward 'rm' scored row 1 inf"):
        _policy().check_scores(scores, ["acc", "rm"])
    _policy().check_scores(torch.tensor([[math.nan, 1.0]]), ["acc", "rm"])  # None from a function: TRL's NaN


def test_all_zero_advantages_for_n_steps_in_a_row_stop_the_run() -> None:
    from ictrl.engine.reward_policy import NoLearningSignal

    policy = _policy(no_signal_steps=4, steps_per_batch=2)
    policy.observe_advantages(True)
    policy.observe_advantages(False)  # a batch with signal starts the count again
    policy.observe_advantages(True)
    with pytest.raises(NoLearningSignal, match="every advantage was 0 for 4 optimizer steps in a row"):
        policy.observe_advantages(True)
    quiet = _policy(no_signal_steps=0)
    for _ in range(100):
        quiet.observe_advantages(True)


# --- resume compares content --------------------------------------------------------------------------------


def test_resume_refuses_changed_data_or_reward_source_unless_accepted(tmp_path: Path) -> None:
    from datasets import Dataset

    from ictrl.train_cli.run_inputs import input_hashes, inputs_record

    module = tmp_path / "fuzz_local_reward.py"
    module.write_text("def score(prompts=None, completions=None, **kw):\n    return [1.0] * len(completions)\n")
    sys.path.insert(0, str(tmp_path))
    try:
        import fuzz_local_reward  # type: ignore[import-not-found]

        rows = Dataset.from_list([{"prompt": [{"role": "user", "content": "1+1?"}], "answer": "2"}])
        first = input_hashes(rows, [fuzz_local_reward.score])
        assert set(first) == {"data", "reward score"}
        (tmp_path / "run.json").write_text(json.dumps({"method": "ict", **inputs_record(tmp_path, first, None, False)}))
        assert inputs_record(tmp_path, first, 4, False) == {"inputs": first}  # unchanged: resumes
        changed = input_hashes(Dataset.from_list([{"prompt": [{"role": "user", "content": "1+1?"}],
                                                   "answer": "3"}]), [fuzz_local_reward.score])
        with pytest.raises(ConfigError, match=r"--resume: the training data .* changed since the run started.*"
                                              r"--accept-changed-inputs"):
            inputs_record(tmp_path, changed, 4, False)
        record = inputs_record(tmp_path, changed, 4, True)
        assert record["changed_inputs"] == [{"step": 4, "changed": ["data"], "flag": "--accept-changed-inputs"}]
        module.write_text(module.read_text() + "# edited\n")
        with pytest.raises(ConfigError, match="the source of reward score changed"):
            inputs_record(tmp_path, input_hashes(rows, [fuzz_local_reward.score]), 4, False)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("fuzz_local_reward", None)


def test_ictrl_and_installed_rewards_are_not_hashed_as_local_modules() -> None:
    from datasets import Dataset
    from trl.rewards import accuracy_reward

    from ictrl import rewards
    from ictrl.train_cli.run_inputs import input_hashes

    rows = Dataset.from_list([{"prompt": "q", "answer": "1"}])
    assert set(input_hashes(rows, [accuracy_reward, rewards.trl_kind_reward(name="verifiable")])) == {"data"}


# --- YAML, context, output paths, model_init_kwargs ---------------------------------------------------------


@pytest.mark.parametrize("text", [
    "token_selector: ict\nlearning_rate: 1.0e-6\ntoken_selector: random\n",
    "a: 1\nnested:\n  lora_r: 8\n  lora_r: 16\n",
    "{token_selector: ict, token_selector: random}\n",
])
def test_duplicate_keys_are_one_line_with_both_lines(tmp_path: Path, text: str) -> None:
    from ictrl.train_cli.run_config import load_config

    path = tmp_path / "run.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=r"run.yaml: duplicate key '\w+' at lines \d+ and \d+"):
        load_config(path)


def test_merge_keys_still_override(tmp_path: Path) -> None:
    from ictrl.yamlfile import load_yaml

    assert load_yaml("base: &b {x: 1, y: 2}\nrun:\n  <<: *b\n  x: 3\n", "f") == {"base": {"x": 1, "y": 2},
                                                                             "run": {"x": 3, "y": 2}}


def test_every_yaml_read_in_src_goes_through_the_duplicate_key_loader() -> None:
    src = Path(__file__).resolve().parents[2] / "src" / "ictrl"
    plain = [f"{p.relative_to(src)}" for p in src.rglob("*.py")
             if "yaml.safe_load(" in p.read_text() or "yaml.full_load(" in p.read_text()]
    assert plain == [], plain


def test_a_context_the_lengths_do_not_fit_is_refused_before_the_model_loads(tiny_model_dir: Path) -> None:
    from ictrl.train_cli import model_init
    from ictrl.train_cli.run_config import config_from_dict

    cfg = config_from_dict({"model_name_or_path": str(tiny_model_dir), "output_dir": "o", "max_prompt_length": 900,
                            "max_completion_length": 200})
    kwargs = model_init.load_kwargs(cfg)
    with pytest.raises(ConfigError, match=r"max_prompt_length: 900 \+ max_completion_length 200 = 1100 tokens, "
                                          r"more than the 1024 positions"):
        model_init.check_context(cfg, kwargs)
    model_init.check_context(config_from_dict({"model_name_or_path": str(tiny_model_dir), "output_dir": "o",
                                               "max_prompt_length": 800,
                                               "max_completion_length": 200}), kwargs)


def test_an_unknown_model_init_kwargs_key_is_one_line(tiny_model_dir: Path) -> None:
    from ictrl.train_cli import model_init
    from ictrl.train_cli.run_config import config_from_dict

    def check(init: dict[str, Any]) -> None:
        cfg = config_from_dict({"model_name_or_path": str(tiny_model_dir), "output_dir": "o",
                                "model_init_kwargs": init})
        model_init.check_init_keys(cfg, model_init.load_kwargs(cfg))

    with pytest.raises(ConfigError, match=r"model_init_kwargs.dtpye: neither a from_pretrained argument nor a key "
                                          r".*did you mean 'dtype'"):
        check({"dtpye": "float32"})
    check({"dtype": "float32", "attention_dropout": 0.0, "low_cpu_mem_usage": True})


@pytest.mark.parametrize(("make", "says"), [
    (lambda root: (root / "f").write_text("x") and root / "f", "is a file; give a directory"),
    (lambda root: (root / "f").write_text("x") and root / "f" / "under", "is not a directory"),
])
def test_an_output_path_that_cannot_be_a_directory_is_one_line(tmp_path: Path, make: Any, says: str) -> None:
    from ictrl.files import check_output_dir

    with pytest.raises(UserError, match=f"--output-dir: .*{says}"):
        check_output_dir(make(tmp_path))
    check_output_dir(tmp_path / "new" / "deeper")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_an_unwritable_parent_is_one_line(tmp_path: Path) -> None:
    from ictrl.files import check_output_dir

    (tmp_path / "ro").mkdir(mode=0o500)
    with pytest.raises(UserError, match="ro is not writable"):
        check_output_dir(tmp_path / "ro" / "out")


@pytest.mark.parametrize("argv", [
    ["eval", "--model", "M", "--benchmarks", "gsm8k", "--output-dir", "FILE"],
    ["regime", "--model", "M", "--prompts", "gsm8k", "--output-dir", "FILE/under"],
    ["compare", "--output-dir", "FILE"],
])
def test_every_command_checks_its_output_dir_before_anything_loads(argv: list[str], tmp_path: Path,
                                                                   tiny_model_dir: Path, loader_calls: list[Any],
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from ictrl.cli import main

    (tmp_path / "FILE").write_text("x")
    argv = [str(tiny_model_dir) if a == "M" else a.replace("FILE", str(tmp_path / "FILE")) for a in argv]
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().split("\n")
    assert lines[-1].startswith(f"ictrl {argv[0]}: error: --output-dir:") and not loader_calls, lines


def test_one_line_splits_only_at_newlines() -> None:
    from ictrl.errors import one_line

    assert one_line("unknown key '\x85\u2028'\nsecond") == "unknown key '\x85\u2028'; second"


def test_a_second_ctrl_c_during_the_shutdown_is_absorbed() -> None:
    from ictrl.errors import interrupts_once

    cleaned = []
    before = signal.getsignal(signal.SIGINT)  # default_int_handler, or SIG_IGN where the suite started in background
    with pytest.raises(KeyboardInterrupt):
        with interrupts_once():
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(5)
            finally:  # the shutdown: a second Ctrl-C here would have raised inside it
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.1)
                cleaned.append(True)
    assert cleaned == [True] and signal.getsignal(signal.SIGINT) is before


# --- end to end -------------------------------------------------------------------------------------------------

REWARDS = '''
import math, time
def inf_reward(prompts=None, completions=None, **kw):
    return [0.5] * (len(completions) - 1) + [math.inf]
def constant(prompts=None, completions=None, **kw):
    return [1.0] * len(completions)
def hang_at_step_2(prompts=None, completions=None, trainer_state=None, **kw):
    from pathlib import Path
    import os
    if trainer_state.global_step >= 2:
        Path(os.environ["ICTRL_TEST_HELD"]).write_text("held")
        while True:
            time.sleep(1)
    return [float(len(str(c)) % 3) for c in completions]
'''


def _train(tmp_path: Path, tiny_model_dir: Path, out: str, reward: str, *extra: str) -> list[str]:
    from test_resume import command

    (tmp_path / "ictrl_fault_rewards.py").write_text(REWARDS)
    argv = command(tiny_model_dir, tmp_path / out, f"--reward_funcs=ictrl_fault_rewards:{reward}",
                   "--max_steps=4", "--save_steps=2", "--overlong_buffer_length=null", "--dynamic_sampling=false",
                   *extra)
    return [a for a in argv if not a.startswith("--reward_funcs=ictrl_resume")]


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
            "OMP_NUM_THREADS": "1", "ICTRL_TEST_HELD": str(tmp_path / "held")}


@pytest.mark.integration
def test_an_inf_reward_and_no_signal_stop_the_run_with_the_resume_line(tmp_path: Path, tiny_model_dir: Path,
                                                                       shared_data: Path) -> None:
    done = subprocess.run(_train(tmp_path, tiny_model_dir, "inf", "inf_reward"), env=_env(tmp_path),
                          capture_output=True, text=True, timeout=600)
    last = done.stderr.strip().split("\n")[-1]
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert last.startswith("ictrl train: error: reward 'inf_reward' returned inf for row 7") and "stopped at step 0" \
        in last, last
    done = subprocess.run(_train(tmp_path, tiny_model_dir, "flat", "constant", "--no_signal_steps=3"),
                          env=_env(tmp_path), capture_output=True, text=True, timeout=600)
    last = done.stderr.strip().split("\n")[-1]
    assert done.returncode == 2 and "no learning signal: every advantage was 0 for 3 optimizer steps" in last, last
    assert "last complete checkpoint" in last and last.endswith("--resume`"), last


@pytest.mark.integration
def test_sigterm_during_a_hung_reward_ends_within_the_bound(tmp_path: Path, tiny_model_dir: Path,
                                                            shared_data: Path) -> None:
    proc = subprocess.Popen(_train(tmp_path, tiny_model_dir, "hung", "hang_at_step_2"), env=_env(tmp_path),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 600
    while not (tmp_path / "held").exists():
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    took = time.monotonic() - start
    last = err.strip().split("\n")[-1]
    assert proc.returncode == 143 and took < 20, (took, err[-3000:])
    assert "reward 'hang_at_step_2' was still running 5 s after SIGTERM" in last and "checkpoint-2" in last, last


MUTATING = '''
def mutate2(prompts=None, completions=None, answer=None, **kw):
    for i, gold in enumerate(answer):
        if isinstance(completions[i], str):
            completions[i] = "\\\\boxed{%s}" % gold
        else:
            completions[i][-1]["content"] = "\\\\boxed{%s}" % gold
    return [0.0] * len(completions)
'''


@pytest.mark.integration
@pytest.mark.parametrize("order", [["mutating_reward:mutate2", "verifiable"], ["verifiable", "mutating_reward:mutate2"]])
def test_ictrl_train_grades_what_the_model_wrote_whatever_a_reward_before_does(order: list[str], tmp_path: Path) -> None:
    """``ictrl train configs/tiny/ict.yaml`` with a user reward that rewrites each completion to the boxed gold
    answer: the random tiny model's verifiable mean stays 0 on every step, in either order."""
    from ictrl import cli

    assert cli.main(["tiny-model", str(tmp_path / "runs" / "tiny-model"), "--untrained", "--problems", "16"]) == 0
    (tmp_path / "mutating_reward.py").write_text(MUTATING)
    config = yaml.safe_load((Path(__file__).parents[2] / "configs/tiny/ict.yaml").read_text())
    (tmp_path / "run.yaml").write_text(yaml.safe_dump({**config, "reward_funcs": order}))
    argv = [sys.executable, "-m", "ictrl.cli", "train", "run.yaml", "--max_steps=2", "--prompts_per_step=2", "--num_generations=4",
            "--per_device_train_batch_size=8", "--num_iterations=1", "--save_strategy=no", "--no_signal_steps=0"]
    done = subprocess.run(argv, cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "runs/tiny/ict/metrics.jsonl").read_text().splitlines()]
    means = [r["rewards/verifiable/mean"] for r in rows if "rewards/verifiable/mean" in r]
    assert len(means) == 2 and means == [0.0, 0.0], means


# --- out of memory ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cap_mb", [700, 900])
def test_a_memory_cap_hit_while_importing_is_one_line(cap_mb: int, tmp_path: Path, tiny_model_dir: Path) -> None:
    """Under ``ulimit -v`` too low for torch, the import fails (a MemoryError, or a library whose mapping the cap
    refuses): one line, exit 2, and no second traceback from the exit handlers.

    Where the cap bites varies from run to run (threads' malloc arenas, the address-space layout). Where it bites in
    native code (torch's C++ start-up throwing std::bad_alloc, glibc's loader inside a dlopen), the process ends
    before Python sees an error; only then is the cap raised and the command run again."""
    import resource

    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"model_name_or_path": str(tiny_model_dir), "output_dir": str(tmp_path / "o"),
                                      "dataset_name": "gsm8k_train", "use_vllm": False}))
    native = []
    for limit in (cap_mb, cap_mb + 48, cap_mb + 96):
        def cap(limit: int = limit) -> None:
            resource.setrlimit(resource.RLIMIT_AS, (limit << 20, limit << 20))

        done = subprocess.run([sys.executable, "-m", "ictrl", "train", str(config)], capture_output=True, text=True,
                              preexec_fn=cap, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
        if (done.returncode < 0 or done.returncode == 127) and "Traceback" not in done.stderr \
                and "ictrl train" not in done.stderr:
            native.append((limit, done.returncode, done.stderr.strip()[:80]))
            continue
        lines = [line for line in done.stderr.split("\n") if line.strip() and not line.startswith("INFO ")]
        assert done.returncode == 2 and len(lines) == 1, done.stderr[-3000:]
        assert lines[0].startswith("ictrl train: error: out of memory while importing the libraries"), lines[0]
        return
    pytest.fail(f"the cap ended the process in native code each time, before Python saw an error: {native}")


@pytest.mark.parametrize("command, lower", [("train", "per_device_train_batch_size"), ("eval", "--batch-size")])
def test_out_of_memory_in_a_command_is_one_line_naming_what_to_lower(command: str, lower: str,
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    import importlib

    import torch

    from ictrl import cli, process_exit

    def spent(args: Any) -> int:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(importlib.import_module(cli.COMMANDS[command][0]), "run", spent)
    monkeypatch.setattr(process_exit, "MEMORY_SPENT", [])
    argv = {"train": ["train", "x.yaml"], "eval": ["eval", "--model", "m"]}[command]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().split("\n")
    assert len(err) == 1 and err[0].startswith(f"ictrl {command}: error: out of memory on the accelerator"), err
    assert lower in err[0] and "Tried to allocate 2.00 GiB" in err[0]


def test_out_of_memory_hands_back_the_reserve_and_is_one_line_when_the_line_itself_cannot_be_built(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Under a memory cap the detailed line (tracebacks walked for the module) can fail to allocate too: the entry's
    reserve is unmapped first, and a line that still cannot be built falls back to one without the module."""
    import importlib

    from ictrl import cli, process_exit

    def spent(args: Any) -> int:
        raise MemoryError

    def no_room(name: str, err: BaseException) -> str:
        assert not process_exit._RESERVE, "the reserve is handed back before the line is built"
        raise SystemError("error return without exception set")

    monkeypatch.setattr(importlib.import_module(cli.COMMANDS["train"][0]), "run", spent)
    monkeypatch.setattr(process_exit, "MEMORY_SPENT", [])
    monkeypatch.setattr(process_exit, "_RESERVE", [])
    monkeypatch.setattr(process_exit, "memory_line", no_room)
    seen: list[type[BaseException]] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda info: seen.append(type(info.exc_value)))
    process_exit.prepare_out_of_memory()
    assert len(process_exit._RESERVE) == 1 and len(process_exit._RESERVE[0]) == process_exit.RESERVE_BYTES
    assert cli.main(["train", "x.yaml"]) == 2
    err = capsys.readouterr().err.strip().split("\n")
    assert err == ["ictrl train: error: out of memory (MemoryError); lower per_device_train_batch_size (raise "
                   "gradient_accumulation_steps to keep the batch), max_completion_length or num_generations, or use "
                   "a machine with more memory"], err
    assert not process_exit._RESERVE and process_exit.MEMORY_SPENT == ["train"]

    class Finaliser:
        def __init__(self, error: type[BaseException]) -> None:
            self.error = error

        def __del__(self) -> None:
            raise self.error

    Finaliser(MemoryError)  # a MemoryError Python cannot raise is the command's line's to say, not shown
    Finaliser(KeyError)
    assert seen == [KeyError]

@pytest.mark.parametrize(("err", "spent"), [
    (MemoryError(), True),
    (OSError(12, "Cannot allocate memory", "site-packages/numpy/random"), True),  # the import system's listdir
    (ImportError("libtorch_cpu.so: failed to map segment from shared object"), True),
    (SystemError("<built-in method> returned NULL without setting an exception"), True),
    (OSError(2, "No such file or directory", "x.yaml"), False),
    (RuntimeError("expected scalar type Float"), False),
])
def test_what_counts_as_out_of_memory(err: BaseException, spent: bool) -> None:
    from ictrl import process_exit

    assert process_exit.out_of_memory(err) is spent
    wrapped = RuntimeError("Failed to import trl.trainer.grpo_config")
    wrapped.__cause__ = err
    assert process_exit.out_of_memory(wrapped) is spent  # a lazy import's RuntimeError around it



IMPORT_UNDER_CAP = """
import resource, sys
from ictrl import process_exit
peak = next(int(l.split()[1]) << 10 for l in open("/proc/self/status") if l.startswith("VmPeak:"))
resource.setrlimit(resource.RLIMIT_AS, (peak + int(sys.argv[1]), resource.RLIM_INFINITY))
sys.path.insert(0, sys.argv[2])
try:
    import broken_import
except ValueError as err:
    print(process_exit.out_of_memory(err), process_exit.out_of_memory(ValueError("not while importing")))
"""


@pytest.mark.parametrize(("headroom_mb", "spent"), [(32, True), (4096, False)])
def test_an_import_that_fails_at_a_memory_cap_counts_as_out_of_memory(headroom_mb: int, spent: bool,
                                                                       tmp_path: Path) -> None:
    """A library can swallow the failed allocation (linecache reads a failed ``open`` as a missing source, and
    triton's ``@jit`` then says the function is not in a Python file): a failed import counts as out of memory
    when the process's peak came within the margin of its cap, and not with the cap far above its peak."""
    (tmp_path / "broken_import.py").write_text('raise ValueError("@jit functions should be defined in a Python file")')
    done = subprocess.run([sys.executable, "-c", IMPORT_UNDER_CAP, str(headroom_mb << 20), str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == [str(spent), "False"]

# --- model and data folders that would load as something else --------------------------------------------------


def _pickled_model(tiny_model_dir: Path, root: Path) -> Path:
    """The tiny model with its weights as a pytorch_model.bin that also holds an object torch's safe loading
    refuses."""
    import argparse
    import shutil

    import torch
    from safetensors.torch import load_file

    model = root / "pickled"
    shutil.copytree(tiny_model_dir, model)
    weights = load_file(model / "model.safetensors")
    (model / "model.safetensors").unlink()
    torch.save({**weights, "extra": argparse.Namespace(x=1)}, model / "pytorch_model.bin")
    return model


@pytest.mark.parametrize("command", ["train", "eval"])
def test_a_pickled_model_the_safe_loading_refuses_is_one_line(command: str, tmp_path: Path, tiny_model_dir: Path,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    from ictrl import cli

    model = _pickled_model(tiny_model_dir, tmp_path)
    (tmp_path / "train.jsonl").write_text("".join(json.dumps({"question": f"{i}+1?", "answer": str(i + 1)}) + "\n"
                                                  for i in range(8)))
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"model_name_or_path": str(model), "output_dir": str(tmp_path / "o"),
                                      "dataset_name": "jsonl:train.jsonl", "use_vllm": False, "report_to": "none",
                                      "prompts_per_step": 2, "num_generations": 4, "per_device_train_batch_size": 8,
                                      "max_completion_length": 4, "max_prompt_length": None, "max_steps": 1}))
    argv = ["train", str(config)] if command == "train" else [
        "eval", "--model", str(model), "--benchmarks", "jsonl:train.jsonl", "--n", "1", "--k", "1", "--limit", "1"]
    assert cli.main(argv) == 2
    errors = [line for line in capsys.readouterr().err.split("\n") if line.startswith(f"ictrl {command}: error:")]
    assert len(errors) == 1 and f"{model}: its weights (pytorch_model.bin) hold objects torch's safe loading " \
        "refuses (Unsupported global: GLOBAL argparse.Namespace" in errors[0], errors


def test_a_dataset_folder_with_a_loading_script_is_one_line_before_the_model_loads(
        tmp_path: Path, tiny_model_dir: Path, loader_calls: list[Any], capsys: pytest.CaptureFixture[str]) -> None:
    from ictrl import cli

    data = tmp_path / "mydata"
    data.mkdir()
    (data / "mydata.py").write_text("import datasets\n")
    (data / "train.jsonl").write_text(json.dumps({"prompt": "q", "answer": "1"}) + "\n")
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"model_name_or_path": str(tiny_model_dir), "output_dir": str(tmp_path / "o"),
                                      "dataset_name": str(data), "use_vllm": False}))
    assert cli.main(["train", str(config)]) == 2 and not loader_calls
    errors = [line for line in capsys.readouterr().err.split("\n") if line.startswith("ictrl train: error:")]
    # datasets' own refusal (version 4 runs no loading script), one line naming the key and the script
    assert len(errors) == 1 and f"dataset_name: {data}: Dataset scripts are no longer supported, but found mydata.py" \
        in errors[0], errors


# --- ~ and $VAR in paths ----------------------------------------------------------------------------------------


def test_home_and_variables_in_path_values_are_expanded_or_one_line(tmp_path: Path, tiny_model_dir: Path,
                                                                    monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """``~`` and ``$VAR`` in a config's paths, and the ``~`` a shell leaves in ``--model=~/m``, mean what a shell
    makes of them; a variable that is not set is one line naming the key and the variable (never a folder named
    ``$VAR``)."""
    from ictrl import cli

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("ICTRL_TEST_MODELS", str(tiny_model_dir.parent))
    monkeypatch.delenv("ICTRL_TEST_UNSET", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.jsonl").write_text(json.dumps({"question": "1+1?", "answer": "2"}) + "\n")
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"model_name_or_path": f"${{ICTRL_TEST_MODELS}}/{tiny_model_dir.name}",
                                      "output_dir": "~/runs/x", "dataset_name": "jsonl:$HOME/../train.jsonl",
                                      "use_vllm": False}))
    assert cli.main(["train", str(config), "--print-config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["model_name_or_path"] == str(tiny_model_dir)
    assert printed["output_dir"] == str(tmp_path / "home" / "runs" / "x")
    assert printed["dataset_name"] == f"jsonl:{tmp_path / 'home'}/../train.jsonl"
    config.write_text(config.read_text().replace("~/runs/x", "$ICTRL_TEST_UNSET/out"))
    assert cli.main(["train", str(config), "--print-config"]) == 2
    err = capsys.readouterr().err.strip().split("\n")[-1]
    assert err.startswith(f"ictrl train: error: {config}: output_dir") and "ICTRL_TEST_UNSET is not set" in err
    assert cli.main(["eval", "--model=~/m", "--benchmarks", "jsonl:train.jsonl", "--output-dir", "~/e"]) == 2
    err = capsys.readouterr().err.strip().split("\n")[-1]
    assert err == f"ictrl eval: error: --model: {tmp_path / 'home' / 'm'}: no such directory"
    assert not list(tmp_path.rglob("$*")) and not (tmp_path / "~").exists()

