"""TransformerLM's output layer: a layer of its own (the default, ``tie_embedding=False``) or
tied to the token embedding (``tie_embedding=True``, what every checkpoint saved before the
untied default holds)."""

from __future__ import annotations

import math

import pytest
import torch

import relpos
from relpos_lab.training.train import TrainConfig, build_model, check_compatible

DIM, VOCAB = 32, 64


def model(seed: int = 0, encoding: str = "alibi", **kwargs) -> relpos.nn.TransformerLM:
    torch.manual_seed(seed)
    return relpos.nn.TransformerLM(VOCAB, DIM, 2, 4, encoding, **kwargs)


def logits_and_final_norm(m: relpos.nn.TransformerLM, tokens: torch.Tensor):
    """The model's logits and the output of its final norm in the same call."""
    seen = []
    hook = m.norm.register_forward_hook(lambda _m, _i, out: seen.append(out))
    try:
        with torch.no_grad():
            logits = m(tokens)
    finally:
        hook.remove()
    return logits, seen[0]


def test_default_head_is_a_layer_of_its_own():
    m = model()
    assert m.tie_embedding is False and m.head is not None and "head.weight" in m.state_dict()


def test_tied_head_is_the_token_embedding_with_no_weight_of_its_own():
    m = model(init="gpt2", tie_embedding=True).eval()
    assert m.tie_embedding is True and m.head is None
    assert "head.weight" not in m.state_dict()
    logits, hidden = logits_and_final_norm(m, torch.randint(0, VOCAB, (2, 5)))
    torch.testing.assert_close(logits, hidden @ m.embed.weight.t())  # (fan-in: * dim^-1/2)


@pytest.mark.parametrize("encoding", ["alibi", "rope"])
def test_untied_logits_are_the_head_of_the_final_norm(encoding):
    m = model(encoding=encoding, tie_embedding=False).eval()
    assert m.head.weight.shape == (VOCAB, DIM) and m.head.bias is None
    tokens = torch.randint(0, VOCAB, (2, 5))
    logits, hidden = logits_and_final_norm(m, tokens)
    torch.testing.assert_close(logits, hidden @ m.head.weight.t())
    with torch.no_grad():
        m.head.weight.zero_()
        assert torch.count_nonzero(m(tokens)) == 0  # the embedding no longer reaches the logits


@pytest.mark.parametrize("init", ["gpt2", "fan-in"])
def test_untied_model_draws_every_other_weight_as_the_tied_one(init):
    """The head is built and drawn last: one seed gives the tied and untied models the same
    embedding, attention and MLP weights, so an ablation changes the head only."""
    tied, untied = model(init=init, tie_embedding=True), model(init=init, tie_embedding=False)
    other = untied.state_dict()
    assert set(other) - set(tied.state_dict()) == {"head.weight"}
    for name, value in tied.state_dict().items():
        torch.testing.assert_close(other[name], value, rtol=0, atol=0, msg=name)


def test_untied_head_init_follows_init():
    gpt2 = model(init="gpt2", tie_embedding=False)
    assert gpt2.head.weight.std().item() == pytest.approx(0.02, rel=0.1)
    assert gpt2.logit_scale == 1.0
    fan_in = model(init="fan-in", tie_embedding=False)
    bound = DIM**-0.5  # nn.Linear's uniform(+-1/sqrt(fan_in)), x-transformers' LinearNoBias
    assert fan_in.head.weight.abs().max().item() <= bound
    assert fan_in.head.weight.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.1)
    assert fan_in.logit_scale == 1.0  # the dim ** -0.5 scale belongs to the tied head only


def test_untied_embedding_gets_gradient_only_on_the_rows_it_embeds():
    tokens = torch.tensor([[1, 2, 3, 1]])
    for tie, unused_grad in ((True, True), (False, False)):
        m = model(tie_embedding=tie)
        m(tokens).sum().backward()
        unused = m.embed.weight.grad[4:]
        assert bool(torch.count_nonzero(unused)) is unused_grad


def test_checkpoints_load_only_into_the_head_they_were_saved_with():
    tied, untied = model(tie_embedding=True), model(tie_embedding=False)
    model(seed=1, tie_embedding=True).load_state_dict(tied.state_dict())
    model(seed=1, tie_embedding=False).load_state_dict(untied.state_dict())
    earlier = r"no 'head.weight'.*tie_embedding=True\) \(with init='gpt2'"
    with pytest.raises(ValueError, match=earlier):
        model().load_state_dict(tied.state_dict())  # a checkpoint of the earlier default
    with pytest.raises(ValueError, match=r"untied head.*tie_embedding=False"):
        model(tie_embedding=True).load_state_dict(untied.state_dict())
    # strict=False leaves the choice to the caller, as nn.Module does
    assert model().load_state_dict(tied.state_dict(), strict=False).missing_keys == ["head.weight"]


def test_non_bool_tie_embedding_is_refused_by_name():
    with pytest.raises(TypeError, match="tie_embedding must be a bool, got 'no'"):
        model(tie_embedding="no")
    with pytest.raises(TypeError, match="tie_embedding must be a bool, got 0"):
        TrainConfig(encoding="alibi", tie_embedding=0)


def test_lab_configs_record_the_head_and_those_saved_before_it_rebuild_the_tied_model():
    saved = TrainConfig(encoding="alibi", dim=DIM, depth=2, tie_embedding=False).to_json()
    assert build_model(TrainConfig.from_json(saved), VOCAB).head is not None
    del saved["tie_embedding"]  # a state.json written before the option
    old = TrainConfig.from_json(saved)
    assert old.tie_embedding is True and build_model(old, VOCAB).head is None


def test_resuming_a_checkpoint_with_the_other_head_is_refused_naming_tie_embedding():
    class Corpus:
        vocab_size, tokenizer, name = 256, "bytes", "x"

        def fingerprint(self) -> str:
            return "f"

    saved = TrainConfig(encoding="alibi").to_json()
    del saved["tie_embedding"]  # written before the option: a tied model
    state = {
        "config": saved,
        "vocab_size": 256,
        "corpus": {"tokenizer": "bytes", "fingerprint": "f"},
    }
    untied = TrainConfig(encoding="alibi", tie_embedding=False)
    with pytest.raises(ValueError, match=r"tie_embedding \(True in the checkpoint, False now\)"):
        check_compatible(untied, Corpus(), state, "run")
    tied = TrainConfig(encoding="alibi", tie_embedding=True)
    assert check_compatible(tied, Corpus(), state, "run") is None
