"""Conformance 4c: ``torch.compile`` of a function that calls ``relpos.attention`` works and
matches the uncompiled result (small shapes: inductor is slow on CPU)."""

from __future__ import annotations

import pytest
import torch

from relpos.attention import supported_backends

from .common import B, D, H, assert_close_rel, attention, make_encoding


@pytest.mark.slow  # inductor compiles per encoding and case: minutes on 2 cores (make test-slow)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_torch_compile_matches_eager(name, backend, causal):
    enc = make_encoding(name)
    if enc.causal_only and not causal:
        pytest.skip("causal-only encoding")
    if backend not in supported_backends(enc):
        pytest.skip("backend cannot run this encoding")
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, 16, D, generator=gen)
    k = torch.randn(B, H, 16, D, generator=gen)
    v = torch.randn(B, H, 16, D, generator=gen)

    def fn(q, k, v):
        return attention(q, k, v, enc, causal=causal, backend=backend)

    # a fresh dynamo state: every case compiles (no silent eager fallback at the recompile limit)
    torch._dynamo.reset()
    with torch.no_grad():
        ref = fn(q, k, v)
        out = torch.compile(fn)(q, k, v)
    assert_close_rel(out, ref)
