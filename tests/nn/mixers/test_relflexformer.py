"""RelFlexformer (arXiv 2605.10706; a reconstruction): the exact sum, the dense spectral quadrature,
the NUFFT and the random-feature fold agree to their stated error bounds; the aliasing and
truncation conditions are checked when the grid is built."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import relpos
from relpos.attention.linear.kernelized import kernelized_attention
from relpos.nn.mixers.relflexformer import (
    CauchyModulation,
    GaussianModulation,
    SpectralGrid,
    direct_convolution,
    nufft_convolution,
    plan_grid,
    position_features,
    quadrature_convolution,
    relflexformer_attention,
    relflexformer_reference,
)


def spec_case():
    """The reference case: 64 points in the unit cube, then x, from default_rng(0)."""
    rng = np.random.default_rng(0)
    r = torch.tensor(rng.random((64, 3)))[None]
    x = torch.tensor(rng.standard_normal(64))[None, None, :, None]
    return r, x, GaussianModulation(1, 3, 0.2, learnable=False)


def span_of(r):
    return r[0].amax(0) - r[0].amin(0)


def test_direct_sum_matches_the_spec_values():
    r, x, mod = spec_case()
    y = direct_convolution(x, r, r, mod)
    want = torch.tensor([-1.072731, -4.052863, -1.543829], dtype=torch.float64)
    torch.testing.assert_close(y[0, 0, :3, 0], want, atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    "h,omega,low,high",
    [(0.4, 5.2, 5e-11, 8e-11), pytest.param(0.25, 6.0, 0.0, 1e-12, marks=pytest.mark.slow)],
)
def test_dense_quadrature_errors_match_the_spec(h, omega, low, high):
    r, x, mod = spec_case()
    grid = plan_grid(mod, span_of(r), 1e-8, h=h, omega=omega)
    assert grid.half_modes == round(omega / h)  # 27^3 and 49^3 nodes
    err = float(
        (quadrature_convolution(x, r, r, mod, grid) - direct_convolution(x, r, r, mod)).abs().max()
    )
    assert low <= err < high  # reference: 6.3e-11 and 1.4e-13


def test_the_aliasing_grid_of_the_spec_is_refused_at_build_time_and_really_aliases():
    r, x, mod = spec_case()
    with pytest.raises(ValueError, match=r"h=0.6 aliases: .*period 1/h = 1.667"):
        plan_grid(mod, span_of(r), 1e-8, h=0.6, omega=5.4)
    # the refused grid, built by hand, is as wrong as predicted (4.7e-3)
    grid = SpectralGrid(h=0.6, half_modes=9, dims=3, aliasing=1.0, truncation=0.0, tol=1e-8)
    err = float(
        (quadrature_convolution(x, r, r, mod, grid) - direct_convolution(x, r, r, mod)).abs().max()
    )
    assert 4.5e-3 < err < 5e-3


def test_truncation_and_grid_size_are_refused_by_name():
    r, _, mod = spec_case()
    with pytest.raises(ValueError, match="omega=2 truncates the spectrum"):
        plan_grid(mod, span_of(r), 1e-8, h=0.4, omega=2.0)
    with pytest.raises(ValueError, match="quadrature grid would need"):
        plan_grid(GaussianModulation(1, 3, 0.01), span_of(r), 1e-8)
    with pytest.raises(ValueError, match="tol"):
        plan_grid(mod, span_of(r), 0.0)


@pytest.mark.parametrize("tol", [1e-5, 1e-10])
def test_nufft_matches_the_dense_quadrature_to_its_tolerance(tol):
    r, x, mod = spec_case()
    grid = plan_grid(mod, span_of(r), 1e-8, h=0.4, omega=5.2)
    quad = quadrature_convolution(x, r, r, mod, grid)
    fast = nufft_convolution(x, r, r, mod, grid, nufft_tol=tol)
    err = float((fast - quad).abs().max())
    assert err <= tol * float(x.abs().sum())
    if tol > 1e-8:  # a real approximation, not the dense sum in disguise
        assert err > 1e-3 * tol * float(x.abs().sum())


@pytest.mark.parametrize(
    "modulation,tol",
    [(GaussianModulation(2, 3, [0.25, 0.4]), 1e-7), (CauchyModulation(1, 2, 0.5), 1e-3)],
)
def test_a_planned_grid_meets_its_tolerance_against_the_exact_sum(modulation, tol):
    gen = torch.Generator().manual_seed(0)
    d = modulation.dims
    q_pos = torch.rand(2, 9, d, generator=gen, dtype=torch.float64)
    k_pos = torch.rand(2, 30, d, generator=gen, dtype=torch.float64) * 1.5 - 0.3
    x = torch.randn(2, modulation.num_heads, 30, 3, generator=gen, dtype=torch.float64)
    exact = direct_convolution(x, q_pos, k_pos, modulation)
    span = torch.cat([q_pos, k_pos], 1).flatten(0, 1)
    grid = plan_grid(modulation, span.amax(0) - span.amin(0), tol)
    assert grid.aliasing <= tol and grid.truncation <= tol
    bound = tol * float(x.abs().sum(2).max())
    fast = nufft_convolution(x, q_pos, k_pos, modulation, grid)
    assert float((fast - exact).detach().abs().max()) <= bound


def test_on_an_integer_line_it_is_the_toeplitz_rpe_of_luo_et_al():
    """With r = integer positions the model is Luo et al.'s kernelized attention with
    the bias b(d) = log f(d)."""
    gen = torch.Generator().manual_seed(0)
    B, H, L, m, Dv = 1, 2, 12, 3, 2
    mod = GaussianModulation(H, 1, [1.5, 3.0], learnable=False)
    pq, pk = (torch.rand(B, H, L, m, generator=gen, dtype=torch.float64) for _ in range(2))
    v = torch.randn(B, H, L, Dv, generator=gen, dtype=torch.float64)
    pos = torch.arange(L, dtype=torch.float64)[None, :, None]
    d = torch.arange(-(L - 1), L, dtype=torch.float64)  # i - j for table entry t
    table = -(d[None] ** 2) / (2 * mod.scale.double()[:, None] ** 2)
    want, _ = kernelized_attention(pq, pk, v, table=table)
    got = relflexformer_attention(pq, pk, v, pos, pos, mod, tol=1e-10)
    torch.testing.assert_close(got, want, atol=1e-8, rtol=0)


def _attention_case(seed: int = 0, lq: int = 7, lk: int = 11):
    gen = torch.Generator().manual_seed(seed)
    B, H, m, Dv = 2, 2, 3, 2
    pq = torch.rand(B, H, lq, m, generator=gen, dtype=torch.float64)
    pk = torch.rand(B, H, lk, m, generator=gen, dtype=torch.float64)
    v = torch.randn(B, H, lk, Dv, generator=gen, dtype=torch.float64)
    q_pos = torch.rand(B, lq, 3, generator=gen, dtype=torch.float64)
    k_pos = torch.rand(B, lk, 3, generator=gen, dtype=torch.float64)
    valid = torch.ones(B, lk, dtype=torch.bool)
    valid[1, -4:] = False
    return pq, pk, v, q_pos, k_pos, valid


@pytest.mark.parametrize("method", ["nufft", "quadrature"])
def test_attention_equals_the_exact_reference_forward_and_gradients(method):
    pq, pk, v, q_pos, k_pos, valid = _attention_case()
    mod = GaussianModulation(2, 3, [0.6, 1.0]).double()
    pq, pk, v = (t.requires_grad_() for t in (pq, pk, v))
    if method == "quadrature":  # the dense quadrature also differentiates the positions
        q_pos.requires_grad_()
    out = relflexformer_attention(
        pq, pk, v, q_pos, k_pos, mod, method=method, tol=1e-7, key_valid=valid
    )
    ref = relflexformer_reference(pq, pk, v, q_pos, k_pos, mod, key_valid=valid)
    torch.testing.assert_close(out, ref, atol=1e-7, rtol=0)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype)
    wrt = (pq, pk, v, mod.log_scale) + ((q_pos,) if q_pos.requires_grad else ())
    got = torch.autograd.grad((out * w).sum(), wrt, retain_graph=True)
    want = torch.autograd.grad((ref * w).sum(), wrt)
    for g, r in zip(got, want, strict=True):
        torch.testing.assert_close(g, r, atol=1e-6, rtol=0)
    # padded keys change nothing: dropping them gives the same rows
    q_pos = q_pos.detach()
    short = relflexformer_attention(
        pq[1:],
        pk[1:, :, :-4],
        v[1:, :, :-4],
        q_pos[1:],
        k_pos[1:, :-4],
        mod,
        method=method,
        tol=1e-7,
    )
    torch.testing.assert_close(out[1:], short, atol=1e-7, rtol=0)


def test_attention_is_invariant_to_moving_and_rotating_every_position():
    pq, pk, v, q_pos, k_pos, _ = _attention_case(1, 9, 9)
    mod = GaussianModulation(2, 3, [0.5, 0.9])
    out = relflexformer_attention(pq, pk, v, q_pos, k_pos, mod, tol=1e-5)
    rot, _ = torch.linalg.qr(
        torch.randn(3, 3, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    )
    shift = torch.tensor([3.0, -7.5, 0.25], dtype=torch.float64)
    moved = relflexformer_attention(
        pq, pk, v, q_pos @ rot.T + shift, k_pos @ rot.T + shift, mod, tol=1e-5
    )
    torch.testing.assert_close(moved, out, atol=1e-4, rtol=0)
    exact = relflexformer_attention(pq, pk, v, q_pos, k_pos, mod, method="direct")
    exact_moved = relflexformer_attention(
        pq, pk, v, q_pos @ rot.T + shift, k_pos @ rot.T + shift, mod, method="direct"
    )
    torch.testing.assert_close(exact_moved, exact, atol=1e-12, rtol=0)


def test_random_features_are_an_unbiased_rank_2k_fold_of_the_modulation():
    gen = torch.Generator().manual_seed(0)
    pos = torch.rand(1, 20, 3, generator=gen, dtype=torch.float64)
    for mod in (
        GaussianModulation(2, 3, [0.3, 0.6], learnable=False),
        CauchyModulation(2, 3, [0.3, 0.6], learnable=False),
    ):
        d2 = (pos[:, :, None] - pos[:, None]).pow(2).sum(-1)
        F = mod.spatial(d2[:, None], head_dim=1).double()
        u = position_features(pos, mod, mod.draw(8, gen))
        assert u.shape == (1, 2, 20, 16)
        assert int(torch.linalg.matrix_rank(u[0, 0] @ u[0, 0].T)) <= 16
        few = float((u @ u.transpose(-1, -2) - F).abs().max())
        many = position_features(pos, mod, mod.draw(20000, gen))
        err = float((many @ many.transpose(-1, -2) - F).abs().max())
        assert err < 0.03 < few  # a Monte Carlo mean of unbiased single-frequency terms


def test_random_method_runs_the_fold_as_linear_attention_and_trains_the_scale():
    pq, pk, v, q_pos, k_pos, _ = _attention_case(2)
    mod = GaussianModulation(2, 3, [0.3, 0.5]).double()
    base = mod.draw(256, torch.Generator().manual_seed(0))
    out = relflexformer_attention(pq, pk, v, q_pos, k_pos, mod, method="random", random_base=base)
    ref = relflexformer_reference(pq, pk, v, q_pos, k_pos, mod)
    assert float((out - ref).detach().abs().max()) < 0.5  # stochastic: a rough estimate at K = 256
    out.sum().backward()
    assert mod.log_scale.grad is not None and bool(mod.log_scale.grad.abs().gt(0).all())
    with pytest.raises(ValueError, match="random_base"):
        relflexformer_attention(pq, pk, v, q_pos, k_pos, mod, method="random")


def test_bad_inputs_are_refused_by_name():
    pq, pk, v, q_pos, k_pos, _ = _attention_case()
    mod = GaussianModulation(2, 3, 0.3)
    with pytest.raises(ValueError, match="no gradient to the positions"):
        relflexformer_attention(pq, pk, v, q_pos.requires_grad_(), k_pos, mod)
    q_pos = q_pos.detach()
    with pytest.raises(ValueError, match="method"):
        relflexformer_attention(pq, pk, v, q_pos, k_pos, mod, method="fft")
    with pytest.raises(ValueError, match="k_pos must have shape"):
        relflexformer_attention(pq, pk, v, q_pos, k_pos[..., :2], mod)
    with pytest.raises(TypeError, match="q_pos must be a floating-point"):
        relflexformer_attention(pq, pk, v, q_pos.long(), k_pos, mod)
    with pytest.raises(ValueError, match="modulation has 3 heads"):
        relflexformer_attention(pq, pk, v, q_pos, k_pos, GaussianModulation(3, 3))
    with pytest.raises(ValueError, match="scale"):
        GaussianModulation(2, 3, [0.3])
    with pytest.raises(ValueError, match="scale"):
        CauchyModulation(2, 3, -1.0)


def test_the_layer_equals_the_functional_call_and_masks_padding():
    torch.manual_seed(0)
    layer = relpos.nn.RelFlexformerAttention(
        8, 2, modulation_options={"scale": [0.6, 0.9]}, tol=1e-6
    ).double()
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 10, 8, generator=gen, dtype=torch.float64)
    pos = torch.rand(2, 10, 3, generator=gen, dtype=torch.float64)
    mask = torch.ones(2, 10, dtype=torch.bool)
    mask[0, 7:] = False
    out = layer(x, pos, mask)
    layer.method = "direct"
    exact = layer(x, pos, mask)
    torch.testing.assert_close(out, exact, atol=1e-5, rtol=0)
    x2 = x.clone()
    x2[0, 7:] = 100.0  # padded tokens: no influence on the others
    torch.testing.assert_close(layer(x2, pos, mask)[0, :7], exact[0, :7], atol=1e-10, rtol=0)
    layer.method = "nufft"
    out.sum().backward()
    assert layer.modulation.log_scale.grad is not None
    assert layer.q_proj.weight.grad is not None


def test_float32_activations_and_empty_sequences():
    pq, pk, v, q_pos, k_pos, _ = _attention_case(4)
    mod = GaussianModulation(2, 3, [0.6, 0.9])
    pq32, pk32, v32 = pq.float(), pk.float(), v.float()
    out = relflexformer_attention(pq32, pk32, v32, q_pos.float(), k_pos.float(), mod, tol=1e-4)
    ref = relflexformer_reference(pq, pk, v, q_pos, k_pos, mod.double())
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref, atol=1e-4, rtol=0)
    empty = relflexformer_attention(pq[:, :, :0], pk, v, q_pos[:, :0], k_pos, mod)
    assert empty.shape == (2, 2, 0, 2)
    none = relflexformer_attention(pq, pk[:, :, :0], v[:, :, :0], q_pos, k_pos[:, :0], mod)
    assert none.shape == (2, 2, 7, 2) and not none.any()
