"""CoPE (Golovneva et al. 2024): reference values worked out from the paper's listing, the
counting semantics (masked and future keys add nothing), the zero init, KV-cache decoding and
the backends (sdpa/flex refuse it by name)."""

from __future__ import annotations

import pytest
import torch

import relpos
from relpos.attention import chunked
from relpos.nn import LayerCache


def row_probe(scores_row: list[float], table: list[float]):
    """A one-head, one-channel call whose last query row has content logits ``scores_row``
    (``q = 1``, ``k_j = s_j``, scale 1) and whose position logits are ``z = table``."""
    n = len(scores_row)
    enc = relpos.create("cope", num_heads=1, head_dim=1, npos_max=len(table)).double()
    with torch.no_grad():
        enc.pos_emb.copy_(torch.tensor(table, dtype=torch.float64).view(1, 1, -1))
    q = torch.ones(1, 1, n, 1, dtype=torch.float64)
    k = torch.tensor(scores_row, dtype=torch.float64).view(1, 1, n, 1)
    return enc, q, k


def last_row_bias(scores_row, table, causal_mask: bool = True):
    enc, q, k = row_probe(scores_row, table)
    n = len(scores_row)
    mask = torch.ones(n, n, dtype=torch.bool).tril() if causal_mask else None
    logits = relpos.scores(q, k, enc, scale=1.0)
    if mask is not None:  # the last row sees every key: scores equal the causal row
        assert mask[-1].all()
    return (logits[0, 0, -1] - k.view(n)).detach()


def test_counted_positions_match_the_spec_reference_values():
    # z_i[n] = n makes the interpolated bias the counted position itself
    identity = [float(n) for n in range(8)]
    zero = last_row_bias([0.0, 0.0, 0.0, 0.0], identity)
    torch.testing.assert_close(zero, torch.tensor([2.0, 1.5, 1.0, 0.5], dtype=torch.float64))
    p = last_row_bias([2.0, -1.0, 3.0, 0.0], identity)
    expected = torch.tensor([2.602313, 1.721516, 1.452574, 0.5], dtype=torch.float64)
    torch.testing.assert_close(p, expected, atol=1e-6, rtol=0)
    gates = torch.sigmoid(torch.tensor([2.0, -1.0, 3.0, 0.0], dtype=torch.float64))
    torch.testing.assert_close(
        gates,
        torch.tensor([0.880797, 0.268941, 0.952574, 0.5], dtype=torch.float64),
        atol=1e-6,
        rtol=0,
    )


def test_interpolated_bias_matches_the_spec_reference_values():
    bias = last_row_bias([2.0, -1.0, 3.0, 0.0], [0.0, 1.0, -1.0, 0.5, 2.0])
    expected = torch.tensor([-0.096531, -0.443031, 0.094852, 0.5], dtype=torch.float64)
    torch.testing.assert_close(bias, expected, atol=1e-6, rtol=0)


def test_positions_clamp_at_npos_max_minus_one():
    # 10 keys with gate 1/2 count up to 5 > npos_max - 1 = 2: the far keys read z[2]
    bias = last_row_bias([0.0] * 10, [0.0, 1.0, 7.0])
    counted = 0.5 * torch.arange(10, 0, -1, dtype=torch.float64)
    expected = torch.where(
        counted >= 2, 7.0, torch.where(counted >= 1, 1 + 6 * (counted - 1), counted)
    )
    torch.testing.assert_close(bias, expected)


def _problem(seed=0, lq=12, lk=12, heads=2, dim=4, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, heads, n, dim, generator=gen, dtype=dtype) for n in (lq, lk, lk))
    enc = relpos.create("cope", num_heads=heads, head_dim=dim, npos_max=6).to(dtype)
    with torch.no_grad():
        enc.pos_emb.normal_(generator=gen)
    return enc, q, k, v


def test_future_and_masked_keys_add_nothing():
    enc, q, k, v = _problem()
    out = relpos.attention(q, k, v, enc, causal=True, backend="eager")
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 7:] += 5.0  # keys after query 6 change
    v2[:, :, 7:] -= 3.0
    out2 = relpos.attention(q, k2, v2, enc, causal=True, backend="eager")
    torch.testing.assert_close(out2[:, :, :7], out[:, :, :7])
    # a masked key neither counts nor is attended: same as dropping it
    mask = torch.ones(12, dtype=torch.bool)
    mask[4] = False
    masked = relpos.attention(q, k, v, enc, mask=mask, backend="eager")
    keep = mask.nonzero().view(-1)
    dropped = relpos.attention(q, k[:, :, keep], v[:, :, keep], enc, backend="eager")
    torch.testing.assert_close(masked, dropped)


def test_zero_init_is_plain_attention_and_models_keep_it():
    enc = relpos.create("cope", num_heads=2, head_dim=4).double()
    assert bool((enc.pos_emb == 0).all()) and enc.keeps_own_init
    _, q, k, v = _problem()
    out = relpos.attention(q, k, v, enc, causal=True)
    plain = relpos.attention(q, k, v, None, causal=True)
    torch.testing.assert_close(out, plain)
    model = relpos.nn.TransformerLM(11, dim=16, depth=1, num_heads=2, encoding="cope")
    assert all(bool((p == 0).all()) for n, p in model.named_parameters() if "pos_emb" in n)


def test_per_head_tables():
    shared = relpos.create("cope", num_heads=3, head_dim=4, npos_max=5)
    own = relpos.create("cope", num_heads=3, head_dim=4, npos_max=5, per_head=True)
    assert shared.pos_emb.shape == (1, 4, 5) and own.pos_emb.shape == (3, 4, 5)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        own.pos_emb.normal_(generator=gen)
    q = torch.randn(1, 1, 6, 4, generator=gen).expand(1, 3, 6, 4)  # the same q in every head
    bias = relpos.scores(q, q, own) - relpos.scores(q, q, None)
    assert not torch.allclose(bias[0, 0], bias[0, 1])


def test_one_query_cached_call_equals_the_last_row_of_the_full_call():
    enc, q, k, v = _problem()
    full = relpos.attention(q, k, v, enc, causal=True)
    cache = LayerCache()
    relpos.attention(q[:, :, :11], k[:, :, :11], v[:, :, :11], enc, causal=True, cache=cache)
    step = relpos.attention(q[:, :, 11:], k[:, :, 11:], v[:, :, 11:], enc, causal=True, cache=cache)
    torch.testing.assert_close(step, full[:, :, 11:])


def test_chunked_walks_key_blocks_right_to_left_and_matches_eager(monkeypatch):
    monkeypatch.setattr(chunked, "FORWARD_BLOCK", 5)  # 12 keys: blocks 10-11, 5-9, 0-4
    for causal, mask in ((True, None), (False, torch.rand(2, 1, 12, 12) > 0.3)):
        enc, q, k, v = _problem(seed=2)
        params = (q, k, v, enc.pos_emb)
        for t in params:
            t.requires_grad_(True)
        outs = {}
        for backend in ("eager", "chunked"):
            out = relpos.attention(q, k, v, enc, causal=causal, mask=mask, backend=backend)
            outs[backend] = (out, torch.autograd.grad(out.square().sum(), params))
        torch.testing.assert_close(outs["chunked"][0], outs["eager"][0])
        for g, r in zip(outs["chunked"][1], outs["eager"][1], strict=True):
            torch.testing.assert_close(g, r)
    assert relpos.attention.plan(q, k, v, enc, causal=True, backend="chunked") == (
        "chunked",
        "row-suffix",
    )


@pytest.mark.parametrize("backend", ["sdpa", "flex"])
def test_sdpa_and_flex_refuse_it_by_name(backend):
    enc, q, k, v = _problem(dtype=torch.float32)
    with pytest.raises(ValueError, match=f"backend '{backend}' cannot run encoding 'cope'"):
        relpos.attention(q, k, v, enc.float(), causal=True, backend=backend)


def test_any_activation_dtype():
    enc, q, k, v = _problem(dtype=torch.float32)
    ref = relpos.attention(q, k, v, enc, causal=True)
    out = relpos.attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), enc, causal=True)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref, atol=3e-2, rtol=3e-2)
