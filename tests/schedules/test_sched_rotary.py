"""Dual Chunk Attention, LM-Infinite and Self-Extend against references written from the papers
and the official code (HKUNLP/ChunkLlama, Glaciohound/LM-Infinite, datamllab/LongLM).

Every reference here is built in float64 from the formulas, pair by pair: the rotary
positions (query, key) that the method assigns to each (i, j), an explicit rotation of q_i
and k_j by those positions (no relpos rotation code), and the mask. relpos must give the same
logits (``relpos.scores``) and outputs (``relpos.attention`` on ``eager`` and ``chunked``
with several query blocks), gradients included, and a KV-cache decode must equal the full
forward. DCA is also checked against the paper's algorithm (three partial softmaxes merged
by log-sum-exp), Self-Extend against the official two-matrix merge.
"""

from __future__ import annotations

import math

import pytest
import torch

import relpos
from relpos.attention import chunked
from relpos.encodings.base import BiasContext

NAMES = ["dca", "lm-infinite", "self-extend"]
SMALL = {
    "dca": {"pretraining_length": 16},  # s = 12, w = 2, c = 10
    "lm-infinite": {"local_branch": 8, "global_branch": 3, "limit_distance": 6},
    "self-extend": {"group_size": 4, "neighbor_window": 6},  # shift W - W/G = 4.5
}


# ----------------------------------------------------------------------------- references
def inv_freq64(rotary_dim: int, base: float = 10000.0) -> torch.Tensor:
    return base ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)


def rotate64(x: torch.Tensor, pos: torch.Tensor, freq: torch.Tensor, layout: str) -> torch.Tensor:
    """Rotate ``x (..., D)`` by ``pos (...)`` (float64), pairs as in ``layout``; channels past
    ``2 * len(freq)`` pass through."""
    r = 2 * freq.numel()
    ang = pos[..., None] * freq
    cos, sin = ang.cos(), ang.sin()
    out = x.clone()
    if layout == "half":
        a, b = x[..., : r // 2], x[..., r // 2 : r]
        out[..., : r // 2] = a * cos - b * sin
        out[..., r // 2 : r] = a * sin + b * cos
    else:
        a, b = x[..., 0:r:2], x[..., 1:r:2]
        out[..., 0:r:2] = a * cos - b * sin
        out[..., 1:r:2] = a * sin + b * cos
    return out


def dca_pairs(lq: int, lk: int, s: int, w: int):
    """Paper / ChunkLlama: chunk length c = s - w; keys at j mod c; a query in chunk n meets
    its own chunk from i mod c, chunk n-1 from min(i mod c + c, s), older chunks from
    min(2c - 1, s); causal."""
    c = s - w
    pq = torch.zeros(lq, lk, dtype=torch.float64)
    pk = torch.zeros(lq, lk, dtype=torch.float64)
    ok = torch.zeros(lq, lk, dtype=torch.bool)
    for a in range(lq):
        i = a + lk - lq
        for j in range(i + 1):
            ci, cj = i // c, j // c
            if ci == cj:
                q = i - ci * c
            elif cj == ci - 1:
                q = min(i - ci * c + c, s)
            else:
                q = min(2 * c - 1, s)
            pq[a, j], pk[a, j], ok[a, j] = q, j - cj * c, True
    return pq, pk, ok


def lm_infinite_pairs(lq: int, lk: int, n_local: int, n_global: int, limit: int):
    """Lambda mask: j visible iff i - j < n_local or j < n_global (j <= i); local keys at their
    true positions; starting keys beyond the window at distance min(limit, kv_len - 1) (the
    official code: the query rotated by that against the unrotated key)."""
    pq = torch.zeros(lq, lk, dtype=torch.float64)
    pk = torch.zeros(lq, lk, dtype=torch.float64)
    ok = torch.zeros(lq, lk, dtype=torch.bool)
    for a in range(lq):
        i = a + lk - lq
        for j in range(i + 1):
            if i - j < n_local:
                pq[a, j], pk[a, j], ok[a, j] = i, j, True
            elif j < n_global:
                pq[a, j], pk[a, j], ok[a, j] = min(limit, lk - 1), 0, True
    return pq, pk, ok


def self_extend_pairs(lq: int, lk: int, group: int, window: int):
    """Neighbour positions (i, j) for i - j < W, else grouped (i // G + W - W / G, j // G)."""
    pq = torch.zeros(lq, lk, dtype=torch.float64)
    pk = torch.zeros(lq, lk, dtype=torch.float64)
    ok = torch.zeros(lq, lk, dtype=torch.bool)
    for a in range(lq):
        i = a + lk - lq
        for j in range(i + 1):
            if i - j < window:
                pq[a, j], pk[a, j] = i, j
            else:
                pq[a, j], pk[a, j] = i // group + window - window / group, j // group
            ok[a, j] = True
    return pq, pk, ok


def pairs_for(name: str, opts: dict, lq: int, lk: int):
    if name == "dca":
        lp = opts["pretraining_length"]
        return dca_pairs(
            lq, lk, opts.get("chunk_size", 3 * lp // 4), opts.get("local_window", lp // 8)
        )
    if name == "lm-infinite":
        limit = opts.get("limit_distance", opts["local_branch"])
        return lm_infinite_pairs(lq, lk, opts["local_branch"], opts["global_branch"], limit)
    return self_extend_pairs(lq, lk, opts["group_size"], opts["neighbor_window"])


def reference_logits(q, k, pairs, *, rotary_dim=None, base=10000.0, layout="half", qscale=None):
    """float64 logits ``(B, H, Lq, Lk)`` with per-pair rotations; -inf where masked."""
    pq, pk, ok = pairs
    q, k = q.double(), k.double()
    if qscale is not None:
        q = q * qscale[None, None, :, None]
    groups = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(groups, dim=1)
    freq = inv_freq64(rotary_dim or q.shape[-1], base)
    qr = rotate64(q[:, :, :, None, :].expand(-1, -1, -1, k.shape[2], -1), pq, freq, layout)
    kr = rotate64(k[:, :, None, :, :].expand(-1, -1, q.shape[2], -1, -1), pk, freq, layout)
    logits = (qr * kr).sum(-1) / math.sqrt(q.shape[-1])
    return logits.masked_fill(~ok, float("-inf"))


def reference_attention(logits: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    groups = logits.shape[1] // v.shape[1]
    return torch.softmax(logits, dim=-1) @ v.double().repeat_interleave(groups, dim=1)


def qkv(b=2, h=4, hkv=4, lq=40, lk=40, d=16, seed=0, grad=False):
    gen = torch.Generator().manual_seed(seed)
    out = (
        torch.randn(b, h, lq, d, generator=gen),
        torch.randn(b, hkv, lk, d, generator=gen),
        torch.randn(b, hkv, lk, d, generator=gen),
    )
    return tuple(t.requires_grad_(grad) for t in out)


def close(actual, expected, rtol=2e-5):
    fin = torch.isfinite(expected)
    assert torch.equal(torch.isfinite(actual), fin), "masked pairs differ"
    scale = float(expected[fin].abs().max())
    torch.testing.assert_close(actual.double()[fin], expected[fin], rtol=rtol, atol=rtol * scale)


# ----------------------------------------------------------------------------- flags
@pytest.mark.parametrize("name", NAMES)
def test_flags_are_honest(name):
    enc = relpos.create(name, num_heads=2, head_dim=8)
    assert enc.piecewise and enc.needs_probabilities and enc.has_rotary
    assert not enc.relative  # chunks, groups and starting tokens are absolute positions
    assert not enc.cache_rotated_keys and enc.causal_only and not enc.continuous
    assert isinstance(enc, type(relpos.create("rope", num_heads=2, head_dim=8)))  # reuses RoPE


# ----------------------------------------------------------------------------- dense references
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(
    "variant",
    [
        {},
        {"layout": "interleaved"},
        {"partial_rotary_factor": 0.5},
        {"base": 500.0},
    ],
    ids=["half", "interleaved", "partial", "base500"],
)
def test_scores_match_per_pair_rotation_reference(name, variant):
    opts = {**SMALL[name], **variant}
    enc = relpos.create(name, num_heads=4, head_dim=16, **opts)
    q, k, _ = qkv(lq=40, lk=40, hkv=2)
    ref = reference_logits(
        q,
        k,
        pairs_for(name, opts, 40, 40),
        rotary_dim=int(16 * opts.get("partial_rotary_factor", 1.0)),
        base=opts.get("base", 10000.0),
        layout=opts.get("layout", "half"),
    )
    got = relpos.scores(q, k, enc)
    close(got, ref)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("lq", [40, 13, 1], ids=["full", "lq<lk", "decode"])
def test_attention_eager_and_chunked_match_reference(name, lq, monkeypatch):
    monkeypatch.setattr(chunked, "TILE_ELEMENTS", 8 * 40)  # 8 query rows per block
    enc = relpos.create(name, num_heads=4, head_dim=16, **SMALL[name])
    q, k, v = qkv(lq=lq, lk=40, hkv=2)
    ref = reference_attention(reference_logits(q, k, pairs_for(name, SMALL[name], lq, 40)), v)
    for backend in ("eager", "chunked", "auto"):
        out = relpos.attention(q, k, v, enc, causal=True, backend=backend)
        close(out, ref)


@pytest.mark.parametrize("name", NAMES)
def test_gradients_match_reference(name, monkeypatch):
    monkeypatch.setattr(chunked, "TILE_ELEMENTS", 8 * 40)
    enc = relpos.create(name, num_heads=4, head_dim=16, **SMALL[name])
    q, k, v = qkv(b=1, lq=40, lk=40, hkv=2, grad=True)
    weight = torch.randn(1, 4, 40, 16, generator=torch.Generator().manual_seed(5))
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = reference_attention(reference_logits(qd, kd, pairs_for(name, SMALL[name], 40, 40)), vd)
    ref_grads = torch.autograd.grad((ref * weight.double()).sum(), (qd, kd, vd))
    for backend in ("eager", "chunked"):
        out = relpos.attention(q, k, v, enc, causal=True, backend=backend)
        grads = torch.autograd.grad((out * weight).sum(), (q, k, v))
        for g, r in zip(grads, ref_grads, strict=True):
            close(g, r, rtol=5e-5)


@pytest.mark.parametrize("name", NAMES)
def test_batch_positions_with_gaps_match_reference(name):
    """Positions are read as values: per-row positions with gaps and offsets follow the same
    formulas with i, j replaced by the positions."""
    opts = SMALL[name]
    enc = relpos.create(name, num_heads=2, head_dim=8, **opts)
    gen = torch.Generator().manual_seed(3)
    pos = torch.randint(1, 3, (2, 30), generator=gen).cumsum(1) + torch.tensor([[0], [5]])
    q, k, v = qkv(b=2, h=2, hkv=2, lq=30, lk=30, d=8)
    got = relpos.attention(q, k, v, enc, q_pos=pos, k_pos=pos, causal=True)
    span = int(pos.max()) + 1
    for b in range(2):
        pairs = pairs_for(name, opts, span, span)
        idx = pos[b]
        sub = tuple(t[idx][:, idx] for t in pairs)
        ref = reference_attention(reference_logits(q[b : b + 1], k[b : b + 1], sub), v[b : b + 1])
        close(got[b : b + 1], ref)


def test_self_extend_log_scale_multiplies_queries():
    opts = {**SMALL["self-extend"], "log_scale_base": 4.0}
    enc = relpos.create("self-extend", num_heads=4, head_dim=16, **opts)
    q, k, v = qkv()
    pos = torch.arange(40, dtype=torch.float64)
    factor = (torch.log(pos + 1) / math.log(4.0)).clamp(min=1)
    ref = reference_logits(q, k, pairs_for("self-extend", opts, 40, 40), qscale=factor)
    close(relpos.scores(q, k, enc), ref)
    with pytest.raises(ValueError, match="non-negative"):
        relpos.scores(q, k, enc, q_pos=torch.arange(-5, 35), k_pos=torch.arange(-5, 35))


def test_dca_linear_scaling_divides_positions():
    """ChunkLlama's ``scaling_factor`` (PI) is RoPE's linear scaling: positions / factor."""
    opts = {**SMALL["dca"], "scaling": {"rope_type": "linear", "factor": 2.0}}
    enc = relpos.create("dca", num_heads=4, head_dim=16, **opts)
    q, k, _ = qkv()
    pq, pk, ok = dca_pairs(40, 40, 12, 2)
    close(relpos.scores(q, k, enc), reference_logits(q, k, (pq / 2, pk / 2, ok)))


# ----------------------------------------------------------------------------- official algorithms
def test_dca_equals_three_partial_softmaxes_merged_by_lse():
    """ChunkLlama's forward: per query chunk, flash attention over (a) its own chunk, causal,
    with intra queries, (b) the previous chunk with successive queries, (c) older chunks with
    the inter query; outputs merged with weights exp(lse) / sum exp(lse)."""
    s, w = 12, 2
    c = s - w
    enc = relpos.create("dca", num_heads=2, head_dim=8, chunk_size=s, local_window=w)
    q, k, v = qkv(b=1, h=2, hkv=2, lq=37, lk=37, d=8)
    freq = inv_freq64(8)
    L = 37
    kr = rotate64(k.double(), (torch.arange(L) % c).double(), freq, "half")

    def part(qx, kx, vx, causal):
        logits = qx @ kx.transpose(-1, -2) / math.sqrt(8)
        if causal:
            logits = logits.masked_fill(
                torch.ones_like(logits, dtype=torch.bool).triu(1), -math.inf
            )
        return torch.softmax(logits, -1) @ vx, torch.logsumexp(logits, -1)

    outs = []
    for begin in range(0, L, c):
        end = min(begin + c, L)
        i = torch.arange(begin, end).double()
        qb, vd = q.double()[:, :, begin:end], v.double()
        results = [
            part(rotate64(qb, i % c, freq, "half"), kr[:, :, begin:end], vd[:, :, begin:end], True)
        ]
        if begin >= c:
            succ = torch.clamp(i % c + c, max=s)
            pb = slice(begin - c, begin)
            results.append(
                part(rotate64(qb, succ, freq, "half"), kr[:, :, pb], vd[:, :, pb], False)
            )
        if begin >= 2 * c:
            inter = torch.full_like(i, min(2 * c - 1, s))
            ob = slice(0, begin - c)
            results.append(
                part(rotate64(qb, inter, freq, "half"), kr[:, :, ob], vd[:, :, ob], False)
            )
        lse = torch.stack([r[1] for r in results])
        weights = torch.softmax(lse, dim=0)
        outs.append(sum(wt[..., None] * r[0] for wt, r in zip(weights, results, strict=True)))
    ref = torch.cat(outs, dim=2)
    close(relpos.attention(q, k, v, enc, causal=True), ref)


def test_self_extend_equals_official_two_matrix_merge():
    """LongLM ``self_extend_forward`` (q_len == kv_len): neighbour and group score matrices,
    the neighbour mask ``tril(ones)`` minus ``tril(ones(L-W, L-W))`` placed at [W:, :-W],
    ``where(mask, neighbour, group)`` plus the causal mask, one softmax."""
    G, W, L = 4, 8, 40
    enc = relpos.create("self-extend", num_heads=2, head_dim=8, group_size=G, neighbor_window=W)
    q, k, v = qkv(b=1, h=2, hkv=2, lq=L, lk=L, d=8)
    freq = inv_freq64(8)
    pos = torch.arange(L).double()
    nq, nk = rotate64(q.double(), pos, freq, "half"), rotate64(k.double(), pos, freq, "half")
    gq_pos = torch.div(pos, G, rounding_mode="floor") + W - W / G
    gq = rotate64(q.double(), gq_pos, freq, "half")
    gk = rotate64(k.double(), torch.div(pos, G, rounding_mode="floor"), freq, "half")
    neighbor = nq @ nk.transpose(-1, -2) / math.sqrt(8)
    group = gq @ gk.transpose(-1, -2) / math.sqrt(8)
    mask = torch.tril(torch.ones(L, L))
    mask[W:, :-W] -= torch.tril(torch.ones(L - W, L - W))
    causal = torch.zeros(L, L).masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), -math.inf)
    logits = torch.where(mask.bool(), neighbor, group) + causal
    ref = torch.softmax(logits, -1) @ v.double()
    close(relpos.attention(q, k, v, enc, causal=True), ref)
    got = relpos.scores(q, k, enc)
    low = torch.ones(L, L, dtype=torch.bool).tril()
    close(got[..., low], logits[..., low])


@pytest.mark.parametrize("limit", [None, 20, 60], ids=["default", "cap>window", "cap>L"])
def test_lm_infinite_equals_official_lambda_attention(limit):
    """LM-Infinite ``Lambda_Attention_Matrix`` semantics: rotated scores inside the local
    window (``triu(-local + 1)`` of the causal matrix), stationary scores (query rotated by
    ``min(limit, kv_len - 1)``, key not rotated) on the first ``global_branch`` keys outside
    it, everything else masked. Default limit = local (the README setting); a cap larger
    than the window scores *every* far starting token at ``min(limit, kv_len - 1)`` too (issue
    10: relpos used the true distance below the cap, up to 1.9 apart in logits)."""
    n_local, n_global, L = 8, 3, 40
    enc = relpos.create(
        "lm-infinite",
        num_heads=2,
        head_dim=8,
        local_branch=n_local,
        global_branch=n_global,
        limit_distance=limit,
    )
    cap = n_local if limit is None else limit
    q, k, v = qkv(b=1, h=2, hkv=2, lq=L, lk=L, d=8)
    freq = inv_freq64(8)
    pos = torch.arange(L).double()
    rq, rk = rotate64(q.double(), pos, freq, "half"), rotate64(k.double(), pos, freq, "half")
    sq = rotate64(q.double(), torch.full((L,), float(min(cap, L - 1))), freq, "half")
    rot = rq @ rk.transpose(-1, -2) / math.sqrt(8)
    stationary = sq @ k.double().transpose(-1, -2) / math.sqrt(8)
    i, j = torch.arange(L)[:, None], torch.arange(L)[None, :]
    local = (j <= i) & (i - j < n_local)
    starting = (j < n_global) & (i - j >= n_local)
    logits = torch.where(local, rot, torch.where(starting, stationary, -math.inf))
    ref = torch.softmax(logits, -1) @ v.double()
    close(relpos.attention(q, k, v, enc, causal=True), ref)
    close(relpos.attention(q, k, v, enc, causal=True, backend="chunked"), ref)
    got = relpos.scores(q, k, enc).double()
    close(got[..., local | starting], logits[..., local | starting])


# -------------------------------------------------------------------------- pinned reference values
def effective(enc, q_pos: torch.Tensor, k_pos: torch.Tensor):
    """Per-pair (distance, piece) from the encoding's own schedule: distance = query rotary
    position - key rotary position of the chosen piece (nan where masked)."""
    qp, kp = q_pos[None], k_pos[None]
    ctx = BiasContext(qp, kp)
    b = torch.zeros(1, 1, 1, 1, dtype=torch.long)
    i = torch.arange(qp.shape[1])[None, None, :, None]
    j = torch.arange(kp.shape[1])[None, None, None, :]
    index = enc.piece_index(ctx, b, b, i, j)[0, 0]
    dist = torch.full(index.shape, float("nan"), dtype=torch.float64)
    for r, (pq, pk) in enumerate(enc.piece_positions(qp, kp)):
        d = pq[0].double()[:, None] - pk[0].double()[None, :]
        dist = torch.where(index == r, d, dist)
    return dist, index


def test_dca_positions_match_spec_r11():
    enc = relpos.create("dca", num_heads=1, head_dim=8, pretraining_length=16)
    assert (enc.chunk_size, enc.local_window, enc.chunk_len) == (12, 2, 10)
    pos = torch.arange(25)[None]
    (intra, key), (succ, _), (inter, _) = enc.piece_positions(pos, pos)
    assert intra[0].tolist() == [*range(10), *range(10), *range(5)]
    assert succ[0].tolist() == [10, 11] + [12] * 8 + [10, 11] + [12] * 8 + [10, 11, 12, 12, 12]
    assert inter[0].tolist() == [12] * 25
    assert key[0].tolist() == [*range(10), *range(10), *range(5)]
    dist, index = effective(enc, torch.arange(25), torch.arange(25))
    low = torch.ones(25, 25, dtype=torch.bool).tril()
    assert float(dist[low].max()) <= 12 and float(dist[low].min()) >= 0  # all within s < Lp
    assert (index[~low] == -1).all()
    assert index[24].tolist()[:25] == [2] * 10 + [1] * 10 + [0] * 5


def test_dca_defaults_follow_chunkllama():
    enc = relpos.create("dca", num_heads=1, head_dim=8)
    assert (enc.pretraining_length, enc.chunk_size, enc.local_window, enc.chunk_len) == (
        4096,
        3072,
        512,
        2560,
    )
    enc = relpos.create("dca", num_heads=1, head_dim=8, max_position_embeddings=2048)
    assert enc.pretraining_length == 2048 and enc.chunk_size == 1536


def test_lm_infinite_mask_and_distances_match_spec_appendix():
    enc = relpos.create(
        "lm-infinite", num_heads=1, head_dim=8, local_branch=3, global_branch=2, limit_distance=3
    )
    dist, index = effective(enc, torch.arange(10), torch.arange(10))
    mask = [
        "1000000000",
        "1100000000",
        "1110000000",
        "1111000000",
        "1111100000",
        "1101110000",
        "1100111000",
        "1100011100",
        "1100001110",
        "1100000111",
    ]
    expected = torch.tensor([[int(c) for c in row] for row in mask], dtype=torch.bool)
    assert torch.equal(index >= 0, expected)
    eff = torch.where(expected, (torch.arange(10)[:, None] - torch.arange(10)).clamp(max=3), -1)
    assert torch.equal(torch.where(expected, dist, -1.0), eff.double())
    assert enc.limit_distance == 3


def test_lm_infinite_distances_match_spec_r12():
    enc = relpos.create(
        "lm-infinite", num_heads=1, head_dim=8, local_branch=4096, global_branch=100
    )
    assert enc.limit_distance == 4096
    dist, index = effective(enc, torch.tensor([10000]), torch.tensor([5, 7000, 5000]))
    assert dist[0, 0] == 4096 and dist[0, 1] == 3000
    assert index[0, 2] == -1 and math.isnan(dist[0, 2])


def test_lm_infinite_defaults():
    enc = relpos.create("lm-infinite", num_heads=1, head_dim=8)
    assert (enc.local_branch, enc.global_branch, enc.limit_distance) == (4096, 10, 4096)
    enc = relpos.create("lm-infinite", num_heads=1, head_dim=8, max_position_embeddings=2048)
    assert enc.local_branch == enc.limit_distance == 2048


def test_self_extend_distances_match_spec_r13():
    enc = relpos.create("self-extend", num_heads=1, head_dim=8, group_size=4, neighbor_window=8)
    keys = torch.tensor([40, 33, 32, 31, 20, 0])
    dist, index = effective(enc, torch.tensor([40]), keys)
    assert dist[0].tolist() == [0, 7, 8.0, 9.0, 11.0, 16.0]
    assert index[0].tolist() == [0, 0, 1, 1, 1, 1]


def test_self_extend_fractional_shift_and_defaults():
    enc = relpos.create("self-extend", num_heads=1, head_dim=8, group_size=4, neighbor_window=6)
    dist, _ = effective(enc, torch.tensor([30]), torch.tensor([0, 24, 25]))
    assert dist[0].tolist() == [30 // 4 + 6 - 1.5, 30 // 4 + 6 - 1.5 - 6, 5.0]
    enc = relpos.create("self-extend", num_heads=1, head_dim=8)
    assert (enc.group_size, enc.neighbor_window) == (8, 1024)


# ----------------------------------------------------------------------------- KV cache and models
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("prefill,step", [(23, 1), (5, 7)])  # token by token: conformance
@torch.no_grad()
def test_kv_cache_decoding_equals_full_forward(name, prefill, step):
    torch.manual_seed(0)
    model = relpos.nn.TransformerLM(
        50,
        dim=32,
        depth=2,
        num_heads=4,
        encoding=name,
        encoding_options=SMALL[name],
        num_kv_heads=2,
    ).eval()
    toks = torch.randint(0, 50, (2, 40), generator=torch.Generator().manual_seed(1))
    full = model(toks)
    cache = model.new_cache()
    parts = [model(toks[:, :prefill], cache=cache)]
    for t in range(prefill, 40, step):
        parts.append(model(toks[:, t : t + step], cache=cache))
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
@torch.no_grad()
def test_llama_model_takes_the_trained_length(name):
    cfg = relpos.nn.LlamaConfig(
        vocab_size=40, dim=32, depth=1, num_heads=4, num_kv_heads=2, hidden_dim=64,
        max_position_embeddings=16,
    )  # fmt: skip
    model = relpos.nn.LlamaLM(cfg).eval()
    toks = torch.randint(0, 40, (1, 48), generator=torch.Generator().manual_seed(0))
    plain = model(toks)
    options = {"group_size": 4, "neighbor_window": 8} if name == "self-extend" else {}
    enc = model.set_encoding(name, **options)
    assert enc.max_position_embeddings == 16
    if name == "dca":
        assert enc.pretraining_length == 16
    if name == "lm-infinite":
        assert enc.local_branch == 16
    out = model(toks)
    assert torch.isfinite(out).all()
    # identical to plain RoPE while nothing reaches past the schedule's first piece
    torch.testing.assert_close(out[:, :8], plain[:, :8], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(out[:, -1], plain[:, -1])


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "name,options,match,exc",
    [
        ("dca", {"local_window": 12, "chunk_size": 12}, "local_window", ValueError),
        ("dca", {"pretraining_length": 1}, "pretraining_length", ValueError),
        ("dca", {"chunk_size": 0}, "chunk_size", ValueError),
        ("dca", {"local_window": -1}, "local_window", ValueError),
        ("dca", {"pretraining_length": 16.0}, "pretraining_length", TypeError),
        ("lm-infinite", {"local_branch": 0}, "local_branch", ValueError),
        ("lm-infinite", {"global_branch": -1}, "global_branch", ValueError),
        ("lm-infinite", {"limit_distance": True}, "limit_distance", TypeError),
        ("self-extend", {"group_size": 0}, "group_size", ValueError),
        ("self-extend", {"neighbor_window": 2.5}, "neighbor_window", TypeError),
        ("self-extend", {"log_scale_base": 1.0}, "log_scale_base", ValueError),
        ("self-extend", {"layout": "diagonal"}, "layout", ValueError),
    ],
)
def test_bad_options_raise_naming_the_option(name, options, match, exc):
    """relpos.validation's policy: TypeError for a wrong type, ValueError for a wrong value."""
    with pytest.raises(exc, match=match):
        relpos.create(name, num_heads=2, head_dim=8, **options)


@pytest.mark.parametrize("name", NAMES)
def test_bad_calls_raise(name):
    enc = relpos.create(name, num_heads=4, head_dim=16, **SMALL[name])
    q, k, v = qkv()
    with pytest.raises(TypeError, match="q_pos"):
        relpos.attention(q, k, v, enc, q_pos=torch.arange(40.0), causal=True)
    with pytest.raises(ValueError, match="causal"):
        relpos.attention(q, k, v, enc, causal=False)
    with pytest.raises(ValueError, match="cannot run encoding"):
        relpos.attention(q, k, v, enc, causal=True, backend="sdpa")
    with pytest.raises(ValueError, match="head_dim"):
        relpos.attention(q[..., :8], k[..., :8], v, enc, causal=True)


def test_dca_mscale_multiplies_logits_past_the_pretraining_length():
    """ChunkLlama's ``get_mscale``: cos/sin times ``m = 0.05 ln(L / Lp) + 1`` on q and k, so
    every logit times ``m^2`` once ``L > Lp``; nothing changes up to ``Lp``."""
    plain = relpos.create("dca", num_heads=4, head_dim=16, **SMALL["dca"])
    scaled = relpos.create("dca", num_heads=4, head_dim=16, mscale=True, **SMALL["dca"])
    assert "mscale=True" in repr(scaled) and "mscale" not in repr(plain)
    for length in (12, 16, 25, 40):
        q, k, _ = qkv(lq=length, lk=length)
        a, b = relpos.scores(q, k, plain), relpos.scores(q, k, scaled)
        m = 0.05 * math.log(length / 16) + 1 if length > 16 else 1.0
        finite = torch.isfinite(a)
        assert torch.equal(finite, torch.isfinite(b))
        torch.testing.assert_close(b[finite], a[finite] * m * m, rtol=1e-5, atol=1e-6)
    q, k, v = qkv(lq=40, lk=40)
    with torch.no_grad():  # the fused CPU path (log-sum-exp merge) and the generic path agree
        ref = relpos.attention(q, k, v, scaled, causal=True, backend="eager")
        out = relpos.attention(q, k, v, scaled, causal=True, backend="chunked")
    close(out, ref.double())
    with pytest.raises(TypeError, match="mscale"):
        relpos.create("dca", num_heads=4, head_dim=16, mscale=1)
