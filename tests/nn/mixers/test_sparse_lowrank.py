"""Sparse + low-rank attention with RoPE (RoLA, RoPeSLR arXiv 2605.20659, combined as SLA):
the blocked form equals the O(L^2) dense definition, the limits are softmax attention and the
RoLA branch alone, both RoLA branches are relative, RoPeSLR's is not, causal calls read no
future token, and masked rows are safe."""

from __future__ import annotations

import math

import pytest
import torch

import relpos
from relpos.attention.linear.feature_maps import HeadwiseLowRankFeatures, LowRankFeatures
from relpos.nn.mixers.rola import rola_attention
from relpos.nn.mixers.ropeslr import GridPositionEmbedding
from relpos.nn.mixers.sparse_lowrank import (
    BlockSelection,
    rotate_queries_keys,
    select_blocks,
    sparse_lowrank_attention,
)
from relpos.positions_nd import grid_positions

B, H, D, DV, R = 2, 2, 12, 3, 4
GRID = (4, 5, 6)


def _inputs(L: int, seed: int = 0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, H, L, D, generator=gen, dtype=dtype) for _ in range(2))
    v = torch.randn(B, H, L, DV, generator=gen, dtype=dtype)
    pos = torch.stack([torch.randint(0, n, (B, L), generator=gen) for n in GRID], -1)
    return q, k, v, pos


def _branch(lowrank: str, seed: int = 0):
    """encoding, feature map, position embedding (RoPeSLR), projection W (fp64)."""
    torch.manual_seed(seed)
    enc = relpos.create("rope-axial", num_heads=H, head_dim=D, dims=3)
    if lowrank == "rola":
        fmap, pe = LowRankFeatures(D, R, seed=seed).double(), None
    else:
        fmap = HeadwiseLowRankFeatures(H, D, R, seed=seed).double()
        pe = GridPositionEmbedding(H, D, GRID, std=0.5, seed=seed).double()
    proj = torch.nn.Linear(DV, DV, bias=False).double()
    return enc, fmap, pe, proj


def _call(q, k, v, pos, lowrank, method="blocked", **kw):
    enc, fmap, pe, proj = _branch(lowrank)
    kw.setdefault("projection", proj)
    return sparse_lowrank_attention(
        q, k, v, enc, fmap, pos=pos, lowrank=lowrank, position_embedding=pe, method=method, **kw
    )


@pytest.mark.parametrize("lowrank", ["rola", "ropeslr"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "L,block,local",
    [(13, 3, 0), (13, 4, None), (16, 4, 1), (16, 4, 0), (11, 5, 0), (7, 8, 0)],
)
def test_blocked_equals_the_dense_definition(lowrank, causal, L, block, local):
    q, k, v, pos = _inputs(L)
    valid = torch.ones(B, L, dtype=torch.bool)
    valid[1, L - 3 :] = False
    valid[1, 1] = False
    kw = dict(block_size=block, sparsity=0.5, local_radius=local, causal=causal, return_parts=True)
    for key_valid in (None, valid):
        out, o_s, o_l = _call(q, k, v, pos, lowrank, key_valid=key_valid, **kw)
        ref, r_s, r_l = _call(q, k, v, pos, lowrank, "dense", key_valid=key_valid, **kw)
        torch.testing.assert_close(o_s, r_s, atol=1e-12, rtol=1e-10)
        torch.testing.assert_close(o_l, r_l, atol=1e-12, rtol=1e-10)
        torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-10)
        if L > block:  # both branches non-trivial (one block: the diagonal covers it all)
            assert float(o_l.detach().abs().max()) > 1e-3
            assert float(o_s.detach().abs().max()) > 1e-3


def _pooled(x, b, n, causal, role):
    """Brute-force pooled vectors (the docstring's definition, one block at a time)."""
    L = x.shape[2]
    rows = []
    for blk in range(n):
        if causal and role == "q":
            lo, hi = max(0, blk * b - b + 1), blk * b + 1
        else:
            lo, hi = blk * b, min(L, blk * b + b)
        rows.append(x[:, :, lo:hi].mean(2))
    return torch.stack(rows, 2)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sparsity,local", [(0.9, 0), (0.5, 1), (0.7, None), (0.0, 0), (1.0, 2)])
def test_selection_keeps_the_local_blocks_and_the_top_pooled_scores(causal, sparsity, local):
    L, b = 29, 3
    q, k, v, pos = _inputs(L, seed=1)
    enc = relpos.create("rope-axial", num_heads=H, head_dim=D, dims=3)
    rq, rk, _ = rotate_queries_keys(enc, q, k, pos, 3)
    sel = select_blocks(rq, rk, block_size=b, sparsity=sparsity, local_radius=local, causal=causal)
    n = math.ceil(L / b)
    scores = _pooled(rq, b, n, causal, "q") @ _pooled(rk, b, n, causal, "k").transpose(-1, -2)
    mask = sel.mask.expand(B, H, n, n)
    for I in range(n):
        visible = list(range(I + 1)) if causal else list(range(n))
        near = [J for J in visible if local is not None and abs(I - J) <= local]
        want = max(len(near), math.floor((1 - sparsity) * len(visible) + 1e-9))
        row = mask[:, :, I]
        assert (row.sum(-1) == want).all()
        if causal:
            assert not row[:, :, I + 1 :].any()
        assert row[:, :, near].all()
        ranked = [J for J in visible if J not in near and not (causal and J == I)]
        for bb in range(B):
            for h in range(H):
                kept = [J for J in ranked if row[bb, h, J]]
                dropped = [J for J in ranked if not row[bb, h, J]]
                if kept and dropped:
                    assert scores[bb, h, I, kept].min() >= scores[bb, h, I, dropped].max()
    assert (
        abs(
            sel.density()
            - float(mask.double().mean(dim=(0, 1)).sum()) / (n * (n + 1) / 2 if causal else n * n)
        )
        < 1e-12
    )


@pytest.mark.parametrize("causal", [False, True])
def test_full_coverage_is_softmax_attention_exactly(causal):
    L = 14
    q, k, v, pos = _inputs(L, seed=2)
    enc, *_ = _branch("rola")
    out, o_s, o_l = _call(
        q, k, v, pos, "rola", block_size=4, sparsity=0.0, causal=causal, return_parts=True
    )
    assert bool((o_l == 0).all())
    want = relpos.attention(q, k, v, enc, causal=causal, q_pos=pos, k_pos=pos, backend="eager")
    torch.testing.assert_close(out, want, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("causal", [False, True])
def test_an_empty_sparse_branch_leaves_the_rola_branch_alone(causal):
    L = 14
    q, k, v, pos = _inputs(L, seed=3)
    enc, fmap, _, proj = _branch("rola")
    out, o_s, o_l = _call(
        q,
        k,
        v,
        pos,
        "rola",
        block_size=4,
        sparsity=1.0,
        local_radius=None,
        causal=causal,
        return_parts=True,
    )
    assert bool((o_s == 0).all())
    alone = rola_attention(q, k, v, enc, fmap, causal=causal, q_pos=pos, k_pos=pos)
    torch.testing.assert_close(o_l, alone, atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(out, proj(alone), atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("causal", [False, True])
def test_both_rola_branches_and_the_selection_are_shift_invariant(causal):
    L = 17
    q, k, v, pos = _inputs(L, seed=4)
    kw = dict(block_size=4, sparsity=0.5, causal=causal, return_parts=True)
    _, o_s, o_l = _call(q, k, v, pos, "rola", **kw)
    shift = torch.tensor([37, -5, 1000])
    _, m_s, m_l = _call(q, k, v, pos + shift, "rola", **kw)
    # the sparse branch rotates with the encoding's float32 cos/sin (rope.py): ~1e-7 at
    # positions ~1000; RoLA's branch forms cos/sin of float64 angles
    torch.testing.assert_close(m_s, o_s, atol=2e-6, rtol=0)
    torch.testing.assert_close(m_l, o_l, atol=1e-10, rtol=0)
    enc, *_ = _branch("rola")
    sels = [
        select_blocks(
            *rotate_queries_keys(enc, q, k, p, 3)[:2], block_size=4, sparsity=0.5, causal=causal
        ).mask
        for p in (pos, pos + shift)
    ]
    assert torch.equal(*sels)


def test_ropeslr_is_absolute_its_branch_changes_under_a_shift():
    L = 17
    q, k, v, pos = _inputs(L, seed=5)
    pos = pos.clamp(max=2)  # room to shift inside the (4, 5, 6) grid
    kw = dict(block_size=4, sparsity=0.5, return_parts=True)
    _, o_s, o_l = _call(q, k, v, pos, "ropeslr", **kw)
    _, m_s, m_l = _call(q, k, v, pos + 1, "ropeslr", **kw)
    torch.testing.assert_close(m_s, o_s, atol=2e-6, rtol=0)  # the sparse branch is RoPE
    assert float((m_l - o_l).detach().abs().max()) > 1e-3


@pytest.mark.parametrize("lowrank", ["rola", "ropeslr"])
def test_causal_outputs_read_no_later_token(lowrank):
    L, b = 19, 4
    q, k, v, pos = _inputs(L, seed=6)
    kw = dict(block_size=b, sparsity=0.5, local_radius=None, causal=True)
    out = _call(q, k, v, pos, lowrank, **kw)
    gen = torch.Generator().manual_seed(7)
    for t in (1, 4, 5, 9, 13, 18):  # block starts and inner tokens
        q2, k2, v2 = (x.clone() for x in (q, k, v))
        for x in (q2, k2, v2):
            x[:, :, t:] = torch.randn(x[:, :, t:].shape, generator=gen, dtype=x.dtype) * 3
        moved = _call(q2, k2, v2, pos, lowrank, **kw)
        torch.testing.assert_close(moved[:, :, :t], out[:, :, :t], atol=1e-12, rtol=0)


@pytest.mark.parametrize("lowrank", ["rola", "ropeslr"])
def test_gradients_match_the_dense_definition_and_pass_gradcheck(lowrank):
    L = 7
    gen = torch.Generator().manual_seed(8)
    q, k = (torch.randn(1, 1, L, 4, generator=gen, dtype=torch.float64) for _ in range(2))
    v = torch.randn(1, 1, L, 2, generator=gen, dtype=torch.float64)
    enc = relpos.create("rope", num_heads=1, head_dim=4)
    pe = None
    if lowrank == "rola":
        fmap = LowRankFeatures(4, 2, seed=0).double()
    else:
        fmap = HeadwiseLowRankFeatures(1, 4, 2, seed=0).double()
        pe = GridPositionEmbedding(1, 4, (L,), std=0.5, seed=0).double()
    for causal in (False, True):
        # row 1 covers block 0 only (its diagonal block open: the in-block causal term)
        mask = torch.tensor([[1, 0, 0], [1, 0, 0], [0, 1, 1]], dtype=torch.bool)
        if not causal:
            mask = torch.tensor([[1, 0, 1], [1, 0, 0], [0, 1, 1]], dtype=torch.bool)
        sel = BlockSelection(mask[None, None], 3, L, causal)

        def f(q, k, v, method="blocked", causal=causal, sel=sel):
            return sparse_lowrank_attention(
                q,
                k,
                v,
                enc,
                fmap,
                causal=causal,
                selection=sel,
                method=method,
                lowrank=lowrank,
                position_embedding=pe,
            )

        inputs = tuple(t.clone().requires_grad_() for t in (q, k, v))
        assert torch.autograd.gradcheck(f, inputs, fast_mode=True)
        grads = []
        for method in ("blocked", "dense"):
            fmap.zero_grad()
            params = [fmap.weight] + ([] if pe is None else list(pe.parameters()))
            for p in params:
                p.grad = None
            xs = tuple(t.clone().requires_grad_() for t in (q, k, v))
            f(*xs, method=method).square().sum().backward()
            grads.append([x.grad for x in xs] + [p.grad.clone() for p in params])
        for a, b in zip(*grads, strict=True):
            torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("causal", [False, True])
def test_rows_without_a_visible_key_are_zero_with_zero_gradients(causal):
    L = 10
    q, k, v, pos = _inputs(L, seed=9)
    valid = torch.ones(B, L, dtype=torch.bool)
    valid[1] = False  # batch row 1 sees nothing
    valid[0, :5] = False  # causal: rows 0..4 of batch 0 see nothing
    xs = [t.clone().requires_grad_() for t in (q, k, v)]
    out = _call(*xs, pos, "rola", block_size=3, sparsity=0.5, causal=causal, key_valid=valid)
    assert bool((out[1] == 0).all())
    if causal:
        assert bool((out[0, :, :5] == 0).all())
    out.sum().backward()
    assert all(bool(torch.isfinite(x.grad).all()) for x in xs)
    assert bool((xs[0].grad[1] == 0).all()) and bool((xs[2].grad[1] == 0).all())


def test_empty_sequences_and_activation_dtypes():
    enc, fmap, _, _ = _branch("rola")
    fmap = fmap.float()
    e = torch.zeros(B, H, 0, D)
    assert _call_f(e, e, torch.zeros(B, H, 0, DV), enc, fmap).shape == (B, H, 0, DV)
    q, k, v, pos = _inputs(21, seed=10, dtype=torch.float32)
    ref = _call_f(q, k, v, enc, fmap, pos=pos)
    assert ref.dtype == torch.float32
    for dtype in (torch.bfloat16, torch.float16):
        got = _call_f(q.to(dtype), k.to(dtype), v.to(dtype), enc, fmap, pos=pos)
        assert got.dtype == dtype
        torch.testing.assert_close(got.float(), ref, atol=3e-2, rtol=3e-2)


def _call_f(q, k, v, enc, fmap, **kw):
    return sparse_lowrank_attention(q, k, v, enc, fmap, block_size=4, sparsity=0.5, **kw)


def test_a_3d_grid_runs_with_default_and_given_positions():
    grid = grid_positions(2, 3, 4)  # (24, 3)
    gen = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(1, H, 24, D, generator=gen, dtype=torch.float64) for _ in range(3))
    enc, fmap, _, _ = _branch("rola")
    a = sparse_lowrank_attention(q, k, v, enc, fmap, pos=grid, block_size=4)
    b = sparse_lowrank_attention(q, k, v, enc, fmap, pos=grid[None], block_size=4)
    torch.testing.assert_close(a, b)
    c = sparse_lowrank_attention(q, k, v, enc, fmap, block_size=4)  # arange on every axis
    assert not torch.allclose(a, c)


def test_bad_arguments_are_refused_by_name():
    q, k, v, pos = _inputs(8)
    enc, fmap, pe, _ = _branch("rola")
    with pytest.raises(ValueError, match="sparsity"):
        sparse_lowrank_attention(q, k, v, enc, fmap, sparsity=1.5)
    with pytest.raises(ValueError, match="block_size"):
        sparse_lowrank_attention(q, k, v, enc, fmap, block_size=0)
    with pytest.raises(ValueError, match="local_radius"):
        sparse_lowrank_attention(q, k, v, enc, fmap, local_radius=-1)
    with pytest.raises(ValueError, match="lowrank"):
        sparse_lowrank_attention(q, k, v, enc, fmap, lowrank="linear")
    with pytest.raises(ValueError, match="self-attention"):
        sparse_lowrank_attention(q, k[:, :, :5], v[:, :, :5], enc, fmap)
    with pytest.raises(ValueError, match="position_embedding"):
        sparse_lowrank_attention(q, k, v, enc, fmap, lowrank="ropeslr")
    with pytest.raises(ValueError, match="pos must be"):
        sparse_lowrank_attention(q, k, v, enc, fmap, pos=pos[:, :5])
    with pytest.raises(ValueError, match="RoLA takes the rotary schedule"):
        alibi = relpos.create("alibi", num_heads=H, head_dim=D)
        sparse_lowrank_attention(q, k, v, alibi, fmap)
    _, hfmap, pe, _ = _branch("ropeslr")
    with pytest.raises(ValueError, match=r"pos\[\.\.\., 0\] must lie in 0\.\.3"):
        sparse_lowrank_attention(
            q, k, v, enc, hfmap, pos=pos + 4, lowrank="ropeslr", position_embedding=pe
        )
    with pytest.raises(ValueError, match="selection was made for length"):
        sel = BlockSelection.full(9, 4)
        sparse_lowrank_attention(q, k, v, enc, fmap, selection=sel)
    with pytest.raises(ValueError, match="causal BlockSelection"):
        BlockSelection(torch.ones(1, 1, 2, 2, dtype=torch.bool), 4, 8, True)
    with pytest.raises(ValueError, match="key_valid"):
        sparse_lowrank_attention(q, k, v, enc, fmap, key_valid=torch.ones(B, 8))


def test_the_fused_sparse_path_has_the_dense_gradients():
    """Bidirectional, every row keeping K whole blocks: the sparse branch runs the fused
    SDPA kernel on the gathered blocks; its gradients equal the dense definition's."""
    q, k, v, pos = _inputs(16, seed=12)
    grads = []
    for method in ("blocked", "dense"):
        xs = [t.clone().requires_grad_() for t in (q, k, v)]
        _call(*xs, pos, "rola", method, block_size=4, sparsity=0.5).square().sum().backward()
        grads.append([x.grad for x in xs])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("causal", [False, True])
def test_one_query_block_per_chunk_gives_the_same_result(causal, monkeypatch):
    """Chunks of one query block (each gathering only its own rows' blocks, some none: a
    causal row 0 without a local block keeps nothing) equal the dense definition."""
    import relpos.nn.mixers.sparse_lowrank as slr

    monkeypatch.setattr(slr, "CHUNK_ELEMENTS", 1)
    q, k, v, pos = _inputs(22, seed=13)
    kw = dict(block_size=3, sparsity=0.6, local_radius=None, causal=causal)
    for grad in (False, True):
        with torch.set_grad_enabled(grad):
            out = _call(q, k, v, pos, "rola", **kw)
            ref = _call(q, k, v, pos, "rola", "dense", **kw)
        torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("causal", [False, True])
def test_checkpointed_chunks_give_the_same_gradients(causal, monkeypatch):
    import relpos.nn.mixers.sparse_lowrank as slr

    monkeypatch.setattr(slr, "CHUNK_ELEMENTS", 64)  # several chunks
    q, k, v, pos = _inputs(16, seed=14)
    grads = []
    for ckpt in (False, True):
        xs = [t.clone().requires_grad_() for t in (q, k, v)]
        out = _call(
            *xs, pos, "rola", block_size=4, sparsity=0.5, causal=causal, checkpoint_chunks=ckpt
        )
        out.square().sum().backward()
        grads.append([out.detach()] + [x.grad for x in xs])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)
