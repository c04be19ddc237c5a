"""relpos_lab.training.train and relpos_lab.training.checkpoint: resume equality, interrupts,
atomic files."""

from __future__ import annotations

import json
import math
import os
import signal
from pathlib import Path

import pytest
import torch

from relpos_lab.training import checkpoint as ckpt
from relpos_lab.training.data import load_corpus
from relpos_lab.training.train import (
    TrainConfig,
    TrainingInterrupted,
    build_model,
    learning_rate,
    load_trained,
    parameter_groups,
    train,
)

DATA = Path(__file__).resolve().parents[1] / "data"
TINY = dict(dim=32, depth=2, num_heads=2, seq_len=32, batch_size=8, steps=10, warmup=3)
TINY.update(checkpoint_every=4, device="cpu")


@pytest.fixture(scope="module")
def corpus():
    return load_corpus(DATA / "sonnets.txt")


def tiny(encoding: str = "alibi", **overrides) -> TrainConfig:
    return TrainConfig(encoding=encoding, **{**TINY, **overrides})


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key


def stop_at(step: int):
    def callback(done: int, loss: torch.Tensor) -> None:
        if done == step:
            raise KeyboardInterrupt

    return callback


@pytest.mark.parametrize("encoding", ["alibi", "rope"])
def test_interrupt_then_resume_equals_an_uninterrupted_run_bitwise(corpus, tmp_path, encoding):
    config = tiny(encoding)
    straight = train(config, corpus, tmp_path / "straight", progress=False)
    assert straight.steps == 10 and len(straight.losses) == 10
    assert all(math.isfinite(x) for x in straight.losses)
    assert straight.final_loss == pytest.approx(sum(straight.losses) / 10)
    assert straight.losses[-1] < straight.losses[0]

    folder = tmp_path / "split"
    with pytest.raises(TrainingInterrupted) as info:  # a KeyboardInterrupt after step 5
        train(config, corpus, folder, progress=False, callback=stop_at(5))
    assert isinstance(info.value, KeyboardInterrupt) and info.value.step == 5
    state = ckpt.read_state(folder)
    assert state["step"] == 5 and not state["complete"] and len(state["losses"]) == 5
    resumed = train(config, corpus, folder, resume=True, progress=False)
    assert resumed.steps == 10
    assert resumed.losses == straight.losses
    assert resumed.final_loss == straight.final_loss
    assert_same_weights(resumed.model, straight.model)
    assert resumed.train_seconds >= state["elapsed_seconds"]

    # a finished run resumes to itself without training; load_trained reads it back
    again = train(config, corpus, folder, resume=True, progress=False)
    assert again.losses == straight.losses
    model, loaded_config, loaded_state = load_trained(folder)
    assert loaded_config == config and loaded_state["complete"] and not model.training
    assert_same_weights(model, straight.model)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_checkpoints_restores_handlers_and_resumes_to_the_same_result(
    corpus, tmp_path, signum
):
    config = tiny("kerple-log", steps=8, checkpoint_every=0)
    straight = train(config, corpus, None, progress=False)
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)

    def send_signal(done: int, loss: torch.Tensor) -> None:
        if done == 3:
            os.kill(os.getpid(), signum)

    folder = tmp_path / "run"
    with pytest.raises(TrainingInterrupted) as info:
        train(config, corpus, folder, progress=False, callback=send_signal)
    assert info.value.signum == signum and info.value.step in (3, 4)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    assert ckpt.read_state(folder)["step"] == info.value.step
    resumed = train(config, corpus, folder, resume=True, progress=False)
    assert resumed.losses == straight.losses
    assert_same_weights(resumed.model, straight.model)


def test_a_failed_save_leaves_the_previous_checkpoint_intact(corpus, tmp_path, monkeypatch):
    config = tiny(steps=4)
    result = train(config, corpus, tmp_path, progress=False)
    files = {name: (tmp_path / name).read_bytes() for name in os.listdir(tmp_path)}
    assert set(files) == {ckpt.MODEL_FILE, ckpt.OPTIMIZER_FILE, ckpt.STATE_FILE}
    saved = {k: v.clone() for k, v in result.model.state_dict().items()}

    with torch.no_grad():
        for p in result.model.parameters():
            p.add_(1.0)
    optimizer = torch.optim.AdamW(result.model.parameters())

    def half_written(obj, path, *args, **kwargs):  # writes some bytes, then fails
        Path(path).write_bytes(b"partial")
        raise OSError("No space left on device")

    monkeypatch.setattr(ckpt.torch, "save", half_written)
    with pytest.raises(OSError, match="No space"):
        ckpt.save_checkpoint(tmp_path, result.model, optimizer, {"step": 99, "config": {}})
    monkeypatch.undo()
    # model.safetensors was replaced before the failure; state.json was not: detected, and
    # no temporary file is left behind
    assert sorted(os.listdir(tmp_path)) == sorted(files)
    assert (tmp_path / ckpt.OPTIMIZER_FILE).read_bytes() == files[ckpt.OPTIMIZER_FILE]
    assert (tmp_path / ckpt.STATE_FILE).read_bytes() == files[ckpt.STATE_FILE]
    with pytest.raises(ValueError, match="inconsistent"):
        load_trained(tmp_path)

    # a failure while writing the first file leaves every file as it was
    (tmp_path / ckpt.MODEL_FILE).write_bytes(files[ckpt.MODEL_FILE])

    def failing_model(model, path, *args, **kwargs):
        Path(path).write_bytes(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(ckpt, "save_model", failing_model)
    with pytest.raises(KeyboardInterrupt):
        ckpt.save_checkpoint(tmp_path, result.model, optimizer, {"step": 99, "config": {}})
    monkeypatch.undo()
    assert {name: (tmp_path / name).read_bytes() for name in os.listdir(tmp_path)} == files
    model, _, state = load_trained(tmp_path)
    assert state["step"] == 4
    assert all(torch.equal(v, saved[k]) for k, v in model.state_dict().items())


def test_resuming_from_an_incompatible_config_names_the_keys(corpus, tmp_path):
    train(tiny(steps=2), corpus, tmp_path, progress=False)
    with pytest.raises(ValueError, match="incompatible config") as info:
        train(tiny("rope", dim=48, steps=4), corpus, tmp_path, resume=True, progress=False)
    message = str(info.value)
    assert "encoding ('alibi' in the checkpoint, 'rope' now)" in message
    assert "dim (32 in the checkpoint, 48 now)" in message and "depth" not in message
    with pytest.raises(ValueError, match="seq_len"):
        train(tiny(seq_len=16, steps=4), corpus, tmp_path, resume=True, progress=False)
    other = load_corpus(DATA / "sonnets")
    with pytest.raises(ValueError, match="corpus"):
        train(tiny(steps=4), other, tmp_path, resume=True, progress=False)
    with pytest.warns(UserWarning, match="lr 0.001 -> 0.002"):
        train(tiny(steps=3, lr=2e-3), corpus, tmp_path, resume=True, progress=False)


def test_checkpoint_files_and_state(corpus, tmp_path):
    result = train(tiny(steps=5, checkpoint_every=2), corpus, tmp_path, progress=True)
    state = json.loads((tmp_path / ckpt.STATE_FILE).read_text())
    assert state["step"] == 5 and state["complete"] and state["losses"] == result.losses
    assert state["config"]["encoding"] == "alibi" and state["vocab_size"] == 256
    assert len(state["rng"]["batch"]) > 0 and all(0 <= v < 256 for v in state["rng"]["torch"])
    payload = torch.load(tmp_path / ckpt.OPTIMIZER_FILE, weights_only=True)
    assert payload["checkpoint_id"] == state["checkpoint_id"]
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]
    assert result.tokens_per_second > 0 and result.train_seconds > 0


def test_learning_rate_warms_up_linearly_then_decays_to_min_ratio():
    config = TrainConfig(encoding="rope", steps=100, warmup=10, lr=1e-3, min_lr_ratio=0.1)
    lrs = [learning_rate(s, config) for s in range(100)]
    assert lrs[0] == pytest.approx(1e-4) and lrs[9] == pytest.approx(1e-3)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:], strict=False))
    assert lrs[-1] == pytest.approx(1e-4)


def test_no_weight_decay_on_norms_biases_and_encoding_parameters():
    model = build_model(TrainConfig(encoding="t5", dim=32, depth=2, num_heads=2), 256)
    decay, rest = parameter_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    assert "embed.weight" in decayed and "blocks.0.attn.q_proj.weight" in decayed
    assert not any("norm" in n or "encoding" in n or n.endswith(".bias") for n in decayed)
    assert any("encoding" in names[id(p)] for p in rest["params"])
    assert rest["weight_decay"] == 0.0


@pytest.mark.parametrize(
    "overrides, match",
    [
        (dict(steps=0), "steps must be a positive int"),
        (dict(dim=30, num_heads=4), "divisible"),
        (dict(lr=-1.0), "lr"),
        (dict(min_lr_ratio=2.0), "min_lr_ratio"),
    ],
)
def test_bad_configs_raise_value_errors(overrides, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(encoding="rope", **overrides)


def test_resume_needs_an_out_dir_and_unknown_encodings_fail(corpus):
    with pytest.raises(ValueError, match="out_dir"):
        train(tiny(), corpus, None, resume=True)
    with pytest.raises(ValueError, match="unknown encoding 'no-such-encoding'"):
        train(tiny("no-such-encoding"), corpus, None, progress=False)
