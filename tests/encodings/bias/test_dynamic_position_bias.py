"""Dynamic position bias (CrossFormer / x-transformers) against the MLP written out on every
pair, and ``TabulatedDistanceBias``: one evaluation per distinct distance, element-wise for
sparse positions."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from dense_reference import assert_matches_reference, dense_attention, qkv, zero_scores

import relpos
from relpos.encodings.bias.tabulated import TabulatedDistanceBias


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
