"""Conformance 4a: gradients reach every learnable parameter of an encoding.

Through ``relpos.attention`` (backend auto, and chunked above 256 queries on both of its
paths) and through a ``TransformerLM`` loss. Encodings that act on the input
(``adds_to_input``) have no role in attention: they are checked through the model only.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import relpos
from relpos.registry import encoding_class

from .common import (
    Case,
    attention,
    build_inputs,
    encoding_params,
    head_dim_refused,
    make_encoding,
    model_inputs,
    table_holds,
)


def assert_gradients_reach(named_params, what: str) -> None:
    assert named_params, f"{what}: no learnable parameters"
    for n, p in named_params:
        assert p.grad is not None, f"{what}: no gradient reaches parameter {n!r}"
        assert torch.isfinite(p.grad).all(), f"{what}: non-finite gradient of {n!r}"
        assert p.grad.abs().max() > 0, f"{what}: zero gradient of {n!r}"


def _attention_loss(enc, case: Case, causal: bool, backend: str) -> None:
    inp = build_inputs(case, enc)
    q, k, v = (inp[n].requires_grad_(True) for n in ("q", "k", "v"))
    kw = {n: inp[n] for n in ("q_pos", "k_pos", "mask", "inputs") if n in inp}
    out = attention(q, k, v, enc, causal=causal, backend=backend, **kw)
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(7))
    (out * weight).sum().backward()
    for t, n in ((q, "q"), (k, "k"), (v, "v")):
        assert t.grad is not None and torch.isfinite(t.grad).all(), n


def _learnable_in_attention(name: str):
    enc = make_encoding(name)
    if not enc.learnable:
        pytest.skip("no learnable parameters")
    if enc.adds_to_input:
        pytest.skip("acts on the input embeddings, not in attention (see the model test)")
    return enc


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_gradients_reach_parameters_through_attention_auto(name, causal):
    enc = _learnable_in_attention(name)
    if enc.causal_only and not causal:
        pytest.skip("causal-only encoding")
    _attention_loss(enc, Case("auto", 64, 64, mask=not causal), causal, "auto")
    assert_gradients_reach(encoding_params(enc), f"{name} auto causal={causal}")


@pytest.mark.parametrize("pos", ["default", "batch"], ids=["toeplitz-or-tile", "tile"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_gradients_reach_parameters_through_chunked(name, causal, pos):
    enc = _learnable_in_attention(name)
    if enc.causal_only and not causal:
        pytest.skip("causal-only encoding")
    _attention_loss(enc, Case("chunked", 96, 96, pos=pos), causal, "chunked")  # both paths
    assert_gradients_reach(encoding_params(enc), f"{name} chunked causal={causal} pos={pos}")


@pytest.mark.parametrize("share", [True, False], ids=["shared", "per-layer"])
def test_gradients_reach_parameters_through_model(name, share):
    if not table_holds(make_encoding(name), 48):
        pytest.skip("the learned table holds fewer positions than the test sequence")
    if (why := head_dim_refused(name, 32 // 4)) is not None:
        pytest.skip(why)
    torch.manual_seed(0)
    model = relpos.nn.TransformerLM(
        50,
        dim=32,
        depth=2,
        num_heads=4,
        encoding=name,
        encoding_options=encoding_class(name).example_options(),
        share_encoding=share,
    )
    encodings = [m for m in model.modules() if isinstance(m, relpos.Encoding)]
    assert encodings, "the model holds no encoding module"
    if not any(e.learnable for e in encodings):
        pytest.skip("no learnable parameters")
    toks = torch.randint(0, 50, (2, 48), generator=torch.Generator().manual_seed(0))
    logits = model(toks, **model_inputs(name, 2, 48))
    F.cross_entropy(logits[:, :-1].reshape(-1, 50), toks[:, 1:].reshape(-1)).backward()
    for i, enc in enumerate(encodings):
        assert_gradients_reach(encoding_params(enc), f"{name} model encoding #{i}")
