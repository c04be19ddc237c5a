"""OPRO (``relpos.encodings.rotary.panel_operators``, a reconstruction from the abstract, arXiv
2603.27637): one-pair reference values of the reconstruction; the properties
the abstract claims (isometry, same-panel invariance) and the reconstruction's (relative in
position across panels, RoPE when the operators are the identity); a float64 reference of the
cross-panel logit over complex channel pairs; gradients; grouped-query keys; KV-cache decoding.
"""

from __future__ import annotations

import pytest
import torch

import relpos
from relpos.nn import MultiHeadAttention
from relpos.nn.cache import LayerCache

H, D = 4, 8


def _opro(seed: int = 0, **options) -> relpos.Encoding:
    torch.manual_seed(seed)
    enc = relpos.create("opro", num_heads=H, head_dim=D, panels=3, **options).double()
    with torch.no_grad():
        enc.phases.normal_()
    return enc


def _panels(*rows: list[int]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.int64)


@pytest.mark.parametrize(
    "pq, pk, want",
    [(0, 0, -1.013879), (1, 1, -1.013879), (0, 1, -1.300094), (1, 0, -0.567594)],
)
def test_spec_one_pair_reference(pq: int, pk: int, want: float) -> None:
    enc = relpos.create("opro", num_heads=1, head_dim=2, panels=2).double()
    with torch.no_grad():
        enc.phases[1] = 0.4
    q = torch.tensor([1.0, 0.5], dtype=torch.float64).view(1, 1, 1, 2)
    k = torch.tensor([0.3, -1.2], dtype=torch.float64).view(1, 1, 1, 2)
    # theta = 0.7 at m = 5, n = 2: head_dim 2 has theta_0 = 1, so positions 3.5 and 1.4
    got = relpos.scores(
        q,
        k,
        enc,
        q_pos=torch.tensor([[3.5]]),
        k_pos=torch.tensor([[1.4]]),
        scale=1.0,
        inputs={"panel": _panels([pk]), "query_panel": _panels([pq])},
    )
    assert got.item() == pytest.approx(want, abs=1e-6)


def _call(enc, L: int = 7, seed: int = 1, hkv: int = H):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, H, L, D, generator=gen, dtype=torch.float64)
    k = torch.randn(2, hkv, L, D, generator=gen, dtype=torch.float64)
    panel = torch.randint(0, 3, (2, L), generator=gen)
    return q, k, panel


def test_operators_keep_norms() -> None:
    enc = _opro()
    q, k, panel = _call(enc)
    pos = torch.arange(7)[None]
    state = enc.prepare_rotary(pos, pos, {"panel": panel})
    qr, kr = enc.rotate_qk(q, k, pos, pos, state)
    q0, k0 = enc.rotate_qk(q, k, pos, pos)  # the frozen RoPE alone (no state: O = I)
    assert not torch.allclose(qr, q0)
    torch.testing.assert_close(qr.norm(dim=-1), q0.norm(dim=-1), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(kr.norm(dim=-1), k0.norm(dim=-1), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(q0.norm(dim=-1), q.norm(dim=-1), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("hkv", [H, 2, 1])
def test_same_panel_pairs_score_as_the_frozen_rope(hkv: int) -> None:
    enc = _opro(layout="interleaved", partial_rotary_factor=0.5)
    rope = relpos.create("rope", num_heads=H, head_dim=D, layout="interleaved",
                         partial_rotary_factor=0.5)  # fmt: skip
    q, k, panel = _call(enc, hkv=hkv)
    got = relpos.scores(q, k, enc, inputs={"panel": panel})
    frozen = relpos.scores(q, k, rope)
    same = (panel[:, :, None] == panel[:, None, :])[:, None].expand_as(got)
    torch.testing.assert_close(got[same], frozen[same], rtol=1e-6, atol=1e-6)
    assert (got[~same] - frozen[~same]).abs().max() > 1e-2  # the operators act across panels


def test_identity_operators_reduce_to_rope_on_every_backend() -> None:
    enc = relpos.create("opro", num_heads=H, head_dim=D, panels=2, base=500.0)
    rope = relpos.create("rope", num_heads=H, head_dim=D, base=500.0)
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, H, 9, D, generator=gen) for _ in range(3))
    panel = torch.randint(0, 2, (2, 9), generator=gen)
    want = relpos.attention(q, k, v, rope, causal=True, backend="eager")
    for backend in ("eager", "sdpa", "chunked"):
        got = relpos.attention(q, k, v, enc, causal=True, backend=backend, inputs={"panel": panel})
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shift", [5, -3, 2.25])
def test_logits_are_relative_in_position_across_panels(shift: float) -> None:
    enc = _opro()
    q, k, panel = _call(enc)
    pos = torch.arange(7, dtype=torch.float64)[None] * 1.5
    inputs = {"panel": panel}
    a = relpos.scores(q, k, enc, q_pos=pos, k_pos=pos, inputs=inputs)
    b = relpos.scores(q, k, enc, q_pos=pos + shift, k_pos=pos + shift, inputs=inputs)
    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_cross_panel_logits_match_a_complex_pair_reference() -> None:
    """``sum_c Re(z_q conj(z_k) e^{i(theta_c (m - n) + phi[p(i)] - phi[p(j)])})`` over the
    half-layout pairs ``z = x_c + i x_{c + D/2}``, times the scale."""
    enc = _opro()
    q, k, panel = _call(enc)
    pos = torch.arange(7, dtype=torch.float64)
    theta = 10000.0 ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)  # (D/2,)
    zq = torch.complex(q[..., : D // 2], q[..., D // 2 :])  # (B, H, L, D/2)
    zk = torch.complex(k[..., : D // 2], k[..., D // 2 :])
    phi = enc.phases.detach().double()[panel].permute(0, 2, 1, 3)  # (B, H, L, D/2)
    angle = (
        (pos[:, None] - pos[None, :])[None, None, :, :, None] * theta
        + phi[:, :, :, None]
        - phi[:, :, None, :]
    )
    prod = zq[:, :, :, None] * zk[:, :, None, :].conj() * torch.exp(1j * angle)
    want = prod.real.sum(-1) * D**-0.5
    got = relpos.scores(q, k, enc, inputs={"panel": panel})
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_gradients_reach_the_phases_and_pass_gradcheck() -> None:
    enc = _opro()
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, H, 3, D, generator=gen, dtype=torch.float64) for _ in range(3))
    inputs = {"panel": _panels([0, 1, 1])}  # panel 2 is not in the call
    out = relpos.attention(q, k, v, enc, causal=True, inputs=inputs, backend="eager")
    (out**2).sum().backward()
    grad = enc.phases.grad
    assert grad is not None and bool((grad[:2].abs().sum((1, 2)) > 0).all())
    assert bool((grad[2] == 0).all())
    q.requires_grad_(True)
    torch.autograd.gradcheck(
        lambda q: relpos.attention(q, k, v, enc, causal=True, inputs=inputs, backend="eager"),
        (q[:, :, :2],),
    )


def test_decoding_through_the_cache_equals_the_full_forward() -> None:
    torch.manual_seed(3)
    layer = MultiHeadAttention(16, 2, "opro", encoding_options={"panels": 2}).double()
    with torch.no_grad():
        layer.encoding.phases.normal_()
    x = torch.randn(1, 6, 16, dtype=torch.float64)
    panel = _panels([0, 0, 0, 1, 1, 1])
    full = layer(x, inputs={"panel": panel})
    cache = LayerCache()
    steps = [layer(x[:, :3], cache=cache, inputs={"panel": panel[:, :3]})]
    steps += [
        layer(x[:, t : t + 1], cache=cache, inputs={"panel": panel[:, t : t + 1]})
        for t in range(3, 6)
    ]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-10, atol=1e-12)


def test_bad_panels_and_options_raise_named_errors() -> None:
    enc = relpos.create("opro", num_heads=H, head_dim=D, panels=2)
    q = torch.randn(1, H, 3, D)
    with pytest.raises(ValueError, match=r"inputs\['panel'\].*\[0, 2\)"):
        relpos.scores(q, q, enc, inputs={"panel": _panels([0, 1, 2])})
    with pytest.raises(ValueError, match=r"inputs\['panel'\].*\(B, 3\)"):
        relpos.scores(q, q, enc, inputs={"panel": _panels([0, 1])})
    with pytest.raises(TypeError, match=r"inputs\['panel'\]"):
        relpos.scores(q, q, enc, inputs={"panel": torch.zeros(1, 3)})
    with pytest.raises(ValueError, match="panel"):
        relpos.scores(q, q, enc)
    with pytest.raises(ValueError, match="query_panel"):
        relpos.scores(torch.randn(1, H, 4, D), q, enc, inputs={"panel": _panels([0, 1, 1])})
    with pytest.raises(ValueError, match="scaling"):
        relpos.create("opro", num_heads=H, head_dim=D, scaling={"rope_type": "dynamic",
                                                                 "factor": 2.0})  # fmt: skip
    with pytest.raises(ValueError, match="panels"):
        relpos.create("opro", num_heads=H, head_dim=D, panels=0)


# ---------------------------------------------------------------- over axial N-D RoPE
def test_axial_operators_keep_same_panel_pairs_and_are_relative_on_every_axis() -> None:
    torch.manual_seed(5)
    enc = relpos.create("opro-axial", num_heads=H, head_dim=D, panels=3).double()
    base = relpos.create("rope-axial", num_heads=H, head_dim=D).double()
    with torch.no_grad():
        enc.phases.normal_()
    assert enc.phases.shape == (3, H, sum(base.sections))
    gen = torch.Generator().manual_seed(6)
    q = torch.randn(2, H, 6, D, generator=gen, dtype=torch.float64)
    k = torch.randn(2, H, 6, D, generator=gen, dtype=torch.float64)
    pos = torch.stack(torch.meshgrid(torch.arange(2), torch.arange(3), indexing="ij"), -1)
    pos = pos.reshape(1, 6, 2)  # a 2 x 3 patch grid
    panel = _panels([0, 0, 0, 1, 1, 1], [2, 0, 2, 0, 2, 0])
    inputs = {"panel": panel}
    got = relpos.scores(q, k, enc, q_pos=pos, k_pos=pos, inputs=inputs)
    frozen = relpos.scores(q, k, base, q_pos=pos, k_pos=pos)
    same = (panel[:, :, None] == panel[:, None, :])[:, None].expand_as(got)
    torch.testing.assert_close(got[same], frozen[same], rtol=1e-10, atol=1e-10)
    assert (got[~same] - frozen[~same]).abs().max() > 1e-2
    shift = torch.tensor([7, -2])
    moved = relpos.scores(q, k, enc, q_pos=pos + shift, k_pos=pos + shift, inputs=inputs)
    torch.testing.assert_close(moved, got, rtol=1e-6, atol=1e-6)  # float32 base angles
    pos3 = torch.cat([pos, torch.zeros(1, 6, 1, dtype=pos.dtype)], -1)
    three = relpos.create("opro-axial", num_heads=H, head_dim=12, dims=3, panels=3)
    assert three.phases.shape == (3, H, 6) and three.dims == 3
    x = torch.randn(1, H, 6, 12)
    assert relpos.scores(x, x, three, q_pos=pos3, k_pos=pos3, inputs=inputs).shape == (2, H, 6, 6)
