"""``relpos.nn.SparseLowRankAttention``: the layer equals the functional call, starts as the
sparse branch alone (zero-initialised W) and learns W first, takes 3-D token grids, ignores
padded tokens, and refuses bad configurations by name."""

from __future__ import annotations

import pytest
import torch

from relpos.nn import SparseLowRankAttention
from relpos.nn.mixers.sparse_lowrank import (
    block_sparse_attention,
    rotate_queries_keys,
    sparse_lowrank_attention,
)
from relpos.positions_nd import grid_positions

GRID = (2, 3, 4)


def _layer(lowrank: str = "rola", **kw) -> SparseLowRankAttention:
    torch.manual_seed(0)
    opts = {"dims": 3}
    if lowrank == "ropeslr":
        kw.setdefault("grid_size", GRID)
    kw.setdefault("block_size", 4)
    kw.setdefault("sparsity", 0.5)
    return SparseLowRankAttention(
        24, 2, "rope-axial", encoding_options=opts, lowrank=lowrank, rank=4, seed=0, **kw
    ).double()


def _heads(layer, x):
    B, L, _ = x.shape
    q = layer.q_proj(x).view(B, L, 2, 12).transpose(1, 2)
    k, v = (t.view(B, L, 2, 12).transpose(1, 2) for t in layer.kv_proj(x).chunk(2, -1))
    return q, k, v


@pytest.mark.parametrize("lowrank", ["rola", "ropeslr"])
@pytest.mark.parametrize("causal", [False, True])
def test_layer_equals_the_functional_call_on_a_3d_grid(lowrank, causal):
    layer = _layer(lowrank)
    torch.nn.init.normal_(layer.lowrank_proj.weight)  # a trained W
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 24, 24, generator=gen, dtype=torch.float64)
    pos = grid_positions(*GRID)
    out = layer(x, pos, causal=causal)
    q, k, v = _heads(layer, x)
    ref = sparse_lowrank_attention(
        q,
        k,
        v,
        layer.encoding,
        layer.feature_map,
        block_size=4,
        sparsity=0.5,
        causal=causal,
        pos=pos,
        lowrank=lowrank,
        position_embedding=layer.position_embedding,
        projection=layer.lowrank_proj,
        method="dense",
    )
    want = layer.out_proj(ref.transpose(1, 2).reshape(2, 24, 24))
    torch.testing.assert_close(out, want, atol=1e-12, rtol=1e-10)
    sel = layer.select(x, pos, causal=causal)
    assert abs(sel.density() - 0.5) < 0.2


@pytest.mark.parametrize("lowrank", ["rola", "ropeslr"])
def test_zero_initialised_w_starts_as_sparse_attention_and_learns_first(lowrank):
    layer = _layer(lowrank)
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(1, 24, 24, generator=gen, dtype=torch.float64)
    pos = grid_positions(*GRID)
    out = layer(x, pos)
    q, k, v = _heads(layer, x)
    rq, rk, _ = rotate_queries_keys(layer.encoding, q, k, pos, 3)
    sparse = block_sparse_attention(rq, rk, v, layer.select(x, pos))
    want = layer.out_proj(sparse.transpose(1, 2).reshape(1, 24, 24))
    torch.testing.assert_close(out, want, atol=1e-12, rtol=1e-10)
    out.square().sum().backward()
    assert bool(layer.lowrank_proj.weight.grad.abs().sum() > 0)
    assert bool((layer.feature_map.weight.grad == 0).all())  # W = 0 blocks it at init
    with torch.no_grad():
        layer.lowrank_proj.weight -= 0.1 * layer.lowrank_proj.weight.grad
    layer.zero_grad()
    layer(x, pos).square().sum().backward()
    assert bool(layer.feature_map.weight.grad.abs().sum() > 0)
    if lowrank == "ropeslr":
        assert all(bool(t.grad.abs().sum() > 0) for t in layer.position_embedding.tables)


def test_padded_tokens_do_not_change_the_valid_outputs():
    layer = _layer(sparsity=1.0, local_radius=1)
    torch.nn.init.normal_(layer.lowrank_proj.weight)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(1, 24, 24, generator=gen, dtype=torch.float64)
    mask = torch.ones(1, 24, dtype=torch.bool)
    mask[:, 18:] = False
    pos = grid_positions(*GRID)
    padded = layer(x, pos, mask=mask)[:, :18]
    short = layer(x[:, :18], pos[:18])
    torch.testing.assert_close(padded, short, atol=1e-12, rtol=1e-10)


def test_bad_configurations_are_refused_by_name():
    with pytest.raises(ValueError, match="grid_size"):
        SparseLowRankAttention(24, 2, "rope-axial", encoding_options={"dims": 3}, lowrank="ropeslr")
    with pytest.raises(ValueError, match="grid_size"):
        SparseLowRankAttention(
            24, 2, "rope-axial", encoding_options={"dims": 3}, lowrank="ropeslr", grid_size=(2, 3)
        )
    with pytest.raises(ValueError, match="grid_size is RoPeSLR's"):
        SparseLowRankAttention(24, 2, "rope", grid_size=(4,))
    with pytest.raises(ValueError, match="lowrank"):
        SparseLowRankAttention(24, 2, "rope", lowrank="performer")
    with pytest.raises(ValueError, match="sparsity"):
        SparseLowRankAttention(24, 2, "rope", sparsity=-0.1)
    with pytest.raises(ValueError, match="RoLA takes the rotary schedule"):
        SparseLowRankAttention(24, 2, "alibi")
    with pytest.raises(ValueError, match="rank must be even"):
        SparseLowRankAttention(24, 2, "rope", rank=5)
    with pytest.raises(ValueError, match="x must have shape"):
        SparseLowRankAttention(24, 2, "rope")(torch.randn(2, 5, 12))
