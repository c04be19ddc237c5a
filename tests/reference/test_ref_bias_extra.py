"""Sandwich, Cable, URPE, dynamic position bias and the ALiBi variants against the spec.

Pinned values are copied from ../shared/spec/formulas-bias.md (section 5 Sandwich, section 7
Cable, section 1 ALiBi slopes). Every encoding is also checked against a dense reference
written here from the formula (and, for Cable and URPE, from the shape of the official code:
``b = cumsum(-softplus(u))``, ``Bias = b_i - b_j``; ``softmax(QK^T/sqrt(d) + B) * C``), forward
and backward, on the eager, sdpa and chunked backends.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import relpos
from relpos.encodings.bias.extra import TabulatedDistanceBias, urpe_bucket
from relpos.functional import alibi_slopes

# ----------------------------------------------------------------------------- helpers


def dense_attention(q, k, v, bias, scale, causal, multiplier=None):
    """softmax(q k^T * scale + bias [+ causal mask]) [* multiplier] @ v, GQA by repetition."""
    groups = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(groups, dim=1)
    v = v.repeat_interleave(groups, dim=1)
    logits = q @ k.transpose(-1, -2) * scale + bias
    if causal:
        Lq, Lk = q.shape[2], k.shape[2]
        i = torch.arange(Lq)[:, None] + (Lk - Lq)
        logits = logits.masked_fill(torch.arange(Lk)[None, :] > i, float("-inf"))
    p = logits.softmax(-1)
    if multiplier is not None:
        p = p * multiplier
    return p @ v


def qkv(batch=2, heads=4, kv_heads=None, lq=24, lk=24, dim=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    kv_heads = heads if kv_heads is None else kv_heads
    return (
        torch.randn(batch, heads, lq, dim, generator=gen),
        torch.randn(batch, kv_heads, lk, dim, generator=gen),
        torch.randn(batch, kv_heads, lk, dim, generator=gen),
    )


def grads(out, tensors, seed=123):
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed))
    return torch.autograd.grad((out * weight).sum(), tensors)


def assert_matches_reference(enc, reference, *, causal, backends, lq=24, lk=24, kv_heads=None):
    """relpos.attention == reference(q, k, v) in output and in the gradients of q, k, v and
    of every parameter of ``enc``; ``reference`` builds its bias from ``enc``'s parameters."""
    params = [p for p in enc.parameters() if p.requires_grad]
    q, k, v = qkv(lq=lq, lk=lk, kv_heads=kv_heads)
    leaves = [t.requires_grad_(True) for t in (q, k, v)]
    ref = reference(*leaves)
    ref_grads = grads(ref, leaves + params)
    for backend in backends:
        out = relpos.attention(*leaves, enc, causal=causal, backend=backend)
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5, msg=backend)
        for g, r in zip(grads(out, leaves + params), ref_grads, strict=True):
            torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5, msg=backend)


def zero_scores(enc, lq, lk, **kw):
    """The bias alone: logits of all-zero queries and keys."""
    q = torch.zeros(1, enc.num_heads, lq, enc.head_dim)
    k = torch.zeros(1, enc.num_heads, lk, enc.head_dim)
    return relpos.scores(q, k, enc, **kw)[0]


# ----------------------------------------------------------------------------- Sandwich

# formulas-bias.md section 5, "Reference values (H=8; n = 0, 1, 2, 10, 100, 1000)"
SANDWICH_N = [0, 1, 2, 10, 100, 1000]
SANDWICH_PUBLISHED = {
    (64, 0): [0, -0.62347065, -2.2799912, -9.1093001, -13.9877, -22.641408],
    (64, 7): [0, -0.077933831, -0.2849989, -1.1386625, -1.7484625, -2.830176],
    (128, 0): [0, -1.4466185, -5.2019926, -19.340906, -33.318914, -53.389647],
}


def sandwich_reference(lq, lk, num_heads, d, base=10000.0):
    """The NeMo construction: |i - j| (bottom-right aligned), k = 1 .. d/2, float64."""
    i = torch.arange(lq, dtype=torch.float64)[:, None] + (lk - lq)
    n = (i - torch.arange(lk, dtype=torch.float64)[None, :]).abs()
    inv_freq = 1.0 / base ** (2 * torch.arange(1, d // 2 + 1, dtype=torch.float64) / d)
    inner = torch.cos(n[..., None] * inv_freq).sum(-1)
    scales = torch.arange(1, num_heads + 1, dtype=torch.float64)[:, None, None] * 8 / num_heads
    return ((inner - d / 2) / scales).float()


@pytest.mark.parametrize(("dim", "head"), sorted(SANDWICH_PUBLISHED))
def test_sandwich_matches_published_values(dim, head):
    enc = relpos.create("sandwich", num_heads=8, head_dim=dim)
    s = zero_scores(enc, 1, 6, q_pos=torch.tensor([1000]), k_pos=1000 - torch.tensor(SANDWICH_N))
    expected = torch.tensor(SANDWICH_PUBLISHED[(dim, head)])
    torch.testing.assert_close(s[head, 0], expected, rtol=1e-6, atol=1e-6)
    # the per-distance table (Toeplitz path, dense SDPA bias) holds the same numbers
    table = enc.distance_table(0, 1000, torch.device("cpu"))
    torch.testing.assert_close(table[head, SANDWICH_N], expected, rtol=1e-6, atol=1e-6)


def test_sandwich_dim_option_is_the_d_of_the_formula():
    # head_dim 32 with d = 64 (the OpenNLPLab reproduction's d = 2 * head_dim) = published d=64
    enc = relpos.create("sandwich", num_heads=8, head_dim=32, dim=64)
    s = zero_scores(enc, 1, 6, q_pos=torch.tensor([1000]), k_pos=1000 - torch.tensor(SANDWICH_N))
    torch.testing.assert_close(
        s[0, 0], torch.tensor(SANDWICH_PUBLISHED[(64, 0)]), rtol=1e-6, atol=1e-6
    )
    with pytest.raises(ValueError, match="dim"):
        relpos.create("sandwich", num_heads=8, head_dim=32, dim=63)


def test_sandwich_is_symmetric_non_positive_and_zero_on_the_diagonal():
    enc = relpos.create("sandwich", num_heads=4, head_dim=16)
    s = zero_scores(enc, 30, 30)
    torch.testing.assert_close(s, s.transpose(-1, -2), rtol=0, atol=0)
    assert (s <= 1e-6).all()
    assert s.diagonal(dim1=-2, dim2=-1).abs().max() < 1e-6
    torch.testing.assert_close(s, sandwich_reference(30, 30, 4, 16), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("causal", [True, False])
def test_sandwich_attention_matches_dense_reference(causal):
    enc = relpos.create("sandwich", num_heads=4, head_dim=16)

    def reference(q, k, v):
        bias = sandwich_reference(q.shape[2], k.shape[2], 4, 16)
        return dense_attention(q, k, v, bias, 16**-0.5, causal)

    assert_matches_reference(
        enc, reference, causal=causal, backends=["eager", "sdpa", "chunked"], lq=20, lk=33
    )


# ----------------------------------------------------------------------------- Cable

# formulas-bias.md section 7, "Reference"
CABLE_U = [0.0, 1.0, -1.0, 2.0]
CABLE_ROWS = [
    [0.0],
    [-1.313262, 0.0],
    [-1.626523, -0.313262, 0.0],
    [-3.753451, -2.440190, -2.126928, 0.0],
]


def _cable_with_scores_in_key_channel_0(num_heads=1, head_dim=4):
    """A key-mode Cable whose token score is u_t = k_t[0] (w = e_0, beta = 0)."""
    enc = relpos.create("cable", num_heads=num_heads, head_dim=head_dim)
    with torch.no_grad():
        enc.weight.zero_()
        enc.weight[:, 0] = 1.0
        enc.bias_u.zero_()
    return enc


def test_cable_matches_published_rows_with_scores_from_the_keys():
    enc = _cable_with_scores_in_key_channel_0()
    q = torch.zeros(1, 1, 4, 4)
    k = torch.zeros(1, 1, 4, 4)
    k[0, 0, :, 0] = torch.tensor(CABLE_U)
    s = relpos.scores(q, k, enc)[0, 0]
    for i, row in enumerate(CABLE_ROWS):
        torch.testing.assert_close(s[i, : i + 1], torch.tensor(row), rtol=1e-6, atol=1e-6)
    # future keys: the symmetric extension -|c_i - c_j|
    torch.testing.assert_close(s, s.t(), rtol=0, atol=0)


def test_cable_matches_published_rows_with_scores_from_hidden_states():
    enc = relpos.create("cable", num_heads=1, head_dim=4, input_dim=1)
    with torch.no_grad():
        enc.proj.weight.fill_(1.0)
        enc.proj.bias.zero_()
    q = torch.zeros(1, 1, 4, 4)
    x = torch.tensor(CABLE_U)[None, :, None]
    s = relpos.scores(q, q, enc, inputs={"x": x})[0, 0]
    for i, row in enumerate(CABLE_ROWS):
        torch.testing.assert_close(s[i, : i + 1], torch.tensor(row), rtol=1e-6, atol=1e-6)


def test_cable_with_constant_scores_is_alibi():
    # softplus(u_h) = m_h for every token: b = -m_h (i - j) below the diagonal
    num_heads = 8
    enc = relpos.create("cable", num_heads=num_heads, head_dim=4)
    m = alibi_slopes(num_heads)
    with torch.no_grad():
        enc.weight.zero_()
        enc.bias_u.copy_(m + torch.log(-torch.expm1(-m)))  # softplus^-1(m)
    s = zero_scores(enc, 12, 12)
    alibi = zero_scores(relpos.create("alibi", num_heads=num_heads, head_dim=4), 12, 12)
    lower = torch.ones(12, 12, dtype=torch.bool).tril().expand(num_heads, 12, 12)
    torch.testing.assert_close(s[lower], alibi[lower], rtol=1e-5, atol=1e-5)


def test_cable_init_starts_as_alibi_with_slope_ln2():
    enc = relpos.create("cable", num_heads=4, head_dim=16)
    assert torch.equal(enc.bias_u, torch.zeros(4))
    assert 0.01 < float(enc.weight.detach().std()) < 0.03
    s = zero_scores(enc, 6, 6)
    i, j = torch.arange(6)[:, None], torch.arange(6)[None, :]
    torch.testing.assert_close(s, -math.log(2) * (i - j).abs().float().expand(4, 6, 6))


def cable_reference(enc, causal):
    """The official forward from key-mode scores: b = cumsum(-softplus(u)) over the keys,
    Bias = b_i - b_j (query i is key i + Lk - Lq), logits not divided by sqrt(d)."""

    def reference(q, k, v):
        Lq, Lk = q.shape[2], k.shape[2]
        keys = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        u = torch.einsum("bhld,hd->bhl", keys, enc.weight) + enc.bias_u[:, None]
        b = torch.cumsum(-F.softplus(u), dim=-1)
        bias = b[..., Lk - Lq :, None] - b[..., None, :]
        if not causal:
            bias = -bias.abs()
        return dense_attention(q, k, v, bias, 1.0, causal)

    return reference


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("kv_heads", [4, 2])
def test_cable_attention_matches_official_formula(causal, kv_heads):
    torch.manual_seed(0)
    enc = relpos.create("cable", num_heads=4, head_dim=16, init_std=0.3)
    with torch.no_grad():
        enc.bias_u.normal_()
    assert_matches_reference(
        enc,
        cable_reference(enc, causal),
        causal=causal,
        backends=["eager", "sdpa", "chunked"],
        lq=20,
        lk=33,
        kv_heads=kv_heads,
    )


def test_cable_scaled_option_divides_logits_by_sqrt_d():
    enc = relpos.create("cable", num_heads=4, head_dim=16)
    assert enc.default_scale(16) == 1.0
    scaled = relpos.create("cable", num_heads=4, head_dim=16, scaled=True)
    scaled.load_state_dict(enc.state_dict())
    q, k, v = qkv()
    torch.testing.assert_close(
        relpos.attention(q, k, v, scaled, causal=True),
        relpos.attention(q, k, v, enc, causal=True, scale=16**-0.5),
    )


def test_cable_decoding_one_token_at_a_time_equals_the_full_causal_forward():
    torch.manual_seed(0)
    enc = relpos.create("cable", num_heads=4, head_dim=16, init_std=0.3)
    q, k, v = qkv(lq=15, lk=15)
    full = relpos.attention(q, k, v, enc, causal=True)
    for t in range(15):
        one = relpos.attention(q[:, :, t : t + 1], k[:, :, : t + 1], v[:, :, : t + 1], enc)
        torch.testing.assert_close(one, full[:, :, t : t + 1], rtol=1e-5, atol=1e-6)


def test_cable_bad_inputs_are_named():
    q, k, v = qkv()
    keys_mode = relpos.create("cable", num_heads=4, head_dim=16)
    with pytest.raises(ValueError, match="input_dim"):
        relpos.attention(q, k, v, keys_mode, causal=True, inputs={"x": torch.randn(2, 24, 8)})
    x_mode = relpos.create("cable", num_heads=4, head_dim=16, input_dim=8)
    with pytest.raises(ValueError, match=r"inputs=\{'x'"):
        relpos.attention(q, k, v, x_mode, causal=True)
    with pytest.raises(ValueError, match=r"inputs\['x'\]"):
        relpos.attention(q, k, v, x_mode, causal=True, inputs={"x": torch.randn(2, 23, 8)})
    with pytest.raises(TypeError, match=r"inputs\['x'\]"):
        relpos.attention(
            q, k, v, x_mode, causal=True, inputs={"x": torch.ones(2, 24, 8, dtype=torch.long)}
        )
    with pytest.raises(ValueError, match="queries"):
        relpos.scores(q, k[:, :, :10], keys_mode)


# ----------------------------------------------------------------------------- URPE


def official_urpe_bucket(max_seq_len, num_buckets, max_distance):
    """lsj2408/URPE TransformerSentenceEncoder: relative_position_bucket, += 2, -= min."""
    ctx = torch.arange(max_seq_len)[:, None]
    mem = torch.arange(max_seq_len)[None, :]
    rel = mem - ctx
    sign = torch.sign(rel)
    half = num_buckets // 2
    n = rel.abs()
    exact = half // 2
    with torch.no_grad():
        large = exact + (
            torch.log(n.float() / exact) / math.log(max_distance / exact) * (half - exact)
        ).to(torch.long)
    large = torch.min(large, torch.full_like(large, half - 1))
    bucket = torch.where(n < exact, n, large) * sign
    bucket[bucket >= 0] += 2
    return rel, bucket - bucket.min()


def test_urpe_bucket_equals_the_official_construction():
    for num_buckets, max_distance in [(64, 128), (32, 64)]:
        rel, expected = official_urpe_bucket(256, num_buckets, max_distance)
        assert torch.equal(urpe_bucket(rel, num_buckets, max_distance), expected)
        assert int(expected.max()) <= num_buckets


def test_urpe_init_is_plain_rpe_attention():
    torch.manual_seed(0)
    enc = relpos.create("urpe", num_heads=4, head_dim=16, max_length=64)
    assert enc.beta.shape == enc.gamma.shape == (127, 4)
    assert torch.equal(enc.gamma, torch.ones(127, 4))
    assert 0.015 < float(enc.beta.detach().std()) < 0.025


def urpe_reference(enc, causal):
    """Toeplitz B and C from the official unique buckets (j - i - min) and the formula."""

    def reference(q, k, v):
        Lq, Lk = q.shape[2], k.shape[2]
        i = torch.arange(Lq)[:, None] + (Lk - Lq)
        bucket = torch.arange(Lk)[None, :] - i + enc.max_length - 1
        bias = F.embedding(bucket, enc.beta).permute(2, 0, 1)
        mult = F.embedding(bucket, enc.gamma).permute(2, 0, 1)
        return dense_attention(q, k, v, bias, q.shape[-1] ** -0.5, causal, mult)

    return reference


@pytest.mark.parametrize("causal", [True, False])
def test_urpe_attention_matches_the_formula(causal):
    torch.manual_seed(0)
    enc = relpos.create("urpe", num_heads=4, head_dim=16, max_length=40)
    with torch.no_grad():
        enc.gamma.uniform_(0.5, 1.5)
    assert_matches_reference(
        enc, urpe_reference(enc, causal), causal=causal, backends=["eager", "chunked"], lq=20, lk=33
    )


def test_urpe_weights_are_not_renormalised():
    enc = relpos.create("urpe", num_heads=4, head_dim=16, max_length=32)
    q, k, v = qkv()
    plain = relpos.attention(q, k, v, enc, causal=True)
    with torch.no_grad():
        enc.gamma.fill_(2.0)
    torch.testing.assert_close(relpos.attention(q, k, v, enc, causal=True), 2 * plain)


def test_urpe_bucketed_tables_follow_the_official_buckets():
    torch.manual_seed(0)
    enc = relpos.create("urpe", num_heads=2, head_dim=8, num_buckets=64, max_distance=128)
    assert enc.beta.shape == (65, 2)
    rel, bucket = official_urpe_bucket(256, 64, 128)
    s = zero_scores(enc, 256, 256)
    torch.testing.assert_close(s, enc.beta[bucket].permute(2, 0, 1), rtol=0, atol=0)


def test_urpe_checks_distances_not_absolute_positions():
    enc = relpos.create("urpe", num_heads=4, head_dim=16, max_length=16)
    q, k, v = qkv(lq=16, lk=16)
    pos = torch.arange(5000, 5016)
    out = relpos.attention(q, k, v, enc, q_pos=pos, k_pos=pos, causal=True)
    torch.testing.assert_close(out, relpos.attention(q, k, v, enc, causal=True))
    with pytest.raises(ValueError, match="max_length"):
        relpos.attention(q, k, v, enc, q_pos=pos, k_pos=pos + torch.arange(16), causal=True)


# ----------------------------------------------------------------------------- dynamic bias


def dpb_reference(enc, distance):
    """The MLP written out from the encoding's layers, applied to every pair: (H, ...)."""
    x = distance.float()[..., None]
    if enc.log_distance:
        x = torch.sign(x) * torch.log(x.abs() + 1)
    for layer in enc.mlp:
        if isinstance(layer, torch.nn.Linear):
            x = x @ layer.weight.t() + layer.bias
        elif isinstance(layer, torch.nn.LayerNorm):
            x = F.layer_norm(x, layer.normalized_shape, layer.weight, layer.bias, layer.eps)
        elif isinstance(layer, torch.nn.SiLU):
            x = x * torch.sigmoid(x)
        else:
            x = x.clamp(min=0)
    return x.movedim(-1, 0)


DPB_OPTIONS = [
    {},
    {"log_distance": True, "depth": 3, "width": 8},
    {"norm": True, "activation": "relu", "depth": 1},
]


@pytest.mark.parametrize("options", DPB_OPTIONS, ids=["default", "log-depth3", "norm-relu"])
@pytest.mark.parametrize("causal", [True, False])
def test_dynamic_position_bias_matches_the_mlp_on_every_pair(options, causal):
    torch.manual_seed(0)
    enc = relpos.create("dynamic-position-bias", num_heads=4, head_dim=16, **options)

    def reference(q, k, v):
        Lq, Lk = q.shape[2], k.shape[2]
        d = torch.arange(Lq)[:, None] + (Lk - Lq) - torch.arange(Lk)[None, :]
        return dense_attention(q, k, v, dpb_reference(enc, d), 16**-0.5, causal)

    assert_matches_reference(
        enc, reference, causal=causal, backends=["eager", "sdpa", "chunked"], lq=20, lk=33
    )


def test_dynamic_position_bias_evaluates_the_mlp_once_per_distinct_distance():
    enc = relpos.create("dynamic-position-bias", num_heads=4, head_dim=16)
    rows: list[int] = []
    enc.mlp[0].register_forward_hook(lambda m, inp, out: rows.append(inp[0].shape[0]))
    q, k, v = qkv(batch=1, lq=300, lk=300)
    out = relpos.attention(q, k, v, enc, causal=True, backend="chunked")  # Toeplitz path
    assert torch.isfinite(out).all()
    assert rows and all(r == 2 * 300 - 1 for r in rows)  # one row per distance, never L^2
    rows.clear()
    pos = torch.arange(300) * 3  # not a range: tile path, gathering from the call's table
    relpos.attention(q, k, v, enc, q_pos=pos, k_pos=pos, causal=True, backend="chunked")
    assert rows == [2 * 897 + 1]


def test_tabulated_bias_falls_back_to_elementwise_for_sparse_positions(monkeypatch):
    torch.manual_seed(0)
    enc = relpos.create("dynamic-position-bias", num_heads=4, head_dim=16, log_distance=True)
    monkeypatch.setattr(TabulatedDistanceBias, "TABLE_MIN", 8)
    pos = torch.tensor([0, 1, 5, 1000, 1003, 40000])
    s = zero_scores(enc, 6, 6, q_pos=pos, k_pos=pos)
    torch.testing.assert_close(s, dpb_reference(enc, pos[:, None] - pos[None, :]))


def test_dynamic_position_bias_rejects_bad_options():
    for bad in ({"activation": "gelu"}, {"depth": 0}, {"width": -1}, {"log_distance": 1}):
        with pytest.raises((ValueError, TypeError), match=next(iter(bad))):
            relpos.create("dynamic-position-bias", num_heads=4, head_dim=16, **bad)


# ----------------------------------------------------------------------------- ALiBi variants

SHARDED = [(8, 2), (8, 4), (12, 3), (12, 4), (12, 6), (20, 5), (6, 2), (6, 3), (5, 1), (24, 8)]


@pytest.mark.parametrize(("total", "per_shard"), SHARDED)
@pytest.mark.parametrize("form", [False, "asymmetric"])
def test_alibi_shards_concatenate_to_the_full_models_slopes(total, per_shard, form):
    shards = [
        relpos.create(
            "alibi",
            num_heads=per_shard,
            head_dim=8,
            bidirectional=form,
            head_offset=r * per_shard,
            total_heads=total,
        )
        for r in range(total // per_shard)
    ]
    full = relpos.create("alibi", num_heads=total, head_dim=8, bidirectional=form)
    assert torch.equal(torch.cat([s.slopes for s in shards]), alibi_slopes(total))
    assert torch.equal(full.slopes, alibi_slopes(total))
    assert torch.equal(torch.cat([s.future_slopes for s in shards]), full.future_slopes)
    # and the biases: each shard's scores are its heads' slice of the full model's
    pos = torch.arange(7)
    full_scores = zero_scores(full, 7, 7, q_pos=pos, k_pos=pos)
    shard_scores = torch.cat([zero_scores(s, 7, 7, q_pos=pos, k_pos=pos) for s in shards])
    assert torch.equal(shard_scores, full_scores)


def test_alibi_shard_of_a_non_power_of_two_model_takes_the_interleaved_slopes():
    # total 12 (spec: [2^-1 .. 2^-8, 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5]); last shard of 4 heads
    enc = relpos.create("alibi", num_heads=4, head_dim=8, head_offset=8, total_heads=12)
    expected = [0.7071067812, 0.3535533906, 0.1767766953, 0.08838834765]
    torch.testing.assert_close(enc.slopes.double(), torch.tensor(expected, dtype=torch.float64))


def test_alibi_shard_options_are_validated_by_name():
    for kw, arg in [
        ({"head_offset": 6, "total_heads": 8}, "head_offset"),
        ({"head_offset": -1}, "head_offset"),
        ({"total_heads": 0}, "total_heads"),
        ({"bidirectional": "both"}, "bidirectional"),
        ({"learnable_slopes": 1}, "learnable_slopes"),
    ]:
        with pytest.raises((ValueError, TypeError), match=arg):
            relpos.create("alibi", num_heads=4, head_dim=8, **kw)


def _bias_forms(num_heads: int, length: int, form):
    enc = relpos.create("alibi", num_heads=num_heads, head_dim=8, bidirectional=form)
    pos = torch.arange(length)
    d = (pos[:, None] - pos[None, :]).double()
    return enc, zero_scores(enc, length, length, q_pos=pos, k_pos=pos).double(), d


def test_alibi_symmetric_string_equals_bidirectional_true():
    _, a, _ = _bias_forms(6, 9, True)
    _, b, d = _bias_forms(6, 9, "symmetric")
    assert torch.equal(a, b)
    m = alibi_slopes(6).double()[:, None, None]
    torch.testing.assert_close(a, -m * d.abs())


def test_alibi_asymmetric_uses_a_second_slope_set_for_future_keys():
    enc, s, d = _bias_forms(8, 9, "asymmetric")
    m = torch.tensor([2.0**-k for k in range(1, 9)], dtype=torch.float64)
    future = m * 2**0.5  # the even slopes of a 16-head model: 2^-0.5, 2^-1.5, ..., 2^-7.5
    torch.testing.assert_close(enc.future_slopes.double(), future)
    expected = torch.where(d >= 0, -m[:, None, None] * d, -future[:, None, None] * d.abs())
    torch.testing.assert_close(s, expected)
    # the past side is plain (causal) ALiBi
    _, causal, _ = _bias_forms(8, 9, False)
    lower = (d >= 0).expand_as(s)
    assert torch.equal(s[lower], causal[lower])


def test_alibi_shifted_form_is_deepminds_encoder_alibi():
    # google-deepmind/randomized_positional_encodings: -m (|i - j| - 0.5 [j < i])
    _, s, d = _bias_forms(4, 7, "shifted")
    m = alibi_slopes(4).double()[:, None, None]
    torch.testing.assert_close(s, -m * (d.abs() - 0.5 * (d > 0).double()))


def test_alibi_learnable_slopes_start_at_the_standard_slopes_and_stay_positive():
    enc = relpos.create("alibi", num_heads=12, head_dim=8, learnable_slopes=True)
    assert enc.learnable and set(enc.state_dict()) == {"log_slopes"}
    torch.testing.assert_close(enc.slopes, alibi_slopes(12), rtol=1e-6, atol=0)
    with torch.no_grad():
        enc.log_slopes.sub_(20.0)  # far below 0 in log space: still positive slopes
    assert (enc.slopes > 0).all()
    asym = relpos.create(
        "alibi", num_heads=4, head_dim=8, learnable_slopes=True, bidirectional="asymmetric"
    )
    assert set(asym.state_dict()) == {"log_slopes", "log_future_slopes"}


@pytest.mark.parametrize(
    ("form", "lq", "lk", "backends"),
    [
        (False, 20, 33, ["eager", "sdpa", "chunked"]),
        ("shifted", 20, 33, ["eager", "sdpa", "chunked"]),
        ("asymmetric", 270, 300, ["eager", "chunked"]),  # several Toeplitz blocks
    ],
)
def test_alibi_learnable_slopes_gradients_agree_across_backends(form, lq, lk, backends):
    enc = relpos.create(
        "alibi", num_heads=4, head_dim=16, learnable_slopes=True, bidirectional=form
    )
    causal = form is False

    def reference(q, k, v):
        pos = torch.arange(k.shape[2])
        d = (pos[-q.shape[2] :, None] - pos[None, :]).float()
        m, mf = enc.slopes[:, None, None], enc.future_slopes[:, None, None]
        if form is False:
            bias = -m * d
        elif form == "asymmetric":
            bias = torch.where(d >= 0, -m * d, mf * d)
        else:
            bias = -m * (d.abs() - 0.5 * (d > 0).float())
        return dense_attention(q, k, v, bias, 16**-0.5, causal)

    assert_matches_reference(enc, reference, causal=causal, backends=backends, lq=lq, lk=lk)
