"""The chunked backend's row-affine path: a bias that, over a group of query rows, is
``constant(d) + r_i * slope(d)`` except at a few distances (FIRE above its threshold) is
built from two tables per group and equals the per-pair bias of every other backend."""

from __future__ import annotations

import importlib

import pytest
import torch

import relpos
from relpos.encodings.bias.fire import FIRE

api = importlib.import_module("relpos.attention.api")
chunked = importlib.import_module("relpos.attention.chunked")

H, D = 4, 16


def fire(threshold: float = 8.0, dtype: torch.dtype = torch.float64) -> FIRE:
    torch.manual_seed(0)
    enc = relpos.create("fire", num_heads=H, head_dim=D, init_L=threshold)
    return enc.to(dtype)


def qkv(B: int, Lq: int, Lk: int, dtype=torch.float64, kv_heads: int = H):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(B, H, Lq, D, generator=g, dtype=dtype)
    k = torch.randn(B, kv_heads, Lk, D, generator=g, dtype=dtype)
    v = torch.randn(B, kv_heads, Lk, D, generator=g, dtype=dtype)
    return q, k, v


def test_fire_above_its_threshold_takes_the_row_affine_path_only_without_gradients():
    enc = fire()
    q, k, v = qkv(1, 200, 200)
    with torch.no_grad():
        assert api.plan(q, k, v, enc, causal=True, backend="chunked") == ("chunked", "row-affine")
    # a training step keeps the checkpointed tile path
    assert api.plan(q, k, v, enc, causal=True, backend="chunked") == ("chunked", "tile")
    with torch.no_grad():  # below the threshold FIRE is a distance table
        low = fire(threshold=1000.0)
        assert api.plan(q, k, v, low, causal=True, backend="chunked") == ("chunked", "toeplitz")
        # a user mask is not a row-affine call
        mask = torch.ones(200, 200, dtype=torch.bool).tril()
        assert api.plan(q, k, v, enc, mask=mask, backend="chunked")[1] == "tile"


@pytest.mark.parametrize(
    "B, Lq, Lk, causal, kv_heads",
    [
        (1, 300, 300, True, H),
        (2, 300, 300, False, H),
        (1, 90, 400, True, H),  # queries at the end of the keys (a cache), bottom-right
        (1, 1, 513, True, H),  # one decoding step
        (2, 257, 257, True, 2),  # grouped keys and values
        (1, 400, 120, True, H),  # more queries than keys: the first rows see no key
        (1, 300, 50, True, H),  # a block whose last groups of rows see no key
    ],
)
def test_equals_the_dense_reference_in_float64(B, Lq, Lk, causal, kv_heads):
    enc = fire()
    q, k, v = qkv(B, Lq, Lk, kv_heads=kv_heads)
    with torch.no_grad():
        assert api.plan(q, k, v, enc, causal=causal, backend="chunked")[1] == "row-affine"
        got = relpos.attention(q, k, v, enc, causal=causal, backend="chunked")
        want = relpos.attention(q, k, v, enc, causal=causal, backend="eager")
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_positions_that_start_elsewhere():
    enc = fire()
    q, k, v = qkv(1, 64, 200)
    q_pos = torch.arange(1000, 1064)[None]
    k_pos = torch.arange(864, 1064)[None]
    with torch.no_grad():
        call = dict(q_pos=q_pos, k_pos=k_pos, causal=True)
        assert api.plan(q, k, v, enc, backend="chunked", **call)[1] == "row-affine"
        got = relpos.attention(q, k, v, enc, backend="chunked", **call)
        want = relpos.attention(q, k, v, enc, backend="eager", **call)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_activation_dtypes_agree_with_the_tile_path(dtype):
    enc = fire(dtype=torch.float32)
    q, k, v = qkv(1, 700, 700, dtype=dtype)
    with torch.no_grad():
        got = relpos.attention(q, k, v, enc, causal=True, backend="chunked")
    tile = relpos.attention(q.requires_grad_(), k, v, enc, causal=True, backend="chunked")
    assert got.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got, tile.detach(), rtol=0, atol=tol)


def test_the_distances_whose_rows_cross_a_knot_are_evaluated_per_pair(monkeypatch):
    """Claiming one affine form at every distance is wrong at the knots: the path's per-pair
    evaluation there is what makes it exact."""
    enc = fire()
    q, k, v = qkv(1, 600, 600)
    rows = torch.arange(300, 332)[None]
    tables = enc.row_affine_tables(None, rows, rows[:, -1:] - torch.arange(600)[None])
    assert (~tables.exact).any()
    with torch.no_grad():
        want = relpos.attention(q, k, v, enc, causal=True, backend="eager")
        right = relpos.attention(q, k, v, enc, causal=True, backend="chunked")
        assert (right - want).abs().max() < 1e-12

        original = FIRE.row_affine_tables

        def claims_exact(self, ctx, rows, distance):
            t = original(self, ctx, rows, distance)
            return type(t)(t.constant, t.slope, t.row_scale, torch.ones_like(t.exact))

        monkeypatch.setattr(FIRE, "row_affine_tables", claims_exact)
        wrong = relpos.attention(q, k, v, enc, causal=True, backend="chunked")
    assert (wrong - want).abs().max() > 1e-6


def test_fire_tables_reproduce_its_bias_wherever_they_say_exact():
    enc = fire()
    rows = torch.stack([torch.arange(40, 72), torch.arange(500, 532)])  # (G, R)
    distance = rows[:, -1:] - torch.arange(-5, 600)[None]  # future distances included
    t = enc.row_affine_tables(None, rows, distance)
    assert t.constant.shape == t.slope.shape == (H, 2, distance.shape[1])
    constant, slope = t.constant.transpose(0, 1), t.slope.transpose(0, 1)  # (G, H, N)
    affine = constant[:, :, None, :] + t.row_scale[:, None, :, None] * slope[:, :, None, :]
    i = rows[:, :, None].double()  # (G, R, 1)
    u = enc.mlp_input(i, i - distance[:, None, :].double())  # (G, R, N)
    per_pair = enc.readout(u[:, None], torch.arange(H).view(1, H, 1, 1))  # (G, H, R, N)
    exact = t.exact[:, None, None, :].expand_as(affine)
    # far above the threshold the rows' normalisers are close: almost every distance is exact
    assert t.exact[1].float().mean() > 0.8 and (~t.exact[0]).any()
    torch.testing.assert_close(affine[exact], per_pair[exact], rtol=0, atol=1e-12)
    assert (affine[~exact] - per_pair[~exact]).abs().max() > 1e-9  # not exact there


def test_a_group_of_one_row_is_one_affine_form_at_every_distance():
    """The engine evaluates the distances where a group's rows cross a knot as groups of one
    row: there the tables are exact and equal the per-pair bias."""
    enc = fire()
    g = torch.Generator().manual_seed(2)
    rows = torch.randint(0, 4000, (500, 1), generator=g)
    distance = rows - torch.randint(0, 4000, (500, 1), generator=g)
    t = enc.row_affine_tables(None, rows, distance)
    assert bool(t.exact.all())
    values = t.constant[:, :, 0] + t.row_scale[:, 0] * t.slope[:, :, 0]  # (H, P)
    i = rows[:, 0].double()
    u = enc.mlp_input(i, i - distance[:, 0].double())
    per_pair = enc.readout(u.view(1, 1, 1, -1), torch.arange(H).view(1, H, 1, 1))
    torch.testing.assert_close(values, per_pair.view(H, -1), rtol=0, atol=1e-12)


def test_pairs_whose_one_row_tables_are_not_exact_take_the_encodings_bias(monkeypatch):
    """Where even a group of one row is not declared exact, the engine falls back to the
    encoding's per-pair ``bias``: the result is still the dense one."""
    enc = fire()
    q, k, v = qkv(1, 600, 600)
    original = FIRE.row_affine_tables

    def one_row_never_exact(self, ctx, rows, distance):
        t = original(self, ctx, rows, distance)
        if rows.shape[1] == 1:  # the engine's per-pair groups: claim nothing, give garbage
            return type(t)(t.constant + 1.0, t.slope, t.row_scale, torch.zeros_like(t.exact))
        return t

    monkeypatch.setattr(FIRE, "row_affine_tables", one_row_never_exact)
    with torch.no_grad():
        want = relpos.attention(q, k, v, enc, causal=True, backend="eager")
        got = relpos.attention(q, k, v, enc, causal=True, backend="chunked")
    assert (got - want).abs().max() < 1e-12


@pytest.mark.parametrize("budget", [1, 2 * 64 * 300 * 8, 1 << 40])  # float64: 8 bytes
def test_the_bias_budget_sets_heads_per_kernel_call_never_the_result(monkeypatch, budget):
    """``ROW_AFFINE_BIAS_BYTES`` bounds the bias written per kernel call: one head at a time,
    two, or all heads at once, the output is the dense one (grouped keys included)."""
    enc = fire()
    q, k, v = qkv(2, 300, 300, kv_heads=2)
    monkeypatch.setattr(chunked, "ROW_AFFINE_BIAS_BYTES", budget)
    with torch.no_grad():
        want = relpos.attention(q, k, v, enc, causal=True, backend="eager")
        got = relpos.attention(q, k, v, enc, causal=True, backend="chunked")
    assert (got - want).abs().max() < 1e-12
