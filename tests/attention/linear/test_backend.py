"""The ``linear`` backend: dispatch, refusals by name, masks, decoding state, dtypes."""

from __future__ import annotations

import pytest
import torch

import relpos
from relpos.attention import plan
from relpos.attention.linear.backend import prepare_linear_call
from relpos.attention.linear.feature_maps import PositiveRandomFeatures
from relpos.attention.linear.kernelized import kernelized_attention, kernelized_reference
from relpos.attention.linear.state import LinearState

H, D = 4, 8


def qkv(lq=10, lk=None, batch=2, hkv=H, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    lk = lq if lk is None else lk
    q = torch.randn(batch, H, lq, D, generator=gen, dtype=dtype)
    k = torch.randn(batch, hkv, lk, D, generator=gen, dtype=dtype)
    v = torch.randn(batch, hkv, lk, D, generator=gen, dtype=dtype)
    return q, k, v


def elu1(x):
    return torch.nn.functional.elu(x) + 1


def test_auto_picks_linear_only_when_a_feature_map_is_asked_for():
    q, k, v = qkv()
    alibi = relpos.create("alibi", num_heads=H, head_dim=D)
    assert plan(q, k, v, alibi, feature_map="elu1") == ("linear", "linear-fft")
    assert plan(q, k, v, None, feature_map="elu1", causal=True) == ("linear", "linear-scan")
    assert plan(q, k, v, None, feature_map="relu") == ("linear", "linear-sum")
    assert plan(q, k, v, alibi)[0] != "linear"
    with pytest.raises(ValueError, match="only backend 'linear'"):
        relpos.attention(q, k, v, alibi, backend="sdpa", feature_map="elu1")
    with pytest.raises(ValueError, match="pass feature_map"):
        relpos.attention(q, k, v, alibi, backend="linear")
    with pytest.raises(ValueError, match="feature_map must be one of"):
        relpos.attention(q, k, v, alibi, feature_map="softmax")


def test_bias_path_is_the_kernelized_reference_with_the_encoding_table():
    q, k, v = qkv(9, 13)
    for name in ("alibi", "t5", "kerple-log", "sandwich", "fire"):
        enc = relpos.create(name, num_heads=H, head_dim=D).double()
        for causal in (False, True):
            out = relpos.attention(q, k, v, enc, causal=causal, feature_map="elu1")
            qp, kp = torch.arange(4, 13)[:, None], torch.arange(13)[None, :]
            b = enc.bias_at_distance(torch.arange(H)[:, None, None], (qp - kp)[None])
            if causal:
                b = b.masked_fill(kp > qp, float("-inf"))
            dist = torch.arange(9)[:, None] - torch.arange(13)[None, :] + 12
            table = torch.zeros(H, 21, dtype=torch.float64)
            table[:, dist] = b.expand(H, 9, 13).double()
            ref = kernelized_reference(elu1(q), elu1(k), v, table=table, causal=causal)
            # the encodings store their tables in float32: agreement to float32 rounding
            torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-6, msg=name)


def test_grouped_query_heads_and_half_precision():
    q, k, v = qkv(7, hkv=2)
    enc = relpos.create("alibi", num_heads=H, head_dim=D).double()
    out = relpos.attention(q, k, v, enc, causal=True, feature_map="elu1")
    k4, v4 = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    ref = relpos.attention(q, k4, v4, enc, causal=True, feature_map="elu1")
    torch.testing.assert_close(out, ref)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        low = relpos.attention(
            q.to(dtype), k.to(dtype), v.to(dtype), enc.float(), causal=True, feature_map="elu1"
        )
        assert low.dtype == dtype
        tol = 1e-5 if dtype == torch.float32 else 3e-2
        torch.testing.assert_close(low.double(), out, atol=tol * 4, rtol=tol)


def test_key_padding_masks_and_refused_masks():
    q, k, v = qkv(6)
    valid = torch.tensor([[True] * 4 + [False] * 2, [False] + [True] * 5])[:, None, None, :]
    out = relpos.attention(q, k, v, None, mask=valid, feature_map="elu1")
    ref = kernelized_reference(elu1(q), elu1(k), v, key_valid=valid[:, :, 0])
    torch.testing.assert_close(out, ref)
    additive = torch.zeros(2, 1, 1, 6).masked_fill(~valid, float("-inf"))
    torch.testing.assert_close(
        relpos.attention(q, k, v, None, mask=additive, feature_map="elu1"), out
    )
    with pytest.raises(ValueError, match="key-padding masks only"):
        relpos.attention(q, k, v, None, mask=torch.rand(6, 6) > 0.5, feature_map="elu1")
    with pytest.raises(ValueError, match="0 / -inf"):
        relpos.attention(q, k, v, None, mask=torch.randn(1, 1, 1, 6), feature_map="elu1")
    with pytest.raises(ValueError, match="mask_mod"):
        relpos.attention(q, k, v, None, mask_mod=lambda b, h, i, j: i >= j, feature_map="elu1")


def test_refusals_name_what_kernelized_attention_cannot_run():
    q, k, v = qkv(6)
    shaw = relpos.create("shaw", num_heads=H, head_dim=D)
    with pytest.raises(ValueError, match="backend 'linear' cannot run encoding 'shaw'"):
        relpos.attention(q, k, v, shaw, feature_map="elu1")
    alibi = relpos.create("alibi", num_heads=H, head_dim=D)
    batch_pos = torch.tensor([[0, 1, 2, 3, 5, 8], [1, 2, 3, 4, 5, 6]])
    with pytest.raises(ValueError, match="needs a Toeplitz bias"):
        relpos.attention(q, k, v, alibi, q_pos=batch_pos, k_pos=batch_pos, feature_map="elu1")
    with pytest.raises(ValueError, match="causal=True"):
        relpos.attention(q, k, v, None, feature_map="elu1", cache=LinearState())
    kerple = relpos.create("kerple-log", num_heads=H, head_dim=D)
    with pytest.raises(ValueError, match="no recurrent state"):
        relpos.attention(q, k, v, kerple, causal=True, feature_map="elu1", cache=LinearState())
    with pytest.raises(ValueError, match="pass feature_map"):
        relpos.attention(q, k, v, None, causal=True, cache=LinearState())


def test_alibi_takes_the_decayed_scan_and_decodes_with_a_state():
    q, k, v = qkv(12)
    sym = relpos.create("alibi", num_heads=H, head_dim=D, bidirectional="symmetric").double()
    assert plan(q, k, v, sym, feature_map="elu1")[1] == "linear-decay"
    assert plan(q, k, v, sym, causal=True, feature_map="elu1")[1] == "linear-decay"
    for causal in (False, True):  # the decayed scan equals the FFT of the same table
        out = relpos.attention(q, k, v, sym, causal=causal, feature_map="elu1")
        call = prepare_linear_call(
            q,
            k,
            v,
            sym,
            q_pos=None,
            k_pos=None,
            causal=causal,
            mask=None,
            scale=None,
            inputs=None,
            mask_mod=None,
            cache=None,
        )
        fft, _ = kernelized_attention(
            elu1(q), elu1(k), v, table=call.distance_table(causal), causal=causal, method="fft"
        )
        torch.testing.assert_close(out, fft, atol=1e-10, rtol=1e-8)
    full = relpos.attention(q, k, v, sym, causal=True, feature_map="elu1")
    state = LinearState()
    parts = [
        relpos.attention(
            q[:, :, t : t + 1],
            k[:, :, t : t + 1],
            v[:, :, t : t + 1],
            sym,
            causal=True,
            feature_map="elu1",
            cache=state,
        )
        for t in range(12)
    ]
    torch.testing.assert_close(torch.cat(parts, 2), full, atol=1e-10, rtol=1e-8)
    other = relpos.create("alibi", num_heads=H, head_dim=D, total_heads=2 * H).double()
    with pytest.raises(ValueError, match="another bias decay"):
        relpos.attention(
            q[:, :, :1],
            k[:, :, :1],
            v[:, :, :1],
            other,
            causal=True,
            feature_map="elu1",
            cache=state,
        )


@pytest.mark.parametrize("feature_map", ["elu1", "prf"])
def test_state_decoding_equals_the_full_forward(feature_map):
    """Token by token and in chunks; random-feature keys rescale the state when a later call
    brings a larger key offset (online-softmax trick)."""
    q, k, v = qkv(14, dtype=torch.float64)
    k = k * torch.linspace(0.2, 3.0, 14, dtype=torch.float64)[:, None]  # growing key norms
    fm = PositiveRandomFeatures(D, 16, normalize=False) if feature_map == "prf" else "elu1"
    full = relpos.attention(q, k, v, None, causal=True, feature_map=fm)
    state = LinearState()
    parts = []
    for s, e in ((0, 3), (3, 4), (4, 9), (9, 14)):
        parts.append(
            relpos.attention(
                q[:, :, s:e],
                k[:, :, s:e],
                v[:, :, s:e],
                None,
                causal=True,
                feature_map=fm,
                cache=state,
            )
        )
    torch.testing.assert_close(torch.cat(parts, 2), full, atol=1e-10, rtol=1e-8)
    assert state.length == 14


def test_kv_cache_decoding_with_a_bias_equals_the_full_forward():
    q, k, v = qkv(9)
    enc = relpos.create("alibi", num_heads=H, head_dim=D).double()
    full = relpos.attention(q, k, v, enc, causal=True, feature_map="elu1")
    cache = relpos.nn.LayerCache()
    parts = [
        relpos.attention(
            q[:, :, t : t + 1],
            k[:, :, t : t + 1],
            v[:, :, t : t + 1],
            enc,
            causal=True,
            feature_map="elu1",
            cache=cache,
        )
        for t in range(9)
    ]
    torch.testing.assert_close(torch.cat(parts, 2), full, atol=1e-10, rtol=1e-8)


def test_empty_calls_and_dead_rows():
    q, k, v = qkv(5, 0)
    q.requires_grad_()
    out = relpos.attention(q, k, v, None, feature_map="elu1", causal=True)
    assert out.shape == (2, H, 5, D) and (out == 0).all()
    q, k, v = qkv(6, 2)
    q.requires_grad_()
    enc = relpos.create("alibi", num_heads=H, head_dim=D).double()
    for e in (None, enc):
        out = relpos.attention(q, k, v, e, feature_map="elu1", causal=True)
        (g,) = torch.autograd.grad(out[:, :, :4].sum(), [q])
        assert (out[:, :, :4] == 0).all() and (g == 0).all()
