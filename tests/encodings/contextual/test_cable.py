"""Cable (axiomlab) against reference values computed from the official formula and the shape of
the official code (``b = cumsum(-softplus(u))``, ``Bias = b_i - b_j``), forward and backward, on
the eager, sdpa and chunked backends."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from dense_reference import assert_matches_reference, dense_attention, qkv, zero_scores

import relpos
from relpos.functional import alibi_slopes

# reference rows, from the official formula in float64
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


@pytest.mark.parametrize("backend", ["eager", "sdpa", "chunked"])
def test_cable_batch_rows_use_their_own_keys_with_batch_shared_positions(backend):
    # the slopes come from each row's keys: a batch must equal its rows run one by one, also
    # when the positions are one shared range (backends may then build one-row index grids)
    torch.manual_seed(0)
    enc = relpos.create("cable", num_heads=4, head_dim=16, init_std=0.3)
    q, k, v = qkv(batch=3, lq=12, lk=12)
    out = relpos.attention(q, k, v, enc, causal=True, backend=backend)
    for b in range(3):
        row = relpos.attention(
            q[b : b + 1], k[b : b + 1], v[b : b + 1], enc, causal=True, backend=backend
        )
        torch.testing.assert_close(out[b : b + 1], row, rtol=1e-5, atol=1e-6)
