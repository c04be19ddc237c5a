"""LightNet (arXiv 2405.21022): the additive recurrence against the dense prefix-softmax formula,
MD-LRPE relativity per axis, MD-TPE against the dense Toeplitz mixer, decoding."""

from __future__ import annotations

import pytest
import torch

from relpos.nn.mixers.lightnet import LightNetState, lightnet_scan, lrpe_theta, md_lrpe, tpe_scan

MODES = ("recurrent", "chunked", "attention")


def dense(q, k, v, n0):
    """o_t = Σ_d q_td Σ_{s≤t} e^{k_sd} / (n0 + Σ_{u≤t} e^{k_ud}) v_s, in float64 with the
    prefix softmax taken by torch.softmax over [log n0, k_0..k_t] (no exp overflow)."""
    q, k, v = q.double(), k.double(), v.double()
    B, H, L, D = q.shape
    out = torch.zeros(B, H, L, v.shape[-1], dtype=torch.float64)
    null = torch.full((B, H, 1, D), 0.0 if n0 == 1 else -torch.inf, dtype=torch.float64)
    for t in range(L):
        w = torch.softmax(torch.cat([null, k[:, :, : t + 1]], dim=2), dim=2)[:, :, 1:]
        out[:, :, t] = torch.einsum("bhd,bhsd,bhse->bhe", q[:, :, t], w, v[:, :, : t + 1])
    return out


def case(B=1, H=2, L=50, D=4, Dv=3, key_scale=10.0, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, D, generator=g, dtype=dtype)
    k = torch.randn(B, H, L, D, generator=g, dtype=dtype) * key_scale
    v = torch.randn(B, H, L, Dv, generator=g, dtype=dtype)
    return q, k, v


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("null_slot", [True, False])
def test_additive_recurrence_equals_the_dense_formula(mode, null_slot):
    q, k, v = case()  # k ~ N(0, 10^2), L = 50, fp32 (tolerance 1e-6)
    o = lightnet_scan(q, k, v, null_slot=null_slot, mode=mode, chunk_size=8)
    assert o.dtype == torch.float32
    ref = dense(q, k, v, 1 if null_slot else 0)
    # fp32 rounding: 1e-6 relative to the output's scale (max |o| is about 4 here)
    assert (o.double() - ref).abs().max() < 1e-6 * ref.abs().max()


def test_huge_keys_do_not_overflow():
    q, k, v = case(L=20, key_scale=1000.0, dtype=torch.float64)
    assert not torch.isfinite(torch.exp(k)).all()  # the naive exp overflows
    o = lightnet_scan(q, k, v, null_slot=True)
    assert torch.allclose(o, dense(q, k, v, 1), atol=1e-12)


def test_single_token_without_null_slot_is_sum_q_times_v():
    q, k, v = case(L=1)
    o = lightnet_scan(q, k, v, null_slot=False)
    assert torch.equal(o, q.sum(-1, keepdim=True) * v)


def test_decoding_with_state_equals_the_full_forward_with_md_lrpe():
    q, k, v = case(L=10, dtype=torch.float64)
    theta = lrpe_theta(2, 4).double()
    pos = torch.arange(10)[:, None]
    full = lightnet_scan(q, k, v, positions=pos, theta=theta)
    o, state = lightnet_scan(
        q[:, :, :6], k[:, :, :6], v[:, :, :6], positions=pos[:6], theta=theta, return_state=True
    )
    outs = [o]
    for t in range(6, 10):
        s = slice(t, t + 1)
        o, state = lightnet_scan(
            q[:, :, s],
            k[:, :, s],
            v[:, :, s],
            positions=pos[s],
            theta=theta,
            mode="recurrent",
            state=state,
            return_state=True,
        )
        outs.append(o)
    assert isinstance(state, LightNetState) and state.length == 10
    assert state.memory.shape == (1, 2, 8, 3)  # 2 Dk channels with MD-LRPE
    assert torch.allclose(torch.cat(outs, dim=2), full, atol=1e-12)


def lrpe_scores(q, k, qpos, kpos, theta):
    return md_lrpe(q, qpos, theta) @ md_lrpe(k, kpos, theta).transpose(-1, -2)


def test_md_lrpe_is_relative_along_each_axis_and_not_symmetric_in_the_axes():
    g = torch.Generator().manual_seed(1)
    q, k = (
        torch.randn(1, 2, 6, 6, generator=g, dtype=torch.float64),
        torch.randn(1, 2, 6, 6, generator=g, dtype=torch.float64),
    )
    pos = torch.randn(6, 2, generator=g, dtype=torch.float64) * 5
    theta = lrpe_theta(2, 3).double()
    s = lrpe_scores(q, k, pos, pos, theta)
    for shift in (torch.tensor([3.0, 0.0]), torch.tensor([0.0, -7.5])):
        shifted = pos + shift
        assert torch.allclose(lrpe_scores(q, k, shifted, shifted, theta), s, atol=1e-12)
    swapped = pos.flip(-1)
    assert not torch.allclose(lrpe_scores(q, k, swapped, swapped, theta), s, atol=1e-3)


def test_md_lrpe_formula_per_axis_group():
    g = torch.Generator().manual_seed(2)
    q, k = (
        torch.randn(1, 1, 1, 5, generator=g, dtype=torch.float64),
        torch.randn(1, 1, 1, 5, generator=g, dtype=torch.float64),
    )
    pq, pk = torch.tensor([[2.0, 5.0]]), torch.tensor([[-1.0, 3.0]])
    theta = lrpe_theta(1, 3).double()  # D = 5 over m = 2 axes: E = 3 (channels 0-2 axis 0)
    got = lrpe_scores(q, k, pq, pk, theta)[0, 0, 0, 0]
    expected = sum(
        q[0, 0, 0, c] * k[0, 0, 0, c] * torch.cos(theta[0, c % 3] * (pq[0, c // 3] - pk[0, c // 3]))
        for c in range(5)
    )
    assert torch.allclose(got, expected, atol=1e-12)


def test_lrpe_theta_is_the_type_3_rule():
    theta = lrpe_theta(2, 4, base=10000.0)
    assert theta.shape == (2, 4)
    assert torch.allclose(theta.flatten(), 10000.0 ** (-2 * torch.arange(8).double() / 8))


def test_bidirectional_form_is_the_whole_set_softmax_and_order_free():
    q, k, v = case(L=12, dtype=torch.float64)
    o = lightnet_scan(q, k, v, causal=False, null_slot=False)
    w = torch.softmax(k, dim=2)
    assert torch.allclose(o, q @ (w.transpose(-1, -2) @ v), atol=1e-12)
    theta = lrpe_theta(2, 2).double()
    pos = torch.randn(12, 2, dtype=torch.float64)
    perm = torch.randperm(12)
    a = lightnet_scan(q, k, v, causal=False, positions=pos, theta=theta)
    b = lightnet_scan(
        q[:, :, perm], k[:, :, perm], v[:, :, perm], causal=False, positions=pos[perm], theta=theta
    )
    assert torch.allclose(a[:, :, perm], b, atol=1e-12)


def test_md_tpe_one_axis_equals_the_dense_toeplitz_mixer():
    g = torch.Generator().manual_seed(4)
    v = torch.randn(2, 3, 9, 4, generator=g, dtype=torch.float64)
    log_decay = torch.nn.functional.logsigmoid(torch.randn(3, generator=g, dtype=torch.float64))
    c = torch.randn(3, generator=g, dtype=torch.float64)
    i = torch.arange(9)
    d = (i[:, None] - i[None]).double()
    lam = log_decay.exp()[:, None, None]
    causal = torch.where(d >= 0, lam ** d.clamp(min=0), 0.0) * c[:, None, None]
    assert torch.allclose(tpe_scan(v, log_decay, c), causal @ v, atol=1e-12)
    both = lam ** d.abs() * c[:, None, None]
    assert torch.allclose(tpe_scan(v, log_decay, c, causal=False), both @ v, atol=1e-12)
    o, state = tpe_scan(v[:, :, :5], log_decay, c, return_state=True)
    rest = tpe_scan(v[:, :, 5:], log_decay, c, state=state)
    assert torch.allclose(torch.cat([o, rest], dim=2), causal @ v, atol=1e-12)


def test_gradients_gradcheck():
    q, k, v = (t.requires_grad_() for t in case(L=5, D=2, Dv=2, key_scale=1.0, dtype=torch.float64))
    theta = lrpe_theta(2, 2).double().requires_grad_()
    pos = torch.arange(5)[:, None]
    torch.autograd.gradcheck(
        lambda q, k, v, t: lightnet_scan(q, k, v, positions=pos, theta=t, chunk_size=2),
        (q, k, v, theta),
        fast_mode=True,
    )


def test_bad_inputs_name_the_argument():
    q, k, v = case(L=4)
    with pytest.raises(ValueError, match="both positions and theta"):
        lightnet_scan(q, k, v, positions=torch.zeros(4, 1))
    with pytest.raises(ValueError, match="positions must have shape"):
        lightnet_scan(q, k, v, positions=torch.zeros(3, 1), theta=lrpe_theta(2, 4))
    with pytest.raises(ValueError, match="E >= "):
        md_lrpe(q, torch.zeros(4, 2), lrpe_theta(2, 1))
    with pytest.raises(ValueError, match="k must be finite"):
        lightnet_scan(q, k.masked_fill(k > 0, torch.inf), v)
    with pytest.raises(ValueError, match="no recurrent state"):
        lightnet_scan(q, k, v, causal=False, return_state=True)
    with pytest.raises(TypeError, match="causal must be a bool"):
        lightnet_scan(q, k, v, causal=1)
    with pytest.raises(ValueError, match="log_decay must be <= 0"):
        tpe_scan(v, torch.ones(2), torch.ones(2))
