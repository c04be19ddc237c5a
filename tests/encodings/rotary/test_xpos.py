"""xPos and hyperbolic-rope (``relpos.encodings.rotary.xpos``): zeta and the score decay of
torchscale's ``XPOS``, hyperbolic-rope is xPos at init and decays monotonically, and the
envelope is exact and finite at long spans (against a float64 reference)."""

from __future__ import annotations

import math

import pytest
import torch

import relpos

from .formulas import randn, rope_fp64


def _t(values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def test_hyperbolic_rope_is_xpos_at_init():
    hyp = relpos.create("hyperbolic-rope", num_heads=2, head_dim=16, layout="interleaved")
    xpos = relpos.create("xpos", num_heads=2, head_dim=16)
    q, k = randn(2, 2, 30, 16, seed=1), randn(2, 2, 30, 16, seed=2)
    torch.testing.assert_close(relpos.scores(q, k, hyp), relpos.scores(q, k, xpos))


def test_hyperbolic_rope_envelope_decays_monotonically():
    d, n = 16, 200
    hyp = relpos.create("hyperbolic-rope", num_heads=1, head_dim=d)
    with torch.no_grad():
        hyp.log_rate.copy_(torch.log(torch.linspace(0.01, 0.1, d // 2)))
    rope = relpos.create("rope", num_heads=1, head_dim=d)
    dist = torch.arange(n)
    kw = dict(q_pos=dist, k_pos=torch.tensor([0]), scale=1.0)
    for i in range(d // 2):  # one pair at a time: score = e^{-kappa_i (m - n)} x RoPE's
        q = torch.zeros(1, 1, n, d)
        q[..., i], q[..., i + d // 2] = 1.0, 0.5
        k = q[:, :, :1].clone()
        got = relpos.scores(q, k, hyp, **kw)[0, 0, :, 0].double()
        envelope = 1.25 * torch.exp(-hyp.rates[i].detach().double() * dist)  # |q_i| |k_i| e^..
        ref = envelope / 1.25 * relpos.scores(q, k, rope, **kw)[0, 0, :, 0].double()
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)
        assert bool((got.abs() <= envelope + 1e-6).all())
        assert bool((envelope[1:] < envelope[:-1]).all())
    with pytest.raises(ValueError, match="causal"):
        relpos.attention(q, q, q, hyp, causal=False)


# xPos zeta (torchscale's formula, d = 8).
R7_ZETA_D8 = [0.285714286, 0.464285714, 0.642857143, 0.821428571]


def test_xpos_zeta_for_head_dim_8_matches_r7() -> None:
    enc = relpos.create("xpos", num_heads=1, head_dim=8)
    torch.testing.assert_close(enc.zeta, _t(R7_ZETA_D8), rtol=1e-6, atol=0.0)


def test_xpos_zeta_for_head_dim_128_spans_r7_first_and_last() -> None:
    zeta = relpos.create("xpos", num_heads=1, head_dim=128).zeta
    assert zeta.shape == (64,)
    torch.testing.assert_close(zeta[0], torch.tensor(0.285714286), rtol=1e-6, atol=0.0)
    torch.testing.assert_close(zeta[-1], torch.tensor(0.988839286), rtol=1e-6, atol=0.0)


def _xpos_reference(q: torch.Tensor, k: torch.Tensor, n: int, m: torch.Tensor) -> torch.Tensor:
    """sum_i zeta_i^((n - m) / 512) * <R(n theta_i) q_i, R(m theta_i) k_i> / sqrt(d), fp64,
    interleaved pairs (2i, 2i+1) as in torchscale. q (d,), k (L, d) -> (L,)."""
    d = q.shape[-1]
    i2 = torch.arange(0, d, 2, dtype=torch.float64)
    theta = 10000.0 ** (-i2 / d)
    zeta = (i2 + 0.4 * d) / (1.4 * d)

    def rot(v: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        v0, v1 = v[..., 0::2], v[..., 1::2]
        return torch.stack((v0 * a.cos() - v1 * a.sin(), v0 * a.sin() + v1 * a.cos()), dim=-1)

    m = m.double()
    term = (rot(q.double(), n * theta)[None] * rot(k.double(), m[:, None] * theta)).sum(-1)
    factor = zeta[None, :] ** ((n - m)[:, None] / 512.0)
    return (factor * term).sum(-1) / math.sqrt(d)


@pytest.mark.parametrize("n", [0, 37, 599])
def test_xpos_score_is_rope_term_times_zeta_to_the_distance_over_512(n: int) -> None:
    # Decoding-shaped call (one query): relpos.scores asks for causal=True when Lq > 1.
    torch.manual_seed(n)
    enc = relpos.create("xpos", num_heads=1, head_dim=8)
    q = torch.randn(1, 1, 1, 8)
    k = torch.randn(1, 1, n + 1, 8)
    m = torch.arange(n + 1)
    got = relpos.scores(q, k, enc, q_pos=torch.tensor([n]), k_pos=m)[0, 0, 0]
    expected = _xpos_reference(q[0, 0, 0], k[0, 0], n, m)
    # Measured 3.6e-6 at n = 599 (scores up to ~4).
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("shift", [1, 1000, 2**25])
def test_xpos_scores_are_invariant_to_shifting_query_and_keys_together(shift: int) -> None:
    # Measured: 1.7e-5 for a shift of 1000 (fp32 angles), 3.2e-6 at 2^25 (fp64 angle path).
    torch.manual_seed(0)
    enc = relpos.create("xpos", num_heads=1, head_dim=8)
    q = torch.randn(1, 1, 1, 8)
    k = torch.randn(1, 1, 600, 8)
    m = torch.arange(600)
    base = relpos.scores(q, k, enc, q_pos=torch.tensor([599]), k_pos=m)
    moved = relpos.scores(q, k, enc, q_pos=torch.tensor([599 + shift]), k_pos=m + shift)
    torch.testing.assert_close(moved, base, rtol=0.0, atol=1e-4)


@pytest.mark.parametrize("pair", range(4))
def test_xpos_score_at_distance_2048_carries_zeta_to_the_fourth_per_pair(pair: int) -> None:
    # with B = 512 the per-pair score factor at distance 2048 is zeta_i^4. Put q and k on
    # pair i only; the xPos score divided by the plain (interleaved) RoPE score is that factor.
    r7_zeta4 = [0.00666389, 0.0464666, 0.170788, 0.455281]
    xpos = relpos.create("xpos", num_heads=1, head_dim=8)
    rope = relpos.create("rope", num_heads=1, head_dim=8, layout="interleaved")
    q = torch.zeros(1, 1, 1, 8)
    k = torch.zeros(1, 1, 1, 8)
    q[..., 2 * pair] = 1.0
    k[..., 2 * pair] = 1.0
    k[..., 2 * pair + 1] = 1.0
    pos = {"q_pos": torch.tensor([2048 + 100]), "k_pos": torch.tensor([100])}
    ratio = relpos.scores(q, k, xpos, **pos) / relpos.scores(q, k, rope, **pos)
    torch.testing.assert_close(ratio[0, 0, 0, 0], torch.tensor(r7_zeta4[pair]), rtol=1e-4, atol=0)


# ------------------------------------------------------------------------------- long spans


def envelope_scores_fp64(q, k, q_pos, k_pos, theta, rates, layout):
    """``sum_i e^{-a_i (n - m)} <RoPE(q, n)_i, RoPE(k, m)_i>`` in float64: the score of
    xPos per pair ``i`` with decay rate ``a_i`` (xPos: ``-ln(zeta_i) / B``), the rotation
    by the given frequencies (angles rounded to float32 as HF forms them for positions up to
    2^16; above, exact). ``(Lq, D)``, ``(Lk, D)`` -> ``(Lq, Lk)``."""
    f = theta.numel()
    qr, kr = rope_fp64(q, q_pos, theta, layout), rope_fp64(k, k_pos, theta, layout)
    if int(max(q_pos.max(), k_pos.max())) <= 2**16:  # HF's float32 angles
        qr = rope_fp64(q, q_pos, theta, layout, float32_angles=True)
        kr = rope_fp64(k, k_pos, theta, layout, float32_angles=True)

    def pairs(x):
        if layout == "half":
            return torch.stack((x[..., :f], x[..., f:]), dim=-1)
        return x.reshape(*x.shape[:-1], f, 2)

    dots = torch.einsum("qfc,kfc->qkf", pairs(qr), pairs(kr))
    dist = (q_pos.double()[:, None] - k_pos.double()[None, :])[..., None]
    return (dots * torch.exp(-dist * rates.double())).sum(-1)


def _xpos_rates(head_dim: int, scale_base: float) -> torch.Tensor:
    i = torch.arange(0, head_dim, 2, dtype=torch.float64)
    zeta = (i + 0.4 * head_dim) / (1.4 * head_dim)
    return -torch.log(zeta) / scale_base


@pytest.mark.parametrize(("name", "layout"), [("xpos", "interleaved"), ("hyperbolic-rope", "half")])
def test_xpos_keys_spanning_a_million_positions_match_a_float64_reference(name, layout):
    """Queries at the end of a 10^6-position key span (decoding with a long cache): every
    visible score is finite and equals the float64 formula. Before the fix the per-token
    factors overflowed float32 past ~141 x scale_base of key span (NaN logits)."""
    d = 16
    enc = relpos.create(name, num_heads=1, head_dim=d)
    k_pos = torch.tensor(
        [0, 1, 2, 1000, 250_000, 500_000, 999_000, 999_990] + list(range(999_995, 1_000_001))
    )
    q_pos = torch.arange(999_995, 1_000_001)
    q, k = randn(1, 1, q_pos.numel(), d, seed=3), randn(1, 1, k_pos.numel(), d, seed=4)
    got = relpos.scores(q, k, enc, q_pos=q_pos, k_pos=k_pos, scale=1.0)[0, 0].double()
    ref = envelope_scores_fp64(
        q[0, 0], k[0, 0], q_pos, k_pos, enc.inv_freq.double(), _xpos_rates(d, 512.0), layout
    )
    visible = k_pos[None, :] <= q_pos[:, None]
    assert torch.isfinite(got).all()
    scale = float(q.norm(dim=-1).max() * k.norm(dim=-1).max())
    torch.testing.assert_close(got[visible], ref[visible], rtol=0, atol=2e-6 * scale)
    out = relpos.attention(
        q, k, randn(1, 1, k_pos.numel(), d, seed=5), enc, q_pos=q_pos, k_pos=k_pos, causal=True
    )
    assert torch.isfinite(out).all()


def test_xpos_self_attention_up_to_the_guaranteed_query_span_is_exact():
    """Queries spanning up to E / a_max = 64 x scale_base positions (1021 at scale_base 16)
    are exact in float32 against the float64 formula, and every logit is finite."""
    d, base_len = 16, 16.0
    enc = relpos.create("xpos", num_heads=1, head_dim=d, scale_base=base_len)
    pos = torch.cat((torch.arange(0, 980, 35), torch.arange(980, 1020)))
    q, k = randn(1, 1, pos.numel(), d, seed=6), randn(1, 1, pos.numel(), d, seed=7)
    got = relpos.scores(q, k, enc, q_pos=pos, k_pos=pos, scale=1.0)[0, 0].double()
    ref = envelope_scores_fp64(
        q[0, 0], k[0, 0], pos, pos, enc.inv_freq.double(), _xpos_rates(d, base_len), "interleaved"
    )
    causal = pos[None, :] <= pos[:, None]
    scale = float(q.norm(dim=-1).max() * k.norm(dim=-1).max())
    torch.testing.assert_close(got[causal], ref[causal], rtol=0, atol=2e-6 * scale)
    assert torch.isfinite(got).all()  # future keys too (clamped, never seen under causal)


def test_xpos_scores_refuse_a_query_span_beyond_its_float_range_naming_q_pos():
    """``relpos.scores`` returns the logits of one call (one envelope centre), so it refuses
    a query span whose envelope leaves float32; ``relpos.attention`` splits it (below)."""
    enc = relpos.create("xpos", num_heads=1, head_dim=16, scale_base=16.0)
    pos = torch.arange(0, 100_000, 1000)
    q = randn(1, 1, pos.numel(), 16)
    with pytest.raises(ValueError, match="q_pos"):
        relpos.scores(q, q, enc, q_pos=pos, k_pos=pos)


def attention_fp64(q, k, v, q_pos, k_pos, theta, rates, layout):
    """Causal softmax attention over the float64 envelope scores, ``(Lq, D)`` -> ``(Lq, Dv)``;
    rows that see no key give zeros."""
    s = envelope_scores_fp64(q, k, q_pos, k_pos, theta, rates, layout) / q.shape[-1] ** 0.5
    visible = k_pos[None, :] <= q_pos[:, None]
    s = s.masked_fill(~visible, float("-inf"))
    w = torch.softmax(s, -1).nan_to_num(0.0)
    return w @ v.double()


@pytest.mark.parametrize("name", ["xpos", "hyperbolic-rope"])
@pytest.mark.parametrize("backend", ["eager", "sdpa", "chunked", "auto"])
def test_xpos_attention_over_queries_spanning_a_million_positions_matches_float64(name, backend):
    """A call whose queries span 10^6 positions (15,600 x the float32 query budget at
    scale_base 16) is computed, not refused: ``relpos.attention`` cuts it into query blocks
    with their own envelope centre, and every output equals the float64 formula."""
    d, base_len = 16, 16.0
    enc = relpos.create(name, num_heads=1, head_dim=d, scale_base=base_len)
    pos = torch.cat((torch.tensor([0, 3, 500, 250_000, 500_000]), torch.arange(999_950, 1_000_001)))
    q, k, v = (randn(1, 1, pos.numel(), d, seed=s) for s in (10, 11, 12))
    out = relpos.attention(q, k, v, enc, q_pos=pos, k_pos=pos, causal=True, backend=backend)
    layout = enc.layout
    ref = attention_fp64(
        q[0, 0], k[0, 0], v[0, 0], pos, pos, enc.inv_freq.double(), _xpos_rates(d, base_len), layout
    )
    torch.testing.assert_close(out[0, 0].double(), ref, rtol=0, atol=2e-5)
    assert relpos.attention.plan(q, k, v, enc, q_pos=pos, k_pos=pos, causal=True)[0] in (
        "sdpa",
        "eager",
        "chunked",
    )


def test_xpos_long_self_attention_is_split_into_query_blocks_with_gradients():
    """Self-attention over 400 consecutive positions at scale_base 1 (query budget 64): the
    split call equals the float64 reference in the forward and its gradients equal those of
    the float64 reference, padding rows (a bool mask) included."""
    d = 8
    enc = relpos.create("xpos", num_heads=1, head_dim=d, scale_base=1.0)
    L = 400
    pos = torch.arange(L)
    q, k, v = (randn(1, 1, L, d, seed=s).requires_grad_() for s in (13, 14, 15))
    out = relpos.attention(q, k, v, enc, causal=True)
    ref = attention_fp64(
        q[0, 0],
        k[0, 0],
        v[0, 0],
        pos,
        pos,
        enc.inv_freq.double(),
        _xpos_rates(d, 1.0),
        "interleaved",
    )
    torch.testing.assert_close(out[0, 0].double(), ref, rtol=0, atol=2e-5)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    ref_grads = torch.autograd.grad(ref.sum(), (q, k, v))
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got.double(), want.double(), rtol=0, atol=1e-4)


def test_xpos_split_call_keeps_masks_and_the_kv_cache_exact():
    """A prefill of 300 queries (budget 64) into a KV cache with a key-padding mask, then a
    decoding step: both equal one unsplit float64 computation, and the cache holds every key
    once."""
    from relpos.nn import LayerCache

    d = 8
    enc = relpos.create("xpos", num_heads=2, head_dim=d, scale_base=1.0)
    L = 300
    q, k, v = (
        randn(1, 2, L + 1, d, seed=16),
        randn(1, 2, L + 1, d, seed=17),
        randn(1, 2, L + 1, d, seed=18),
    )
    keep = torch.ones(1, 1, 1, L, dtype=torch.bool)
    keep[..., :5] = False  # left padding
    cache = LayerCache()
    first = relpos.attention(
        q[:, :, :L], k[:, :, :L], v[:, :, :L], enc, causal=True, mask=keep, cache=cache
    )
    full_keep = torch.cat((keep, torch.ones(1, 1, 1, 1, dtype=torch.bool)), -1)
    second = relpos.attention(
        q[:, :, L:], k[:, :, L:], v[:, :, L:], enc, causal=True, mask=full_keep, cache=cache
    )
    assert cache.length == L + 1
    expected = relpos.attention(
        q.double(), k.double(), v.double(), enc, causal=True, mask=full_keep
    )
    got = torch.cat((first, second), dim=2).double()
    torch.testing.assert_close(got[:, :, 5:], expected[:, :, 5:], rtol=0, atol=2e-5)
    assert (got[:, :, :5] == 0).all()  # rows that see only padding


def test_query_span_blocks_cover_every_query_within_the_limit():
    from relpos.attention.query_split import query_span_blocks

    pos = torch.tensor([[0, 1, 2, 10, 11, 30, 31, 32], [0, 1, 2, 3, 20, 21, 22, 23]])
    blocks = query_span_blocks(pos, 5.0)
    assert blocks[0][0] == 0 and blocks[-1][1] == pos.shape[1]
    assert all(a[1] == b[0] for a, b in zip(blocks, blocks[1:], strict=False))
    for s, e in blocks:
        span = pos[:, s:e].amax(-1) - pos[:, s:e].amin(-1)
        assert (span <= 5).all()
    assert blocks == [(0, 3), (3, 4), (4, 5), (5, 8)]


@pytest.mark.parametrize("name", ["xpos", "hyperbolic-rope"])
@pytest.mark.parametrize(("lq", "lk"), [(0, 0), (0, 5)])
@pytest.mark.parametrize("backend", ["eager", "sdpa", "auto"])
def test_xpos_takes_empty_sequences(name, lq, lk, backend):
    enc = relpos.create(name, num_heads=2, head_dim=8)
    q, k, v = randn(1, 2, lq, 8), randn(1, 2, lk, 8, seed=1), randn(1, 2, lk, 8, seed=2)
    out = relpos.attention(q, k, v, enc, backend=backend, causal=True)
    assert out.shape == (1, 2, lq, 8)


def test_xpos_float64_queries_may_span_far_more_than_float32_ones():
    """Float64 activations keep the envelope in float64: a query span of 200 x scale_base
    (refused in float32) is exact against the float64 formula."""
    d, base_len = 16, 16.0
    enc = relpos.create("xpos", num_heads=1, head_dim=d, scale_base=base_len)
    pos = torch.arange(0, 3200, 40)
    q = randn(1, 1, pos.numel(), d, seed=8).double()
    k = randn(1, 1, pos.numel(), d, seed=9).double()
    with pytest.raises(ValueError, match="q_pos"):
        relpos.scores(q.float(), k.float(), enc, q_pos=pos, k_pos=pos)
    got = relpos.scores(q, k, enc, q_pos=pos, k_pos=pos, scale=1.0)[0, 0]
    ref = envelope_scores_fp64(
        q[0, 0], k[0, 0], pos, pos, enc.inv_freq.double(), _xpos_rates(d, base_len), "interleaved"
    )
    causal = pos[None, :] <= pos[:, None]
    scale = float(q.norm(dim=-1).max() * k.norm(dim=-1).max())
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got[causal], ref[causal], rtol=0, atol=2e-6 * scale)
