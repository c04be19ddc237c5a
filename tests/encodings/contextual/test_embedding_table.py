"""Relative-embedding tables (Shaw, Music Transformer, NEZHA, Huang et al. 2020 methods 3/4)
against pinned reference values worked out from the official code (tensorflow/tensor2tensor for
Shaw and the Music Transformer, huawei-noah/Pretrained-Language-Model for NEZHA, HF BERT's
``relative_key_query`` for Huang et al.'s method 4) and against dense O(L^2 D) references
written here from each paper's formula.

* pinned values: the Music Transformer's skewing examples, NEZHA's sinusoid rows and index
  matrix;
* skewing == gather == the dense product, and equals the Music Transformer bias of relpos;
* every encoding: logits and outputs equal the dense reference (an explicit ``(L, L, D)``
  gather ``a_ij``, then the paper's sums) on ``eager`` and ``chunked`` (production and small
  blocks), forward and backward (gradients of q, k, v and of the tables).
"""

from __future__ import annotations

import math

import pytest
import torch

import relpos
from relpos.attention import chunked, supported_backends
from relpos.encodings.contextual.table_ops import skew, skew_unmasked, trilinear_scores

B, H, D = 2, 3, 8


def close(actual: torch.Tensor, expected: torch.Tensor, rtol: float = 1e-5, msg: str = "") -> None:
    """Relative to the largest magnitude of ``expected`` (as the conformance suite)."""
    scale = float(expected.detach().abs().max()) if expected.numel() else 0.0
    torch.testing.assert_close(
        actual, expected, rtol=rtol, atol=rtol * scale + 1e-30, msg=(lambda m: f"{msg}\n{m}")
    )


# ------------------------------------------------------------------------------ pinned values
def test_skew_matches_spec_masked_reference() -> None:
    # Music Transformer skewing, L=3: R = [[1,2,3],[4,5,6],[7,8,9]] -> [[3,.,.],[5,6,.],[7,8,9]]
    out = skew(torch.arange(1.0, 10.0).view(3, 3))
    lower = torch.ones(3, 3, dtype=torch.bool).tril()
    expected = torch.tensor([[3.0, 0, 0], [5, 6, 0], [7, 8, 9]])
    assert torch.equal(out[lower], expected[lower])


def test_skew_unmasked_matches_spec_reference() -> None:
    # unmasked skewing: x = arange(1..15).view(3,5) gives [[3,4,5],[7,8,9],[11,12,13]]
    out = skew_unmasked(torch.arange(1.0, 16.0).view(3, 5))
    assert torch.equal(out, torch.tensor([[3.0, 4, 5], [7, 8, 9], [11, 12, 13]]))


def test_nezha_sinusoid_rows_match_spec() -> None:
    # NEZHA (d=4, K=2): rows of T for pos 0..4
    expected = torch.tensor(
        [
            [0.0, 1.0, 0.0, 1.0],
            [0.841471, 0.540302, 0.01, 0.99995],
            [0.909297, -0.416147, 0.019999, 0.9998],
            [0.14112, -0.989992, 0.029996, 0.99955],
            [-0.756802, -0.653644, 0.039989, 0.9992],
        ]
    )
    enc = relpos.create("nezha", num_heads=1, head_dim=4, max_relative_position=2)
    torch.testing.assert_close(enc.relation_table("key"), expected, rtol=0, atol=1e-5)
    assert enc.relation_table("value") is enc.relation_table("key")  # one table for both


def test_nezha_index_matrix_matches_spec() -> None:
    # NEZHA: "the index matrix for L=4 is [[2,3,4,4],[1,2,3,4],[0,1,2,3],[0,0,1,2]]" (K=2)
    enc = relpos.create("nezha", num_heads=1, head_dim=4, max_relative_position=2)
    pos = torch.arange(4)
    expected = torch.tensor([[2, 3, 4, 4], [1, 2, 3, 4], [0, 1, 2, 3], [0, 0, 1, 2]])
    assert torch.equal(enc.index(pos, pos), expected)


def test_shaw_index_is_clipped_key_minus_query_plus_k() -> None:
    # Shaw: w[clip(j - i, -k, k) + k]; an asymmetric (left, right) window shifts by left
    pos = torch.arange(6)
    rel = pos[None, :] - pos[:, None]
    sym = relpos.create("shaw", num_heads=1, head_dim=4, max_relative_position=2)
    assert torch.equal(sym.index(pos, pos), rel.clamp(-2, 2) + 2)
    asym = relpos.create("shaw", num_heads=1, head_dim=4, max_relative_position=(3, 1))
    assert torch.equal(asym.index(pos, pos), rel.clamp(-3, 1) + 3)
    assert asym.key_table.shape == (5, 4)


def test_huang2020_index_is_hf_query_minus_key_plus_m_minus_1() -> None:
    # Huang et al. method 3: a_ij = E[(i - j) + max_pos - 1], table 2 max_pos - 1 rows
    for name in ("huang2020-m3", "huang2020-m4"):
        enc = relpos.create(name, num_heads=2, head_dim=4, max_position_embeddings=5)
        pos = torch.arange(5)
        assert torch.equal(enc.index(pos, pos), pos[:, None] - pos[None, :] + 4)
        assert enc.distance_embedding.shape == (9, 4)


def test_music_transformer_rows_run_from_minus_n_plus_1_to_0() -> None:
    # Music Transformer: E_r has N rows for relative positions -(N-1) .. 0: row = j - i + N - 1
    enc = relpos.create("music-transformer", num_heads=2, head_dim=4, max_relative_position=4)
    assert enc.key_table.shape == (2, 4, 4)  # heads do not share by default (t2t)
    pos = torch.arange(4)
    assert torch.equal(enc.index(pos, pos).tril(), (pos[None, :] - pos[:, None] + 3).tril())


def test_default_options_follow_the_sources() -> None:
    shaw = relpos.create("shaw", num_heads=4, head_dim=16)
    assert (shaw.left, shaw.right, shaw.has_value_term) == (16, 16, True)
    assert shaw.key_table.shape == (33, 16)  # shared by the heads
    bound = math.sqrt(3 / 33)  # uniform_unit_scaling of a [2k+1, d] variable
    top = float(shaw.key_table.detach().abs().max())
    assert 0.8 * bound < top <= bound
    nezha = relpos.create("nezha", num_heads=4, head_dim=16)
    assert (nezha.left, nezha.has_value_term, nezha.learnable) == (64, True, False)
    m4 = relpos.create("huang2020-m4", num_heads=4, head_dim=16)
    assert m4.distance_embedding.shape == (1023, 16) and not m4.has_value_term
    mt = relpos.create("music-transformer", num_heads=4, head_dim=16)
    assert mt.causal_only and not mt.has_value_term
    assert abs(float(mt.key_table.detach().std()) - 16**-0.5) < 0.02  # N(0, d^-0.5)


# ------------------------------------------------------------------------------ skewing
def _relative_gather(qe: torch.Tensor) -> torch.Tensor:
    """``out[i, j] = qe[i, j - i + L - 1]`` by an explicit index gather (garbage-free where
    the index is valid, 0 elsewhere)."""
    L, C = qe.shape[-2], qe.shape[-1]
    i = torch.arange(L)[:, None]
    j = torch.arange(L)[None, :]
    col = j - i + L - 1
    valid = (col >= 0) & (col < C)
    out = torch.gather(qe, -1, col.clamp(0, C - 1).expand(*qe.shape[:-1], L))
    return out * valid


def test_skew_equals_gather_equals_dense_product() -> None:
    gen = torch.Generator().manual_seed(0)
    L = 11
    q = torch.randn(B, H, L, D, generator=gen, dtype=torch.float64)
    E = torch.randn(L, D, generator=gen, dtype=torch.float64)  # relative positions -(L-1)..0
    qe = q @ E.T
    i = torch.arange(L)[:, None]
    j = torch.arange(L)[None, :]
    lower = j <= i
    dense = torch.einsum("bhid,ijd->bhij", q, E[(j - i + L - 1).clamp(0, L - 1)])
    torch.testing.assert_close(skew(qe)[..., lower], _relative_gather(qe)[..., lower])
    torch.testing.assert_close(skew(qe)[..., lower], dense[..., lower])


def test_skew_unmasked_equals_gather_equals_dense_product() -> None:
    gen = torch.Generator().manual_seed(1)
    L = 9
    q = torch.randn(B, H, L, D, generator=gen, dtype=torch.float64)
    E = torch.randn(2 * L - 1, D, generator=gen, dtype=torch.float64)  # -(L-1) .. L-1
    qe = q @ E.T
    i = torch.arange(L)[:, None]
    j = torch.arange(L)[None, :]
    dense = torch.einsum("bhid,ijd->bhij", q, E[j - i + L - 1])
    torch.testing.assert_close(skew_unmasked(qe), _relative_gather(qe))
    torch.testing.assert_close(skew_unmasked(qe), dense)


@pytest.mark.parametrize("bidirectional", [False, True], ids=["masked", "unmasked"])
def test_music_transformer_bias_equals_skewed_q_er(bidirectional: bool) -> None:
    L = 13
    torch.manual_seed(0)
    enc = relpos.create(
        "music-transformer",
        num_heads=H,
        head_dim=D,
        max_relative_position=L,
        bidirectional=bidirectional,
    )
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(B, H, L, D, generator=gen)
    k = torch.randn(B, H, L, D, generator=gen)
    scale = D**-0.5
    rel = relpos.scores(q, k, enc) - (q @ k.transpose(-1, -2)) * scale
    qe = torch.einsum("bhld,hrd->bhlr", q, enc.key_table.detach())
    if bidirectional:
        close(rel, skew_unmasked(qe) * scale)
    else:
        lower = torch.ones(L, L, dtype=torch.bool).tril()
        close(rel[..., lower], skew(qe)[..., lower] * scale)
        assert torch.equal(rel[..., ~lower], torch.zeros_like(rel[..., ~lower]))


def test_trilinear_scores_forward_and_backward_equal_the_dense_product() -> None:
    gen = torch.Generator().manual_seed(3)
    T, S, R = 5, 7, 4
    q = torch.randn(B, H, T, 1, D, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(B, H, 1, S, D, generator=gen, dtype=torch.float64, requires_grad=True)
    table = torch.randn(R, D, generator=gen, dtype=torch.float64, requires_grad=True)
    rows = torch.randint(0, R, (B, 1, T, S), generator=gen)
    got = trilinear_scores(q, k, table, rows)
    expected = (q * k * table[rows]).sum(-1)
    torch.testing.assert_close(got, expected)
    g = torch.randn(expected.shape, generator=gen, dtype=torch.float64)
    ga = torch.autograd.grad((got * g).sum(), (q, k, table))
    ge = torch.autograd.grad((expected * g).sum(), (q, k, table))
    for a, e in zip(ga, ge, strict=True):
        torch.testing.assert_close(a, e)
    assert torch.autograd.gradcheck(
        lambda q, k, t: trilinear_scores(q, k, t, rows), (q, k, table), fast_mode=True
    )


# ------------------------------------------------------------------------------ dense references
def _rel(q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """``j - i`` in positions, ``(B|1, Lq, Lk)``."""
    return k_pos[..., None, :] - q_pos[..., :, None]


def _sinusoid(rows: int, d: int) -> torch.Tensor:
    """NEZHA's table written out: T[pos, 2m] = sin(pos / 10000^(2m/d)), T[pos, 2m+1] = cos."""
    t = torch.zeros(rows, d, dtype=torch.float64)
    for pos in range(rows):
        for m in range(d // 2):
            angle = pos / 10000 ** (2 * m / d)
            t[pos, 2 * m] = math.sin(angle)
            t[pos, 2 * m + 1] = math.cos(angle)
    return t.float()


def _lookup(table: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``table[idx]`` for a shared ``(R, D)`` table -> ``(B, Lq, Lk, D)``; a per-head
    ``(H, R, D)`` table -> ``(B, H, Lq, Lk, D)``."""
    return table[idx] if table.dim() == 2 else table[:, idx].transpose(0, 1)


def _per_head(a: torch.Tensor) -> torch.Tensor:
    """``(B, Lq, Lk, D)`` -> ``(B, 1, Lq, Lk, D)``; a per-head ``(B, H, Lq, Lk, D)`` is kept."""
    return a[:, None] if a.dim() == 4 else a


def dense_reference(enc, q, k, v, q_pos, k_pos, causal: bool):
    """The paper's formula with the relative embeddings gathered into ``(L, L, D)`` tensors.

    Returns ``(logits, out)``.
    """
    scale = D**-0.5
    rel = _rel(q_pos, k_pos)  # (B, Lq, Lk)
    content = q @ k.transpose(-1, -2)
    aV = None
    if enc.name == "shaw":
        k_max = enc.left  # symmetric window in these tests
        idx = rel.clamp(-k_max, k_max) + k_max
        aK = _lookup(enc.key_table, idx)  # w^K[clip(j - i, -k, k) + k]
        aV = _lookup(enc.value_table, idx) if enc.has_value_term else None
        logits = (content + torch.einsum("bhid,bhijd->bhij", q, _per_head(aK))) * scale
    elif enc.name == "music-transformer":
        n = enc.max_relative_position
        E = enc.key_table  # (H, N or 2N-1, D) or (N or 2N-1, D): from relative position -(N-1)
        # zero rows before -(N-1); causal: no embedding after the query, bidirectional: rows
        # for relative positions -(N-1) .. N-1 and zero beyond
        ok = (rel > -n) & ((rel < n) if enc.bidirectional else (rel <= 0))
        rows = (rel + n - 1).clamp(0, E.shape[-2] - 1)
        keep = ok[..., None].to(q.dtype)
        aK = _lookup(E, rows) * (keep[:, None] if E.dim() == 3 else keep)
        if enc.has_value_term:
            aV = _lookup(enc.value_table, rows) * (keep[:, None] if E.dim() == 3 else keep)
        logits = (content + torch.einsum("bhid,bhijd->bhij", q, _per_head(aK))) * scale
    elif enc.name == "nezha":
        K = enc.max_relative_position
        T = _sinusoid(2 * K + 1, D)
        aK = aV = T[rel.clamp(-K, K) + K]
        logits = (content + torch.einsum("bhid,bhijd->bhij", q, _per_head(aK))) * scale
    else:
        M = enc.max_position_embeddings
        idx = (-rel).clamp(-(M - 1), M - 1) + M - 1  # (i - j) + M - 1, clipped beyond the table
        a = _per_head(enc.distance_embedding[idx])
        if enc.name == "huang2020-m4":  # q.k + q.a + k.a
            qa = torch.einsum("bhid,bhijd->bhij", q, a)
            ka = torch.einsum("bhjd,bhijd->bhij", k, a)
            logits = (content + qa + ka) * scale
        else:  # method 3: sum_l q_il k_jl a_ijl
            logits = torch.einsum("bhid,bhjd,bhijd->bhij", q, k, a) * scale
    masked = logits
    if causal:
        i = torch.arange(q.shape[2])[:, None] + (k.shape[2] - q.shape[2])
        masked = logits.masked_fill(torch.arange(k.shape[2])[None, :] > i, float("-inf"))
    p = masked.softmax(-1)
    out = p @ v
    if aV is not None:
        out = out + torch.einsum("bhij,bhijd->bhid", p, _per_head(aV))
    return logits, out


# (name, options): small windows so that clipping / zero rows are exercised at these lengths
ENCODINGS = [
    ("shaw", {"max_relative_position": 5}),
    ("shaw", {"max_relative_position": 5, "values": False}),
    ("shaw", {"max_relative_position": 4, "heads_share": False}),
    ("music-transformer", {"max_relative_position": 16}),
    ("music-transformer", {"max_relative_position": 12, "values": True, "heads_share": True}),
    ("music-transformer", {"max_relative_position": 10, "bidirectional": True, "values": True}),
    ("nezha", {"max_relative_position": 6}),
    ("huang2020-m4", {"max_position_embeddings": 10}),
    ("huang2020-m3", {"max_position_embeddings": 10}),
]
IDS = [f"{n}-{'-'.join(f'{k}={v}' for k, v in o.items())}" for n, o in ENCODINGS]


def _make(name: str, options: dict):
    torch.manual_seed(0)
    enc = relpos.create(name, num_heads=H, head_dim=D, **options)
    with torch.no_grad():  # move m3 away from its all-ones init: the test must see the table
        for p in enc.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return enc


def _problem(lq: int, lk: int, positions: str, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, n, D, generator=gen) for n in (lq, lk, lk))
    if positions == "default":
        kp = torch.arange(lk)[None]
    else:  # per-batch positions with gaps and different starts
        steps = torch.randint(1, 3, (B, lk), generator=gen)
        kp = steps.cumsum(1) + torch.tensor([[3], [40]])
    return q, k, v, kp[:, lk - lq :], kp


def _run(enc, q, k, v, q_pos, k_pos, causal: bool, backend: str):
    q, k, v = (t.clone().requires_grad_(True) for t in (q, k, v))
    leaves = [q, k, v, *enc.parameters()]
    if backend == "dense":
        _, out = dense_reference(enc, q, k, v, q_pos, k_pos, causal)
    else:
        out = relpos.attention(
            q, k, v, enc, q_pos=q_pos, k_pos=k_pos, causal=causal, backend=backend
        )
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(9))
    grads = torch.autograd.grad((out * weight).sum(), leaves)
    return out.detach(), grads


CASES = [  # (Lq, Lk, positions, causal)
    (40, 40, "default", True),
    (24, 40, "batch", False),
    (24, 40, "batch", True),
]


@pytest.mark.parametrize(("lq", "lk", "positions", "causal"), CASES)
@pytest.mark.parametrize(("name", "options"), ENCODINGS, ids=IDS)
def test_logits_equal_dense_reference(name, options, lq, lk, positions, causal) -> None:
    enc = _make(name, options)
    q, k, _, qp, kp = _problem(lq, lk, positions)
    expected, _ = dense_reference(enc, q, k, k, qp, kp, causal)
    close(relpos.scores(q, k, enc, q_pos=qp, k_pos=kp), expected.detach())


@pytest.mark.parametrize("backend", ["eager", "chunked", "chunked-small"])
@pytest.mark.parametrize(("lq", "lk", "positions", "causal"), CASES)
@pytest.mark.parametrize(("name", "options"), ENCODINGS, ids=IDS)
def test_attention_and_gradients_equal_dense_reference(
    name, options, lq, lk, positions, causal, backend, monkeypatch
) -> None:
    enc = _make(name, options)
    if enc.causal_only and not causal:
        pytest.skip("causal-only encoding")
    if backend == "chunked-small":  # several query blocks on the probability and tile paths
        monkeypatch.setattr(chunked, "TILE_ELEMENTS", 8 * lk)
        monkeypatch.setattr(enc, "block_rows", lambda ctx: 1)  # small blocks with key reads too
    problem = _problem(lq, lk, positions)
    ref_out, ref_grads = _run(enc, *problem, causal, "dense")
    out, grads = _run(enc, *problem, causal, backend.removesuffix("-small"))
    close(out, ref_out, msg="output")
    names = ["q", "k", "v", *(n for n, _ in enc.named_parameters())]
    for n, g, r in zip(names, grads, ref_grads, strict=True):
        close(g, r, msg=f"grad {n}")


def test_value_term_changes_the_output_and_keys_only_shaw_needs_no_probabilities() -> None:
    q, k, v, qp, kp = _problem(16, 16, "default")
    with_values = _make("shaw", {"max_relative_position": 3})
    keys_only = _make("shaw", {"max_relative_position": 3, "values": False})
    keys_only.key_table = with_values.key_table
    a = relpos.attention(q, k, v, with_values, causal=True)
    b = relpos.attention(q, k, v, keys_only, causal=True)
    assert (a - b).abs().max() > 1e-3
    # keys only has no value term: sdpa and flex accept it
    assert supported_backends(keys_only) == ["eager", "sdpa", "chunked", "flex"]
    assert supported_backends(with_values) == ["eager", "chunked"]


@pytest.mark.parametrize("name", ["shaw", "music-transformer", "huang2020-m4"])
def test_prepare_reads_only_the_rows_the_positions_reach(name) -> None:
    """O(L R) with R <= Lq + Lk - 1, whatever the table size (here 1023 to 4095 rows)."""
    big = {"shaw": {"max_relative_position": 2047}, "huang2020-m4": {}}.get(
        name, {"max_relative_position": 2048}
    )
    enc = relpos.create(name, num_heads=H, head_dim=D, **big)
    q = torch.randn(1, H, 1, D)  # one decoding step against 30 keys
    k = torch.randn(1, H, 30, D)
    ctx = enc.prepare(q, k, torch.tensor([[29]]), torch.arange(30)[None])
    assert ctx.data.query.compute().shape == (1, H, 1, 30)


def test_bad_options_name_the_argument() -> None:
    with pytest.raises(ValueError, match="max_relative_position"):
        relpos.create("shaw", num_heads=2, head_dim=4, max_relative_position=-1)
    with pytest.raises(ValueError, match="max_relative_position"):
        relpos.create("shaw", num_heads=2, head_dim=4, max_relative_position=(1, 2, 3))
    with pytest.raises(ValueError, match="max_relative_position"):
        relpos.create("music-transformer", num_heads=2, head_dim=4, max_relative_position=0)
    with pytest.raises(TypeError, match="max_position_embeddings"):  # a wrong type: TypeError
        relpos.create("huang2020-m4", num_heads=2, head_dim=4, max_position_embeddings=1.5)
    with pytest.raises(ValueError, match="head_dim"):
        relpos.create("nezha", num_heads=2, head_dim=5)
    with pytest.raises(TypeError, match="values"):
        relpos.create("shaw", num_heads=2, head_dim=4, values="yes")
