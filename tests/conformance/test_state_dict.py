"""Conformance 4b: ``state_dict`` round-trips (encoding alone and inside a model)."""

from __future__ import annotations

import io

import pytest
import torch

import relpos
from relpos.registry import encoding_class

from .common import (
    B,
    D,
    H,
    attention,
    head_dim_refused,
    in_table,
    make_encoding,
    model_inputs,
    scores,
    table_holds,
)


def _outputs(enc) -> list[torch.Tensor]:
    """Everything the encoding computes from its state: logits, causal attention, embeddings."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, 24, D, generator=gen)
    k = torch.randn(B, H, 24, D, generator=gen)
    pos = in_table(enc, torch.arange(24))
    outs = [
        scores(q, k, enc, q_pos=pos, k_pos=pos),
        attention(q, k, k, enc, causal=True, backend="eager"),
    ]
    if enc.adds_to_input:
        outs.append(enc.embed(pos[None], H * D))
    return outs


def _round_trip(state: dict) -> dict:
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def test_state_dict_round_trip(name):
    src = make_encoding(name, seed=0)
    dst = make_encoding(name, seed=1)
    with torch.no_grad():  # make sure the two differ even if the init were deterministic
        for p in dst.parameters():
            p.add_(torch.randn_like(p) * 0.1 + 0.05)
    if src.learnable:
        assert any(not torch.equal(a, b) for a, b in zip(_outputs(src), _outputs(dst), strict=True))
    state = _round_trip(src.state_dict())
    assert set(state) == set(dst.state_dict())
    dst.load_state_dict(state)
    for key, value in dst.state_dict().items():
        assert torch.equal(value, src.state_dict()[key]), key
    for a, b in zip(_outputs(src), _outputs(dst), strict=True):
        assert torch.equal(a, b)


@torch.no_grad()
def test_model_state_dict_round_trip(name):
    if not table_holds(make_encoding(name), 20):
        pytest.skip("the learned table holds fewer positions than the test sequence")
    if (why := head_dim_refused(name, 32 // 4)) is not None:
        pytest.skip(why)
    torch.manual_seed(0)
    options = encoding_class(name).example_options()
    src = relpos.nn.TransformerLM(
        50, dim=32, depth=2, num_heads=4, encoding=name, encoding_options=options
    ).eval()
    torch.manual_seed(1)
    dst = relpos.nn.TransformerLM(
        50, dim=32, depth=2, num_heads=4, encoding=name, encoding_options=options
    ).eval()
    dst.load_state_dict(_round_trip(src.state_dict()))
    toks = torch.randint(0, 50, (2, 20), generator=torch.Generator().manual_seed(0))
    kw = model_inputs(name, 2, 20)
    assert torch.equal(src(toks, **kw), dst(toks, **kw))
