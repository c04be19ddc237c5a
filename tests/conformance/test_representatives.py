"""Fast representatives of the slow compile tests (the per-encoding versions run in
``make test-slow``): one compiled FlexAttention call and one ``torch.compile`` of attention."""

import pytest
import torch

import relpos


def _inputs(length: int = 128):
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(1, 4, length, 16, generator=gen) for _ in range(3)]


@pytest.mark.slow  # compiles FlexAttention
def test_flex_runs_a_bias_as_score_mod_and_matches_eager():
    enc = relpos.create("kerple-log", num_heads=4, head_dim=16)
    q, k, v = _inputs()
    with torch.no_grad():
        out = relpos.attention(q, k, v, enc, causal=True, backend="flex")
        ref = relpos.attention(q, k, v, enc, causal=True, backend="eager")
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.slow  # compiles
def test_torch_compile_of_rotary_attention_matches_eager():
    torch._dynamo.reset()
    enc = relpos.create("rope", num_heads=4, head_dim=16)
    q, k, v = _inputs(64)

    def fn(q, k, v):
        return relpos.attention(q, k, v, enc, causal=True, backend="sdpa")

    torch.testing.assert_close(torch.compile(fn)(q, k, v), fn(q, k, v), rtol=1e-5, atol=1e-5)
