"""LongHeads (Lu et al. 2024, arXiv 2402.10685; official code LuLuLuyi/LongHeads) against a
per-query reference written from the official algorithm: gather the selected chunks, concatenate
them, rotate the concatenation at ``0 .. rel`` and attend (``modeling_llama.py``, the prefill and
decode branches), never from relpos."""

from __future__ import annotations

import pytest
import torch

import relpos

from .formulas import randn, rope_fp64, theta_fp64

W, A = 4, 16  # k = 4 chunks per head
K = A // W


def local_features(q, k, v, w):
    """kappa (G, D) of the complete chunks of one head, official formula (float64)."""
    L, D = k.shape
    theta = theta_fp64(D)
    out = []
    for g in range(L // w):
        t = torch.arange(g * w, (g + 1) * w)
        ql = rope_fp64(q[t], t % w, theta, "half")
        kl = rope_fp64(k[t], t % w, theta, "half")
        o = torch.softmax(ql @ kl.T / D**0.5, -1) @ v[t].double()
        vbar = o.mean(0)
        out.append(torch.softmax(vbar @ kl.T / D**0.5, -1) @ kl)
    return torch.stack(out)


def reference(q, k, v, *, w=W, a=A, begin=A, official=False, decode=False):
    """Official LongHeads attention of one head: q, k, v (L, D); rows are queries 0..L-1.
    ``decode``: every row as a decoding step (diagonal included), else a prefill."""
    L, D = q.shape
    theta = theta_fp64(D)
    kk = a // w
    kappa = local_features(q, k, v, w)
    out = torch.zeros(L, v.shape[1], dtype=torch.float64)
    for i in range(L):
        if i < begin:
            pos = torch.arange(i + 1)
            qi = rope_fp64(q[i : i + 1], torch.tensor([i]), theta, "half")
            ki = rope_fp64(k[: i + 1], pos, theta, "half")
            out[i] = torch.softmax(qi @ ki.T / D**0.5, -1) @ v[: i + 1].double()
            continue
        c = i // w
        score = q[i].double() @ kappa[1 : c - 1].T  # candidates 1 .. c-2
        top = (torch.topk(score, kk - 3).indices + 1).tolist()
        chosen = sorted({0, c - 1, c, *top})
        keys = torch.cat([k[g * w : (g + 1) * w] for g in chosen])
        vals = torch.cat([v[g * w : (g + 1) * w] for g in chosen])
        rel = (kk - 1) * w + i % w
        n = rel + (0 if official and not decode else 1)
        qi = rope_fp64(q[i : i + 1], torch.tensor([rel]), theta, "half")
        ki = rope_fp64(keys[:n], torch.arange(n), theta, "half")
        out[i] = torch.softmax(qi @ ki.T / D**0.5, -1) @ vals[:n].double()
    return out


def make(**options):
    return relpos.create(
        "longheads", num_heads=2, head_dim=8, window_size=W, atten_length=A, **options
    )


@pytest.mark.parametrize("backend", ["eager", "chunked"])
@pytest.mark.parametrize("official", [False, True])
def test_prefill_matches_the_official_per_query_gather(backend, official):
    L = 41  # a partial last chunk
    q, k, v = randn(1, 2, L, 8, seed=1), randn(1, 2, L, 8, seed=2), randn(1, 2, L, 8, seed=3)
    enc = make(official_prefill=official)
    out = relpos.attention(q, k, v, enc, causal=True, backend=backend)
    for h in range(2):
        ref = reference(q[0, h], k[0, h], v[0, h], official=official)
        torch.testing.assert_close(out[0, h].double(), ref, rtol=1e-5, atol=1e-5)


def test_decoding_steps_match_the_official_decode_branch_and_see_themselves():
    L = 37
    q, k, v = randn(1, 2, L, 8, seed=4), randn(1, 2, L, 8, seed=5), randn(1, 2, L, 8, seed=6)
    enc = make(official_prefill=True)
    for t in (16, 23, 30, 36):
        cache = relpos.nn.LayerCache()  # keeps the raw queries the chunk features need
        relpos.attention(q[:, :, :t], k[:, :, :t], v[:, :, :t], enc, causal=True, cache=cache)
        step = relpos.attention(q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1], enc,
                                causal=True, cache=cache)  # fmt: skip
        for h in range(2):
            ref = reference(q[0, h, : t + 1], k[0, h, : t + 1], v[0, h, : t + 1], decode=True)
            torch.testing.assert_close(step[0, h, 0].double(), ref[t], rtol=1e-5, atol=1e-5)


def test_relpos_prefill_rows_equal_decoding_steps_and_the_official_prefill_drops_the_diagonal():
    L = 33
    q, k, v = randn(1, 2, L, 8, seed=7), randn(1, 2, L, 8, seed=8), randn(1, 2, L, 8, seed=9)
    ours = relpos.attention(q, k, v, make(), causal=True)
    official = relpos.attention(q, k, v, make(official_prefill=True), causal=True)
    cache = relpos.nn.LayerCache()
    relpos.attention(q[:, :, :-1], k[:, :, :-1], v[:, :, :-1], make(), causal=True, cache=cache)
    last = relpos.attention(q[:, :, -1:], k[:, :, -1:], v[:, :, -1:], make(), causal=True,
                            cache=cache)  # fmt: skip
    torch.testing.assert_close(last[:, :, 0], ours[:, :, -1], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours[:, :, :A], official[:, :, :A])  # plain RoPE below B
    assert not torch.allclose(ours[:, :, A:], official[:, :, A:], atol=1e-4)


def test_spec_decode_at_30_reads_four_chunks_and_every_distance_stays_below_A():
    """Spec section 12: w = 4, A = 16, decoding at position 30: 7 complete chunks, chunk 0,
    one of 1..5, chunk 6 and the partial chunk 7; rel = 14, keys at 0..14."""
    enc = make()
    L = 31
    q, k, v = randn(1, 2, 1, 8, seed=10), randn(1, 2, L, 8, seed=11), randn(1, 2, L, 8, seed=12)
    past = randn(1, 2, L - 1, 8, seed=13)
    pieces, sel = enc.select_pieces(q, k, v, torch.tensor([[30]]), torch.arange(L)[None], {},
                                    past_queries=past)  # fmt: skip
    assert len(pieces) == K + 1
    rank = sel.rank[0, :, 0]  # (H, G)
    for h in range(2):
        chosen = (rank[h] >= 0).nonzero().flatten().tolist()
        assert len(chosen) == K and chosen[0] == 0 and chosen[-2:] == [6, 7]
        assert 1 <= chosen[1] <= 5
    ctx = relpos.encodings.base.BiasContext(torch.tensor([[30]]), torch.arange(L)[None], sel)
    b, h = torch.zeros(1, 1, 1, 1, dtype=torch.long), torch.arange(2)[None, :, None, None]
    i, j = torch.zeros(1, 1, 1, 1, dtype=torch.long), torch.arange(L)[None, None, None, :]
    piece = enc.piece_index(ctx, b, h, i, j)[0, :, 0]  # (H, L)
    assert int((piece >= 0).sum(-1).max()) == A - 1  # 3 full chunks + 3 keys of chunk 7
    r = K - 1 - piece.clamp(min=0)  # the rank each key is read at
    key_pos = r * W + torch.arange(L) % W
    distance = ((K - 1) * W + 30 % W) - key_pos
    visible = piece >= 0
    assert int(distance[visible].max()) <= A - 1 and int(distance[visible].min()) == 0


def test_below_begin_selective_length_it_is_rope():
    q, k, v = randn(2, 2, A, 8, seed=14), randn(2, 2, A, 8, seed=15), randn(2, 2, A, 8, seed=16)
    rope = relpos.create("rope", num_heads=2, head_dim=8)
    for backend in ("eager", "chunked"):
        out = relpos.attention(q, k, v, make(), causal=True, backend=backend)
        torch.testing.assert_close(out, relpos.attention(q, k, v, rope, causal=True))


def test_heads_select_their_own_chunks():
    L = 64
    q, k, v = randn(1, 2, L, 8, seed=17), randn(1, 2, L, 8, seed=18), randn(1, 2, L, 8, seed=19)
    _, sel = make().select_pieces(q, k, v, torch.arange(L)[None], torch.arange(L)[None], {})
    assert not torch.equal(sel.rank[0, 0], sel.rank[0, 1])


def test_features_of_gapped_positions_equal_the_chunked_features_of_a_range():
    """The O(Lk^2) same-chunk path (any positions) and the reshape path (one range) agree."""
    enc = make()
    L = 40
    q, k, v = randn(1, 2, L, 8, seed=20), randn(1, 2, L, 8, seed=21), randn(1, 2, L, 8, seed=22)
    pos = torch.arange(L)[None]
    fast = enc.chunk_keys(q, k, v, pos)
    q2, k2, v2 = (x.expand(2, -1, -1, -1) for x in (q, k, v))
    gapped = enc.chunk_keys(q2, k2, v2, pos.expand(2, L))  # (B, L) positions: same-chunk mask
    torch.testing.assert_close(gapped[0][1:], fast[0].expand_as(gapped[0])[1:])
    torch.testing.assert_close(gapped[1][0], fast[1][0])


@pytest.mark.parametrize(
    "options, message",
    [
        ({"window_size": 4, "atten_length": 18}, "a multiple k"),
        ({"window_size": 4, "atten_length": 8}, "k >= 3"),
        ({"window_size": 4, "atten_length": 16, "begin_selective_length": 8}, ">= atten_length"),
    ],
)
def test_bad_sizes_are_refused_by_name(options, message):
    with pytest.raises(ValueError, match=message):
        relpos.create("longheads", num_heads=2, head_dim=8, **options)


def test_value_head_dim_must_match():
    q, k = randn(1, 2, 20, 8), randn(1, 2, 20, 8)
    with pytest.raises(ValueError, match="head_dim"):
        relpos.attention(q, k, randn(1, 2, 20, 4), make(), causal=True)
