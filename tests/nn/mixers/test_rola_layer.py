"""``relpos.nn.RoLAAttention``: RoLA's low-rank branch as a layer equals the functional call,
and causal decoding through its ``LinearState`` equals the full forward."""

from __future__ import annotations

import pytest
import torch

from relpos.nn import RoLAAttention
from relpos.nn.mixers.rola import rola_attention


def _layer(**kw) -> RoLAAttention:
    torch.manual_seed(0)
    opts = {"dims": 3}
    return RoLAAttention(24, 2, "rope-axial", rank=6, encoding_options=opts, seed=0, **kw).double()


def test_layer_forward_equals_the_functional_branch():
    layer = _layer(frequency_subset="highest")
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 9, 24, generator=gen, dtype=torch.float64)
    pos = torch.randint(0, 6, (2, 9, 3), generator=gen)
    out = layer(x, pos)
    q = layer.q_proj(x).view(2, 9, 2, 12).transpose(1, 2)
    k, v = (t.view(2, 9, 2, 12).transpose(1, 2) for t in layer.kv_proj(x).chunk(2, -1))
    ref = rola_attention(
        q, k, v, layer.encoding, layer.feature_map, frequency_subset="highest", q_pos=pos, k_pos=pos
    )
    want = layer.out_proj(ref.transpose(1, 2).reshape(2, 9, 24))
    torch.testing.assert_close(out, want, atol=1e-12, rtol=1e-12)
    out.sum().backward()
    assert layer.feature_map.weight.grad is not None


def test_layer_decoding_with_its_state_equals_the_full_causal_forward():
    layer = _layer()
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(1, 8, 24, generator=gen, dtype=torch.float64)
    pos = torch.randint(0, 6, (1, 8, 3), generator=gen)
    with torch.no_grad():
        full = layer(x, pos, causal=True)
        state = layer.new_state()
        parts = [layer(x[:, :3], pos[:, :3], causal=True, state=state)]
        parts += [
            layer(x[:, t : t + 1], pos[:, t : t + 1], causal=True, state=state) for t in range(3, 8)
        ]
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-12, rtol=1e-10)


def test_layer_refuses_a_rank_the_schedule_cannot_serve():
    with pytest.raises(ValueError, match="rank <= 12"):
        RoLAAttention(24, 2, "rope", rank=14)
    with pytest.raises(ValueError, match="RoLA takes the rotary schedule"):
        RoLAAttention(24, 2, "alibi", rank=4)
