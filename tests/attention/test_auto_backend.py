"""``backend="auto"``: picks a correct backend (one of ``api.candidate_backends``) and never
materialises an L x L bias above ``relpos.attention.api.DENSE_BIAS_LIMIT`` elements."""

from __future__ import annotations

import math

import pytest
import torch

from conformance.common import (
    D,
    H,
    assert_close_rel,
    attention,
    in_table,
    lift_positions,
    make_encoding,
)
from relpos.attention import api
from relpos.attention.call import AttentionCall, prepare_call


def large_shape(enc) -> tuple[int, int]:
    """``(B, L)`` with ``B * H * L * L`` just above the limit (positions are reduced into a
    learned table shorter than L: ``common.in_table``)."""
    length = math.isqrt(api.DENSE_BIAS_LIMIT // H) + 8
    batch = api.DENSE_BIAS_LIMIT // (H * length * length) + 1
    assert batch * H * length * length > api.DENSE_BIAS_LIMIT
    return batch, length


def _call(enc, batch: int, length: int, causal: bool = True) -> AttentionCall:
    q = torch.randn(batch, H, length, D, requires_grad=True)  # a training step
    inputs = enc.example_inputs(batch, length, length, torch.Generator().manual_seed(0))
    pos = lift_positions(enc, in_table(enc, torch.arange(length)))
    return prepare_call(
        q, q, q, enc, q_pos=pos, k_pos=pos, causal=causal, mask=None, scale=None, inputs=inputs
    )


def test_auto_chooses_a_candidate_and_keeps_memory(name):
    """Whatever the table ranks, ``auto`` runs a candidate: above ``DENSE_BIAS_LIMIT`` never
    one that forms an ``Lq x Lk`` tensor for a score term, encodings beyond an additive score
    on eager / chunked only, and without a bias the fused kernels are among the candidates."""
    enc = make_encoding(name)
    large_call = _call(enc, *large_shape(enc))
    small_call = _call(enc, 2, 64)
    for call in (large_call, small_call):
        assert api.choose_backend(call) in api.candidate_backends(call)
    large = api.candidate_backends(large_call)
    if enc.needs_probabilities:
        assert large == ("chunked",), "weights beyond a score term, large: chunked only"
        assert api.candidate_backends(small_call) == ("eager", "chunked")
    elif enc.has_bias:
        assert "eager" not in large and "sdpa" not in large and "chunked" in large
    else:
        assert "sdpa" in large and "eager" not in large


@pytest.fixture
def bias_size_guard(monkeypatch):
    """Fails the test if any backend builds a bias block above DENSE_BIAS_LIMIT elements."""
    sizes: list[int] = []
    original = AttentionCall.bias_block

    def guarded(self, i, j):
        out = original(self, i, j)
        sizes.append(self.q.shape[0] * self.q.shape[1] * i.numel() * j.numel())
        assert out.numel() <= api.DENSE_BIAS_LIMIT, f"materialised bias {tuple(out.shape)}"
        return out

    monkeypatch.setattr(AttentionCall, "bias_block", guarded)
    return sizes


def test_auto_never_materialises_a_large_bias(name, bias_size_guard):
    enc = make_encoding(name)
    if not enc.needs_context:
        pytest.skip("no additive bias or weight hooks")
    batch, length = large_shape(enc)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(batch, H, length, D, generator=gen, requires_grad=True)
    k = torch.randn(batch, H, length, D, generator=gen, requires_grad=True)
    v = torch.randn(batch, H, length, D, generator=gen, requires_grad=True)
    out = attention(q, k, v, enc, causal=True)
    out.square().mean().backward()
    assert torch.isfinite(out).all() and torch.isfinite(q.grad).all()
    assert all(s <= api.DENSE_BIAS_LIMIT for s in bias_size_guard), bias_size_guard
    if enc.reads_past_queries:  # the last rows alone lack the earlier queries they read
        return
    # and the answer is the eager one on the last rows
    tail = 8
    with torch.no_grad():
        ref = attention(q[:, :, -tail:], k, v, enc, causal=True, backend="eager")
    assert_close_rel(out[:, :, -tail:].detach(), ref)
