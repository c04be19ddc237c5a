"""TransformerLM's weight initialisations: "fan-in" (the default, x-transformers' defaults)
and "gpt2" (GPT-2's, the default before), and what they leave alone."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import relpos
from relpos.nn.transformer import INIT_SCHEMES
from relpos_lab.training.train import TrainConfig, build_model, check_compatible

DIM = 32


def model(encoding: str = "alibi", seed: int = 0, **kwargs) -> relpos.nn.TransformerLM:
    torch.manual_seed(seed)
    return relpos.nn.TransformerLM(256, DIM, 2, 4, encoding, **kwargs)


def test_fan_in_is_he_embedding_pytorch_linears_and_a_scaled_tied_head():
    m = model(tie_embedding=True)
    assert model().init == "fan-in"  # the default
    assert m.init == "fan-in" and m.logit_scale == pytest.approx(DIM**-0.5)
    # He normal on the token embedding: std sqrt(2 / dim) (fan-in = dim for an Embedding)
    assert m.embed.weight.std().item() == pytest.approx(math.sqrt(2 / DIM), rel=0.05)
    # nn.Linear's own fan-in init: uniform in +-1/sqrt(fan_in), biases too (not zeroed)
    for lin in (m.blocks[0].attn.q_proj, m.blocks[1].mlp.fc_in, m.blocks[1].mlp.fc_out):
        bound = lin.in_features**-0.5
        assert lin.weight.abs().max().item() <= bound
        assert lin.weight.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.1)
    assert m.blocks[0].mlp.fc_in.bias.abs().max().item() > 0


def test_fan_in_logits_are_the_tied_head_times_dim_to_the_minus_half():
    m = model("alibi", init="fan-in", tie_embedding=True).eval()
    tokens = torch.randint(0, 256, (2, 7))
    with torch.no_grad():
        logits = m(tokens)
        m.logit_scale = 1.0
        unscaled = m(tokens)
    torch.testing.assert_close(logits, unscaled * DIM**-0.5)


def test_gpt2_init_is_the_earlier_default_model():
    m = model(init="gpt2", tie_embedding=True)
    assert m.init == "gpt2" and m.logit_scale == 1.0 and m.head is None
    assert m.embed.weight.std().item() == pytest.approx(0.02, rel=0.05)
    q = m.blocks[0].attn.q_proj.weight
    assert q.std().item() == pytest.approx(0.02, rel=0.1)
    out = m.blocks[0].attn.out_proj.weight
    assert out.std().item() == pytest.approx(0.02 / math.sqrt(2 * 2), rel=0.1)
    assert torch.count_nonzero(m.blocks[0].mlp.fc_in.bias) == 0


@pytest.mark.parametrize("encoding", ["fire", "t5", "learned"])
def test_state_dict_keys_do_not_depend_on_init_and_encodings_init_the_same(encoding):
    """Checkpoints of either init load into the other; an encoding's own layers get the
    same init under both (FIRE keeps its input layer, the rest is N(0, 0.02))."""
    a, b = model(encoding, init="gpt2"), model(encoding, init="fan-in")
    assert a.state_dict().keys() == b.state_dict().keys()
    b.load_state_dict(a.state_dict())
    fan_in = model(encoding, init="fan-in")
    enc = fan_in.blocks[0].attn.encoding or fan_in.input_encoding
    for sub in enc.modules():
        if isinstance(sub, (nn.Linear, nn.Embedding)) and id(sub) not in {
            id(m) for m in enc.modules_keeping_init()
        }:
            assert sub.weight.std().item() == pytest.approx(0.02, rel=0.3)
    if encoding == "fire":  # its scalar-input layer keeps PyTorch's init (weights in [-1, 1])
        assert enc.mlp_in.weight.abs().max().item() > 0.1


def test_unknown_init_is_refused_by_name():
    with pytest.raises(ValueError, match=r"init must be one of gpt2, fan-in, got 'xavier'"):
        model(init="xavier")
    with pytest.raises(ValueError, match="init must be one of"):
        TrainConfig(encoding="alibi", init="xavier")
    assert INIT_SCHEMES == ("gpt2", "fan-in")


def test_lab_configs_record_init_and_those_saved_before_it_rebuild_the_gpt2_model():
    saved = TrainConfig(encoding="alibi", dim=DIM, depth=2, init="fan-in").to_json()
    assert build_model(TrainConfig.from_json(saved), 256).init == "fan-in"
    del saved["init"]  # a state.json written before the "init" field
    old = TrainConfig.from_json(saved)
    assert old.init == "gpt2" and build_model(old, 256).logit_scale == 1.0


def test_resuming_a_checkpoint_of_the_other_init_is_refused_naming_init():
    class Corpus:
        vocab_size, tokenizer, name = 256, "bytes", "x"

        def fingerprint(self) -> str:
            return "f"

    config = TrainConfig(encoding="alibi", init="fan-in", tie_embedding=True)
    saved = TrainConfig(encoding="alibi").to_json()
    del saved["init"], saved["tie_embedding"]  # written before both fields: gpt2, tied
    state = {
        "config": saved,
        "vocab_size": 256,
        "corpus": {"tokenizer": "bytes", "fingerprint": "f"},
    }
    with pytest.raises(ValueError, match=r"init \('gpt2' in the checkpoint, 'fan-in' now\)"):
        check_compatible(config, Corpus(), state, "run")
    earlier = TrainConfig(encoding="alibi", init="gpt2", tie_embedding=True)
    assert check_compatible(earlier, Corpus(), state, "run") is None
