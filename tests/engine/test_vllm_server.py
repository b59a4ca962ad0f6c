"""Server mode (``vllm_mode='server'``): at start-up ICTGRPOTrainer reads the hand-started server's
``logprobs_mode`` through TRL's ``VLLMClient.get_server_info`` (run as written, its HTTP session
answered in-process with a ``/server_info`` tree shaped like vLLM 0.31's: tests/fixtures/fake_vllm.py), and stops
with one line where the server cannot give what the run reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import mp_worker as w
from fixtures import fake_vllm
from ictrl.errors import UserError
from rollout_helpers import _load


def _server_trainer(monkeypatch: pytest.MonkeyPatch, model_dir: Path, tmp_path: Path,
                    session: fake_vllm.ServerSession, **overrides: Any) -> Any:
    from ictrl.engine.trainer import ICTGRPOTrainer

    clients = fake_vllm.install_server(monkeypatch, session)
    model, tokenizer = _load(model_dir)
    trainer = ICTGRPOTrainer(model=model, reward_funcs=w.digit_reward, train_dataset=w.make_dataset(),
                             processing_class=tokenizer,
                             args=w.make_config(tmp_path, use_vllm=True, vllm_mode="server", **overrides))
    assert len(clients) == 1 and trainer.vllm_generation.vllm_client is clients[0]
    return trainer


def test_server_settings_come_from_trls_client(tiny_model_dir: Path, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    session = fake_vllm.ServerSession(max_logprobs=-1, logprobs_mode="processed_logprobs")
    trainer = _server_trainer(monkeypatch, tiny_model_dir, tmp_path, session, token_selector="ict",
                              selection_topk=64, temperature=0.7)
    assert trainer._vllm_server_settings == {"logprobs_mode": "processed_logprobs"}
    assert any(url.endswith("/server_info") for url in session.requests)


@pytest.mark.parametrize(("overrides", "stops"), [
    ({}, "vllm_importance_sampling_correction need"),  # TRL's default: correction on
    ({"vllm_importance_sampling_correction": False, "selection_topk": 8}, None),
])
def test_unprocessed_logprobs_stop_where_they_are_read(tiny_model_dir: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch, overrides: dict[str, Any],
                                                       stops: str | None) -> None:
    session = fake_vllm.ServerSession(max_logprobs=-1, logprobs_mode="raw_logprobs")  # vLLM's default
    if stops is None:  # nothing reads the server's log-probs: a raw server is fine
        trainer = _server_trainer(monkeypatch, tiny_model_dir, tmp_path, session, token_selector="ict", **overrides)
        assert trainer._vllm_server_settings["logprobs_mode"] == "raw_logprobs"
        return
    with pytest.raises(UserError) as err:
        _server_trainer(monkeypatch, tiny_model_dir, tmp_path, session, token_selector="ict", **overrides)
    message = str(err.value)
    assert "\n" not in message and stops in message
    assert "logprobs_mode='raw_logprobs'" in message and "--logprobs-mode processed_logprobs" in message


def test_server_without_dev_mode_is_named_by_trl(tiny_model_dir: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(RuntimeError, match="VLLM_SERVER_DEV_MODE=1"):  # TRL's own message, from its client
        _server_trainer(monkeypatch, tiny_model_dir, tmp_path, fake_vllm.ServerSession(dev_mode=False))
