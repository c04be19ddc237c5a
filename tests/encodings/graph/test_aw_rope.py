"""AW-RoPE (``aw-rope``, ``aw-rope-exact``; official code jiaqingxie/AW-RoPE): reference values
worked out from the official operator, the gauge identity against a walk resolvent built from
networkx's neighbourhoods, routes that reinforce or cancel, permutation equivariance,
the official head split, non-backtracking walks, padded graphs and input errors."""

from __future__ import annotations

import math

import pytest
import torch

import relpos
from relpos.encodings.graph.aw_rope import example_walk_graphs
from relpos.encodings.graph.walk_transport import truncation_bound

from ._graphs import path_adjacency

Z = 0.8


def _encoding(name: str, *, z: float = Z, omega: float | None = None, **options):
    """A float64 encoding with ``z`` set exactly (and every frequency ``omega`` if given)."""
    enc = relpos.create(name, **{"num_heads": 1, "head_dim": 2, **options}).double()
    with torch.no_grad():
        if hasattr(enc, "z_logit"):
            enc.z_logit.copy_(torch.logit(torch.tensor(z / (1 - 1e-4), dtype=torch.float64)))
        if omega is not None:
            enc.frequencies.fill_(omega)
    return enc


def _transport(enc, x, inputs, pos=None):
    """The walk transport of ``x (B, H, L, D)`` at node ids ``pos`` (default ``0..L-1``)."""
    pos = torch.arange(x.shape[2])[None] if pos is None else pos
    with torch.no_grad():
        return enc.rotate(x, pos, "q", enc.prepare_rotary(pos, pos, inputs))


def _complex(y):
    return torch.view_as_complex(y.reshape(*y.shape[:-1], -1, 2).contiguous())


def _path_call(name, **options):
    """A worked example: path 0-1-2, coordinate field x = (0, 1, 2) with w = 1 (unbounded),
    omega = 1, z = 0.8, X = 1 (every node holds 1 + 0i)."""
    enc = _encoding(
        name, omega=1.0, field="coordinate", position_dim=1, max_displacement=None, **options
    )
    with torch.no_grad():
        enc.projection.weight.fill_(1.0)
    inputs = {"adjacency": path_adjacency(3), "node_positions": torch.arange(3.0)[None, :, None]}
    x = torch.tensor([1.0, 0.0], dtype=torch.float64).expand(1, 1, 3, 2)
    return _complex(_transport(enc, x, inputs))[0, 0, :, 0]


def test_exact_resolvent_matches_the_spec_reference_on_a_path():
    y = _path_call("aw-rope-exact")
    expected = torch.tensor([2.719652 + 2.6782j, 3.97845 + 0j, 2.719652 - 2.6782j])
    torch.testing.assert_close(y.detach(), expected.to(y.dtype), atol=1e-5, rtol=0)
    assert abs(float((y[0] * y[2].conj()).real) - 0.223754) < 1e-6


@pytest.mark.parametrize(
    "steps,error", [(0, 3.18276), (1, 2.546208), (2, 2.036966), (8, 0.533978), (32, 0.002522)]
)
def test_sparse_walk_sum_truncation_errors_match_the_spec(steps, error):
    exact = _path_call("aw-rope-exact")
    sparse = _path_call("aw-rope", num_steps=steps)
    gap = float((sparse - exact).abs().max())
    assert abs(gap - error) < 1e-5
    assert gap <= truncation_bound(Z, steps, 1.0)  # the paper's forward bound


def _walk_resolvent(adjacency: torch.Tensor, z: float) -> torch.Tensor:
    """``(I - z P)^{-1} = sum_k z^k P^k`` with the random walk ``P[u, v] = 1 / deg(u)`` over
    the neighbours networkx reports (a Neumann series to 1e-16, independent of relpos)."""
    nx = pytest.importorskip("networkx")
    n = adjacency.shape[-1]
    g = nx.Graph()
    g.add_nodes_from(range(n))
    g.add_edges_from(adjacency[0].nonzero().tolist())
    walk = torch.zeros(n, n, dtype=torch.float64)
    for u in g.nodes:
        for v in g.neighbors(u):
            walk[u, v] = 1.0 / g.degree(u)
    out, term = torch.eye(n, dtype=torch.float64), torch.eye(n, dtype=torch.float64)
    for _ in range(200):  # z^200 < 1e-19
        term = z * term @ walk
        out = out + term
    return out


def test_coordinate_field_obeys_the_gauge_identity_with_a_networkx_resolvent():
    """``Y = e^{-i w x} (I - z P)^{-1} (e^{i w x} X)``: rotate as RoPE does, smooth by the
    random walk, rotate back (a gradient field carries no holonomy)."""
    gen = torch.Generator().manual_seed(0)
    adj = example_walk_graphs(1, 12, gen)
    coords = torch.randn(1, 12, 2, generator=gen, dtype=torch.float64)
    enc = _encoding(
        "aw-rope-exact",
        head_dim=6,
        field="coordinate",
        position_dim=2,
        max_displacement=None,
        frequency_ladder="head",
    )
    x = torch.randn(1, 1, 12, 6, generator=gen, dtype=torch.float64)
    y = _complex(_transport(enc, x, {"adjacency": adj, "node_positions": coords}))[0, 0]
    phase = (coords[0] @ enc.projection.weight[0]).detach()[:, None] * enc.frequencies.detach()
    gauge = torch.polar(torch.ones_like(phase), phase)  # (N, C)
    walk = _walk_resolvent(adj, Z).to(torch.complex128)
    expected = gauge.conj() * (walk @ (gauge * _complex(x)[0, 0]))
    torch.testing.assert_close(y.detach(), expected, atol=1e-9, rtol=0)


def _cycle_routes(delta: float):
    """A unit feature at node 2 of the 4-cycle 0-1-2-3-0, read at node 0 after walks of
    length 2: the routes 0-1-2 (angle 0.7) and 0-3-2 (angle 0.7 + delta)."""
    adj = torch.zeros(1, 4, 4, dtype=torch.bool)
    angles = torch.zeros(1, 4, 4, dtype=torch.float64)
    for u, v, a in ((0, 1, 0.3), (1, 2, 0.4), (0, 3, 0.2), (3, 2, 0.5 + delta)):
        adj[0, u, v] = adj[0, v, u] = True
        angles[0, u, v], angles[0, v, u] = a, -a
    enc = _encoding("aw-rope", omega=1.0, field="precomputed", num_steps=2)
    x = torch.zeros(1, 1, 4, 2, dtype=torch.float64)
    x[0, 0, 2, 0] = 1.0
    y = _transport(enc, x, {"adjacency": adj, "edge_angles": angles})
    return _complex(y)[0, 0, 0, 0]


def test_routes_reinforce_or_cancel():
    # z^2 (P01 P12 e^{i 0.7} + P03 P32 e^{i (0.7 + delta)}), every P = 1/2
    agree = _cycle_routes(0.0)
    expected = Z**2 / 2 * complex(math.cos(0.7), math.sin(0.7))
    assert abs(complex(agree) - expected) < 1e-12
    assert abs(_cycle_routes(math.pi)) < 1e-12  # opposite routes cancel exactly
    # node-wise rotations give node 0 one phase per endpoint pair; here the flux decides
    assert abs(_cycle_routes(math.pi / 2)) == pytest.approx(Z**2 / 2 / math.sqrt(2))


def test_non_backtracking_walks_drop_immediate_reversals():
    """Path 0-1-2, no angles, unit feature at node 0, K = 2: the walk 0-1-0 adds
    ``z^2 P01 P10 = z^2 / 2`` at node 0 unless it is non-backtracking."""
    inputs = {"adjacency": path_adjacency(3), "edge_angles": torch.zeros(1, 3, 3)}
    x = torch.zeros(1, 1, 3, 2, dtype=torch.float64)
    x[0, 0, 0, 0] = 1.0
    for nb, expected in ((False, 1 + Z**2 / 2), (True, 1.0)):
        enc = _encoding("aw-rope", field="precomputed", num_steps=2, non_backtracking=nb)
        y = _transport(enc, x, inputs)
        assert float(y[0, 0, 0, 0]) == pytest.approx(expected, abs=1e-12)
        assert float(y[0, 0, 2, 0]) == pytest.approx(Z**2 / 2, abs=1e-12)  # 2-1-0 either way


@pytest.mark.parametrize("name", ["aw-rope", "aw-rope-exact"])
def test_scores_are_equivariant_under_a_relabelling_of_the_nodes(name):
    torch.manual_seed(0)
    enc = relpos.create(name, num_heads=2, head_dim=8, feature_dim=5).double()
    gen = torch.Generator().manual_seed(1)
    n = 10
    adj = example_walk_graphs(1, n, gen)
    feats = torch.randn(1, n, 5, generator=gen, dtype=torch.float64)
    q, k = (torch.randn(1, 2, n, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    ref = relpos.scores(q, k, enc, inputs={"adjacency": adj, "node_features": feats})
    perm = torch.randperm(n, generator=gen)  # new node i is old node perm[i]
    moved = {"adjacency": adj[:, perm][:, :, perm], "node_features": feats[:, perm]}
    at = torch.argsort(perm)  # token t (old node t) sits at new node at[t]
    out = relpos.scores(q, k, enc, q_pos=at, k_pos=at, inputs=moved)
    torch.testing.assert_close(out, ref, atol=1e-10, rtol=1e-10)


def test_coordinate_field_is_invariant_to_translating_the_coordinates():
    enc = relpos.create("aw-rope", num_heads=2, head_dim=8, field="coordinate").double()
    gen = torch.Generator().manual_seed(2)
    adj = example_walk_graphs(2, 9, gen)
    coords = torch.randn(2, 9, 3, generator=gen, dtype=torch.float64)
    q, k = (torch.randn(2, 2, 9, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    s0 = relpos.scores(q, k, enc, inputs={"adjacency": adj, "node_positions": coords})
    s1 = relpos.scores(q, k, enc, inputs={"adjacency": adj, "node_positions": coords + 5.0})
    torch.testing.assert_close(s1, s0, atol=1e-10, rtol=1e-10)
    s2 = relpos.scores(q, k, enc, inputs={"adjacency": adj, "node_positions": 2 * coords})
    assert not torch.allclose(s2, s0)  # but it reads the displacements


def test_model_ladder_is_the_official_transport_before_the_head_split():
    """GraphGPS applies AW-RoPE to the model width and then splits heads: an H-head call
    with ``frequency_ladder="model"`` equals the 1-head call on the concatenated heads."""
    gen = torch.Generator().manual_seed(3)
    adj = example_walk_graphs(1, 8, gen)
    feats = torch.randn(1, 8, 12, generator=gen)
    torch.manual_seed(0)
    split = relpos.create("aw-rope", num_heads=3, head_dim=4, feature_dim=12)
    whole = relpos.create("aw-rope", num_heads=1, head_dim=12, feature_dim=12)
    whole.load_state_dict({**split.state_dict(), "frequencies": split.frequencies.reshape(1, 6)})
    torch.testing.assert_close(
        split.frequencies.reshape(-1).double(),
        10_000.0 ** (-2 * torch.arange(6, dtype=torch.float64) / 12),
    )
    x = torch.randn(1, 3, 8, 4, generator=gen)
    inputs = {"adjacency": adj, "node_features": feats}
    y_split = _transport(split, x, inputs)
    y_whole = _transport(whole, x.permute(0, 2, 1, 3).reshape(1, 1, 8, 12), inputs)
    torch.testing.assert_close(y_split.permute(0, 2, 1, 3).reshape(1, 8, 12), y_whole[:, 0])


def test_exact_and_sparse_share_parameters_and_agree_for_long_walks():
    torch.manual_seed(0)
    exact = relpos.create("aw-rope-exact", num_heads=2, head_dim=8, feature_dim=4).double()
    sparse = relpos.create("aw-rope", num_heads=2, head_dim=8, feature_dim=4, num_steps=120)
    sparse = sparse.double()
    sparse.load_state_dict(exact.state_dict())
    gen = torch.Generator().manual_seed(4)
    inputs = {
        "adjacency": example_walk_graphs(2, 16, gen),
        "node_features": torch.randn(2, 16, 4, generator=gen, dtype=torch.float64),
    }
    x = torch.randn(2, 2, 16, 8, generator=gen, dtype=torch.float64)
    a, b = _transport(exact, x, inputs), _transport(sparse, x, inputs)
    bound = truncation_bound(float(exact.z.detach()), 120, float(_complex(x).abs().max()))
    assert float((_complex(a) - _complex(b)).abs().max()) <= bound < 1e-9
    short = relpos.create("aw-rope", num_heads=2, head_dim=8, feature_dim=4, num_steps=3)
    short = short.double()
    short.load_state_dict(exact.state_dict())
    c = _transport(short, x, inputs)
    gap = float((_complex(a) - _complex(c)).abs().max())
    assert (
        1e-3 < gap <= truncation_bound(float(exact.z.detach()), 3, float(_complex(x).abs().max()))
    )


@pytest.mark.parametrize("name", ["aw-rope", "aw-rope-exact"])
def test_padded_nodes_neither_send_nor_receive(name):
    """A graph of 6 nodes padded to 9 (isolated nodes, masked keys): the live rows equal the
    call on the 6-node graph alone, whatever the padded tokens hold."""
    torch.manual_seed(0)
    enc = relpos.create(name, num_heads=2, head_dim=8, field="coordinate")
    gen = torch.Generator().manual_seed(5)
    small = example_walk_graphs(1, 6, gen)
    coords = torch.randn(1, 9, 3, generator=gen)
    q, k, v = (torch.randn(1, 2, 9, 8, generator=gen) for _ in range(3))
    padded = torch.zeros(1, 9, 9, dtype=torch.bool)
    padded[:, :6, :6] = small
    mask = (torch.arange(9) < 6)[None, None, None]
    out = relpos.attention(
        q, k, v, enc, mask=mask, inputs={"adjacency": padded, "node_positions": coords}
    )
    ref = relpos.attention(
        q[:, :, :6],
        k[:, :, :6],
        v[:, :, :6],
        enc,
        inputs={"adjacency": small, "node_positions": coords[:, :6]},
    )
    torch.testing.assert_close(out[:, :, :6], ref)


def test_gradients_are_exact_in_float64():
    torch.manual_seed(0)
    enc = relpos.create("aw-rope-exact", num_heads=1, head_dim=4, feature_dim=3).double()
    gen = torch.Generator().manual_seed(6)
    inputs = {
        "adjacency": example_walk_graphs(1, 5, gen),
        "node_features": torch.randn(1, 5, 3, generator=gen, dtype=torch.float64),
    }
    q, k, v = (torch.randn(1, 1, 5, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    q.requires_grad_(True)
    z = enc.z_logit

    def f(q, z_logit):
        with torch.no_grad():
            enc.z_logit.copy_(z_logit)
        return relpos.attention(q, k, v, enc, inputs=inputs, backend="eager")

    assert torch.autograd.gradcheck(lambda q: f(q, z.detach()), (q,))
    out = relpos.attention(q, k, v, enc, inputs=inputs, backend="eager")
    grads = torch.autograd.grad(out.square().sum(), [enc.z_logit, enc.frequencies])
    assert all(float(g.abs().max()) > 0 for g in grads)


def test_bad_inputs_raise_errors_that_name_them():
    enc = relpos.create("aw-rope", num_heads=2, head_dim=8, feature_dim=4)
    gen = torch.Generator().manual_seed(7)
    adj = example_walk_graphs(1, 6, gen)
    q = torch.randn(1, 2, 6, 8)
    feats = torch.randn(1, 6, 4)
    with pytest.raises(ValueError, match="node_features"):
        relpos.attention(q, q, q, enc, inputs={"adjacency": adj})
    with pytest.raises(ValueError, match=r"inputs\['node_features'\] must have shape"):
        relpos.attention(q, q, q, enc, inputs={"adjacency": adj, "node_features": feats[..., :3]})
    with pytest.raises(TypeError, match="node_features"):
        relpos.attention(q, q, q, enc, inputs={"adjacency": adj, "node_features": feats.long()})
    with pytest.raises(ValueError, match="node ids"):
        relpos.attention(
            q,
            q,
            q,
            enc,
            k_pos=torch.arange(6) + 1,
            inputs={"adjacency": adj, "node_features": feats},
        )
    with pytest.raises(ValueError, match="edge_weights"):
        relpos.attention(
            q,
            q,
            q,
            enc,
            inputs={"adjacency": adj, "node_features": feats, "edge_weights": -adj.float()},
        )
    three = torch.randn(3, 2, 6, 8)
    with pytest.raises(ValueError, match="graphs"):
        two = {"adjacency": adj.expand(2, 6, 6), "node_features": feats}
        relpos.attention(three, three, three, enc, inputs=two)
    pre = relpos.create("aw-rope", num_heads=2, head_dim=8, field="precomputed")
    angles = torch.zeros(1, 6, 6)
    angles[0, 0, adj[0, 0].nonzero()[0, 0]] = 0.5  # u -> v without its -0.5 back
    with pytest.raises(ValueError, match="antisymmetric"):
        relpos.attention(q, q, q, pre, inputs={"adjacency": adj, "edge_angles": angles})
    with pytest.raises(ValueError, match="head_dim"):
        relpos.create("aw-rope", num_heads=2, head_dim=7)
    with pytest.raises(ValueError, match="cache"):
        relpos.attention(
            q,
            q,
            q,
            enc,
            inputs={"adjacency": adj, "node_features": feats},
            cache=relpos.nn.LayerCache(),
        )


def test_multiscale_walks_mix_single_scale_walks():
    """``z_values`` (official ``aw-nb-ms``): with the initial uniform mixture the transport is
    the mean of the single-scale transports (it is linear in the walk coefficients)."""
    gen = torch.Generator().manual_seed(8)
    adj = example_walk_graphs(1, 7, gen)
    inputs = {"adjacency": adj, "edge_angles": torch.zeros(1, 7, 7, dtype=torch.float64)}
    x = torch.randn(1, 1, 7, 2, generator=gen, dtype=torch.float64)
    common = dict(field="precomputed", num_steps=4, non_backtracking=True)
    mixed = _encoding("aw-rope", z_values=(0.2, 0.6), **common)
    assert torch.allclose(mixed.z_values.detach(), torch.tensor([0.2, 0.6], dtype=torch.float64))
    parts = [_transport(_encoding("aw-rope", z=z, **common), x, inputs) for z in (0.2, 0.6)]
    torch.testing.assert_close(_transport(mixed, x, inputs), (parts[0] + parts[1]) / 2)
    with pytest.raises(ValueError, match="z_values"):
        relpos.create("aw-rope", num_heads=1, head_dim=2, z_values=(0.5, 1.0))


@pytest.mark.parametrize("name", ["aw-rope", "aw-rope-exact"])
@pytest.mark.parametrize("ladder", ["model", "head"])
def test_a_graph_shared_by_the_batch_and_grouped_keys(name, ladder):
    """One graph for a batch of 2 equals each row's call; grouped keys (2 key heads for 4
    query heads) equal their expansion to the query heads."""
    torch.manual_seed(0)
    enc = relpos.create(name, num_heads=4, head_dim=8, feature_dim=3, frequency_ladder=ladder)
    gen = torch.Generator().manual_seed(9)
    inputs = {
        "adjacency": example_walk_graphs(1, 7, gen),
        "node_features": torch.randn(1, 7, 3, generator=gen),
    }
    q = torch.randn(2, 4, 7, 8, generator=gen)
    k, v = torch.randn(2, 2, 7, 8, generator=gen), torch.randn(2, 2, 7, 8, generator=gen)
    out = relpos.scores(q, k, enc, inputs=inputs)
    for b in range(2):
        row = relpos.scores(q[b : b + 1], k[b : b + 1], enc, inputs=inputs)
        torch.testing.assert_close(out[b : b + 1], row)
    wide = k.repeat_interleave(2, dim=1)
    torch.testing.assert_close(out, relpos.scores(q, wide, enc, inputs=inputs))
    attn = relpos.attention(q, k, v, enc, inputs=inputs)
    ref = relpos.attention(q, wide, v.repeat_interleave(2, dim=1), enc, inputs=inputs)
    torch.testing.assert_close(attn, ref)


def test_edge_weights_are_normalised_by_the_out_degree():
    """Path 0-1-2 with weights 1 (0-1) and 3 (1-2): node 1 moves along 1 -> 0 with
    ``P10 = 1/4``, so a unit feature at node 0 reaches node 1 as ``z / 4`` after one step."""
    weights = torch.tensor([[[0.0, 1, 0], [1, 0, 3], [0, 3, 0]]])
    inputs = {
        "adjacency": weights > 0,
        "edge_weights": weights,
        "edge_angles": torch.zeros(1, 3, 3),
    }
    x = torch.zeros(1, 1, 3, 2, dtype=torch.float64)
    x[0, 0, 0, 0] = 1.0
    y = _transport(_encoding("aw-rope", field="precomputed", num_steps=1), x, inputs)
    assert float(y[0, 0, 1, 0]) == pytest.approx(Z / 4, abs=1e-12)
    assert float(y[0, 0, 2, 0]) == 0.0  # two steps away
