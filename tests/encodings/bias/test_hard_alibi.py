"""Hard-ALiBi (Jelassi et al. 2024, "Repeat After Me: Transformers are Better than State Space
Models at Copying", arXiv 2402.01032) against its definition and its official code.

The official code (sjelassi/transformers_ssm_copy, ``synthetic_exps/models/
hard_alibi_model.py``, ``GPTHardAlibiAttention._attn``) gives head ``i < num_masked_heads`` an
additive mask that is 0 on the diagonals ``0 .. i`` below the main one and ``finfo.min``
elsewhere (a window of ``m_i = i + 1`` keys), and leaves the other heads without a positional
term (NoPE); ``synthetic_exps/main.py`` defaults to 8 such heads out of 16. The expected values
below are written out by hand from that rule, and the attention references are formed here in
float64 with explicit loops, independently of relpos.
"""

from __future__ import annotations

import math

import pytest
import torch

import relpos
from relpos.attention.linear import LinearState

INF = math.inf


def bias_table(enc: relpos.Encoding, length: int) -> torch.Tensor:
    """``(H, L, L)``: the bias alone (zero q and k), queries and keys at ``0 .. L-1``."""
    H, D = enc.num_heads, enc.head_dim
    zero = torch.zeros(1, H, length, D)
    return relpos.scores(zero, zero, enc)[0]


# ------------------------------------------------------------------ the bias, by hand


def test_default_four_heads_bias_rows_written_out():
    # H = 4: heads 0, 1 get windows 1, 2 (num_heads // 2 windowed heads), heads 2, 3 are NoPE.
    # Query 3 against keys 0..5 (d = 3, 2, 1, 0, -1, -2):
    enc = relpos.create("hard-alibi", num_heads=4, head_dim=8)
    row = bias_table(enc, 6)[:, 3]
    assert row[0].tolist() == [-INF, -INF, -INF, 0.0, -INF, -INF]  # window 1: itself only
    assert row[1].tolist() == [-INF, -INF, 0.0, 0.0, -INF, -INF]  # window 2: d = 1, 0
    assert row[2].tolist() == [0.0] * 6  # NoPE: no positional term, future keys included
    assert row[3].tolist() == [0.0] * 6


def test_bias_at_distance_per_head_matches_the_window_rule():
    # b_h(d) = 0 for 0 <= d < m_h, -inf otherwise; m = (3, inf, 1, 5)
    enc = relpos.create("hard-alibi", num_heads=4, head_dim=8, windows=[3, None, 1, 5])
    d = torch.arange(-2, 8)
    got = enc.bias_at_distance(torch.arange(4)[:, None], d[None, :])
    expected = [
        # d: -2    -1    0    1    2    3     4     5     6     7
        [-INF, -INF, 0.0, 0.0, 0.0, -INF, -INF, -INF, -INF, -INF],
        [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
        [-INF, -INF, 0.0, -INF, -INF, -INF, -INF, -INF, -INF, -INF],
        [-INF, -INF, 0.0, 0.0, 0.0, 0.0, 0.0, -INF, -INF, -INF],
    ]
    assert got.tolist() == expected


def test_official_default_sixteen_heads_eight_windows_one_to_eight():
    # main.py: --heads 16, --num_masked_heads 8 -> windows 1..8, then 8 NoPE heads
    enc = relpos.create("hard-alibi", num_heads=16, head_dim=8)
    assert enc.windows == (1, 2, 3, 4, 5, 6, 7, 8) + (None,) * 8
    assert relpos.create("hard-alibi", num_heads=16, head_dim=8, windowed_heads=8).windows == (
        enc.windows
    )


@pytest.mark.parametrize(("num_heads", "windowed"), [(1, 0), (3, 1), (5, 2), (12, 6)])
def test_default_windows_half_the_heads_rounded_down(num_heads, windowed):
    enc = relpos.create("hard-alibi", num_heads=num_heads, head_dim=8)
    assert enc.windows == tuple(range(1, windowed + 1)) + (None,) * (num_heads - windowed)


def test_windowed_head_i_is_the_band_of_diagonals_zero_to_i():
    # the official construction: zero on the diagonals j = 0..i below the main one, as a band
    # matrix tril(0) - tril(-(i + 1)); every other entry masked
    length, heads = 11, 12
    enc = relpos.create("hard-alibi", num_heads=heads, head_dim=8, windowed_heads=7)
    table = bias_table(enc, length)
    ones = torch.ones(length, length, dtype=torch.bool)
    for i in range(heads):
        if i < 7:
            band = torch.tril(ones) & ~torch.tril(ones, diagonal=-(i + 1))
            assert torch.equal(table[i] == 0, band), f"head {i}"
            assert bool((table[i][~band] == -INF).all()), f"head {i}"
        else:
            assert bool((table[i] == 0).all()), f"head {i} must be a NoPE head"


def test_no_parameters_nothing_in_the_state_dict_and_no_linear_pieces():
    enc = relpos.create("hard-alibi", num_heads=4, head_dim=8)
    assert list(enc.parameters()) == [] and enc.state_dict() == {}
    assert enc.linear_pieces() is None  # a step, not a line: no exact fold
    assert enc.causal_only and enc.distance_only and enc.relative


def test_the_window_test_stays_exact_when_the_module_is_cast_to_bfloat16():
    # bfloat16 cannot hold 1001 (it rounds to 1000): the windows are kept as integers
    enc = relpos.create("hard-alibi", num_heads=2, head_dim=8, windows=[1001, None])
    enc = enc.to(torch.bfloat16)
    d = torch.tensor([999, 1000, 1001, 1002])
    assert enc.bias_at_distance(torch.tensor(0), d).tolist() == [0.0, 0.0, -INF, -INF]


# ------------------------------------------------- attention: windows and NoPE heads


def reference_attention(q, k, v, windows, key_valid=None):
    """Causal softmax attention in float64 with explicit loops: head ``h`` of query ``i`` sees
    the keys ``j <= i`` with ``i - j < m_h`` (all of them for ``m_h = None``) that
    ``key_valid[b, j]`` allows; a query that sees no key gives 0."""
    B, H, L, D = q.shape
    out = torch.zeros(B, H, L, v.shape[-1], dtype=torch.float64)
    for b in range(B):
        for h, m in enumerate(windows):
            for i in range(L):
                keys = [
                    j
                    for j in range(i + 1)
                    if (m is None or i - j < m) and (key_valid is None or bool(key_valid[b, j]))
                ]
                if not keys:
                    continue
                logits = torch.stack([q[b, h, i] @ k[b, h, j] / math.sqrt(D) for j in keys])
                weights = torch.softmax(logits, dim=0)
                out[b, h, i] = sum(w * v[b, h, j] for w, j in zip(weights, keys, strict=True))
    return out


def qkv(B: int = 2, H: int = 4, L: int = 9, D: int = 8, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, L, D, generator=gen, dtype=torch.float64) for _ in range(3))


@pytest.mark.parametrize("backend", ["eager", "sdpa", "chunked"])
def test_attention_is_sliding_windows_plus_nope_heads(backend):
    windows = [1, 3, None, 5]
    enc = relpos.create("hard-alibi", num_heads=4, head_dim=8, windows=windows)
    q, k, v = qkv()
    out = relpos.attention(q, k, v, enc, causal=True, backend=backend)
    torch.testing.assert_close(out, reference_attention(q, k, v, windows), rtol=1e-12, atol=1e-12)


def test_the_official_finfo_min_mask_gives_the_same_weights():
    # the official code adds finfo.min (not -inf) outside the causal mask and the window
    windows = [1, 2, None, None]
    enc = relpos.create("hard-alibi", num_heads=4, head_dim=8)
    q, k, v = qkv()
    L = q.shape[2]
    low = torch.tensor(torch.finfo(torch.float64).min, dtype=torch.float64)
    d = torch.arange(L)[:, None] - torch.arange(L)[None, :]
    s = q @ k.transpose(-1, -2) / math.sqrt(8)
    s = torch.where(d >= 0, s, low)
    for h, m in enumerate(windows):
        if m is not None:
            s[:, h] = s[:, h] + torch.where((d >= 0) & (d < m), 0.0, low)
    official = torch.softmax(s, dim=-1) @ v
    out = relpos.attention(q, k, v, enc, causal=True, backend="eager")
    torch.testing.assert_close(out, official, rtol=1e-12, atol=1e-12)


def test_a_window_head_ignores_every_key_outside_its_window():
    enc = relpos.create("hard-alibi", num_heads=4, head_dim=8, windows=[2, 4, None, None])
    q, k, v = qkv(B=1, L=12)
    out = relpos.attention(q, k, v, enc, causal=True)
    k2, v2 = k.clone(), v.clone()
    k2[..., :6, :] = torch.randn_like(k2[..., :6, :])  # keys 0..5 change
    v2[..., :6, :] = torch.randn_like(v2[..., :6, :])
    out2 = relpos.attention(q, k2, v2, enc, causal=True)
    # query i of a head with window m reads keys i-m+1..i: unchanged from i = 5 + m on
    assert torch.equal(out[0, 0, 7:], out2[0, 0, 7:])
    assert torch.equal(out[0, 1, 9:], out2[0, 1, 9:])
    assert not torch.allclose(out[0, 2, -1], out2[0, 2, -1])  # a NoPE head sees them all


@pytest.mark.parametrize("backend", ["eager", "sdpa", "chunked"])
def test_padding_over_a_window_leaves_a_dead_row_that_gives_zero(backend):
    # head 0 (window 1) of a padded query sees no key at all: output 0, gradients finite
    windows = [1, 2, None, None]
    enc = relpos.create("hard-alibi", num_heads=4, head_dim=8)
    q, k, v = (x.requires_grad_() for x in qkv(L=8))
    valid = torch.ones(2, 8, dtype=torch.bool)
    valid[0, 5] = False
    valid[1, 2:4] = False
    out = relpos.attention(q, k, v, enc, causal=True, mask=valid[:, None, None, :], backend=backend)
    expected = reference_attention(q.detach(), k.detach(), v.detach(), windows, valid)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    assert bool((out[0, 0, 5] == 0).all()) and bool((out[1, 1, 3] == 0).all())
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    assert all(bool(torch.isfinite(g).all()) for g in grads)


# ----------------------------------------------------------------------------- errors


def test_non_causal_attention_is_refused():
    enc = relpos.create("hard-alibi", num_heads=4, head_dim=8)
    q, k, v = qkv()
    with pytest.raises(ValueError, match="causal"):
        relpos.attention(q, k, v, enc, causal=False)


@pytest.mark.parametrize(
    ("options", "exc", "match"),
    [
        ({"windowed_heads": 5}, ValueError, "windowed_heads must be <= num_heads=4"),
        ({"windowed_heads": -1}, ValueError, "windowed_heads"),
        ({"windowed_heads": 2.0}, TypeError, "windowed_heads"),
        ({"windows": [1, 2, 3]}, ValueError, r"windows must have one entry per head"),
        ({"windows": [1, 2, 0, None]}, ValueError, r"windows\[2\]"),
        ({"windows": [1, 2, 2.5, None]}, TypeError, r"windows\[2\]"),
        ({"windows": [1, True, 3, None]}, TypeError, r"windows\[1\]"),
        ({"windows": (1, 2, math.inf, None)}, TypeError, r"windows\[2\]"),
        ({"windows": 4}, TypeError, "windows must be a list or tuple"),
        ({"windows": []}, ValueError, "windows"),
        ({"windows": [1, 2, 3, 4], "windowed_heads": 2}, ValueError, "not both"),
    ],
)
def test_bad_options_are_refused_by_name(options, exc, match):
    with pytest.raises(exc, match=match):
        relpos.create("hard-alibi", num_heads=4, head_dim=8, **options)


def test_a_recurrent_linear_state_is_refused_by_name():
    # a hard window is no geometric decay: kernelized decoding needs a KV cache
    enc = relpos.create("hard-alibi", num_heads=4, head_dim=8).double()
    q, k, v = qkv()
    with pytest.raises(ValueError, match="hard-alibi"):
        for t in range(3):
            s = slice(t, t + 1)
            relpos.attention(
                q[:, :, s],
                k[:, :, s],
                v[:, :, s],
                enc,
                causal=True,
                feature_map="elu1",
                cache=LinearState(),
            )
