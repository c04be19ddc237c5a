"""TransformerLM and LlamaLM check their token ids and generation counts by name."""

from __future__ import annotations

import pytest
import torch

import relpos


def test_tokens_outside_the_vocabulary_are_refused_by_name():
    lm = relpos.nn.TransformerLM(vocab_size=10, dim=16, depth=1, num_heads=2, encoding="rope")
    for bad in (torch.tensor([[1, 10]]), torch.tensor([[-1, 2]])):
        with pytest.raises(ValueError, match="tokens"):
            lm(bad)
    with pytest.raises(TypeError, match="tokens"):
        lm(torch.tensor([[1.0, 2.0]]))


def test_generate_refuses_a_negative_count():
    lm = relpos.nn.TransformerLM(vocab_size=10, dim=16, depth=1, num_heads=2, encoding="rope")
    with pytest.raises(ValueError, match="max_new_tokens"):
        lm.generate(torch.tensor([[1, 2]]), max_new_tokens=-1)
    assert lm.generate(torch.tensor([[1, 2]]), max_new_tokens=0).shape == (1, 2)


def test_llama_refuses_tokens_outside_its_vocabulary():
    from relpos.nn.llama import LlamaConfig, LlamaLM

    cfg = LlamaConfig(vocab_size=12, dim=16, depth=1, num_heads=2, num_kv_heads=1, hidden_dim=32)
    lm = LlamaLM(cfg)
    with pytest.raises(ValueError, match="tokens"):
        lm(torch.tensor([[3, 12]]))
