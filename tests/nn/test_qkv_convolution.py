"""RCMHA's causal depth-wise q/k/v convolutions (``relpos.nn.qkv_convolution``,
``MultiHeadAttention(qkv_conv=K)``) against the official code (hermansh-id/rcmha
``SpatialDepthWiseConvolution``): worked taps, the padded and
trimmed ``Conv1d`` the official layer uses, a float64 reference of the whole RCMHA layer
written from the formula, and causal decoding through the KV cache.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import relpos
from relpos.nn import MultiHeadAttention, TransformerLM
from relpos.nn.cache import LayerCache
from relpos.nn.qkv_convolution import CausalDepthwiseConv


def test_spec_taps_on_a_ramp() -> None:
    conv = CausalDepthwiseConv(1, 3)
    with torch.no_grad():
        conv.conv.weight.copy_(torch.tensor([[[0.5, -1.0, 2.0]]]))  # taps t-2, t-1, t
        conv.conv.bias.zero_()
    y, tail = conv(torch.tensor([1.0, 2.0, 3.0, 4.0]).view(1, 1, 4, 1))
    assert y.flatten().tolist() == [2.0, 3.0, 4.5, 6.0]
    assert tail.flatten().tolist() == [3.0, 4.0]


@pytest.mark.parametrize("kernel_size", [1, 3, 4])
def test_equals_the_padded_and_trimmed_conv1d_shared_by_heads(kernel_size: int) -> None:
    torch.manual_seed(0)
    conv = CausalDepthwiseConv(5, kernel_size).double()
    x = torch.randn(2, 3, 7, 5, dtype=torch.float64)  # (B, H, L, d)
    ref = nn.Conv1d(5, 5, kernel_size, groups=5, padding=kernel_size - 1).double()
    ref.load_state_dict(conv.conv.state_dict())
    seq = x.permute(0, 1, 3, 2).reshape(6, 5, 7)  # (B * H, d, L): one kernel for every head
    want = ref(seq)[..., :7].reshape(2, 3, 5, 7).permute(0, 1, 3, 2)
    y, _ = conv(x)
    torch.testing.assert_close(y, want, rtol=1e-12, atol=1e-12)
    # split anywhere: the tail continues the sequence exactly
    y1, tail = conv(x[:, :, :3])
    y2, _ = conv(x[:, :, 3:], tail)
    torch.testing.assert_close(torch.cat((y1, y2), dim=2), want, rtol=1e-12, atol=1e-12)


def _conv_reference(x: torch.Tensor, conv: CausalDepthwiseConv) -> torch.Tensor:
    """``y[t, c] = b_c + sum_s w[c, s] x[t - (K - 1) + s, c]`` with zeros before the start."""
    w, b = conv.conv.weight[:, 0], conv.conv.bias  # (d, K), (d,)
    K, L = w.shape[1], x.shape[2]
    y = b.expand_as(x).clone()
    for t in range(L):
        for s in range(K):
            src = t - (K - 1) + s
            if src >= 0:
                y[:, :, t] += w[:, s] * x[:, :, src]
    return y


def _random_rcmha_layer(dim: int = 8, heads: int = 2, p: int = 4) -> MultiHeadAttention:
    torch.manual_seed(0)
    layer = MultiHeadAttention(
        dim, heads, "rcmha", encoding_options={"max_relative_position": p}, qkv_conv=3
    ).double()
    with torch.no_grad():
        for param in layer.encoding.parameters():
            param.normal_()
    return layer


def test_rcmha_layer_matches_a_float64_reference_of_the_formula() -> None:
    layer = _random_rcmha_layer()
    enc, H, d, P = layer.encoding, layer.num_heads, layer.head_dim, 4
    x = torch.randn(2, 7, 8, dtype=torch.float64, requires_grad=True)
    out = layer(x, causal=True)

    B, L = 2, 7
    q = x @ layer.q_proj.weight.t()
    k, v = (x @ layer.kv_proj.weight.t()).chunk(2, dim=-1)
    q, k, v = (t.view(B, L, H, d).transpose(1, 2) for t in (q, k, v))
    q, k, v = (_conv_reference(t, c) for t, c in zip((q, k, v), layer.qkv_conv, strict=True))
    logits = torch.empty(B, H, L, L, dtype=torch.float64)
    for i in range(L):
        for j in range(L):
            r = min(max(j - i, -P), P - 1) + P
            logits[:, :, i, j] = (
                ((q[:, :, i] + enc.content_bias) * k[:, :, j]).sum(-1)
                + (q[:, :, i] * enc.key_table[:, r]).sum(-1)
                + enc.distance_bias[:, r]
            ) / math.sqrt(d)
    logits = logits.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
    heads = torch.softmax(logits, -1) @ v
    want = heads.transpose(1, 2).reshape(B, L, H * d) @ layer.out_proj.weight.t()
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-12)
    g = torch.randn_like(want)
    params = [x, *layer.qkv_conv.parameters(), enc.key_table]
    for a, b in zip(
        torch.autograd.grad((out * g).sum(), params),
        torch.autograd.grad((want * g).sum(), params),
        strict=True,
    ):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


def test_zero_tables_make_the_layer_convolution_plus_nope() -> None:
    torch.manual_seed(1)
    rcmha = MultiHeadAttention(8, 2, "rcmha", qkv_conv=3)
    plain = MultiHeadAttention(8, 2, None, qkv_conv=3)
    plain.load_state_dict(rcmha.state_dict(), strict=False)
    x = torch.randn(2, 6, 8)
    torch.testing.assert_close(rcmha(x), plain(x))


def test_decoding_through_the_cache_equals_the_full_forward() -> None:
    torch.manual_seed(2)
    model = TransformerLM(
        50, dim=16, depth=2, num_heads=2, encoding="rcmha", qkv_conv=3, backend="eager"
    ).double()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "encoding" in name:
                param.normal_(std=0.3)
    tokens = torch.randint(0, 50, (2, 9))
    full = model(tokens)
    cache = model.new_cache()
    steps = [model(tokens[:, :5], cache=cache)]
    steps += [model(tokens[:, t : t + 1], cache=cache) for t in range(5, 9)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-10, atol=1e-10)


def test_a_cache_filled_without_the_convolution_state_is_refused() -> None:
    layer = MultiHeadAttention(8, 2, "rcmha", qkv_conv=3)
    plain = MultiHeadAttention(8, 2, "rcmha")
    cache = LayerCache()
    plain(torch.randn(1, 3, 8), cache=cache)
    with pytest.raises(ValueError, match="qkv_conv"):
        layer(torch.randn(1, 1, 8), cache=cache)


def test_options_are_checked_by_name_and_empty_calls_run() -> None:
    with pytest.raises(ValueError, match="qkv_conv"):
        MultiHeadAttention(8, 2, "rcmha", qkv_conv=0)
    with pytest.raises(TypeError, match="qkv_conv"):
        MultiHeadAttention(8, 2, "rcmha", qkv_conv=2.5)
    layer = MultiHeadAttention(8, 2, "rcmha", qkv_conv=3)
    assert layer(torch.randn(2, 0, 8)).shape == (2, 0, 8)
    with pytest.raises(ValueError, match="tail"):
        layer.qkv_conv[0](torch.randn(1, 2, 3, 4), torch.randn(1, 2, 1, 4))
    assert relpos.create("rcmha", num_heads=2, head_dim=4).has_bias


def test_segment_recurrence_trains_segment_by_segment_with_the_convolutions() -> None:
    from relpos.nn import SegmentRecurrence

    torch.manual_seed(4)
    model = TransformerLM(30, dim=16, depth=1, num_heads=2, encoding="rcmha", qkv_conv=3)
    rec = SegmentRecurrence(model, memory_length=4)
    tokens = torch.randint(0, 30, (2, 12))
    for segment in tokens.split(4, dim=1):  # the conv state is detached with the memory
        rec.step(segment).sum().backward()
    tails = rec.cache.layers[0].conv_tail
    assert tails is not None and not any(t.requires_grad for t in tails)
    with torch.no_grad():  # same forward as one call while the memory covers the conv
        full = model(tokens)
        rec.reset()
        parts = rec.run(tokens, 4)
    assert torch.allclose(parts[:, :4], full[:, :4], atol=1e-6)
